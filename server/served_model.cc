#include "server/served_model.h"

#include <algorithm>
#include <iostream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "planner/generation_config.h"
#include "runtime/executor/group_load.h"

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

absl::StatusOr<runtime::ServingRequest> ServingRequestOf(const planner::Placement& placement,
                                                         const ServingFlags& serving,
                                                         const std::optional<planner::MachineInventory>& inventory) {
  if (!placement.model_dir) return absl::InvalidArgumentError("--model: a checkpoint directory is needed to serve");
  runtime::ServingRequest request;
  request.model_dir = *placement.model_dir;
  request.device_map = placement.device_map;
  request.max_memory = placement.max_memory;
  request.inventory = inventory;
  request.physical = placement.physical_devices;
  request.dtype = placement.dtype;
  request.serving = serving.runtime;
  request.kv_cache_tokens = placement.kv_cache_tokens;
  request.runtime_reserve = placement.runtime_reserve;
  request.quantized_sizing = placement.quantized_sizing;
  request.mtp = serving.speculative.method == runtime::SpeculativeOptions::Method::kMtp;
  return request;
}

ServingNotes NotesOnServing(const planner::Placement& placement, const ServingFlags& serving,
                            const runtime::LoadOptions& load) {
  ServingNotes out;
  const int64_t trained = load.spec.max_position_embeddings;
  if (trained > 0 && serving.runtime.max_context > trained) {
    out.warnings.push_back(absl::StrCat("--max-context ", serving.runtime.max_context, " is more than the ", trained,
                                        " positions the model was trained for (config.json max_position_embeddings): "
                                        "past them its output is unreliable"));
  }
  const int64_t pool_tokens = load.kv_blocks * load.serving.kv_block_tokens;
  if (placement.kv_cache_tokens > 0 && pool_tokens != placement.kv_cache_tokens) {
    out.notes.push_back(absl::StrCat("--kv-cache-tokens ", placement.kv_cache_tokens, " rounded up to ", pool_tokens,
                                     ": whole blocks of --kv-block-tokens ", load.serving.kv_block_tokens));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<ServedModel>> ServedModel::Load(const ServerOptions& options,
                                                               const runtime::LoadOptions& load,
                                                               const runtime::LoadOptions* draft,
                                                               std::function<void(const absl::Status&)> on_device_lost,
                                                               runtime::NodeGroup* group) {
  std::unique_ptr<ServedModel> served(new ServedModel());
  absl::StatusOr<std::unique_ptr<runtime::LoadedModel>> model = runtime::LoadedModel::Load(load);
  if (!model.ok()) {
    return absl::Status(model.status().code(),
                        absl::StrCat("--model ", load.model_dir.string(), ": ", model.status().message()));
  }
  served->model_ = *std::move(model);
  if (draft != nullptr) {
    absl::StatusOr<std::unique_ptr<runtime::LoadedModel>> loaded = runtime::LoadedModel::Load(*draft);
    if (!loaded.ok()) {
      return absl::Status(loaded.status().code(),
                          absl::StrCat("--draft-model ", draft->model_dir.string(), ": ", loaded.status().message()));
    }
    served->draft_ = *std::move(loaded);
  }
  if (group != nullptr) {
    if (absl::Status ready = runtime::AwaitGroupReady(*group); !ready.ok()) return ready;
    served->model_->SetGroup(group);
  }

  if (tokenizer::Tokenizer::DirectoryHasTokenizer(options.placement.model_dir->string())) {
    absl::StatusOr<std::unique_ptr<tokenizer::Tokenizer>> tok =
        tokenizer::Tokenizer::FromPath(options.placement.model_dir->string());
    if (!tok.ok()) return tok.status();
    served->tokenizer_ = *std::move(tok);
  }
  // The chat template, parsed once here: one that does not parse stops the start naming its file and line
  // (exit 2). A checkpoint without one serves prompts and ids only.
  absl::StatusOr<chat_template::CheckpointChatTemplate> chat =
      chat_template::LoadChatTemplate(*options.placement.model_dir, options.serving.chat_template_file);
  if (chat.ok()) {
    served->chat_template_ = *std::move(chat);
  } else if (!absl::IsNotFound(chat.status()) || !options.serving.chat_template_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        options.serving.chat_template_file.empty() ? "chat template: " : "--chat-template: ", chat.status().message()));
  }
  absl::StatusOr<std::vector<int32_t>> eos = planner::EosTokenIds(served->model_->report().spec);
  if (!eos.ok()) return eos.status();
  const std::vector<int32_t> eos_ids = *eos;

  runtime::EngineOptions engine_options;
  engine_options.max_queue = options.serving.max_queue;
  engine_options.prefix_cache = options.serving.prefix_cache;
  engine_options.jump_forward = options.serving.jump_forward;
  // One micro-batch per stage keeps every stage busy; more only cut the batch finer, and each micro-batch
  // reads every weight of its stage again (a one-stage plan loses half its decode speed with two).
  engine_options.micro_batches =
      options.serving.micro_batches > 0
          ? options.serving.micro_batches
          : std::max<int64_t>(1, static_cast<int64_t>(served->model_->report().plan.stages.size()));
  engine_options.prefill_chunk_tokens = options.serving.prefill_chunk;
  engine_options.micro_batch_tokens = options.serving.max_batch_tokens;
  engine_options.intra_op_threads = options.serving.intra_op_threads;
  engine_options.fault = options.serving.fault;
  engine_options.on_device_lost = std::move(on_device_lost);
  engine_options.group = group;
  engine_options.speculative = options.serving.speculative;
  engine_options.draft = served->draft_.get();
  absl::StatusOr<std::unique_ptr<runtime::Engine>> engine =
      runtime::Engine::Start(*served->model_, served->tokenizer_.get(), *std::move(eos), engine_options);
  if (!engine.ok()) return engine.status();
  served->engine_ = *std::move(engine);

  // Structured outputs compile against the tokenizer's vocabulary within the model's (its logits' columns), ending
  // with the engine's EOS ids. Without a tokenizer (or a vocabulary xgrammar cannot read) the server serves on and
  // refuses constrained requests, saying why.
  if (served->tokenizer_ == nullptr) {
    served->limits_.grammar_unavailable = "the model has no tokenizer.json (or tiktoken.model) to compile against";
  } else {
    structured::CompilerOptions compiler_options;
    compiler_options.max_compile_time = options.limits.max_grammar_compile_time;
    compiler_options.max_constraint_bytes = options.limits.max_grammar_bytes;
    absl::StatusOr<std::unique_ptr<structured::Compiler>> compiler =
        structured::Compiler::Create(*served->tokenizer_, served->engine_->vocab_size(), eos_ids, compiler_options);
    if (compiler.ok()) {
      served->grammar_compiler_ = *std::move(compiler);
      served->limits_.grammar_compiler = served->grammar_compiler_.get();
    } else {
      served->limits_.grammar_unavailable = std::string(compiler.status().message());
      std::cerr << "strata-server: WARNING: structured outputs are off: " << compiler.status().message() << std::endl;
    }
  }
  served->limits_.vocab_size = served->model_->vocab_size();
  served->limits_.max_context = options.serving.runtime.max_context;
  served->limits_.kv_cache_tokens = served->engine_->kv_cache_tokens();
  served->limits_.max_new_tokens =
      options.limits.max_new_tokens > 0 ? options.limits.max_new_tokens : options.serving.runtime.max_context;
  served->limits_.max_prompt_bytes = options.limits.max_prompt_bytes;
  served->limits_.max_prompt_tokens =
      options.limits.max_prompt_tokens > 0 ? options.limits.max_prompt_tokens : options.serving.runtime.max_context;
  served->plan_.spec = served->model_->report().spec;
  served->plan_.plan = served->model_->report().plan;
  served->plan_.kv_cache_tokens = served->engine_->kv_cache_tokens();
  served->plan_.kv_cache_blocks = served->model_->kv_blocks();
  served->plan_.kv_block_tokens = served->model_->kv_block_tokens();
  served->plan_.kv_devices = served->model_->report().kv_devices;
  if (served->draft_ != nullptr) {
    auto draft_plan = std::make_shared<ServedPlan>();
    draft_plan->spec = served->draft_->report().spec;
    draft_plan->plan = served->draft_->report().plan;
    draft_plan->kv_cache_blocks = served->draft_->kv_blocks();
    draft_plan->kv_block_tokens = served->draft_->kv_block_tokens();
    draft_plan->kv_cache_tokens = draft_plan->kv_cache_blocks * draft_plan->kv_block_tokens;
    draft_plan->kv_devices = served->draft_->report().kv_devices;
    served->plan_.draft = std::move(draft_plan);
  }
  return served;
}

}  // namespace strata::server
