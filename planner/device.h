#pragma once
// Devices of a plan and their memory budgets, with accelerate's `max_memory` semantics.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace strata::planner {

// The largest GPU index a device map or --max-memory may name: what Device::index holds. Larger
// indices are errors, never truncated.
inline constexpr int64_t kMaxGpuIndex = 2147483647;

// A place a module can live: GPU `index`, host memory, or the checkpoint on disk. Written as in
// transformers' hf_device_map: "0", "1", ... (JSON integers), "cpu", "disk".
struct Device {
  enum class Kind { kGpu, kCpu, kDisk };
  Kind kind = Kind::kCpu;
  int index = 0;  // meaningful for kGpu only

  static Device Gpu(int index) { return {Kind::kGpu, index}; }
  static Device Cpu() { return {Kind::kCpu, 0}; }
  static Device Disk() { return {Kind::kDisk, 0}; }

  bool is_gpu() const { return kind == Kind::kGpu; }
  std::string ToString() const;  // "0", "cpu", "disk"
  friend bool operator==(const Device&, const Device&) = default;
  // GPUs by index, then cpu, then disk: the order accelerate fills devices in.
  friend auto operator<=>(const Device& a, const Device& b) {
    if (a.kind != b.kind) return a.kind <=> b.kind;
    return a.index <=> b.index;
  }
};

// "0", "cuda:0", "cpu", "disk" -> Device. The error names the text.
absl::StatusOr<Device> ParseDevice(absl::string_view text);

// One device's budget. Budgets are doubles because transformers scales some of them by 0.9 and
// compares the resulting Python floats with integer sizes; doubles reproduce that exactly.
struct DeviceBudget {
  Device device;
  double bytes = 0;
};

// accelerate's `max_memory`, in its order: GPUs sorted by index, then "cpu", then "disk".
using MaxMemory = std::vector<DeviceBudget>;

// A size as accelerate's convert_file_size_to_int reads it: an integer number of bytes, or a number
// with a unit: GiB/MiB/KiB (powers of 2), GB/MB/KB (powers of 10; a lowercase final "b" means bits).
// TiB and TB are accepted too (accelerate has no terabyte units).
absl::StatusOr<int64_t> ParseMemorySize(absl::string_view text);

// One "DEVICE=SIZE" entry of a list such as max_memory or an inventory.
struct DeviceSize {
  Device device;
  int64_t bytes = 0;
};

// "0=20GiB,1=20GiB,cpu=64GiB,disk=1TB" -> entries sorted as accelerate sorts max_memory (GPUs by
// index, then cpu, then disk). Errors start with `what` ("max_memory", "inventory") and name the
// entry: a missing "=", an unknown device, an unparsable size, a device given twice, no entry at all.
absl::StatusOr<std::vector<DeviceSize>> ParseDeviceSizes(absl::string_view spec, absl::string_view what);

// ParseDeviceSizes(spec, "max_memory") as accelerate's `max_memory`.
absl::StatusOr<MaxMemory> ParseMaxMemory(absl::string_view spec);

// "20.00 GiB" style, for tables and messages.
std::string FormatBytes(double bytes);

}  // namespace strata::planner
