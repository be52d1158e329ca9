#pragma once
// LibTorch's CPU allocator, counting (tests only): what the CPU path allocates while a scope runs, measured.

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <cstdint>
#include <cstring>

namespace strata::runtime {

// LibTorch's CPU allocator, counting: the bytes its allocations hold now and at most since Reset.
class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t n) override {
    allocations_.fetch_add(1);
    auto* held = new Held{base_->allocate(n), n, this};
    const int64_t now = live_.fetch_add(static_cast<int64_t>(n)) + static_cast<int64_t>(n);
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    void* data = held->inner.get();
    return {data, held, &Free, held->inner.device()};
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }

  void Reset() { peak_ = live_.load(); }
  int64_t live() const { return live_; }
  int64_t peak() const { return peak_; }
  int64_t allocations() const { return allocations_; }

 private:
  struct Held {
    c10::DataPtr inner;
    size_t bytes;
    CountingAllocator* owner;
  };
  static void Free(void* context) {
    auto* held = static_cast<Held*>(context);
    held->owner->live_ -= static_cast<int64_t>(held->bytes);
    delete held;
  }
  c10::Allocator* base_;
  std::atomic<int64_t> live_{0};
  std::atomic<int64_t> peak_{0};
  std::atomic<int64_t> allocations_{0};
};

// Counts the CPU allocations of one scope: the peak of what they held above what was held when it began. The
// counting allocator is installed once, for the rest of the process (SetCPUAllocator keeps the allocator of the
// highest priority it was given).
class Measure {
 public:
  Measure() {
    static CountingAllocator* counting = [] {
      auto* allocator = new CountingAllocator(c10::GetDefaultCPUAllocator());  // outlives every tensor
      c10::SetCPUAllocator(allocator, /*priority=*/255);
      return allocator;
    }();
    counting_ = counting;
    counting_->Reset();
    start_ = counting_->live();
    start_allocations_ = counting_->allocations();
  }
  int64_t peak_above_start() const { return counting_->peak() - start_; }
  int64_t allocations() const { return counting_->allocations() - start_allocations_; }

 private:
  CountingAllocator* counting_;
  int64_t start_ = 0;
  int64_t start_allocations_ = 0;
};

}  // namespace strata::runtime
