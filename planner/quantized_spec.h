#pragma once
// A quantized checkpoint's spec (planner/quantization.h applied to a ModelSpec): which linear layers the
// format converts, what each stores (SpecQuantization::linears), and the module tree's parameters under the
// two sizings (--quantized-sizing): `packed`, the bytes the files hold, and `transformers`, the tensors
// transformers' quantizer's replacement modules register, machine dependence included.

#include <map>
#include <string>

#include "absl/status/status.h"
#include "nlohmann/json_fwd.hpp"
#include "planner/inventory.h"
#include "planner/model_spec.h"

namespace strata::planner {

// Reads config.json's quantization_config (ParseQuantizationConfig) and, when there is one, fills
// spec.quantization: every linear layer (class "Linear", and each MoE experts module's per-expert
// projections) the format converts, skip lists matched as the format's transformers quantizer matches
// them, and sizes the tree `packed`. ModelSpecFromConfig calls it once for every family.
absl::Status QuantizeSpec(const nlohmann::json& config, ModelSpec& spec);

// Takes each quantized linear's scale dtype from the checkpoint header (tensor name -> safetensors dtype,
// "F32", "BF16", "U8", ...) where the header holds an accepted one, and re-sizes the tree with the sizing it
// has. A dtype that is not accepted is left for the checkpoint check to report. LoadModelSpec calls it.
void AdoptStoredScaleDTypes(ModelSpec& spec, const std::map<std::string, std::string>& header_dtypes);

// Whether transformers' FP8 quantizer keeps FP8 weights on `inventory`'s machine: CUDA device 0 (what
// torch.cuda.get_device_capability() asks about) has compute capability 8.9 or more. No GPU, or a GPU whose
// capability is unknown, dequantizes.
bool TransformersKeepsFp8(const MachineInventory& inventory);

// Re-sizes a quantized spec's tree (nothing for a dense spec): `packed` or `transformers` (for which
// `keeps_fp8` says whether FP8 stays FP8: TransformersKeepsFp8 of the machine).
void SizeQuantizedSpec(ModelSpec& spec, QuantizedSizing sizing, bool keeps_fp8);

// The checkpoint tensors of the quantized linears, replacing their dense entries in `tensors`
// (CheckpointTensors calls it).
void AddQuantizedCheckpointTensors(const ModelSpec& spec, std::map<std::string, ExpectedTensor>& tensors);

// "fp8 (float8_e4m3fn, block 128x128), 196 quantized linear layers, sized packed (...)", for plans.
std::string QuantizationSummary(const ModelSpec& spec);
// {"quant_method", "format", "sizing", "planned_dense", "quantized_linears"} (strata-plan --json's "quantization").
nlohmann::ordered_json QuantizationToJson(const ModelSpec& spec);

}  // namespace strata::planner
