// The acceptor's side of the port (progress thread): accepting connections, driving their handshakes
// (group_handshake.h) byte by byte as epoll reports them, and handing established links to Accept (caller's thread).
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <utility>

#include "transport/core.h"
#include "transport/sockets.h"
#include "transport/waiting.h"

namespace strata::transport::internal {
namespace {

// A connection refused with a reason keeps its socket this long (reading and discarding), so the peer reads the
// refusal before the connection goes.
constexpr absl::Duration kLinger = absl::Seconds(1);
constexpr int kMaxAcceptsPerWake = 64;

}  // namespace

HandshakeSide Core::Side(uint64_t token) const {
  HandshakeSide side;
  side.rank = options_.rank;
  side.group_size = options_.group_size;
  side.secret = options_.secret;
  side.facts = options_.facts;
  side.worker_address = worker_address_;
  side.token = token;
  return side;
}

void Core::AcceptConnections() {
  for (int i = 0; i < kMaxAcceptsPerWake; ++i) {
    sockaddr_storage from{};
    socklen_t from_length = sizeof from;
    const int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&from), &from_length, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN: none left; EMFILE and the like: the next wake tries again
    // At the cap, the oldest connection goes: a real peer completes its handshake in a round trip or two, so the
    // oldest is the likeliest squatter, and a peer dropped by mistake retries (Connect).
    while (pending_.size() >= static_cast<size_t>(options_.max_pending_connections)) {
      auto oldest = pending_.begin();
      for (auto it = pending_.begin(); it != pending_.end(); ++it) {
        if (it->second.order < oldest->second.order) oldest = it;
      }
      if (!oldest->second.closing) {
        refused_.fetch_add(1);
        std::fprintf(stderr,
                     "strata transport: node %d refused a connection from %s: dropped for a newer one (%d "
                     "connections in the handshake at most)\n",
                     options_.rank, oldest->second.address.c_str(), options_.max_pending_connections);
      }
      DropConnection(oldest->first);
    }
    PendingConnection& conn = pending_[fd];
    conn.fd = fd;
    conn.order = next_order_++;
    conn.address = AddressString(from);
    conn.peer = from;
    conn.deadline = absl::Now() + options_.handshake_timeout;
    conn.handshake =
        Handshake::ForAcceptor(Side(RandomToken()), HandshakeNonce(), [this, fd](int rank) { return Admit(fd, rank); });
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
    Advance(conn);  // writes the hello
  }
}

// A rank that proved the secret: refused while it holds a live link; a newer connection claiming it replaces an
// older one still in the handshake (the older is a connect attempt its node gave up on).
std::string Core::Admit(int fd, int rank) {
  if (auto it = ranks_.find(rank); it != ranks_.end()) {
    if (auto held = it->second.lock()) {
      std::lock_guard<std::mutex> lock(held->mu);
      if (held->phase != Phase::kFailed) {
        return absl::StrCat("node ", rank, " already has a link to node ", options_.rank);
      }
    }
  }
  if (auto it = claimed_.find(rank); it != claimed_.end() && it->second != fd) {
    if (auto older = pending_.find(it->second); older != pending_.end()) {
      older->second.claimed_rank = -1;
      older->second.deadline = absl::InfinitePast();  // the sweep drops it
    }
  }
  claimed_[rank] = fd;
  pending_.at(fd).claimed_rank = rank;
  return "";
}

void Core::OnConnectionEvent(int fd, uint32_t events) {
  auto it = pending_.find(fd);
  if (it == pending_.end()) return;
  PendingConnection& conn = it->second;
  if (events & EPOLLOUT) Flush(conn);
  if (!(events & (EPOLLIN | EPOLLHUP | EPOLLERR))) return;
  char buffer[kReadChunk];
  // Never more than the current frame still needs: a peer cannot make this node buffer more than one frame.
  const size_t want = conn.closing ? sizeof buffer : std::min(conn.handshake->wanted(), sizeof buffer);
  const ssize_t n = recv(fd, buffer, want, 0);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (conn.closing) {
    if (n <= 0) DropConnection(fd);  // the peer has read what it was told and gone
    return;
  }
  if (n > 0) {
    conn.handshake->Feed(absl::string_view(buffer, static_cast<size_t>(n)));
  } else {
    conn.handshake->PeerClosed();
  }
  Advance(conn);
}

void Core::Advance(PendingConnection& conn) {
  Handshake& handshake = *conn.handshake;
  switch (handshake.outcome()) {
    case Handshake::Outcome::kPending:
      conn.out += handshake.TakeOutput();
      Flush(conn);
      return;
    case Handshake::Outcome::kRefused:
      OnRefused(conn);
      return;
    case Handshake::Outcome::kEstablished:
      // The link, its endpoint and its token exist before the peer reads "ready" and may send.
      if (std::shared_ptr<LinkState> link = EstablishAccepted(conn)) {
        conn.out += handshake.TakeOutput();
        StartClosing(conn, kLinger);
        Established(link);
      } else {
        DropConnection(conn.fd);
      }
      return;
    case Handshake::Outcome::kFailed:  // a connector's outcome; not reached here
      DropConnection(conn.fd);
      return;
  }
}

void Core::OnRefused(PendingConnection& conn) {
  const Handshake& handshake = *conn.handshake;
  refused_.fetch_add(1);
  std::fprintf(stderr, "strata transport: node %d refused a connection from %s%s: %s\n", options_.rank,
               conn.address.c_str(), handshake.claim().c_str(), std::string(handshake.status().message()).c_str());
  if (handshake.status().code() == absl::StatusCode::kFailedPrecondition) {  // a member whose facts differ
    {
      std::lock_guard<std::mutex> lock(accept_mu_);
      accept_failures_[handshake.peer_rank()] = Detached(handshake.status());
    }
    accept_cv_.notify_all();
  }
  if (handshake.refusal().empty()) {
    DropConnection(conn.fd);
    return;
  }
  conn.out += conn.handshake->TakeOutput();
  StartClosing(conn, kLinger);
}

std::shared_ptr<LinkState> Core::EstablishAccepted(PendingConnection& conn) {
  const Handshake& handshake = *conn.handshake;
  const int rank = handshake.peer_rank();
  // A newer connection from the same rank took the claim while this one was finishing: that one goes on.
  // The member's host may reach UCX's listeners from now on (before it reads "ready" and connects there).
  const absl::Status allowed = ucx_filter_.Allow(conn.peer);
  absl::StatusOr<ucp_ep_h> ep = !allowed.ok() ? absl::StatusOr<ucp_ep_h>(allowed)
                                : conn.claimed_rank != rank
                                    ? absl::AbortedError("a newer connection from that rank replaced it")
                                    : CreateEp(handshake.peer_worker_address());
  if (!ep.ok()) {
    refused_.fetch_add(1);
    std::fprintf(stderr, "strata transport: node %d refused a connection from %s (rank %d): %s\n", options_.rank,
                 conn.address.c_str(), rank, std::string(ep.status().message()).c_str());
    return nullptr;
  }
  auto link = std::make_shared<LinkState>(Role::kAcceptor, options_.rank, rank, conn.address, handshake.self_token());
  link->ep = *ep;
  link->peer_token = handshake.peer_token();
  eps_[*ep] = link;
  tokens_[link->token] = link;
  ranks_[rank] = link;
  return link;
}

void Core::Flush(PendingConnection& conn) {
  while (!conn.out.empty()) {
    const ssize_t n = send(conn.fd, conn.out.data(), conn.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      conn.out.erase(0, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) break;
    conn.out.clear();  // the peer is gone: reading will say so
    break;
  }
  const bool want_write = !conn.out.empty();
  if (want_write != conn.want_write) {
    conn.want_write = want_write;
    epoll_event ev{};
    ev.events = want_write ? (EPOLLIN | EPOLLOUT) : EPOLLIN;
    ev.data.fd = conn.fd;
    epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, conn.fd, &ev);
  }
  if (conn.closing && conn.out.empty()) shutdown(conn.fd, SHUT_WR);
}

// The handshake is over: what is left to say is written, then the socket lingers (reading and discarding) until
// the peer closes or `linger` passes, so that closing with unread bytes does not reset the connection first.
void Core::StartClosing(PendingConnection& conn, absl::Duration linger) {
  conn.closing = true;
  conn.linger_until = absl::Now() + linger;
  if (conn.claimed_rank >= 0) {
    if (auto it = claimed_.find(conn.claimed_rank); it != claimed_.end() && it->second == conn.fd) claimed_.erase(it);
    conn.claimed_rank = -1;
  }
  Flush(conn);
}

void Core::DropConnection(int fd) {
  auto it = pending_.find(fd);
  if (it == pending_.end()) return;
  if (const int rank = it->second.claimed_rank; rank >= 0) {
    if (auto c = claimed_.find(rank); c != claimed_.end() && c->second == fd) claimed_.erase(c);
  }
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  close(fd);
  pending_.erase(it);
}

// ---- the caller's side: waiting for a rank ----

absl::StatusOr<std::shared_ptr<LinkState>> Core::Accept(int peer, absl::Time deadline) {
  const absl::Time start = absl::Now();
  std::unique_lock<std::mutex> lock(accept_mu_);
  for (;;) {
    if (auto it = accepted_.find(peer); it != accepted_.end()) {
      std::shared_ptr<LinkState> link = std::move(it->second);
      accepted_.erase(it);
      return link;
    }
    if (auto it = accept_failures_.find(peer); it != accept_failures_.end()) {
      absl::Status status = Detached(it->second);
      accept_failures_.erase(it);
      return status;
    }
    if (stopped_) return absl::UnavailableError("transport stopped");
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "node ", peer, " did not connect to node ", options_.rank, " listening on ", listen_address(), " within ",
          Seconds(absl::Now() - start), " (", refused_.load(), " connections refused so far)"));
    }
    WaitUntil(accept_cv_, lock, deadline);
  }
}

}  // namespace strata::transport::internal
