#include "runtime/engine/draft_model.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tokenizer/tokenizer.h"

namespace strata::runtime {

absl::StatusOr<LoadOptions> PlanDraftLoad(const ServingRequest& target, const LoadOptions& target_load,
                                          const std::filesystem::path& draft_dir) {
  ServingRequest draft = target;
  draft.model_dir = draft_dir;
  draft.device_map = planner::DeviceMapChoice{};
  draft.device_map.strategy = planner::Strategy::kSequential;
  draft.kv_cache_tokens = target_load.kv_blocks * target_load.serving.kv_block_tokens;
  draft.runtime_reserve = planner::RuntimeReserve{};  // the target's reserve covers what serving allocates
  planner::MaxMemory left;
  for (const planner::DeviceUsage& usage : target_load.plan.devices) {
    // A group's other nodes' GPUs: the draft runs in the leader's process (their budgets are theirs).
    const int gpu = usage.device.is_gpu() ? usage.device.index : -1;
    if (gpu >= 0 && static_cast<size_t>(gpu) < target_load.gpu_nodes.size() &&
        target_load.gpu_nodes[static_cast<size_t>(gpu)] != 0) {
      continue;
    }
    const double taken = static_cast<double>(usage.planned_bytes) + static_cast<double>(usage.kv_cache_bytes) +
                         static_cast<double>(usage.runtime_reserve.total());
    left.push_back({usage.device, std::isfinite(usage.budget_bytes) ? std::max(0.0, usage.budget_bytes - taken)
                                                                    : usage.budget_bytes});
  }
  if (!left.empty()) {
    draft.max_memory = left;
    draft.inventory.reset();
  }
  absl::StatusOr<LoadOptions> options = PlanLoad(draft);
  if (!options.ok()) {
    // The planner names the folder as --model's: it is --draft-model's.
    std::string message(options.status().message());
    const std::string as_model = absl::StrCat("--model ", draft_dir.string(), ": ");
    if (absl::StartsWith(message, as_model)) message.erase(0, as_model.size());
    return absl::Status(options.status().code(), absl::StrCat("--draft-model ", draft_dir.string(), ": ", message));
  }
  return options;
}

absl::Status CheckDraftTokenizer(const std::filesystem::path& target_dir, const std::filesystem::path& draft_dir) {
  using tokenizer::Tokenizer;
  if (!Tokenizer::DirectoryHasTokenizer(target_dir.string()) || !Tokenizer::DirectoryHasTokenizer(draft_dir.string())) {
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<Tokenizer>> ours = Tokenizer::FromPath(target_dir.string());
  if (!ours.ok()) return ours.status();
  absl::StatusOr<std::unique_ptr<Tokenizer>> theirs = Tokenizer::FromPath(draft_dir.string());
  if (!theirs.ok()) {
    return absl::Status(theirs.status().code(), absl::StrCat("--draft-model: ", theirs.status().message()));
  }
  const int64_t ids = std::min((*ours)->IdCount(), (*theirs)->IdCount());
  for (int64_t id = 0; id < ids; ++id) {
    const std::optional<std::string> a = (*ours)->IdToToken(static_cast<int32_t>(id));
    const std::optional<std::string> b = (*theirs)->IdToToken(static_cast<int32_t>(id));
    if (a != b) {
      return absl::InvalidArgumentError(absl::StrCat("--draft-model ", draft_dir.string(), ": its tokenizer's id ", id,
                                                     " is \"", absl::CHexEscape(b.value_or("(none)")),
                                                     "\", the model's \"", absl::CHexEscape(a.value_or("(none)")),
                                                     "\": a draft must share the model's vocabulary"));
    }
  }
  return absl::OkStatus();
}

DraftModel::DraftModel(std::unique_ptr<Executor> executor, int64_t vocab, int64_t target_vocab, int64_t chunk_tokens,
                       int64_t block_tokens)
    : executor_(std::move(executor)),
      vocab_(vocab),
      target_vocab_(target_vocab),
      chunk_tokens_(chunk_tokens),
      block_tokens_(block_tokens) {}

DraftModel::~DraftModel() = default;

absl::StatusOr<std::unique_ptr<DraftModel>> DraftModel::Start(LoadedModel& draft, const LoadedModel& target,
                                                              int64_t chunk_tokens, int32_t intra_op_threads) {
  if (draft.vocab_size() > target.vocab_size()) {
    return absl::InvalidArgumentError(absl::StrCat("--draft-model: its vocabulary has ", draft.vocab_size(),
                                                   " ids, the target's ", target.vocab_size(),
                                                   ": it could propose ids the target does not have"));
  }
  if (draft.kv_block_tokens() != target.kv_block_tokens() || draft.kv_blocks() < target.kv_blocks()) {
    return absl::InvalidArgumentError(absl::StrCat("--draft-model: its KV pool has ", draft.kv_blocks(), " blocks of ",
                                                   draft.kv_block_tokens(), " positions, the target's ",
                                                   target.kv_blocks(), " of ", target.kv_block_tokens(),
                                                   ": a sequence's draft cache lives in the target's block ids"));
  }
  if (draft.max_context() < target.max_context()) {
    return absl::InvalidArgumentError(absl::StrCat("--draft-model: its context reaches ", draft.max_context(),
                                                   " positions, the target's ", target.max_context()));
  }
  ExecutorOptions options;
  options.intra_op_threads = intra_op_threads;
  absl::StatusOr<std::unique_ptr<Executor>> executor = Executor::Start(draft, options);
  if (!executor.ok()) return executor.status();
  return std::unique_ptr<DraftModel>(new DraftModel(*std::move(executor), draft.vocab_size(), target.vocab_size(),
                                                    std::max<int64_t>(1, chunk_tokens), draft.kv_block_tokens()));
}

absl::StatusOr<MicroBatchResult> DraftModel::Run(MicroBatchWork work) {
  work.id = next_id_++;
  executor_->Submit(std::move(work));
  MicroBatchResult result = executor_->WaitCompleted();
  if (!result.status.ok()) {
    device_lost_ = device_lost_ || result.device_lost;
    return absl::Status(result.status.code(), absl::StrCat("the draft model: ", result.status.message()));
  }
  return result;
}

absl::StatusOr<std::vector<DraftProposal>> DraftModel::Propose(std::vector<DraftRequest>& requests) {
  const size_t n = requests.size();
  std::vector<DraftProposal> proposals(n);
  std::vector<bool> stopped(n, false);  // the draft's logits were not finite: it proposes what it has
  auto row_for = [&](const DraftRequest& request, int64_t start, std::vector<int32_t> tokens, bool samples) {
    BatchRow row;
    const int64_t reach = (start + static_cast<int64_t>(tokens.size()) + block_tokens_ - 1) / block_tokens_;
    row.blocks.assign(request.blocks.begin(),
                      request.blocks.begin() + std::min<int64_t>(reach, static_cast<int64_t>(request.blocks.size())));
    row.start = start;
    row.tokens = std::move(tokens);
    row.samples = samples;
    if (samples) {
      const bool sampled = request.temperature >= kMinSamplingTemperature;
      row.sampling.temperature = request.temperature;
      row.sampling.top_k = request.top_k;
      row.sampling.top_p = request.top_p;
      row.sampling.return_probs = sampled;
      if (sampled) row.sampling.uniform = std::uniform_real_distribution<double>(0.0, 1.0)(*request.random);
      if (request.matcher != nullptr) {
        std::vector<int32_t> words(static_cast<size_t>(structured::MaskWords(request.matcher->vocab_size())));
        request.matcher->FillMask(words.data());
        row.sampling.allowed = AllowedTokens::Ready(std::move(words));
      }
    }
    return row;
  };
  // Proposals each matcher accepted: rolled back however Propose returns.
  struct Rollbacks {
    std::vector<DraftRequest>& requests;
    std::vector<int32_t> advanced;
    ~Rollbacks() {
      for (size_t i = 0; i < requests.size(); ++i) {
        if (requests[i].matcher != nullptr) requests[i].matcher->Rollback(advanced[i]);
      }
    }
  } rollbacks{requests, std::vector<int32_t>(n, 0)};
  std::vector<int32_t>& advanced = rollbacks.advanced;
  auto take = [&](size_t i, const MicroBatchResult& result, size_t r) {
    if (r < result.row_errors.size() && !result.row_errors[r].ok()) stopped[i] = true;
    if (stopped[i] || !result.tokens[r]) {
      stopped[i] = true;
      return;
    }
    DraftProposal& proposal = proposals[i];
    structured::Matcher* matcher = requests[i].matcher;
    if (matcher != nullptr) {
      if (!matcher->Accept(result.tokens[r]->id)) {
        stopped[i] = true;  // the grammar ended (nothing may follow) or its matcher failed: propose what came before
        return;
      }
      ++advanced[i];
      stopped[i] = matcher->Ended();  // an EOS id the grammar accepted: nothing may follow it
    }
    proposal.tokens.push_back(result.tokens[r]->id);
    if (r < result.probs.size() && !result.probs[r].empty()) {
      const std::vector<float>& q = result.probs[r];
      proposal.probs.insert(proposal.probs.end(), q.begin(), q.end());
      proposal.probs.resize(proposal.tokens.size() * static_cast<size_t>(target_vocab_), 0.0f);
    }
  };
  // What each draft cache lacks, in chunks under one token budget a micro-batch; each request's last chunk samples
  // its first proposal.
  while (true) {
    MicroBatchWork work;
    std::vector<std::pair<size_t, int64_t>> fed;  // (request, tokens)
    int64_t budget = chunk_tokens_;
    for (size_t i = 0; i < n && budget > 0; ++i) {
      DraftRequest& request = requests[i];
      const int64_t length = static_cast<int64_t>(request.tokens->size());
      request.computed = std::clamp<int64_t>(request.computed, 0, length - 1);
      if (request.count < 1 || !proposals[i].tokens.empty() || stopped[i]) continue;
      const int64_t count = std::min(length - request.computed, budget);
      const auto from = request.tokens->begin() + request.computed;
      work.rows.push_back(row_for(request, request.computed, std::vector<int32_t>(from, from + count),
                                  request.computed + count == length));
      fed.emplace_back(i, count);
      budget -= count;
    }
    if (work.rows.empty()) break;
    absl::StatusOr<MicroBatchResult> result = Run(std::move(work));
    if (!result.ok()) return result.status();
    for (size_t r = 0; r < fed.size(); ++r) {
      auto [i, count] = fed[r];
      requests[i].computed += count;
      if (requests[i].computed == static_cast<int64_t>(requests[i].tokens->size())) take(i, *result, r);
    }
  }
  // Then one token a step, the proposals fed back.
  for (int64_t step = 1;; ++step) {
    MicroBatchWork work;
    std::vector<size_t> fed;
    for (size_t i = 0; i < n; ++i) {
      const DraftRequest& request = requests[i];
      if (stopped[i] || request.count <= step || static_cast<int64_t>(proposals[i].tokens.size()) != step) continue;
      const int64_t start = static_cast<int64_t>(request.tokens->size()) - 1 + step;
      work.rows.push_back(row_for(request, start, {proposals[i].tokens.back()}, true));
      fed.push_back(i);
    }
    if (work.rows.empty()) break;
    absl::StatusOr<MicroBatchResult> result = Run(std::move(work));
    if (!result.ok()) return result.status();
    for (size_t r = 0; r < fed.size(); ++r) {
      ++requests[fed[r]].computed;
      take(fed[r], *result, r);
    }
  }
  return proposals;
}

}  // namespace strata::runtime
