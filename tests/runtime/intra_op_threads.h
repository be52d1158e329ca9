#pragma once
// Test helper: runs a scope on `threads` intra-op threads and restores the previous count after. The tsan
// lane runs LibTorch on one thread whatever is asked: TSan cannot see into the wheel's own libgomp
// (tests/sanitize/README.md); the split over threads is covered by the other builds.

#include <ATen/Parallel.h>

namespace strata::runtime {

class IntraOpThreads {
 public:
  explicit IntraOpThreads(int threads) : previous_(at::get_num_threads()) {
#if defined(__SANITIZE_THREAD__)
    (void)threads;
    at::set_num_threads(1);
#else
    at::set_num_threads(threads);
#endif
  }
  ~IntraOpThreads() { at::set_num_threads(previous_); }
  IntraOpThreads(const IntraOpThreads&) = delete;
  IntraOpThreads& operator=(const IntraOpThreads&) = delete;

 private:
  int previous_;
};

}  // namespace strata::runtime
