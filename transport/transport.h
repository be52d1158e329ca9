#pragma once
// The group's transport (no torch): authenticated messages between the processes of a group over UCX.
//
// One process per node; rank 0 is the leader. Every process listens (Transport::Start) and links are made by
// Connect (the caller) and Accept (the listener). Before any data message both ends prove they hold the group
// secret (HMAC-SHA256 over fresh nonces) and compare their facts (version, model, plan, group size): a stranger
// is refused and counted, a member that disagrees fails both ends with FAILED_PRECONDITION.
//
// Who reads a stranger's bytes. The port is a plain TCP socket of strata's own, bound to bind_host alone, and the
// handshake (group_handshake.h, a pure state machine with bounded frames) runs over it first: UCX sees no byte of a
// connection until both sides are authenticated. Only then do they swap UCX worker addresses over that socket
// (covered by the handshake's MACs) and connect UCX endpoints by worker address; there is no ucp_listener. Why not
// UCX's own listener: Debian 12's UCX 1.13.1 parses a connection's first bytes itself and asserts on 16 bytes of
// 0xff (tcp_sockcm_ep.c), taking the process down. A connection still in the handshake is dropped after
// handshake_timeout, and at most max_pending_connections are held (the oldest is dropped for a new one).
// UCX's TCP transport still listens on its own (ephemeral) port for worker-address connections, and that listener
// aborts on a crafted header too; so UCX's network devices are restricted to the interface that holds bind_host
// (UCX_NET_DEVICES, unless a UCX_* variable chooses), and a socket filter admits the members' hosts alone there
// (peer_filter.h). An exposed bind_host still wants a NetworkPolicy (transport/README.md). UCX moves every data
// byte (active messages; rendezvous for large ones); no byte a peer sends is deserialized beyond length-prefixed fields
// with bounds checks. ucp.h stays out of this header (core.h and link_state.h are internal).
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace strata::transport {

struct TransportOptions {
  int rank = 0;        // this process (0: the leader)
  int group_size = 1;  // also sent as the fact "group size" unless `facts` names it
  std::string secret;  // the group secret (must be non-empty)
  // What every process of the group must agree on, compared name by name in the handshake:
  // e.g. {"strata version", "0.9"}, {"model", "sha256:..."}, {"plan", "sha256:..."}, {"group size", "2"}.
  std::vector<std::pair<std::string, std::string>> facts;
  std::string bind_host = "127.0.0.1";             // the data port (and UCX's devices) bind this address only
  int port = 0;                                    // 0: an ephemeral port (port() says which)
  uint64_t max_message_bytes = uint64_t{4} << 30;  // a larger message from a peer is an error, not an allocation
  // A connection (or a connect attempt) that has not completed the handshake by then is dropped (refused, counted).
  absl::Duration handshake_timeout = absl::Seconds(5);
  // Connections in the handshake held at once; a new one beyond it drops the oldest (refused, counted).
  int max_pending_connections = 64;
};

struct Message {
  uint32_t kind = 0;
  std::string bytes;
};

namespace internal {
class Core;
struct LinkState;
}  // namespace internal

class Link {  // one authenticated connection to one peer
 public:
  Link(std::shared_ptr<internal::Core> core, std::shared_ptr<internal::LinkState> state);
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;
  ~Link();  // closes the link

  int peer_rank() const;
  std::string peer_address() const;  // "host:port" as seen from here
  // One message, its parts sent back to back (gather); returns when the parts' memory may be reused.
  // Safe to call from several threads; messages from one thread keep their order.
  absl::Status Send(uint32_t kind, absl::Span<const absl::string_view> parts);
  // The next message from this peer, in order. DEADLINE_EXCEEDED naming the peer (rank and address) and how
  // long it waited; UNAVAILABLE naming the peer once it is gone (closed, process killed, connection reset).
  // Messages that arrived before the peer went away are still returned first.
  absl::StatusOr<Message> Receive(absl::Time deadline);
  void Close();  // later Send/Receive on either side: UNAVAILABLE

 private:
  std::shared_ptr<internal::Core> core_;
  std::shared_ptr<internal::LinkState> state_;
};

class Transport {
 public:
  // Starts UCX (the UCX_* environment applies; without UCX_NET_DEVICES or UCX_TLS its network devices are the
  // interface of bind_host) and listens on bind_host:port (a TCP socket of its own).
  static absl::StatusOr<std::unique_ptr<Transport>> Start(const TransportOptions& options);
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;
  // Closes every link (their later Send/Receive: UNAVAILABLE) and stops UCX; the links may outlive it.
  ~Transport();

  int port() const;
  // Waits until rank `peer` has connected and passed the handshake. Connections that fail authentication
  // are refused (closed) and counted, and the wait goes on. Past the deadline: DEADLINE_EXCEEDED naming the
  // rank it waited for and the address it listens on. FAILED_PRECONDITION when that rank connected with
  // different facts.
  absl::StatusOr<std::shared_ptr<Link>> Accept(int peer, absl::Time deadline);
  // Connects to rank `peer` at host:port, retrying (the peer may not listen yet) until the deadline.
  // PERMISSION_DENIED when the peer refuses this node or cannot prove it holds the secret;
  // FAILED_PRECONDITION listing every fact that differs.
  absl::StatusOr<std::shared_ptr<Link>> Connect(int peer, const std::string& host, int port, absl::Time deadline);
  // Connections refused so far: wrong secret, garbage, wrong group, silent past handshake_timeout, dropped for the
  // cap on pending connections, gone mid-handshake.
  int64_t refused() const;

 private:
  explicit Transport(std::shared_ptr<internal::Core> core);
  std::shared_ptr<internal::Core> core_;
};

}  // namespace strata::transport
