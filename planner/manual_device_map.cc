// Manual device maps: parsing hf_device_map JSON and validating it against the model, as accelerate's
// check_device_map and transformers' tied-weight check do, made strict: what upstream only warns
// about (unknown module names, tied weights split across devices) is an error here, as is a
// parameter covered by two entries or a device over its max_memory.

#include "planner/manual_device_map.h"

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/file_reader.h"
#include "base/json.h"
#include "nlohmann/json.hpp"

namespace strata::planner {

absl::StatusOr<DeviceMap> ParseDeviceMap(absl::string_view json_text) {
  // Messages quote a value that is no device (printing recurses): bound its depth first.
  if (absl::Status s =
          base::CheckJsonDepth(std::string_view(json_text.data(), json_text.size()), base::kMaxJsonDepth, "device_map");
      !s.ok()) {
    return s;
  }
  // The parser callback sees each key of the top-level object before nlohmann folds duplicates.
  std::set<std::string> keys;
  std::string duplicate;
  auto on_event = [&](int depth, nlohmann::ordered_json::parse_event_t event, nlohmann::ordered_json& parsed) {
    if (event == nlohmann::ordered_json::parse_event_t::key && depth == 1) {
      const std::string key = parsed.get<std::string>();
      if (!keys.insert(key).second && duplicate.empty()) duplicate = key;
    }
    return true;
  };
  nlohmann::ordered_json json;
  try {
    json = nlohmann::ordered_json::parse(json_text.begin(), json_text.end(), on_event);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("device_map: not valid JSON: ", e.what()));
  }
  if (!json.is_object()) {
    return absl::InvalidArgumentError(
        "device_map: expected a JSON object of module name -> device, e.g. {\"\": 0} or {\"model\": 0, \"lm_head\": "
        "\"cpu\"}");
  }
  if (!duplicate.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("device_map: module \"", duplicate, "\" is given twice"));
  }
  if (json.empty()) return absl::InvalidArgumentError("device_map: the map is empty");
  DeviceMap map;
  for (const auto& [module, value] : json.items()) {
    absl::StatusOr<Device> device = absl::InvalidArgumentError("");
    if (value.is_number_integer()) {
      // An index past int's range must not wrap to a small one ({"": 4294967296} is not GPU 0).
      const bool fits = value.is_number_unsigned() ? value.get<uint64_t>() <= uint64_t{kMaxGpuIndex}
                                                   : value.get<int64_t>() >= 0 && value.get<int64_t>() <= kMaxGpuIndex;
      device = fits ? absl::StatusOr<Device>(Device::Gpu(static_cast<int>(value.get<int64_t>())))
                    : absl::InvalidArgumentError(
                          absl::StrCat("unknown device ", value.dump(), " (GPU indices are 0 to ", kMaxGpuIndex, ")"));
    } else if (value.is_string()) {
      device = ParseDevice(value.get<std::string>());
    } else {
      device = absl::InvalidArgumentError(absl::StrCat("unknown device ", value.dump()));
    }
    if (!device.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("device_map: module \"", module, "\": ", device.status().message()));
    }
    map.push_back({module, *device});
  }
  return map;
}

absl::StatusOr<DeviceMapChoice> ParseDeviceMapChoice(absl::string_view text) {
  absl::string_view t = absl::StripAsciiWhitespace(text);
  static constexpr std::pair<absl::string_view, Strategy> kStrategies[] = {{"auto", Strategy::kAuto},
                                                                           {"balanced", Strategy::kBalanced},
                                                                           {"balanced_low_0", Strategy::kBalancedLow0},
                                                                           {"sequential", Strategy::kSequential}};
  for (const auto& [name, strategy] : kStrategies) {
    if (t == name) return DeviceMapChoice{strategy, {}};
  }
  std::string json_text;
  if (absl::StartsWith(t, "@")) {
    std::string path(t.substr(1));
    absl::StatusOr<std::string> text = base::ReadRegularFile(path, base::kMaxDeviceMapFileBytes);
    if (!text.ok()) return absl::InvalidArgumentError(absl::StrCat("device_map: ", text.status().message()));
    json_text = *std::move(text);
  } else if (absl::StartsWith(t, "{")) {
    json_text = std::string(t);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("device_map: unknown strategy \"", text,
                     "\": expected auto, balanced, balanced_low_0, sequential, a JSON map or @FILE holding one"));
  }
  absl::StatusOr<DeviceMap> map = ParseDeviceMap(json_text);
  if (!map.ok()) return map.status();
  return DeviceMapChoice{Strategy::kManual, *std::move(map)};
}

namespace internal {

DeviceResolver::DeviceResolver(const DeviceMap& map) {
  for (const auto& [name, device] : map) entries_.emplace(name, device);
}

std::optional<std::pair<std::string, Device>> DeviceResolver::Find(absl::string_view name) const {
  std::string key(name);
  while (true) {
    auto it = entries_.find(key);
    if (it != entries_.end()) return *it;
    if (key.empty()) return std::nullopt;
    size_t dot = key.rfind('.');
    key = dot == std::string::npos ? "" : key.substr(0, dot);
  }
}

namespace {

struct NamedTensor {
  std::string name;
  const TensorSpec* tensor;
};

void CollectTensors(const ModuleSpec& module, std::vector<NamedTensor>& out, std::set<std::string>& names) {
  names.insert(module.name);
  for (const TensorSpec& p : module.parameters) {
    out.push_back({module.ChildName(p.name), &p});
    names.insert(out.back().name);
  }
  for (const TensorSpec& b : module.buffers) {
    out.push_back({module.ChildName(b.name), &b});
    names.insert(out.back().name);
  }
  for (const ModuleSpec& c : module.children) CollectTensors(c, out, names);
}

}  // namespace

absl::Status ValidateManualMap(const ModelSpec& spec, const DeviceMap& map, const std::optional<MaxMemory>& max_memory,
                               const std::map<Device, int64_t>& planned) {
  std::vector<NamedTensor> tensors;
  std::set<std::string> known;  // module and tensor names
  CollectTensors(spec.root, tensors, known);

  // Every key names something in the model.
  for (const auto& [name, device] : map) {
    if (name.empty() || known.count(name)) continue;
    return absl::InvalidArgumentError(
        absl::StrCat("device_map: unknown module \"", name, "\": the model has no module or tensor of that name"));
  }
  // No entry inside another: each tensor must be covered by exactly one entry.
  std::set<std::string> keys;
  for (const auto& entry : map) keys.insert(entry.first);
  for (const std::string& key : keys) {
    if (key.empty()) {
      if (keys.size() > 1) {
        return absl::InvalidArgumentError(absl::StrCat("device_map: \"\" covers the whole model, so \"",
                                                       *std::next(keys.begin()), "\" is covered by two entries"));
      }
      continue;
    }
    std::string parent = key;
    while (true) {
      size_t dot = parent.rfind('.');
      if (dot == std::string::npos) break;
      parent.resize(dot);
      if (keys.count(parent)) {
        return absl::InvalidArgumentError(
            absl::StrCat("device_map: \"", key, "\" is covered by two entries: \"", parent, "\" and \"", key, "\""));
      }
    }
  }
  // Every tensor of the checkpoint (parameters, tied aliases included, and persistent buffers) is
  // covered, like accelerate's check over state_dict().
  DeviceResolver resolver(map);
  for (const NamedTensor& t : tensors) {
    if (!t.tensor->persistent) continue;
    if (!resolver.Find(t.name)) {
      return absl::InvalidArgumentError(absl::StrCat("device_map: ", t.name, " is not covered by any entry"));
    }
  }
  // Devices exist: with max_memory given, every GPU in the map must be one of its devices.
  if (max_memory) {
    for (const auto& [name, device] : map) {
      if (!device.is_gpu()) continue;
      bool listed = false;
      for (const DeviceBudget& b : *max_memory) listed = listed || b.device == device;
      if (!listed) {
        return absl::InvalidArgumentError(absl::StrCat("device_map: module \"", name, "\" is mapped to unknown device ",
                                                       device.ToString(), " (max_memory lists no such GPU)"));
      }
    }
  }
  // Tied weights share storage, so they must share a device.
  for (const auto& [key, target] : spec.tied_weights) {
    auto a = resolver.Find(key);
    auto b = resolver.Find(target);
    if (a && b && !(a->second == b->second)) {
      return absl::InvalidArgumentError(
          absl::StrCat("device_map: tied weights ", key, " (on ", a->second.ToString(), " via \"", a->first, "\") and ",
                       target, " (on ", b->second.ToString(), " via \"", b->first, "\") must be on one device"));
    }
  }
  // Budgets.
  if (max_memory) {
    for (const DeviceBudget& b : *max_memory) {
      auto it = planned.find(b.device);
      if (it == planned.end()) continue;
      if (static_cast<double>(it->second) > b.bytes) {
        return absl::InvalidArgumentError(absl::StrCat("device_map: device ", b.device.ToString(),
                                                       " is over its max_memory: ", FormatBytes(it->second),
                                                       " planned, ", FormatBytes(b.bytes), " allowed"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace strata::planner
