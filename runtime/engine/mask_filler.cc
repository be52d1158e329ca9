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
  {
    std::lock_guard lock(mutex_);
    queue_.push_back({matcher, std::move(mask)});
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
    const auto start = std::chrono::steady_clock::now();
    task.matcher->FillMask(task.mask->data());
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    task.mask->MarkReady();
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

}  // namespace strata::runtime
