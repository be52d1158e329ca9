#pragma once
// What the processes of a group send each other (no torch): each message's bytes, laid out field after field
// in little-endian fixed widths, lengths before their elements. Each message lists its fields once (group_wire.cc),
// and the codec (transport/wire_codec.h) encodes and decodes that list. Decoding checks every length against the
// bytes left before it allocates, so a message can neither overrun nor make the receiver allocate more than it
// sent; an error names the field. Nothing is deserialized into code or types chosen by the sender (no pickle).
//
// The transport (transport/transport.h) moves these bytes between authenticated peers; the group (group.h)
// decides what to send when.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/executor/device_memory.h"
#include "runtime/executor/executor.h"

namespace strata::runtime::wire {

// Message kinds.
enum Kind : uint32_t {
  kHop = 1,        // a micro-batch on its way to a stage of another node: HopHeader, work, activation
  kResult = 2,     // a micro-batch's result, to the leader: MicroBatchResult
  kHeartbeat = 3,  // "still here": empty
  kGoodbye = 4,    // the sender leaves the group (drain, SIGTERM): its reason
  kJoin = 10,      // worker -> leader after the handshake: JoinRequest
  kPlan = 11,      // leader -> worker: GroupPlan
  kReady = 12,     // worker -> leader: its stages are loaded
  kFailed = 13,    // either way, during start-up: why this node cannot go on
};

std::string KindName(uint32_t kind);

// A stage's activation as bytes: ATen's scalar type code, its sizes, its contiguous bytes.
struct Activation {
  int32_t dtype = -1;  // -1: none (a hop to stage 0 carries only the work's ids)
  std::vector<int64_t> sizes;
  absl::string_view bytes;  // encoding: the caller's memory; decoding: a view into the message
};

struct Hop {
  uint32_t stage = 0;  // the stage that runs next
  MicroBatchWork work;
  Activation activation;
};

// Encodes a hop's fixed part and work; the activation's bytes follow as a second part (no copy of them).
std::string EncodeHopHeader(uint32_t stage, const MicroBatchWork& work, const Activation& activation);
// `message` must outlive the result's activation.bytes.
absl::StatusOr<Hop> DecodeHop(absl::string_view message);

std::string EncodeResult(const MicroBatchResult& result);
absl::StatusOr<MicroBatchResult> DecodeResult(absl::string_view message);

// What a worker tells the leader when it joins: its node's GPU budgets (plan order, bytes: --max-memory's or
// the free memory it found), its host's, and whether they were given by hand (--max-memory) or discovered.
struct JoinRequest {
  std::vector<int64_t> gpu_bytes;
  std::vector<int64_t> gpu_total_bytes;
  std::vector<uint8_t> gpu_runs_on_cpu;  // --physical-devices maps it to the CPU (it gets no runtime reserve)
  int64_t host_bytes = 0;
  bool given = false;
  int32_t cuda_driver_version = 0;
  int32_t data_port = 0;  // where the worker listens for its neighbours in the stage order
};
std::string EncodeJoin(const JoinRequest& join);
absl::StatusOr<JoinRequest> DecodeJoin(absl::string_view message);

// What the leader planned for the group, as every node loads it.
struct GroupPlan {
  std::string device_map_json;     // hf_device_map form, the plan's map
  std::vector<int32_t> gpu_nodes;  // plan GPU -> node
  std::string dtype;               // the serving dtype ("float32", "bfloat16")
  int64_t kv_blocks = 0;
  int64_t kv_block_tokens = 0;
  int64_t max_batch = 0;
  int64_t max_context = 0;
  std::vector<std::string> addresses;  // node -> "host:port" of its data port, as the leader reached it
  bool mtp = false;                    // the plan keeps the multi-token-prediction layer (ServingRequest::mtp)
};
std::string EncodeGroupPlan(const GroupPlan& plan);
absl::StatusOr<GroupPlan> DecodeGroupPlan(absl::string_view message);

// A worker's heartbeat payload: what its links carried and its devices' memory (the leader's metrics and
// GetDeviceMap show every node's).
struct HeartbeatReport {
  std::vector<LinkTransfer> transfers;
  std::vector<DeviceMemory> memory;
};
std::string EncodeHeartbeat(const HeartbeatReport& report);
absl::StatusOr<HeartbeatReport> DecodeHeartbeat(absl::string_view message);

}  // namespace strata::runtime::wire
