// runtime/model/parallel.h: ParallelRows covers [0, n) once in at most kPiecesPerThread x threads pieces, on
// workers that sleep when idle and wake for the next job, nested calls inline, exceptions reach the caller.
#include "runtime/model/parallel.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

namespace strata::runtime {
namespace {

// Sets this thread's intra-op threads for the scope.
class Threads {
 public:
  explicit Threads(int n) : saved_(at::get_num_threads()) { at::set_num_threads(n); }
  ~Threads() { at::set_num_threads(saved_); }

 private:
  int saved_;
};

// The pieces one call ran, checked to tile [0, n) exactly.
std::vector<std::pair<int64_t, int64_t>> Pieces(int64_t n, int64_t grain) {
  std::mutex mutex;
  std::vector<std::pair<int64_t, int64_t>> pieces;
  std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
  ParallelRows(n, grain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
    std::lock_guard lock(mutex);
    pieces.emplace_back(begin, end);
  });
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "index " << i << " of " << n;
  return pieces;
}

TEST(ParallelRows, CoversEveryIndexOnceInAtMostFourPiecesPerThread) {
  for (int threads : {1, 2, 3, 4}) {
    Threads scope(threads);
    for (int64_t n : {1, 2, 3, 7, 64, 1000, 4097}) {
      for (int64_t grain : {1, 5, 64, 10000}) {
        const auto pieces = Pieces(n, grain);
        const int64_t most = std::min<int64_t>(threads * kPiecesPerThread, (n + grain - 1) / grain);
        EXPECT_LE(static_cast<int64_t>(pieces.size()), most) << threads << " threads, n " << n << " grain " << grain;
        for (const auto& [begin, end] : pieces) EXPECT_LT(begin, end);
      }
    }
  }
}

TEST(ParallelRows, EmptyRangeRunsNothing) {
  Threads scope(2);
  int calls = 0;
  ParallelRows(0, 1, [&](int64_t, int64_t) { ++calls; });
  ParallelRows(-3, 1, [&](int64_t, int64_t) { ++calls; });
  EXPECT_EQ(calls, 0);
}

TEST(ParallelRows, PiecesRunOnOtherThreads) {
  Threads scope(2);
  std::mutex mutex;
  std::set<std::thread::id> ids;
  // Several jobs: a worker may still be waking for the first.
  for (int job = 0; job < 50; ++job) {
    ParallelRows(2, 1, [&](int64_t, int64_t) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      std::lock_guard lock(mutex);
      ids.insert(std::this_thread::get_id());
    });
  }
  EXPECT_EQ(ids.size(), 2u);
}

TEST(ParallelRows, WorkersThatFellAsleepWakeForTheNextJob) {
  Threads scope(3);
  for (int round = 0; round < 3; ++round) {
    // Past the spin: the workers block on their futex, and the job must wake them.
    std::this_thread::sleep_for(std::chrono::microseconds(4 * kSpinMicros));
    EXPECT_EQ(Pieces(300, 1).size(), 3u * kPiecesPerThread) << "round " << round;
  }
}

TEST(ParallelRows, NestedCallsRunInline) {
  Threads scope(2);
  std::atomic<int> inner_pieces{0};
  std::atomic<int64_t> covered{0};
  ParallelRows(2, 1, [&](int64_t, int64_t) {
    ParallelRows(100, 1, [&](int64_t begin, int64_t end) {
      inner_pieces.fetch_add(1);
      covered.fetch_add(end - begin);
    });
  });
  EXPECT_EQ(inner_pieces.load(), 2);  // one inner piece per outer piece
  EXPECT_EQ(covered.load(), 200);
}

TEST(ParallelRows, AnExceptionInAnyPieceReachesTheCaller) {
  Threads scope(2);
  for (int64_t thrower : {0, 1}) {
    EXPECT_THROW(ParallelRows(2, 1,
                              [&](int64_t begin, int64_t) {
                                if (begin == thrower) throw std::runtime_error("piece failed");
                              }),
                 std::runtime_error)
        << "piece " << thrower;
    // The team is whole afterwards.
    EXPECT_GE(Pieces(10, 1).size(), 2u);
  }
}

TEST(ParallelRows, ATeamPerCallingThreadAndAThreadCountChangeRebuildsIt) {
  std::atomic<int64_t> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 3; ++c) {
    callers.emplace_back([&, c] {
      Threads scope(2 + c % 2);
      for (int job = 0; job < 200; ++job) {
        ParallelRows(97, 1, [&](int64_t begin, int64_t end) { total.fetch_add(end - begin); });
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(total.load(), 3 * 200 * 97);
  Threads four(4);
  EXPECT_EQ(Pieces(400, 1).size(), 4u * kPiecesPerThread);
  Threads two(2);
  EXPECT_EQ(Pieces(400, 1).size(), 2u * kPiecesPerThread);
}

}  // namespace
}  // namespace strata::runtime
