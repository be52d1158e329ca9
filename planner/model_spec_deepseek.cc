// ModelSpecFromConfig for DeepseekV3ForCausalLM (`deepseek_v3`; Kimi K2's `kimi_k2` checkpoints use the same
// architecture): multi-head latent attention and DeepSeekMoE.
//
// The tree reproduces what transformers 5.23 builds for `AutoModelForCausalLM.from_config(config, dtype=...)`
// (models/deepseek_v3/modeling_deepseek_v3.py, configuration_deepseek_v3.py): DeepseekV3Attention's projections in
// registration order (q_proj, or q_a_proj + q_a_layernorm + q_b_proj when q_lora_rank is set; kv_a_proj_with_mqa,
// kv_a_layernorm, kv_b_proj, o_proj); a dense DeepseekV3MLP in the first `first_k_dense_replace` layers and
// DeepseekV3MoE (experts, gate with its persistent e_score_correction_bias buffer, shared_experts) after them.
// Checkpoints store the experts one tensor per expert (mlp.experts.E.{gate,up,down}_proj.weight), and may carry
// the multi-token-prediction layer as `model.layers.<num_hidden_layers>.*`, which transformers does not build and
// strata does not load (ModelSpec::ignored_prefixes).
//
// The forward pass's settings (ModelSpec::decoder): the MLA sizes, RoPE (default or YaRN, whose mscale_all_dim also
// scales the softmax), the router (sigmoid, groups, correction bias, routed_scaling_factor) and the shared experts.

#include <cmath>
#include <cstdint>
#include <optional>
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

// DeepseekV3Config's fields beyond the common sizes, with its defaults.
struct DeepseekFields {
  int64_t moe_intermediate = 2048;
  int64_t n_shared_experts = 1;
  int64_t n_routed_experts = 256;
  double routed_scaling_factor = 2.5;
  int64_t kv_lora_rank = 512;
  std::optional<int64_t> q_lora_rank = 1536;
  int64_t qk_rope_head_dim = 64;
  int64_t v_head_dim = 128;
  int64_t qk_nope_head_dim = 128;
  int64_t n_group = 8;
  int64_t topk_group = 4;
  int64_t top_k = 8;
  int64_t first_k_dense_replace = 3;
  bool norm_topk_prob = true;
  bool rope_interleave = true;
  bool attention_bias = false;
  bool tie = false;
  std::string act_class;
};

absl::Status ReadInt(const json& config, const char* field, int64_t& out, int64_t max, bool may_be_zero = false) {
  auto it = config.find(field);
  if (it == config.end()) return absl::OkStatus();
  if (may_be_zero && it->is_number_integer() && it->get<int64_t>() == 0) {
    out = 0;
    return absl::OkStatus();
  }
  absl::StatusOr<int64_t> v = PositiveIntAtMost(*it, field, max);
  if (!v.ok()) return v.status();
  out = *v;
  return absl::OkStatus();
}

absl::StatusOr<DeepseekFields> ReadFields(const json& config, int64_t layers) {
  DeepseekFields f;
  const std::pair<const char*, int64_t*> sizes[] = {
      {"moe_intermediate_size", &f.moe_intermediate}, {"kv_lora_rank", &f.kv_lora_rank},
      {"qk_rope_head_dim", &f.qk_rope_head_dim},      {"v_head_dim", &f.v_head_dim},
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
  if (absl::Status s = ReadInt(config, "n_shared_experts", f.n_shared_experts, 1024, /*may_be_zero=*/true); !s.ok()) {
    return s;
  }
  // n_routed_experts, or its alias num_local_experts (the config's attribute_map).
  const char* experts_field = config.contains("n_routed_experts") ? "n_routed_experts" : "num_local_experts";
  if (absl::Status s = ReadInt(config, experts_field, f.n_routed_experts, internal::kMaxExperts); !s.ok()) return s;
  if (absl::Status s = ReadInt(config, "n_group", f.n_group, internal::kMaxExperts); !s.ok()) return s;
  if (absl::Status s = ReadInt(config, "topk_group", f.topk_group, internal::kMaxExperts); !s.ok()) return s;
  if (absl::Status s = ReadInt(config, "num_experts_per_tok", f.top_k, internal::kMaxExperts); !s.ok()) return s;
  if (absl::Status s = ReadInt(config, "first_k_dense_replace", f.first_k_dense_replace, kMaxHiddenLayers,
                               /*may_be_zero=*/true);
      !s.ok()) {
    return s;
  }
  // The router's shapes: groups of equal size, topk_group of them kept, top_k experts among the kept ones.
  if (f.n_routed_experts % f.n_group != 0) {
    return FieldError("n_routed_experts",
                      absl::StrCat("(", f.n_routed_experts, ") must be a multiple of n_group (", f.n_group, ")"));
  }
  if (f.topk_group > f.n_group) {
    return FieldError("topk_group", absl::StrCat("(", f.topk_group, ") must be at most n_group (", f.n_group, ")"));
  }
  const int64_t per_group = f.n_routed_experts / f.n_group;
  if (per_group < 2) {
    // A group's score is the sum of its two best experts' (topk(2) in the router).
    return FieldError("n_group", absl::StrCat("(", f.n_group, ") leaves fewer than 2 experts per group"));
  }
  if (f.top_k > f.topk_group * per_group) {
    return FieldError("num_experts_per_tok", absl::StrCat("(", f.top_k, ") exceeds the experts of topk_group (",
                                                          f.topk_group, ") groups of ", per_group));
  }
  if (absl::Status s = internal::CheckExpertModules(
          f.n_routed_experts, std::max<int64_t>(0, layers - f.first_k_dense_replace), experts_field);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<double> scaling = NumberOr(config, "", "routed_scaling_factor", 2.5);
  if (!scaling.ok()) return scaling.status();
  if (!(*scaling > 0) || !std::isfinite(*scaling)) {
    return FieldError("routed_scaling_factor", "must be a positive finite number");
  }
  f.routed_scaling_factor = *scaling;
  for (auto [field, out] :
       {std::pair{"norm_topk_prob", &f.norm_topk_prob}, std::pair{"rope_interleave", &f.rope_interleave},
        std::pair{"attention_bias", &f.attention_bias}, std::pair{"tie_word_embeddings", &f.tie}}) {
    absl::StatusOr<bool> b = BoolOr(config, field, *out);
    if (!b.ok()) return b.status();
    *out = *b;
  }
  std::string act = "silu";
  if (auto it = config.find("hidden_act"); it != config.end()) {
    if (!it->is_string()) return FieldError("hidden_act", absl::StrCat("must be a string, got ", it->dump()));
    act = it->get<std::string>();
  }
  if (act != "silu") return FieldError("hidden_act", absl::StrCat("\"", act, "\" is not supported (silu)"));
  f.act_class = *ActivationClass(act);
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
  experts.parameters.push_back(Tensor("gate_up_proj", {f.n_routed_experts, 2 * f.moe_intermediate, hidden}, dtype));
  experts.parameters.push_back(Tensor("down_proj", {f.n_routed_experts, hidden, f.moe_intermediate}, dtype));
  experts.children.push_back(Module(experts, "act_fn", f.act_class));
  block.children.push_back(std::move(experts));
  ModuleSpec gate = Module(block, "gate", "DeepseekV3TopkRouter");
  gate.parameters.push_back(Tensor("weight", {f.n_routed_experts, hidden}, dtype));
  // transformers keeps it in float32 when loading (_keep_in_fp32_modules_strict); from_config sizes it in `dtype`.
  gate.buffers.push_back(Tensor("e_score_correction_bias", {f.n_routed_experts}, dtype));
  block.children.push_back(std::move(gate));
  block.children.push_back(Mlp(block, "shared_experts", hidden, f.moe_intermediate * f.n_shared_experts, f, dtype));
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

// The module tree under spec.root (DeepseekV3ForCausalLM): embeddings, the decoder layers (the first
// first_k_dense_replace dense, the rest MoE, whose experts' per-expert storage it records), norm, rotary
// embedding, LM head.
void AddModules(const DecoderSizes& sizes, const DeepseekFields& f, DType dtype, ModelSpec& spec) {
  const int64_t hidden = sizes.hidden;
  ModuleSpec& root = spec.root;
  root.class_name = spec.architecture;
  ModuleSpec model = Module(root, "model", "DeepseekV3Model");
  ModuleSpec embed = Module(model, "embed_tokens", "Embedding");
  embed.parameters.push_back(Tensor("weight", {sizes.vocab, hidden}, dtype));
  model.children.push_back(std::move(embed));
  ModuleSpec layer_list = Module(model, "layers", "ModuleList");
  for (int64_t i = 0; i < sizes.layers; ++i) {
    ModuleSpec layer = Module(layer_list, std::to_string(i), "DeepseekV3DecoderLayer");
    layer.children.push_back(Attention(layer, sizes, f, dtype));
    if (i >= f.first_k_dense_replace) {
      layer.children.push_back(MoeBlock(layer, hidden, f, dtype));
      const std::string experts = layer.ChildName("mlp.experts");
      spec.per_expert_storage.push_back(ExpertsStorage{experts, experts, "gate_proj.weight", "up_proj.weight",
                                                       "down_proj.weight", f.n_routed_experts, hidden,
                                                       f.moe_intermediate, dtype});
    } else {
      layer.children.push_back(Mlp(layer, "mlp", hidden, sizes.intermediate, f, dtype));
    }
    layer.children.push_back(RmsNorm(layer, "input_layernorm", hidden, dtype));
    layer.children.push_back(RmsNorm(layer, "post_attention_layernorm", hidden, dtype));
    layer_list.children.push_back(std::move(layer));
  }
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

// The MoE block's routing (DeepseekV3TopkRouter: sigmoid scores, group-limited top-k) and which layers are sparse.
void SetMoe(const DeepseekFields& f, int64_t layers, MoeConfig& moe) {
  moe.router = MoeConfig::Router::kSigmoidGroups;
  moe.num_experts = f.n_routed_experts;
  moe.top_k = f.top_k;
  moe.norm_topk_prob = f.norm_topk_prob;
  moe.weights_in_float32 = true;
  moe.n_group = f.n_group;
  moe.topk_group = f.topk_group;
  moe.routed_scaling_factor = f.routed_scaling_factor;
  moe.shared_intermediate = f.moe_intermediate * f.n_shared_experts;
  moe.sparse.assign(static_cast<size_t>(layers), false);
  for (int64_t i = f.first_k_dense_replace; i < layers; ++i) moe.sparse[static_cast<size_t>(i)] = true;
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

  AddModules(*sizes, *f, dtype, spec);
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
  SetMoe(*f, sizes->layers, decoder.moe);
  decoder.sliding_window.assign(static_cast<size_t>(sizes->layers), 0);
  absl::StatusOr<double> eps = NumberOr(config, "", "rms_norm_eps", 1e-6);
  if (!eps.ok()) return eps.status();
  if (!(*eps > 0) || !std::isfinite(*eps)) {
    return FieldError("rms_norm_eps", absl::StrCat("must be a positive finite number, got ", *eps));
  }
  decoder.rms_norm_eps = *eps;
  if (absl::Status s = ReadRope(config, max_positions, *f, decoder); !s.ok()) {
    spec.decoder = s;
  } else {
    spec.decoder = std::move(decoder);
  }
  return spec;
}

}  // namespace strata::planner
