#include "runtime/engine/mask_filler.h"

#include <algorithm>
#include <chrono>
#include <utility>

namespace strata::runtime {

MaskFiller::MaskFiller(int threads) {
  for (int t = 0; t < std::max(1, threads); ++t) threads_.emplace_back([this] { Run(); });
}

MaskFiller::~MaskFiller() {
  {
    std::lock_guard lock(mutex_);
    closing_ = true;
  }
  wake_.notify_all();
  for (std::thread& thread : threads_) thread.join();
}

void MaskFiller::Fill(structured::Matcher* matcher, std::shared_ptr<AllowedTokens> mask) {
  FillVerified(matcher, {}, {std::move(mask)});
}

void MaskFiller::FillVerified(structured::Matcher* matcher, std::vector<int32_t> proposals,
                              std::vector<std::shared_ptr<AllowedTokens>> masks) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back({matcher, std::move(proposals), std::move(masks)});
  }
  wake_.notify_one();
}

MaskFiller::Totals MaskFiller::totals() const {
  std::lock_guard lock(mutex_);
  return totals_;
}

void MaskFiller::SetObserver(std::function<void(double seconds)> observer) {
  std::lock_guard lock(mutex_);
  observer_ = std::move(observer);
}

void MaskFiller::Run() {
  while (true) {
    Task task;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return closing_ || !queue_.empty(); });
      if (queue_.empty()) return;  // closing, and every queued mask was filled
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    const size_t last = task.masks.size() - 1;
    int32_t accepted = 0;
    bool refused = false;
    for (size_t j = 0; j <= last; ++j) {
      AllowedTokens& mask = *task.masks[j];
      if (j > 0 && !refused) refused = !task.matcher->Accept(task.proposals[j - 1]);
      const auto start = std::chrono::steady_clock::now();
      if (refused) {
        const std::vector<int32_t>& before = task.masks[j - 1]->Get();
        std::copy(before.begin(), before.end(), mask.data());
      } else {
        accepted += j > 0;
        task.matcher->FillMask(mask.data());
      }
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (j == last) task.matcher->Rollback(accepted);
      mask.MarkReady();
      std::function<void(double)> observer;
      {
        std::lock_guard lock(mutex_);
        ++totals_.filled;
        totals_.seconds += seconds;
        observer = observer_;
      }
      if (observer) observer(seconds);
    }
  }
}

}  // namespace strata::runtime
