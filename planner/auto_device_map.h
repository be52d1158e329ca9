#pragma once
// transformers' automatic placement, step for step: get_balanced_memory (the max_memory rebalancing
// behind "auto", "balanced" and "balanced_low_0") and infer_auto_device_map (the greedy fill with
// splitting, tied parameters and the largest-layer reserve), then clean_device_map.
// Internal to planner/: callers use PlaceSpec (plan.h).

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "planner/device.h"
#include "planner/model_spec.h"
#include "planner/plan.h"

namespace strata::planner::internal {

// compute_module_sizes(model, only_modules=False): bytes of every module and of every parameter and
// buffer. Tied keys are not counted, as upstream. Kept by address rather than by name: planning asks
// for thousands of sizes and building name strings for them would dominate its time.
class ModuleSizes {
 public:
  explicit ModuleSizes(const ModelSpec& spec);
  int64_t Of(const ModuleSpec& module) const;
  int64_t Of(const TensorSpec& tensor) const;  // 0 for a tied alias
  int64_t total() const { return total_; }
  // Largest sum of tensors owned directly by one module (get_balanced_memory's "biggest leaf").
  int64_t biggest_leaf() const { return biggest_leaf_; }

 private:
  int64_t Add(const ModuleSpec& module);
  std::unordered_map<const ModuleSpec*, int64_t> module_sizes_;
  std::unordered_map<const TensorSpec*, bool> tied_;  // tied aliases, by address
  int64_t total_ = 0;
  int64_t biggest_leaf_ = 0;
};

// get_balanced_memory(model, max_memory, no_split, low_zero): shrinks the GPU budgets so that the
// fill spreads the model evenly; with low_zero, GPU 0 keeps only what the others cannot hold.
// `trace` (optional) receives one line per decision.
absl::StatusOr<MaxMemory> BalancedMaxMemory(const ModelSpec& spec, const ModuleSizes& sizes, MaxMemory max_memory,
                                            bool low_zero, std::vector<std::string>* trace);

// infer_auto_device_map(model, max_memory, no_split) followed by clean_device_map. The result is in
// module definition order.
absl::StatusOr<DeviceMap> InferAutoDeviceMap(const ModelSpec& spec, const ModuleSizes& sizes,
                                             const MaxMemory& max_memory, std::vector<std::string>* trace);

// Orders device-map keys as the modules are defined (a module, its parameters, its children, its
// buffers), the order a forward pass meets them. Names the model lacks go last, in their given order.
void SortByDefinition(const ModelSpec& spec, DeviceMap& map);

}  // namespace strata::planner::internal
