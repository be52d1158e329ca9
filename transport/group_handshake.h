#pragma once
// The group's handshake as a pure state machine over the bytes of one TCP connection (no sockets, no UCX): the
// transport (acceptor.cc, connector.cc) feeds it what it reads and writes what it says; the fuzzer (tests/fuzz/
// fuzz_group_handshake.cc) feeds it anything. It is the only code that reads an unauthenticated peer's bytes.
//
// The stream is a sequence of frames, each a 4-byte big-endian length (1..kMaxHandshakeFrameBytes) and that many
// bytes: one byte naming the step, then fields, each a 4-byte big-endian length and that many bytes.
//   1. acceptor -> Hello  {"strata-group-v2", nonce A, acceptor's rank}
//   2. connector -> Auth  {connector's rank, nonce B, HMAC(secret, "... connect" | A | B | rank)}
//   3. acceptor -> Accept {HMAC(secret, "... accept" | A | B | rank | the rest of this frame), worker address,
//                          token, facts...}
//   4. connector -> Facts {HMAC(secret, "... facts" | A | B | rank | the rest of this frame), worker address,
//                          token, facts...}
//   5. acceptor -> Ready {} (or Refuse {reason} at any step)
// The UCX worker addresses and the tokens (the id each side puts on every message to the other) are covered by the
// MACs: only a holder of the secret who answered this connection's nonces can make UCX connect anywhere.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace strata::transport {

inline constexpr size_t kMaxHandshakeFrameBytes = 64 << 10;
inline constexpr size_t kMaxWorkerAddressBytes = 16 << 10;
inline constexpr size_t kHandshakeNonceBytes = 32;

// One side of a link as the handshake sees it.
struct HandshakeSide {
  int rank = 0;
  int group_size = 1;
  std::string secret;
  std::vector<std::pair<std::string, std::string>> facts;  // compared name by name
  std::string worker_address;                              // this side's UCX worker address
  uint64_t token = 0;                                      // what the peer puts on every message to this side
};

class Handshake {
 public:
  enum class Outcome {
    kPending,      // more bytes wanted
    kEstablished,  // both sides proved the secret and agree on the facts: peer_*() are set
    kRefused,      // acceptor: the peer is refused (status() says why; the refusal frame is in the output)
    kFailed,       // connector: status() names the peer and what went wrong
  };
  // Acceptor: `admit` decides whether a rank that proved the secret may take a link: "" or the refusal's reason.
  using Admit = std::function<std::string(int rank)>;

  static std::unique_ptr<Handshake> ForAcceptor(HandshakeSide self, std::string nonce, Admit admit);
  // `peer` names the acceptor in messages, e.g. "node 0 at 10.0.0.1:50061".
  static std::unique_ptr<Handshake> ForConnector(HandshakeSide self, int peer_rank, std::string peer,
                                                 std::string nonce);

  // How many more bytes the current frame needs (at least 1 while pending): a reader reads no more than this, so
  // a peer cannot make the process buffer more than one bounded frame.
  size_t wanted() const;
  // Bytes as they arrived (any split of the stream). Bytes past wanted() or after the outcome are malformed.
  void Feed(absl::string_view bytes);
  void PeerClosed();         // the connection ended (EOF or reset)
  void Expired();            // the handshake's deadline passed
  std::string TakeOutput();  // what to write to the peer next (may be empty)

  Outcome outcome() const { return outcome_; }
  // kRefused: PERMISSION_DENIED, or FAILED_PRECONDITION listing the facts that differ (a member with other facts);
  // kFailed: the connector's error. refusal(): the reason sent to the peer ("" when nothing was said).
  const absl::Status& status() const { return status_; }
  const std::string& refusal() const { return refusal_; }
  const std::string& claim() const { return claim_; }  // acceptor: " (claims rank N)" once a rank was read
  bool retryable() const { return retryable_; }        // connector: the acceptor never spoke (not listening yet)
  int peer_rank() const { return peer_rank_; }
  const std::string& peer_worker_address() const { return peer_worker_address_; }
  uint64_t peer_token() const { return peer_token_; }
  uint64_t self_token() const { return self_.token; }

 private:
  enum class Step { kSendHello, kAwaitHello, kAwaitAuth, kAwaitAccept, kAwaitFacts, kAwaitReady, kAwaitVerdict, kDone };
  Handshake() = default;
  void OnFrame(absl::string_view body);
  void AcceptorFrame(absl::string_view body);
  void ConnectorFrame(absl::string_view body);
  void OnAuth(const std::vector<absl::string_view>& fields);
  void OnFacts(const std::vector<absl::string_view>& fields);
  void OnAccept(const std::vector<absl::string_view>& fields);
  void Refuse(const std::string& reason);
  void Fail(absl::Status status, bool retryable = false);
  void Send(std::string frame_body);

  bool acceptor_ = false;
  HandshakeSide self_;
  Admit admit_;
  std::string peer_;  // connector: how messages name the acceptor
  Step step_ = Step::kDone;
  std::string nonce_a_, nonce_b_;
  std::string in_;  // the current frame's bytes so far (length prefix included)
  std::string out_;
  Outcome outcome_ = Outcome::kPending;
  absl::Status status_;
  absl::Status verdict_;  // connector whose facts differ: the error once the acceptor has answered
  std::string refusal_, claim_;
  bool retryable_ = false;
  int peer_rank_ = -1;
  std::string peer_worker_address_;
  uint64_t peer_token_ = 0;
};

// kHandshakeNonceBytes from OpenSSL's generator (aborts if it fails: an all-zero nonce would weaken the handshake).
std::string HandshakeNonce();

}  // namespace strata::transport
