// ModelSpecFromConfig for Glm4MoeForCausalLM (`glm4_moe`: GLM-4.5, 4.6, 4.7 and their -Air models): GQA attention
// with partial RoPE, per-head q/k RMSNorms (`use_qk_norm`) and q/k/v biases (`attention_bias`; o_proj has none), and
// DeepSeekMoE (model_spec_moe.h's GroupRouterFields: sigmoid router with e_score_correction_bias, shared experts, the
// first `first_k_dense_replace` layers dense).
//
// The tree reproduces what transformers 5.23 builds for `AutoModelForCausalLM.from_config(config, dtype=...)`
// (models/glm4_moe/modeling_glm4_moe.py, configuration_glm4_moe.py): Glm4MoeAttention's q_proj, k_proj, v_proj, o_proj
// then q_norm, k_norm; a Glm4MoeMLP (intermediate_size) or Glm4MoeMoE (experts, gate with its float32
// e_score_correction_bias buffer, shared_experts of moe_intermediate_size x n_shared_experts). Checkpoints store the
// experts one tensor per expert (mlp.experts.E.{gate,up,down}_proj.weight) and carry the multi-token-prediction layer
// as `model.layers.<num_hidden_layers>.*` (num_nextn_predict_layers of them), which transformers does not build:
// strata neither plans nor loads them (ModelSpec::ignored_prefixes) unless --speculative mtp keeps the first
// (ModelSpec::mtp).
//
// The forward pass's settings (ModelSpec::decoder): the rotated leading dims (head_dim x partial_rotary_factor, 0.5
// unless the config says otherwise), RoPE (Llama-style types), the q/k norms and biases, the router.

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

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

// Glm4MoeConfig's defaults for DeepSeekMoE's fields.
constexpr internal::GroupRouterFields kGlmRouter{.moe_intermediate = 1408,
                                                 .n_shared_experts = 1,
                                                 .n_routed_experts = 128,
                                                 .routed_scaling_factor = 1.0,
                                                 .n_group = 1,
                                                 .topk_group = 1,
                                                 .top_k = 8,
                                                 .first_k_dense_replace = 1,
                                                 .norm_topk_prob = true};

struct GlmFields {
  internal::GroupRouterFields moe;
  bool attention_bias = false;
  bool qk_norm = false;
  bool tie = false;
  double partial_rotary_factor = 0.5;
  std::string act_class;
};

absl::StatusOr<GlmFields> ReadFields(const json& config, int64_t layers) {
  GlmFields f;
  absl::StatusOr<internal::GroupRouterFields> moe = internal::ReadGroupRouterFields(config, kGlmRouter, layers);
  if (!moe.ok()) return moe.status();
  f.moe = *moe;
  for (auto [field, out] : {std::pair{"attention_bias", &f.attention_bias}, std::pair{"use_qk_norm", &f.qk_norm},
                            std::pair{"tie_word_embeddings", &f.tie}}) {
    absl::StatusOr<bool> b = BoolOr(config, field, *out);
    if (!b.ok()) return b.status();
    *out = *b;
  }
  absl::StatusOr<std::string> act = HiddenAct(config, /*silu_only=*/true);
  if (!act.ok()) return act.status();
  f.act_class = *ActivationClass(*act);
  return f;
}

ModuleSpec RmsNorm(const ModuleSpec& parent, const char* local, int64_t dim, DType dtype) {
  return Norm(parent, local, "Glm4MoeRMSNorm", dim, dtype);
}

ModuleSpec Mlp(const ModuleSpec& parent, const char* local, int64_t hidden, int64_t intermediate, const GlmFields& f,
               DType dtype) {
  ModuleSpec mlp = Module(parent, local, "Glm4MoeMLP");
  mlp.children.push_back(LinearModule(mlp, "gate_proj", hidden, intermediate, false, dtype));
  mlp.children.push_back(LinearModule(mlp, "up_proj", hidden, intermediate, false, dtype));
  mlp.children.push_back(LinearModule(mlp, "down_proj", intermediate, hidden, false, dtype));
  mlp.children.push_back(Module(mlp, "act_fn", f.act_class));
  return mlp;
}

ModuleSpec Attention(const ModuleSpec& layer, const DecoderSizes& sizes, const GlmFields& f, DType dtype) {
  const int64_t hidden = sizes.hidden, d = sizes.head_dim;
  ModuleSpec attn = Module(layer, "self_attn", "Glm4MoeAttention");
  attn.children.push_back(LinearModule(attn, "q_proj", hidden, sizes.heads * d, f.attention_bias, dtype));
  attn.children.push_back(LinearModule(attn, "k_proj", hidden, sizes.kv_heads * d, f.attention_bias, dtype));
  attn.children.push_back(LinearModule(attn, "v_proj", hidden, sizes.kv_heads * d, f.attention_bias, dtype));
  attn.children.push_back(LinearModule(attn, "o_proj", sizes.heads * d, hidden, /*bias=*/false, dtype));
  if (f.qk_norm) {
    attn.children.push_back(RmsNorm(attn, "q_norm", d, dtype));
    attn.children.push_back(RmsNorm(attn, "k_norm", d, dtype));
  }
  return attn;
}

ModuleSpec MoeBlock(const ModuleSpec& layer, int64_t hidden, const GlmFields& f, DType dtype) {
  const internal::GroupRouterFields& m = f.moe;
  ModuleSpec block = Module(layer, "mlp", "Glm4MoeMoE");
  ModuleSpec experts = Module(block, "experts", "Glm4MoeExperts");
  experts.parameters.push_back(Tensor("gate_up_proj", {m.n_routed_experts, 2 * m.moe_intermediate, hidden}, dtype));
  experts.parameters.push_back(Tensor("down_proj", {m.n_routed_experts, hidden, m.moe_intermediate}, dtype));
  experts.children.push_back(Module(experts, "act_fn", f.act_class));
  block.children.push_back(std::move(experts));
  ModuleSpec gate = Module(block, "gate", "Glm4MoeTopkRouter");
  gate.parameters.push_back(Tensor("weight", {m.n_routed_experts, hidden}, dtype));
  // Made float32 by Glm4MoeTopkRouter itself (torch.zeros(..., dtype=torch.float32)), in any dtype.
  gate.buffers.push_back(Tensor("e_score_correction_bias", {m.n_routed_experts}, DType::kFloat32));
  block.children.push_back(std::move(gate));
  block.children.push_back(Mlp(block, "shared_experts", hidden, m.moe_intermediate * m.n_shared_experts, f, dtype));
  return block;
}

}  // namespace

absl::StatusOr<ModelSpec> Glm4MoeSpecFromConfig(const json& config, const Architecture& arch, DType dtype,
                                                int64_t max_positions) {
  absl::StatusOr<DecoderSizes> sizes = ReadDecoderSizes(config);
  if (!sizes.ok()) return sizes.status();
  // Glm4MoeConfig declares no head_dim: getattr(config, "head_dim", hidden_size // num_attention_heads).
  absl::StatusOr<int64_t> head_dim = ReadGqaHeads(config, 8, sizes->hidden / sizes->heads, *sizes);
  if (!head_dim.ok()) return head_dim.status();
  if (*head_dim == 0) return FieldError("hidden_size", "is smaller than num_attention_heads");
  absl::StatusOr<GlmFields> f = ReadFields(config, sizes->layers);
  if (!f.ok()) return f.status();
  if (absl::Status s = CheckPadTokenId(config, sizes->vocab, 0); !s.ok()) return s;

  ModelSpec spec = DecoderSpecFrame(std::string(arch.name), dtype, "Glm4Moe", f->tie, *sizes);
  // The multi-token-prediction layer(s) GLM checkpoints carry after the decoder's.
  spec.ignored_prefixes = {absl::StrCat("model.layers.", sizes->layers, ".")};
  if (auto it = config.find("num_nextn_predict_layers"); it != config.end() && it->is_number_integer()) {
    for (int64_t i = 1; i < std::min<int64_t>(it->get<int64_t>(), 8); ++i) {
      spec.ignored_prefixes.push_back(absl::StrCat("model.layers.", sizes->layers + i, "."));
    }
  }
  spec.keep_float32 = {"e_score_correction_bias"};

  // RoPE over the leading head_dim x partial_rotary_factor dims (Glm4MoeRotaryEmbedding: int(head_dim x factor)).
  absl::StatusOr<double> factor = PartialRotaryFactor(config, 0.5);  // Glm4MoeConfig's default
  if (!factor.ok()) return factor.status();
  const int64_t rotary_dim = static_cast<int64_t>(static_cast<double>(*head_dim) * *factor);
  if (rotary_dim < 2) return FieldError("partial_rotary_factor", "rotates fewer than 2 dims of a head");
  const int64_t hidden = sizes->hidden;
  auto layer_of = [&](const ModuleSpec& list, int64_t i, std::vector<ExpertsStorage>& experts) {
    ModuleSpec layer = Module(list, std::to_string(i), "Glm4MoeDecoderLayer");
    layer.children.push_back(Attention(layer, *sizes, *f, dtype));
    if (i >= f->moe.first_k_dense_replace) {
      layer.children.push_back(MoeBlock(layer, hidden, *f, dtype));
      const std::string module = layer.ChildName("mlp.experts");
      experts.push_back(ExpertsStorage{module, module, "gate_proj.weight", "up_proj.weight", "down_proj.weight",
                                       f->moe.n_routed_experts, hidden, f->moe.moe_intermediate, dtype});
    } else {
      layer.children.push_back(Mlp(layer, "mlp", hidden, sizes->intermediate, *f, dtype));
    }
    layer.children.push_back(RmsNorm(layer, "input_layernorm", hidden, dtype));
    layer.children.push_back(RmsNorm(layer, "post_attention_layernorm", hidden, dtype));
    return layer;
  };
  if (absl::Status s =
          BuildCausalLm(spec, *sizes, "Glm4Moe", (rotary_dim + 1) / 2,
                        [&](const ModuleSpec& list, int64_t i) { return layer_of(list, i, spec.per_expert_storage); });
      !s.ok()) {
    return s;
  }
  if (DeclaresMtpLayer(config)) {
    // The first of them, as vLLM's Glm4MoeMTP runs (--speculative mtp keeps it: ModelSpec::mtp).
    const ModuleSpec list = Module(Module(spec.root, "model", "Glm4MoeModel"), "layers", "ModuleList");
    std::vector<ExpertsStorage> experts;
    spec.mtp = MtpLayer(layer_of(list, sizes->layers, experts), "Glm4MoeMTPLayer", "Glm4MoeRMSNorm", hidden,
                        sizes->vocab, dtype);
    spec.mtp->experts = std::move(experts);
    spec.mtp->sparse = sizes->layers >= f->moe.first_k_dense_replace;
  }

  DecoderConfig decoder;
  decoder.architecture = spec.architecture;
  SetSizes(*sizes, decoder);
  decoder.qkv_bias = f->attention_bias;
  decoder.qk_norm = f->qk_norm;
  decoder.rotary_dim = rotary_dim == *head_dim ? 0 : rotary_dim;
  internal::SetGroupRouterMoe(f->moe, sizes->layers, decoder.moe);
  decoder.sliding_window.assign(static_cast<size_t>(sizes->layers), 0);
  if (absl::Status s = FinishDictRopeDecoder(config, 1e-5, 10000.0, max_positions, nullptr, std::move(decoder), spec);
      !s.ok()) {
    return s;
  }
  return spec;
}

}  // namespace strata::planner
