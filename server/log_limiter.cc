#include "server/log_limiter.h"

#include <google/protobuf/stubs/logging.h>

#include <iostream>
#include <utility>

#include "absl/strings/str_cat.h"

namespace strata::server {

LogLimiter::LogLimiter(Sink sink, Clock::duration window, size_t max_kinds, std::function<Clock::time_point()> now)
    : sink_(std::move(sink)), window_(window), max_kinds_(max_kinds), now_(std::move(now)) {}

void LogLimiter::Log(std::string_view line) {
  std::string out;
  {
    std::lock_guard lock(mutex_);
    const Clock::time_point now = now_();
    auto it = kinds_.find(std::string(line));
    if (it != kinds_.end() && now - it->second.window_start < window_) {
      ++it->second.repeats;
      return;
    }
    if (it == kinds_.end()) {
      if (kinds_.size() >= max_kinds_) {
        // Forget the windows that have passed; if none has, forget them all (a flood of distinct lines).
        std::erase_if(kinds_, [&](const auto& kind) { return now - kind.second.window_start >= window_; });
        if (kinds_.size() >= max_kinds_) kinds_.clear();
      }
      it = kinds_.emplace(std::string(line), Kind{}).first;
    }
    out = std::string(line);
    if (it->second.repeats > 0) {
      absl::StrAppend(&out, " (repeated ", it->second.repeats, " more times in the last ",
                      std::chrono::duration_cast<std::chrono::seconds>(now - it->second.window_start).count(), " s)");
    }
    it->second = Kind{now, 0};
  }
  sink_(out);
}

namespace {

const char* LevelName(google::protobuf::LogLevel level) {
  switch (level) {
    case google::protobuf::LOGLEVEL_INFO:
      return "INFO";
    case google::protobuf::LOGLEVEL_WARNING:
      return "WARNING";
    case google::protobuf::LOGLEVEL_ERROR:
      return "ERROR";
    case google::protobuf::LOGLEVEL_FATAL:
      return "FATAL";
  }
  return "?";
}

LogLimiter& ProtobufLogLimiter() {
  static LogLimiter* limiter = new LogLimiter([](std::string_view line) { std::cerr << line << std::endl; });
  return *limiter;
}

void ProtobufLogHandler(google::protobuf::LogLevel level, const char* filename, int line, const std::string& message) {
  // FATAL is followed by an abort in protobuf itself: never held back.
  if (level == google::protobuf::LOGLEVEL_FATAL) {
    std::cerr << "[libprotobuf FATAL " << filename << ":" << line << "] " << message << std::endl;
    return;
  }
  ProtobufLogLimiter().Log(absl::StrCat("[libprotobuf ", LevelName(level), " ", filename, ":", line, "] ", message));
}

}  // namespace

void RateLimitProtobufLog() {
  ProtobufLogLimiter();  // constructed before the handler can run
  google::protobuf::SetLogHandler(&ProtobufLogHandler);
}

}  // namespace strata::server
