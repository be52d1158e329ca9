#pragma once
// Internal to the engine: the threads that fill constrained rows' token masks (structured outputs) while
// the micro-batch's forward pass runs (SGLang's and vLLM's overlap). The engine thread queues a row's fill
// when it builds the micro-batch; the sampler waits for the mask (AllowedTokens::Get) only when it needs
// it, after the stages. Rows without a grammar queue nothing and pay nothing.

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/executor/executor.h"
#include "structured/structured.h"

namespace strata::runtime {

class MaskFiller {
 public:
  explicit MaskFiller(int threads);
  ~MaskFiller();  // fills what is queued, then joins

  // Fills `mask` from `matcher`'s position, then marks it ready. Nothing else may use the matcher until the
  // mask is ready (the engine next touches it after the micro-batch's tokens came back, which waited for it).
  void Fill(structured::Matcher* matcher, std::shared_ptr<AllowedTokens> mask);
  // A verified row's masks (speculative decoding): masks[j] for the matcher's position after proposals[0, j), one
  // more mask than proposals; the matcher is rolled back before the last mask is marked ready. A position after a
  // proposal the grammar refuses is never kept (the target cannot choose that proposal): it gets the mask before it.
  void FillVerified(structured::Matcher* matcher, std::vector<int32_t> proposals,
                    std::vector<std::shared_ptr<AllowedTokens>> masks);

  struct Totals {
    uint64_t filled = 0;
    double seconds = 0;  // spent filling, summed over the threads
  };
  Totals totals() const;
  // Called on a mask thread with each fill's seconds (a histogram's Observe: thread-safe, quick).
  void SetObserver(std::function<void(double seconds)> observer);

 private:
  struct Task {
    structured::Matcher* matcher = nullptr;
    std::vector<int32_t> proposals;
    std::vector<std::shared_ptr<AllowedTokens>> masks;  // proposals.size() + 1
  };
  void Run();

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Task> queue_;
  bool closing_ = false;
  Totals totals_;
  std::function<void(double)> observer_;
  std::vector<std::thread> threads_;
};

}  // namespace strata::runtime
