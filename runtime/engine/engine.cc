#include "runtime/engine/engine.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <variant>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/engine/draft_model.h"
#include "runtime/engine/mask_filler.h"
#include "runtime/engine/output_processor.h"
#include "runtime/engine/scheduler.h"
#include "structured/structured.h"

namespace strata::runtime {

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kEos:
      return "eos";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
  }
  return "unknown";
}

namespace {

// A request as the engine thread sees it: tokens and sampling state, no text.
struct Sequence {
  uint64_t id = 0;
  GenerationRequest request;
  ChunkCallback callback;  // handed to the output thread at admission
  std::shared_ptr<RequestHandle> handle;
  // Set by the output thread when a stop string ended the request: the engine frees its KV blocks.
  std::shared_ptr<std::atomic<bool>> stopped = std::make_shared<std::atomic<bool>>(false);
  std::vector<int32_t> tokens;  // prompt, then generated
  int64_t generated = 0;
  size_t penalty_sent = 0;  // tokens the sampler's penalty state holds (BatchRow::penalty_tokens)
  // SamplingParams::prompt_logprobs: entry i scores prompt token i (filled as the prefill's chunks come
  // back), handed to the output thread with the first step.
  std::vector<std::optional<GeneratedToken>> prompt_logprobs;
  bool prompt_logprobs_sent = false;
  std::mt19937_64 random;
  bool done = false;
  // Structured outputs: where the sequence is in its grammar (every generated token accepted), and the mask
  // being filled for its next token (the matcher is the mask thread's until that mask is ready).
  std::optional<structured::Matcher> matcher;
  std::shared_ptr<AllowedTokens> pending_mask;
  std::shared_ptr<AllowedTokens> ready_mask;  // jump-forward filled the next step's mask already
  // Speculative decoding: the tokens proposed for the next step (fed after the last known one), the acceptance
  // state, and draws taken from `random` for positions not yet emitted: generated token g always gets the
  // request's g-th draw, so seeded sampling gives the same ids with speculation as without.
  std::vector<int32_t> draft;
  std::optional<Speculation> speculation;
  // A draft model's: the distributions its sampled proposals were drawn from (draft.size() x vocab), the tokens its
  // cache holds (DraftRequest::computed), and the generators of its draws and of the acceptance draws, apart from
  // `random` so that seeded requests stay reproducible.
  std::vector<float> draft_probs;
  int64_t draft_computed = 0;
  size_t draft_for = 0;  // the length of `tokens` the draft model's proposal follows (it stands until they grow)
  std::mt19937_64 draft_random;
  std::mt19937_64 accept_random;
  // The multi-token-prediction layer's proposal (MicroBatchResult::mtp) for the token after the first `mtp_for` tokens:
  // the next step's when `tokens` has that length then (jump-forward's tokens leave it behind).
  int32_t mtp_proposal = -1;
  size_t mtp_for = 0;
  std::deque<double> uniforms;
  double Draw() {
    if (uniforms.empty()) return std::uniform_real_distribution<double>(0.0, 1.0)(random);
    const double u = uniforms.front();
    uniforms.pop_front();
    return u;
  }
  // The next `n` draws, left in place for Draw.
  std::vector<double> PeekDraws(size_t n) {
    while (uniforms.size() < n) uniforms.push_back(std::uniform_real_distribution<double>(0.0, 1.0)(random));
    return std::vector<double>(uniforms.begin(), uniforms.begin() + static_cast<std::ptrdiff_t>(n));
  }
  // Waits for the mask thread to be done with the matcher.
  void SettleMask() {
    if (pending_mask != nullptr) pending_mask->Get();
    pending_mask.reset();
  }
};

}  // namespace

struct Engine::Impl {
  Impl(LoadedModel& m, const tokenizer::Tokenizer* t, std::vector<int32_t> eos, const EngineOptions& o,
       const SchedulerOptions& so)
      : model(m), tokenizer(t), eos_ids(eos.begin(), eos.end()), options(o), scheduler(so) {}

  void Run();
  void Admit();
  MicroBatchWork Build(uint64_t id, const ScheduledMicroBatch& batch);
  void Process(MicroBatchResult result);
  void Finish(Sequence& sequence, FinishReason reason, const absl::Status& error = absl::OkStatus());
  // Appends a token the engine chose (sampled, or forced by the grammar), ends the sequence where it must and
  // hands the token to the output thread; whether it ended.
  bool Append(Sequence& s, GeneratedToken token, std::optional<FinishReason> finish);
  void JumpForward(Sequence& s);
  // Speculative decoding: proposals for the idle decoding sequences, before the scheduler picks the next rows.
  void Propose();
  // Appends a token the sampler chose: the grammar first takes it (and may end the sequence); true when it ended.
  bool AppendChosen(Sequence& s, GeneratedToken token);
  // Keeps result row r's multi-token-prediction proposal for the token after the sequence's new end: the one made at
  // the position of its last kept token (row.accepted proposals kept, AcceptVerified; none for a plain row).
  void KeepMtpProposal(Sequence& s, const ScheduledRow& row, const MicroBatchResult& result, size_t r);
  // A verified row: appends the proposed tokens the model chose too, then its own choice at the first difference
  // (or after the last); sets row.accepted.
  void AcceptVerified(Sequence& s, ScheduledRow& row, std::vector<GeneratedToken>& verified, GeneratedToken last);
  // How much of a constrained sequence's n-gram proposal to verify: up to and with the first token its grammar refuses
  // (the target cannot choose it: rejected there; nothing after it could be kept), or to an EOS id it accepts. A draft
  // model's proposals need no cut: DraftModel chooses them under the grammar's masks and stops at its end.
  size_t GrammarKeeps(Sequence& s, const std::vector<int32_t>& proposal);
  void LoseDevice(const absl::Status& status);
  void Publish();
  void Emit(OutputEvent event);
  // The request's prompt log-probabilities, once, for its first step (empty when not asked for).
  std::vector<std::optional<GeneratedToken>> TakePromptLogprobs(Sequence& s);

  LoadedModel& model;
  const tokenizer::Tokenizer* tokenizer;
  const std::set<int32_t> eos_ids;
  const EngineOptions options;
  std::unique_ptr<Executor> executor;
  std::unique_ptr<DraftModel> draft;  // SpeculativeOptions::Method::kDraft
  // Speculative decoding's cost-aware switch (engine thread): the passes' measured seconds, when each micro-batch in
  // flight was submitted, and the steps it held proposals back.
  PassCosts costs;
  std::map<uint64_t, std::chrono::steady_clock::time_point> submitted;
  CostProbes probes;

  // Engine thread only.
  Scheduler scheduler;
  std::map<uint64_t, std::unique_ptr<Sequence>> sequences;
  std::vector<uint64_t> released;  // ended sequences with penalty state, for the next micro-batch to free
  std::map<uint64_t, ScheduledMicroBatch> in_flight;  // by micro-batch id
  uint64_t next_batch = 1;
  std::mt19937_64 seeds{std::random_device{}()};
  // Declared after `sequences`: destroyed first, so every queued fill finishes while its matcher lives.
  MaskFiller masks{1};
  bool device_lost = false;

  // Shared with Submit and Stats.
  mutable std::mutex mutex;
  std::condition_variable wake;
  std::deque<std::unique_ptr<Sequence>> incoming;
  uint64_t next_id = 1;
  bool stopping = false;
  bool refusing = false;  // a device was lost: Submit answers Unavailable
  absl::Status lost_status;
  int64_t scheduler_queued = 0;
  int64_t active = 0;
  KvBlockCounts kv;
  uint64_t preemptions = 0;
  uint64_t prefix_queried = 0;
  uint64_t prefix_hits = 0;
  uint64_t micro_batches_run = 0;
  uint64_t forced_tokens = 0;  // jump-forward
  uint64_t spec_proposed = 0;
  uint64_t spec_accepted = 0;
  uint64_t spec_verifications = 0;
  uint64_t spec_skipped_steps = 0;
  std::function<void(int64_t, int64_t)> spec_observer;
  std::ofstream spec_trace;                                        // EngineOptions::speculation_trace (engine thread)
  std::map<std::pair<std::string, std::string>, uint64_t> errors;  // (stage, device) -> failed micro-batches
  std::map<std::pair<std::string, std::string>, uint64_t> nonfinite;  // (stage, device) -> rows with NaN/inf logits
  // Requests ended kError since the last micro-batch that produced a token (EngineStats).
  int64_t failed_in_a_row = 0;
  std::function<void(int64_t)> observer;

  std::thread thread;
  OutputProcessor output;  // detokenizing, stop strings, callbacks
};

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Start(LoadedModel& model, const tokenizer::Tokenizer* tokenizer,
                                                      std::vector<int32_t> eos_ids, const EngineOptions& options) {
  if (options.micro_batches < 1) return absl::InvalidArgumentError("micro_batches: must be at least 1");
  if (options.prefill_chunk_tokens < 1) return absl::InvalidArgumentError("prefill_chunk_tokens: must be at least 1");
  if (options.max_queue < 0) return absl::InvalidArgumentError("max_queue: must not be negative");
  SchedulerOptions so;
  so.max_running = model.max_batch();
  so.kv_blocks = model.kv_blocks();
  so.block_tokens = model.kv_block_tokens();
  so.prefix_cache = options.prefix_cache;
  so.prefill_chunk_tokens = options.prefill_chunk_tokens;
  so.micro_batch_tokens = options.micro_batch_tokens;
  so.micro_batches = options.micro_batches;
  so.recompute_at = model.recompute_threshold();
  so.max_positions = model.max_context();
  if (options.speculative.method != SpeculativeOptions::Method::kNone) {
    if (absl::Status valid = ValidateSpeculativeOptions(options.speculative); !valid.ok()) return valid;
  }
  auto impl = std::make_unique<Impl>(model, tokenizer, std::move(eos_ids), options, so);
  if (!options.speculation_trace.empty()) {
    impl->spec_trace.open(options.speculation_trace, std::ios::out | std::ios::trunc);
    if (!impl->spec_trace) {
      return absl::InvalidArgumentError(
          absl::StrCat("--speculation-trace ", options.speculation_trace, ": cannot be written"));
    }
  }
  impl->kv.free = so.kv_blocks;
  ExecutorOptions eo;
  eo.stage_threads = options.stage_threads;
  eo.intra_op_threads = options.intra_op_threads;
  eo.fault = options.fault;
  eo.group = options.group;
  eo.on_group_lost = options.on_device_lost;
  absl::StatusOr<std::unique_ptr<Executor>> executor = Executor::Start(model, eo);
  if (!executor.ok()) return executor.status();
  impl->executor = *std::move(executor);
  if (options.speculative.method == SpeculativeOptions::Method::kMtp && !model.mtp()) {
    return absl::InvalidArgumentError(
        "--speculative mtp: the model was loaded without its multi-token-prediction layer (ServingRequest::mtp)");
  }
  if (options.speculative.method == SpeculativeOptions::Method::kDraft) {
    if (options.draft == nullptr) return absl::InvalidArgumentError("--speculative draft: no draft model was loaded");
    absl::StatusOr<std::unique_ptr<DraftModel>> draft =
        DraftModel::Start(*options.draft, model, options.prefill_chunk_tokens, options.intra_op_threads);
    if (!draft.ok()) return draft.status();
    impl->draft = *std::move(draft);
  }
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->Run(); });
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

Engine::~Engine() {
  {
    std::lock_guard lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->wake.notify_all();
  impl_->thread.join();  // every request has been finished and its last event queued
  impl_->output.Close();
  impl_->executor.reset();
}

int64_t Engine::max_context() const { return impl_->model.max_context(); }
int64_t Engine::kv_cache_tokens() const { return impl_->model.kv_blocks() * impl_->model.kv_block_tokens(); }
int64_t Engine::vocab_size() const { return impl_->model.vocab_size(); }

void Engine::SetMicroBatchObserver(std::function<void(int64_t rows)> observer) {
  std::lock_guard lock(impl_->mutex);
  impl_->observer = std::move(observer);
}

void Engine::SetMaskObserver(std::function<void(double seconds)> observer) {
  impl_->masks.SetObserver(std::move(observer));
}

void Engine::SetSpeculationObserver(std::function<void(int64_t proposed, int64_t accepted)> observer) {
  std::lock_guard lock(impl_->mutex);
  impl_->spec_observer = std::move(observer);
}

absl::StatusOr<std::shared_ptr<RequestHandle>> Engine::Submit(GenerationRequest request, ChunkCallback callback) {
  auto sequence = std::make_unique<Sequence>();
  sequence->tokens = request.prompt;
  sequence->request = std::move(request);
  sequence->callback = std::move(callback);
  sequence->handle = std::make_shared<RequestHandle>();
  std::shared_ptr<RequestHandle> handle = sequence->handle;
  {
    std::lock_guard lock(impl_->mutex);
    if (impl_->stopping) return absl::UnavailableError("the engine is shutting down");
    if (impl_->refusing) {
      return absl::UnavailableError(absl::StrCat("the engine lost a device: ", impl_->lost_status.message()));
    }
    const int64_t queued = static_cast<int64_t>(impl_->incoming.size()) + impl_->scheduler_queued;
    if (queued >= impl_->options.max_queue) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "queue full: ", queued, " requests wait for a slot (--max-queue ", impl_->options.max_queue, ")"));
    }
    sequence->id = impl_->next_id++;
    impl_->incoming.push_back(std::move(sequence));
  }
  impl_->wake.notify_all();
  return handle;
}

EngineStats Engine::Stats() const {
  EngineStats stats;
  {
    std::lock_guard lock(impl_->mutex);
    stats.queued = static_cast<int64_t>(impl_->incoming.size()) + impl_->scheduler_queued;
    stats.active = impl_->active;
    stats.kv_used = impl_->kv.used;
    stats.kv_cached = impl_->kv.cached;
    stats.kv_free = impl_->kv.free;
    stats.preemptions = impl_->preemptions;
    stats.prefix_queried_tokens = impl_->prefix_queried;
    stats.prefix_hit_tokens = impl_->prefix_hits;
    stats.micro_batches_run = impl_->micro_batches_run;
    stats.forced_tokens = impl_->forced_tokens;
    stats.spec_proposed_tokens = impl_->spec_proposed;
    stats.spec_accepted_tokens = impl_->spec_accepted;
    stats.spec_verifications = impl_->spec_verifications;
    stats.spec_skipped_steps = impl_->spec_skipped_steps;
    stats.spec_method = SpeculativeMethodName(impl_->options.speculative.method);
    stats.device_lost = impl_->refusing;
    stats.failed_in_a_row = impl_->failed_in_a_row;
    for (const auto& [where, count] : impl_->errors) stats.errors.push_back({where.first, where.second, count});
    for (const auto& [where, count] : impl_->nonfinite)
      stats.nonfinite_logits.push_back({where.first, where.second, count});
  }
  const MaskFiller::Totals masks = impl_->masks.totals();
  stats.masks_filled = masks.filled;
  stats.mask_fill_seconds = masks.seconds;
  stats.max_running = impl_->model.max_batch();
  stats.kv_devices = impl_->model.report().kv_devices;
  stats.kv_blocks = impl_->model.kv_blocks();
  stats.kv_block_tokens = impl_->model.kv_block_tokens();
  stats.stages = impl_->executor->Busy();
  stats.transfers = impl_->executor->Transfers();
  stats.refused_connections = impl_->executor->RefusedConnections();
  return stats;
}

void Engine::Impl::Emit(OutputEvent event) { output.Emit(std::move(event)); }

std::vector<std::optional<GeneratedToken>> Engine::Impl::TakePromptLogprobs(Sequence& s) {
  if (s.request.sampling.prompt_logprobs < 0 || s.prompt_logprobs_sent) return {};
  s.prompt_logprobs_sent = true;
  return std::move(s.prompt_logprobs);
}

void Engine::Impl::Admit() {
  std::deque<std::unique_ptr<Sequence>> arrived;
  {
    std::lock_guard lock(mutex);
    arrived.swap(incoming);
  }
  for (std::unique_ptr<Sequence>& s : arrived) {
    const SamplingParams& p = s->request.sampling;
    const uint64_t seed = p.seed ? *p.seed : seeds();
    s->random.seed(seed);
    s->draft_random.seed(seed ^ 0x9e3779b97f4a7c15ull);
    s->accept_random.seed(seed ^ 0xd1b54a32d192ed03ull);
    if (options.speculative.method != SpeculativeOptions::Method::kNone && p.speculative) {
      s->speculation.emplace(options.speculative);
    }
    auto stream = std::make_unique<OutputStream>();
    stream->callback = std::move(s->callback);
    stream->stopped = s->stopped;
    if (tokenizer != nullptr) stream->decoder.emplace(*tokenizer, /*skip_special_tokens=*/true);
    if (s->request.grammar != nullptr) {
      s->matcher.emplace(s->request.grammar);
      stream->grammar = s->request.grammar;
    }
    if (!p.stop.empty() && stream->grammar != nullptr) {
      // A constrained request stops at a stop string only where the output before it is a whole sentence of
      // its grammar (vLLM would cut a JSON object in half).
      stream->stop.emplace(p.stop, [grammar = stream->grammar](std::string_view before) {
        return structured::Completes(*grammar, std::string(before));
      });
    } else if (!p.stop.empty()) {
      stream->stop.emplace(p.stop);
    }
    stream->min_tokens = p.min_tokens;
    stream->prompt_tokens = static_cast<int64_t>(s->request.prompt.size());
    Emit(OpenStream{s->id, std::move(stream)});
    // Prompt log-probabilities need the logits of every prompt position: nothing is taken from the
    // prefix cache.
    if (p.prompt_logprobs >= 0) s->prompt_logprobs.resize(s->request.prompt.size());
    scheduler.Add(s->id, s->tokens, /*reuse_prefix=*/p.prompt_logprobs < 0);
    if (device_lost) Finish(*s, FinishReason::kError, lost_status);
    sequences.emplace(s->id, std::move(s));
  }
}

void Engine::Impl::Publish() {
  std::lock_guard lock(mutex);
  scheduler_queued = scheduler.queued();
  active = scheduler.running();
  kv = scheduler.blocks().counts();
  preemptions = scheduler.preemptions();
  prefix_queried = scheduler.prefix_queried_tokens();
  prefix_hits = scheduler.prefix_hit_tokens();
}

MicroBatchWork Engine::Impl::Build(uint64_t id, const ScheduledMicroBatch& batch) {
  MicroBatchWork work;
  work.id = id;
  work.released = std::move(released);
  released.clear();
  for (const ScheduledRow& row : batch.rows) {
    Sequence& s = *sequences.at(row.sequence);
    const SamplingParams& p = s.request.sampling;
    BatchRow r;
    r.blocks = row.blocks;
    r.start = row.start;
    r.length = row.length;
    r.tokens.assign(s.tokens.begin() + row.start, s.tokens.begin() + row.start + row.count - row.draft);
    if (row.draft > 0) {
      r.tokens.insert(r.tokens.end(), s.draft.begin(), s.draft.begin() + row.draft);
      r.verify = static_cast<int32_t>(row.draft);
    }
    if (row.admitted) s.draft_computed = 0;  // its blocks' draft cache is not (all) its own
    r.samples = row.samples;
    if (!row.samples && row.start + row.count < static_cast<int64_t>(s.tokens.size())) {
      r.mtp_next = s.tokens[static_cast<size_t>(row.start + row.count)];  // a prompt chunk's next token
    }
    // An MTP layer's proposal is the next step's: wanted only where the sequence may propose then.
    r.mtp_wanted = s.speculation.has_value() && !s.speculation->Paused();
    const int64_t prompt = static_cast<int64_t>(s.request.prompt.size());
    if (p.prompt_logprobs >= 0 && !s.prompt_logprobs_sent) {
      // Position q's logits score prompt token q + 1; the last prompt position's choose the first new token.
      r.prompt_logprobs = p.prompt_logprobs;
      for (int64_t q = row.start; q < std::min(row.start + row.count, prompt - 1); ++q) {
        r.prompt_targets.push_back(s.tokens[q + 1]);
      }
    }
    if (row.samples) {
      r.sampling.temperature = p.temperature;
      r.sampling.top_k = p.top_k;
      r.sampling.top_p = p.top_p;
      r.sampling.repetition_penalty = p.repetition_penalty;
      r.sampling.frequency_penalty = p.frequency_penalty;
      r.sampling.presence_penalty = p.presence_penalty;
      r.sampling.logit_bias = p.logit_bias;
      if (!p.ignore_eos && s.generated < p.min_tokens && !s.matcher) {
        // vLLM's min_tokens: the EOS ids cannot be sampled yet (a grammar's end is not held back: it may allow
        // nothing else).
        for (int32_t eos : eos_ids) r.sampling.logit_bias.emplace_back(eos, -std::numeric_limits<float>::infinity());
      }
      if (row.draft > 0) {
        // Position j of the proposal draws what generated token s.generated + j would: left in place until emitted.
        r.verify_uniforms = s.PeekDraws(static_cast<size_t>(row.draft) + 1);
        r.sampling.uniform = r.verify_uniforms.back();
        r.verify_uniforms.pop_back();
        const size_t vocab = static_cast<size_t>(model.vocab_size());
        if (s.draft_probs.size() >= static_cast<size_t>(row.draft) * vocab) {
          // A draft model's sampled proposal: verified by rejection against the distributions it was drawn from.
          r.verify_draft_probs.assign(s.draft_probs.begin(), s.draft_probs.begin() + row.draft * vocab);
          for (int64_t j = 0; j < row.draft; ++j) {
            r.verify_accept_uniforms.push_back(std::uniform_real_distribution<double>(0.0, 1.0)(s.accept_random));
          }
        }
      } else {
        r.sampling.uniform = s.Draw();
      }
      r.sampling.top_logprobs = p.top_logprobs;
      if (s.matcher && row.draft > 0) {
        // A verified row: a mask per position, each after the proposals before it (the mask thread accepts them in
        // turn and rolls the matcher back); the last one is the row's own and what SettleMask waits for.
        s.ready_mask.reset();
        std::vector<std::shared_ptr<AllowedTokens>> positions;
        for (int64_t j = 0; j <= row.draft; ++j) {
          positions.push_back(std::make_shared<AllowedTokens>(structured::MaskWords(model.vocab_size())));
        }
        r.verify_allowed.assign(positions.begin(), positions.end() - 1);
        s.pending_mask = positions.back();
        r.sampling.allowed = s.pending_mask;
        masks.FillVerified(&*s.matcher, std::vector<int32_t>(s.draft.begin(), s.draft.begin() + row.draft),
                           std::move(positions));
      } else if (s.ready_mask != nullptr) {
        r.sampling.allowed = std::move(s.ready_mask);
        s.ready_mask.reset();
      } else if (s.matcher) {
        s.pending_mask = std::make_shared<AllowedTokens>(structured::MaskWords(model.vocab_size()));
        r.sampling.allowed = s.pending_mask;
        masks.Fill(&*s.matcher, s.pending_mask);
      }
      if (p.repetition_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f) {
        r.sequence = s.id;
        r.penalty_reset = s.penalty_sent == 0;
        const auto from = s.tokens.begin() + static_cast<std::ptrdiff_t>(s.penalty_sent);
        if (p.repetition_penalty != 1.0f) r.penalty_tokens.assign(from, s.tokens.end());
        r.output_tokens.assign(std::max(from, s.tokens.begin() + prompt), s.tokens.end());
        s.penalty_sent = s.tokens.size();
      }
    }
    work.rows.push_back(std::move(r));
  }
  return work;
}

void Engine::Impl::Finish(Sequence& s, FinishReason reason, const absl::Status& error) {
  if (s.done) return;
  s.done = true;
  scheduler.Finish(s.id);
  if (reason == FinishReason::kError) {
    std::lock_guard lock(mutex);
    ++failed_in_a_row;
  }
  // A Status of its own for the output thread: a copy would share its reference-counted payload with the
  // micro-batch's result, which this thread drops while the output thread copies it into a chunk (the
  // count is atomic, but Debian's Abseil frees the payload where ThreadSanitizer cannot see the order).
  absl::Status own = error.ok() ? absl::OkStatus() : absl::Status(error.code(), error.message());
  Emit(SequenceStep{s.id, std::nullopt, reason, std::move(own), {}});
}

void Engine::Impl::LoseDevice(const absl::Status& status) {
  if (device_lost) return;
  device_lost = true;
  {
    std::lock_guard lock(mutex);
    refusing = true;
    lost_status = status;
  }
  std::cerr << "strata engine: a device is unusable, no more requests are served: " << status.message() << "\n";
  // First the callback (the server reports NOT_SERVING), then the requests end: a client that sees its
  // INTERNAL finds the server already unhealthy.
  if (options.on_device_lost) options.on_device_lost(status);
  for (auto& [id, s] : sequences) Finish(*s, FinishReason::kError, status);
}

void Engine::Impl::Process(MicroBatchResult result) {
  auto node = in_flight.extract(result.id);
  ScheduledMicroBatch& schedule = node.mapped();
  if (auto sent = submitted.extract(result.id); !sent.empty() && result.status.ok()) {
    costs.RecordPass(schedule.tokens(),
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - sent.mapped()).count());
  }
  if (!result.status.ok()) {
    std::cerr << "strata engine: " << result.status.message() << "\n";
    {
      std::lock_guard lock(mutex);
      ++errors[{result.failed_stage, result.failed_device}];
    }
    for (const ScheduledRow& row : schedule.rows)
      Finish(*sequences.at(row.sequence), FinishReason::kError, result.status);
    if (result.device_lost) LoseDevice(result.status);
    scheduler.Complete(schedule);
    return;
  }
  bool produced = false;
  for (size_t r = 0; r < schedule.rows.size(); ++r) {
    ScheduledRow& row = schedule.rows[r];
    Sequence& s = *sequences.at(row.sequence);
    if (s.done) continue;
    if (r < result.row_errors.size() && !result.row_errors[r].ok()) {
      // The request id is the client's: escaped, so that it cannot forge log lines or send terminal controls.
      std::cerr << "strata engine: request \"" << absl::CHexEscape(s.request.request_id)
                << "\": " << result.row_errors[r].message() << "\n";
      {
        std::lock_guard lock(mutex);
        ++nonfinite[{result.last_stage, result.last_device}];
      }
      Finish(s, FinishReason::kError, result.row_errors[r]);
      continue;
    }
    if (r < result.prompt_logprobs.size() && !s.prompt_logprobs_sent) {
      for (size_t j = 0; j < result.prompt_logprobs[r].size(); ++j) {
        s.prompt_logprobs.at(static_cast<size_t>(row.start) + j + 1) = std::move(result.prompt_logprobs[r][j]);
      }
    }
    if (!result.tokens[r]) continue;
    produced = true;
    if (s.request.sampling.max_new_tokens <= 0) {
      // Prefill alone (to score the prompt): the token chosen is dropped.
      s.done = true;
      scheduler.Finish(s.id);
      Emit(SequenceStep{s.id, std::nullopt, FinishReason::kLength, absl::OkStatus(), TakePromptLogprobs(s)});
      continue;
    }
    GeneratedToken& token = *result.tokens[r];
    if (row.draft > 0) {
      if (r >= result.verified.size() || result.verified[r].size() != static_cast<size_t>(row.draft)) {
        Finish(s, FinishReason::kError, absl::InternalError("a verified row came back without its verified tokens"));
        continue;
      }
      AcceptVerified(s, row, result.verified[r], std::move(token));
      KeepMtpProposal(s, row, result, r);
      continue;
    }
    KeepMtpProposal(s, row, result, r);
    // A draft model's cache holds the fed tokens this step kept (AcceptVerified: also the accepted proposals).
    s.draft_computed = std::min(s.draft_computed, row.start + row.count);
    if (!AppendChosen(s, std::move(token)) && s.matcher && options.jump_forward) JumpForward(s);
  }
  if (produced) {
    // A forward pass produced a token: the engine works (again).
    std::lock_guard lock(mutex);
    failed_in_a_row = 0;
  }
  scheduler.Complete(schedule);
}

bool Engine::Impl::Append(Sequence& s, GeneratedToken token, std::optional<FinishReason> finish) {
  s.tokens.push_back(token.id);
  ++s.generated;
  if (!s.request.sampling.ignore_eos && eos_ids.contains(token.id)) finish = FinishReason::kEos;
  if (!finish && s.generated >= s.request.sampling.max_new_tokens) finish = FinishReason::kLength;
  if (finish) {
    s.done = true;
    scheduler.Finish(s.id);
  } else {
    scheduler.Append(s.id);
  }
  Emit(SequenceStep{s.id, std::move(token), finish, absl::OkStatus(), TakePromptLogprobs(s)});
  return finish.has_value();
}

// Jump-forward, exact: where the grammar allows exactly one id, the sampler could choose nothing else (every other
// logit is -inf: probability 1, greedy or sampled; its log-probability 0), so it is appended without a forward pass
// of its own and the next forward feeds the forced ids together, as a chunk. Each skipped step draws the uniform it
// would have drawn, so seeded outputs are unchanged: the ids are those of decoding without it. (The forced text is
// not re-tokenized, SGLang's way, which changes ids.) A mask with several ids is kept for the next step.
void Engine::Impl::JumpForward(Sequence& s) {
  const int64_t vocab = model.vocab_size();
  while (true) {
    auto mask = std::make_shared<AllowedTokens>(structured::MaskWords(vocab));
    s.matcher->FillMask(mask->data());
    mask->MarkReady();
    std::optional<int32_t> only;
    const std::vector<int32_t>& words = mask->Get();
    for (size_t w = 0; w < words.size(); ++w) {
      if (words[w] == 0) continue;
      const uint32_t bits = static_cast<uint32_t>(words[w]);
      if (only || (bits & (bits - 1)) != 0) {
        only.reset();
        s.ready_mask = std::move(mask);
        return;
      }
      only = static_cast<int32_t>(w * 32 + static_cast<size_t>(__builtin_ctz(bits)));
    }
    if (!only || *only >= vocab || !s.matcher->Accept(*only)) {
      s.ready_mask = std::move(mask);
      return;
    }
    s.Draw();  // the skipped step's draw
    GeneratedToken token;
    token.id = *only;
    if (s.request.sampling.top_logprobs > 0) token.top.emplace_back(*only, 0.0);
    {
      std::lock_guard lock(mutex);
      ++forced_tokens;
    }
    if (Append(s, std::move(token), s.matcher->Ended() ? std::optional(FinishReason::kEos) : std::nullopt)) return;
  }
}

void Engine::Impl::Propose() {
  const SpeculativeOptions& o = options.speculative;
  // The sequences that may propose this step, with how many tokens (an n-gram proposal is made here already, to
  // know its length), and the decoding rows the next pass feeds.
  struct Candidate {
    Sequence* s = nullptr;
    int64_t room = 0;
  };
  std::vector<Candidate> candidates;
  int64_t rows = 0;
  int64_t proposed = 0;
  for (auto& [id, s] : sequences) {
    if (s->done || scheduler.InFlight(id) || s->generated == 0) continue;
    ++rows;
    const SamplingParams& p = s->request.sampling;
    if (!s->speculation) continue;
    if (draft != nullptr && !s->draft.empty() && s->draft_for == s->tokens.size()) continue;  // proposed, unverified
    int64_t room = std::min<int64_t>(o.tokens, p.max_new_tokens - s->generated - 1);
    // Before min_tokens every verified position bans the EOS ids (Build's logit_bias): the proposal stops where the
    // ban would end, so that no position needs a ban of its own.
    if (!p.ignore_eos && s->generated < p.min_tokens) room = std::min<int64_t>(room, p.min_tokens - s->generated - 1);
    if (room < 1 || !s->speculation->MayPropose()) {
      scheduler.Propose(id, 0);
      continue;
    }
    if (o.method == SpeculativeOptions::Method::kMtp) {
      // One token: the layer's proposal after the sequence's last token, when the last pass made one there.
      s->draft.clear();
      if (s->mtp_proposal >= 0 && s->mtp_for == s->tokens.size()) s->draft.push_back(s->mtp_proposal);
      if (s->matcher && !s->draft.empty()) s->draft.resize(GrammarKeeps(*s, s->draft));
      room = static_cast<int64_t>(s->draft.size());
      if (room == 0) {
        scheduler.Propose(id, 0);
        continue;
      }
    } else if (draft == nullptr) {
      s->draft = ProposeNgram(s->tokens, o.ngram_min, o.ngram_max, static_cast<int32_t>(room));
      if (s->matcher) s->draft.resize(GrammarKeeps(*s, s->draft));
      room = static_cast<int64_t>(s->draft.size());
    }
    candidates.push_back({s.get(), room});
    proposed += room;
  }
  if (proposed == 0) {
    for (const Candidate& c : candidates) scheduler.Propose(c.s->id, 0);
    return;
  }
  if (o.cost_aware) {
    // The sequences most likely to keep their proposals first; how many of them propose is what the measured pass
    // (and draft) times say pays best (speculation.h, ProposersThatPay).
    std::stable_sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
      return a.s->speculation->expected_rate() > b.s->speculation->expected_rate();
    });
    std::vector<ProposalCandidate> weighed;
    for (const Candidate& c : candidates) {
      weighed.push_back({c.room, c.s->speculation->expected_rate() * static_cast<double>(c.room)});
    }
    int64_t proposers = ProposersThatPay(costs, rows, weighed, draft != nullptr);
    switch (probes.Next(proposers)) {
      case CostProbes::Step::kPropose:
        break;
      case CostProbes::Step::kProbe:
        proposers = 1;  // the likeliest
        break;
      case CostProbes::Step::kSkip:
      case CostProbes::Step::kPlain: {
        for (const Candidate& c : candidates) scheduler.Propose(c.s->id, 0);
        if (proposers == 0) {
          std::lock_guard lock(mutex);
          ++spec_skipped_steps;
        }
        return;
      }
    }
    for (size_t i = static_cast<size_t>(proposers); i < candidates.size(); ++i) {
      scheduler.Propose(candidates[i].s->id, 0);
    }
    candidates.resize(static_cast<size_t>(proposers));
  }
  if (draft == nullptr) {
    for (const Candidate& c : candidates) scheduler.Propose(c.s->id, c.room);
    return;
  }
  std::vector<DraftRequest> requests;
  std::vector<Sequence*> drafted;
  for (const Candidate& c : candidates) {
    Sequence& s = *c.s;
    const SamplingParams& p = s.request.sampling;
    DraftRequest request;
    request.count = scheduler.ReserveProposal(s.id, c.room, &request.blocks);
    if (request.count < 1) continue;
    request.tokens = &s.tokens;
    request.computed = s.draft_computed;
    request.temperature = p.temperature;
    request.top_k = p.top_k;
    request.top_p = p.top_p;
    request.random = &s.draft_random;
    if (s.matcher) {
      s.SettleMask();
      request.matcher = &*s.matcher;
    }
    drafted.push_back(&s);
    requests.push_back(std::move(request));
  }
  if (requests.empty()) return;
  const auto started = std::chrono::steady_clock::now();
  absl::StatusOr<std::vector<DraftProposal>> proposals = draft->Propose(requests);
  if (!proposals.ok()) {
    // Speculation is an optimisation: the sequences decode without a proposal (and their draft caches start
    // again), unless the draft's failure left the device unusable.
    std::cerr << "strata engine: " << proposals.status().message() << "\n";
    for (Sequence* s : drafted) s->draft_computed = 0;
    if (draft->device_lost()) LoseDevice(proposals.status());
    return;
  }
  costs.RecordDraft(static_cast<int64_t>(requests.size()),
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  for (size_t i = 0; i < drafted.size(); ++i) {
    Sequence& s = *drafted[i];
    s.draft = std::move((*proposals)[i].tokens);
    s.draft_probs = std::move((*proposals)[i].probs);  // (under a grammar, chosen under its masks: nothing to cut)
    s.draft_computed = requests[i].computed;
    s.draft_for = s.tokens.size();
    scheduler.Propose(s.id, static_cast<int64_t>(s.draft.size()));
  }
}

size_t Engine::Impl::GrammarKeeps(Sequence& s, const std::vector<int32_t>& proposal) {
  s.SettleMask();
  int32_t valid = 0;
  bool ended = false;
  while (!ended && static_cast<size_t>(valid) < proposal.size() &&
         s.matcher->Accept(proposal[static_cast<size_t>(valid)])) {
    ++valid;
    ended = s.matcher->Ended();  // an EOS id: the sequence would end there
  }
  s.matcher->Rollback(valid);
  return ended ? static_cast<size_t>(valid) : std::min(proposal.size(), static_cast<size_t>(valid) + 1);
}

bool Engine::Impl::AppendChosen(Sequence& s, GeneratedToken token) {
  std::optional<FinishReason> finish;
  if (s.matcher) {
    s.SettleMask();
    if (!s.matcher->Accept(token.id)) {
      // The mask allowed only what the grammar accepts: this is a fault, not the client's.
      Finish(s, FinishReason::kError,
             absl::InternalError(absl::StrCat("the sampler chose token ", token.id, ", which the grammar forbids")));
      return true;
    }
    // The grammar ended (it accepted an EOS id): nothing may follow, whatever ignore_eos says.
    if (s.matcher->Ended()) finish = FinishReason::kEos;
  }
  return Append(s, std::move(token), finish);
}

void Engine::Impl::KeepMtpProposal(Sequence& s, const ScheduledRow& row, const MicroBatchResult& result, size_t r) {
  if (r >= result.mtp.size() || result.mtp[r].size() != static_cast<size_t>(row.draft) + 1) {
    s.mtp_proposal = -1;
    return;
  }
  // The row's positions chose c_0, c_1, ...: the sequence kept c_0 .. c_accepted, after which the layer proposed
  // mtp[r][accepted].
  const size_t j = static_cast<size_t>(row.accepted);
  s.mtp_proposal = result.mtp[r][j];
  s.mtp_for = static_cast<size_t>(row.start + row.count - row.draft) + j + 1;
}

void Engine::Impl::AcceptVerified(Sequence& s, ScheduledRow& row, std::vector<GeneratedToken>& verified,
                                  GeneratedToken last) {
  int64_t accepted = 0;
  bool ended = false;
  for (size_t j = 0; j < verified.size() && !ended; ++j) {
    const bool agrees = verified[j].id == s.draft.at(j);
    s.Draw();  // this position's draw, used
    ended = AppendChosen(s, std::move(verified[j]));
    if (!agrees) break;
    ++accepted;
  }
  if (!ended && accepted == row.draft) {
    s.Draw();
    ended = AppendChosen(s, std::move(last));
  }
  row.accepted = accepted;
  s.draft_computed = std::min(s.draft_computed, row.start + row.count - row.draft + accepted);
  s.speculation->Record(static_cast<int32_t>(row.draft), static_cast<int32_t>(accepted));
  std::function<void(int64_t, int64_t)> observe;
  {
    std::lock_guard lock(mutex);
    spec_proposed += static_cast<uint64_t>(row.draft);
    spec_accepted += static_cast<uint64_t>(accepted);
    ++spec_verifications;
    observe = spec_observer;
  }
  if (observe) observe(row.draft, accepted);
  if (spec_trace.is_open()) {
    spec_trace << "{\"sequence\": " << s.id << ", \"at\": " << row.start + row.count - row.draft << ", \"proposed\": ["
               << absl::StrJoin(s.draft.begin(), s.draft.begin() + row.draft, ", ") << "], \"accepted\": " << accepted
               << "}\n";
    spec_trace.flush();
  }
  if (!ended && s.matcher && options.jump_forward) JumpForward(s);
}

void Engine::Impl::Run() {
  while (true) {
    Admit();
    bool stop_now;
    {
      std::lock_guard lock(mutex);
      stop_now = stopping;
    }
    // Cancelled (or, at shutdown, every) request leaves now, as does one the output thread ended with a
    // stop string: its blocks are free as soon as it is not in a micro-batch still flowing through the stages.
    for (auto& [id, s] : sequences) {
      if (s->done) continue;
      if (stop_now || s->handle->cancelled()) {
        Finish(*s, FinishReason::kCancelled);
      } else if (s->stopped->load(std::memory_order_acquire)) {
        Finish(*s, FinishReason::kStop);  // the output thread already sent the final chunk
      }
    }
    for (auto it = sequences.begin(); it != sequences.end();) {
      if (!it->second->done || scheduler.InFlight(it->first)) {
        ++it;
        continue;
      }
      it->second->SettleMask();
      if (it->second->penalty_sent > 0) released.push_back(it->first);
      it = sequences.erase(it);
    }
    if (!stop_now && !device_lost) {
      if (options.speculative.method != SpeculativeOptions::Method::kNone) Propose();
      while (scheduler.in_flight() < options.micro_batches) {
        std::optional<ScheduledMicroBatch> next = scheduler.Next();
        if (!next) break;
        const uint64_t id = next_batch++;
        MicroBatchWork work = Build(id, *next);
        std::function<void(int64_t)> observe;
        {
          std::lock_guard lock(mutex);
          ++micro_batches_run;
          observe = observer;
        }
        if (observe) observe(static_cast<int64_t>(next->rows.size()));
        in_flight.emplace(id, *std::move(next));
        submitted[id] = std::chrono::steady_clock::now();
        executor->Submit(std::move(work));
      }
    }
    Publish();
    if (scheduler.in_flight() == 0) {
      if (stop_now) return;
      std::unique_lock lock(mutex);
      // Woken by a submission or shutdown; the timeout notices cancellations of queued requests.
      wake.wait_for(lock, std::chrono::milliseconds(20), [&] { return stopping || !incoming.empty(); });
      continue;
    }
    Process(executor->WaitCompleted());
  }
}

}  // namespace strata::runtime
