#pragma once
// strata-plan --experts-on DEVICE: keep the decoder layers of a MoE model on the GPUs and put the experts
// of the layers that do not fit there on DEVICE instead of the whole layer, in the spirit of llama.cpp's
// --n-cpu-moe. The rule (planner/README.md, "Experts apart"):
//
//   1. Plan the model with the request's strategy. If every entry is on a GPU (or the budgets list no
//      GPU), nothing moves.
//   2. Otherwise, for k = 1, 2, ... experts modules counted from the LAST layer: plan the model with
//      those k experts modules weighing nothing; the first k whose plan puts every entry on a GPU wins
//      (k = all of them when none does; what still does not fit is offloaded as the strategy says).
//   3. The winning map, with each moved layer's entry split into its children so that exactly
//      `model.layers.N.mlp.experts` goes to DEVICE, is then validated as a manual map against the
//      request's max_memory (DEVICE must hold the moved experts) and the KV reserve.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/device.h"
#include "planner/model_spec.h"
#include "planner/plan.h"

namespace strata::planner {

struct ExpertsOnPlan {
  Plan plan;                       // strategy: the request's; device_map with the experts apart
  std::vector<std::string> moved;  // experts modules placed on the device, in layer order
};

// Errors: a manual map in the request (there is nothing to re-plan), a model without experts modules,
// DEVICE over its max_memory.
absl::StatusOr<ExpertsOnPlan> PlaceSpecWithExpertsOn(const ModelSpec& spec, const PlanRequest& request,
                                                     const Device& experts_device);

}  // namespace strata::planner
