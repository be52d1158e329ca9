// ModelSpecFromConfig for the Llama family: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM.
//
// The tree reproduces what transformers 5.23 builds for `AutoModelForCausalLM.from_config(config, dtype=...)`
// (models/{llama,mistral,qwen2}/modeling_*.py and configuration_*.py): the same module names, class names,
// registration order, parameters, buffers and tied weights. The three families share one layout and differ
// in class-name prefix, config defaults, validation and which projections carry a bias. Qwen3, Qwen3-MoE
// and Mixtral reuse this layout and edit it through Family::extend (model_spec_qwen3.h, model_spec_moe.h).
//
// The forward pass's settings (ModelSpec::decoder) are read with the tree: rms_norm_eps, RoPE (default,
// linear, llama3), sliding windows per layer (Mistral: `sliding_window` on every layer; Qwen2 and Qwen3:
// with `use_sliding_window`, on the layers `layer_types` or, absent, `max_window_layers` marks; Qwen3-MoE
// on every layer with `use_sliding_window`; Llama none), the activation (SiLU only).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "planner/decoder_config.h"
#include "planner/model_registry.h"
#include "planner/model_spec.h"
#include "planner/model_spec_moe.h"
#include "planner/model_spec_qwen3.h"
#include "planner/spec_builder.h"

namespace strata::planner {
namespace {

using namespace spec_builder;  // NOLINT: the family builders' shared vocabulary

// Which layers attend through a sliding window, as each family's modeling code decides it.
enum class SlidingWindows {
  kNone,     // Llama
  kMistral,  // `sliding_window` (default none) on every layer: Mistral, Mixtral
  // Qwen2, Qwen3: `sliding_window` (default 4096) where `use_sliding_window`, on the layers `layer_types`
  // marks "sliding_attention", else on the layers from `max_window_layers` (default 28) on.
  kQwen2,
  kQwen2EveryLayer,  // Qwen3-MoE: as Qwen2, but on every layer
};

// How one family's config class and modeling code differ from Llama's.
struct Family {
  absl::string_view architecture;  // "LlamaForCausalLM" (model_registry.cc's name)
  absl::string_view prefix;        // class-name prefix: "Llama" -> LlamaModel, LlamaDecoderLayer, ...
  // num_key_value_heads when config.json omits it: the config class's field default (MistralConfig: 8,
  // Qwen2Config: 32), or nullopt where the default is None and __post_init__ copies num_attention_heads.
  std::optional<int64_t> default_kv_heads = std::nullopt;
  bool kv_heads_may_be_null = false;  // MistralConfig types the field `int`, so an explicit null is rejected
  // Qwen2Config declares no head_dim field: a head_dim in config.json is kept as an extra attribute and
  // honoured, but an explicit null reaches `head_dim ** -0.5` in Qwen2Attention and fails.
  bool declares_head_dim = false;
  bool reads_attention_bias = false;      // LlamaAttention: bias=config.attention_bias on q, k, v and o
  bool reads_mlp_bias = false;            // LlamaMLP: bias=config.mlp_bias
  bool qkv_bias = false;                  // Qwen2Attention: q, k, v always have a bias, o never
  bool requires_divisible_heads = false;  // LlamaConfig.validate_architecture, even when head_dim is explicit
  // head_dim when config.json omits it (Qwen3Config: 128), else hidden_size / num_attention_heads.
  std::optional<int64_t> default_head_dim = std::nullopt;
  SlidingWindows sliding_windows = SlidingWindows::kNone;
  // The family's changes to the Llama layout (q/k norms, sparse MoE blocks) and to the forward pass's
  // settings that go with them, model_spec_qwen3.h and model_spec_moe.h.
  absl::Status (*extend)(const json& config, ModelSpec& spec, DecoderConfig& decoder) = nullptr;
};

constexpr Family kFamilies[] = {
    {.architecture = "LlamaForCausalLM",
     .prefix = "Llama",
     .default_kv_heads = std::nullopt,
     .kv_heads_may_be_null = true,
     .declares_head_dim = true,
     .reads_attention_bias = true,
     .reads_mlp_bias = true,
     .requires_divisible_heads = true},
    {.architecture = "MistralForCausalLM",
     .prefix = "Mistral",
     .default_kv_heads = 8,
     .declares_head_dim = true,
     .sliding_windows = SlidingWindows::kMistral},
    {.architecture = "Qwen2ForCausalLM",
     .prefix = "Qwen2",
     .default_kv_heads = 32,
     .kv_heads_may_be_null = true,
     .qkv_bias = true,
     .sliding_windows = SlidingWindows::kQwen2},
    {.architecture = "Qwen3ForCausalLM",
     .prefix = "Qwen3",
     .default_kv_heads = 32,
     .kv_heads_may_be_null = true,
     .declares_head_dim = true,
     .reads_attention_bias = true,
     .default_head_dim = 128,
     .sliding_windows = SlidingWindows::kQwen2,
     .extend = internal::ExtendQwen3Spec},
    {.architecture = "Qwen3MoeForCausalLM",
     .prefix = "Qwen3Moe",
     .default_kv_heads = 4,
     .reads_attention_bias = true,
     .sliding_windows = SlidingWindows::kQwen2EveryLayer,
     .extend = internal::ExtendQwen3MoeSpec},
    {.architecture = "MixtralForCausalLM",
     .prefix = "Mixtral",
     .default_kv_heads = 8,
     .declares_head_dim = true,
     .sliding_windows = SlidingWindows::kMistral,
     .extend = internal::ExtendMixtralSpec},
};

// ACT2FN's parameterless activations (transformers/activations.py): hidden_act -> module class name.
constexpr std::pair<absl::string_view, absl::string_view> kActivations[] = {
    {"gelu", "GELUActivation"},
    {"gelu_10", "ClippedGELUActivation"},
    {"gelu_accurate", "AccurateGELUActivation"},
    {"gelu_fast", "FastGELUActivation"},
    {"gelu_new", "NewGELUActivation"},
    {"gelu_python", "GELUActivation"},
    {"gelu_python_tanh", "GELUTanh"},
    {"gelu_pytorch_tanh", "GELUTanh"},
    {"hardswish", "Hardswish"},
    {"laplace", "LaplaceActivation"},
    {"leaky_relu", "LeakyReLU"},
    {"linear", "LinearActivation"},
    {"mish", "MishActivation"},
    {"quick_gelu", "QuickGELUActivation"},
    {"relu", "ReLU"},
    {"relu2", "ReLUSquaredActivation"},
    {"relu6", "ReLU6"},
    {"sigmoid", "Sigmoid"},
    {"silu", "SiLUActivation"},
    {"sqrtsoftplus", "SqrtSoftplusActivation"},
    {"swish", "SiLU"},
    {"tanh", "Tanh"},
};

// A positive integer, absent (nullopt) or, where `may_be_null`, null (also nullopt).
absl::StatusOr<std::optional<int64_t>> OptionalPositiveInt(const json& config, absl::string_view field,
                                                           bool may_be_null, int64_t max) {
  auto it = config.find(field);
  if (it == config.end()) return std::optional<int64_t>();
  if (it->is_null() && may_be_null) return std::optional<int64_t>();
  absl::StatusOr<int64_t> v = PositiveIntAtMost(*it, field, max);
  if (!v.ok()) return v.status();
  return std::optional<int64_t>(*v);
}

const Family& FamilyOf(const Architecture& arch) {
  for (const Family& f : kFamilies) {
    if (f.architecture == arch.name) return f;
  }
  return kFamilies[0];  // unreachable: model_registry.cc names this builder for these architectures only
}

// The RoPE settings that decide the length of the rotary embedding's inv_freq buffer.
struct RopeShape {
  std::string type = "default";
  std::optional<double> partial_rotary_factor;
  std::optional<int64_t> longrope_short_factors;  // length of short_factor, for "longrope"
  std::string field = "rope_parameters";          // the config field the settings came from
  const json* params = nullptr;                   // its dict, when the config has a non-empty one
};

absl::StatusOr<RopeShape> ParseRope(const json& config) {
  RopeShape rope;
  // PreTrainedConfig.convert_rope_params_to_dict: a truthy legacy `rope_scaling` wins over
  // `rope_parameters`; a top-level partial_rotary_factor is a default for the dict's own.
  absl::StatusOr<RopeDict> dict = FindRopeDict(config);
  if (!dict.ok()) return dict.status();
  const json* params = dict->params;
  rope.field = dict->field;
  rope.params = params;
  if (auto it = config.find("partial_rotary_factor"); it != config.end() && !it->is_null()) {
    if (!it->is_number() || it->get<double>() <= 0) {
      return FieldError("partial_rotary_factor", absl::StrCat("must be a positive number, got ", it->dump()));
    }
    rope.partial_rotary_factor = it->get<double>();
  }
  if (params == nullptr) return rope;

  const std::string prefix = absl::StrCat(rope.field, ".");
  if (params->contains("full_attention") || params->contains("sliding_attention")) {
    // Per-layer-type RoPE dicts: the Llama-family rotary embedding reads rope_parameters["rope_type"] and
    // fails on them.
    return FieldError(rope.field, "holds per-layer-type RoPE parameters, which this architecture does not support");
  }
  absl::StatusOr<std::string> type = RopeTypeOf(*dict);
  if (!type.ok()) return type.status();
  rope.type = *type;
  constexpr absl::string_view kRopeTypes[] = {"default",  "linear", "dynamic",     "yarn",
                                              "longrope", "llama3", "proportional"};
  bool known = false;
  for (absl::string_view t : kRopeTypes) known = known || t == rope.type;
  if (!known) {
    return FieldError(absl::StrCat(prefix, "rope_type"),
                      absl::StrCat("\"", rope.type, "\" is not a RoPE type transformers knows (",
                                   absl::StrJoin(kRopeTypes, ", "), ")"));
  }
  if (auto it = params->find("partial_rotary_factor"); it != params->end() && !it->is_null()) {
    if (!it->is_number() || it->get<double>() <= 0) {
      return FieldError(absl::StrCat(prefix, "partial_rotary_factor"),
                        absl::StrCat("must be a positive number, got ", it->dump()));
    }
    rope.partial_rotary_factor = it->get<double>();
  }
  if (rope.type == "longrope") {
    auto it = params->find("short_factor");
    if (it == params->end() || !it->is_array() || it->empty()) {
      return FieldError(absl::StrCat(prefix, "short_factor"), "must be a non-empty array of numbers for longrope");
    }
    rope.longrope_short_factors = static_cast<int64_t>(it->size());
  }
  return rope;
}

// Length of inv_freq, following each rope_init_fn in transformers/modeling_rope_utils.py.
absl::StatusOr<int64_t> InvFreqLength(const RopeShape& rope, int64_t head_dim) {
  if (rope.type == "default") {
    // compute_default_rope_parameters ignores partial_rotary_factor: arange(0, head_dim, 2).
    return (head_dim + 1) / 2;
  }
  const double factor = rope.partial_rotary_factor.value_or(1.0);
  if (rope.type == "proportional") {
    // Rotated angles for the first fraction of the head, zeros for the rest, head_dim // 2 in all.
    const int64_t rope_angles = static_cast<int64_t>(std::floor(factor * static_cast<double>(head_dim) / 2.0));
    return std::max(rope_angles, head_dim / 2);
  }
  // int(head_dim * partial_rotary_factor), then arange(0, dim, 2).
  const int64_t dim = static_cast<int64_t>(static_cast<double>(head_dim) * factor);
  const int64_t length = (dim + 1) / 2;
  if (rope.type == "longrope") {
    // short_factor (one per frequency) broadcasts against the frequencies.
    const int64_t n = *rope.longrope_short_factors;
    if (n == length || length == 1) return n;
    if (n == 1) return length;
    return FieldError(absl::StrCat(rope.field, ".short_factor"),
                      absl::StrCat("has ", n, " entries, expected ", length, " (one per rotary frequency)"));
  }
  return length;
}

ModuleSpec RMSNorm(const ModuleSpec& parent, std::string_view local, const Family& family, int64_t hidden,
                   DType dtype) {
  ModuleSpec m = Module(parent, local, absl::StrCat(family.prefix, "RMSNorm"));
  m.parameters.push_back(Tensor("weight", {hidden}, dtype));
  return m;
}

// The layers' sliding windows (DecoderConfig::sliding_window), as `family` decides them.
absl::Status ReadSlidingWindows(const json& config, const Family& family, DecoderConfig& decoder) {
  decoder.sliding_window.assign(static_cast<size_t>(decoder.num_layers), 0);
  if (family.sliding_windows == SlidingWindows::kNone) return absl::OkStatus();
  const bool qwen2 = family.sliding_windows != SlidingWindows::kMistral;
  // Every field is type-checked before use: json::value() would throw type_error on a null or a string.
  int64_t window = 0;
  if (auto it = config.find("sliding_window"); it != config.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() <= 0) {
      return FieldError("sliding_window", absl::StrCat("must be a positive integer, got ", it->dump()));
    }
    window = it->get<int64_t>();
  } else if (qwen2 && it == config.end()) {
    window = 4096;  // Qwen2Config's default
  }
  bool use_window = !qwen2;
  if (auto it = config.find("use_sliding_window"); qwen2 && it != config.end() && !it->is_null()) {
    if (!it->is_boolean())
      return FieldError("use_sliding_window", absl::StrCat("must be true or false, got ", it->dump()));
    use_window = it->get<bool>();
  }
  if (!use_window || window == 0) return absl::OkStatus();
  if (family.sliding_windows != SlidingWindows::kQwen2) {
    for (int64_t& w : decoder.sliding_window) w = window;
    return absl::OkStatus();
  }
  if (auto types = config.find("layer_types"); types != config.end() && types->is_array()) {
    if (static_cast<int64_t>(types->size()) != decoder.num_layers) {
      return FieldError("layer_types", "must have one entry per hidden layer");
    }
    for (int64_t i = 0; i < decoder.num_layers; ++i) {
      const json& type = (*types)[static_cast<size_t>(i)];
      if (!type.is_string()) {
        return FieldError(absl::StrCat("layer_types[", i, "]"), absl::StrCat("must be a string, got ", type.dump()));
      }
      if (type == "sliding_attention") decoder.sliding_window[static_cast<size_t>(i)] = window;
    }
    return absl::OkStatus();
  }
  int64_t first = 28;  // Qwen2Config's default
  if (auto it = config.find("max_window_layers"); it != config.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() < 0) {
      return FieldError("max_window_layers", absl::StrCat("must be a non-negative integer, got ", it->dump()));
    }
    first = it->get<int64_t>();
  }
  for (int64_t i = first; i < decoder.num_layers; ++i) decoder.sliding_window[static_cast<size_t>(i)] = window;
  return absl::OkStatus();
}

// The forward pass's settings of a config the builder accepted, beyond what `decoder` holds already
// (architecture, layers, and the q/k norms and MoE routing Family::extend set): rms_norm_eps, the
// activation, RoPE and the sliding windows. `hidden_act` and `rope` are what the builder read.
absl::StatusOr<DecoderConfig> ReadForwardPass(const json& config, const Family& family, const std::string& hidden_act,
                                              const RopeShape& rope, int64_t max_positions, DecoderConfig decoder) {
  absl::StatusOr<double> eps = NumberOr(config, "", "rms_norm_eps", 1e-6);
  if (!eps.ok()) return eps.status();
  // A zero or negative epsilon divides by zero (or takes the root of a negative) on a zero row: the model
  // would stream garbage under status OK.
  if (!(*eps > 0) || !std::isfinite(*eps)) {
    return FieldError("rms_norm_eps", absl::StrCat("must be a positive finite number, got ", *eps));
  }
  decoder.rms_norm_eps = *eps;
  if (hidden_act != "silu") {
    return FieldError("hidden_act", absl::StrCat("\"", hidden_act, "\" is not supported by the runtime (silu)"));
  }
  // rope_theta may sit in the dict (transformers 5 writes it there) or at the top level (older exports).
  absl::StatusOr<double> theta = NumberOr(config, "", "rope_theta", 10000.0);
  if (!theta.ok()) return theta.status();
  absl::StatusOr<RopeConfig> rotary = LlamaStyleRope(rope.params != nullptr ? *rope.params : json::object(),
                                                     rope.params != nullptr ? rope.field + "." : "", rope.type, *theta,
                                                     max_positions > 0 ? static_cast<double>(max_positions) : 8192.0);
  if (!rotary.ok()) return rotary.status();
  // Llama-family attention rotates the whole head; a partial factor would make transformers' own forward
  // fail for scaled types and is ignored by the default type, so only 1 is meaningful here.
  if (rope.partial_rotary_factor.value_or(1.0) != 1.0 && rotary->type != RopeConfig::Type::kDefault) {
    return FieldError("partial_rotary_factor", "must be 1.0 for this RoPE type (the runtime rotates whole heads)");
  }
  decoder.rope = *rotary;
  if (absl::Status s = ReadSlidingWindows(config, family, decoder); !s.ok()) return s;
  return decoder;
}

// The model's sizes, read from config.json and checked as `family`'s config class and modeling code do.
struct LlamaSizes : DecoderSizes {
  bool has_head_dim_attribute = false;  // whether the config object has a head_dim attribute
};

// Reads and checks hidden, intermediate, layers, heads, vocab, kv heads and head_dim.
absl::StatusOr<LlamaSizes> ReadSizes(const json& config, const Family& family) {
  absl::StatusOr<DecoderSizes> common = ReadDecoderSizes(config);
  if (!common.ok()) return common.status();
  LlamaSizes sizes;
  static_cast<DecoderSizes&>(sizes) = *common;
  const int64_t hidden = sizes.hidden, heads = sizes.heads;
  absl::StatusOr<std::optional<int64_t>> kv_heads_field =
      OptionalPositiveInt(config, "num_key_value_heads", family.kv_heads_may_be_null, kMaxAttentionHeads);
  if (!kv_heads_field.ok()) return kv_heads_field.status();
  sizes.kv_heads = heads;
  if (kv_heads_field->has_value()) {
    sizes.kv_heads = **kv_heads_field;
  } else if (!config.contains("num_key_value_heads") && family.default_kv_heads) {
    sizes.kv_heads = *family.default_kv_heads;
  }

  absl::StatusOr<std::optional<int64_t>> head_dim_field =
      OptionalPositiveInt(config, "head_dim", family.declares_head_dim, kMaxHeadDim);
  if (!head_dim_field.ok()) return head_dim_field.status();
  sizes.head_dim = head_dim_field->value_or(family.default_head_dim.value_or(hidden / heads));
  // Whether the config object has a head_dim attribute, which is what RoPE validation looks at.
  sizes.has_head_dim_attribute = family.declares_head_dim || head_dim_field->has_value();

  if (family.requires_divisible_heads && hidden % heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: hidden_size (", hidden,
                                                   ") must be a multiple of num_attention_heads (", heads, ")"));
  }
  return sizes;
}

// The activation, the biases and the embedding tie, as config.json states them.
struct LlamaOptions {
  std::string act_class;
  std::string hidden_act = "silu";
  bool tie = false;
  bool attention_bias = false;
  bool mlp_bias = false;
};

// Reads and checks hidden_act, tie_word_embeddings and the bias flags `family` reads.
absl::StatusOr<LlamaOptions> ReadOptions(const json& config, const Family& family) {
  LlamaOptions options;
  if (auto it = config.find("hidden_act"); it != config.end()) {
    if (!it->is_string()) return FieldError("hidden_act", absl::StrCat("must be a string, got ", it->dump()));
    options.hidden_act = it->get<std::string>();
  }
  for (const auto& [name, cls] : kActivations) {
    if (name == options.hidden_act) options.act_class = std::string(cls);
  }
  // prelu carries a parameter; xielu's buffers depend on an optional CUDA kernel. Neither is used by
  // this family's checkpoints, so they are refused rather than guessed.
  if (options.act_class.empty()) {
    return FieldError("hidden_act",
                      absl::StrCat("\"", options.hidden_act, "\" is not a supported parameterless activation"));
  }

  absl::StatusOr<bool> tie = BoolOr(config, "tie_word_embeddings", false);
  if (!tie.ok()) return tie.status();
  options.tie = *tie;
  if (family.reads_attention_bias) {
    absl::StatusOr<bool> b = BoolOr(config, "attention_bias", false);
    if (!b.ok()) return b.status();
    options.attention_bias = *b;
  }
  if (family.reads_mlp_bias) {
    absl::StatusOr<bool> b = BoolOr(config, "mlp_bias", false);
    if (!b.ok()) return b.status();
    options.mlp_bias = *b;
  }
  return options;
}

// Parses the RoPE settings, checks head_dim against them and returns the inv_freq length.
absl::StatusOr<int64_t> ReadRope(const json& config, const LlamaSizes& sizes, RopeShape& rope) {
  absl::StatusOr<RopeShape> parsed = ParseRope(config);
  if (!parsed.ok()) return parsed.status();
  rope = *std::move(parsed);
  const int64_t head_dim = sizes.head_dim;
  // PreTrainedConfig.validate_rope: an odd head that is rotated in full is refused (heads of 4 or less pass,
  // for tiny test checkpoints).
  if (sizes.has_head_dim_attribute && head_dim > 4 && head_dim % 2 == 1 &&
      static_cast<int64_t>(static_cast<double>(head_dim) * rope.partial_rotary_factor.value_or(1.0)) == head_dim) {
    return FieldError("head_dim", absl::StrCat("(", head_dim, ") must be even: RoPE rotates pairs of dimensions"));
  }
  return InvFreqLength(rope, head_dim);
}

// One decoder layer: attention, MLP and the two norms.
ModuleSpec DecoderLayer(const ModuleSpec& layer_list, int64_t i, const Family& family, const LlamaSizes& sizes,
                        const LlamaOptions& options, DType dtype) {
  const std::string p(family.prefix);
  const int64_t hidden = sizes.hidden;
  const int64_t intermediate = sizes.intermediate;
  const int64_t heads = sizes.heads;
  const int64_t kv_heads = sizes.kv_heads;
  const int64_t head_dim = sizes.head_dim;
  const bool attention_bias = options.attention_bias;
  const bool mlp_bias = options.mlp_bias;
  const bool qkv_bias = family.qkv_bias || attention_bias;
  ModuleSpec layer = Module(layer_list, std::to_string(i), absl::StrCat(p, "DecoderLayer"));

  ModuleSpec attn = Module(layer, "self_attn", absl::StrCat(p, "Attention"));
  attn.children.push_back(LinearModule(attn, "q_proj", hidden, heads * head_dim, qkv_bias, dtype));
  attn.children.push_back(LinearModule(attn, "k_proj", hidden, kv_heads * head_dim, qkv_bias, dtype));
  attn.children.push_back(LinearModule(attn, "v_proj", hidden, kv_heads * head_dim, qkv_bias, dtype));
  attn.children.push_back(LinearModule(attn, "o_proj", heads * head_dim, hidden, attention_bias, dtype));
  layer.children.push_back(std::move(attn));

  ModuleSpec mlp = Module(layer, "mlp", absl::StrCat(p, "MLP"));
  mlp.children.push_back(LinearModule(mlp, "gate_proj", hidden, intermediate, mlp_bias, dtype));
  mlp.children.push_back(LinearModule(mlp, "up_proj", hidden, intermediate, mlp_bias, dtype));
  mlp.children.push_back(LinearModule(mlp, "down_proj", intermediate, hidden, mlp_bias, dtype));
  mlp.children.push_back(Module(mlp, "act_fn", options.act_class));
  layer.children.push_back(std::move(mlp));

  layer.children.push_back(RMSNorm(layer, "input_layernorm", family, hidden, dtype));
  layer.children.push_back(RMSNorm(layer, "post_attention_layernorm", family, hidden, dtype));
  return layer;
}

// The spec's summary fields and its module tree, from the checked sizes and options.
ModelSpec BuildSpec(const Family& family, const LlamaSizes& sizes, const LlamaOptions& options, DType dtype,
                    int64_t inv_freq_length) {
  const std::string p(family.prefix);
  ModelSpec spec = DecoderSpecFrame(std::string(family.architecture), dtype, p, options.tie, sizes);
  ModuleSpec& root = spec.root;

  ModuleSpec model = Module(root, "model", absl::StrCat(p, "Model"));
  ModuleSpec embed = Module(model, "embed_tokens", "Embedding");
  embed.parameters.push_back(Tensor("weight", {sizes.vocab, sizes.hidden}, dtype));
  model.children.push_back(std::move(embed));

  model.children.push_back(DecoderLayers(model, sizes.layers, [&](const ModuleSpec& list, int64_t i) {
    return DecoderLayer(list, i, family, sizes, options, dtype);
  }));
  model.children.push_back(RMSNorm(model, "norm", family, sizes.hidden, dtype));

  // The rotary tables are computed in float32 (arange(..., dtype=int64).float()) and registered as
  // non-persistent buffers, so from_config's dtype does not touch them and checkpoints do not hold them.
  ModuleSpec rotary = Module(model, "rotary_emb", absl::StrCat(p, "RotaryEmbedding"));
  rotary.buffers.push_back(Tensor("inv_freq", {inv_freq_length}, DType::kFloat32, /*persistent=*/false));
  rotary.buffers.push_back(Tensor("original_inv_freq", {inv_freq_length}, DType::kFloat32, /*persistent=*/false));
  model.children.push_back(std::move(rotary));

  root.children.push_back(std::move(model));
  // With tie_word_embeddings, lm_head.weight is the embedding's Parameter object: it still appears under
  // lm_head (as named_parameters(recurse=False) shows) and tied_weights records the sharing.
  root.children.push_back(LinearModule(root, "lm_head", sizes.hidden, sizes.vocab, /*bias=*/false, dtype));
  return spec;
}

}  // namespace

absl::StatusOr<ModelSpec> LlamaFamilySpecFromConfig(const nlohmann::json& config, const Architecture& arch, DType dtype,
                                                    int64_t max_positions) {
  const Family& family = FamilyOf(arch);

  absl::StatusOr<LlamaSizes> sizes = ReadSizes(config, family);
  if (!sizes.ok()) return sizes.status();
  absl::StatusOr<LlamaOptions> options = ReadOptions(config, family);
  if (!options.ok()) return options.status();
  RopeShape rope;
  absl::StatusOr<int64_t> inv_freq_length = ReadRope(config, *sizes, rope);
  if (!inv_freq_length.ok()) return inv_freq_length.status();

  ModelSpec spec = BuildSpec(family, *sizes, *options, dtype, *inv_freq_length);
  DecoderConfig decoder;
  decoder.architecture = spec.architecture;
  SetSizes(*sizes, decoder);
  decoder.qkv_bias = family.qkv_bias || options->attention_bias;
  decoder.o_bias = options->attention_bias;
  decoder.mlp_bias = options->mlp_bias;
  if (family.extend != nullptr) {
    if (absl::Status s = family.extend(config, spec, decoder); !s.ok()) return s;
  }
  if (absl::StatusOr<int64_t> total = SpecBytes(spec); !total.ok()) {
    return FieldError("num_hidden_layers", absl::StrCat("x the layer sizes: ", total.status().message()));
  }
  spec.decoder = ReadForwardPass(config, family, options->hidden_act, rope, max_positions, std::move(decoder));
  return spec;
}

}  // namespace strata::planner
