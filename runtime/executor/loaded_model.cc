#include "runtime/executor/loaded_model.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/safetensors.h"
#include "planner/physical_devices.h"
#include "runtime/executor/pipeline.h"
#include "runtime/executor/sampler.h"
#include "runtime/executor/torch_info.h"

namespace strata::runtime {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Greedy's KV layout: the sequence of batch row r owns blocks [r * per_row, (r + 1) * per_row), enough
// for max_context positions. `rows[i]` is the batch row that line i of the forward pass feeds.
at::Tensor GreedyBlocks(const Pipeline& pipeline, const std::vector<int64_t>& rows, int64_t per_row) {
  const int64_t n = static_cast<int64_t>(rows.size());
  at::Tensor blocks = pipeline.HostBuffer({n, per_row}, at::kLong);
  int64_t* table = blocks.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < per_row; ++j) table[i * per_row + j] = rows[i] * per_row + j;
  }
  return blocks;
}

// One greedy decode step in which some rows' sequences grow past longrope's original_max_position_embeddings
// with a cache computed under the short factors: as transformers' generate() (Phi3ForCausalLM drops its
// cache there), those rows are recomputed from position 0 over their whole sequence (`sequences[r]`, which
// ends with the token being fed) in one forward; the other rows decode as usual in another.
GreedyStep RecomputeStep(Pipeline& pipeline, const std::vector<std::vector<int64_t>>& sequences,
                         const std::vector<int64_t>& positions, const std::vector<bool>& recompute, int64_t top_k,
                         int64_t per_row) {
  const int64_t rows = static_cast<int64_t>(sequences.size());
  GreedyStep merged;
  merged.ids.resize(rows);
  merged.logprobs.resize(rows);
  merged.top.resize(rows);
  for (bool group : {true, false}) {
    std::vector<int64_t> members;
    for (int64_t r = 0; r < rows; ++r) {
      if (recompute[r] == group) members.push_back(r);
    }
    if (members.empty()) continue;
    const int64_t n = static_cast<int64_t>(members.size());
    const int64_t tokens = group ? positions[members[0]] + 1 : 1;
    at::Tensor ids = pipeline.HostBuffer({n, tokens}, at::kLong);
    ForwardGroup g;
    g.starts = pipeline.HostBuffer({n}, at::kLong);
    g.blocks = GreedyBlocks(pipeline, members, per_row);
    g.last = pipeline.HostBuffer({n}, at::kLong);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = members[i];
      const std::vector<int64_t>& sequence = sequences[r];
      std::copy(sequence.end() - tokens, sequence.end(), ids.data_ptr<int64_t>() + i * tokens);
      g.starts.data_ptr<int64_t>()[i] = group ? 0 : positions[r];
      g.last.data_ptr<int64_t>()[i] = tokens - 1;
      g.key_length = std::max(g.key_length, positions[r] + 1);
    }
    GreedyStep step = SampleGreedy(pipeline.Forward(pipeline.OneGroup(ids, std::move(g))), top_k);
    for (int64_t i = 0; i < n; ++i) {
      merged.ids[members[i]] = step.ids[i];
      merged.logprobs[members[i]] = step.logprobs[i];
      if (!step.top.empty()) merged.top[members[i]] = step.top[i];
    }
  }
  return merged;
}

}  // namespace

struct LoadedModel::Impl {
  LoadReport report;
  LoadOptions options;
  Checkpoint checkpoint;
  std::unique_ptr<Pipeline> pipeline;
};

LoadedModel::LoadedModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LoadedModel::~LoadedModel() = default;
const LoadReport& LoadedModel::report() const { return impl_->report; }
int64_t LoadedModel::vocab_size() const { return impl_->pipeline->dims().vocab; }
int64_t LoadedModel::max_batch() const { return impl_->options.max_batch; }
int64_t LoadedModel::max_context() const { return impl_->options.max_context; }
int64_t LoadedModel::kv_blocks() const { return impl_->options.kv_blocks; }
int64_t LoadedModel::kv_block_tokens() const { return impl_->options.kv_block_tokens; }

absl::StatusOr<std::pair<int64_t, int64_t>> KvPoolBlocks(int64_t max_batch, int64_t max_context,
                                                         int64_t kv_cache_tokens, int64_t kv_block_tokens) {
  if (kv_block_tokens < 1 || kv_block_tokens > 4096) {
    return absl::InvalidArgumentError(absl::StrCat("--kv-block-tokens: ", kv_block_tokens, " is not in [1, 4096]"));
  }
  if (kv_cache_tokens < 0) return absl::InvalidArgumentError("--kv-cache-tokens: must not be negative");
  int64_t blocks = (kv_cache_tokens + kv_block_tokens - 1) / kv_block_tokens;
  if (kv_cache_tokens == 0) {
    absl::StatusOr<int64_t> dense =
        planner::CheckedMul(max_batch, (max_context + kv_block_tokens - 1) / kv_block_tokens,
                            "--max-batch x --max-context (KV cache blocks)");
    if (!dense.ok()) return dense.status();
    blocks = *dense;
  }
  if (blocks > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrCat("--kv-cache-tokens: ", blocks, " blocks of ", kv_block_tokens,
                                                   " tokens, more than the 2^30 a KV pool may have"));
  }
  return std::pair{blocks, kv_block_tokens};
}
int64_t LoadedModel::recompute_threshold() const { return impl_->pipeline->recompute_threshold(); }
Pipeline& LoadedModel::pipeline() { return *impl_->pipeline; }

absl::StatusOr<LoadOptions> PlanServing(const ServingRequest& request) {
  if (request.max_batch < 1) return absl::InvalidArgumentError("--max-batch: must be at least 1");
  if (request.max_context < 1) return absl::InvalidArgumentError("--max-context: must be at least 1");
  const TorchInfo torch = QueryTorch();
  if (torch.cuda_load_failed) return absl::FailedPreconditionError(absl::StrCat("CUDA: ", torch.cuda_load));
  // Serving dtype: as asked; else the checkpoint's when a GPU will run it, float32 on the CPU.
  std::optional<planner::DType> dtype = request.dtype;
  if (!dtype) {
    bool gpu = request.physical.empty() ? torch.cuda_available : false;
    for (const auto& [index, device] : request.physical) gpu = gpu || device.cuda;
    if (!gpu) dtype = planner::DType::kFloat32;  // else LoadModelSpec takes the config's
  }
  if (dtype && *dtype != planner::DType::kFloat32 && *dtype != planner::DType::kFloat16 &&
      *dtype != planner::DType::kBFloat16) {
    return absl::InvalidArgumentError(absl::StrCat("--dtype: ", std::string(planner::DTypeName(*dtype)),
                                                   " is not a serving dtype (float32, float16, bfloat16)"));
  }
  LoadOptions options;
  options.model_dir = request.model_dir;
  options.physical = request.physical;
  options.max_batch = request.max_batch;
  options.max_context = request.max_context;
  absl::StatusOr<std::pair<int64_t, int64_t>> pool =
      KvPoolBlocks(request.max_batch, request.max_context, request.kv_cache_tokens, request.kv_block_tokens);
  if (!pool.ok()) return pool.status();
  std::tie(options.kv_blocks, options.kv_block_tokens) = *pool;
  // The spec checks every checkpoint header against the expected tensors (missing, unexpected,
  // mis-shaped): the one list of what the model needs.
  absl::StatusOr<planner::ModelSpec> spec = planner::LoadModelSpec(request.model_dir, dtype);
  if (!spec.ok()) return spec.status();
  options.spec = *std::move(spec);
  const planner::DType serving = options.spec.dtype;
  if (serving != planner::DType::kFloat32 && serving != planner::DType::kFloat16 &&
      serving != planner::DType::kBFloat16) {
    return absl::InvalidArgumentError(
        absl::StrCat((request.model_dir / "config.json").string(), ": dtype ", std::string(planner::DTypeName(serving)),
                     " is not a serving dtype (float32, float16, bfloat16); pass --dtype"));
  }
  planner::PlanRequest plan_request;
  plan_request.device_map = request.device_map;
  plan_request.max_memory = request.max_memory;
  plan_request.inventory = request.inventory;
  if (!request.max_memory && !request.inventory) {
    // What transformers reads when from_pretrained gets no max_memory: every visible GPU's free memory
    // and the host's available memory, queried once here.
    absl::StatusOr<planner::MachineInventory> inventory = planner::DiscoverInventory();
    if (!inventory.ok()) return inventory.status();
    plan_request.inventory = *std::move(inventory);
  }
  plan_request.kv_cache_tokens = options.kv_blocks * options.kv_block_tokens;
  absl::StatusOr<planner::Plan> plan = planner::MakePlan(options.spec, plan_request);
  if (!plan.ok()) return plan.status();
  options.plan = *std::move(plan);
  return options;
}

absl::StatusOr<std::unique_ptr<LoadedModel>> LoadedModel::Load(const LoadOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  if (options.max_batch < 1) return absl::InvalidArgumentError("--max-batch: must be at least 1");
  if (options.max_context < 1) return absl::InvalidArgumentError("--max-context: must be at least 1");
  if (options.kv_blocks < 1 || options.kv_block_tokens < 1) {
    return absl::InvalidArgumentError("--kv-cache-tokens: the KV pool needs at least one block");
  }
  // The forward pass's settings, as the planner read them from config.json: an error when config.json asks
  // for what the runtime does not implement, and for module trees.
  if (!options.spec.decoder.ok()) return options.spec.decoder.status();
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  LoadReport& report = impl->report;
  report.spec = options.spec;
  report.plan = options.plan;
  report.dtype = std::string(planner::DTypeName(options.spec.dtype));
  absl::StatusOr<Checkpoint> checkpoint = Checkpoint::Open(options.model_dir);
  if (!checkpoint.ok()) return checkpoint.status();
  impl->checkpoint = *std::move(checkpoint);
  report.checkpoint_bytes = impl->checkpoint.total_bytes();

  PipelineOptions pipeline_options;
  pipeline_options.dtype = ToScalarType(options.spec.dtype);
  pipeline_options.kv_blocks = options.kv_blocks;
  pipeline_options.kv_block_tokens = options.kv_block_tokens;
  pipeline_options.physical = options.physical;
  try {
    absl::StatusOr<std::unique_ptr<Pipeline>> pipeline =
        Pipeline::Build(report.spec, report.plan, impl->checkpoint, pipeline_options);
    if (!pipeline.ok()) return pipeline.status();
    impl->pipeline = *std::move(pipeline);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("loading ", options.model_dir.string(), ": ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("loading ", options.model_dir.string(), ": ", e.what()));
  }
  const WeightLoadStats& stats = impl->pipeline->load_stats();
  report.zero_copy_tensors = stats.zero_copy;
  report.copied_tensors = stats.copied;
  report.disk_tensors = stats.on_disk;
  report.kv_cache_bytes = impl->pipeline->kv_cache_bytes();
  for (const Stage& stage : impl->pipeline->stages()) {
    if (stage.kv.bytes() > 0 &&
        std::find(report.kv_devices.begin(), report.kv_devices.end(), stage.label) == report.kv_devices.end()) {
      report.kv_devices.push_back(stage.label);
    }
  }
  report.stages = impl->pipeline->Describe();
  report.seconds = SecondsSince(start);
  return std::unique_ptr<LoadedModel>(new LoadedModel(std::move(impl)));
}

absl::StatusOr<std::vector<GreedyResult>> LoadedModel::Greedy(const GreedyRequest& request, GenerateTiming* timing) {
  const int64_t vocab = vocab_size();
  const int64_t max_context = impl_->options.max_context;
  if (request.max_new_tokens < 0) return absl::InvalidArgumentError("--max-new-tokens: must not be negative");
  if (request.top_logprobs < 0) return absl::InvalidArgumentError("--top-logprobs: must not be negative");
  for (size_t p = 0; p < request.prompts.size(); ++p) {
    const std::vector<int64_t>& prompt = request.prompts[p];
    if (prompt.empty()) return absl::InvalidArgumentError(absl::StrCat("prompt ", p, ": no token ids"));
    for (size_t i = 0; i < prompt.size(); ++i) {
      if (prompt[i] < 0 || prompt[i] >= vocab) {
        return absl::InvalidArgumentError(absl::StrCat("prompt ", p, ": token id ", prompt[i], " at position ", i,
                                                       " is outside the vocabulary [0, ", vocab, ")"));
      }
    }
    // As the server counts (server/README.md): every prompt token and every token that may be generated.
    const int64_t context = static_cast<int64_t>(prompt.size()) + request.max_new_tokens;
    if (context > max_context) {
      return absl::InvalidArgumentError(absl::StrCat(
          "prompt ", p, ": ", prompt.size(), prompt.size() == 1 ? " token + " : " tokens + ", request.max_new_tokens,
          request.max_new_tokens == 1 ? " new token = " : " new tokens = ", context, ", more than --max-context ",
          max_context));
    }
  }

  const int64_t per_row = (max_context + impl_->options.kv_block_tokens - 1) / impl_->options.kv_block_tokens;
  if (impl_->options.max_batch * per_row > impl_->options.kv_blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-batch ", impl_->options.max_batch, " sequences of --max-context ", max_context, " need ",
                     impl_->options.max_batch * per_row, " KV blocks, the pool has ", impl_->options.kv_blocks));
  }
  std::vector<GreedyResult> results(request.prompts.size());
  GenerateTiming local;
  GenerateTiming& t = timing != nullptr ? *timing : local;
  try {
    const int64_t max_batch = impl_->options.max_batch;
    for (size_t begin = 0; begin < request.prompts.size(); begin += static_cast<size_t>(max_batch)) {
      const size_t end = std::min(request.prompts.size(), begin + static_cast<size_t>(max_batch));
      const int64_t rows = static_cast<int64_t>(end - begin);
      std::vector<int64_t> lengths;
      int64_t longest = 0;
      for (size_t p = begin; p < end; ++p) {
        lengths.push_back(static_cast<int64_t>(request.prompts[p].size()));
        longest = std::max(longest, lengths.back());
      }
      if (request.max_new_tokens == 0) continue;
      // Prefill: prompts right-padded into one [rows, longest] batch from position 0, each in the KV blocks
      // of its row (GreedyBlocks). Inputs are staged on the host (pinned when a stage is CUDA) and copied by each
      // stage.
      Pipeline& pipeline = *impl_->pipeline;
      at::Tensor ids = pipeline.HostBuffer({rows, longest}, at::kLong).zero_();
      ForwardGroup prefill;
      prefill.starts = pipeline.HostBuffer({rows}, at::kLong).zero_();
      std::vector<int64_t> batch_rows(static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r) batch_rows[r] = r;
      prefill.blocks = GreedyBlocks(pipeline, batch_rows, per_row);
      prefill.last = pipeline.HostBuffer({rows}, at::kLong);
      for (int64_t r = 0; r < rows; ++r) {
        const std::vector<int64_t>& prompt = request.prompts[begin + static_cast<size_t>(r)];
        std::copy(prompt.begin(), prompt.end(), ids.data_ptr<int64_t>() + r * longest);
        prefill.last.data_ptr<int64_t>()[r] = lengths[r] - 1;
      }
      prefill.key_length = longest;
      const ForwardBatch batch = pipeline.OneGroup(ids, prefill);
      const ForwardGroup& blocks = batch.groups.front();  // the decode steps reuse its block tables

      auto record = [&](const GreedyStep& step) {
        for (int64_t r = 0; r < rows; ++r) {
          GreedyResult& out = results[begin + static_cast<size_t>(r)];
          out.ids.push_back(step.ids[r]);
          out.logprobs.push_back(step.logprobs[r]);
          if (request.top_logprobs > 0) {
            std::vector<TokenLogprob> top;
            for (const auto& [id, lp] : step.top[r]) top.push_back({id, lp});
            out.top_logprobs.push_back(std::move(top));
          }
        }
      };
      auto start = std::chrono::steady_clock::now();
      GreedyStep step = SampleGreedy(pipeline.Forward(batch), request.top_logprobs);
      record(step);
      t.prefill_seconds += SecondsSince(start);

      start = std::chrono::steady_clock::now();
      const int64_t threshold = pipeline.recompute_threshold();
      for (int64_t n = 1; n < request.max_new_tokens; ++n) {
        if (threshold > 0) {
          // longrope: rows whose prompt was at most `threshold` long reach threshold + 1 tokens now.
          std::vector<bool> recompute(static_cast<size_t>(rows));
          std::vector<std::vector<int64_t>> sequences(static_cast<size_t>(rows));
          std::vector<int64_t> positions(static_cast<size_t>(rows));
          bool any = false;
          for (int64_t r = 0; r < rows; ++r) {
            positions[r] = lengths[r] + n - 1;
            recompute[r] = lengths[r] <= threshold && positions[r] == threshold;
            any = any || recompute[r];
            sequences[r] = request.prompts[begin + static_cast<size_t>(r)];
            const std::vector<int64_t>& generated = results[begin + static_cast<size_t>(r)].ids;
            sequences[r].insert(sequences[r].end(), generated.begin(), generated.end());
          }
          if (any) {
            step = RecomputeStep(pipeline, sequences, positions, recompute, request.top_logprobs, per_row);
            record(step);
            ++t.decode_steps;
            continue;
          }
        }
        // Decode: each row's newest token at its own next position.
        at::Tensor ids = pipeline.HostBuffer({rows, 1}, at::kLong);
        ForwardGroup decode;
        decode.starts = pipeline.HostBuffer({rows}, at::kLong);
        decode.last = pipeline.HostBuffer({rows}, at::kLong).zero_();
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t position = lengths[r] + n - 1;
          ids.data_ptr<int64_t>()[r] = step.ids[r];
          decode.starts.data_ptr<int64_t>()[r] = position;
          decode.key_length = std::max(decode.key_length, position + 1);
        }
        decode.blocks = blocks.blocks;
        step = SampleGreedy(pipeline.Forward(pipeline.OneGroup(ids, std::move(decode))), request.top_logprobs);
        record(step);
        ++t.decode_steps;
      }
      t.decode_seconds += SecondsSince(start);
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("forward: ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("forward: ", e.what()));
  }
  return results;
}

}  // namespace strata::runtime
