#pragma once
// Plans: where every module of a model lives, with transformers' device_map semantics.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json_fwd.hpp"
#include "planner/device.h"
#include "planner/inventory.h"
#include "planner/model_spec.h"
#include "planner/runtime_reserve.h"

namespace strata::planner {

enum class Strategy { kAuto, kBalanced, kBalancedLow0, kSequential, kManual };

absl::string_view StrategyName(Strategy strategy);  // "auto", "balanced", ..., "manual"

// transformers' hf_device_map: module name -> device, in a stable order (module definition order).
using DeviceMap = std::vector<std::pair<std::string, Device>>;

// Parses a manual map in hf_device_map JSON text ({"model.embed_tokens": 0, "lm_head": "cpu"}; {"": 0}),
// keeping the entries' order. Values: integers (GPUs), "cpu", "disk", "cuda:N". Errors name the entry
// (a key given twice, a value that is no device).
absl::StatusOr<DeviceMap> ParseDeviceMap(absl::string_view json_text);

// What --device-map accepts: a strategy name, inline JSON, or @FILE holding JSON.
struct DeviceMapChoice {
  Strategy strategy = Strategy::kBalancedLow0;
  DeviceMap manual;  // when strategy == kManual
};
absl::StatusOr<DeviceMapChoice> ParseDeviceMapChoice(absl::string_view text);

struct PlanRequest {
  DeviceMapChoice device_map;
  // The budgets, as transformers' max_memory. Absent: DefaultMaxMemory(inventory, strategy), what
  // transformers computes from the machine when it is given no max_memory.
  std::optional<MaxMemory> max_memory;
  // The machine, discovered once by the caller (DiscoverInventory) or given by hand. Read only when
  // max_memory is absent; when both are absent PlaceSpec discovers the machine itself (callers that
  // plan more than once should discover once and pass it here).
  std::optional<MachineInventory> inventory;
  // Beyond transformers: reserve on each GPU the KV cache its decoder layers need for this many
  // tokens (in the spec's dtype), iterating placement and reserve to a fixed point.
  int64_t kv_cache_tokens = 0;
  // Beyond transformers: memory kept on each GPU that runs a stage for what serving allocates besides weights
  // and KV cache (runtime_reserve.h), subtracted from its budget as the KV reserve is, to the same fixed point.
  RuntimeReserve runtime_reserve;
  // Fill Plan::explanation (costs string building on every placement decision).
  bool explain = false;
  // A quantized checkpoint's sizing (--quantized-sizing), applied by LoadAndPlace / ApplyQuantizedSizing before
  // placing; PlaceSpec places the tree it is given.
  QuantizedSizing quantized_sizing = QuantizedSizing::kPacked;
};

struct DeviceUsage {
  Device device;
  double budget_bytes = 0;     // the max_memory the placement ran with (after balancing)
  int64_t planned_bytes = 0;   // sum of the sizes of the modules placed here
  int64_t kv_cache_bytes = 0;  // KV reserve taken from the budget (GPUs, with kv_cache_tokens)
  // Runtime reserve taken from the budget (GPUs that run a stage, with PlanRequest::runtime_reserve).
  RuntimeReserveParts runtime_reserve;
  // GPUs whose decoder layers keep KV cache (their own, and the first GPU's for cpu/disk layers): the tokens of KV
  // cache the room left in its max_memory (less what is planned there and the runtime reserve) could hold; -1 where
  // the device keeps no KV cache or has no limit.
  int64_t kv_capacity_tokens = -1;
};

// The KV cache a plan leaves room for. Every stage's paged pool has the same blocks (a sequence's block table is
// shared by all stages), so the pipeline holds what its tightest stage holds, as vLLM caps every stage by the
// smallest; this names that stage.
struct KvCapacity {
  int64_t tokens = 0;
  Device limited_by;
};

// Consecutive device_map entries on one device form a stage (GUIDE.md, Stages).
struct Stage {
  Device device;
  std::vector<std::string> modules;
};

struct Plan {
  Strategy strategy = Strategy::kBalancedLow0;
  DeviceMap device_map;
  std::vector<DeviceUsage> devices;  // every device of max_memory, in its order
  std::vector<Stage> stages;
  // With PlanRequest::explain: one line per placement decision, why each module went where it went.
  std::vector<std::string> explanation;
  // The machine the budgets came from (absent when the request gave max_memory).
  std::optional<MachineInventory> inventory;
  // With decoder layers on GPUs with finite budgets: the KV cache the tightest of them leaves room for.
  std::optional<KvCapacity> kv_capacity;
  // Things a person should know about a valid plan, e.g. budgets listing GPUs on which no decoder
  // layer ended up (too small, or taken by the KV reserve).
  std::vector<std::string> warnings;
};

// Places a spec already loaded (LoadAndPlace loads one, then calls this). Strategies reproduce transformers'
// from_pretrained(device_map=...) exactly; manual maps are validated (coverage, unknown modules/devices, tied weights,
// budgets). Errors are InvalidArgument naming the module or device.
absl::StatusOr<Plan> PlaceSpec(const ModelSpec& spec, const PlanRequest& request);

// Sizes a quantized spec's tree as request.quantized_sizing says (nothing for a dense spec). `transformers`
// sizing of an FP8 checkpoint depends on the machine (quantized_spec.h's TransformersKeepsFp8): the request's
// inventory, else the one DiscoverInventory finds (even when max_memory is given: transformers asks torch).
absl::Status ApplyQuantizedSizing(ModelSpec& spec, const PlanRequest& request);

// Where a model's description comes from: a checkpoint directory (--model) or a module tree JSON
// (--module-tree); one of them.
struct ModelSource {
  std::optional<std::filesystem::path> model_dir;
  std::optional<std::filesystem::path> module_tree;
  SpecOptions spec_options;  // a checkpoint's (model_dir)
};

struct PlannedModel {
  ModelSpec spec;
  Plan plan;
};

// The one planning step of strata-server (plan-only and serving) and the runtime's PlanLoad: the spec of
// `source` in `dtype` (LoadModelSpec, every checkpoint header checked; or LoadModuleTree), placed by
// `request` (PlaceSpec). Errors keep their code and message, prefixed with the flag that led to them:
// "--model DIR: ...", "--module-tree FILE: ...", "cannot place the model with --device-map S: ...".
absl::StatusOr<PlannedModel> LoadAndPlace(const ModelSource& source, std::optional<DType> dtype,
                                          const PlanRequest& request);

// {"strategy", "device_map": {...}, "devices": [...], "stages": [...], "inventory" (when the plan has one),
// "warnings": [...]} (see planner/README.md), map keys in plan order.
nlohmann::ordered_json PlanToJson(const Plan& plan);
// The node of a group a plan device is on (GroupInventory: GPUs node-major, "cpu" and "disk" the leader's); 0 on one
// machine.
int NodeOf(const Plan& plan, const Device& device);
// A table a person reads at a glance: per device, layers, planned GiB, budget GiB, % used.
std::string PlanToTable(const ModelSpec& spec, const Plan& plan);

}  // namespace strata::planner
