#pragma once
// The plan strata-server serves: the model's module tree and where each module lives, made once at
// start-up from the validated placement flags.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/model_spec.h"
#include "planner/plan.h"
#include "server/flags.h"

namespace strata::server {

struct ServedPlan {
  planner::ModelSpec spec;
  planner::Plan plan;
  int64_t kv_cache_tokens = 0;
  // Serving: the paged KV cache (blocks per pool, tokens per block) and the plan devices holding a pool.
  int64_t kv_cache_blocks = 0;
  int64_t kv_block_tokens = 0;
  std::vector<std::string> kv_devices;
  // --draft-model's plan, in the same form (null without one).
  std::shared_ptr<const ServedPlan> draft;
};

// The plan of a server without weights to load (it only plans): the model's spec (--model or --module-tree) placed
// with no runtime reserve unless one was given by size. Errors keep the planner's code and message, prefixed with the
// flag that led to them (planner::LoadAndPlace, which runtime::PlanLoad uses too).
// `inventory`: the machine as discovered at start-up (used when --max-memory is absent).
absl::StatusOr<ServedPlan> PlanWithoutWeights(const planner::Placement& placement,
                                              const std::optional<planner::MachineInventory>& inventory);

}  // namespace strata::server
