// ModelSpecFromConfig for Gemma 2 (Gemma2ForCausalLM, model_type gemma2) and Gemma 3 text
// (Gemma3ForCausalLM, model_type gemma3_text): the tree `AutoModelForCausalLM.from_config(config, dtype=D)`
// builds with transformers 5.23 (models/gemma2, models/gemma3: modeling_*.py and configuration_*.py).
//
// What differs from Llama: the embedding is a Gemma*TextScaledWordEmbedding carrying a 0-d,
// non-persistent `embed_scale` buffer in the serving dtype; four RMSNorms per layer (input,
// post-attention, pre- and post-feedforward); Gemma 3 adds q_norm / k_norm over head_dim and one pair of
// rotary buffers per layer type present ("full_attention_inv_freq", ...), in sorted type order; the MLP
// activation comes from `hidden_activation`; embeddings are tied by default.
//
// The forward pass's settings (ModelSpec::decoder), as the two config classes and modeling code read them:
// - layer_types, or by default every `sliding_window_pattern`-th layer full attention (Gemma 2: 2; Gemma 3:
//   sliding_window_pattern, default 6), the others sliding with `sliding_window` (default 4096; the same
//   create_sliding_window_causal_mask as Mistral: key visible when query - key < window);
// - Gemma 2 RoPE is one Llama-style dict; Gemma 3 has one per layer type: the global layers' from
//   rope_parameters.full_attention updated by the legacy rope_scaling (+ rope_theta, default 1e6), the
//   sliding layers' from rope_parameters.sliding_attention (+ rope_local_base_freq, default 1e4);
// - scores scaled by query_pre_attn_scalar^-1/2 (default 256); Gemma 2 soft-caps them with
//   attn_logit_softcapping (default 50). Gemma3Attention in 5.23 does not pass attn_logit_softcapping to
//   its attention function, so for Gemma 3 the field is validated and, as upstream, has no effect;
// - final_logit_softcapping (Gemma 2 default 30, Gemma 3 none) caps the logits; the MLP runs
//   gelu_pytorch_tanh only; bidirectional attention (use_bidirectional_attention) is refused.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
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

struct GemmaVariant {
  absl::string_view architecture;  // model_registry.cc's name
  absl::string_view prefix;        // class-name prefix: Gemma2, Gemma3
  absl::string_view model_class;   // Gemma2Model, Gemma3TextModel
  bool qk_norm;                    // Gemma 3
  int64_t sliding_window_pattern;  // default layer_types: every pattern-th layer is full attention
};

constexpr GemmaVariant kGemma2{.architecture = "Gemma2ForCausalLM",
                               .prefix = "Gemma2",
                               .model_class = "Gemma2Model",
                               .qk_norm = false,
                               .sliding_window_pattern = 2};
constexpr GemmaVariant kGemma3{.architecture = "Gemma3ForCausalLM",
                               .prefix = "Gemma3",
                               .model_class = "Gemma3TextModel",
                               .qk_norm = true,
                               .sliding_window_pattern = 6};

const GemmaVariant& VariantOf(const Architecture& arch) {
  return arch.name == kGemma3.architecture ? kGemma3 : kGemma2;
}

// The RoPE type of one rotary embedding: only the types whose inv_freq the runtime computes for this
// family (default; linear, which Gemma 3's global layers use) are accepted.
absl::Status CheckRopeDict(const json& params, const std::string& field) {
  if (!params.is_object()) return FieldError(field, absl::StrCat("must be an object, got ", params.dump()));
  std::string type = "default";
  for (const char* key : {"rope_type", "type"}) {
    auto it = params.find(key);
    if (it == params.end()) continue;
    if (!it->is_string())
      return FieldError(absl::StrCat(field, ".", key), absl::StrCat("must be a string, got ", it->dump()));
    type = it->get<std::string>();
    break;
  }
  if (type != "default" && type != "linear") {
    return FieldError(absl::StrCat(field, ".rope_type"),
                      absl::StrCat("\"", type, "\" is not supported for this architecture (default, linear)"));
  }
  if (auto it = params.find("partial_rotary_factor"); it != params.end() && !it->is_null()) {
    if (!it->is_number() || it->get<double>() != 1.0) {
      return FieldError(absl::StrCat(field, ".partial_rotary_factor"), "is not supported for this architecture");
    }
  }
  return absl::OkStatus();
}

// PreTrainedConfig's layer_types check: one of the known types per hidden layer.
absl::StatusOr<std::vector<std::string>> LayerTypes(const json& config, const GemmaVariant& v, int64_t layers) {
  std::vector<std::string> types;
  auto it = config.find("layer_types");
  if (it == config.end() || it->is_null()) {
    int64_t pattern = v.sliding_window_pattern;
    if (&v == &kGemma3) {
      if (auto p = config.find("sliding_window_pattern"); p != config.end() && !p->is_null()) {
        absl::StatusOr<int64_t> n = PositiveIntAtMost(*p, "sliding_window_pattern", kMaxHiddenLayers);
        if (!n.ok()) return n.status();
        pattern = *n;
      }
    }
    for (int64_t i = 0; i < layers; ++i) {
      types.push_back((i + 1) % pattern != 0 ? "sliding_attention" : "full_attention");
    }
    return types;
  }
  if (!it->is_array() || static_cast<int64_t>(it->size()) != layers) {
    return FieldError("layer_types", absl::StrCat("must be an array with one entry per hidden layer (", layers, ")"));
  }
  for (size_t i = 0; i < it->size(); ++i) {
    const json& t = (*it)[i];
    if (!t.is_string() || (t != "sliding_attention" && t != "full_attention")) {
      return FieldError(absl::StrCat("layer_types[", i, "]"),
                        absl::StrCat("must be \"sliding_attention\" or \"full_attention\", got ", t.dump()));
    }
    types.push_back(t.get<std::string>());
  }
  return types;
}

absl::Status CheckRope(const json& config, const GemmaVariant& v) {
  if (auto it = config.find("partial_rotary_factor"); it != config.end() && !it->is_null()) {
    if (!it->is_number() || it->get<double>() != 1.0) {
      return FieldError("partial_rotary_factor", "is not supported for this architecture");
    }
  }
  auto scaling = config.find("rope_scaling");
  const bool has_scaling =
      scaling != config.end() && !scaling->is_null() && !(scaling->is_object() && scaling->empty());
  if (has_scaling) {
    absl::Status s = CheckRopeDict(*scaling, "rope_scaling");
    if (!s.ok()) return s;
  }
  auto params = config.find("rope_parameters");
  if (params == config.end() || params->is_null()) return absl::OkStatus();
  if (!params->is_object())
    return FieldError("rope_parameters", absl::StrCat("must be an object, got ", params->dump()));
  const bool nested = params->contains("full_attention") || params->contains("sliding_attention");
  if (&v == &kGemma2) {
    if (nested)
      return FieldError("rope_parameters", "holds per-layer-type RoPE parameters, which Gemma 2 does not support");
    return has_scaling ? absl::OkStatus() : CheckRopeDict(*params, "rope_parameters");
  }
  if (!nested) {
    return FieldError("rope_parameters", "must hold \"full_attention\" and \"sliding_attention\" entries for Gemma 3");
  }
  for (const char* type : {"full_attention", "sliding_attention"}) {
    auto it = params->find(type);
    if (it == params->end() || it->is_null()) continue;
    absl::Status s = CheckRopeDict(*it, absl::StrCat("rope_parameters.", type));
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// A positive finite number; `fallback` when absent; 0 (none) when null and `nullable`.
absl::StatusOr<double> PositiveNumberOr(const json& config, const char* field, double fallback, bool nullable) {
  auto it = config.find(field);
  if (it == config.end()) return fallback;
  if (it->is_null() && nullable) return 0.0;
  if (!it->is_number() || !(it->get<double>() > 0) || !std::isfinite(it->get<double>())) {
    return FieldError(
        field, absl::StrCat("must be a positive finite number", nullable ? " or null" : "", ", got ", it->dump()));
  }
  return it->get<double>();
}

// The type a RoPE dict names (its first string among rope_type and type), "default" when none.
std::string RopeType(const json& params) {
  for (const char* key : {"rope_type", "type"}) {
    if (auto it = params.find(key); it != params.end() && it->is_string()) return it->get<std::string>();
  }
  return "default";
}

// Gemma 3's two RoPE dicts (Gemma3TextConfig.convert_rope_params_to_dict); CheckRope validated their shape.
absl::Status ReadGemma3Rope(const json& config, DecoderConfig& decoder) {
  json full = json{{"rope_type", "default"}};
  json local = json{{"rope_type", "default"}};
  if (auto it = config.find("rope_parameters"); it != config.end() && !it->is_null()) {
    if (auto f = it->find("full_attention"); f != it->end() && !f->is_null()) full = *f;
    if (auto s = it->find("sliding_attention"); s != it->end() && !s->is_null()) local = *s;
  }
  if (auto it = config.find("rope_scaling"); it != config.end() && !it->is_null()) full.update(*it);
  if (!full.contains("rope_theta")) {
    absl::StatusOr<double> theta = PositiveNumberOr(config, "rope_theta", 1000000.0, false);
    if (!theta.ok()) return theta.status();
    full["rope_theta"] = *theta;
  }
  if (!local.contains("rope_theta")) {
    absl::StatusOr<double> theta = PositiveNumberOr(config, "rope_local_base_freq", 10000.0, false);
    if (!theta.ok()) return theta.status();
    local["rope_theta"] = *theta;
  }
  // CheckRope allowed default and linear only, so llama3's original length is never read.
  absl::StatusOr<RopeConfig> global_rope =
      LlamaStyleRope(full, "rope_parameters.full_attention.", RopeType(full), 10000.0, 8192.0);
  if (!global_rope.ok()) return global_rope.status();
  absl::StatusOr<RopeConfig> local_rope =
      LlamaStyleRope(local, "rope_parameters.sliding_attention.", RopeType(local), 10000.0, 8192.0);
  if (!local_rope.ok()) return local_rope.status();
  decoder.rope = *global_rope;
  decoder.sliding_rope = *local_rope;
  return absl::OkStatus();
}

// The forward pass's settings of a config the builder accepted; `activation` and `layer_types` are what
// it read.
absl::StatusOr<DecoderConfig> ReadForwardPass(const json& config, const GemmaVariant& v, const std::string& activation,
                                              const std::vector<std::string>& layer_types) {
  const bool gemma3 = &v == &kGemma3;
  DecoderConfig out;
  out.architecture = std::string(v.architecture);
  out.num_layers = static_cast<int64_t>(layer_types.size());
  absl::StatusOr<double> eps = PositiveNumberOr(config, "rms_norm_eps", 1e-6, false);
  if (!eps.ok()) return eps.status();
  out.rms_norm_eps = *eps;
  if (activation != "gelu_pytorch_tanh") {
    return FieldError("hidden_activation",
                      absl::StrCat("\"", activation, "\" is not supported by the runtime (gelu_pytorch_tanh)"));
  }
  if (auto it = config.find("use_bidirectional_attention"); it != config.end() && !it->is_null()) {
    if (!it->is_boolean()) return FieldError("use_bidirectional_attention", "must be true, false or null");
    if (it->get<bool>()) return FieldError("use_bidirectional_attention", "is not supported (bidirectional attention)");
  }
  absl::StatusOr<double> scalar = PositiveNumberOr(config, "query_pre_attn_scalar", 256, false);
  if (!scalar.ok()) return scalar.status();
  out.query_pre_attn_scalar = *scalar;
  absl::StatusOr<double> final_cap = PositiveNumberOr(config, "final_logit_softcapping", gemma3 ? 0.0 : 30.0, true);
  if (!final_cap.ok()) return final_cap.status();
  out.final_logit_softcapping = *final_cap;
  absl::StatusOr<double> attn_cap = PositiveNumberOr(config, "attn_logit_softcapping", gemma3 ? 0.0 : 50.0, true);
  if (!attn_cap.ok()) return attn_cap.status();
  if (!gemma3) out.attn_logit_softcapping = *attn_cap;

  const bool any_sliding = std::find(layer_types.begin(), layer_types.end(), "sliding_attention") != layer_types.end();
  int64_t window = 4096;
  if (auto it = config.find("sliding_window"); it != config.end()) {
    if (it->is_null()) {
      if (any_sliding) return FieldError("sliding_window", "is null but layer_types has sliding_attention layers");
    } else if (!it->is_number_integer() || it->get<int64_t>() <= 0) {
      return FieldError("sliding_window", absl::StrCat("must be a positive integer, got ", it->dump()));
    } else {
      window = it->get<int64_t>();
    }
  }
  out.sliding_window.assign(layer_types.size(), 0);
  for (size_t i = 0; i < layer_types.size(); ++i) {
    if (layer_types[i] == "sliding_attention") out.sliding_window[i] = window;
  }

  if (gemma3) {
    if (absl::Status s = ReadGemma3Rope(config, out); !s.ok()) return s;
    return out;
  }
  // Gemma 2: one Llama-style dict, a truthy legacy rope_scaling winning over rope_parameters (CheckRope
  // allowed default and linear RoPE only, and no partial rotation).
  const json* params = nullptr;
  std::string prefix;
  for (const char* name : {"rope_scaling", "rope_parameters"}) {
    auto it = config.find(name);
    if (it != config.end() && it->is_object() && !it->empty()) {
      params = &*it;
      prefix = absl::StrCat(name, ".");
      break;
    }
  }
  absl::StatusOr<double> theta = NumberOr(config, "", "rope_theta", 10000.0);
  if (!theta.ok()) return theta.status();
  absl::StatusOr<RopeConfig> rope = LlamaStyleRope(params != nullptr ? *params : json::object(), prefix,
                                                   params != nullptr ? RopeType(*params) : "default", *theta, 8192.0);
  if (!rope.ok()) return rope.status();
  out.rope = *rope;
  return out;
}

// The model's sizes, read from config.json and checked as both config classes do.
using GemmaSizes = DecoderSizes;

// Reads and checks hidden, intermediate, layers, heads, vocab, kv heads, head_dim and pad_token_id.
absl::StatusOr<GemmaSizes> ReadSizes(const json& config) {
  absl::StatusOr<DecoderSizes> sizes = ReadDecoderSizes(config);
  if (!sizes.ok()) return sizes.status();
  const int64_t hidden = sizes->hidden, heads = sizes->heads, vocab = sizes->vocab;
  // Both config classes type these `int` with defaults 4 and 256: null is refused.
  absl::StatusOr<int64_t> kv_heads = PositiveIntOr(config, "num_key_value_heads", 4, false, kMaxAttentionHeads);
  if (!kv_heads.ok()) return kv_heads.status();
  absl::StatusOr<int64_t> head_dim = PositiveIntOr(config, "head_dim", 256, false, kMaxHeadDim);
  if (!head_dim.ok()) return head_dim.status();
  // validate_architecture of both config classes.
  if (hidden % heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: hidden_size (", hidden,
                                                   ") must be a multiple of num_attention_heads (", heads, ")"));
  }
  if (heads % *kv_heads != 0) {
    return FieldError("num_key_value_heads",
                      absl::StrCat("(", *kv_heads, ") must divide num_attention_heads (", heads, ")"));
  }
  if (absl::Status s = CheckPadTokenId(config, vocab, 0); !s.ok()) return s;
  sizes->kv_heads = *kv_heads;
  sizes->head_dim = *head_dim;
  return sizes;
}

// The activation, the embedding tie and the attention bias, as config.json states them.
struct GemmaOptions {
  std::string activation = "gelu_pytorch_tanh";
  std::string act_class;
  bool tie = true;
  bool bias = false;
};

// Reads and checks hidden_activation, tie_word_embeddings and attention_bias.
absl::StatusOr<GemmaOptions> ReadOptions(const json& config) {
  GemmaOptions options;
  if (auto it = config.find("hidden_activation"); it != config.end() && !it->is_null()) {
    if (!it->is_string()) return FieldError("hidden_activation", absl::StrCat("must be a string, got ", it->dump()));
    options.activation = it->get<std::string>();
  }
  std::optional<std::string> act_class = ActivationClass(options.activation);
  if (!act_class) return FieldError("hidden_activation", absl::StrCat("\"", options.activation, "\" is not supported"));
  options.act_class = *act_class;

  absl::StatusOr<bool> tie = BoolOr(config, "tie_word_embeddings", true);
  if (!tie.ok()) return tie.status();
  options.tie = *tie;
  absl::StatusOr<bool> bias = BoolOr(config, "attention_bias", false);
  if (!bias.ok()) return bias.status();
  options.bias = *bias;
  return options;
}

// One decoder layer: attention (with Gemma 3's q/k norms), MLP and the four norms.
ModuleSpec DecoderLayer(const ModuleSpec& layer_list, int64_t i, const GemmaVariant& v, const GemmaSizes& sizes,
                        const GemmaOptions& options, DType dtype) {
  const std::string p(v.prefix);
  const std::string norm_class = p + "RMSNorm";
  const int64_t hidden = sizes.hidden;
  const int64_t intermediate = sizes.intermediate;
  const int64_t heads = sizes.heads;
  const int64_t kv_heads = sizes.kv_heads;
  const int64_t head_dim = sizes.head_dim;
  const bool bias = options.bias;
  ModuleSpec layer = Module(layer_list, std::to_string(i), p + "DecoderLayer");
  ModuleSpec attn = Module(layer, "self_attn", p + "Attention");
  attn.children.push_back(LinearModule(attn, "q_proj", hidden, heads * head_dim, bias, dtype));
  attn.children.push_back(LinearModule(attn, "k_proj", hidden, kv_heads * head_dim, bias, dtype));
  attn.children.push_back(LinearModule(attn, "v_proj", hidden, kv_heads * head_dim, bias, dtype));
  attn.children.push_back(LinearModule(attn, "o_proj", heads * head_dim, hidden, bias, dtype));
  if (v.qk_norm) {
    attn.children.push_back(Norm(attn, "q_norm", norm_class, head_dim, dtype));
    attn.children.push_back(Norm(attn, "k_norm", norm_class, head_dim, dtype));
  }
  layer.children.push_back(std::move(attn));
  ModuleSpec mlp = Module(layer, "mlp", p + "MLP");
  mlp.children.push_back(LinearModule(mlp, "gate_proj", hidden, intermediate, false, dtype));
  mlp.children.push_back(LinearModule(mlp, "up_proj", hidden, intermediate, false, dtype));
  mlp.children.push_back(LinearModule(mlp, "down_proj", intermediate, hidden, false, dtype));
  mlp.children.push_back(Module(mlp, "act_fn", options.act_class));
  layer.children.push_back(std::move(mlp));
  for (const char* norm :
       {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"}) {
    layer.children.push_back(Norm(layer, norm, norm_class, hidden, dtype));
  }
  return layer;
}

// The rotary embedding and its non-persistent float32 buffers.
ModuleSpec RotaryEmbedding(const ModuleSpec& model, const GemmaVariant& v, int64_t head_dim,
                           const std::vector<std::string>& layer_types) {
  const std::string p(v.prefix);
  // Default and linear RoPE: arange(0, head_dim, 2) frequencies, float32, non-persistent.
  const int64_t inv_freq_length = (head_dim + 1) / 2;
  ModuleSpec rotary = Module(model, "rotary_emb", p + "RotaryEmbedding");
  if (v.qk_norm) {
    // Gemma3RotaryEmbedding: one pair per layer type in use, in sorted order.
    const std::set<std::string> used(layer_types.begin(), layer_types.end());
    for (const std::string& type : used) {
      rotary.buffers.push_back(Tensor(type + "_inv_freq", {inv_freq_length}, DType::kFloat32, false));
      rotary.buffers.push_back(Tensor(type + "_original_inv_freq", {inv_freq_length}, DType::kFloat32, false));
    }
  } else {
    rotary.buffers.push_back(Tensor("inv_freq", {inv_freq_length}, DType::kFloat32, false));
    rotary.buffers.push_back(Tensor("original_inv_freq", {inv_freq_length}, DType::kFloat32, false));
  }
  return rotary;
}

// The spec's summary fields and its module tree, from the checked sizes, options and layer types.
ModelSpec BuildSpec(const GemmaVariant& v, const GemmaSizes& sizes, const GemmaOptions& options,
                    const std::vector<std::string>& layer_types, DType dtype) {
  const std::string p(v.prefix);
  const std::string norm_class = p + "RMSNorm";
  ModelSpec spec = DecoderSpecFrame(std::string(v.architecture), dtype, p, options.tie, sizes);
  ModuleSpec& root = spec.root;
  ModuleSpec model = Module(root, "model", std::string(v.model_class));
  // torch.tensor(hidden_size ** 0.5) built under from_config's default dtype: a 0-d buffer in the
  // serving dtype, not saved in checkpoints.
  ModuleSpec embed = Module(model, "embed_tokens", p + "TextScaledWordEmbedding");
  embed.parameters.push_back(Tensor("weight", {sizes.vocab, sizes.hidden}, dtype));
  embed.buffers.push_back(Tensor("embed_scale", {}, dtype, /*persistent=*/false));
  model.children.push_back(std::move(embed));

  model.children.push_back(DecoderLayers(model, sizes.layers, [&](const ModuleSpec& list, int64_t i) {
    return DecoderLayer(list, i, v, sizes, options, dtype);
  }));
  model.children.push_back(Norm(model, "norm", norm_class, sizes.hidden, dtype));

  model.children.push_back(RotaryEmbedding(model, v, sizes.head_dim, layer_types));
  root.children.push_back(std::move(model));
  root.children.push_back(LinearModule(root, "lm_head", sizes.hidden, sizes.vocab, /*bias=*/false, dtype));
  return spec;
}

}  // namespace

absl::StatusOr<ModelSpec> GemmaSpecFromConfig(const json& config, const Architecture& arch, DType dtype,
                                              int64_t /*max_positions*/) {
  const GemmaVariant& v = VariantOf(arch);

  absl::StatusOr<GemmaSizes> sizes = ReadSizes(config);
  if (!sizes.ok()) return sizes.status();
  absl::StatusOr<GemmaOptions> options = ReadOptions(config);
  if (!options.ok()) return options.status();
  absl::StatusOr<std::vector<std::string>> layer_types = LayerTypes(config, v, sizes->layers);
  if (!layer_types.ok()) return layer_types.status();
  if (absl::Status s = CheckRope(config, v); !s.ok()) return s;

  ModelSpec spec = BuildSpec(v, *sizes, *options, *layer_types, dtype);
  if (absl::StatusOr<int64_t> total = SpecBytes(spec); !total.ok()) {
    return FieldError("num_hidden_layers", absl::StrCat("x the layer sizes: ", total.status().message()));
  }
  spec.decoder = ReadForwardPass(config, v, options->activation, *layer_types);
  if (spec.decoder.ok()) {
    SetSizes(*sizes, *spec.decoder);
    spec.decoder->qkv_bias = spec.decoder->o_bias = options->bias;
  }
  return spec;
}

}  // namespace strata::planner
