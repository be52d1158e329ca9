#include "planner/physical_devices.h"

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace strata::planner {

absl::StatusOr<PhysicalDeviceMap> ParsePhysicalDevices(absl::string_view text) {
  PhysicalDeviceMap out;
  for (absl::string_view entry : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    entry = absl::StripAsciiWhitespace(entry);
    const size_t eq = entry.find('=');
    auto error = [&](absl::string_view what) {
      return absl::InvalidArgumentError(absl::StrCat("--physical-devices: \"", entry, "\": ", what));
    };
    if (eq == absl::string_view::npos) return error("expected GPU=DEVICE, e.g. 0=cpu or 1=cuda:0");
    int gpu = 0;
    if (!absl::SimpleAtoi(entry.substr(0, eq), &gpu) || gpu < 0)
      return error("the GPU index is not a non-negative integer");
    absl::string_view device = entry.substr(eq + 1);
    PhysicalDevice physical;
    if (device == "cpu") {
      physical.cuda = false;
    } else if (absl::ConsumePrefix(&device, "cuda:") && absl::SimpleAtoi(device, &physical.index) &&
               physical.index >= 0) {
      physical.cuda = true;
    } else {
      return error("the device is neither cpu nor cuda:N");
    }
    if (!out.emplace(gpu, physical).second) return error(absl::StrCat("GPU ", gpu, " is given twice"));
  }
  return out;
}

}  // namespace strata::planner
