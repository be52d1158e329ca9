#include "transport/transport.h"

#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "transport/core.h"
#include "transport/waiting.h"

// The public faces: Link and Transport hand their calls to the progress core (core.h); Link::Receive waits on the
// link's inbox on the caller's thread.
namespace strata::transport {

Link::Link(std::shared_ptr<internal::Core> core, std::shared_ptr<internal::LinkState> state)
    : core_(std::move(core)), state_(std::move(state)) {}

Link::~Link() { Close(); }

int Link::peer_rank() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->peer_rank;
}

std::string Link::peer_address() const { return state_->address; }

absl::Status Link::Send(uint32_t kind, absl::Span<const absl::string_view> parts) {
  return core_->Send(state_, kind, parts);
}

absl::StatusOr<Message> Link::Receive(absl::Time deadline) {
  const absl::Time start = absl::Now();
  internal::LinkState& s = *state_;
  std::unique_lock<std::mutex> lock(s.mu);
  for (;;) {
    if (s.closed_here) return internal::Detached(s.failure);
    auto front = s.inbox.begin();
    const bool ready = front != s.inbox.end() && front->first == s.next_deliver && front->second->ready;
    if (ready) {  // messages that arrived before the peer went away are still delivered
      Message message{front->second->kind, std::move(front->second->bytes)};
      s.inbox.erase(front);
      ++s.next_deliver;
      return message;
    }
    // A hard failure ends the wait for messages still in flight; after a polite close they still arrive.
    if (s.phase == internal::Phase::kFailed && (s.hard_failure || s.inbox.empty()))
      return internal::Detached(s.failure);
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(s.WhoLocked(), ": no message within ", internal::Seconds(now - start)));
    }
    internal::WaitUntil(s.cv, lock, deadline);
  }
}

void Link::Close() { core_->Close(state_); }

Transport::Transport(std::shared_ptr<internal::Core> core) : core_(std::move(core)) {}

Transport::~Transport() { core_->Stop(); }

absl::StatusOr<std::unique_ptr<Transport>> Transport::Start(const TransportOptions& options) {
  auto core = std::make_shared<internal::Core>(options);
  absl::Status status = core->Start();
  if (!status.ok()) return status;
  return std::unique_ptr<Transport>(new Transport(std::move(core)));
}

int Transport::port() const { return core_->port(); }

int64_t Transport::refused() const { return core_->refused(); }

absl::StatusOr<std::shared_ptr<Link>> Transport::Accept(int peer, absl::Time deadline) {
  auto state = core_->Accept(peer, deadline);
  if (!state.ok()) return state.status();
  return std::make_shared<Link>(core_, *std::move(state));
}

absl::StatusOr<std::shared_ptr<Link>> Transport::Connect(int peer, const std::string& host, int port,
                                                         absl::Time deadline) {
  auto state = core_->Connect(peer, host, port, deadline);
  if (!state.ok()) return state.status();
  return std::make_shared<Link>(core_, *std::move(state));
}

}  // namespace strata::transport
