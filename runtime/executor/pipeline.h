#pragma once
// Internal (ATen): the model's units grouped into stages (consecutive units on one logical device), the
// transfers between them, and each stage's KV cache (GUIDE.md: Stages, Transfers, Offload, KV cache).
//
// CUDA stages each own a stream: a stage's work is issued on its stream; the producer records an event
// after writing its output, the consumer's stream waits on it and copies (non_blocking) onto its own
// device; the producer's buffer is marked as used by the consumer's stream (record_stream), so the
// caching allocator reuses it only after that copy completed. Nothing synchronises a device in the
// forward path. CPU stages run the same code with the stream and event operations skipped.

#include <ATen/core/Tensor.h>
#include <c10/core/Stream.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/safetensors.h"
#include "planner/decoder_config.h"
#include "planner/model_spec.h"
#include "planner/physical_devices.h"
#include "planner/plan.h"
#include "runtime/executor/serving_options.h"
#include "runtime/model/kv_cache.h"
#include "runtime/model/unit.h"
#include "runtime/model/weights.h"

namespace strata::runtime {

struct Stage {
  std::string label;  // the plan's device: "0", "1", "cpu", "disk"
  at::Device device = at::kCPU;
  // The group node that runs it (0: the leader; every stage of a one-process plan). Another node's stage is
  // a placeholder here: no weights, stream or KV cache; its micro-batches travel there (group.h).
  int node = 0;
  bool local = true;
  std::optional<c10::Stream> stream;       // compute stream (CUDA stages)
  std::optional<c10::Stream> copy_stream;  // offloaded weights' prefetch (CUDA stages with offload)
  // The offloaded units' weights on `device`: two persistent slots (weights.h), filled on copy_stream one unit ahead
  // on CUDA, in host order on the CPU ("disk" entries cast to the serving dtype); null without offloaded units.
  std::shared_ptr<OffloadBuffers> offload;
  std::vector<size_t> units;    // indices into Pipeline::units_
  std::set<int64_t> windows;    // sliding windows of its layers (0: full)
  at::Tensor inv_freq;          // RoPE inverse frequencies on `device`
  at::Tensor inv_freq_sliding;  // Gemma 3: the sliding layers' (else undefined)
  at::Tensor inv_freq_long;     // longrope (Phi-3): the long factors' (inv_freq has the short)
  planner::RopeConfig rope;     // longrope's threshold, longrope's and yarn's attention factor
  KvCache kv;
};

struct PipelineOptions {
  at::ScalarType dtype = at::kFloat;
  int64_t kv_blocks = 1;                // blocks in each stage's KV pool
  ServingOptions serving;               // its kv_block_tokens (positions per block) and fp8_scaled_mm are read here
  planner::PhysicalDeviceMap physical;  // plan GPU -> device; missing entries default to cuda:i
  // A group of nodes (issue 24): this process's node and each plan GPU's node ("cpu" and "disk" entries are the
  // leader's, node 0). Only this node's units are loaded; empty: one process runs every stage.
  int node = 0;
  std::vector<int> gpu_nodes;
};

// One group of a forward pass: `rows` sequences that each feed `count` tokens (right-padded rows, as
// strata-generate's prefill has, carry their real last token in `last`): each row's first position (its
// positions are start, start + 1, ...), KV block table and last real token. Positions, masks and RoPE
// tables are derived on each stage's device from these.
struct ForwardGroup {
  int64_t rows = 0;
  int64_t count = 0;
  at::Tensor starts;  // int64 [rows]
  at::Tensor blocks;  // int64 [rows, table_blocks]: each row's KV blocks, covering its positions < key_length
  at::Tensor last;    // int64 [rows]: within the row
  int64_t key_length = 0;
  // int64 [rows], optional: each row's sequence length (prompt + generated), by which longrope picks its
  // factors; undefined means each row's last fed position + 1.
  at::Tensor lengths;
  // What the host knows about `blocks` without reading a device (KvBlockTables::strided).
  bool blocks_strided = false;
  int64_t first_block = 0;
  int64_t block_stride = 0;
};

// One forward pass's input, staged on the host once (in pinned memory when a stage runs on CUDA, so
// every stage's copy is non_blocking on its own stream). Its tokens are packed: the groups' rows one
// after another (AttentionBatch), so decode rows and prefill chunks of any length share every projection.
struct ForwardBatch {
  at::Tensor ids;  // int64 [1, tokens]
  std::vector<ForwardGroup> groups;
  // int64, ascending: the tokens among `ids` whose logits the last stage computes: each row's last real
  // token, and every token of a row that scores its prompt (BatchRow::prompt_targets).
  at::Tensor last;
};

// What flows from one stage to the next: the activation and, when its producer runs on a CUDA stream,
// the event recorded after writing it.
struct StageActivation {
  at::Tensor hidden;  // ids before the first stage; logits after the last
  // With a multi-token-prediction layer: the final norm's output for every fed token [tokens, 1, hidden] (the LM head
  // reads the `last` ones), on the last stage, for Pipeline::RunMtp.
  at::Tensor normed;
  std::optional<c10::Event> produced;
  const Stage* producer = nullptr;  // the stage that wrote `hidden`
};

// A kept multi-token-prediction layer (planner::ModelSpec::mtp_kept; runtime/model/mtp.h), loaded on the last
// stage, beside the final norm and the LM head whose weight it shares.
struct MtpLayer {
  Unit layer;                  // its decoder layer (layer index DecoderConfig::mtp_layer), run by the family's runner
  std::vector<Weight> extras;  // embed_tokens, enorm, hnorm, eh_proj, shared_head.norm (MtpUnitModule::extras)
};

class Pipeline {
 public:
  // Loads every unit's weights onto the devices `plan` gives them and allocates the KV caches. The forward
  // pass's settings are the spec's (ModelSpec::decoder); its error when it has none.
  static absl::StatusOr<std::unique_ptr<Pipeline>> Build(const planner::ModelSpec& spec, const planner::Plan& plan,
                                                         const Checkpoint& checkpoint, const PipelineOptions& options);
  // One stage of a forward pass: reads `activation` (the previous stage's output, or the batch's ids when
  // `stage` is 0) and replaces it with this stage's output. Stages of different forward passes may run
  // at the same time on different threads (micro-batch pipelining): a stage touches only its own
  // units, KV cache and stream. Passes whose rows write the same KV blocks must not overlap.
  void RunStage(size_t stage, const ForwardBatch& batch, StageActivation& activation);
  // After the last stage: order the caller's current stream after the logits' producer.
  void AwaitOutput(StageActivation& activation);
  // The multi-token-prediction layer, null when the spec kept none.
  const MtpLayer* mtp() const { return mtp_ ? &*mtp_ : nullptr; }
  // On the last stage's worker, after sampling (its stream current): the MTP layer over every fed token of `batch`
  // (writing its KV pool), each with `normed` (StageActivation::normed) and the token after it, `next` (int64
  // [tokens] on the device: the next fed token, or the one chosen there); returns the proposals at the packed
  // positions `rows` (int64 [k], host), int64 [k] on the device.
  at::Tensor RunMtp(const ForwardBatch& batch, const at::Tensor& normed, const at::Tensor& next,
                    const at::Tensor& rows);

  // A host tensor to stage inputs in: pinned when a stage runs on CUDA (its copies are then asynchronous
  // and the caching host allocator keeps the block until they complete), pageable otherwise.
  at::Tensor HostBuffer(at::IntArrayRef sizes, at::ScalarType dtype) const;
  // Fills a group's host-side facts about its block tables.
  static void DescribeBlocks(ForwardGroup& group);
  int64_t kv_blocks() const { return options_.kv_blocks; }
  int64_t kv_block_tokens() const { return options_.serving.kv_block_tokens; }
  bool uses_cuda() const { return uses_cuda_; }
  // longrope: original_max_position_embeddings (see SchedulerOptions::recompute_at); else 0.
  int64_t recompute_threshold() const { return recompute_threshold_; }

  const DecoderConfig& config() const { return config_; }
  const std::vector<Stage>& stages() const { return stages_; }
  const WeightLoadStats& load_stats() const { return load_stats_; }
  int64_t kv_cache_bytes() const;
  int node() const { return options_.node; }
  std::string Describe() const;  // "stage 0 (plan device 0 on cpu): model.embed_tokens, layers 0-1"

 private:
  struct Devices;  // where the plan's devices execute (pipeline.cc)
  // Build's steps: every unit's weights loaded onto its planned device, in forward order (returns each
  // unit's plan-device label); one unit's weights; a sparse layer's experts; the stages over the units.
  absl::StatusOr<std::vector<std::string>> LoadUnits(const planner::ModelSpec& spec, const planner::Plan& plan,
                                                     const Devices& devices, WeightLoader& loader);
  absl::StatusOr<std::string> LoadUnitWeights(const planner::ModelSpec& spec, const planner::Plan& plan,
                                              const Devices& devices, WeightLoader& loader,
                                              const std::vector<std::string>& names, Unit& unit);
  absl::Status LoadExpertsOf(const planner::ModelSpec& spec, const planner::Plan& plan, const Devices& devices,
                             WeightLoader& loader, Unit& unit);
  void FormStages(const planner::DecoderConfig& config, const std::vector<std::string>& labels);
  // A decoder layer's KV pool on its stage (and its window among the stage's masks).
  void AddKvLayer(Stage& stage, const Unit& unit);
  int NodeOf(const planner::Device& device) const;  // the group node of a plan device
  // Build's step for a kept MTP layer, after LoadUnits: its weights on the LM head's device (an error naming the
  // module when the plan put it, the final norm or the LM head elsewhere).
  absl::Status LoadMtp(const planner::ModelSpec& spec, const planner::Plan& plan, const Devices& devices,
                       WeightLoader& loader, const std::vector<std::string>& labels);

  DecoderConfig config_;
  PipelineOptions options_;
  std::vector<Unit> units_;
  std::vector<Stage> stages_;
  std::optional<MtpLayer> mtp_;
  WeightLoadStats load_stats_;
  bool uses_cuda_ = false;
  int64_t recompute_threshold_ = 0;
};

}  // namespace strata::runtime
