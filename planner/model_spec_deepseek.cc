// ModelSpecFromConfig for DeepseekV3ForCausalLM (`deepseek_v3`; Kimi K2's `kimi_k2` checkpoints use the same
// architecture): multi-head latent attention and DeepSeekMoE.
//
// The tree reproduces what transformers 5.23 builds for `AutoModelForCausalLM.from_config(config, dtype=...)`
// (models/deepseek_v3/modeling_deepseek_v3.py, configuration_deepseek_v3.py): DeepseekV3Attention's projections in
// registration order (q_proj, or q_a_proj + q_a_layernorm + q_b_proj when q_lora_rank is set; kv_a_proj_with_mqa,
// kv_a_layernorm, kv_b_proj, o_proj); a dense DeepseekV3MLP in the first `first_k_dense_replace` layers and
// DeepseekV3MoE (experts, gate with its persistent e_score_correction_bias buffer, shared_experts) after them.
// Checkpoints store the experts one tensor per expert (mlp.experts.E.{gate,up,down}_proj.weight), and may carry
// the multi-token-prediction layer as `model.layers.<num_hidden_layers>.*`, which transformers does not build:
// strata neither plans nor loads it (ModelSpec::ignored_prefixes) unless --speculative mtp keeps it (ModelSpec::mtp).
//
// The forward pass's settings (ModelSpec::decoder): the MLA sizes, RoPE (default or YaRN, whose mscale_all_dim also
// scales the softmax), the router (sigmoid, groups, correction bias, routed_scaling_factor) and the shared experts.

#include <algorithm>
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

// DeepseekV3Config's fields beyond the common sizes and DeepSeekMoE's (model_spec_moe.h), with its defaults.
struct DeepseekFields {
  internal::GroupRouterFields moe;
  int64_t kv_lora_rank = 512;
  std::optional<int64_t> q_lora_rank = 1536;
  int64_t qk_rope_head_dim = 64;
  int64_t v_head_dim = 128;
  int64_t qk_nope_head_dim = 128;
  bool rope_interleave = true;
  bool attention_bias = false;
  bool tie = false;
  std::string act_class;
};

// DeepseekV3Config's defaults for DeepSeekMoE's fields.
constexpr internal::GroupRouterFields kDeepseekRouter{.moe_intermediate = 2048,
                                                      .n_shared_experts = 1,
                                                      .n_routed_experts = 256,
                                                      .routed_scaling_factor = 2.5,
                                                      .n_group = 8,
                                                      .topk_group = 4,
                                                      .top_k = 8,
                                                      .first_k_dense_replace = 3,
                                                      .norm_topk_prob = true};

// A positive integer field at most `max` into `out`, left as it is when absent.
absl::Status ReadInt(const json& config, const char* field, int64_t& out, int64_t max) {
  auto it = config.find(field);
  if (it == config.end()) return absl::OkStatus();
  absl::StatusOr<int64_t> v = PositiveIntAtMost(*it, field, max);
  if (!v.ok()) return v.status();
  out = *v;
  return absl::OkStatus();
}

absl::StatusOr<DeepseekFields> ReadFields(const json& config, int64_t layers) {
  DeepseekFields f;
  const std::pair<const char*, int64_t*> sizes[] = {
      {"kv_lora_rank", &f.kv_lora_rank},
      {"qk_rope_head_dim", &f.qk_rope_head_dim},
      {"v_head_dim", &f.v_head_dim},
      {"qk_nope_head_dim", &f.qk_nope_head_dim},
  };
  for (const auto& [field, out] : sizes) {
    if (absl::Status s = ReadInt(config, field, *out, kMaxHiddenSize); !s.ok()) return s;
  }
  if (auto it = config.find("q_lora_rank"); it != config.end()) {
    if (it->is_null()) {
      f.q_lora_rank.reset();
    } else {
      absl::StatusOr<int64_t> v = PositiveIntAtMost(*it, "q_lora_rank", kMaxHiddenSize);
      if (!v.ok()) return v.status();
      f.q_lora_rank = *v;
    }
  }
  absl::StatusOr<internal::GroupRouterFields> moe = internal::ReadGroupRouterFields(config, kDeepseekRouter, layers);
  if (!moe.ok()) return moe.status();
  f.moe = *moe;
  for (auto [field, out] : {std::pair{"rope_interleave", &f.rope_interleave},
                            std::pair{"attention_bias", &f.attention_bias}, std::pair{"tie_word_embeddings", &f.tie}}) {
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
  return Norm(parent, local, "DeepseekV3RMSNorm", dim, dtype);
}

ModuleSpec Mlp(const ModuleSpec& parent, const char* local, int64_t hidden, int64_t intermediate,
               const DeepseekFields& f, DType dtype) {
  ModuleSpec mlp = Module(parent, local, "DeepseekV3MLP");
  mlp.children.push_back(LinearModule(mlp, "gate_proj", hidden, intermediate, false, dtype));
  mlp.children.push_back(LinearModule(mlp, "up_proj", hidden, intermediate, false, dtype));
  mlp.children.push_back(LinearModule(mlp, "down_proj", intermediate, hidden, false, dtype));
  mlp.children.push_back(Module(mlp, "act_fn", f.act_class));
  return mlp;
}

ModuleSpec Attention(const ModuleSpec& layer, const DecoderSizes& sizes, const DeepseekFields& f, DType dtype) {
  const int64_t hidden = sizes.hidden, heads = sizes.heads;
  const int64_t qk_head_dim = f.qk_nope_head_dim + f.qk_rope_head_dim;
  ModuleSpec attn = Module(layer, "self_attn", "DeepseekV3Attention");
  if (!f.q_lora_rank) {
    attn.children.push_back(LinearModule(attn, "q_proj", hidden, heads * qk_head_dim, false, dtype));
  } else {
    attn.children.push_back(LinearModule(attn, "q_a_proj", hidden, *f.q_lora_rank, f.attention_bias, dtype));
    attn.children.push_back(RmsNorm(attn, "q_a_layernorm", *f.q_lora_rank, dtype));
    attn.children.push_back(LinearModule(attn, "q_b_proj", *f.q_lora_rank, heads * qk_head_dim, false, dtype));
  }
  attn.children.push_back(
      LinearModule(attn, "kv_a_proj_with_mqa", hidden, f.kv_lora_rank + f.qk_rope_head_dim, f.attention_bias, dtype));
  attn.children.push_back(RmsNorm(attn, "kv_a_layernorm", f.kv_lora_rank, dtype));
  attn.children.push_back(
      LinearModule(attn, "kv_b_proj", f.kv_lora_rank, heads * (f.qk_nope_head_dim + f.v_head_dim), false, dtype));
  attn.children.push_back(LinearModule(attn, "o_proj", heads * f.v_head_dim, hidden, f.attention_bias, dtype));
  return attn;
}

ModuleSpec MoeBlock(const ModuleSpec& layer, int64_t hidden, const DeepseekFields& f, DType dtype) {
  ModuleSpec block = Module(layer, "mlp", "DeepseekV3MoE");
  ModuleSpec experts = Module(block, "experts", "DeepseekV3Experts");
  experts.parameters.push_back(
      Tensor("gate_up_proj", {f.moe.n_routed_experts, 2 * f.moe.moe_intermediate, hidden}, dtype));
  experts.parameters.push_back(Tensor("down_proj", {f.moe.n_routed_experts, hidden, f.moe.moe_intermediate}, dtype));
  experts.children.push_back(Module(experts, "act_fn", f.act_class));
  block.children.push_back(std::move(experts));
  ModuleSpec gate = Module(block, "gate", "DeepseekV3TopkRouter");
  gate.parameters.push_back(Tensor("weight", {f.moe.n_routed_experts, hidden}, dtype));
  // transformers keeps it in float32 when loading (_keep_in_fp32_modules_strict); from_config sizes it in `dtype`.
  gate.buffers.push_back(Tensor("e_score_correction_bias", {f.moe.n_routed_experts}, dtype));
  block.children.push_back(std::move(gate));
  block.children.push_back(
      Mlp(block, "shared_experts", hidden, f.moe.moe_intermediate * f.moe.n_shared_experts, f, dtype));
  return block;
}

// RoPE: default or YaRN (rope_parameters, or the legacy rope_scaling DeepSeek's configs use, with a top-level
// rope_theta), and the softmax scale with YaRN's mscale_all_dim (modeling_deepseek_v3.py's yarn_apply_mscale).
absl::Status ReadRope(const json& config, int64_t max_positions, const DeepseekFields& f, DecoderConfig& decoder) {
  absl::StatusOr<RopeDict> dict = FindRopeDict(config);
  if (!dict.ok()) return dict.status();
  absl::StatusOr<std::string> rope_type = RopeTypeOf(*dict);
  if (!rope_type.ok()) return rope_type.status();
  const std::string& type = *rope_type;
  const json empty = json::object();
  const json& p = dict->params != nullptr ? *dict->params : empty;
  const std::string& field = dict->field;
  const std::string prefix = field + ".";
  absl::StatusOr<double> theta = NumberOr(config, "", "rope_theta", 10000.0);
  if (!theta.ok()) return theta.status();
  const double qk_head_dim = static_cast<double>(f.qk_nope_head_dim + f.qk_rope_head_dim);
  decoder.mla.softmax_scale = 1.0 / std::sqrt(qk_head_dim);
  const double positions = static_cast<double>(max_positions);
  absl::StatusOr<RopeConfig> rope = type == "yarn" ? YarnRope(p, prefix, *theta, max_positions > 0 ? positions : 0)
                                                   : LlamaStyleRope(p, dict->params != nullptr ? prefix : "", type,
                                                                    *theta, max_positions > 0 ? positions : 8192.0);
  if (!rope.ok()) return rope.status();
  decoder.rope = *rope;
  if (type == "default") return absl::OkStatus();
  // yarn_apply_mscale: any type but default, where mscale_all_dim is set.
  absl::StatusOr<double> all_dim = NumberOr(p, prefix, "mscale_all_dim", 0);
  if (!all_dim.ok()) return all_dim.status();
  if (*all_dim != 0 && rope->factor > 1) {
    const double m = 0.1 * *all_dim * std::log(rope->factor) + 1.0;
    decoder.mla.softmax_scale *= m * m;
  }
  return absl::OkStatus();
}

// Decoder layer `i` under `layer_list` as `class_name` (its first first_k_dense_replace dense, the rest MoE, whose
// experts' per-expert storage goes to `experts`).
ModuleSpec DecoderLayer(const ModuleSpec& layer_list, int64_t i, const std::string& class_name,
                        const DecoderSizes& sizes, const DeepseekFields& f, DType dtype,
                        std::vector<ExpertsStorage>& experts) {
  const int64_t hidden = sizes.hidden;
  ModuleSpec layer = Module(layer_list, std::to_string(i), class_name);
  layer.children.push_back(Attention(layer, sizes, f, dtype));
  if (i >= f.moe.first_k_dense_replace) {
    layer.children.push_back(MoeBlock(layer, hidden, f, dtype));
    const std::string module = layer.ChildName("mlp.experts");
    experts.push_back(ExpertsStorage{module, module, "gate_proj.weight", "up_proj.weight", "down_proj.weight",
                                     f.moe.n_routed_experts, hidden, f.moe.moe_intermediate, dtype});
  } else {
    layer.children.push_back(Mlp(layer, "mlp", hidden, sizes.intermediate, f, dtype));
  }
  layer.children.push_back(RmsNorm(layer, "input_layernorm", hidden, dtype));
  layer.children.push_back(RmsNorm(layer, "post_attention_layernorm", hidden, dtype));
  return layer;
}

// The multi-token-prediction layer `model.layers.<layers>` as DeepSeek-V3's checkpoints store it.
MtpLayerSpec MtpLayerOf(const ModuleSpec& layer_list, const DecoderSizes& sizes, const DeepseekFields& f, DType dtype) {
  std::vector<ExpertsStorage> experts;
  ModuleSpec layer = DecoderLayer(layer_list, sizes.layers, "DeepseekV3DecoderLayer", sizes, f, dtype, experts);
  MtpLayerSpec mtp =
      MtpLayer(std::move(layer), "DeepseekV3MTPLayer", "DeepseekV3RMSNorm", sizes.hidden, sizes.vocab, dtype);
  mtp.experts = std::move(experts);
  mtp.sparse = sizes.layers >= f.moe.first_k_dense_replace;
  return mtp;
}

// The module tree under spec.root (DeepseekV3ForCausalLM): embeddings, the decoder layers, norm, rotary embedding,
// LM head; and, when the config declares one (`mtp`), the MTP layer beside it (ModelSpec::mtp).
void AddModules(const DecoderSizes& sizes, const DeepseekFields& f, DType dtype, bool mtp, ModelSpec& spec) {
  const int64_t hidden = sizes.hidden;
  ModuleSpec& root = spec.root;
  root.class_name = spec.architecture;
  ModuleSpec model = Module(root, "model", "DeepseekV3Model");
  ModuleSpec embed = Module(model, "embed_tokens", "Embedding");
  embed.parameters.push_back(Tensor("weight", {sizes.vocab, hidden}, dtype));
  model.children.push_back(std::move(embed));
  ModuleSpec layer_list = Module(model, "layers", "ModuleList");
  for (int64_t i = 0; i < sizes.layers; ++i) {
    layer_list.children.push_back(
        DecoderLayer(layer_list, i, "DeepseekV3DecoderLayer", sizes, f, dtype, spec.per_expert_storage));
  }
  if (mtp) spec.mtp = MtpLayerOf(layer_list, sizes, f, dtype);
  model.children.push_back(std::move(layer_list));
  model.children.push_back(RmsNorm(model, "norm", hidden, dtype));
  ModuleSpec rotary = Module(model, "rotary_emb", "DeepseekV3RotaryEmbedding");
  const int64_t inv_freq = (f.qk_rope_head_dim + 1) / 2;  // head_dim is qk_rope_head_dim
  rotary.buffers.push_back(Tensor("inv_freq", {inv_freq}, DType::kFloat32, /*persistent=*/false));
  rotary.buffers.push_back(Tensor("original_inv_freq", {inv_freq}, DType::kFloat32, /*persistent=*/false));
  model.children.push_back(std::move(rotary));
  root.children.push_back(std::move(model));
  root.children.push_back(LinearModule(root, "lm_head", hidden, sizes.vocab, /*bias=*/false, dtype));
}

}  // namespace

absl::StatusOr<ModelSpec> DeepseekV3SpecFromConfig(const json& config, const Architecture& arch, DType dtype,
                                                   int64_t max_positions) {
  absl::StatusOr<DecoderSizes> sizes = ReadDecoderSizes(config);
  if (!sizes.ok()) return sizes.status();
  // DeepseekV3Config: num_key_value_heads None means num_attention_heads; MLA's attention does not read it.
  absl::StatusOr<int64_t> kv_heads =
      PositiveIntOr(config, "num_key_value_heads", sizes->heads, /*may_be_null=*/true, kMaxAttentionHeads);
  if (!kv_heads.ok()) return kv_heads.status();
  absl::StatusOr<DeepseekFields> f = ReadFields(config, sizes->layers);
  if (!f.ok()) return f.status();
  if (absl::Status s = CheckPadTokenId(config, sizes->vocab, 0); !s.ok()) return s;

  ModelSpec spec = DecoderSpecFrame(std::string(arch.name), dtype, "DeepseekV3", f->tie, *sizes);
  // The latent cache: one row of kv_lora_rank + qk_rope_head_dim per token and layer (ModelSpec::kv_latent).
  spec.num_key_value_heads = 1;
  spec.head_dim = f->kv_lora_rank + f->qk_rope_head_dim;
  spec.kv_latent = true;
  // The multi-token-prediction layer(s) some checkpoints carry after the decoder's.
  spec.ignored_prefixes = {absl::StrCat("model.layers.", sizes->layers, ".")};
  spec.keep_float32 = {"e_score_correction_bias"};

  AddModules(*sizes, *f, dtype, DeclaresMtpLayer(config), spec);
  if (absl::StatusOr<int64_t> total = SpecBytes(spec); !total.ok()) {
    return FieldError("num_hidden_layers", absl::StrCat("x the layer sizes: ", total.status().message()));
  }

  DecoderConfig decoder;
  decoder.architecture = spec.architecture;
  sizes->kv_heads = *kv_heads;
  sizes->head_dim = f->qk_nope_head_dim + f->qk_rope_head_dim;
  SetSizes(*sizes, decoder);
  decoder.rotary_dim = f->qk_rope_head_dim;
  decoder.o_bias = f->attention_bias;
  decoder.mla = MlaConfig{.q_lora_rank = f->q_lora_rank.value_or(0),
                          .kv_lora_rank = f->kv_lora_rank,
                          .qk_nope_head_dim = f->qk_nope_head_dim,
                          .qk_rope_head_dim = f->qk_rope_head_dim,
                          .v_head_dim = f->v_head_dim,
                          .rope_interleave = f->rope_interleave,
                          .attention_bias = f->attention_bias};
  internal::SetGroupRouterMoe(f->moe, sizes->layers, decoder.moe);
  decoder.sliding_window.assign(static_cast<size_t>(sizes->layers), 0);
  absl::StatusOr<double> eps = RmsNormEps(config, 1e-6);
  if (!eps.ok()) return eps.status();
  decoder.rms_norm_eps = *eps;
  if (absl::Status s = ReadRope(config, max_positions, *f, decoder); !s.ok()) {
    spec.decoder = s;
  } else {
    spec.decoder = std::move(decoder);
  }
  return spec;
}

}  // namespace strata::planner
