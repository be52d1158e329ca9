// The connector's side: Connect retries until the peer listens; each attempt runs the handshake (group_handshake.h)
// on the calling thread over a blocking-by-poll socket of its own, then makes the link's endpoint on the progress
// thread.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "transport/core.h"
#include "transport/sockets.h"
#include "transport/waiting.h"

namespace strata::transport::internal {
namespace {

constexpr absl::Duration kConnectRetry = absl::Milliseconds(200);

// Drives the connector's side of the handshake over `fd` until it ends or `deadline` passes.
void RunConnectorHandshake(int fd, Handshake& handshake, absl::Time deadline) {
  char buffer[kReadChunk];
  for (;;) {
    const std::string out = handshake.TakeOutput();
    for (size_t at = 0; at < out.size();) {
      const ssize_t n = send(fd, out.data() + at, out.size() - at, MSG_NOSIGNAL);
      if (n > 0) {
        at += static_cast<size_t>(n);
        continue;
      }
      pollfd p{fd, POLLOUT, 0};
      if (n < 0 && errno != EAGAIN && errno != EINTR) {
        handshake.PeerClosed();
        break;
      }
      if (absl::Now() >= deadline) {
        handshake.Expired();
        break;
      }
      poll(&p, 1, PollMs(deadline));
    }
    if (handshake.outcome() != Handshake::Outcome::kPending) return;
    pollfd p{fd, POLLIN, 0};
    if (absl::Now() >= deadline) {
      handshake.Expired();
      continue;
    }
    if (poll(&p, 1, PollMs(deadline)) <= 0) continue;
    const ssize_t n = recv(fd, buffer, std::min(handshake.wanted(), sizeof buffer), 0);
    if (n > 0) {
      handshake.Feed(absl::string_view(buffer, static_cast<size_t>(n)));
    } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
      handshake.PeerClosed();
    }
  }
}

}  // namespace

absl::StatusOr<std::shared_ptr<LinkState>> Core::Connect(int peer, const std::string& host, int port,
                                                         absl::Time deadline) {
  const std::string address = absl::StrCat(host, ":", port);
  if (peer < 0 || peer >= options_.group_size || peer == options_.rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("node ", options_.rank, " cannot connect to node ", peer, " in a group of ", options_.group_size));
  }
  const std::string at = absl::StrCat("node ", peer, " at ", address);
  const absl::Time start = absl::Now();
  absl::Status last = absl::DeadlineExceededError("no attempt was made");
  while (absl::Now() < deadline) {
    auto resolved = Resolve(host, port, /*passive=*/false);
    if (resolved.ok()) {
      const absl::Time attempt_deadline = std::min(deadline, absl::Now() + options_.handshake_timeout);
      Attempt attempt = ConnectOnce(peer, at, address, resolved->first, resolved->second, attempt_deadline);
      if (attempt.link.ok() || !attempt.retryable) return std::move(attempt.link);
      last = attempt.link.status();
    } else {
      last = resolved.status();
    }
    const absl::Time next = std::min(deadline, absl::Now() + kConnectRetry);
    absl::SleepFor(next - absl::Now());
  }
  return absl::DeadlineExceededError(absl::StrCat("node ", options_.rank, " could not connect to node ", peer, " at ",
                                                  address, " within ", Seconds(absl::Now() - start), ": ",
                                                  last.message()));
}

// The handshake runs on the calling thread over a socket of its own; the progress thread only registers the link's
// token first (the acceptor may send as soon as it has said "ready") and makes the endpoint after.
Core::Attempt Core::ConnectOnce(int peer, const std::string& at, const std::string& address,
                                const sockaddr_storage& addr, socklen_t len, absl::Time deadline) {
  absl::StatusOr<int> fd = ConnectSocket(addr, len, at, deadline);
  if (!fd.ok()) return Attempt{fd.status(), true};
  auto link = std::make_shared<LinkState>(Role::kConnector, options_.rank, peer, address, RandomToken());
  const absl::Status stopped = absl::UnavailableError("transport stopped");
  if (!RunOnProgressThread([this, link] { tokens_[link->token] = link; })) {
    close(*fd);
    return Attempt{stopped, false};
  }
  // The acceptor's UCX connects here once it has read this side's facts: its host may, from now on (the address
  // this node chose to connect to, so no stranger's).
  if (absl::Status allowed = ucx_filter_.Allow(addr); !allowed.ok()) {
    close(*fd);
    RunOnProgressThread([this, link] { tokens_.erase(link->token); });
    return Attempt{absl::UnavailableError(absl::StrCat(at, ": ", allowed.message())), false};
  }
  std::unique_ptr<Handshake> handshake = Handshake::ForConnector(Side(link->token), peer, at, HandshakeNonce());
  RunConnectorHandshake(*fd, *handshake, deadline);
  close(*fd);
  absl::Status failed = handshake->status();
  const bool established = handshake->outcome() == Handshake::Outcome::kEstablished;
  bool ran = RunOnProgressThread([&] {
    if (established) {
      absl::StatusOr<ucp_ep_h> ep = CreateEp(handshake->peer_worker_address());
      if (ep.ok()) {
        link->ep = *ep;
        link->peer_token = handshake->peer_token();
        eps_[*ep] = link;
        Established(link);
        return;
      }
      failed = absl::UnavailableError(absl::StrCat(at, ": ", ep.status().message()));
    }
    Fail(link, failed, true);
    CloseEp(link, true);  // forgets the token
  });
  if (!ran) return Attempt{stopped, false};
  if (established && failed.ok()) return Attempt{link, false};
  return Attempt{Detached(failed), !established && handshake->retryable()};
}

}  // namespace strata::transport::internal
