#include "server/served_plan.h"

#include <string>
#include <utility>

namespace strata::server {

absl::StatusOr<ServedPlan> PlanWithoutWeights(const planner::Placement& placement,
                                              const std::optional<planner::MachineInventory>& inventory) {
  planner::PlanRequest request;
  request.device_map = placement.device_map;
  request.max_memory = placement.max_memory;
  request.inventory = inventory;
  request.kv_cache_tokens = placement.kv_cache_tokens;
  request.runtime_reserve = placement.runtime_reserve;
  // A server that only plans runs no engine: auto (sized from what the engine allocates) keeps transformers'
  // budgets; a size given by hand is kept.
  if (request.runtime_reserve.kind == planner::RuntimeReserve::Kind::kAuto) {
    request.runtime_reserve.kind = planner::RuntimeReserve::Kind::kNone;
  }
  request.quantized_sizing = placement.quantized_sizing;
  absl::StatusOr<planner::PlannedModel> planned =
      planner::LoadAndPlace(planner::ModelSource{placement.model_dir, placement.module_tree}, placement.dtype, request);
  if (!planned.ok()) return planned.status();
  ServedPlan served;
  served.spec = std::move(planned->spec);
  served.plan = std::move(planned->plan);
  served.kv_cache_tokens = placement.kv_cache_tokens;
  return served;
}

}  // namespace strata::server
