#pragma once
// The runtime's plain-C++ face (no torch headers): plan a checkpoint and load it onto the devices the plan
// gives it. Generation runs through the Engine (runtime/engine/engine.h; batch_generate.h offline).
// server/ and strata-generate include this.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/model_spec.h"
#include "planner/physical_devices.h"
#include "planner/plan.h"
#include "runtime/executor/serving_options.h"

namespace strata::runtime {

class Pipeline;   // internal (ATen): runtime/executor/pipeline.h
class NodeGroup;  // group.h

// What to serve, parsed and validated at the edge (flags), once.
struct ServingRequest {
  std::filesystem::path model_dir;
  planner::DeviceMapChoice device_map;           // default: balanced_low_0
  std::optional<planner::MaxMemory> max_memory;  // absent: DefaultMaxMemory(inventory), as transformers
  // The machine, discovered once by the caller; absent (and no max_memory): PlanLoad discovers it.
  std::optional<planner::MachineInventory> inventory;
  planner::PhysicalDeviceMap physical;  // plan GPU -> device; missing entries are cuda:i
  std::optional<planner::DType> dtype;  // absent: the checkpoint's when a GPU runs it, float32 on the CPU
  // A quantized checkpoint's sizing in the plan (--quantized-sizing; planner/quantized_spec.h).
  planner::QuantizedSizing quantized_sizing = planner::QuantizedSizing::kPacked;
  ServingOptions serving;
  // The paged KV cache: tokens each stage's pool holds (0: serving.max_batch sequences of serving.max_context,
  // each rounded up to whole blocks, the memory the dense cache had) in blocks of serving.kv_block_tokens.
  int64_t kv_cache_tokens = 0;
  // --runtime-reserve: GPU memory kept for what serving allocates besides weights and KV cache
  // (planner/runtime_reserve.h; auto: sized from `limits`, which the caller fills from its serving flags).
  planner::RuntimeReserve runtime_reserve;
  // A group of nodes (group_load.h): each plan GPU's node, this process's node, and the plan GPUs that run on a
  // CPU on any node (no runtime reserve; `physical` then names this node's GPUs only). Empty: one process.
  std::vector<int> gpu_nodes;
  int node = 0;
  std::set<int> gpus_on_cpu;
  // --speculative mtp: the checkpoint's multi-token-prediction layer is planned (with lm_head) and loaded
  // (planner::SpecOptions::mtp).
  bool mtp = false;
};

// The KV pool of a ServingRequest: (blocks, block_tokens); errors name the flag.
absl::StatusOr<std::pair<int64_t, int64_t>> KvPoolBlocks(int64_t max_batch, int64_t max_context,
                                                         int64_t kv_cache_tokens, int64_t kv_block_tokens);

// A model ready to load: its spec in the serving dtype (every checkpoint header checked) and the one
// plan the process serves, with a KV reserve of kv_blocks x serving.kv_block_tokens tokens. GetDeviceMap shows
// this plan; LoadedModel::Load places the weights by it.
struct LoadOptions {
  std::filesystem::path model_dir;
  planner::ModelSpec spec;
  planner::Plan plan;
  planner::PhysicalDeviceMap physical;
  ServingOptions serving;  // ServingRequest::serving
  int64_t kv_blocks = 128;
  // A group of nodes: this process loads the stages of `node` only (ServingRequest::gpu_nodes).
  std::vector<int> gpu_nodes;
  int node = 0;
};

// Plans what LoadedModel::Load loads: resolves the serving dtype and the KV pool, then loads the checkpoint's spec
// and places it (planner::LoadAndPlace). Bad input is InvalidArgument naming the flag, file, module or device.
absl::StatusOr<LoadOptions> PlanLoad(const ServingRequest& request);

struct LoadReport {
  planner::ModelSpec spec;
  planner::Plan plan;
  std::string dtype;
  double seconds = 0;             // wall time of Load
  uint64_t checkpoint_bytes = 0;  // sum of the safetensors files
  int64_t copied_tensors = 0;
  int64_t disk_tensors = 0;
  int64_t packed_tensors = 0;         // quantized linear layers kept packed (runtime/model/quantized_linear.h)
  int64_t fp8_scaled_mm_tensors = 0;  // of them, FP8 layers a GPU runs W8A8 (--fp8-matmul scaled_mm)
  int64_t huge_page_bytes = 0;        // the process's AnonHugePages after loading (AnonHugePageBytes)
  int64_t pinned_bytes = 0;           // page-locked host memory of offloaded weights (sized to them, weights.h)
  int64_t offload_slot_bytes = 0;     // device memory of the stages' offload slots (two per offloading stage)
  int64_t kv_cache_bytes = 0;
  std::vector<std::string> kv_devices;  // plan devices of the stages holding KV pools, in stage order
  std::string stages;                   // one line per stage
};

class LoadedModel {
 public:
  // Loads the weights where options.plan puts them and allocates the KV caches. Bad input (checkpoint
  // bytes, config fields the forward needs, devices) is InvalidArgument naming the thing.
  static absl::StatusOr<std::unique_ptr<LoadedModel>> Load(const LoadOptions& options);
  ~LoadedModel();

  const LoadReport& report() const;
  int64_t vocab_size() const;
  int64_t max_batch() const;    // sequences running at once
  int64_t max_context() const;  // positions a sequence may reach
  int64_t kv_blocks() const;    // blocks in each stage's KV pool
  int64_t kv_block_tokens() const;
  // Whether the plan has the multi-token-prediction layer (ServingRequest::mtp; in a group, the node of the last stage
  // loads and runs it): each forward pass proposes a token.
  bool mtp() const;
  // longrope (Phi-3): original_max_position_embeddings, past which a sequence's cache is recomputed; else 0.
  int64_t recompute_threshold() const;
  // The stages and their KV caches, for the engine (runtime/engine/engine.h). Internal: its header has ATen.
  Pipeline& pipeline();
  // A group's leader: the group its other nodes' stages run in, whose heartbeats report their devices' memory
  // (MeasureDeviceMemory). Not owned; null for one process.
  void SetGroup(NodeGroup* group);
  NodeGroup* group() const;

 private:
  struct Impl;
  explicit LoadedModel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::runtime
