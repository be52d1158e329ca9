#pragma once
// Internal to planner/: the pieces the config.json model builders share (model_spec_llama.cc,
// model_spec_gemma.cc, model_spec_phi3.cc, model_spec_moe.cc): typed field readers whose errors name the
// field ("config.json: FIELD what"), constructors for the nn.Module nodes transformers registers, and the
// readers of the forward pass's settings (decoder_config.h) that more than one family uses.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "planner/decoder_config.h"
#include "planner/model_spec.h"

namespace strata::planner::spec_builder {

using json = nlohmann::json;

inline absl::Status FieldError(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("config.json: ", field, " ", what));
}

// A positive integer no larger than `max`; booleans and floats such as 64.0 are refused, as transformers'
// strict config dataclasses refuse them for int fields.
inline absl::StatusOr<int64_t> PositiveIntAtMost(const json& value, absl::string_view field, int64_t max) {
  if (!value.is_number_integer() || (!value.is_number_unsigned() && value.get<int64_t>() <= 0) ||
      (value.is_number_unsigned() && value.get<uint64_t>() == 0)) {
    return FieldError(field, absl::StrCat("must be a positive integer, got ", value.dump()));
  }
  if ((value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(max)) ||
      (!value.is_number_unsigned() && value.get<int64_t>() > max)) {
    return FieldError(field, absl::StrCat("must be at most ", max, ", got ", value.dump()));
  }
  return value.get<int64_t>();
}

inline absl::StatusOr<int64_t> RequiredPositiveInt(const json& config, absl::string_view field, int64_t max) {
  auto it = config.find(field);
  if (it == config.end()) return FieldError(field, "is missing (expected a positive integer)");
  return PositiveIntAtMost(*it, field, max);
}

// The field's value, `fallback` when absent; null is `fallback` only where `may_be_null`.
inline absl::StatusOr<int64_t> PositiveIntOr(const json& config, absl::string_view field, int64_t fallback,
                                             bool may_be_null, int64_t max) {
  auto it = config.find(field);
  if (it == config.end() || (it->is_null() && may_be_null)) return fallback;
  return PositiveIntAtMost(*it, field, max);
}

inline absl::StatusOr<bool> BoolOr(const json& config, absl::string_view field, bool fallback) {
  auto it = config.find(field);
  if (it == config.end()) return fallback;
  if (!it->is_boolean()) return FieldError(field, absl::StrCat("must be true or false, got ", it->dump()));
  return it->get<bool>();
}

// nn.Embedding(vocab, hidden, padding_idx=pad_token_id) asserts that the padding index is inside the table.
inline absl::Status CheckPadTokenId(const json& config, int64_t vocab, int64_t fallback) {
  int64_t pad = fallback;
  auto it = config.find("pad_token_id");
  if (it != config.end()) {
    if (it->is_null()) return absl::OkStatus();
    if (!it->is_number_integer())
      return FieldError("pad_token_id", absl::StrCat("must be an integer, got ", it->dump()));
    if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(vocab)) {
      return FieldError("pad_token_id", absl::StrCat("(", it->dump(), ") must be below vocab_size (", vocab, ")"));
    }
    pad = it->get<int64_t>();
  }
  if (pad >= vocab || pad < -vocab) {
    return FieldError("pad_token_id", absl::StrCat("(", pad, ") must be below vocab_size (", vocab, ")"));
  }
  return absl::OkStatus();
}

// ACT2FN's parameterless activations this family's checkpoints use -> module class name; nullopt for others.
inline std::optional<std::string> ActivationClass(absl::string_view name) {
  constexpr std::pair<absl::string_view, absl::string_view> kActivations[] = {
      {"gelu", "GELUActivation"},
      {"gelu_python", "GELUActivation"},
      {"gelu_new", "NewGELUActivation"},
      {"gelu_pytorch_tanh", "GELUTanh"},
      {"gelu_python_tanh", "GELUTanh"},
      {"silu", "SiLUActivation"},
      {"swish", "SiLU"},
      {"relu", "ReLU"},
  };
  for (const auto& [n, cls] : kActivations) {
    if (n == name) return std::string(cls);
  }
  return std::nullopt;
}

inline TensorSpec Tensor(std::string name, std::vector<int64_t> shape, DType dtype, bool persistent = true) {
  return TensorSpec{std::move(name), std::move(shape), dtype, persistent};
}

inline ModuleSpec Module(const ModuleSpec& parent, std::string_view local, std::string class_name) {
  ModuleSpec m;
  m.name = parent.ChildName(local);
  m.class_name = std::move(class_name);
  return m;
}

// A decoder's sizes as a family builder reads them from config.json.
struct DecoderSizes {
  int64_t hidden = 0;
  int64_t intermediate = 0;
  int64_t layers = 0;
  int64_t heads = 0;
  int64_t vocab = 0;
  int64_t kv_heads = 0;  // the family's own read (its defaults differ)
  int64_t head_dim = 0;  // the family's own read
};

// The five sizes every family's config states: hidden_size, intermediate_size, num_hidden_layers,
// num_attention_heads, vocab_size, each required (transformers would fall back to the config class's
// defaults, a 7B model's sizes; a real checkpoint always states them, so a missing one is a broken config),
// positive and capped (model_spec.h). kv_heads and head_dim are left to the family.
inline absl::StatusOr<DecoderSizes> ReadDecoderSizes(const json& config) {
  DecoderSizes sizes;
  const std::pair<absl::string_view, std::pair<int64_t*, int64_t>> fields[] = {
      {"hidden_size", {&sizes.hidden, kMaxHiddenSize}},
      {"intermediate_size", {&sizes.intermediate, kMaxHiddenSize}},
      {"num_hidden_layers", {&sizes.layers, kMaxHiddenLayers}},
      {"num_attention_heads", {&sizes.heads, kMaxAttentionHeads}},
      {"vocab_size", {&sizes.vocab, kMaxVocabSize}},
  };
  for (const auto& [field, target] : fields) {
    absl::StatusOr<int64_t> v = RequiredPositiveInt(config, field, target.second);
    if (!v.ok()) return v.status();
    *target.first = *v;
  }
  return sizes;
}

// The sizes into the model's one hyper-parameter struct.
inline void SetSizes(const DecoderSizes& sizes, DecoderConfig& decoder) {
  decoder.num_layers = sizes.layers;
  decoder.hidden = sizes.hidden;
  decoder.intermediate = sizes.intermediate;
  decoder.num_heads = sizes.heads;
  decoder.num_kv_heads = sizes.kv_heads;
  decoder.head_dim = sizes.head_dim;
  decoder.vocab = sizes.vocab;
}

// nn.Linear(in, out, bias): weight [out, in], then bias [out].
inline ModuleSpec LinearModule(const ModuleSpec& parent, std::string_view local, int64_t in, int64_t out, bool bias,
                               DType dtype) {
  ModuleSpec m = Module(parent, local, "Linear");
  m.parameters.push_back(Tensor("weight", {out, in}, dtype));
  if (bias) m.parameters.push_back(Tensor("bias", {out}, dtype));
  return m;
}

// A decoder-only spec's frame: its architecture (also the root's class), dtype, `<prefix>DecoderLayer` as the
// no-split class, lm_head tied to the embedding when `tie`, and the sizes GetDeviceMap and the KV reserve read.
inline ModelSpec DecoderSpecFrame(std::string architecture, DType dtype, const std::string& prefix, bool tie,
                                  const DecoderSizes& sizes) {
  ModelSpec spec;
  spec.architecture = std::move(architecture);
  spec.dtype = dtype;
  spec.no_split_classes = {prefix + "DecoderLayer"};
  if (tie) spec.tied_weights["lm_head.weight"] = "model.embed_tokens.weight";
  spec.num_hidden_layers = sizes.layers;
  spec.num_key_value_heads = sizes.kv_heads;
  spec.head_dim = sizes.head_dim;
  spec.root.class_name = spec.architecture;
  return spec;
}

// nn.ModuleList of `count` decoder layers under `parent`: "layers.0", "layers.1", ... each built by
// `layer(list, i)`, a family's own decoder layer.
template <typename LayerBuilder>
ModuleSpec DecoderLayers(const ModuleSpec& parent, int64_t count, LayerBuilder&& layer) {
  ModuleSpec list = Module(parent, "layers", "ModuleList");
  for (int64_t i = 0; i < count; ++i) list.children.push_back(layer(list, i));
  return list;
}

inline ModuleSpec Norm(const ModuleSpec& parent, std::string_view local, const std::string& class_name, int64_t dim,
                       DType dtype) {
  ModuleSpec m = Module(parent, local, class_name);
  m.parameters.push_back(Tensor("weight", {dim}, dtype));
  return m;
}

// A multi-token-prediction layer (ModelSpec::mtp) from the family's decoder layer model.layers.<num_hidden_layers>,
// as DeepSeek-V3's and GLM-4.5's checkpoints store it (vLLM's DeepSeekMultiTokenPredictorLayer): the layer, its class
// named `class_name`, plus enorm and hnorm (`norm_class`), eh_proj, shared_head {norm, head} and embed_tokens. Its
// experts' storage and `sparse` are the caller's.
inline MtpLayerSpec MtpLayer(ModuleSpec layer, std::string class_name, const std::string& norm_class, int64_t hidden,
                             int64_t vocab, DType dtype) {
  layer.class_name = std::move(class_name);
  layer.children.push_back(Norm(layer, "enorm", norm_class, hidden, dtype));
  layer.children.push_back(Norm(layer, "hnorm", norm_class, hidden, dtype));
  layer.children.push_back(LinearModule(layer, "eh_proj", 2 * hidden, hidden, /*bias=*/false, dtype));
  ModuleSpec head = Module(layer, "shared_head", "SharedHead");
  head.children.push_back(Norm(head, "norm", norm_class, hidden, dtype));
  head.children.push_back(LinearModule(head, "head", hidden, vocab, /*bias=*/false, dtype));
  layer.children.push_back(std::move(head));
  ModuleSpec embed = Module(layer, "embed_tokens", "Embedding");
  embed.parameters.push_back(Tensor("weight", {vocab, hidden}, dtype));
  layer.children.push_back(std::move(embed));
  MtpLayerSpec mtp;
  mtp.module = std::move(layer);
  return mtp;
}

// Whether config.json declares a multi-token-prediction layer (num_nextn_predict_layers, which transformers' configs
// do not read): a positive integer; anything else is none (only --speculative mtp needs one).
inline bool DeclaresMtpLayer(const json& config) {
  auto it = config.find("num_nextn_predict_layers");
  return it != config.end() && it->is_number_integer() && it->get<int64_t>() > 0;
}

// --- The forward pass's settings (decoder_config.cc). Their errors are not the planner's: a family
// builder keeps them in ModelSpec::decoder, for the runtime to report, and places the model all the same.

// A number (not a boolean), `fallback` when absent or null; else an error naming `prefix` + `key`.
absl::StatusOr<double> NumberOr(const json& object, absl::string_view prefix, absl::string_view key, double fallback);

// The config's RoPE dict as PreTrainedConfig.convert_rope_params_to_dict picks it: a truthy legacy `rope_scaling`
// wins over `rope_parameters` (null and {} count as absent; anything else but an object is an error naming the
// field). `params` is null when the config has neither; `field` names the one found, else "rope_parameters".
struct RopeDict {
  const json* params = nullptr;
  std::string field = "rope_parameters";
};
absl::StatusOr<RopeDict> FindRopeDict(const json& config);

// The dict's "rope_type" (else the legacy "type"), `fallback` when it has neither or there is no dict.
absl::StatusOr<std::string> RopeTypeOf(const RopeDict& dict, std::string fallback = "default");

// The RoPE of one Llama-style dict (rope_parameters or the legacy rope_scaling; `prefix` names it with its
// dot, and is "" with an empty `params` when the config has neither) whose `type` the builder resolved:
// its rope_theta (else `theta`, the top-level field's), linear's and llama3's factor, llama3's frequency
// factors and original_max_position_embeddings (else `max_positions`). Types other than default, linear
// and llama3 are errors: the runtime implements no others for these families.
absl::StatusOr<RopeConfig> LlamaStyleRope(const json& params, absl::string_view prefix, absl::string_view type,
                                          double theta, double max_positions);

// YaRN's dict (rope_parameters or rope_scaling; `prefix` names it with its dot): rope_theta (else `theta`),
// factor (else max_position_embeddings / original_max_position_embeddings), original_max_position_embeddings
// (else `max_positions`), beta_fast, beta_slow, truncate, and the cos/sin attention_factor as
// transformers' _compute_yarn_parameters derives it from mscale and mscale_all_dim.
absl::StatusOr<RopeConfig> YarnRope(const json& params, absl::string_view prefix, double theta, double max_positions);

// GQA's heads into `sizes`: num_key_value_heads (`default_kv_heads` when absent; null refused) dividing
// num_attention_heads, and head_dim (`default_head_dim` when absent). Returns head_dim.
absl::StatusOr<int64_t> ReadGqaHeads(const json& config, int64_t default_kv_heads, int64_t default_head_dim,
                                     DecoderSizes& sizes);

// hidden_act: a string (else an error naming the field), "silu" when absent; with `silu_only`, any other refused (the
// families whose runtime MLP is SiLU-gated).
absl::StatusOr<std::string> HiddenAct(const json& config, bool silu_only);

// rms_norm_eps: a positive finite number (zero would divide a zero row by zero), `fallback` when absent.
absl::StatusOr<double> RmsNormEps(const json& config, double fallback);

// The RoPE of a family whose dict (rope_parameters, or the legacy rope_scaling) takes a Llama-style type or YaRN:
// theta from the dict, else the top-level rope_theta, else `default_theta` (the config class's); `defaults` stands in
// for a config with no dict (nullptr: the default type).
absl::StatusOr<RopeConfig> DictRope(const json& config, double default_theta, int64_t max_positions,
                                    const json* defaults = nullptr);

// The end of a builder whose family reads DictRope: rms_norm_eps (RmsNormEps, `default_eps` when absent) into
// `decoder` (an error is returned: the config is bad), then its RoPE (DictRope with `default_theta` and
// `rope_defaults`): an error there becomes spec.decoder (the tree stands; the runtime refuses to run it), else
// `decoder` goes into spec.decoder.
absl::Status FinishDictRopeDecoder(const json& config, double default_eps, double default_theta, int64_t max_positions,
                                   const json* rope_defaults, DecoderConfig decoder, ModelSpec& spec);

// partial_rotary_factor in (0, 1]: the RoPE dict's own, else the top-level field, else `fallback`
// (PreTrainedConfig.convert_rope_params_to_dict's order).
absl::StatusOr<double> PartialRotaryFactor(const json& config, double fallback);

// A causal LM's tree around its decoder layers, as transformers' <prefix>ForCausalLM registers it: model
// (<prefix>Model: embed_tokens, layers built by `layer(list, i)`, norm (<prefix>RMSNorm), rotary_emb
// (<prefix>RotaryEmbedding with float32 inv_freq and original_inv_freq of `inv_freq` values)), then lm_head; the
// total checked against the caps (an error names num_hidden_layers).
template <typename LayerBuilder>
absl::Status BuildCausalLm(ModelSpec& spec, const DecoderSizes& sizes, const std::string& prefix, int64_t inv_freq,
                           LayerBuilder&& layer) {
  const int64_t hidden = sizes.hidden;
  ModuleSpec model = Module(spec.root, "model", prefix + "Model");
  ModuleSpec embed = Module(model, "embed_tokens", "Embedding");
  embed.parameters.push_back(Tensor("weight", {sizes.vocab, hidden}, spec.dtype));
  model.children.push_back(std::move(embed));
  model.children.push_back(DecoderLayers(model, sizes.layers, layer));
  model.children.push_back(Norm(model, "norm", prefix + "RMSNorm", hidden, spec.dtype));
  ModuleSpec rotary = Module(model, "rotary_emb", prefix + "RotaryEmbedding");
  rotary.buffers.push_back(Tensor("inv_freq", {inv_freq}, DType::kFloat32, /*persistent=*/false));
  rotary.buffers.push_back(Tensor("original_inv_freq", {inv_freq}, DType::kFloat32, /*persistent=*/false));
  model.children.push_back(std::move(rotary));
  spec.root.children.push_back(std::move(model));
  spec.root.children.push_back(LinearModule(spec.root, "lm_head", hidden, sizes.vocab, /*bias=*/false, spec.dtype));
  if (absl::StatusOr<int64_t> total = SpecBytes(spec); !total.ok()) {
    return FieldError("num_hidden_layers", absl::StrCat("x the layer sizes: ", total.status().message()));
  }
  return absl::OkStatus();
}

}  // namespace strata::planner::spec_builder
