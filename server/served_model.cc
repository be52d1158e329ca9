#include "server/served_model.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/file_reader.h"
#include "runtime/engine/generation_config.h"

namespace strata::server {

bool HasWeights(const std::filesystem::path& dir) {
  // The error_code forms throughout: an unreadable directory is "no weights" here, and the load that
  // follows names the problem.
  std::error_code error;
  for (std::filesystem::directory_iterator it(dir, error), end; !error && it != end; it.increment(error)) {
    const std::filesystem::path& path = it->path();
    if (path.extension() == ".safetensors" || path.filename() == "model.safetensors.index.json") return true;
  }
  return false;
}

absl::StatusOr<runtime::LoadOptions> PlanServedModel(const ServerOptions& options,
                                                     const std::optional<planner::MachineInventory>& inventory) {
  if (!options.model_dir) return absl::InvalidArgumentError("--model: a checkpoint directory is needed to serve");
  runtime::ServingRequest request;
  request.model_dir = *options.model_dir;
  request.device_map = options.device_map;
  request.max_memory = options.max_memory;
  request.inventory = inventory;
  request.physical = options.physical_devices;
  request.dtype = options.dtype;
  request.max_batch = options.max_batch;
  request.max_context = options.max_context;
  request.kv_cache_tokens = options.kv_cache_tokens;
  request.kv_block_tokens = options.kv_block_tokens;
  absl::StatusOr<runtime::LoadOptions> load = runtime::PlanServing(request);
  if (!load.ok()) {
    return absl::Status(load.status().code(),
                        absl::StrCat("--model ", options.model_dir->string(), ": ", load.status().message()));
  }
  return load;
}

absl::StatusOr<std::unique_ptr<ServedModel>> ServedModel::Load(
    const ServerOptions& options, const runtime::LoadOptions& load,
    std::function<void(const absl::Status&)> on_device_lost) {
  std::unique_ptr<ServedModel> served(new ServedModel());
  absl::StatusOr<std::unique_ptr<runtime::LoadedModel>> model = runtime::LoadedModel::Load(load);
  if (!model.ok()) {
    return absl::Status(model.status().code(),
                        absl::StrCat("--model ", load.model_dir.string(), ": ", model.status().message()));
  }
  served->model_ = *std::move(model);

  if (checkpoint::PathMayExist(*options.model_dir / "tokenizer.json")) {
    absl::StatusOr<std::unique_ptr<tokenizer::Tokenizer>> tok =
        tokenizer::Tokenizer::FromPath(options.model_dir->string());
    if (!tok.ok()) return tok.status();
    served->tokenizer_ = *std::move(tok);
  }
  absl::StatusOr<std::vector<int32_t>> eos =
      runtime::ReadEosTokenIds(*options.model_dir, served->model_->report().spec);
  if (!eos.ok()) return eos.status();

  runtime::EngineOptions engine_options;
  engine_options.max_queue = options.max_queue;
  engine_options.prefix_cache = options.prefix_cache;
  // One micro-batch per stage keeps every stage busy; more only cut the batch finer, and each micro-batch
  // reads every weight of its stage again (a one-stage plan loses half its decode speed with two).
  engine_options.micro_batches =
      options.micro_batches > 0
          ? options.micro_batches
          : std::max<int64_t>(1, static_cast<int64_t>(served->model_->report().plan.stages.size()));
  engine_options.prefill_chunk_tokens = options.prefill_chunk;
  engine_options.micro_batch_tokens = options.max_batch_tokens;
  engine_options.intra_op_threads = options.intra_op_threads;
  engine_options.fault = options.fault;
  engine_options.on_device_lost = std::move(on_device_lost);
  absl::StatusOr<std::unique_ptr<runtime::Engine>> engine =
      runtime::Engine::Start(*served->model_, served->tokenizer_.get(), *std::move(eos), engine_options);
  if (!engine.ok()) return engine.status();
  served->engine_ = *std::move(engine);

  served->limits_.vocab_size = served->model_->vocab_size();
  served->limits_.max_context = options.max_context;
  served->limits_.kv_cache_tokens = served->engine_->kv_cache_tokens();
  served->limits_.max_new_tokens = options.max_new_tokens > 0 ? options.max_new_tokens : options.max_context;
  served->limits_.max_prompt_bytes = options.max_prompt_bytes;
  served->limits_.max_prompt_tokens = options.max_prompt_tokens > 0 ? options.max_prompt_tokens : options.max_context;
  served->plan_.spec = served->model_->report().spec;
  served->plan_.plan = served->model_->report().plan;
  served->plan_.kv_cache_tokens = served->engine_->kv_cache_tokens();
  served->plan_.kv_cache_blocks = served->model_->kv_blocks();
  served->plan_.kv_block_tokens = served->model_->kv_block_tokens();
  served->plan_.kv_devices = served->model_->report().kv_devices;
  return served;
}

}  // namespace strata::server
