// libFuzzer harness: the raw bytes on a group's port (transport/group_handshake.h), as the handshake reads
// them before anyone is authenticated. The first byte picks who listens and how far an honest peer has gone:
//   0: the acceptor reads the bytes from the start (a stranger on the port);
//   1: the connector reads them as the acceptor's answer (a stranger listening where a member connects);
//   2: the acceptor, after an honest connector's proof, reads them as the facts frame;
//   3: the connector, after an honest acceptor's hello, reads them as the acceptor's proof and facts.
// The second byte is the read size (1..256, as a socket may split the stream). Nothing may overrun, abort, ask for
// more than one bounded frame at a time, or say more than one bounded frame back. The seeds (make_seeds.py) hold
// honest transcripts, MACs included (the nonces are fixed here), so the fuzzer starts from every step.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "transport/group_handshake.h"

namespace {

using strata::transport::Handshake;
using strata::transport::HandshakeSide;
using strata::transport::kMaxHandshakeFrameBytes;

void Check(bool ok) {
  if (!ok) std::abort();
}

HandshakeSide Side(int rank) {
  HandshakeSide side;
  side.rank = rank;
  side.group_size = 3;
  side.secret = "the group secret, 16+ bytes";
  side.facts = {{"strata version", "fuzz"}, {"model", "sha256:aa"}};
  side.worker_address = std::string(64, static_cast<char>('a' + rank));
  side.token = 0x1000 + rank;
  return side;
}

// Fixed nonces: the honest peer's frames are the same for every input, so the fuzzer's bytes meet the same state.
std::string FixedNonce(char c) { return std::string(32, c); }

// Feeds `bytes` in reads of `chunk`, as the transport does (never more than wanted()).
void FeedInReads(Handshake& h, absl::string_view bytes, size_t chunk) {
  while (!bytes.empty() && h.outcome() == Handshake::Outcome::kPending) {
    const size_t wanted = h.wanted();
    Check(wanted >= 1 && wanted <= 4 + kMaxHandshakeFrameBytes);
    const size_t n = std::min({wanted, chunk, bytes.size()});
    h.Feed(bytes.substr(0, n));
    bytes.remove_prefix(n);
    Check(h.TakeOutput().size() <= 4 + kMaxHandshakeFrameBytes);
  }
  if (h.outcome() == Handshake::Outcome::kPending) h.PeerClosed();
  Check(h.outcome() != Handshake::Outcome::kPending);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const int mode = data[0] % 4;
  const size_t chunk = size_t{data[1]} + 1;
  const absl::string_view bytes(reinterpret_cast<const char*>(data) + 2, size - 2);
  auto acceptor = Handshake::ForAcceptor(Side(0), FixedNonce('A'), [](int) { return std::string(); });
  auto connector = Handshake::ForConnector(Side(1), 0, "node 0 at fuzz:1", FixedNonce('B'));
  Handshake* reader = mode == 0 || mode == 2 ? acceptor.get() : connector.get();
  if (mode >= 2) {
    // The honest peer's first exchange: the acceptor's hello, the connector's proof.
    const std::string hello = acceptor->TakeOutput();
    connector->Feed(hello);
    if (mode == 2) acceptor->Feed(connector->TakeOutput());
    Check(acceptor->outcome() == Handshake::Outcome::kPending && connector->outcome() == Handshake::Outcome::kPending);
    acceptor->TakeOutput();
    connector->TakeOutput();
  }
  FeedInReads(*reader, bytes, chunk);
  if (reader->outcome() == Handshake::Outcome::kEstablished) {
    Check(!reader->peer_worker_address().empty());
    Check(reader->peer_worker_address().size() <= strata::transport::kMaxWorkerAddressBytes);
  }
  return 0;
}
