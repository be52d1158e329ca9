// Plans written for machines (JSON in hf_device_map form) and for people (a table).

#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "planner/manual_device_map.h"
#include "planner/plan.h"

namespace strata::planner {
namespace {

nlohmann::ordered_json DeviceJson(const Device& device) {
  if (device.is_gpu()) return device.index;
  return device.ToString();
}

// Budgets are whole bytes except where transformers scaled them by a float; unlimited is null.
nlohmann::ordered_json BytesJson(double bytes) {
  if (std::isinf(bytes)) return nullptr;
  if (bytes == std::floor(bytes) && std::fabs(bytes) < 9e18) return static_cast<int64_t>(bytes);
  return bytes;
}

// "0-3, 7" from sorted layer indices.
std::string Ranges(const std::vector<int>& indices) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < indices.size();) {
    size_t j = i;
    while (j + 1 < indices.size() && indices[j + 1] == indices[j] + 1) ++j;
    parts.push_back(i == j ? absl::StrCat(indices[i]) : absl::StrCat(indices[i], "-", indices[j]));
    i = j + 1;
  }
  return parts.empty() ? "-" : absl::StrJoin(parts, ", ");
}

struct LayerInfo {
  std::string name;
  int index = -1;            // trailing number of the name
  std::set<Device> devices;  // where its tensors are
};

std::vector<LayerInfo> Layers(const ModelSpec& spec, const DeviceMap& map) {
  internal::DeviceResolver resolver(map);
  std::vector<LayerInfo> layers;
  for (const ModuleSpec* m : NoSplitModules(spec)) {
    LayerInfo info;
    info.name = m->name;
    size_t dot = m->name.rfind('.');
    if (!absl::SimpleAtoi(m->name.substr(dot == std::string::npos ? 0 : dot + 1), &info.index)) info.index = -1;
    std::vector<const ModuleSpec*> inner = {m};
    while (!inner.empty()) {
      const ModuleSpec* x = inner.back();
      inner.pop_back();
      for (const TensorSpec& p : x->parameters)
        if (auto e = resolver.Find(x->ChildName(p.name))) info.devices.insert(e->second);
      for (const ModuleSpec& c : x->children) inner.push_back(&c);
    }
    layers.push_back(std::move(info));
  }
  return layers;
}

bool IsLayerOrInside(const std::string& name, const std::vector<LayerInfo>& layers) {
  for (const LayerInfo& l : layers) {
    if (name == l.name || name.rfind(l.name + ".", 0) == 0 || l.name.rfind(name.empty() ? "" : name + ".", 0) == 0)
      return true;
  }
  return false;
}

// A group plan (GroupInventory): the node a device is on, to show; nothing on one machine.
std::optional<int> ShownNode(const Plan& plan, const Device& device) {
  if (!plan.inventory || plan.inventory->nodes() < 2) return std::nullopt;
  return NodeOf(plan, device);
}

}  // namespace

int NodeOf(const Plan& plan, const Device& device) {
  if (!plan.inventory || !device.is_gpu()) return 0;
  return plan.inventory->NodeOf(static_cast<size_t>(device.index));
}

nlohmann::ordered_json PlanToJson(const Plan& plan) {
  nlohmann::ordered_json json;
  json["strategy"] = StrategyName(plan.strategy);
  nlohmann::ordered_json map = nlohmann::ordered_json::object();
  for (const auto& [name, device] : plan.device_map) map[name] = DeviceJson(device);
  json["device_map"] = std::move(map);
  nlohmann::ordered_json devices = nlohmann::ordered_json::array();
  for (const DeviceUsage& d : plan.devices) {
    devices.push_back({{"device", d.device.ToString()},
                       {"budget_bytes", BytesJson(d.budget_bytes)},
                       {"planned_bytes", d.planned_bytes},
                       {"kv_cache_bytes", d.kv_cache_bytes},
                       {"runtime_reserve_bytes", d.runtime_reserve.total()}});
    if (d.kv_capacity_tokens >= 0) devices.back()["kv_capacity_tokens"] = d.kv_capacity_tokens;
    if (std::optional<int> node = ShownNode(plan, d.device)) devices.back()["node"] = *node;
  }
  json["devices"] = std::move(devices);
  if (plan.kv_capacity) {
    json["kv_capacity"] = {{"tokens", plan.kv_capacity->tokens},
                           {"limited_by", plan.kv_capacity->limited_by.ToString()}};
  }
  nlohmann::ordered_json stages = nlohmann::ordered_json::array();
  for (const Stage& s : plan.stages) {
    stages.push_back({{"device", s.device.ToString()}, {"modules", s.modules}});
    if (std::optional<int> node = ShownNode(plan, s.device)) stages.back()["node"] = *node;
  }
  json["stages"] = std::move(stages);
  if (plan.inventory) {
    nlohmann::ordered_json gpus = nlohmann::ordered_json::array();
    for (size_t i = 0; i < plan.inventory->gpus.size(); ++i) {
      const GpuMemory& gpu = plan.inventory->gpus[i];
      gpus.push_back({{"device", std::to_string(i)},
                      {"free_bytes", gpu.free_bytes},
                      {"total_bytes", gpu.total_bytes},
                      {"integrated", gpu.integrated},
                      {"compute_capability", gpu.compute_capability_major > 0
                                                 ? nlohmann::ordered_json(absl::StrCat(
                                                       gpu.compute_capability_major, ".", gpu.compute_capability_minor))
                                                 : nlohmann::ordered_json(nullptr)}});
      if (plan.inventory->nodes() > 1) gpus.back()["node"] = plan.inventory->NodeOf(i);
    }
    json["inventory"] = {{"gpus", std::move(gpus)}, {"cpu_available_bytes", plan.inventory->host_available_bytes}};
  }
  json["warnings"] = plan.warnings;
  return json;
}

std::string PlanToTable(const ModelSpec& spec, const Plan& plan) {
  const std::vector<LayerInfo> layers = Layers(spec, plan.device_map);
  int64_t total = 0;
  for (const DeviceUsage& d : plan.devices) total += d.planned_bytes;
  std::string out = absl::StrFormat("%s, %s, strategy %s, %s in %d stage%s\n", spec.architecture, DTypeName(spec.dtype),
                                    StrategyName(plan.strategy), FormatBytes(total), plan.stages.size(),
                                    plan.stages.size() == 1 ? "" : "s");
  const bool any_kv =
      std::any_of(plan.devices.begin(), plan.devices.end(), [](const DeviceUsage& d) { return d.kv_cache_bytes > 0; });
  const bool any_runtime = std::any_of(plan.devices.begin(), plan.devices.end(),
                                       [](const DeviceUsage& d) { return d.runtime_reserve.total() > 0; });
  const bool group = plan.inventory && plan.inventory->nodes() > 1;
  if (group) absl::StrAppendFormat(&out, "%-4s  ", "node");
  absl::StrAppendFormat(&out, "%-6s  %-16s  %12s  %12s  %7s", "device", "layers", "planned", "budget", "used");
  if (any_kv) absl::StrAppendFormat(&out, "  %12s", "kv cache");
  if (any_runtime) absl::StrAppendFormat(&out, "  %12s", "runtime");
  absl::StrAppend(&out, "  other modules\n");
  for (const DeviceUsage& d : plan.devices) {
    std::vector<int> whole;
    std::vector<int> partial;  // split layers (e.g. experts apart): "31-47 (part)"
    for (const LayerInfo& l : layers) {
      if (!l.devices.count(d.device)) continue;
      if (l.devices.size() == 1) {
        whole.push_back(l.index);
      } else {
        partial.push_back(l.index);
      }
    }
    std::string layer_text = Ranges(whole);
    if (!partial.empty()) layer_text = (whole.empty() ? "" : layer_text + ", ") + Ranges(partial) + " (part)";
    std::vector<std::string> others;
    for (const auto& [name, device] : plan.device_map) {
      if (device == d.device && !IsLayerOrInside(name, layers)) others.push_back(name.empty() ? "(all)" : name);
    }
    std::string used = std::isinf(d.budget_bytes) || d.budget_bytes <= 0
                           ? (d.planned_bytes > 0 && d.budget_bytes <= 0 ? "over" : "-")
                           : absl::StrFormat("%.1f%%", 100.0 * static_cast<double>(d.planned_bytes) / d.budget_bytes);
    if (group) absl::StrAppendFormat(&out, "%-4d  ", *ShownNode(plan, d.device));
    absl::StrAppendFormat(&out, "%-6s  %-16s  %12s  %12s  %7s", d.device.ToString(), layer_text,
                          FormatBytes(d.planned_bytes), FormatBytes(d.budget_bytes), used);
    if (any_kv) absl::StrAppendFormat(&out, "  %12s", FormatBytes(d.kv_cache_bytes));
    if (any_runtime) absl::StrAppendFormat(&out, "  %12s", FormatBytes(static_cast<double>(d.runtime_reserve.total())));
    absl::StrAppend(&out, "  ", others.empty() ? "-" : absl::StrJoin(others, ", "), "\n");
  }
  std::vector<std::string> stage_text;
  for (const Stage& s : plan.stages) {
    stage_text.push_back(group ? absl::StrCat(s.device.ToString(), " (node ", NodeOf(plan, s.device), ")")
                               : s.device.ToString());
  }
  absl::StrAppend(&out, "stages: ", absl::StrJoin(stage_text, " -> "), "\n");
  if (plan.kv_capacity) {
    absl::StrAppend(
        &out, "kv cache: room for ", plan.kv_capacity->tokens, " tokens, the tightest stage's (GPU ",
        plan.kv_capacity->limited_by.ToString(),
        "; every stage's pool holds the same blocks, so the pipeline holds what its tightest stage holds)\n");
  }
  return out;
}

}  // namespace strata::planner
