#include "server/in_flight_generations.h"

#include <utility>

namespace strata::server {

void InFlightGenerations::Add(CuttableGeneration* generation) {
  std::lock_guard lock(mutex_);
  generations_.insert(generation);
}

void InFlightGenerations::Remove(CuttableGeneration* generation, bool cut) {
  std::function<void()> on_empty;
  {
    std::lock_guard lock(mutex_);
    if (generations_.erase(generation) == 0) return;
    if (draining_ && !cut) ++counts_.finished;
    if (generations_.empty()) {
      empty_.notify_all();
      on_empty = std::exchange(on_empty_, nullptr);
    }
  }
  if (on_empty) on_empty();
}

int64_t InFlightGenerations::BeginDrain(std::function<void()> on_empty) {
  int64_t in_flight = 0;
  {
    std::lock_guard lock(mutex_);
    draining_ = true;
    in_flight = counts_.in_flight = static_cast<int64_t>(generations_.size());
    if (in_flight > 0) on_empty_ = std::move(on_empty);
  }
  if (in_flight == 0 && on_empty) on_empty();
  return in_flight;
}

int64_t InFlightGenerations::size() const {
  std::lock_guard lock(mutex_);
  return static_cast<int64_t>(generations_.size());
}

void InFlightGenerations::CutAll() {
  // Under the mutex: a generation removes itself (here) before it is deleted, so each one seen is alive.
  std::lock_guard lock(mutex_);
  for (CuttableGeneration* generation : generations_) generation->Cut();
}

bool InFlightGenerations::WaitEmpty(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  return empty_.wait_for(lock, timeout, [this] { return generations_.empty(); });
}

DrainCounts InFlightGenerations::counts() const {
  std::lock_guard lock(mutex_);
  DrainCounts counts = counts_;
  counts.cut = counts.in_flight - counts.finished;
  return counts;
}

}  // namespace strata::server
