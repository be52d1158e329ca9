// ModelSpecFromConfig for Phi-3 (Phi3ForCausalLM, model_type phi3): the tree
// `AutoModelForCausalLM.from_config(config, dtype=D)` builds with transformers 5.23 (models/phi3).
//
// What differs from Llama: attention has one fused `qkv_proj` (registered after `o_proj`) and the MLP one
// fused `gate_up_proj`, its activation module is `activation_fn`; each layer ends with two parameterless
// Dropout children; RoPE is default or longrope ("su" and "yarn" are renamed to longrope by Phi3Config),
// with partial_rotary_factor honoured by both.
//
// The forward pass's settings (ModelSpec::decoder), as Phi3Config and modeling_phi3 read them:
// - RoPE: a truthy legacy rope_scaling replaces rope_parameters; rope_theta (default 1e4) and
//   partial_rotary_factor (default 1) may sit in the dict or at the top level. The rotary embedding rotates
//   the first int(head_dim * partial_rotary_factor) dims of each head, also for the default type.
// - longrope (_compute_longrope_parameters): inv_freq = 1 / (ext * theta^(2i/d)) with ext = short_factor,
//   or long_factor while the batch's longest sequence (max position + 1) exceeds
//   original_max_position_embeddings (dynamic_rope_update); cos and sin are scaled by attention_factor,
//   default sqrt(1 + ln(factor) / ln(original)) for factor = max_position_embeddings / original (1 when
//   factor <= 1). original_max_position_embeddings is the top-level field (Phi3Config default 4096); for
//   "su" the dict must also hold one (Phi3Config's validation), whose value is then overridden.
// - sliding_window, when set, applies to every layer; rms_norm_eps defaults to 1e-5; the MLP runs SiLU only.

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "planner/decoder_config.h"
#include "planner/model_registry.h"
#include "planner/model_spec.h"
#include "planner/spec_builder.h"

namespace strata::planner {
namespace {

using namespace spec_builder;  // NOLINT: the family builders' shared vocabulary

absl::StatusOr<double> PartialRotaryFactor(const json& object, const std::string& field, double fallback) {
  auto it = object.find("partial_rotary_factor");
  if (it == object.end() || it->is_null()) return fallback;
  if (!it->is_number() || !(it->get<double>() > 0) || it->get<double>() > 1) {
    return FieldError(field + "partial_rotary_factor", absl::StrCat("must be a number in (0, 1], got ", it->dump()));
  }
  return it->get<double>();
}

// The RoPE settings as Phi3Config.convert_rope_params_to_dict + validate_rope leave them.
struct Phi3Rope {
  int64_t inv_freq_length = 0;                    // of the rotary embedding's inv_freq buffer
  const json* params = nullptr;                   // the dict, when the config has a non-empty one
  std::string field;                              // its name: "rope_scaling", "rope_parameters"
  std::string type = "default";                   // as config.json spells it: default, longrope, su, yarn
  int64_t rotary_dim = 0;                         // int(head_dim * partial_rotary_factor)
  std::vector<double> short_factor, long_factor;  // longrope
};

absl::StatusOr<Phi3Rope> ReadPhi3Rope(const json& config, int64_t hidden, int64_t heads, int64_t head_dim) {
  Phi3Rope rope;
  absl::StatusOr<double> partial = PartialRotaryFactor(config, "", 1.0);
  if (!partial.ok()) return partial.status();
  absl::StatusOr<RopeDict> dict = FindRopeDict(config);
  if (!dict.ok()) return dict.status();
  rope.params = dict->params;
  rope.field = dict->params != nullptr ? dict->field : "";
  const json* params = rope.params;
  const std::string& field = rope.field;
  if (params != nullptr) {
    partial = PartialRotaryFactor(*params, field + ".", *partial);
    if (!partial.ok()) return partial.status();
  }
  absl::StatusOr<std::string> rope_type = RopeTypeOf(*dict);
  if (!rope_type.ok()) return rope_type.status();
  rope.type = *rope_type;
  const std::string& type = rope.type;
  const int64_t dim = static_cast<int64_t>(static_cast<double>(head_dim) * *partial);
  if (dim < 2) return FieldError("partial_rotary_factor", "leaves fewer than two rotary dimensions");
  const int64_t length = (dim + 1) / 2;
  rope.inv_freq_length = length;
  rope.rotary_dim = dim;
  if (type == "default") return rope;
  if (type != "longrope" && type != "su" && type != "yarn") {
    return FieldError(absl::StrCat(field, ".rope_type"),
                      absl::StrCat("\"", type, "\" is not a RoPE type Phi-3 supports (default, longrope, su)"));
  }
  // Phi3Config validates "su" before renaming it to longrope: its dict must name the original length.
  if (type == "su" && !params->contains("original_max_position_embeddings")) {
    return FieldError(absl::StrCat(field, ".original_max_position_embeddings"), "is required for rope type \"su\"");
  }
  // Phi3Config.validate_rope measures the factors against hidden_size // num_attention_heads.
  const int64_t expected = static_cast<int64_t>(static_cast<double>(hidden / heads) * *partial) / 2;
  for (const char* key : {"short_factor", "long_factor"}) {
    auto it = params->find(key);
    if (it == params->end() || !it->is_array()) {
      return FieldError(absl::StrCat(field, ".", key), "must be an array of numbers for longrope");
    }
    std::vector<double>& factors = key == std::string("short_factor") ? rope.short_factor : rope.long_factor;
    for (const json& x : *it) {
      if (!x.is_number() || !(x.get<double>() > 0)) {
        return FieldError(absl::StrCat(field, ".", key), absl::StrCat("must hold positive numbers, got ", x.dump()));
      }
      factors.push_back(x.get<double>());
    }
    if (static_cast<int64_t>(it->size()) != expected || expected != length) {
      return FieldError(absl::StrCat(field, ".", key), absl::StrCat("has ", it->size(), " entries, expected ", expected,
                                                                    " (one per rotary frequency)"));
    }
  }
  return rope;
}

// The forward pass's settings of a config the builder accepted; `activation` and `rope` are what it read.
absl::StatusOr<DecoderConfig> ReadForwardPass(const json& config, int64_t layers, int64_t head_dim,
                                              const std::string& activation, const Phi3Rope& rope,
                                              int64_t max_positions) {
  DecoderConfig out;
  out.architecture = "Phi3ForCausalLM";
  out.num_layers = layers;
  absl::StatusOr<double> eps = NumberOr(config, "", "rms_norm_eps", 1e-5);
  if (!eps.ok()) return eps.status();
  if (!(*eps > 0)) return FieldError("rms_norm_eps", absl::StrCat("must be a positive finite number, got ", *eps));
  out.rms_norm_eps = *eps;
  if (activation != "silu") {
    return FieldError("hidden_act", absl::StrCat("\"", activation, "\" is not supported by the runtime (silu)"));
  }
  out.sliding_window.assign(static_cast<size_t>(layers), 0);
  if (auto it = config.find("sliding_window"); it != config.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() <= 0) {
      return FieldError("sliding_window", absl::StrCat("must be a positive integer or null, got ", it->dump()));
    }
    for (int64_t& w : out.sliding_window) w = it->get<int64_t>();
  }

  const json& params = rope.params != nullptr ? *rope.params : json::object();
  const std::string prefix = rope.params != nullptr ? rope.field + "." : "";
  absl::StatusOr<double> top_theta = NumberOr(config, "", "rope_theta", 10000.0);
  if (!top_theta.ok()) return top_theta.status();
  absl::StatusOr<double> theta = NumberOr(params, prefix, "rope_theta", *top_theta);
  if (!theta.ok()) return theta.status();
  if (!(*theta > 0))
    return FieldError(prefix + "rope_theta", absl::StrCat("must be a positive finite number, got ", *theta));
  if (rope.rotary_dim % 2 != 0) {
    return FieldError("partial_rotary_factor",
                      absl::StrCat("gives ", rope.rotary_dim, " rotary dims; the runtime needs an even number >= 2"));
  }
  out.rotary_dim = rope.rotary_dim == head_dim ? 0 : rope.rotary_dim;
  out.rope.theta = *theta;
  if (rope.type == "default") return out;

  RopeConfig& longrope = out.rope;
  longrope.type = RopeConfig::Type::kLongRope;
  longrope.short_factor = rope.short_factor;
  longrope.long_factor = rope.long_factor;
  // The top-level field (default 4096) overrides the dict's for every spelling: transformers'
  // _compute_longrope_parameters standardizes again once the type reads "longrope".
  absl::StatusOr<int64_t> original =
      PositiveIntOr(config, "original_max_position_embeddings", 4096, /*may_be_null=*/true, kMaxPositions);
  if (!original.ok()) return original.status();
  const double positions = static_cast<double>(max_positions > 0 ? max_positions : 4096);
  longrope.original_max_positions = static_cast<double>(*original);
  absl::StatusOr<double> factor = NumberOr(params, prefix, "factor", positions / longrope.original_max_positions);
  if (!factor.ok()) return factor.status();
  if (!(*factor > 0)) return FieldError(prefix + "factor", "must be positive");
  const double default_attention =
      *factor <= 1.0 ? 1.0 : std::sqrt(1 + std::log(*factor) / std::log(longrope.original_max_positions));
  absl::StatusOr<double> attention = NumberOr(params, prefix, "attention_factor", default_attention);
  if (!attention.ok()) return attention.status();
  if (!(*attention > 0)) return FieldError(prefix + "attention_factor", "must be positive");
  longrope.attention_factor = *attention;
  return out;
}

}  // namespace

absl::StatusOr<ModelSpec> Phi3SpecFromConfig(const json& config, const Architecture& /*arch*/, DType dtype,
                                             int64_t max_positions) {
  absl::StatusOr<DecoderSizes> sizes = ReadDecoderSizes(config);
  if (!sizes.ok()) return sizes.status();
  const int64_t hidden = sizes->hidden, intermediate = sizes->intermediate, layers = sizes->layers;
  const int64_t heads = sizes->heads, vocab = sizes->vocab;
  // Phi3Config: num_key_value_heads None (absent or null) means num_attention_heads.
  absl::StatusOr<int64_t> kv_heads = PositiveIntOr(config, "num_key_value_heads", heads, true, kMaxAttentionHeads);
  if (!kv_heads.ok()) return kv_heads.status();
  if (heads % *kv_heads != 0) {
    return FieldError("num_key_value_heads",
                      absl::StrCat("(", *kv_heads, ") must divide num_attention_heads (", heads, ")"));
  }
  const int64_t head_dim = hidden / heads;
  if (head_dim == 0) {
    return FieldError("num_attention_heads", absl::StrCat("(", heads, ") exceeds hidden_size (", hidden, ")"));
  }
  if (auto it = config.find("head_dim"); it != config.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() != head_dim) {
      return FieldError("head_dim", absl::StrCat("must be hidden_size / num_attention_heads (", head_dim,
                                                 ") for Phi-3, got ", it->dump()));
    }
  }
  if (absl::Status s = CheckPadTokenId(config, vocab, 32000); !s.ok()) return s;
  std::string activation = "silu";
  if (auto it = config.find("hidden_act"); it != config.end() && !it->is_null()) {
    if (!it->is_string()) return FieldError("hidden_act", absl::StrCat("must be a string, got ", it->dump()));
    activation = it->get<std::string>();
  }
  std::optional<std::string> act_class = ActivationClass(activation);
  if (!act_class) return FieldError("hidden_act", absl::StrCat("\"", activation, "\" is not supported"));
  absl::StatusOr<bool> tie = BoolOr(config, "tie_word_embeddings", false);
  if (!tie.ok()) return tie.status();
  absl::StatusOr<Phi3Rope> rope = ReadPhi3Rope(config, hidden, heads, head_dim);
  if (!rope.ok()) return rope.status();

  ModelSpec spec = DecoderSpecFrame("Phi3ForCausalLM", dtype, "Phi3", *tie,
                                    DecoderSizes{.layers = layers, .kv_heads = *kv_heads, .head_dim = head_dim});
  ModuleSpec& root = spec.root;
  ModuleSpec model = Module(root, "model", "Phi3Model");
  ModuleSpec embed = Module(model, "embed_tokens", "Embedding");
  embed.parameters.push_back(Tensor("weight", {vocab, hidden}, dtype));
  model.children.push_back(std::move(embed));
  ModuleSpec layer_list = Module(model, "layers", "ModuleList");
  const int64_t qkv_rows = (heads + 2 * *kv_heads) * head_dim;
  for (int64_t i = 0; i < layers; ++i) {
    ModuleSpec layer = Module(layer_list, std::to_string(i), "Phi3DecoderLayer");
    ModuleSpec attn = Module(layer, "self_attn", "Phi3Attention");
    attn.children.push_back(LinearModule(attn, "o_proj", heads * head_dim, hidden, false, dtype));
    attn.children.push_back(LinearModule(attn, "qkv_proj", hidden, qkv_rows, false, dtype));
    layer.children.push_back(std::move(attn));
    ModuleSpec mlp = Module(layer, "mlp", "Phi3MLP");
    mlp.children.push_back(LinearModule(mlp, "gate_up_proj", hidden, 2 * intermediate, false, dtype));
    mlp.children.push_back(LinearModule(mlp, "down_proj", intermediate, hidden, false, dtype));
    mlp.children.push_back(Module(mlp, "activation_fn", *act_class));
    layer.children.push_back(std::move(mlp));
    layer.children.push_back(Norm(layer, "input_layernorm", "Phi3RMSNorm", hidden, dtype));
    layer.children.push_back(Norm(layer, "post_attention_layernorm", "Phi3RMSNorm", hidden, dtype));
    layer.children.push_back(Module(layer, "resid_attn_dropout", "Dropout"));
    layer.children.push_back(Module(layer, "resid_mlp_dropout", "Dropout"));
    layer_list.children.push_back(std::move(layer));
  }
  model.children.push_back(std::move(layer_list));
  model.children.push_back(Norm(model, "norm", "Phi3RMSNorm", hidden, dtype));
  ModuleSpec rotary = Module(model, "rotary_emb", "Phi3RotaryEmbedding");
  rotary.buffers.push_back(Tensor("inv_freq", {rope->inv_freq_length}, DType::kFloat32, false));
  rotary.buffers.push_back(Tensor("original_inv_freq", {rope->inv_freq_length}, DType::kFloat32, false));
  model.children.push_back(std::move(rotary));
  root.children.push_back(std::move(model));
  root.children.push_back(LinearModule(root, "lm_head", hidden, vocab, /*bias=*/false, dtype));
  if (absl::StatusOr<int64_t> total = SpecBytes(spec); !total.ok()) {
    return FieldError("num_hidden_layers", absl::StrCat("x the layer sizes: ", total.status().message()));
  }
  spec.decoder = ReadForwardPass(config, layers, head_dim, activation, *rope, max_positions);
  if (spec.decoder.ok()) {
    sizes->kv_heads = *kv_heads;
    sizes->head_dim = head_dim;
    SetSizes(*sizes, *spec.decoder);
  }
  return spec;
}

}  // namespace strata::planner
