// ModelSpecFromConfig for GptOssForCausalLM (`gpt_oss`: gpt-oss-120b, -20b): GQA attention with q/k/v/o biases
// (`attention_bias`) and a learned sink logit per query head (`self_attn.sinks`), sliding (`sliding_window`) and full
// layers as `layer_types` says (alternating, sliding first, by default), YaRN RoPE (`truncate: false` by default) over
// halves of each head; a sparse block in every layer: a router with a bias whose top-k logits are softmaxed among
// themselves, experts with biases, interleaved gate/up columns and a clamped SwiGLU.
//
// The tree reproduces what transformers 5.23 builds for `AutoModelForCausalLM.from_config(config, dtype=...)`
// (models/gpt_oss/modeling_gpt_oss.py, configuration_gpt_oss.py): GptOssAttention's sinks, then q_proj, k_proj,
// v_proj, o_proj; GptOssMLP's router (weight, bias) and experts (gate_up_proj [E, H, 2I], gate_up_proj_bias,
// down_proj [E, I, H], down_proj_bias: x @ W, the transpose of nn.Linear's layout). Checkpoints store the experts as
// the tree has them (ExpertsStorage::fused_interleaved), dense or as MXFP4 blocks and scales (planner/quantization.h).

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

struct GptOssFields {
  int64_t experts = 128;
  int64_t top_k = 4;
  std::optional<int64_t> sliding_window = 128;
  bool attention_bias = true;
  bool tie = false;
  double swiglu_alpha = 1.702;
  double swiglu_limit = 7.0;
};

ModuleSpec RmsNorm(const ModuleSpec& parent, const char* local, int64_t dim, DType dtype) {
  return Norm(parent, local, "GptOssRMSNorm", dim, dtype);
}

ModuleSpec Attention(const ModuleSpec& layer, const DecoderSizes& sizes, const GptOssFields& f, DType dtype) {
  const int64_t hidden = sizes.hidden, d = sizes.head_dim;
  ModuleSpec attn = Module(layer, "self_attn", "GptOssAttention");
  attn.parameters.push_back(Tensor("sinks", {sizes.heads}, dtype));
  attn.children.push_back(LinearModule(attn, "q_proj", hidden, sizes.heads * d, f.attention_bias, dtype));
  attn.children.push_back(LinearModule(attn, "k_proj", hidden, sizes.kv_heads * d, f.attention_bias, dtype));
  attn.children.push_back(LinearModule(attn, "v_proj", hidden, sizes.kv_heads * d, f.attention_bias, dtype));
  attn.children.push_back(LinearModule(attn, "o_proj", sizes.heads * d, hidden, f.attention_bias, dtype));
  return attn;
}

ModuleSpec Mlp(const ModuleSpec& layer, const DecoderSizes& sizes, const GptOssFields& f, DType dtype) {
  const int64_t hidden = sizes.hidden, inter = sizes.intermediate, e = f.experts;
  ModuleSpec mlp = Module(layer, "mlp", "GptOssMLP");
  ModuleSpec router = Module(mlp, "router", "GptOssTopKRouter");
  router.parameters.push_back(Tensor("weight", {e, hidden}, dtype));
  router.parameters.push_back(Tensor("bias", {e}, dtype));
  mlp.children.push_back(std::move(router));
  ModuleSpec experts = Module(mlp, "experts", "GptOssExperts");
  experts.parameters.push_back(Tensor("gate_up_proj", {e, hidden, 2 * inter}, dtype));
  experts.parameters.push_back(Tensor("gate_up_proj_bias", {e, 2 * inter}, dtype));
  experts.parameters.push_back(Tensor("down_proj", {e, inter, hidden}, dtype));
  experts.parameters.push_back(Tensor("down_proj_bias", {e, hidden}, dtype));
  mlp.children.push_back(std::move(experts));
  return mlp;
}

absl::StatusOr<GptOssFields> ReadFields(const json& config, const DecoderSizes& sizes) {
  GptOssFields f;
  const char* experts_field = config.contains("num_local_experts") ? "num_local_experts" : "num_experts";
  absl::StatusOr<int64_t> experts = PositiveIntOr(config, experts_field, 128, false, internal::kMaxExperts);
  if (!experts.ok()) return experts.status();
  absl::StatusOr<int64_t> top_k = PositiveIntOr(config, "num_experts_per_tok", 4, false, internal::kMaxExperts);
  if (!top_k.ok()) return top_k.status();
  if (*top_k > *experts) {
    return FieldError("num_experts_per_tok",
                      absl::StrCat("(", *top_k, ") must not exceed ", experts_field, " (", *experts, ")"));
  }
  if (absl::Status s = internal::CheckExpertModules(*experts, sizes.layers, experts_field); !s.ok()) return s;
  f.experts = *experts;
  f.top_k = *top_k;
  if (auto it = config.find("sliding_window"); it != config.end()) {
    if (it->is_null()) {
      f.sliding_window.reset();
    } else {
      absl::StatusOr<int64_t> w = PositiveIntAtMost(*it, "sliding_window", kMaxPositions);
      if (!w.ok()) return w.status();
      f.sliding_window = *w;
    }
  }
  for (auto [field, out] : {std::pair{"attention_bias", &f.attention_bias}, std::pair{"tie_word_embeddings", &f.tie}}) {
    absl::StatusOr<bool> b = BoolOr(config, field, *out);
    if (!b.ok()) return b.status();
    *out = *b;
  }
  for (auto [field, out] : {std::pair{"swiglu_alpha", &f.swiglu_alpha}, std::pair{"swiglu_limit", &f.swiglu_limit}}) {
    absl::StatusOr<double> v = NumberOr(config, "", field, *out);
    if (!v.ok()) return v.status();
    if (!(*v > 0) || !std::isfinite(*v)) return FieldError(field, "must be a positive finite number");
    *out = *v;
  }
  return f;
}

// Per layer: the sliding window of `layer_types`' "sliding_attention" layers (GptOssConfig's default alternates,
// sliding first), 0 for full attention.
absl::StatusOr<std::vector<int64_t>> SlidingWindows(const json& config, int64_t layers, const GptOssFields& f) {
  std::vector<int64_t> windows(static_cast<size_t>(layers), 0);
  auto types = config.find("layer_types");
  const bool listed = types != config.end() && !types->is_null();
  if (listed && (!types->is_array() || static_cast<int64_t>(types->size()) != layers)) {
    return FieldError("layer_types", "must be a list with one entry per hidden layer");
  }
  for (int64_t i = 0; i < layers; ++i) {
    bool sliding = (i + 1) % 2 == 1;
    if (listed) {
      const json& type = (*types)[static_cast<size_t>(i)];
      if (!type.is_string() || (type != "sliding_attention" && type != "full_attention")) {
        return FieldError(absl::StrCat("layer_types[", i, "]"),
                          absl::StrCat("must be \"sliding_attention\" or \"full_attention\", got ", type.dump()));
      }
      sliding = type == "sliding_attention";
    }
    // GptOssAttention: sliding_window only where the layer slides (None: full attention everywhere).
    if (sliding && f.sliding_window) windows[static_cast<size_t>(i)] = *f.sliding_window;
  }
  return windows;
}

}  // namespace

absl::StatusOr<ModelSpec> GptOssSpecFromConfig(const json& config, const Architecture& arch, DType dtype,
                                               int64_t max_positions) {
  absl::StatusOr<DecoderSizes> sizes = ReadDecoderSizes(config);
  if (!sizes.ok()) return sizes.status();
  // GptOssConfig types num_key_value_heads and head_dim as int (its strict validation refuses null).
  absl::StatusOr<int64_t> head_dim = ReadGqaHeads(config, 8, 64, *sizes);
  if (!head_dim.ok()) return head_dim.status();
  if (*head_dim < 2 || *head_dim % 2 != 0) return FieldError("head_dim", "must be an even number of at least 2");
  absl::StatusOr<GptOssFields> f = ReadFields(config, *sizes);
  if (!f.ok()) return f.status();
  // GptOssExperts ignores hidden_act (its clamped SwiGLU is fixed); the config class still declares "silu", so it is
  // only checked to be a string.
  if (absl::StatusOr<std::string> act = HiddenAct(config, /*silu_only=*/false); !act.ok()) return act.status();
  if (absl::Status s = CheckPadTokenId(config, sizes->vocab, 0); !s.ok()) return s;
  absl::StatusOr<std::vector<int64_t>> windows = SlidingWindows(config, sizes->layers, *f);
  if (!windows.ok()) return windows.status();

  ModelSpec spec = DecoderSpecFrame(std::string(arch.name), dtype, "GptOss", f->tie, *sizes);
  const int64_t hidden = sizes->hidden;
  if (absl::Status s = BuildCausalLm(
          spec, *sizes, "GptOss", *head_dim / 2,
          [&](const ModuleSpec& list, int64_t i) {
            ModuleSpec layer = Module(list, std::to_string(i), "GptOssDecoderLayer");
            layer.children.push_back(Attention(layer, *sizes, *f, dtype));
            layer.children.push_back(Mlp(layer, *sizes, *f, dtype));
            layer.children.push_back(RmsNorm(layer, "input_layernorm", hidden, dtype));
            layer.children.push_back(RmsNorm(layer, "post_attention_layernorm", hidden, dtype));
            const std::string experts = layer.ChildName("mlp.experts");
            ExpertsStorage storage{experts, experts, "", "", "", f->experts, hidden, sizes->intermediate, dtype};
            storage.fused_interleaved = true;
            spec.per_expert_storage.push_back(std::move(storage));
            return layer;
          });
      !s.ok()) {
    return s;
  }

  DecoderConfig decoder;
  decoder.architecture = spec.architecture;
  SetSizes(*sizes, decoder);
  decoder.qkv_bias = f->attention_bias;
  decoder.o_bias = f->attention_bias;
  decoder.attention_sinks = true;
  decoder.sliding_window = *windows;
  MoeConfig& moe = decoder.moe;
  moe.router = MoeConfig::Router::kTopkSoftmax;
  moe.num_experts = f->experts;
  moe.top_k = f->top_k;
  moe.activation = MoeConfig::Activation::kClampedSwiglu;
  moe.swiglu_alpha = f->swiglu_alpha;
  moe.swiglu_limit = f->swiglu_limit;
  moe.sparse.assign(static_cast<size_t>(sizes->layers), true);
  // RoPE: GptOssConfig's default is YaRN (factor 32 over 4096 positions, truncate false, theta 150000).
  const json defaults = {{"rope_type", "yarn"}, {"factor", 32.0},    {"beta_fast", 32.0},
                         {"beta_slow", 1.0},    {"truncate", false}, {"original_max_position_embeddings", 4096}};
  if (absl::Status s =
          FinishDictRopeDecoder(config, 1e-5, 150000.0, max_positions, &defaults, std::move(decoder), spec);
      !s.ok()) {
    return s;
  }
  return spec;
}

}  // namespace strata::planner
