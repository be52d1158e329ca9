#pragma once
// Waiting across threads (no UCX): the callers of Link and Transport wait on condition variables that the progress
// thread notifies, until absl deadlines; what they are handed back is a Status of their own.
#include <chrono>
#include <condition_variable>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace strata::transport::internal {

// A Status another thread also holds, as a Status of its own (its own payload): absl::Status shares its payload by
// a reference count that Debian's uninstrumented Abseil releases where ThreadSanitizer cannot see the order, so a
// stored failure is never handed to a caller as a copy (the engine's output thread does the same).
inline absl::Status Detached(const absl::Status& status) {
  return status.ok() ? absl::OkStatus() : absl::Status(status.code(), std::string(status.message()));
}

// How long a wait took, as messages say it ("1.5s"), to the millisecond.
inline std::string Seconds(absl::Duration d) {
  return absl::StrCat(absl::FormatDuration(absl::Trunc(d, absl::Milliseconds(1))));
}

// cv.wait_until with an absl deadline (an infinite one waits in long steps).
template <typename Lock>
void WaitUntil(std::condition_variable& cv, Lock& lock, absl::Time deadline) {
  if (deadline - absl::Now() > absl::Hours(1)) {
    cv.wait_for(lock, std::chrono::hours(1));
  } else {
    cv.wait_until(lock, absl::ToChronoTime(deadline));
  }
}

}  // namespace strata::transport::internal
