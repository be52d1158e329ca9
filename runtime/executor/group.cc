#include "runtime/executor/group.h"

#include <chrono>
#include <iostream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "runtime/executor/group_wire.h"

namespace strata::runtime {
namespace {

// The host of "host:port" (an IPv6 host is bracketed, as transport/transport.h writes it).
std::string HostOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  std::string host = colon == std::string::npos ? address : address.substr(0, colon);
  if (host.size() > 1 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return host;
}

}  // namespace

absl::StatusOr<std::unique_ptr<NodeGroup>> NodeGroup::Join(const GroupOptions& options) {
  if (options.size < 2) return absl::InvalidArgumentError("--group-size: a group has at least 2 nodes");
  if (options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rank: ", options.rank, " is not in [0, ", options.size, ") (--group-size ", options.size, ")"));
  }
  if (options.secret.empty()) return absl::InvalidArgumentError("--group-secret-file: the group secret is empty");
  std::unique_ptr<NodeGroup> group(new NodeGroup(options));
  transport::TransportOptions t;
  t.rank = options.rank;
  t.group_size = options.size;
  t.secret = options.secret;
  t.facts = options.facts;
  t.bind_host = options.bind_host;
  t.port = options.rank == 0 ? options.leader_port : options.worker_port;
  absl::StatusOr<std::unique_ptr<transport::Transport>> transport = transport::Transport::Start(t);
  if (!transport.ok()) {
    return absl::Status(transport.status().code(), absl::StrCat("node ", options.rank, ": the data port ", t.bind_host,
                                                                ":", t.port, ": ", transport.status().message()));
  }
  group->transport_ = *std::move(transport);
  const absl::Time deadline = absl::Now() + options.start_timeout;
  if (options.rank == 0) {
    for (int r = 1; r < options.size; ++r) {
      absl::StatusOr<std::shared_ptr<transport::Link>> link = group->transport_->Accept(r, deadline);
      if (!link.ok()) {
        if (absl::IsDeadlineExceeded(link.status())) {
          return absl::DeadlineExceededError(absl::StrCat(
              "the group did not form: node ", r, " of ", options.size, " did not join within --group-timeout ",
              absl::FormatDuration(options.start_timeout), " (", link.status().message(), ")"));
        }
        return link.status();
      }
      auto peer = std::make_unique<Peer>();
      peer->link = *std::move(link);
      group->peers_[r] = std::move(peer);
    }
  } else {
    absl::StatusOr<std::shared_ptr<transport::Link>> link =
        group->transport_->Connect(0, options.leader_host, options.leader_port, deadline);
    if (!link.ok()) {
      if (absl::IsDeadlineExceeded(link.status())) {
        return absl::DeadlineExceededError(
            absl::StrCat("node ", options.rank, " could not join the leader at ", options.leader_host, ":",
                         options.leader_port, " within --group-timeout ", absl::FormatDuration(options.start_timeout),
                         " (", link.status().message(), ")"));
      }
      return link.status();
    }
    auto peer = std::make_unique<Peer>();
    peer->link = *std::move(link);
    group->peers_[0] = std::move(peer);
  }
  return group;
}

NodeGroup::~NodeGroup() { Stop(); }

void NodeGroup::Stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  stop_.notify_all();
  for (auto& [node, peer] : peers_) peer->link->Close();
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

int NodeGroup::data_port() const { return transport_->port(); }
int64_t NodeGroup::refused() const { return transport_->refused(); }

std::string NodeGroup::Describe(int node) const {
  auto it = peers_.find(node);
  if (it == peers_.end()) return absl::StrCat("node ", node);
  return absl::StrCat("node ", node, " (", it->second->link->peer_address(), ")");
}

std::string NodeGroup::AddressOf(int node) const {
  auto it = peers_.find(node);
  return it == peers_.end() ? "" : HostOf(it->second->link->peer_address());
}

absl::Status NodeGroup::Send(int node, uint32_t kind, absl::Span<const absl::string_view> parts) {
  auto it = peers_.find(node);
  if (it == peers_.end()) {
    return absl::InternalError(absl::StrCat("node ", options_.rank, " has no link to node ", node));
  }
  Peer& peer = *it->second;
  std::lock_guard lock(peer.send);
  const auto start = std::chrono::steady_clock::now();
  absl::Status sent = peer.link->Send(kind, parts);
  if (sent.ok() && kind != wire::kHeartbeat) {
    peer.sent.messages += 1;
    for (absl::string_view part : parts) peer.sent.bytes += part.size();
    peer.sent.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return sent;
}

std::vector<LinkTransfer> NodeGroup::Transfers() const {
  std::vector<LinkTransfer> out;
  for (const auto& [node, peer] : peers_) {
    std::lock_guard lock(peer->send);
    LinkTransfer t = peer->sent;
    t.from = options_.rank;
    t.to = node;
    out.push_back(t);
  }
  std::lock_guard lock(reported_mutex_);
  for (const auto& [node, links] : reported_) out.insert(out.end(), links.begin(), links.end());
  return out;
}

absl::StatusOr<transport::Message> NodeGroup::ReceiveDuringStart(int node) {
  auto it = peers_.find(node);
  if (it == peers_.end()) {
    return absl::InternalError(absl::StrCat("node ", options_.rank, " has no link to node ", node));
  }
  while (true) {
    absl::StatusOr<transport::Message> message = it->second->link->Receive(absl::Now() + options_.start_timeout);
    if (!message.ok()) return message.status();
    if (message->kind == wire::kHeartbeat) continue;
    if (message->kind == wire::kFailed) {
      return absl::FailedPreconditionError(absl::StrCat(Describe(node), " failed: ", message->bytes));
    }
    return message;
  }
}

absl::Status NodeGroup::LinkWorkers(const std::vector<std::pair<int, int>>& pairs,
                                    const std::vector<std::string>& addresses) {
  const absl::Time deadline = absl::Now() + options_.start_timeout;
  // Lower ranks accept, higher ranks connect: every pair once, whatever order the nodes get here in.
  for (const auto& [a, b] : pairs) {
    if (b != options_.rank || a == 0 || peers_.contains(a)) continue;
    const std::string& address = addresses.at(static_cast<size_t>(a));
    const size_t colon = address.rfind(':');
    int port = 0;
    if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port)) {
      return absl::InvalidArgumentError(absl::StrCat("node ", a, "'s address \"", address, "\" has no port"));
    }
    absl::StatusOr<std::shared_ptr<transport::Link>> link = transport_->Connect(a, HostOf(address), port, deadline);
    if (!link.ok()) return link.status();
    auto peer = std::make_unique<Peer>();
    peer->link = *std::move(link);
    peers_[a] = std::move(peer);
  }
  for (const auto& [a, b] : pairs) {
    if (a != options_.rank || a == 0 || peers_.contains(b)) continue;
    absl::StatusOr<std::shared_ptr<transport::Link>> link = transport_->Accept(b, deadline);
    if (!link.ok()) return link.status();
    auto peer = std::make_unique<Peer>();
    peer->link = *std::move(link);
    peers_[b] = std::move(peer);
  }
  return absl::OkStatus();
}

void NodeGroup::StartHeartbeat() {
  if (heartbeat_started_) return;
  heartbeat_started_ = true;
  threads_.emplace_back([this] { Heartbeat(); });
}

void NodeGroup::Serve(Handlers handlers) {
  handlers_ = std::move(handlers);
  for (const auto& [node, peer] : peers_) threads_.emplace_back([this, n = node] { Receive(n); });
  StartHeartbeat();
}

void NodeGroup::Receive(int node) {
  transport::Link& link = *peers_.at(node)->link;
  while (!stopping_) {
    absl::StatusOr<transport::Message> message = link.Receive(absl::Now() + options_.deadline);
    if (stopping_) return;
    if (!message.ok()) {
      if (absl::IsDeadlineExceeded(message.status())) {
        Lose(node, absl::UnavailableError(absl::StrCat(Describe(node), " sent nothing for --group-deadline ",
                                                       absl::FormatDuration(options_.deadline),
                                                       " (stopped, hung or cut off): the group cannot go on")));
      } else {
        Lose(node, absl::UnavailableError(absl::StrCat(Describe(node), " is gone: ", message.status().message(),
                                                       ": the group cannot go on")));
      }
      return;
    }
    if (message->kind == wire::kHeartbeat) {
      if (options_.rank == 0 && !message->bytes.empty()) {
        absl::StatusOr<wire::HeartbeatReport> report = wire::DecodeHeartbeat(message->bytes);
        if (report.ok()) {
          std::lock_guard lock(reported_mutex_);
          reported_[node] = std::move(report->transfers);
          reported_memory_[node] = std::move(report->memory);
        }
      }
      continue;
    }
    if (message->kind == wire::kGoodbye) {
      // CANCELLED: a goodbye (a drain, SIGTERM), not a failure; the node that gets it ends all the same.
      Lose(node, absl::CancelledError(
                     absl::StrCat(Describe(node), " left the group (", message->bytes, "): the group cannot go on")));
      return;
    }
    handlers_.on_message(node, *std::move(message));
  }
}

void NodeGroup::Heartbeat() {
  const absl::Duration every = options_.deadline / 4;
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    stop_.wait_for(lock, absl::ToChronoMilliseconds(every), [&] { return stopping_.load(); });
    if (stopping_) return;
    lock.unlock();
    // A worker's heartbeat to the leader carries what its links carried (the leader's metrics show every link).
    std::string report;
    if (options_.rank != 0) {
      wire::HeartbeatReport r;
      r.transfers = Transfers();
      {
        // Under the lock: SetMemoryReport({}) waits for a measurement in progress (it reads the model).
        std::lock_guard reported(reported_mutex_);
        if (memory_report_) r.memory = memory_report_();
      }
      report = wire::EncodeHeartbeat(r);
    }
    for (const auto& [node, peer] : peers_) {
      // A failed heartbeat is the receiver's to report (the link is closed or the peer silent).
      const absl::string_view part = node == 0 ? absl::string_view(report) : absl::string_view();
      (void)Send(node, wire::kHeartbeat, {part});
    }
    lock.lock();
  }
}

void NodeGroup::SetMemoryReport(std::function<std::vector<DeviceMemory>()> report) {
  std::lock_guard lock(reported_mutex_);
  memory_report_ = std::move(report);
}

std::vector<DeviceMemory> NodeGroup::ReportedMemory(int node) const {
  std::lock_guard lock(reported_mutex_);
  auto it = reported_memory_.find(node);
  return it == reported_memory_.end() ? std::vector<DeviceMemory>{} : it->second;
}

void NodeGroup::Lose(int node, const absl::Status& why) {
  if (lost_.exchange(true)) return;
  std::cerr << "strata group (node " << options_.rank << "): " << why.message() << std::endl;
  if (handlers_.on_lost) handlers_.on_lost(node, why);
}

void NodeGroup::Leave(const std::string& reason) {
  if (left_.exchange(true)) return;
  for (const auto& [node, peer] : peers_) {
    const absl::string_view part = reason;
    (void)Send(node, wire::kGoodbye, {part});
  }
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  stop_.notify_all();
}

}  // namespace strata::runtime
