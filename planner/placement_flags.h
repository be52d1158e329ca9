#pragma once
// The model and placement flags, declared once for strata-server, strata-generate and strata-plan: the
// same names, help, defaults and error messages in all three. A binary lists the ones it takes
// (PlacementFlagSpecs) in its CommandLine and reads them back as one Placement (ParsePlacement).
//
//   --model DIR, --module-tree FILE (where taken), --device-map S|JSON|@FILE (balanced_low_0),
//   --max-memory SPEC, --dtype D, --quantized-sizing packed|transformers, --kv-cache-tokens N (where taken),
//   --runtime-reserve auto|none|SIZE, --physical-devices MAP, --fp8-matmul dequantize|scaled_mm (where taken)

#include <cstdint>
#include <filesystem>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "cli/flags.h"
#include "planner/device.h"
#include "planner/model_spec.h"
#include "planner/physical_devices.h"
#include "planner/plan.h"

namespace strata::planner {

// Which of the optional placement flags a binary takes (--model, --device-map, --max-memory and --dtype
// always).
struct PlacementFlagSet {
  bool module_tree = false;  // --module-tree FILE as the other source of the spec
  bool kv_cache_tokens = false;
  bool physical_devices = false;  // only binaries that run the plan
  bool fp8_matmul = false;        // likewise
  // --runtime-reserve's default: auto where the binary has serving limits (the caller fills
  // Placement::runtime_reserve.limits), else none, and auto is refused.
  bool runtime_reserve_auto = false;
};

// What the placement flags said.
struct Placement {
  // With PlacementFlagSet::module_tree exactly one of the two; otherwise model_dir.
  std::optional<std::filesystem::path> model_dir;
  std::optional<std::filesystem::path> module_tree;
  DeviceMapChoice device_map;           // default: balanced_low_0, as transformers' examples use
  std::optional<MaxMemory> max_memory;  // absent: the planner's default (the machine's memory)
  std::optional<DType> dtype;           // absent: what the checkpoint declares
  // How a quantized checkpoint's linear layers are sized (planner/quantized_spec.h): the packed bytes strata
  // keeps (default) or what transformers' quantizer registers on this machine.
  QuantizedSizing quantized_sizing = QuantizedSizing::kPacked;
  int64_t kv_cache_tokens = 0;
  PhysicalDeviceMap physical_devices;  // empty: GPU i is cuda:i
  bool fp8_scaled_mm = false;          // --fp8-matmul scaled_mm: W8A8 FP8 layers on GPUs
  // --runtime-reserve (planner/runtime_reserve.h); for auto the binary sets `limits` from its serving flags.
  RuntimeReserve runtime_reserve;
};

// The flags of `set`, in the order --help lists them; `section` heads the first (may be empty).
std::vector<cli::FlagSpec> PlacementFlagSpecs(const PlacementFlagSet& set);

// Reads the placement flags of `set` after Parse. Errors are InvalidArgument naming the flag
// ("--max-memory: ...", "give exactly one of --model DIR or --module-tree FILE").
absl::StatusOr<Placement> ParsePlacement(const cli::ParsedArgs& parsed, const PlacementFlagSet& set);

}  // namespace strata::planner
