#pragma once
// Internal (ATen): the sparse MoE block shared by Qwen3-MoE, Mixtral and DeepSeek-V3, as transformers 5.23's
// grouped_mm experts forward computes it: router logits, softmax in float32, top-k (renormalised when
// the config says so; DeepSeekMoE: sigmoid scores and group-limited top-k, moe.router), the (token, expert) pairs
// sorted by expert, each expert's rows through its gated MLP with one grouped matmul per projection (offsets from a
// histogram of the sorted ids), weighted, put back in token order and summed over the k choices. Tensor ops only: no
// per-token or per-expert host loop, no .item(). (LibTorch's grouped matmul has a fused CUDA kernel for bfloat16 on
// SM90+; for other dtypes, and on the CPU, its fallback runs one matmul per expert after reading the offsets on the
// host, as transformers' grouped_mm path does on the same tensors. On CUDA, float16 and float32 experts take
// PaddedExpertsMlp instead while its tensors fit kPaddedExpertsBytes, which reads nothing on the host.)
//
// The experts may live on another device than the rest of their layer (`strata-plan --experts-on`, a
// manual map placing `model.layers.N.mlp.experts` apart): only the routed rows and the offsets travel
// to the experts' device and the expert outputs travel back. Between CUDA devices the copies are
// ordered by the devices' current streams (the stage's stream on the layer's device). CPU experts behind a GPU
// layer: the rows come over into pinned memory on the layer's stream and the CPU waits for that copy's event alone
// (no device or stream synchronisation); the outputs go back from pinned memory, asynchronously.

#include <ATen/core/Tensor.h>

#include <vector>

#include "absl/status/statusor.h"
#include "planner/decoder_config.h"
#include "planner/model_spec.h"
#include "runtime/model/weights.h"

namespace strata::runtime {

// The fused experts' gated MLP over `rows` [S, H] sorted by expert (`sorted_experts` [S], group ends `offsets`
// [E] int32, as SparseMoe builds them), returning [S, H] in that order. Grouped: LibTorch's grouped matmul.
// Padded: each expert's rows scattered into [E, tokens, H] (an expert gets at most `tokens` rows: a token's top-k
// experts are distinct), two batched matmuls, gathered back: the group sizes never leave the device, where
// LibTorch's grouped matmul reads them on the host for every dtype but bfloat16 on SM90+ (a sync per layer).
at::Tensor GroupedExpertsMlp(const at::Tensor& rows, const at::Tensor& offsets, const at::Tensor& gate_up,
                             const at::Tensor& down);
at::Tensor PaddedExpertsMlp(const at::Tensor& rows, const at::Tensor& sorted_experts, const at::Tensor& offsets,
                            const at::Tensor& gate_up, const at::Tensor& down, int64_t tokens);
// The padded form's largest tensor may hold this many bytes; past it (long prefill chunks) the grouped form runs.
inline constexpr int64_t kPaddedExpertsBytes = int64_t{256} << 20;

// hidden [B, T, H] on the layer's device; router [E, H] there too (with DeepSeekMoE's e_score_correction_bias [E],
// moe.router kSigmoidGroups); `experts` (LoadExperts) on the experts' device. Returns [B, T, H] on hidden's device,
// in hidden's dtype.
// gpt-oss (moe.activation kClampedSwiglu): `experts` end with the experts' biases {gate_up_bias [E, 2I], down_bias
// [E, H]}, and `router_bias` [E] is the router's (moe.router kTopkSoftmax).
at::Tensor SparseMoe(const at::Tensor& hidden, const at::Tensor& router, const std::vector<Weight>& experts,
                     const planner::MoeConfig& moe, const at::Tensor& correction_bias = at::Tensor(),
                     const at::Tensor& router_bias = at::Tensor());

// Loads one experts module from its per-expert checkpoint tensors on `device`: dense experts fused into
// {gate_up [E, 2I, H] (each expert's gate rows, then its up rows), down [E, H, I]}; experts a quantized checkpoint
// stores packed (`quantized`) stay packed, three per expert {gate, up, down}, each run on its routed rows alone
// (quantized_linear.h: the kernels read its packed bytes for a few rows). `on_disk` ("disk" experts, dense): three
// views of the file per expert, paged in as they are used, so that a "disk" placement costs no memory.
absl::StatusOr<std::vector<Weight>> LoadExperts(WeightLoader& loader, const planner::ExpertsStorage& storage,
                                                at::Device device, const planner::SpecQuantization* quantized,
                                                bool on_disk = false);

}  // namespace strata::runtime
