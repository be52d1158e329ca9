// ModelSpecFromConfig for MiniMaxM2ForCausalLM (`minimax_m2`): GQA attention with RMSNorms over all query heads and
// all key heads at once (q_norm [heads x head_dim], k_norm [kv_heads x head_dim], before RoPE), RoPE over the leading
// rotary_dim dims of each head, and a sparse MoE block in every layer: a sigmoid router whose choice adds the block's
// e_score_correction_bias, the chosen scores renormalised (MoeConfig::Router::kSigmoid), experts of intermediate_size.
//
// The tree reproduces what transformers 5.23 builds for `AutoModelForCausalLM.from_config(config, dtype=...)`
// (models/minimax_m2/modeling_minimax_m2.py, configuration_minimax_m2.py): MiniMaxM2Attention's q_proj, k_proj,
// v_proj, o_proj, q_norm, k_norm (no biases); MiniMaxM2SparseMoeBlock's gate, experts and its own
// e_score_correction_bias buffer. Checkpoints keep Mixtral's names (transformers' conversion mapping):
// block_sparse_moe.gate.weight, block_sparse_moe.e_score_correction_bias and
// block_sparse_moe.experts.E.{w1,w3,w2}.weight for each expert's gate, up and down projections; MiniMax's released
// checkpoints are FP8 blocks (planner/quantization).
//
// The forward pass's settings (ModelSpec::decoder): partial_rotary_factor (the RoPE dict's, else the top-level one,
// else the legacy rotary_dim / head_dim), RoPE (Llama-style types, theta 5e6 by default), the router.

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "planner/decoder_config.h"
#include "planner/model_registry.h"
#include "planner/model_spec.h"
#include "planner/model_spec_moe.h"
#include "planner/spec_builder.h"

namespace strata::planner {
namespace {

using namespace spec_builder;  // NOLINT: the family builders' shared vocabulary

ModuleSpec RmsNorm(const ModuleSpec& parent, const char* local, int64_t dim, DType dtype) {
  return Norm(parent, local, "MiniMaxM2RMSNorm", dim, dtype);
}

ModuleSpec Attention(const ModuleSpec& layer, const DecoderSizes& sizes, DType dtype) {
  const int64_t hidden = sizes.hidden, d = sizes.head_dim;
  ModuleSpec attn = Module(layer, "self_attn", "MiniMaxM2Attention");
  attn.children.push_back(LinearModule(attn, "q_proj", hidden, sizes.heads * d, false, dtype));
  attn.children.push_back(LinearModule(attn, "k_proj", hidden, sizes.kv_heads * d, false, dtype));
  attn.children.push_back(LinearModule(attn, "v_proj", hidden, sizes.kv_heads * d, false, dtype));
  attn.children.push_back(LinearModule(attn, "o_proj", sizes.heads * d, hidden, false, dtype));
  attn.children.push_back(RmsNorm(attn, "q_norm", sizes.heads * d, dtype));
  attn.children.push_back(RmsNorm(attn, "k_norm", sizes.kv_heads * d, dtype));
  return attn;
}

ModuleSpec MoeBlock(const ModuleSpec& layer, const DecoderSizes& sizes, int64_t experts_count,
                    const std::string& act_class, DType dtype) {
  const int64_t hidden = sizes.hidden, inter = sizes.intermediate;
  ModuleSpec block = Module(layer, "mlp", "MiniMaxM2SparseMoeBlock");
  ModuleSpec gate = Module(block, "gate", "MiniMaxM2TopKRouter");
  gate.parameters.push_back(Tensor("weight", {experts_count, hidden}, dtype));
  block.children.push_back(std::move(gate));
  ModuleSpec experts = Module(block, "experts", "MiniMaxM2Experts");
  experts.parameters.push_back(Tensor("gate_up_proj", {experts_count, 2 * inter, hidden}, dtype));
  experts.parameters.push_back(Tensor("down_proj", {experts_count, hidden, inter}, dtype));
  experts.children.push_back(Module(experts, "act_fn", act_class));
  block.children.push_back(std::move(experts));
  block.buffers.push_back(Tensor("e_score_correction_bias", {experts_count}, dtype));
  return block;
}

// The fraction of each head RoPE rotates: the RoPE dict's partial_rotary_factor, else the top-level one, else the
// legacy rotary_dim / head_dim (MiniMaxM2Config.convert_rope_params_to_dict), else 1.
absl::StatusOr<double> RotaryFraction(const json& config, int64_t head_dim) {
  absl::StatusOr<RopeDict> dict = FindRopeDict(config);
  if (!dict.ok()) return dict.status();
  const bool stated = (config.contains("partial_rotary_factor") && !config["partial_rotary_factor"].is_null()) ||
                      (dict->params != nullptr && dict->params->contains("partial_rotary_factor"));
  double fallback = 1.0;
  if (auto it = config.find("rotary_dim"); !stated && it != config.end() && !it->is_null()) {
    absl::StatusOr<int64_t> dim = PositiveIntAtMost(*it, "rotary_dim", head_dim);
    if (!dim.ok()) return dim.status();
    fallback = static_cast<double>(*dim) / static_cast<double>(head_dim);
  }
  return PartialRotaryFactor(config, fallback);
}

}  // namespace

absl::StatusOr<ModelSpec> MiniMaxM2SpecFromConfig(const json& config, const Architecture& arch, DType dtype,
                                                  int64_t max_positions) {
  absl::StatusOr<DecoderSizes> sizes = ReadDecoderSizes(config);
  if (!sizes.ok()) return sizes.status();
  absl::StatusOr<int64_t> head_dim = ReadGqaHeads(config, 8, 128, *sizes);
  if (!head_dim.ok()) return head_dim.status();
  const char* experts_field = config.contains("num_local_experts") ? "num_local_experts" : "num_experts";
  absl::StatusOr<int64_t> experts = PositiveIntOr(config, experts_field, 256, false, internal::kMaxExperts);
  if (!experts.ok()) return experts.status();
  absl::StatusOr<int64_t> top_k = PositiveIntOr(config, "num_experts_per_tok", 8, false, internal::kMaxExperts);
  if (!top_k.ok()) return top_k.status();
  if (*top_k > *experts) {
    return FieldError("num_experts_per_tok",
                      absl::StrCat("(", *top_k, ") must not exceed ", experts_field, " (", *experts, ")"));
  }
  if (absl::Status s = internal::CheckExpertModules(*experts, sizes->layers, experts_field); !s.ok()) return s;
  absl::StatusOr<bool> tie = BoolOr(config, "tie_word_embeddings", false);
  if (!tie.ok()) return tie.status();
  absl::StatusOr<std::string> act = HiddenAct(config, /*silu_only=*/true);
  if (!act.ok()) return act.status();
  if (absl::Status s = CheckPadTokenId(config, sizes->vocab, 0); !s.ok()) return s;
  absl::StatusOr<double> factor = RotaryFraction(config, *head_dim);
  if (!factor.ok()) return factor.status();
  const int64_t rotary_dim = static_cast<int64_t>(static_cast<double>(*head_dim) * *factor);
  if (rotary_dim < 2) return FieldError("partial_rotary_factor", "rotates fewer than 2 dims of a head");

  ModelSpec spec = DecoderSpecFrame(std::string(arch.name), dtype, "MiniMaxM2", *tie, *sizes);
  const int64_t hidden = sizes->hidden;
  const std::string act_class = *ActivationClass(*act);
  if (absl::Status s = BuildCausalLm(
          spec, *sizes, "MiniMaxM2", (rotary_dim + 1) / 2,
          [&](const ModuleSpec& list, int64_t i) {
            ModuleSpec layer = Module(list, std::to_string(i), "MiniMaxM2DecoderLayer");
            layer.children.push_back(Attention(layer, *sizes, dtype));
            layer.children.push_back(MoeBlock(layer, *sizes, *experts, act_class, dtype));
            layer.children.push_back(RmsNorm(layer, "input_layernorm", hidden, dtype));
            layer.children.push_back(RmsNorm(layer, "post_attention_layernorm", hidden, dtype));
            const std::string stored = absl::StrCat("model.layers.", i, ".block_sparse_moe");
            spec.stored_names[layer.ChildName("mlp.gate.weight")] = stored + ".gate.weight";
            spec.stored_names[layer.ChildName("mlp.e_score_correction_bias")] = stored + ".e_score_correction_bias";
            spec.per_expert_storage.push_back(ExpertsStorage{layer.ChildName("mlp.experts"), stored + ".experts",
                                                             "w1.weight", "w3.weight", "w2.weight", *experts, hidden,
                                                             sizes->intermediate, dtype});
            return layer;
          });
      !s.ok()) {
    return s;
  }

  DecoderConfig decoder;
  decoder.architecture = spec.architecture;
  SetSizes(*sizes, decoder);
  decoder.qk_norm = true;
  decoder.qk_norm_across_heads = true;
  decoder.rotary_dim = rotary_dim == *head_dim ? 0 : rotary_dim;
  decoder.moe.router = MoeConfig::Router::kSigmoid;
  decoder.moe.num_experts = *experts;
  decoder.moe.top_k = *top_k;
  decoder.moe.norm_topk_prob = true;
  decoder.moe.weights_in_float32 = true;
  decoder.moe.sparse.assign(static_cast<size_t>(sizes->layers), true);
  decoder.sliding_window.assign(static_cast<size_t>(sizes->layers), 0);
  // MiniMaxM2Config.default_theta 5e6.
  if (absl::Status s = FinishDictRopeDecoder(config, 1e-6, 5000000.0, max_positions, nullptr, std::move(decoder), spec);
      !s.ok()) {
    return s;
  }
  return spec;
}

}  // namespace strata::planner
