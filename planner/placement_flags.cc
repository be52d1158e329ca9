#include "planner/placement_flags.h"

#include <string>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

// Declared at global scope, as ABSL_FLAG asks; only ParsePlacement reads them.
ABSL_FLAG(std::string, model, "",
          "checkpoint directory: config.json, *.safetensors (their headers are checked against the config) and "
          "tokenizer.json where the binary uses one");
ABSL_FLAG(std::string, module_tree, "", "any architecture: a module tree JSON (tools/export_module_tree.py)");
ABSL_FLAG(std::string, device_map, "balanced_low_0",
          "auto | balanced | balanced_low_0 | sequential | a JSON map ('{\"model\": 0, \"lm_head\": \"cpu\"}') | "
          "@FILE holding one");
ABSL_FLAG(std::string, max_memory, "",
          "per-device budgets as accelerate reads them: 0=20GiB,1=20GiB,cpu=64GiB,disk=1TB");
ABSL_FLAG(std::string, dtype, "", "size (and run) the weights in D: float32 | float16 | bfloat16");
ABSL_FLAG(std::string, quantized_sizing, "packed",
          "quantized checkpoints: packed (the bytes the files hold: strata runs FP8 and int4 weights packed) | "
          "transformers (what transformers' quantizer registers, FP8 dequantized unless GPU 0 has compute "
          "capability >= 8.9)");
ABSL_FLAG(int64_t, kv_cache_tokens, 0,
          "reserve KV cache for N tokens on every GPU that holds decoder layers; when serving, the paged KV cache "
          "of each stage holds N tokens (0: none when planning, --max-batch x --max-context when serving)");
ABSL_FLAG(std::string, fp8_matmul, "dequantize",
          "block-wise FP8 layers on a GPU: dequantize (blocks of weight rows into a GEMM in the serving dtype, exact "
          "to transformers' dequantized weights) | scaled_mm (W8A8: activations quantized to FP8 per token and 128 "
          "columns, torch's block-scaled _scaled_mm; needs cuBLAS block scaling, compute capability 9.0)");
ABSL_FLAG(std::string, runtime_reserve, "",
          "GPU memory kept on each GPU that runs a stage for what serving allocates besides weights and KV cache "
          "(cuBLAS workspaces, a micro-batch's activations and attention, the sampler's work over the logits): auto "
          "(sized from --max-batch, --max-context and --max-batch-tokens) | none (transformers' budgets) | a size "
          "such as 2GiB");
ABSL_FLAG(std::string, physical_devices, "", "run plan GPUs on these devices: 0=cpu,1=cpu or 0=cuda:0,1=cuda:0");

namespace strata::planner {

std::vector<cli::FlagSpec> PlacementFlagSpecs(const PlacementFlagSet& set) {
  std::vector<cli::FlagSpec> flags;
  flags.push_back(cli::Flag(FLAGS_model, "DIR"));
  if (set.module_tree) flags.push_back(cli::Flag(FLAGS_module_tree, "FILE"));
  flags.push_back(cli::Flag(FLAGS_device_map, "S"));
  flags.push_back(cli::Flag(FLAGS_max_memory, "SPEC")
                      .ShowDefault("what transformers takes from the machine (each GPU's free memory, 90% of the "
                                   "available host memory; 90% of the GPU when one GPU has memory, unless "
                                   "sequential)"));
  flags.push_back(cli::Flag(FLAGS_dtype, "D")
                      .ShowDefault("the checkpoint's; float32 when a server or strata-generate runs "
                                   "every stage on the CPU"));
  flags.push_back(cli::Flag(FLAGS_quantized_sizing, "S"));
  if (set.kv_cache_tokens) flags.push_back(cli::Flag(FLAGS_kv_cache_tokens, "N"));
  flags.push_back(
      cli::Flag(FLAGS_runtime_reserve, "R")
          .ShowDefault(set.runtime_reserve_auto ? "auto" : "none (a size keeps one on every GPU that runs a stage)"));
  if (set.physical_devices) flags.push_back(cli::Flag(FLAGS_physical_devices, "MAP").ShowDefault("GPU i is cuda:i"));
  if (set.fp8_matmul) flags.push_back(cli::Flag(FLAGS_fp8_matmul, "M"));
  return flags;
}

absl::StatusOr<Placement> ParsePlacement(const cli::ParsedArgs& parsed, const PlacementFlagSet& set) {
  Placement out;
  const bool model = parsed.Given(FLAGS_model);
  const bool module_tree = set.module_tree && parsed.Given(FLAGS_module_tree);
  if (set.module_tree && model == module_tree) {
    return absl::InvalidArgumentError("give exactly one of --model DIR or --module-tree FILE");
  }
  if (!set.module_tree && !model) return absl::InvalidArgumentError("--model DIR is required");
  if (model) {
    if (absl::GetFlag(FLAGS_model).empty()) return absl::InvalidArgumentError("--model: empty path");
    out.model_dir = absl::GetFlag(FLAGS_model);
  } else {
    if (absl::GetFlag(FLAGS_module_tree).empty()) return absl::InvalidArgumentError("--module-tree: empty path");
    out.module_tree = absl::GetFlag(FLAGS_module_tree);
  }
  absl::StatusOr<DeviceMapChoice> choice = ParseDeviceMapChoice(absl::GetFlag(FLAGS_device_map));
  if (!choice.ok()) return cli::FlagError(FLAGS_device_map, choice.status());
  out.device_map = *std::move(choice);
  if (parsed.Given(FLAGS_max_memory)) {
    absl::StatusOr<MaxMemory> max_memory = ParseMaxMemory(absl::GetFlag(FLAGS_max_memory));
    if (!max_memory.ok()) return cli::FlagError(FLAGS_max_memory, max_memory.status());
    out.max_memory = *std::move(max_memory);
  }
  if (parsed.Given(FLAGS_dtype)) {
    absl::StatusOr<DType> dtype = ParseDType(absl::GetFlag(FLAGS_dtype));
    if (!dtype.ok()) return cli::FlagError(FLAGS_dtype, dtype.status());
    out.dtype = *dtype;
  }
  absl::StatusOr<QuantizedSizing> sizing = ParseQuantizedSizing(absl::GetFlag(FLAGS_quantized_sizing));
  if (!sizing.ok()) return cli::FlagError(FLAGS_quantized_sizing, sizing.status());
  out.quantized_sizing = *sizing;
  if (set.kv_cache_tokens) {
    out.kv_cache_tokens = absl::GetFlag(FLAGS_kv_cache_tokens);
    if (out.kv_cache_tokens < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(cli::Spelling(FLAGS_kv_cache_tokens), ": \"", out.kv_cache_tokens, "\" is not an integer >= 0"));
    }
  }
  out.runtime_reserve.kind = set.runtime_reserve_auto ? RuntimeReserve::Kind::kAuto : RuntimeReserve::Kind::kNone;
  if (parsed.Given(FLAGS_runtime_reserve)) {
    absl::StatusOr<RuntimeReserve> reserve = ParseRuntimeReserve(absl::GetFlag(FLAGS_runtime_reserve));
    if (!reserve.ok()) return cli::FlagError(FLAGS_runtime_reserve, reserve.status());
    if (reserve->kind == RuntimeReserve::Kind::kAuto && !set.runtime_reserve_auto) {
      return absl::InvalidArgumentError(
          absl::StrCat(cli::Spelling(FLAGS_runtime_reserve),
                       ": auto is sized from serving limits this command does not take (strata-server's and "
                       "strata-generate's --max-batch, --max-context, --max-batch-tokens): give a size or none"));
    }
    out.runtime_reserve = *reserve;
  }
  if (set.physical_devices && parsed.Given(FLAGS_physical_devices)) {
    // ParsePhysicalDevices' messages already start with the flag.
    absl::StatusOr<PhysicalDeviceMap> physical = ParsePhysicalDevices(absl::GetFlag(FLAGS_physical_devices));
    if (!physical.ok()) return physical.status();
    out.physical_devices = *std::move(physical);
  }
  if (set.fp8_matmul) {
    const std::string matmul = absl::GetFlag(FLAGS_fp8_matmul);
    if (matmul != "dequantize" && matmul != "scaled_mm") {
      return absl::InvalidArgumentError(
          absl::StrCat(cli::Spelling(FLAGS_fp8_matmul), ": \"", matmul, "\" is not dequantize or scaled_mm"));
    }
    out.fp8_scaled_mm = matmul == "scaled_mm";
  }
  return out;
}

}  // namespace strata::planner
