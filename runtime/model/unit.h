#pragma once
// Internal (ATen): a model as a list of execution units in forward order — embedding, decoder layers, final
// norm, LM head — each with its weights already on their planned devices, and the one table of unit runners:
// planner::ModelFamily (model_registry.cc names each architecture's) -> the family's file that names a
// unit's weights and runs it. Adding a family: runtime/model/README.md.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/decoder_config.h"
#include "planner/model_spec.h"
#include "runtime/model/attention.h"
#include "runtime/model/weights.h"

namespace strata::runtime {

using ModelFamily = planner::ModelFamily;

// The model's one hyper-parameter struct, as its family's spec builder filled it (ModelSpec::decoder).
using DecoderConfig = planner::DecoderConfig;

enum class UnitKind { kEmbedding, kDecoderLayer, kFinalNorm, kLmHead };

struct Unit {
  UnitKind kind = UnitKind::kEmbedding;
  std::string module;  // HF module name: "model.embed_tokens", "model.layers.3", "model.norm", "lm_head"
  int64_t layer = -1;  // decoder layer index
  int64_t window = 0;  // sliding window of a decoder layer (0: full)
  std::vector<Weight> weights;
  at::Device device = at::kCPU;  // where it executes
  int node = 0;                  // the group node that runs it (PipelineOptions::gpu_nodes); another's: not loaded
  // A sparse MoE layer's experts (moe.h's LoadExperts: fused {gate_up [E, 2I, H], down [E, H, I]}, or packed
  // {gate, up, down} per expert), resident on the device they
  // execute on, which may differ from `device` (moe.h).
  std::vector<Weight> experts;
  std::string experts_label;  // the plan device of the experts ("cpu", "1")

  bool offloaded() const;  // some weight is fetched on use
  std::vector<const Weight*> weight_ptrs() const;
};

// A family's unit code. `weights` lists the parameters `run` reads, in the order it indexes them, by their
// names relative to the unit's module ("weight"; "self_attn.q_proj.weight"). `run` gets them on the unit's
// device (Weight::Use, or a stage's OffloadBuffers slot). Embedding: `hidden` is the packed ids [1, tokens] int64.
// Final norm first keeps the tokens whose logits are needed (`last`, int64 places among the packed tokens, ascending;
// LastTokens): each row's last token, and every token of a row that scores its prompt. LM head returns
// float32 logits [those tokens, vocab].
struct UnitRunner {
  std::vector<std::string> (*weights)(UnitKind kind, int64_t layer, const DecoderConfig& dims);
  at::Tensor (*run)(const Unit& unit, const std::vector<WeightTensor>& weights, const DecoderConfig& dims,
                    const at::Tensor& hidden, AttentionBatch& batch, KvLayer* cache, const at::Tensor& last);
};

// The runner of `family` (unit.cc's table).
const UnitRunner& RunnerFor(ModelFamily family);

// Whether every runner reads the unit's weight `local` (relative to the unit's module) only as a whole linear
// layer's, through Linear or WeightRows (linear.h): the LM head's, and a decoder layer's projections ("*_proj.weight":
// attention's and the dense MLP's, Phi-3's fused ones). Those on the CPU are packed at load (WeightLoader::Load).
bool ReadByLinear(UnitKind kind, const std::string& local);

// Where a unit's module sits in the spec's module tree.
struct UnitModule {
  UnitKind kind;
  int64_t layer;                      // decoder layer index, else -1
  const planner::ModuleSpec* module;  // in the spec's tree
};

// The units of a config.json-built spec in forward order, found in its module tree: model.embed_tokens, the
// children of model.layers, model.norm, lm_head. An error names the module the tree lacks.
absl::StatusOr<std::vector<UnitModule>> UnitModules(const planner::ModelSpec& spec);

// A kept multi-token-prediction layer (planner::ModelSpec::mtp_kept): its decoder layer as a module of its own (the
// layer's module without what the MTP adds, which UnitTensorNames then checks as any layer's), and the full names of
// what it adds, in the order MtpWeights takes them: embed_tokens, enorm, hnorm, eh_proj, shared_head.norm (its head is
// lm_head's, tied). An error when the spec keeps none.
struct MtpUnitModule {
  planner::ModuleSpec layer;
  std::vector<std::string> extras;
  int64_t index = -1;  // its layer index (DecoderConfig::mtp_layer)
};
absl::StatusOr<MtpUnitModule> FindMtpUnitModule(const planner::ModelSpec& spec);

// The full names of the parameters the family's runner reads for `unit`, in its order: each is a parameter
// of the unit's subtree, and each parameter of the subtree is read by the runner or is a sparse block's
// fused experts (loaded apart, moe.h). An error names the tensor on either side of a mismatch.
// A quantized layer's weight (`quantized`: ModelSpec::quantization's linears) is read as its dense name: the
// runner reads "q_proj.weight", the tree holds what the checkpoint stores for it ("q_proj.weight" and
// "q_proj.weight_scale_inv"; "q_proj.qweight", ...), all of which that one name covers.
absl::StatusOr<std::vector<std::string>> UnitTensorNames(const UnitModule& unit, const DecoderConfig& dims,
                                                         const planner::SpecQuantization* quantized = nullptr);

// Runs one unit with its family's runner.
at::Tensor RunUnit(const Unit& unit, const std::vector<WeightTensor>& weights, const DecoderConfig& dims,
                   const at::Tensor& hidden, AttentionBatch& batch, KvLayer* cache, const at::Tensor& last);

}  // namespace strata::runtime
