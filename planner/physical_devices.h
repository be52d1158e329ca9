#pragma once
// Logical devices: a plan made for N GPUs runs on the devices that exist (GUIDE.md, Logical devices).
// `--physical-devices 0=cpu,1=cpu` or `0=cuda:0,1=cuda:0`; by default GPU i is cuda:i. Plain C++: the
// planner's binaries and the runtime read it alike (planner/placement_flags.h parses the flag).

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace strata::planner {

struct PhysicalDevice {
  bool cuda = false;
  int index = 0;  // CUDA ordinal when `cuda`
  std::string ToString() const { return cuda ? "cuda:" + std::to_string(index) : "cpu"; }
  friend bool operator==(const PhysicalDevice&, const PhysicalDevice&) = default;
};

// Plan GPU index -> the device that runs it.
using PhysicalDeviceMap = std::map<int, PhysicalDevice>;

// Parses "0=cpu,1=cuda:0". Errors name the entry: no "=", a GPU index that is not a non-negative
// integer, a device other than cpu / cuda:N, an index given twice.
absl::StatusOr<PhysicalDeviceMap> ParsePhysicalDevices(absl::string_view text);

}  // namespace strata::planner
