#include "planner/device.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace strata::planner {

std::string Device::ToString() const {
  switch (kind) {
    case Kind::kGpu:
      return std::to_string(index);
    case Kind::kCpu:
      return "cpu";
    case Kind::kDisk:
      return "disk";
  }
  return "?";
}

absl::StatusOr<Device> ParseDevice(absl::string_view text) {
  absl::string_view t = absl::StripAsciiWhitespace(text);
  if (t == "cpu") return Device::Cpu();
  if (t == "disk") return Device::Disk();
  absl::string_view digits = t;
  absl::ConsumePrefix(&digits, "cuda:");
  int index = 0;
  if (!digits.empty() && std::isdigit(static_cast<unsigned char>(digits[0])) && absl::SimpleAtoi(digits, &index)) {
    return Device::Gpu(index);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown device \"", text, "\": expected a GPU index (0, 1, ... or cuda:N), \"cpu\" or \"disk\""));
}

namespace {

// Python's float() accepts more than this, but these are the spellings a size is written in.
bool ParseNumber(absl::string_view text, double* out) {
  text = absl::StripAsciiWhitespace(text);
  if (text.empty()) return false;
  return absl::SimpleAtod(text, out) && std::isfinite(*out);
}

}  // namespace

// Reproduces accelerate's convert_file_size_to_int: the unit suffix is matched case-insensitively,
// GiB/MiB/KiB are binary, GB/MB/KB decimal, and a decimal unit whose last letter is a lowercase "b"
// ("5Gb") means bits, so the byte count is divided by 8. The float is truncated towards zero.
absl::StatusOr<int64_t> ParseMemorySize(absl::string_view text) {
  const std::string upper = absl::AsciiStrToUpper(text);
  auto invalid = [&] {
    return absl::InvalidArgumentError(absl::StrCat("cannot parse size \"", text,
                                                   "\": use an integer number of bytes or a number with a unit "
                                                   "(TiB, GiB, MiB, KiB, TB, GB, MB, KB), e.g. \"20GiB\""));
  };
  struct Unit {
    absl::string_view suffix;
    double factor;
    bool decimal;
  };
  // TiB and TB go beyond accelerate (which rejects them) so that disk budgets read naturally.
  static constexpr Unit kUnits[] = {{.suffix = "TIB", .factor = 1099511627776.0, .decimal = false},
                                    {.suffix = "GIB", .factor = 1073741824.0, .decimal = false},
                                    {.suffix = "MIB", .factor = 1048576.0, .decimal = false},
                                    {.suffix = "KIB", .factor = 1024.0, .decimal = false},
                                    {.suffix = "TB", .factor = 1e12, .decimal = true},
                                    {.suffix = "GB", .factor = 1e9, .decimal = true},
                                    {.suffix = "MB", .factor = 1e6, .decimal = true},
                                    {.suffix = "KB", .factor = 1e3, .decimal = true}};
  for (const Unit& unit : kUnits) {
    if (!absl::EndsWith(upper, unit.suffix)) continue;
    double number = 0;
    if (!ParseNumber(text.substr(0, text.size() - unit.suffix.size()), &number)) return invalid();
    double bytes = std::trunc(number * unit.factor);
    if (bytes < 0 || bytes > 9.2e18) return invalid();
    int64_t size = static_cast<int64_t>(bytes);
    if (unit.decimal && text.back() == 'b') size /= 8;
    return size;
  }
  // A plain integer (accelerate accepts Python ints only; a bare "1.5" is an error there too).
  int64_t bytes = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &bytes) || bytes < 0) return invalid();
  return bytes;
}

absl::StatusOr<std::vector<DeviceSize>> ParseDeviceSizes(absl::string_view spec, absl::string_view what) {
  std::vector<DeviceSize> result;
  std::set<Device> seen;
  for (absl::string_view entry : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(entry, absl::MaxSplits('=', 1));
    if (!absl::StrContains(entry, '=')) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": entry \"", entry, "\" is not DEVICE=SIZE (e.g. 0=20GiB, cpu=64GiB)"));
    }
    absl::StatusOr<Device> device = ParseDevice(kv.first);
    if (!device.ok()) return absl::InvalidArgumentError(absl::StrCat(what, ": ", device.status().message()));
    absl::StatusOr<int64_t> bytes = ParseMemorySize(absl::StripAsciiWhitespace(kv.second));
    if (!bytes.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": ", bytes.status().message(), " for device ", device->ToString()));
    }
    if (!seen.insert(*device).second) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": device ", device->ToString(), " is given twice"));
    }
    result.push_back({*device, *bytes});
  }
  if (result.empty())
    return absl::InvalidArgumentError(absl::StrCat(what, ": no devices given (e.g. 0=20GiB,cpu=64GiB)"));
  std::stable_sort(result.begin(), result.end(),
                   [](const DeviceSize& a, const DeviceSize& b) { return a.device < b.device; });
  return result;
}

absl::StatusOr<MaxMemory> ParseMaxMemory(absl::string_view spec) {
  absl::StatusOr<std::vector<DeviceSize>> entries = ParseDeviceSizes(spec, "max_memory");
  if (!entries.ok()) return entries.status();
  MaxMemory result;
  for (const DeviceSize& e : *entries) result.push_back({e.device, static_cast<double>(e.bytes)});
  return result;
}

std::string FormatBytes(double bytes) {
  if (std::isinf(bytes)) return "unlimited";
  constexpr double kGiB = 1073741824.0;
  constexpr double kMiB = 1048576.0;
  if (bytes >= kGiB) return absl::StrFormat("%.2f GiB", bytes / kGiB);
  if (bytes >= kMiB) return absl::StrFormat("%.1f MiB", bytes / kMiB);
  return absl::StrFormat("%.0f B", bytes);
}

}  // namespace strata::planner
