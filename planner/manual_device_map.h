#pragma once
// Manual device maps: lookup of a name's entry and validation against the model. Internal to
// planner/; parsing is public in plan.h.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "planner/device.h"
#include "planner/model_spec.h"
#include "planner/plan.h"

namespace strata::planner::internal {

// Finds the entry of a device map that covers a module or tensor name: the name itself, else its
// nearest dotted ancestor, else "" (the whole model).
class DeviceResolver {
 public:
  explicit DeviceResolver(const DeviceMap& map);
  std::optional<std::pair<std::string, Device>> Find(absl::string_view name) const;

 private:
  std::unordered_map<std::string, Device> entries_;
};

// Checks a manual map: known names, each checkpoint tensor covered exactly once, known devices, tied
// weights together, and each device's `planned` bytes within max_memory. Errors name the module or
// device.
absl::Status ValidateManualMap(const ModelSpec& spec, const DeviceMap& map, const std::optional<MaxMemory>& max_memory,
                               const std::map<Device, int64_t>& planned);

}  // namespace strata::planner::internal
