#pragma once
// Debian's gRPC orders a reactor's callbacks (the constructor, then OnWriteDone/OnCancel, then OnDone, each
// possibly on another of its threads) with Abseil mutexes and atomics inside uninstrumented libraries, which
// ThreadSanitizer cannot see: without help it reports every reactor member touched on two gRPC threads as
// a race. These state the ordering gRPC guarantees, for TSan only (tests/sanitize/README.md); in other
// builds they are empty.

#if defined(__SANITIZE_THREAD__)
#define STRATA_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define STRATA_TSAN 1
#endif
#endif

#ifdef STRATA_TSAN
extern "C" void __tsan_acquire(void* address);
extern "C" void __tsan_release(void* address);
#endif

namespace strata::server {

// Before handing `reactor` to gRPC (returning it to gRPC, StartWrite, Finish): what this thread did to it
// happens before the callback gRPC runs next.
inline void HandToGrpc([[maybe_unused]] void* reactor) {
#ifdef STRATA_TSAN
  __tsan_release(reactor);
#endif
}

// First thing in a callback gRPC runs on `reactor`.
inline void TakeFromGrpc([[maybe_unused]] void* reactor) {
#ifdef STRATA_TSAN
  __tsan_acquire(reactor);
#endif
}

}  // namespace strata::server
