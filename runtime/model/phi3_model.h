#pragma once
// Internal (ATen): Phi-3 units (unit.h's runner). The layer is Llama's with fused
// projections: qkv_proj's rows are q | k | v and gate_up_proj's gate | up. They are split at run time by
// row views of the weights (no copy, the checkpoint's tensor is used in place): attention then runs
// through the shared SelfAttention, whose RoPE rotates only the tables' width (partial_rotary_factor).

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "runtime/model/unit.h"

namespace strata::runtime {

enum Phi3LayerWeight : int { kPhi3InputNorm, kPhi3Qkv, kPhi3O, kPhi3PostNorm, kPhi3GateUp, kPhi3Down };

// UnitRunner::weights and ::run (unit.h); the embedding, final norm and LM head are Llama's.
std::vector<std::string> Phi3UnitWeights(UnitKind kind, int64_t layer, const DecoderConfig& dims);

at::Tensor RunPhi3Unit(const Unit& unit, const std::vector<WeightTensor>& weights, const DecoderConfig& dims,
                       const at::Tensor& hidden, AttentionBatch& batch, KvLayer* cache, const at::Tensor& last);

}  // namespace strata::runtime
