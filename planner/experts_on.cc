#include "planner/experts_on.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"

namespace strata::planner {
namespace {

// Experts modules in definition order: what the MoE families build (ExpertsStorage), else any module
// named `experts` whose class ends in "Experts" (a module tree of another MoE family).
void FindExperts(const ModuleSpec& module, std::vector<std::string>& out) {
  const std::string suffix = "Experts";
  const bool named = module.name.size() >= 8 && module.name.compare(module.name.size() - 8, 8, ".experts") == 0;
  const bool typed = module.class_name.size() >= suffix.size() &&
                     module.class_name.compare(module.class_name.size() - suffix.size(), suffix.size(), suffix) == 0;
  if (named && typed && !module.parameters.empty()) {
    out.push_back(module.name);
    return;
  }
  for (const ModuleSpec& child : module.children) FindExperts(child, out);
}

bool Inside(const std::string& name, const std::string& module) {
  return module.empty() || name == module ||
         (name.size() > module.size() && name.compare(0, module.size(), module) == 0 && name[module.size()] == '.');
}

// The spec with the parameters of `weightless` experts modules sized 0 (their first dimension zeroed).
void ZeroExperts(ModuleSpec& module, const std::set<std::string>& weightless) {
  if (weightless.contains(module.name)) {
    for (TensorSpec& t : module.parameters) {
      if (!t.shape.empty()) t.shape[0] = 0;
    }
    return;
  }
  for (ModuleSpec& child : module.children) ZeroExperts(child, weightless);
}

const ModuleSpec* FindModule(const ModuleSpec& module, const std::string& name) {
  if (module.name == name) return &module;
  for (const ModuleSpec& child : module.children) {
    if (Inside(name, child.name)) return FindModule(child, name);
  }
  return nullptr;
}

// The entries that replace `module` (on `device`) so that each moved experts module inside it is on
// `experts_device`: modules with nothing moved inside stay whole; on the way down, direct parameters
// and buffers become entries of their own, in definition order (parameters, children, buffers).
void Expand(const ModuleSpec& module, const Device& device, const std::set<std::string>& moved,
            const Device& experts_device, DeviceMap& out) {
  if (moved.contains(module.name)) {
    out.push_back({module.name, experts_device});
    return;
  }
  bool holds_moved = false;
  for (const std::string& m : moved) holds_moved = holds_moved || Inside(m, module.name);
  if (!holds_moved) {
    out.push_back({module.name, device});
    return;
  }
  for (const TensorSpec& p : module.parameters) out.push_back({module.ChildName(p.name), device});
  for (const ModuleSpec& child : module.children) Expand(child, device, moved, experts_device, out);
  for (const TensorSpec& b : module.buffers) out.push_back({module.ChildName(b.name), device});
}

bool AllOnGpus(const DeviceMap& map) {
  return std::all_of(map.begin(), map.end(), [](const auto& entry) { return entry.second.is_gpu(); });
}

}  // namespace

absl::StatusOr<ExpertsOnPlan> PlaceSpecWithExpertsOn(const ModelSpec& spec, const PlanRequest& request,
                                                     const Device& experts_device) {
  if (request.device_map.strategy == Strategy::kManual) {
    return absl::InvalidArgumentError(
        "--experts-on: needs a strategy (auto, balanced, balanced_low_0, sequential), not a manual device map; "
        "a manual map places model.layers.N.mlp.experts itself");
  }
  std::vector<std::string> experts;
  FindExperts(spec.root, experts);
  if (experts.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--experts-on: ", spec.architecture, " has no experts modules (model.layers.N.mlp.experts)"));
  }
  absl::StatusOr<Plan> first = PlaceSpec(spec, request);
  if (!first.ok()) return first.status();
  ExpertsOnPlan out;
  const bool has_gpus = std::any_of(first->devices.begin(), first->devices.end(),
                                    [](const DeviceUsage& d) { return d.device.is_gpu() && d.budget_bytes > 0; });
  if (AllOnGpus(first->device_map) || !has_gpus) {
    out.plan = *std::move(first);
    out.plan.explanation.push_back(absl::StrCat("experts on ", experts_device.ToString(), ": none moved (",
                                                has_gpus ? "everything fits the GPUs" : "no GPU in the budgets", ")"));
    return out;
  }

  // Moving the experts of the last k layers.
  std::set<std::string> moved;
  absl::StatusOr<Plan> placed = std::move(first);
  for (size_t k = 1; k <= experts.size(); ++k) {
    moved.insert(experts[experts.size() - k]);
    ModelSpec lighter = spec;
    ZeroExperts(lighter.root, moved);
    placed = PlaceSpec(lighter, request);
    if (!placed.ok()) return placed.status();
    if (AllOnGpus(placed->device_map)) break;
  }

  PlanRequest manual = request;
  manual.device_map.strategy = Strategy::kManual;
  manual.device_map.manual.clear();
  for (const auto& [name, device] : placed->device_map) {
    const ModuleSpec* module = FindModule(spec.root, name);
    bool holds_moved = false;
    for (const std::string& m : moved) holds_moved = holds_moved || Inside(m, name);
    if (module == nullptr || !holds_moved || device == experts_device) {
      manual.device_map.manual.push_back({name, device});
      continue;
    }
    Expand(*module, device, moved, experts_device, manual.device_map.manual);
  }
  absl::StatusOr<Plan> final_plan = PlaceSpec(spec, manual);
  if (!final_plan.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--experts-on ", experts_device.ToString(), ": the experts of ",
                                                   moved.size(),
                                                   " layers do not fit there: ", final_plan.status().message()));
  }
  out.plan = *std::move(final_plan);
  out.plan.strategy = request.device_map.strategy;
  out.plan.warnings.insert(out.plan.warnings.end(), placed->warnings.begin(), placed->warnings.end());
  for (const std::string& m : experts) {
    if (moved.contains(m)) out.moved.push_back(m);
  }
  out.plan.explanation = placed->explanation;
  out.plan.explanation.push_back(absl::StrCat("experts on ", experts_device.ToString(), ": moved ", out.moved.size(),
                                              " of ", experts.size(), " experts modules (", out.moved.front(), " .. ",
                                              out.moved.back(), "), counted from the last layer, until the rest ",
                                              AllOnGpus(placed->device_map) ? "fits the GPUs" : "was all moved"));
  return out;
}

}  // namespace strata::planner
