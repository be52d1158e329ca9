#pragma once
// Start-up and serving of a group of nodes (issue 24; plain C++, for strata-server): the leader plans for the
// group's GPUs as one machine, every node loads only its own stages, and the workers serve theirs until the
// group ends.
//
//   leader                                   worker r
//   NodeGroup::Join (accepts every worker)   NodeGroup::Join (connects; secret and facts checked both ways)
//   PlanForGroup: takes each join ─────────── TakeGroupPlan: sends its join (GPU budgets, data port)
//     plans the union, sends the plan ───────► loads its stages (LoadedModel::Load)
//   LoadedModel::Load (node 0's stages)
//   AwaitGroupReady ◄──────────────────────── ServeGroupStages: ready, then its stages until the group ends
//   Engine (executor with ExecutorOptions::group)
//
// The group's budgets: every node's --max-memory (in its own GPU numbering), or every node's discovered memory;
// not a mix. GPUs are numbered node-major (node 0's, then node 1's, ...); "cpu" and "disk" are the leader's host
// (planner/inventory.h, GroupInventory).

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/executor/executor.h"
#include "runtime/executor/group.h"
#include "runtime/executor/loaded_model.h"

namespace strata::runtime {

// The facts every node of a group must share (the handshake compares them): strata's version and group wire
// format, a digest of the model (config.json, the safetensors index or file list, the dtype asked for), the group
// size. Errors: the checkpoint cannot be read.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> GroupFacts(const ServingRequest& request,
                                                                            int group_size);

// The leader: takes every worker's join, plans `request` for the group, sends each worker the plan, and returns
// the leader's own LoadOptions (node 0's stages). Errors name the node.
absl::StatusOr<LoadOptions> PlanForGroup(NodeGroup& group, ServingRequest request);
// A worker: sends its join (its budgets from `request`), takes the leader's plan, links its neighbours in the
// stage order, and returns its LoadOptions (its own stages).
absl::StatusOr<LoadOptions> TakeGroupPlan(NodeGroup& group, ServingRequest request);
// The leader, after loading its own stages: every worker's ready (it loaded its stages), or the first failure.
absl::Status AwaitGroupReady(NodeGroup& group);
// A worker after TakeGroupPlan: loads its stages, says ready (or sends its failure to the leader), and serves them
// until the group ends: the leader leaves (OK when it drains) or a peer is lost (UNAVAILABLE naming it).
// `on_ready` (may be empty) is called once its stages are loaded and the leader told.
absl::Status ServeGroupStages(NodeGroup& group, const LoadOptions& load, ExecutorOptions options,
                              const std::function<void()>& on_ready = {});

}  // namespace strata::runtime
