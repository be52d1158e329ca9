// The forward-pass settings of Qwen3, Qwen3-MoE and Mixtral beyond the Llama family's (model_config.h):
// q/k norms and the sparse MoE routing. The MoE fields are read by the planner's own reader
// (planner/model_spec_moe.h), so the planner and the runtime agree on which layers are sparse.

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "planner/model_spec_moe.h"
#include "runtime/model/model_config.h"

namespace strata::runtime {

absl::Status ReadQwen3AndMoeConfig(const nlohmann::json& config, DecoderConfig& out) {
  const bool qwen3 = out.architecture == "Qwen3ForCausalLM";
  const bool qwen3_moe = out.architecture == "Qwen3MoeForCausalLM";
  const bool mixtral = out.architecture == "MixtralForCausalLM";
  if (!qwen3 && !qwen3_moe && !mixtral) return absl::OkStatus();
  out.qk_norm = qwen3 || qwen3_moe;
  if (qwen3) return absl::OkStatus();
  absl::StatusOr<planner::internal::MoeFields> moe =
      qwen3_moe ? planner::internal::ReadQwen3MoeFields(config) : planner::internal::ReadMixtralFields(config);
  if (!moe.ok()) return moe.status();
  out.moe.num_experts = moe->num_experts;
  out.moe.top_k = moe->top_k;
  out.moe.norm_topk_prob = moe->norm_topk_prob;
  out.moe.weights_in_float32 = mixtral;
  out.moe.sparse.assign(static_cast<size_t>(out.num_layers), true);
  if (qwen3_moe) {
    for (int64_t i = 0; i < out.num_layers; ++i) {
      out.moe.sparse[static_cast<size_t>(i)] = planner::internal::Qwen3MoeLayerIsSparse(*moe, i);
    }
  }
  return absl::OkStatus();
}

}  // namespace strata::runtime
