#pragma once
// Internal (ATen): micro-batch pipelining across the stages (GUIDE.md, Pipelining). One worker thread
// per stage, each with a queue: a micro-batch enters stage 0's queue, each worker runs its stage and
// hands the activation to the next stage's queue, and the last stage's output lands in `completed`.
// With several micro-batches in flight, stage s works on micro-batch m while stage s+1 works on m-1. A worker
// that finishes a CPU stage with nothing queued runs the next CPU stage itself when that one is idle
// (ChainNext): a lone micro-batch gains nothing from changing threads, and each change costs a wake-up.
//
// Worker threads (rather than one launcher issuing async CUDA work in wavefront order) because the same
// code must overlap CPU stages, where there is no asynchronous queue to issue into; on CUDA a worker's
// launches go to its stage's stream, and transfers wait on events, so GPU work overlaps as well.

#include <ATen/core/Tensor.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "runtime/executor/executor.h"
#include "runtime/executor/pipeline.h"
#include "runtime/executor/sampler.h"

namespace strata::runtime {

struct MicroBatch {
  MicroBatchWork work;
  ForwardBatch batch;       // packed: decode rows and prefill chunks of any length together
  SamplingInputs sampling;  // the rows that sample, staged with the batch
  // The sampling rows of BatchRow::verify positions before a row's last (the row's sampling with that position's
  // draw): SamplingInputs stages from pointers to them.
  std::deque<BatchRow> verify_rows;
  int64_t sampling_rows = 0;
  // host int64 [sampling_rows]: the sampling rows' places among the logits (rows grouped by length);
  // undefined when those are exactly the sampling rows, in order
  at::Tensor sample_index;
  StageActivation activation;  // after the last stage: float32 logits [rows, vocab]
  PendingSamples samples;      // after the last stage: the sampler's results on their way to the host
  // Prompt log-probabilities (BatchRow::prompt_targets): host int64 [scored] places among the logits and
  // the tokens they score; undefined when no row asks. score_top[i]: how many top tokens entry i keeps.
  at::Tensor score_index;
  at::Tensor score_targets;
  std::vector<int32_t> score_top;
  std::vector<size_t> score_first;  // per row: its first entry (rows are scored group after group)
  PendingSamples scores;            // after the last stage: on their way to the host
  // A multi-token-prediction layer (Pipeline::mtp): host int64 [tokens] each fed token's next token (the next fed one;
  // at a sampled position overwritten by the token chosen there), host int64 [sampling_rows] the packed positions of
  // the sampling rows, and after the last stage their proposals on the way to the host.
  at::Tensor mtp_next;
  at::Tensor mtp_rows;
  // Of those, the ones whose proposals are wanted (BatchRow::mtp_wanted; host int64), and per sampling row its index
  // among them or -1.
  at::Tensor mtp_heads;
  std::vector<int64_t> mtp_head_of;
  PendingSamples mtp;
  std::exception_ptr error;  // a stage threw (the batch skips the remaining stages)
  size_t failed_stage = 0;
  // A group (group.h): the result another node sent for it, or the group's loss; WaitCompleted returns it as is.
  std::optional<MicroBatchResult> remote_result;
};

class StageWorkers {
 public:
  // `threaded`: one worker per stage; otherwise Submit runs every stage on the caller's thread (one stage
  // at a time, as accelerate runs a dispatched model). `intra_op_threads` > 0 sets LibTorch's intra-op
  // thread count in each worker. `after_last` runs on the last stage's worker, on its stream, after the
  // last stage (the sampler). `fault` arms the test seam (executor.h).
  // A group's pipeline has other nodes' stages (Stage::local false): no worker runs them here; a micro-batch whose
  // next stage is one of them goes to `hand_off` (which sends it there) instead of that stage's queue.
  StageWorkers(Pipeline& pipeline, bool threaded, int intra_op_threads, std::function<void(MicroBatch&)> after_last,
               std::optional<FaultInjection> fault,
               std::function<void(size_t stage, std::unique_ptr<MicroBatch>)> hand_off = {});
  ~StageWorkers();

  void Submit(std::unique_ptr<MicroBatch> batch);
  // A group: a micro-batch that arrived from another node, for local stage `stage`.
  void Inject(size_t stage, std::unique_ptr<MicroBatch> batch);
  // A group: a micro-batch done elsewhere (its remote_result set), for WaitCompleted.
  void Complete(std::unique_ptr<MicroBatch> batch);
  // The next micro-batch that went through every stage; blocks until one does.
  // With a timeout: null when none completed within it.
  std::unique_ptr<MicroBatch> WaitCompleted(std::optional<std::chrono::milliseconds> timeout = std::nullopt);
  std::vector<double> BusySeconds() const;  // per stage

 private:
  struct Lane {
    std::deque<std::unique_ptr<MicroBatch>> queue;
    double busy_seconds = 0;
    bool running = false;  // a thread runs this stage now (its own worker, or the one before chaining into it)
  };
  void Work(size_t stage);
  void RunOne(size_t stage, MicroBatch& batch);
  // After `ran` ran `batch` on a worker that owns `own`: whether this thread goes on to run stage ran + 1 itself,
  // claiming it (under mutex_). Only from a CPU stage into an idle local CPU stage, and only while `own` has no
  // queued micro-batch, so no overlap is lost: handing a micro-batch to another core's sleeping thread costs a
  // wake-up per hop (a third of a 2-stage plan's decode step on a 2-vCPU VM), and a lone micro-batch gains nothing
  // from changing threads.
  bool ChainNext(size_t own, size_t ran, const MicroBatch& batch);
  // After `stage` ran (or before stage 0): the next local stage's queue, another node, or completed.
  void Forward(size_t next, std::unique_ptr<MicroBatch> batch);

  Pipeline& pipeline_;
  bool threaded_;
  int intra_op_threads_;
  std::function<void(MicroBatch&)> after_last_;
  std::optional<FaultInjection> fault_;
  std::function<void(size_t, std::unique_ptr<MicroBatch>)> hand_off_;
  int64_t fault_calls_ = 0;  // micro-batches the armed stage has started (by the thread running it: one at a time)
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<Lane> lanes_;
  std::deque<std::unique_ptr<MicroBatch>> completed_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace strata::runtime
