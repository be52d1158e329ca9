#pragma once
// A group of nodes serving one model (issue 24; no torch): one process per node, rank 0 the leader. The leader
// plans, schedules and samples-or-receives; each worker runs its own stages. This is the group's membership and
// its links: who is in it, how to reach each peer, and how a peer's loss becomes loud.
//
//   Start-up: the leader listens on its data port; each worker connects, and both sides authenticate with the
//   group secret and compare their facts (transport/transport.h). The leader then takes each worker's join (its
//   memory), plans, and sends every worker the plan (group_wire.h); workers that neighbour each other in the stage
//   order link directly. A peer that never comes fails start-up after --group-timeout, naming it.
//   Serving: a receiver thread per link hands each message to the executor. Every link carries a heartbeat every
//   deadline / 4; a link silent for the whole --group-deadline (a stopped process, a cut cable) or closed (a
//   killed process, a reset) is a lost peer: `on_lost` is called once, naming the node.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "runtime/executor/device_memory.h"
#include "runtime/executor/executor.h"
#include "transport/transport.h"

namespace strata::runtime {

struct GroupOptions {
  int rank = 0;
  int size = 1;
  std::string leader_host;            // where workers reach the leader's data port
  int leader_port = 0;                // the leader's data port: the leader listens on it, workers connect to it
  std::string bind_host = "0.0.0.0";  // the data port binds this address
  int worker_port = 0;                // a worker's own data port (its neighbours connect to it); 0: any
  std::string secret;
  // What every node must agree on (the handshake compares them): version, model digest, group size, dtype.
  std::vector<std::pair<std::string, std::string>> facts;
  absl::Duration start_timeout = absl::Seconds(120);  // --group-timeout: peers arriving, the plan, loading
  absl::Duration deadline = absl::Seconds(10);        // --group-deadline: the longest a link may stay silent
};

class NodeGroup {
 public:
  // The leader listens and waits for every worker; a worker connects to the leader. Either way the handshake has
  // run on every link when this returns. Errors: a peer that did not come within start_timeout, a wrong secret,
  // facts that differ (naming the node and the fact).
  static absl::StatusOr<std::unique_ptr<NodeGroup>> Join(const GroupOptions& options);
  ~NodeGroup();

  int rank() const { return options_.rank; }
  int size() const { return options_.size; }
  int data_port() const;                  // where this node listens
  std::string Describe(int node) const;   // "node 1 (10.0.0.2:41234)"
  std::string AddressOf(int node) const;  // the peer's host as this node sees it ("10.0.0.2")
  int64_t refused() const;                // connections that failed the handshake
  const GroupOptions& options() const { return options_; }

  // One message to a peer (serialized per link: stage workers, the heartbeat and results share it).
  absl::Status Send(int node, uint32_t kind, absl::Span<const absl::string_view> parts);
  // Start-up only (before Serve): the next message from `node` within the start-up timeout; a kFailed message is
  // returned as the error it carries, naming the node.
  absl::StatusOr<transport::Message> ReceiveDuringStart(int node);
  // Links worker pairs that neighbour in the stage order ({a, b}, a < b): the higher rank connects to the lower
  // at `addresses[a]` ("host:port"); both must call this with the same pairs.
  absl::Status LinkWorkers(const std::vector<std::pair<int, int>>& pairs, const std::vector<std::string>& addresses);

  struct Handlers {
    std::function<void(int node, transport::Message message)> on_message;  // on that link's receiver thread
    std::function<void(int node, const absl::Status& why)> on_lost;        // once, the first loss
  };
  // Starts the heartbeat (idempotent): from then on every link stays alive however long this node plans or loads.
  // Before Serve, messages are read by ReceiveDuringStart, which skips heartbeats. Call once every link is made.
  void StartHeartbeat();
  // Starts the receiver threads (and the heartbeat, if not yet).
  void Serve(Handlers handlers);
  // Says goodbye to every peer (they treat this node as gone at once, not at the deadline) and stops; once.
  void Leave(const std::string& reason);
  // Stops the receivers and the heartbeat and closes every link (idempotent; never from a handler).
  void Stop();
  bool lost() const { return lost_.load(); }
  // What each link carried: this node's outgoing links and, on the leader, those its workers last reported.
  std::vector<LinkTransfer> Transfers() const;
  // A worker: its devices' memory, measured for each heartbeat (on the heartbeat thread).
  void SetMemoryReport(std::function<std::vector<DeviceMemory>()> report);
  // The leader: the devices of node `node` as its last heartbeat measured them (empty before the first).
  std::vector<DeviceMemory> ReportedMemory(int node) const;

 private:
  struct Peer {
    std::shared_ptr<transport::Link> link;
    std::mutex send;
    // Under `send`: what this node sent on the link (heartbeats not counted).
    LinkTransfer sent;
  };
  explicit NodeGroup(const GroupOptions& options) : options_(options) {}
  void Receive(int node);
  void Heartbeat();
  void Lose(int node, const absl::Status& why);

  GroupOptions options_;
  std::unique_ptr<transport::Transport> transport_;
  std::map<int, std::unique_ptr<Peer>> peers_;
  Handlers handlers_;
  std::atomic<bool> lost_{false};
  std::atomic<bool> stopping_{false};
  std::atomic<bool> left_{false};
  bool heartbeat_started_ = false;
  std::mutex mutex_;
  std::condition_variable stop_;
  std::vector<std::thread> threads_;
  mutable std::mutex reported_mutex_;
  std::map<int, std::vector<LinkTransfer>> reported_;         // the leader: each worker's links, from its heartbeats
  std::map<int, std::vector<DeviceMemory>> reported_memory_;  // the leader: each worker's devices
  std::function<std::vector<DeviceMemory>()> memory_report_;  // a worker: under reported_mutex_
};

}  // namespace strata::runtime
