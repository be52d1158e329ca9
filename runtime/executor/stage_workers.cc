#include "runtime/executor/stage_workers.h"

#include <ATen/Parallel.h>
#include <ATen/core/LegacyTypeDispatch.h>

#include <chrono>
#include <stdexcept>
#include <utility>

#include "absl/strings/str_cat.h"

namespace strata::runtime {

StageWorkers::StageWorkers(Pipeline& pipeline, bool threaded, int intra_op_threads,
                           std::function<void(MicroBatch&)> after_last, std::optional<FaultInjection> fault,
                           std::function<void(size_t, std::unique_ptr<MicroBatch>)> hand_off)
    : pipeline_(pipeline),
      threaded_(threaded),
      intra_op_threads_(intra_op_threads),
      after_last_(std::move(after_last)),
      fault_(fault),
      hand_off_(std::move(hand_off)) {
  lanes_ = std::vector<Lane>(pipeline_.stages().size());
  if (threaded_) {
    for (size_t s = 0; s < lanes_.size(); ++s) {
      if (pipeline_.stages()[s].local) threads_.emplace_back([this, s] { Work(s); });
    }
  }
}

StageWorkers::~StageWorkers() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void StageWorkers::RunOne(size_t stage, MicroBatch& batch) {
  if (batch.error) return;
  // Inference only: ATen's autograd and view-tracking dispatch keys are skipped for every operator of the stage
  // (what c10::InferenceMode does, without marking the tensors it makes as inference tensors, which the KV pools,
  // the sampler's in-place work and the hand-offs between threads would then have to respect).
  const at::AutoDispatchBelowADInplaceOrView inference;
  const auto start = std::chrono::steady_clock::now();
  try {
    if (fault_ && static_cast<size_t>(fault_->stage) == stage) {
      ++fault_calls_;
      if (fault_calls_ == fault_->call ||
          (fault_->repeat && fault_calls_ > fault_->call && (fault_->until == 0 || fault_calls_ <= fault_->until))) {
        throw std::runtime_error(fault_->device_lost
                                     ? "CUDA error: an illegal memory access was encountered (injected fault)"
                                     : absl::StrCat("injected fault on micro-batch ", fault_calls_));
      }
    }
    if (stage == 0) batch.activation.hidden = batch.batch.ids;
    pipeline_.RunStage(stage, batch.batch, batch.activation);
    if (stage + 1 == lanes_.size() && after_last_) after_last_(batch);
  } catch (...) {
    batch.error = std::current_exception();
    batch.failed_stage = stage;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::lock_guard lock(mutex_);
  lanes_[stage].busy_seconds += seconds;
}

void StageWorkers::Submit(std::unique_ptr<MicroBatch> batch) {
  if (!threaded_) {
    for (size_t s = 0; s < lanes_.size(); ++s) RunOne(s, *batch);
    std::lock_guard lock(mutex_);
    completed_.push_back(std::move(batch));
    return;
  }
  Forward(0, std::move(batch));
}

void StageWorkers::Inject(size_t stage, std::unique_ptr<MicroBatch> batch) { Forward(stage, std::move(batch)); }

void StageWorkers::Complete(std::unique_ptr<MicroBatch> batch) {
  {
    std::lock_guard lock(mutex_);
    completed_.push_back(std::move(batch));
  }
  changed_.notify_all();
}

void StageWorkers::Forward(size_t next, std::unique_ptr<MicroBatch> batch) {
  // A failed micro-batch passes the remaining local stages without running them (RunOne), in order; it does not
  // travel to another node's: it completes here (a worker sends its error to the leader as its result).
  const bool remote = next < lanes_.size() && !pipeline_.stages()[next].local;
  if (remote && !batch->error) {
    hand_off_(next, std::move(batch));
    return;
  }
  {
    std::lock_guard lock(mutex_);
    if (next < lanes_.size() && !remote) {
      lanes_[next].queue.push_back(std::move(batch));
    } else {
      completed_.push_back(std::move(batch));
    }
  }
  changed_.notify_all();
}

bool StageWorkers::ChainNext(size_t own, size_t ran, const MicroBatch& batch) {
  const std::vector<Stage>& stages = pipeline_.stages();
  const size_t next = ran + 1;
  bool chain = false;
  bool waiting = false;  // `ran`'s own worker has a micro-batch it waited to start until this thread was done
  {
    std::lock_guard lock(mutex_);
    lanes_[ran].running = false;
    waiting = ran != own && !lanes_[ran].queue.empty();
    chain = !batch.error && next < lanes_.size() && stages[next].local && stages[ran].device.is_cpu() &&
            stages[next].device.is_cpu() && !lanes_[next].running && lanes_[next].queue.empty() &&
            lanes_[own].queue.empty();
    if (chain) lanes_[next].running = true;
  }
  if (waiting) changed_.notify_all();
  return chain;
}

void StageWorkers::Work(size_t stage) {
  if (intra_op_threads_ > 0) at::set_num_threads(intra_op_threads_);
  while (true) {
    std::unique_ptr<MicroBatch> batch;
    {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] { return stopping_ || (!lanes_[stage].queue.empty() && !lanes_[stage].running); });
      if (stopping_) return;
      batch = std::move(lanes_[stage].queue.front());
      lanes_[stage].queue.pop_front();
      lanes_[stage].running = true;
    }
    size_t ran = stage;
    RunOne(ran, *batch);
    while (ChainNext(stage, ran, *batch)) RunOne(++ran, *batch);
    // Forward notifies: a worker whose stage this thread ran may have been handed a micro-batch meanwhile.
    Forward(ran + 1, std::move(batch));
  }
}

std::unique_ptr<MicroBatch> StageWorkers::WaitCompleted(std::optional<std::chrono::milliseconds> timeout) {
  std::unique_lock lock(mutex_);
  if (!timeout) {
    changed_.wait(lock, [&] { return !completed_.empty(); });
  } else if (!changed_.wait_for(lock, *timeout, [&] { return !completed_.empty(); })) {
    return nullptr;
  }
  std::unique_ptr<MicroBatch> batch = std::move(completed_.front());
  completed_.pop_front();
  return batch;
}

std::vector<double> StageWorkers::BusySeconds() const {
  std::lock_guard lock(mutex_);
  std::vector<double> out;
  for (const Lane& lane : lanes_) out.push_back(lane.busy_seconds);
  return out;
}

}  // namespace strata::runtime
