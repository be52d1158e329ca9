// libFuzzer harness: what --device-map, --max-memory, --inventory and --physical-devices parse (planner/
// device.h, planner/plan.h, planner/inventory.h, planner/physical_devices.h), and the plan those
// values make for a small Llama. The input is four lines:
//   MAX_MEMORY \n INVENTORY \n PHYSICAL_DEVICES \n DEVICE_MAP...
// (the device map is the rest: JSON may span lines). "@FILE" device maps are skipped: they read a file.
// When neither budgets nor an inventory parse, a fixed two-GPU inventory stands in, so that PlaceSpec never
// looks at this machine.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "planner/device.h"
#include "planner/inventory.h"
#include "planner/model_spec.h"
#include "planner/physical_devices.h"
#include "planner/plan.h"

namespace {

using namespace strata::planner;

const ModelSpec& SmallLlama() {
  static const ModelSpec spec = [] {
    const nlohmann::json config = {{"architectures", {"LlamaForCausalLM"}},
                                   {"hidden_size", 64},
                                   {"intermediate_size", 128},
                                   {"num_hidden_layers", 4},
                                   {"num_attention_heads", 4},
                                   {"num_key_value_heads", 2},
                                   {"vocab_size", 1000},
                                   {"tie_word_embeddings", true}};
    absl::StatusOr<ModelSpec> built = ModelSpecFromConfig(config, DType::kBFloat16);
    if (!built.ok()) std::abort();
    return *std::move(built);
  }();
  return spec;
}

// The next line of `rest` (without its newline), consumed.
absl::string_view NextLine(absl::string_view& rest) {
  const size_t end = rest.find('\n');
  absl::string_view line = rest.substr(0, end);
  rest = end == absl::string_view::npos ? absl::string_view() : rest.substr(end + 1);
  return line;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view rest(reinterpret_cast<const char*>(data), size);
  const absl::string_view max_memory_text = NextLine(rest);
  const absl::string_view inventory_text = NextLine(rest);
  const absl::string_view physical_text = NextLine(rest);
  const absl::string_view device_map_text = rest;

  // The single-value parsers, on each line as a whole.
  for (absl::string_view line : {max_memory_text, inventory_text, physical_text}) {
    (void)ParseMemorySize(line);
    (void)ParseDevice(line);
  }
  (void)strata::planner::ParsePhysicalDevices(physical_text);

  PlanRequest request;
  if (absl::StartsWith(absl::StripLeadingAsciiWhitespace(device_map_text), "@")) return 0;
  absl::StatusOr<DeviceMapChoice> choice = ParseDeviceMapChoice(device_map_text);
  absl::StatusOr<MaxMemory> max_memory = ParseMaxMemory(max_memory_text);
  absl::StatusOr<MachineInventory> inventory = ParseInventory(inventory_text);
  if (!choice.ok()) return 0;
  request.device_map = *std::move(choice);
  if (max_memory.ok()) {
    request.max_memory = *std::move(max_memory);
  } else if (inventory.ok()) {
    request.inventory = *std::move(inventory);
  } else {
    request.inventory = MachineInventory{{{4'000'000, 4'000'000, false}, {4'000'000, 4'000'000, false}}, 16'000'000};
  }
  request.kv_cache_tokens = 256;
  request.explain = true;
  absl::StatusOr<Plan> plan = PlaceSpec(SmallLlama(), request);
  if (plan.ok()) {
    (void)PlanToJson(*plan).dump();
    (void)PlanToTable(SmallLlama(), *plan);
  }
  return 0;
}
