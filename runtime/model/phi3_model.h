#pragma once
// Internal (ATen): Phi-3 units (llama_model.h's Unit / ModelDims). The layer is Llama's with fused
// projections: qkv_proj's rows are q | k | v and gate_up_proj's gate | up. They are split at run time by
// row views of the weights (no copy, the checkpoint's tensor is used in place): attention then runs
// through the shared SelfAttention, whose RoPE rotates only the tables' width (partial_rotary_factor).

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "runtime/model/llama_model.h"

namespace strata::runtime {

enum Phi3LayerWeight : int { kPhi3InputNorm, kPhi3Qkv, kPhi3O, kPhi3PostNorm, kPhi3GateUp, kPhi3Down };

std::vector<std::string> Phi3UnitTensorNames(UnitKind kind, int64_t layer, const ModelDims& dims, bool tied_head);

at::Tensor RunPhi3Unit(const Unit& unit, const std::vector<at::Tensor>& weights, const ModelDims& dims,
                       const at::Tensor& hidden, AttentionBatch& batch, KvLayer* cache, const at::Tensor& last);

}  // namespace strata::runtime
