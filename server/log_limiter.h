// Repeated identical log lines, rate-limited: the first of a kind is written at once, the repeats within
// the window are counted and summed up ("... (repeated N more times in the last 60 s)") when the window
// has passed and the line comes again. Used for libprotobuf's log (every request with invalid UTF-8
// would otherwise write an ERROR line of its own).
#ifndef STRATA_SERVER_LOG_LIMITER_H_
#define STRATA_SERVER_LOG_LIMITER_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

namespace strata::server {

class LogLimiter {
 public:
  using Clock = std::chrono::steady_clock;
  using Sink = std::function<void(std::string_view line)>;

  // `max_kinds` bounds the memory: past it, the oldest windows are forgotten.
  LogLimiter(Sink sink, Clock::duration window = std::chrono::seconds(60), size_t max_kinds = 1024,
             std::function<Clock::time_point()> now = Clock::now);

  // Writes `line` to the sink now, or counts it as a repeat within its window. Thread-safe.
  void Log(std::string_view line);

 private:
  struct Kind {
    Clock::time_point window_start;
    int64_t repeats = 0;
  };

  Sink sink_;
  Clock::duration window_;
  size_t max_kinds_;
  std::function<Clock::time_point()> now_;
  std::mutex mutex_;
  std::unordered_map<std::string, Kind> kinds_;
};

// Routes libprotobuf's log lines through one process-wide LogLimiter writing to stderr.
void RateLimitProtobufLog();

}  // namespace strata::server

#endif  // STRATA_SERVER_LOG_LIMITER_H_
