// The group's handshake (transport/group_handshake.h) as the pure state machine it is: two machines talk to each
// other through strings, with no socket and no UCX, so every outcome is tested byte for byte and at any split of
// the stream.
#include "transport/group_handshake.h"

#include <algorithm>
#include <cstddef>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata::transport {
namespace {

using ::testing::HasSubstr;
using Outcome = Handshake::Outcome;

HandshakeSide Side(int rank, std::string secret, std::string worker_address, uint64_t token) {
  HandshakeSide side;
  side.rank = rank;
  side.group_size = 2;
  side.secret = std::move(secret);
  side.facts = {{"version", "1.0"}, {"model", "digest-1"}};
  side.worker_address = std::move(worker_address);
  side.token = token;
  return side;
}

// Delivers what `from` says to `to`, `chunk` bytes at a time at most and never past what `to` wants: what a
// reader of the connection does. Returns whether anything was delivered.
bool Deliver(Handshake& from, Handshake& to, std::string& pending, size_t chunk) {
  pending += from.TakeOutput();
  bool delivered = false;
  while (!pending.empty() && to.outcome() == Outcome::kPending) {
    const size_t n = std::min({pending.size(), to.wanted(), chunk});
    to.Feed(absl::string_view(pending).substr(0, n));
    pending.erase(0, n);
    delivered = true;
  }
  return delivered;
}

// Runs both sides until neither has anything left to say.
void Converse(Handshake& acceptor, Handshake& connector, size_t chunk = 1 << 20) {
  std::string to_connector, to_acceptor;
  for (int round = 0; round < 64; ++round) {
    const bool a = Deliver(acceptor, connector, to_connector, chunk);
    const bool c = Deliver(connector, acceptor, to_acceptor, chunk);
    if (!a && !c) return;
  }
  FAIL() << "the handshake did not settle in 64 rounds";
}

struct Pair {
  std::unique_ptr<Handshake> acceptor;
  std::unique_ptr<Handshake> connector;
};

Pair MakePair(
    HandshakeSide acceptor_side, HandshakeSide connector_side,
    Handshake::Admit admit = [](int) { return std::string(); }) {
  Pair pair;
  pair.acceptor = Handshake::ForAcceptor(std::move(acceptor_side), HandshakeNonce(), std::move(admit));
  pair.connector =
      Handshake::ForConnector(std::move(connector_side), /*peer_rank=*/0, "node 0 at 10.0.0.1:50061", HandshakeNonce());
  return pair;
}

TEST(GroupHandshake, TheSameSecretAndFactsEstablishTheLinkWithEachSidesAddressAndToken) {
  Pair p = MakePair(Side(0, "s3cret", "ucx-address-of-0", 100), Side(1, "s3cret", "ucx-address-of-1", 200));
  Converse(*p.acceptor, *p.connector);
  ASSERT_EQ(p.acceptor->outcome(), Outcome::kEstablished) << p.acceptor->status();
  ASSERT_EQ(p.connector->outcome(), Outcome::kEstablished) << p.connector->status();
  EXPECT_EQ(p.acceptor->peer_rank(), 1);
  EXPECT_EQ(p.connector->peer_rank(), 0);
  EXPECT_EQ(p.acceptor->peer_worker_address(), "ucx-address-of-1");
  EXPECT_EQ(p.connector->peer_worker_address(), "ucx-address-of-0");
  EXPECT_EQ(p.acceptor->peer_token(), 200u);
  EXPECT_EQ(p.connector->peer_token(), 100u);
}

TEST(GroupHandshake, AnySplitOfTheStreamEstablishesTheLink) {
  for (size_t chunk : {1, 2, 3, 5, 7, 64}) {
    Pair p = MakePair(Side(0, "s3cret", "a0", 1), Side(1, "s3cret", "a1", 2));
    Converse(*p.acceptor, *p.connector, chunk);
    EXPECT_EQ(p.acceptor->outcome(), Outcome::kEstablished) << "chunk " << chunk << ": " << p.acceptor->status();
    EXPECT_EQ(p.connector->outcome(), Outcome::kEstablished) << "chunk " << chunk << ": " << p.connector->status();
  }
}

TEST(GroupHandshake, AWrongSecretIsRefusedAndTheConnectorIsToldNothingItCouldUse) {
  Pair p = MakePair(Side(0, "s3cret", "a0", 1), Side(1, "guess", "a1", 2));
  Converse(*p.acceptor, *p.connector);
  EXPECT_EQ(p.acceptor->outcome(), Outcome::kRefused);
  EXPECT_EQ(p.acceptor->status().code(), absl::StatusCode::kPermissionDenied) << p.acceptor->status();
  EXPECT_EQ(p.connector->outcome(), Outcome::kFailed);
  EXPECT_TRUE(p.acceptor->peer_worker_address().empty()) << "an unauthenticated peer's address was accepted";
  EXPECT_TRUE(p.connector->peer_worker_address().empty()) << "the acceptor's address went to a stranger";
}

TEST(GroupHandshake, DifferentFactsAreRefusedNamingTheFact) {
  HandshakeSide other = Side(1, "s3cret", "a1", 2);
  other.facts = {{"version", "1.0"}, {"model", "digest-2"}};
  Pair p = MakePair(Side(0, "s3cret", "a0", 1), std::move(other));
  Converse(*p.acceptor, *p.connector);
  EXPECT_EQ(p.acceptor->outcome(), Outcome::kRefused);
  EXPECT_EQ(p.acceptor->status().code(), absl::StatusCode::kFailedPrecondition) << p.acceptor->status();
  EXPECT_THAT(std::string(p.acceptor->status().message()), HasSubstr("model"));
  EXPECT_EQ(p.connector->outcome(), Outcome::kFailed);
  EXPECT_THAT(std::string(p.connector->status().message()), HasSubstr("model"));
}

TEST(GroupHandshake, ARankTheAcceptorDoesNotAdmitIsRefusedWithTheReason) {
  Pair p = MakePair(Side(0, "s3cret", "a0", 1), Side(1, "s3cret", "a1", 2),
                    [](int rank) { return rank == 1 ? std::string("rank 1 has a link already") : std::string(); });
  Converse(*p.acceptor, *p.connector);
  EXPECT_EQ(p.acceptor->outcome(), Outcome::kRefused);
  EXPECT_EQ(p.acceptor->refusal(), "rank 1 has a link already");
  EXPECT_EQ(p.connector->outcome(), Outcome::kFailed);
  EXPECT_THAT(std::string(p.connector->status().message()), HasSubstr("rank 1 has a link already"));
}

TEST(GroupHandshake, AStrangersBytesAreRefusedWithoutBufferingMoreThanOneFrame) {
  auto acceptor =
      Handshake::ForAcceptor(Side(0, "s3cret", "a0", 1), HandshakeNonce(), [](int) { return std::string(); });
  acceptor->TakeOutput();  // its hello
  const std::string noise(16, '\xff');
  size_t fed = 0;
  while (fed < noise.size() && acceptor->outcome() == Outcome::kPending) {
    EXPECT_LE(acceptor->wanted(), kMaxHandshakeFrameBytes + 4);
    const size_t n = std::min(acceptor->wanted(), noise.size() - fed);
    acceptor->Feed(absl::string_view(noise).substr(fed, n));
    fed += n;
  }
  EXPECT_EQ(acceptor->outcome(), Outcome::kRefused);
  EXPECT_EQ(acceptor->status().code(), absl::StatusCode::kPermissionDenied) << acceptor->status();
}

TEST(GroupHandshake, AnAcceptorThatNeverSpokeIsRetryableAndOneThatLeftMidwayIsNamed) {
  auto silent = Handshake::ForConnector(Side(1, "s3cret", "a1", 2), 0, "node 0 at 10.0.0.1:50061", HandshakeNonce());
  silent->PeerClosed();
  EXPECT_EQ(silent->outcome(), Outcome::kFailed);
  EXPECT_TRUE(silent->retryable());
  EXPECT_THAT(std::string(silent->status().message()), HasSubstr("node 0 at 10.0.0.1:50061"));

  auto acceptor =
      Handshake::ForAcceptor(Side(0, "s3cret", "a0", 1), HandshakeNonce(), [](int) { return std::string(); });
  acceptor->PeerClosed();
  EXPECT_EQ(acceptor->outcome(), Outcome::kRefused);
  auto late = Handshake::ForAcceptor(Side(0, "s3cret", "a0", 1), HandshakeNonce(), [](int) { return std::string(); });
  late->Expired();
  EXPECT_EQ(late->outcome(), Outcome::kRefused);
  EXPECT_THAT(std::string(late->status().message()), HasSubstr("in time"));
}

}  // namespace
}  // namespace strata::transport
