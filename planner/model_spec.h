#pragma once
// The module tree of a model without its weights: what transformers builds on the meta device, with
// the same module names, class names, parameters, buffers, tied weights and no-split classes.

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/dtype.h"
#include "nlohmann/json_fwd.hpp"
#include "planner/decoder_config.h"
#include "planner/quantization.h"

namespace strata::planner {

// Element types live with the checkpoint reader (checkpoint/dtype.h); the planner speaks them too.
using checkpoint::DType;
using checkpoint::DTypeName;
using checkpoint::DTypeSize;
using checkpoint::ParseDType;

// Caps on config.json's sizes, checked before anything is sized by them: a hostile or mistyped config is
// an error naming the field, not an out-of-memory kill. Each is far above any released model (the
// largest have ~130 layers, hidden sizes of ~16k, 128 heads, head_dim 256 and 256k-token vocabularies).
inline constexpr int64_t kMaxHiddenLayers = 4096;                // num_hidden_layers
inline constexpr int64_t kMaxHiddenSize = int64_t{1} << 20;      // hidden_size, intermediate_size
inline constexpr int64_t kMaxAttentionHeads = int64_t{1} << 16;  // num_attention_heads, num_key_value_heads
inline constexpr int64_t kMaxHeadDim = int64_t{1} << 16;         // head_dim
inline constexpr int64_t kMaxVocabSize = int64_t{1} << 24;       // vocab_size
inline constexpr int64_t kMaxPositions = int64_t{1} << 40;       // max_position_embeddings

// a * b, or an error "`what`: ... does not fit in 64 bits" when the product overflows or either is
// negative. The one checked multiplication for byte counts (tensor sizes, KV cache, batch x context).
absl::StatusOr<int64_t> CheckedMul(int64_t a, int64_t b, absl::string_view what);

// A parameter or buffer. `name` is local to its module ("weight", "inv_freq").
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  DType dtype = DType::kFloat32;
  bool persistent = true;  // false for non-persistent buffers (not in the checkpoint, still in memory)

  // Unchecked: valid for tensors of a spec that ModelSpecFromConfig / ModelSpecFromModuleTree returned
  // (SpecBytes checked their sum then). CheckedBytes for anything else.
  int64_t numel() const;
  int64_t bytes() const { return numel() * DTypeSize(dtype); }
  // numel x dtype size, or an error naming the tensor when the product does not fit in int64.
  absl::StatusOr<int64_t> CheckedBytes() const;
};

// A module. `name` is the full dotted HF name ("model.layers.0.self_attn"); the root's name is "".
// Children are in registration order, as nn.Module.named_children yields them.
struct ModuleSpec {
  std::string name;
  std::string class_name;
  std::vector<TensorSpec> parameters;
  std::vector<TensorSpec> buffers;
  std::vector<ModuleSpec> children;

  // Full name of a direct tensor or child: "model" + "embed_tokens" -> "model.embed_tokens".
  std::string ChildName(std::string_view local) const;
};

// A sparse MoE block's experts module (transformers 5: `experts.gate_up_proj` [E, 2I, H] and
// `experts.down_proj` [E, H, I]) as save_pretrained writes it: for each expert e,
// `stored_prefix.e.gate` and `.up` ([I, H], the two halves of gate_up_proj[e]) and `.down` ([H, I]).
struct ExpertsStorage {
  std::string module;          // "model.layers.3.mlp.experts"
  std::string stored_prefix;   // "model.layers.3.mlp.experts" (Qwen3-MoE), "model.layers.3.block_sparse_moe.experts"
  std::string gate, up, down;  // "gate_proj.weight", "up_proj.weight", "down_proj.weight" (Mixtral: w1, w3, w2)
  int64_t num_experts = 0;
  int64_t hidden = 0;
  int64_t intermediate = 0;
  DType dtype = DType::kFloat32;
  // gpt-oss: not one tensor per expert but the module's own fused parameters as the tree has them, gate_up_proj
  // [E, H, 2I] (x @ W; gate and up columns interleaved: gate 2j, up 2j + 1), gate_up_proj_bias [E, 2I], down_proj
  // [E, I, H], down_proj_bias [E, H] (or their MXFP4 blocks and scales); gate, up and down are unused.
  bool fused_interleaved = false;
};

// A checkpoint's multi-token-prediction layer (DeepSeek-V3's `model.layers.<num_hidden_layers>`, its next-next-token
// head), built by the family beside the tree and kept in it only when asked (SpecOptions::mtp: --speculative mtp).
// Its module holds a decoder layer's children plus what the MTP adds: enorm, hnorm (the RMSNorms of the next token's
// embedding and of the model's hidden state), eh_proj (their concatenation back to the hidden size), shared_head.norm,
// shared_head.head (the model's lm_head, which DeepSeek shares: kept tied to it) and its own embed_tokens.
struct MtpLayerSpec {
  ModuleSpec module;
  std::vector<ExpertsStorage> experts;  // a sparse layer's per-expert storage
  bool sparse = false;                  // its MLP is the family's MoE block
};

// How a checkpoint's spec is built beyond what config.json says.
struct SpecOptions {
  // Keep the multi-token-prediction layer (ModelSpec::mtp) in the tree: planned with lm_head (tied to it), loaded
  // and run as a proposer (--speculative mtp). An error naming num_nextn_predict_layers when the model has none.
  bool mtp = false;
};

struct ModelSpec {
  std::string architecture;       // "LlamaForCausalLM", or the module tree's root class
  DType dtype = DType::kFloat32;  // the dtype the parameters were sized in
  ModuleSpec root;
  std::vector<std::string> no_split_classes;  // e.g. {"LlamaDecoderLayer"}
  // transformers' all_tied_weights_keys: tied parameter -> the parameter it shares storage with
  // ("lm_head.weight" -> "model.embed_tokens.weight"). Keys are not counted in sizes.
  std::map<std::string, std::string> tied_weights;
  // The model's config, kept for later stages (KV cache sizing needs heads and head_dim).
  int64_t num_hidden_layers = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  // MLA (DeepSeek-V3): each token keeps one latent row of head_dim (kv_lora_rank + qk_rope_head_dim) per layer,
  // keys and values alike (num_key_value_heads is 1), rather than a key and a value per KV head.
  bool kv_latent = false;
  // Elements of the KV cache per token per decoder layer: 2 x num_key_value_heads x head_dim, or the latent row.
  int64_t KvElementsPerToken() const { return (kv_latent ? 1 : 2) * num_key_value_heads * head_dim; }
  // config.json's max_position_embeddings: the positions the model was trained for (0 when the config does
  // not say, or for module trees). The server warns when --max-context goes past it.
  int64_t max_position_embeddings = 0;
  // What the forward pass needs beyond the tree (decoder_config.h), read from config.json with it; the
  // runtime reads only this. An error when config.json asks for something the runtime does not implement
  // (another RoPE type or activation: the planner places such a model all the same, the runtime refuses
  // to load it with this error) and for module trees, which carry no config.
  absl::StatusOr<DecoderConfig> decoder{
      absl::InvalidArgumentError("the spec has no config.json (a module tree cannot be loaded)")};
  // The ids that end a sequence: generation_config.json's eos_token_id when LoadModelSpec found one there
  // (planner/generation_config.h), else config.json's. nullopt when neither sets it (and for module
  // trees); an error, reported only where the ids are used (EosTokenIds), when a file cannot be read or an
  // id is not an id, a list of ids or null.
  std::optional<absl::StatusOr<std::vector<int32_t>>> eos_token_ids;
  // Checkpoint layout where it differs from the module tree (MoE families, model_spec_moe.h): tensors
  // stored under another name, and fused expert parameters stored one tensor per expert.
  std::map<std::string, std::string> stored_names;  // spec tensor -> checkpoint tensor
  std::vector<ExpertsStorage> per_expert_storage;
  // Checkpoint tensors under these prefixes are not the model's (DeepSeek-V3's multi-token-prediction layer,
  // "model.layers.61."): transformers skips them on load, so they are neither planned nor loaded. LoadModelSpec lists
  // those the checkpoint holds in `ignored_tensors` (the later speculative decoder reads them from there).
  // Tensors loaded in float32 whatever the serving dtype, by their last name component (transformers'
  // _keep_in_fp32_modules_strict: DeepSeek-V3's "e_score_correction_bias"); planned in the spec's dtype, as
  // from_config sizes them.
  std::vector<std::string> keep_float32;
  std::vector<std::string> ignored_prefixes;
  std::vector<std::string> ignored_tensors;
  // A quantized checkpoint's format and its quantized linear layers (planner/quantization.h); nullopt for a
  // dense one. The module tree holds the parameters the chosen sizing counts; `linears` what the files hold.
  std::optional<SpecQuantization> quantization;
  // The multi-token-prediction layer the config declares (num_nextn_predict_layers), outside the tree; after
  // SpecOptions::mtp kept it, `mtp_kept` is set and the layer is the last child of model.layers.
  std::optional<MtpLayerSpec> mtp;
  bool mtp_kept = false;
};

// The modules of a no-split class (a model's decoder layers), in definition order, not looking inside them.
std::vector<const ModuleSpec*> NoSplitModules(const ModelSpec& spec);

// Every parameter and buffer's bytes summed with checked arithmetic: an error when a tensor's size or
// the total does not fit in int64. Specs are checked with it once, so later sums of their parts cannot
// overflow.
absl::StatusOr<int64_t> SpecBytes(const ModelSpec& spec);

// Builds the tree transformers builds for one of the architectures of model_registry.h's table from a
// parsed config.json, with parameters in `dtype`, and reads the forward pass's settings (`decoder`) and
// eos_token_id with it. Errors name the config field: "config.json: FIELD: what". model_registry.cc.
absl::StatusOr<ModelSpec> ModelSpecFromConfig(const nlohmann::json& config, DType dtype,
                                              const SpecOptions& options = {});

// Reads a module tree JSON (format "strata.module_tree.v1", written by tools/export_module_tree.py;
// documented in planner/README.md). Parameter dtypes are those in the file unless `dtype` is given,
// in which case floating-point parameters are re-sized to it (buffers keep theirs, as upstream).
absl::StatusOr<ModelSpec> ModelSpecFromModuleTree(const nlohmann::json& tree, std::optional<DType> dtype);

// The serving dtype a checkpoint declares: config.json's "dtype" (transformers 5) or "torch_dtype";
// float32 when neither is set.
absl::StatusOr<DType> ConfigDType(const nlohmann::json& config);

// Reads DIR/config.json and builds the spec in `dtype` (default: ConfigDType). When the directory
// holds *.safetensors files (one file, or shards listed by model.safetensors.index.json), reads their
// JSON headers only and checks every tensor's name, dtype and shape against the spec: missing,
// unexpected and mis-shaped tensors are errors naming them.
absl::StatusOr<ModelSpec> LoadModelSpec(const std::filesystem::path& checkpoint_dir, std::optional<DType> dtype,
                                        const SpecOptions& options = {});

// Reads a module tree file (see ModelSpecFromModuleTree).
absl::StatusOr<ModelSpec> LoadModuleTree(const std::filesystem::path& file, std::optional<DType> dtype);

// eos_token_id as transformers reads it from config.json and generation_config.json: an id or a list of
// ids, each a non-negative 32-bit integer, or null (none). Errors name `file` and the field.
absl::StatusOr<std::vector<int32_t>> EosTokenIdsFromJson(const nlohmann::json& value, absl::string_view file);

// Writes a spec as a module tree JSON (the format ModelSpecFromModuleTree reads): what
// `strata-plan --print-module-tree` prints, and what tools/export_module_tree.py writes.
nlohmann::json ModuleTreeToJson(const ModelSpec& spec);

// The checkpoint tensors a spec expects: full name -> (shape, dtype). Tied keys and non-persistent
// buffers are not in a checkpoint.
struct ExpectedTensor {
  std::vector<int64_t> shape;
  DType dtype;
  // The safetensors dtypes the header may give it ("F8_E4M3", "I32"); empty: any (a dense checkpoint may be
  // stored in another float dtype than the one it is served in). Set for a quantized layer's tensors.
  std::vector<std::string> stored_dtypes = {};
};
std::map<std::string, ExpectedTensor> CheckpointTensors(const ModelSpec& spec);

}  // namespace strata::planner
