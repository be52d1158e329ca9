#pragma once
// Quantized checkpoints: config.json's `quantization_config`, read once into a typed QuantizationConfig, and
// for each linear layer the checkpoint stores quantized, what it stores (QuantizedLinear). The planner sizes
// the module tree from it (packed bytes by default, or transformers' quantizers' own sizing) and checks the
// safetensors headers against it; the runtime reads QuantizedLinear to load each such layer packed
// (runtime/model/quantized_linear.h). Plain C++: no torch.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/dtype.h"
#include "nlohmann/json_fwd.hpp"

namespace strata::planner {

// quantization_config.quant_method (with compressed-tensors' format).
enum class QuantMethod {
  kFp8,                // "fp8": block-wise float8_e4m3fn (Qwen3-FP8, DeepSeek-V3), transformers' FineGrainedFP8
  kCompressedTensors,  // "compressed-tensors": pack-quantized int4/int8, float-quantized FP8
  kAwq,                // "awq", version "gemm"
  kGptq,               // "gptq", checkpoint_format "gptq" (v1)
  kMxfp4,              // "mxfp4": gpt-oss's experts as E2M1 blocks with E8M0 scales (ExpertsStorage::fused_interleaved)
};

// How one quantized linear layer's weight is stored in the checkpoint, and so how the runtime unpacks it into
// kernels/quantized.h's canonical form.
enum class QuantLayout {
  kFp8Block,          // weight F8_E4M3 [N, K]; scale [ceil(N/block_n), ceil(K/block_k)] (the multiplier)
  kCompressedPacked,  // weight_packed int32 [N, K*bits/32] (bits values per int32, lowest first, stored
                      // value + 2^(bits-1) for symmetric); weight_scale [N, K/group]; weight_zero_point
                      // packed int32 [N/(32/bits), K/group] (asymmetric); weight_shape int [2]
  kAwqGemm,           // qweight int32 [K, N/8] (AWQ's interleaved nibble order 0,2,4,6,1,3,5,7); qzeros
                      // int32 [K/group, N/8] same order; scales [K/group, N]
  kGptqV1,            // qweight int32 [K*bits/32, N] packed along K; qzeros int32 [K/group, N*bits/32] stored
                      // minus one; scales [K/group, N]; g_idx int32 [K] (act-order when not k/group)
};

struct QuantizationConfig {
  QuantMethod method = QuantMethod::kFp8;
  std::string quant_method;  // as config.json says it, for messages
  // Block-wise FP8 (and compressed-tensors' FP8 with its strategy mapped onto blocks: "channel" is
  // block_n 1 x block_k K, "tensor" N x K, "block" its block_structure).
  int64_t block_n = 0;
  int64_t block_k = 0;
  bool scale_ue8m0 = false;  // scale_fmt "ue8m0": the scales are powers of two (stored as uint8 exponents or floats)
  bool dynamic_activations = true;  // activation_scheme "dynamic" (static activation scales are refused)
  // Integer formats.
  int bits = 0;            // 4 or 8
  int64_t group_size = 0;  // along K; -1 in the config (one group per row) is stored as K per layer
  bool symmetric = true;
  bool desc_act = false;  // GPTQ act-order: g_idx is a permutation of the groups
  // Modules left dense: FP8's modules_to_not_convert, compressed-tensors' ignore (names or "re:" patterns),
  // AWQ's modules_to_not_convert, GPTQ's (none by default), as the config lists them.
  std::vector<std::string> not_converted;
  // transformers' dequantize switch (FP8, compressed-tensors): the model is planned as a dense one.
  bool dequantize = false;
  // compressed-tensors: the config group's targets ("Linear", module names, "re:" patterns), its strategy
  // ("group", "channel", "tensor", "block") and format ("pack-quantized", "float-quantized"); float_weights
  // for its FP8 scheme (type "float", mapped onto block_n x block_k: see above).
  std::vector<std::string> targets;
  std::string strategy;
  std::string format;
  bool float_weights = false;
  // GPTQ: the module list whose nn.Linear layers optimum converts (block_name_to_quantize, "model.layers" when
  // the config does not say) and, when given, the names within a block that are (modules_in_block_to_quantize,
  // flattened; a layer is converted when its name ends with one).
  std::string block_name;
  std::vector<std::string> modules_in_block;
  // FP8: modules_to_not_convert was absent or null, so transformers adds its default skips (tied weights,
  // the last parameter's module, the output embeddings: lm_head). A list, even an empty one, replaces them.
  bool default_skips = false;
};

// How the planner sizes a quantized model's linear layers (--quantized-sizing).
enum class QuantizedSizing {
  kPacked,        // the bytes the checkpoint holds: what strata keeps in memory (its kernels run them packed)
  kTransformers,  // what transformers' quantizer registers, machine dependence included (FP8 dequantized to
                  // the serving dtype unless CUDA device 0 has compute capability 8.9 or more)
};
absl::string_view QuantizedSizingName(QuantizedSizing sizing);  // "packed", "transformers"
// "packed" | "transformers"; an error listing both otherwise.
absl::StatusOr<QuantizedSizing> ParseQuantizedSizing(absl::string_view text);

// config.json's quantization_config, or nullopt when the config has none (or null). Errors read
// "config.json: quantization_config.FIELD: what"; unknown methods, formats, strategies, bit widths and types are
// refused naming the value and listing the supported ones, as are activation schemes strata cannot run.
absl::StatusOr<std::optional<QuantizationConfig>> ParseQuantizationConfig(const nlohmann::json& config);

// "fp8 (block 128x128)", for plans and messages.
std::string QuantizationConfigSummary(const QuantizationConfig& config);

// One linear layer the checkpoint stores quantized. Tensor names are full checkpoint names.
struct QuantizedLinear {
  std::string module;  // "model.layers.0.self_attn.q_proj"
  QuantLayout layout = QuantLayout::kFp8Block;
  int64_t out_features = 0;  // N
  int64_t in_features = 0;   // K
  int bits = 8;              // 8 for FP8; 4 or 8 for the integer layouts
  int64_t block_n = 0;       // FP8: scale block (1 x K per channel, N x K per tensor)
  int64_t block_k = 0;
  int64_t group_size = 0;  // integer layouts: along K (K when one group per row)
  bool symmetric = true;
  std::string weight;      // "...q_proj.weight" / "...weight_packed" / "...qweight"
  std::string scale;       // "...weight_scale_inv" / "...weight_scale" / "...scales"
  std::string zero_point;  // "...weight_zero_point" / "...qzeros"; empty when symmetric (AWQ/GPTQ always have one)
  std::string g_idx;       // GPTQ's "...g_idx"; empty otherwise
  std::string shape;       // compressed-tensors' "...weight_shape"; empty otherwise
  checkpoint::DType scale_dtype = checkpoint::DType::kFloat32;
  bool scale_ue8m0 = false;
  // compressed-tensors' "tensor" strategy: one scale, stored as [1] rather than a [1, 1] grid.
  bool per_tensor_scale = false;
  // The layer has a bias (not quantized: "...bias" [N], stored as the dense checkpoint stores it).
  bool has_bias = false;
};

// What ModelSpec carries for a quantized checkpoint (ModelSpec::quantization).
struct SpecQuantization {
  QuantizationConfig config;
  // By the dense weight's full name ("model.layers.0.self_attn.q_proj.weight"): the name the family runners
  // read (runtime/model/unit.h) and the name transformers' dense model has.
  std::map<std::string, QuantizedLinear> linears;
  // The sizing the module tree currently has (planner/quantized_spec.h's SizeQuantizedSpec), and whether that
  // sizing planned the model dense (transformers dequantizing FP8 on this machine, or `dequantize`).
  QuantizedSizing sizing = QuantizedSizing::kPacked;
  bool planned_dense = false;
  // MXFP4: the experts modules stored as `X_blocks` uint8 [E, N, K / 32, 16] and `X_scales` uint8 [E, N, K / 32] for
  // X = gate_up_proj (N = 2I, gate and up rows interleaved) and down_proj (N = H), their biases dense.
  std::vector<std::string> mxfp4_experts;
};

}  // namespace strata::planner
