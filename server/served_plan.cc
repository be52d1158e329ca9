#include "server/served_plan.h"

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace strata::server {

absl::StatusOr<ServedPlan> MakeServedPlan(const cli::Placement& placement,
                                          const std::optional<planner::MachineInventory>& inventory) {
  ServedPlan served;
  if (placement.model_dir.has_value()) {
    absl::StatusOr<planner::ModelSpec> spec = planner::LoadModelSpec(*placement.model_dir, placement.dtype);
    if (!spec.ok()) {
      return absl::Status(spec.status().code(),
                          absl::StrCat("--model ", placement.model_dir->string(), ": ", spec.status().message()));
    }
    served.spec = *std::move(spec);
  } else {
    absl::StatusOr<planner::ModelSpec> spec = planner::LoadModuleTree(*placement.module_tree, placement.dtype);
    if (!spec.ok()) {
      return absl::Status(spec.status().code(), absl::StrCat("--module-tree ", placement.module_tree->string(), ": ",
                                                             spec.status().message()));
    }
    served.spec = *std::move(spec);
  }

  planner::PlanRequest request;
  request.device_map = placement.device_map;
  request.max_memory = placement.max_memory;
  request.inventory = inventory;
  request.kv_cache_tokens = placement.kv_cache_tokens;
  absl::StatusOr<planner::Plan> plan = planner::MakePlan(served.spec, request);
  if (!plan.ok()) {
    // The planner names the module or device; say which flags the plan came from.
    return absl::Status(
        plan.status().code(),
        absl::StrCat("cannot place the model with --device-map ",
                     std::string(planner::StrategyName(placement.device_map.strategy)), ": ", plan.status().message()));
  }
  served.plan = *std::move(plan);
  served.kv_cache_tokens = placement.kv_cache_tokens;
  return served;
}

}  // namespace strata::server
