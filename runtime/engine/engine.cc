#include "runtime/engine/engine.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <iostream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "runtime/executor/stage_workers.h"
#include "runtime/executor/pipeline.h"
#include "runtime/executor/sampler.h"
#include "runtime/engine/scheduler.h"
#include "runtime/engine/stop_strings.h"
#include "tokenizer/streaming_decoder.h"

namespace strata::runtime {

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength: return "length";
    case FinishReason::kStop: return "stop";
    case FinishReason::kEos: return "eos";
    case FinishReason::kCancelled: return "cancelled";
  }
  return "unknown";
}

namespace {

struct Sequence {
  uint64_t id = 0;
  GenerationRequest request;
  ChunkCallback callback;
  std::shared_ptr<RequestHandle> handle;
  std::vector<int32_t> tokens;  // prompt, then generated
  int64_t generated = 0;
  std::mt19937_64 random;
  std::optional<tokenizer::StreamingDecoder> decoder;
  std::optional<StopStringMatcher> stop;
  bool done = false;
};

}  // namespace

struct Engine::Impl {
  Impl(LoadedModel& m, Pipeline& p, const tokenizer::Tokenizer* t, std::vector<int32_t> eos, const EngineOptions& o,
       const SchedulerOptions& so)
      : model(m), pipeline(p), tokenizer(t), eos_ids(eos.begin(), eos.end()), options(o), scheduler(so) {}

  void Run();
  void Admit();
  void Build(MicroBatch& batch) const;
  void Process(MicroBatch& batch);
  void Finish(Sequence& sequence, FinishReason reason, GenerationChunk chunk);
  void Publish();

  LoadedModel& model;
  Pipeline& pipeline;
  const tokenizer::Tokenizer* tokenizer;
  const std::set<int32_t> eos_ids;
  const EngineOptions options;

  // Engine thread only.
  Scheduler scheduler;
  std::map<uint64_t, std::unique_ptr<Sequence>> sequences;
  std::mt19937_64 seeds{std::random_device{}()};
  std::unique_ptr<StageWorkers> workers;

  // Shared with Submit and Stats.
  mutable std::mutex mutex;
  std::condition_variable wake;
  std::deque<std::unique_ptr<Sequence>> incoming;
  uint64_t next_id = 1;
  bool stopping = false;
  int64_t scheduler_queued = 0;
  int64_t active = 0;
  int64_t free_slots = 0;
  uint64_t micro_batches_run = 0;
  std::function<void(int64_t)> observer;

  std::thread thread;
};

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Start(LoadedModel& model, const tokenizer::Tokenizer* tokenizer,
                                                     std::vector<int32_t> eos_ids, const EngineOptions& options) {
  if (options.micro_batches < 1) return absl::InvalidArgumentError("micro_batches: must be at least 1");
  if (options.prefill_chunk_tokens < 1) return absl::InvalidArgumentError("prefill_chunk_tokens: must be at least 1");
  if (options.max_queue < 0) return absl::InvalidArgumentError("max_queue: must not be negative");
  SchedulerOptions so;
  so.slots = model.max_batch();
  so.max_context = model.max_context();
  so.prefill_chunk_tokens = options.prefill_chunk_tokens;
  so.micro_batch_tokens = options.micro_batch_tokens;
  so.micro_batches = options.micro_batches;
  auto impl = std::make_unique<Impl>(model, model.pipeline(), tokenizer, std::move(eos_ids), options, so);
  impl->free_slots = so.slots;
  impl->workers = std::make_unique<StageWorkers>(impl->pipeline, options.stage_threads, options.intra_op_threads);
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
  impl_->thread.join();
  impl_->workers.reset();
}

int64_t Engine::max_context() const { return impl_->model.max_context(); }
int64_t Engine::vocab_size() const { return impl_->model.vocab_size(); }

void Engine::SetMicroBatchObserver(std::function<void(int64_t rows)> observer) {
  std::lock_guard lock(impl_->mutex);
  impl_->observer = std::move(observer);
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
    const int64_t queued = static_cast<int64_t>(impl_->incoming.size()) + impl_->scheduler_queued;
    if (queued >= impl_->options.max_queue) {
      return absl::ResourceExhaustedError(
          absl::StrCat("queue full: ", queued, " requests wait for a slot (--max-queue ", impl_->options.max_queue, ")"));
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
    stats.free_slots = impl_->free_slots;
    stats.micro_batches_run = impl_->micro_batches_run;
  }
  stats.slots = impl_->model.max_batch();
  const std::vector<double> busy = impl_->workers->BusySeconds();
  const std::vector<Stage>& stages = impl_->pipeline.stages();
  for (size_t s = 0; s < stages.size(); ++s) {
    stats.stages.push_back({stages[s].label, stages[s].device.str(), busy[s]});
  }
  return stats;
}

void Engine::Impl::Admit() {
  std::deque<std::unique_ptr<Sequence>> arrived;
  {
    std::lock_guard lock(mutex);
    arrived.swap(incoming);
  }
  for (std::unique_ptr<Sequence>& s : arrived) {
    const SamplingParams& p = s->request.sampling;
    s->random.seed(p.seed ? *p.seed : seeds());
    if (tokenizer != nullptr) s->decoder.emplace(*tokenizer, /*skip_special_tokens=*/true);
    if (!p.stop.empty()) s->stop.emplace(p.stop);
    scheduler.Add(s->id, static_cast<int64_t>(s->tokens.size()));
    sequences.emplace(s->id, std::move(s));
  }
}

void Engine::Impl::Publish() {
  std::lock_guard lock(mutex);
  scheduler_queued = scheduler.queued();
  active = scheduler.running();
  free_slots = scheduler.free_slots();
}

void Engine::Impl::Build(MicroBatch& mb) const {
  const std::vector<ScheduledRow>& rows = mb.schedule.rows;
  const int64_t n = static_cast<int64_t>(rows.size());
  const int64_t count = rows.front().count;
  ForwardBatch& b = mb.batch;
  b.ids = at::empty({n, count}, at::kLong);
  b.positions = at::empty({n, count}, at::kLong);
  b.slots = at::empty({n}, at::kLong);
  b.last = at::empty({n}, at::kLong);
  int64_t* ids = b.ids.data_ptr<int64_t>();
  int64_t* positions = b.positions.data_ptr<int64_t>();
  b.key_length = 0;
  for (int64_t r = 0; r < n; ++r) {
    const ScheduledRow& row = rows[r];
    const Sequence& s = *sequences.at(row.sequence);
    for (int64_t j = 0; j < count; ++j) {
      ids[r * count + j] = s.tokens[row.start + j];
      positions[r * count + j] = row.start + j;
    }
    b.slots.data_ptr<int64_t>()[r] = row.slot;
    b.last.data_ptr<int64_t>()[r] = count - 1;
    b.key_length = std::max(b.key_length, row.start + count);
  }
}

void Engine::Impl::Finish(Sequence& s, FinishReason reason, GenerationChunk chunk) {
  // What the detokenizer and stop matcher still hold comes out with the last chunk, unless a stop
  // string ended the text.
  if (reason != FinishReason::kStop && reason != FinishReason::kCancelled) {
    std::string rest = s.decoder ? s.decoder->Finish() : std::string();
    if (s.stop) {
      StopStringMatcher::Result r = s.stop->Push(rest);
      chunk.text += r.text;
      if (r.stopped) {
        reason = FinishReason::kStop;
      } else {
        chunk.text += s.stop->Flush();
      }
    } else {
      chunk.text += rest;
    }
  }
  chunk.finish = reason;
  chunk.prompt_tokens = static_cast<int64_t>(s.request.prompt.size());
  chunk.completion_tokens = s.generated;
  s.done = true;
  scheduler.Finish(s.id);
  s.callback(std::move(chunk));
}

void Engine::Impl::Process(MicroBatch& mb) {
  if (mb.error) {
    try {
      std::rethrow_exception(mb.error);
    } catch (const c10::Error& e) {
      std::cerr << "strata engine: forward failed: " << e.what_without_backtrace() << "\n";
    } catch (const std::exception& e) {
      std::cerr << "strata engine: forward failed: " << e.what() << "\n";
    }
  }
  pipeline.AwaitOutput(mb.activation);
  std::vector<size_t> sampled;  // rows of the micro-batch that sample
  std::vector<RowSampling> params;
  for (size_t r = 0; r < mb.schedule.rows.size(); ++r) {
    const ScheduledRow& row = mb.schedule.rows[r];
    Sequence& s = *sequences.at(row.sequence);
    if (s.done) continue;
    if (mb.error) {
      Finish(s, FinishReason::kCancelled, {});
      continue;
    }
    if (!row.samples) continue;
    const SamplingParams& p = s.request.sampling;
    RowSampling rs;
    rs.temperature = p.temperature;
    rs.top_k = p.top_k;
    rs.top_p = p.top_p;
    rs.repetition_penalty = p.repetition_penalty;
    rs.context = &s.tokens;
    rs.uniform = std::uniform_real_distribution<double>(0.0, 1.0)(s.random);
    rs.top_logprobs = p.top_logprobs;
    sampled.push_back(r);
    params.push_back(rs);
  }
  if (!sampled.empty()) {
    std::vector<int64_t> index(sampled.begin(), sampled.end());
    at::Tensor logits = mb.activation.hidden;
    if (sampled.size() != mb.schedule.rows.size()) {
      logits = logits.index_select(
          0, at::from_blob(index.data(), {static_cast<int64_t>(index.size())}, at::kLong).to(logits.device()));
    }
    GreedyStep step = SampleRows(logits, params);
    for (size_t k = 0; k < sampled.size(); ++k) {
      Sequence& s = *sequences.at(mb.schedule.rows[sampled[k]].sequence);
      const int32_t id = static_cast<int32_t>(step.ids[k]);
      GenerationChunk chunk;
      GeneratedToken token{id, step.logprobs[k], {}};
      for (const auto& [top_id, lp] : step.top[k]) token.top.push_back({static_cast<int32_t>(top_id), lp});
      chunk.tokens.push_back(std::move(token));
      s.tokens.push_back(id);
      ++s.generated;
      std::optional<FinishReason> finish;
      if (s.decoder) {
        std::string piece = s.decoder->Step(id);
        if (s.stop) {
          StopStringMatcher::Result r = s.stop->Push(piece);
          chunk.text = std::move(r.text);
          if (r.stopped) finish = FinishReason::kStop;
        } else {
          chunk.text = std::move(piece);
        }
      }
      if (!finish && !s.request.sampling.ignore_eos && eos_ids.contains(id)) finish = FinishReason::kEos;
      if (!finish && s.generated >= s.request.sampling.max_new_tokens) finish = FinishReason::kLength;
      if (finish) {
        Finish(s, *finish, std::move(chunk));
      } else {
        scheduler.Append(s.id);
        chunk.prompt_tokens = static_cast<int64_t>(s.request.prompt.size());
        chunk.completion_tokens = s.generated;
        s.callback(std::move(chunk));
      }
    }
  }
  scheduler.Complete(mb.schedule);
}

void Engine::Impl::Run() {
  if (options.intra_op_threads > 0) at::set_num_threads(options.intra_op_threads);
  while (true) {
    Admit();
    bool stop_now;
    {
      std::lock_guard lock(mutex);
      stop_now = stopping;
    }
    // Cancelled (or, at shutdown, every) request leaves now: its slot is free as soon as it is not in a
    // micro-batch still flowing through the stages.
    for (auto& [id, s] : sequences) {
      if (!s->done && (stop_now || s->handle->cancelled())) Finish(*s, FinishReason::kCancelled, {});
    }
    for (auto it = sequences.begin(); it != sequences.end();) {
      it = it->second->done && !scheduler.InFlight(it->first) ? sequences.erase(it) : std::next(it);
    }
    if (!stop_now) {
      while (scheduler.in_flight() < options.micro_batches) {
        std::optional<ScheduledMicroBatch> next = scheduler.Next();
        if (!next) break;
        auto mb = std::make_unique<MicroBatch>();
        mb->schedule = *std::move(next);
        Build(*mb);
        std::function<void(int64_t)> observe;
        {
          std::lock_guard lock(mutex);
          ++micro_batches_run;
          observe = observer;
        }
        if (observe) observe(static_cast<int64_t>(mb->schedule.rows.size()));
        workers->Submit(std::move(mb));
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
    std::unique_ptr<MicroBatch> done = workers->WaitCompleted();
    try {
      Process(*done);
    } catch (const c10::Error& e) {
      std::cerr << "strata engine: sampling failed: " << e.what_without_backtrace() << "\n";
      for (const ScheduledRow& row : done->schedule.rows) {
        Sequence& s = *sequences.at(row.sequence);
        if (!s.done) Finish(s, FinishReason::kCancelled, {});
      }
      scheduler.Complete(done->schedule);
    }
  }
}

}  // namespace strata::runtime
