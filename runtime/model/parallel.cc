#include "runtime/model/parallel.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace strata::runtime {
namespace {

inline void Relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Whether this thread is running a piece of a job (a nested call runs inline).
thread_local bool in_job = false;

// Spins while `busy()` for up to kSpinMicros; false when the time ran out first.
template <class Busy>
bool SpinWhile(Busy&& busy) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(kSpinMicros);
  for (uint32_t spins = 1; busy(); ++spins) {
    if ((spins & 63) == 0 && std::chrono::steady_clock::now() > deadline) return false;
    Relax();
  }
  return true;
}

// The calling thread and `workers` threads, which claim a job's pieces one at a time. A job is published by
// bumping `epoch_`; every worker acknowledges every job (after claiming pieces until none is left) by
// decrementing `pending_`, so the job's fields stay put until all of them are done with it. 32-bit atomics:
// wait / notify are plain futexes.
class Team {
 public:
  explicit Team(int workers) {
    threads_.reserve(static_cast<size_t>(workers));
    for (int i = 1; i <= workers; ++i) threads_.emplace_back([this] { Work(); });
  }
  ~Team() {
    stop_.store(true, std::memory_order_seq_cst);
    epoch_.fetch_add(1, std::memory_order_seq_cst);
    epoch_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  int size() const { return static_cast<int>(threads_.size()) + 1; }

  void Run(int tasks, int64_t n, int64_t chunk, absl::FunctionRef<void(int64_t, int64_t)> fn) {
    fn_ = &fn;
    n_ = n;
    chunk_ = chunk;
    tasks_ = tasks;
    error_ = nullptr;
    next_.store(0, std::memory_order_relaxed);
    pending_.store(static_cast<int32_t>(threads_.size()), std::memory_order_relaxed);
    epoch_.fetch_add(1, std::memory_order_seq_cst);  // publishes the fields above
    if (sleepers_.load(std::memory_order_seq_cst) > 0) epoch_.notify_all();
    RunPieces();
    if (!SpinWhile([&] { return pending_.load(std::memory_order_acquire) != 0; })) {
      caller_waiting_.store(true, std::memory_order_seq_cst);
      for (int32_t p; (p = pending_.load(std::memory_order_seq_cst)) != 0;) pending_.wait(p);
      caller_waiting_.store(false, std::memory_order_relaxed);
    }
    if (error_ != nullptr) std::rethrow_exception(error_);
  }

 private:
  // Claims pieces until none is left: a thread that a neighbour on the same core or the hypervisor slowed
  // takes fewer, so no thread waits at the join for a fixed half that another could not finish in time.
  void RunPieces() {
    for (int id; (id = next_.fetch_add(1, std::memory_order_relaxed)) < tasks_;) RunPiece(id);
  }

  void RunPiece(int id) {
    const int64_t begin = id * chunk_, end = std::min(n_, begin + chunk_);  // never empty (ParallelRows)
    in_job = true;
    try {
      (*fn_)(begin, end);
    } catch (...) {
      std::lock_guard lock(error_mutex_);
      if (error_ == nullptr) error_ = std::current_exception();
    }
    in_job = false;
  }

  void Work() {
    uint32_t seen = 0;  // the epoch at creation: no job has been published before the team exists
    while (true) {
      const auto fresh = [&] { return epoch_.load(std::memory_order_acquire) != seen; };
      if (!fresh() && !SpinWhile([&] { return !fresh(); })) {
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        epoch_.wait(seen, std::memory_order_seq_cst);  // returns once the epoch differs from `seen`
        sleepers_.fetch_sub(1, std::memory_order_seq_cst);
      }
      seen = epoch_.load(std::memory_order_acquire);
      if (stop_.load(std::memory_order_acquire)) return;
      RunPieces();
      if (pending_.fetch_sub(1, std::memory_order_seq_cst) == 1 && caller_waiting_.load(std::memory_order_seq_cst)) {
        pending_.notify_one();
      }
    }
  }

  std::vector<std::thread> threads_;
  std::atomic<uint32_t> epoch_{0};
  std::atomic<int32_t> pending_{0};
  std::atomic<int32_t> next_{0};  // the next piece to claim
  std::atomic<int32_t> sleepers_{0};
  std::atomic<bool> caller_waiting_{false};
  std::atomic<bool> stop_{false};
  // The job: written by the caller before the epoch moves, read by the workers after.
  const absl::FunctionRef<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0, chunk_ = 0;
  int tasks_ = 0;
  std::mutex error_mutex_;
  std::exception_ptr error_;
};

thread_local std::unique_ptr<Team> team;

}  // namespace

void ParallelRows(int64_t n, int64_t grain, absl::FunctionRef<void(int64_t, int64_t)> fn) {
  if (n <= 0) return;
  const int threads = in_job ? 1 : std::max(1, at::get_num_threads());
  const int64_t most = (n + std::max<int64_t>(grain, 1) - 1) / std::max<int64_t>(grain, 1);
  if (std::min<int64_t>(threads, most) <= 1) return fn(0, n);
  const int64_t tasks = std::min<int64_t>(int64_t{threads} * kPiecesPerThread, most);
  if (team == nullptr || team->size() != threads) {
    team.reset();
    team = std::make_unique<Team>(threads - 1);
  }
  const int64_t chunk = (n + tasks - 1) / tasks;
  team->Run(static_cast<int>((n + chunk - 1) / chunk), n, chunk, fn);  // no empty piece
}

}  // namespace strata::runtime
