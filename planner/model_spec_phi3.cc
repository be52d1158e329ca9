// ModelSpecFromConfig for Phi-3 (Phi3ForCausalLM, model_type phi3): the tree
// `AutoModelForCausalLM.from_config(config, dtype=D)` builds with transformers 5.23 (models/phi3).
//
// What differs from Llama: attention has one fused `qkv_proj` (registered after `o_proj`) and the MLP one
// fused `gate_up_proj`, its activation module is `activation_fn`; each layer ends with two parameterless
// Dropout children; RoPE is default or longrope ("su" and "yarn" are renamed to longrope by Phi3Config),
// with partial_rotary_factor honoured by both.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
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

// Phi3Config.convert_rope_params_to_dict + validate_rope: the length of the rotary inv_freq buffer.
absl::StatusOr<int64_t> Phi3InvFreqLength(const json& config, int64_t hidden, int64_t heads, int64_t head_dim) {
  absl::StatusOr<double> partial = PartialRotaryFactor(config, "", 1.0);
  if (!partial.ok()) return partial.status();
  const json* params = nullptr;
  std::string field;
  // A truthy legacy rope_scaling replaces rope_parameters.
  for (const char* name : {"rope_scaling", "rope_parameters"}) {
    auto it = config.find(name);
    if (it == config.end() || it->is_null()) continue;
    if (!it->is_object()) return FieldError(name, absl::StrCat("must be an object, got ", it->dump()));
    if (it->empty()) continue;
    params = &*it;
    field = name;
    break;
  }
  std::string type = "default";
  if (params != nullptr) {
    partial = PartialRotaryFactor(*params, field + ".", *partial);
    if (!partial.ok()) return partial.status();
    for (const char* key : {"rope_type", "type"}) {
      auto it = params->find(key);
      if (it == params->end()) continue;
      if (!it->is_string())
        return FieldError(absl::StrCat(field, ".", key), absl::StrCat("must be a string, got ", it->dump()));
      type = it->get<std::string>();
      break;
    }
  }
  const int64_t dim = static_cast<int64_t>(static_cast<double>(head_dim) * *partial);
  if (dim < 2) return FieldError("partial_rotary_factor", "leaves fewer than two rotary dimensions");
  const int64_t length = (dim + 1) / 2;
  if (type == "default") return length;
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
    for (const json& x : *it) {
      if (!x.is_number() || !(x.get<double>() > 0)) {
        return FieldError(absl::StrCat(field, ".", key), absl::StrCat("must hold positive numbers, got ", x.dump()));
      }
    }
    if (static_cast<int64_t>(it->size()) != expected || expected != length) {
      return FieldError(absl::StrCat(field, ".", key), absl::StrCat("has ", it->size(), " entries, expected ", expected,
                                                                    " (one per rotary frequency)"));
    }
  }
  return length;
}

}  // namespace

bool IsPhi3Config(const json& config) {
  if (!config.is_object()) return false;
  auto mt = config.find("model_type");
  if (mt != config.end() && mt->is_string() && mt->get<std::string>() == "phi3") return true;
  auto arch = config.find("architectures");
  return arch != config.end() && arch->is_array() && !arch->empty() && (*arch)[0].is_string() &&
         (*arch)[0].get<std::string>() == "Phi3ForCausalLM";
}

absl::StatusOr<ModelSpec> Phi3SpecFromConfig(const json& config, DType dtype) {
  if (absl::Status s = CheckArchitecture(config, "Phi3ForCausalLM", "phi3"); !s.ok()) return s;
  absl::StatusOr<int64_t> hidden = RequiredPositiveInt(config, "hidden_size", kMaxHiddenSize);
  if (!hidden.ok()) return hidden.status();
  absl::StatusOr<int64_t> intermediate = RequiredPositiveInt(config, "intermediate_size", kMaxHiddenSize);
  if (!intermediate.ok()) return intermediate.status();
  absl::StatusOr<int64_t> layers = RequiredPositiveInt(config, "num_hidden_layers", kMaxHiddenLayers);
  if (!layers.ok()) return layers.status();
  absl::StatusOr<int64_t> heads = RequiredPositiveInt(config, "num_attention_heads", kMaxAttentionHeads);
  if (!heads.ok()) return heads.status();
  absl::StatusOr<int64_t> vocab = RequiredPositiveInt(config, "vocab_size", kMaxVocabSize);
  if (!vocab.ok()) return vocab.status();
  // Phi3Config: num_key_value_heads None (absent or null) means num_attention_heads.
  absl::StatusOr<int64_t> kv_heads = PositiveIntOr(config, "num_key_value_heads", *heads, true, kMaxAttentionHeads);
  if (!kv_heads.ok()) return kv_heads.status();
  if (*heads % *kv_heads != 0) {
    return FieldError("num_key_value_heads",
                      absl::StrCat("(", *kv_heads, ") must divide num_attention_heads (", *heads, ")"));
  }
  const int64_t head_dim = *hidden / *heads;
  if (head_dim == 0) {
    return FieldError("num_attention_heads", absl::StrCat("(", *heads, ") exceeds hidden_size (", *hidden, ")"));
  }
  if (auto it = config.find("head_dim"); it != config.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() != head_dim) {
      return FieldError("head_dim", absl::StrCat("must be hidden_size / num_attention_heads (", head_dim,
                                                 ") for Phi-3, got ", it->dump()));
    }
  }
  if (absl::Status s = CheckPadTokenId(config, *vocab, 32000); !s.ok()) return s;
  std::string activation = "silu";
  if (auto it = config.find("hidden_act"); it != config.end() && !it->is_null()) {
    if (!it->is_string()) return FieldError("hidden_act", absl::StrCat("must be a string, got ", it->dump()));
    activation = it->get<std::string>();
  }
  std::optional<std::string> act_class = ActivationClass(activation);
  if (!act_class) return FieldError("hidden_act", absl::StrCat("\"", activation, "\" is not supported"));
  absl::StatusOr<bool> tie = BoolOr(config, "tie_word_embeddings", false);
  if (!tie.ok()) return tie.status();
  absl::StatusOr<int64_t> inv_freq_length = Phi3InvFreqLength(config, *hidden, *heads, head_dim);
  if (!inv_freq_length.ok()) return inv_freq_length.status();

  ModelSpec spec;
  spec.architecture = "Phi3ForCausalLM";
  spec.dtype = dtype;
  spec.no_split_classes = {"Phi3DecoderLayer"};
  if (*tie) spec.tied_weights["lm_head.weight"] = "model.embed_tokens.weight";
  spec.num_hidden_layers = *layers;
  spec.num_key_value_heads = *kv_heads;
  spec.head_dim = head_dim;

  ModuleSpec& root = spec.root;
  root.class_name = spec.architecture;
  ModuleSpec model = Module(root, "model", "Phi3Model");
  ModuleSpec embed = Module(model, "embed_tokens", "Embedding");
  embed.parameters.push_back(Tensor("weight", {*vocab, *hidden}, dtype));
  model.children.push_back(std::move(embed));
  ModuleSpec layer_list = Module(model, "layers", "ModuleList");
  const int64_t qkv_rows = (*heads + 2 * *kv_heads) * head_dim;
  for (int64_t i = 0; i < *layers; ++i) {
    ModuleSpec layer = Module(layer_list, std::to_string(i), "Phi3DecoderLayer");
    ModuleSpec attn = Module(layer, "self_attn", "Phi3Attention");
    attn.children.push_back(Linear(attn, "o_proj", *heads * head_dim, *hidden, false, dtype));
    attn.children.push_back(Linear(attn, "qkv_proj", *hidden, qkv_rows, false, dtype));
    layer.children.push_back(std::move(attn));
    ModuleSpec mlp = Module(layer, "mlp", "Phi3MLP");
    mlp.children.push_back(Linear(mlp, "gate_up_proj", *hidden, 2 * *intermediate, false, dtype));
    mlp.children.push_back(Linear(mlp, "down_proj", *intermediate, *hidden, false, dtype));
    mlp.children.push_back(Module(mlp, "activation_fn", *act_class));
    layer.children.push_back(std::move(mlp));
    layer.children.push_back(Norm(layer, "input_layernorm", "Phi3RMSNorm", *hidden, dtype));
    layer.children.push_back(Norm(layer, "post_attention_layernorm", "Phi3RMSNorm", *hidden, dtype));
    layer.children.push_back(Module(layer, "resid_attn_dropout", "Dropout"));
    layer.children.push_back(Module(layer, "resid_mlp_dropout", "Dropout"));
    layer_list.children.push_back(std::move(layer));
  }
  model.children.push_back(std::move(layer_list));
  model.children.push_back(Norm(model, "norm", "Phi3RMSNorm", *hidden, dtype));
  ModuleSpec rotary = Module(model, "rotary_emb", "Phi3RotaryEmbedding");
  rotary.buffers.push_back(Tensor("inv_freq", {*inv_freq_length}, DType::kFloat32, false));
  rotary.buffers.push_back(Tensor("original_inv_freq", {*inv_freq_length}, DType::kFloat32, false));
  model.children.push_back(std::move(rotary));
  root.children.push_back(std::move(model));
  root.children.push_back(Linear(root, "lm_head", *hidden, *vocab, /*bias=*/false, dtype));
  if (absl::StatusOr<int64_t> total = SpecBytes(spec); !total.ok()) {
    return FieldError("num_hidden_layers", absl::StrCat("x the layer sizes: ", total.status().message()));
  }
  return spec;
}

}  // namespace strata::planner
