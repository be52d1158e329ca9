#include "runtime/engine/stop_strings.h"

#include <algorithm>
#include <utility>

namespace strata::runtime {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stop) {
  for (std::string& s : stop) {
    if (!s.empty()) stop_.push_back(std::move(s));
  }
}

StopStringMatcher::StopStringMatcher(std::vector<std::string> stop, std::function<bool(std::string_view)> may_stop)
    : StopStringMatcher(std::move(stop)) {
  may_stop_ = std::move(may_stop);
}

StopStringMatcher::Result StopStringMatcher::Push(const std::string& text) {
  Result result;
  if (stopped_) return result;
  pending_ += text;
  // The earliest complete occurrence of any stop string wins (among those may_stop_ allows).
  size_t match = std::string::npos;
  for (size_t from = 0; from < pending_.size();) {
    match = std::string::npos;
    for (const std::string& s : stop_) match = std::min(match, pending_.find(s, from));
    if (match == std::string::npos || !may_stop_ || may_stop_(released_ + pending_.substr(0, match))) break;
    from = match + 1;
    match = std::string::npos;
  }
  if (match != std::string::npos) {
    result.text = pending_.substr(0, match);
    result.stopped = stopped_ = true;
    pending_.clear();
    return result;
  }
  // Hold back the longest tail that is a proper prefix of some stop string: the rest can no longer be
  // part of a match.
  size_t keep_from = pending_.size();
  for (const std::string& s : stop_) {
    const size_t longest = std::min(s.size() - 1, pending_.size());
    for (size_t n = longest; n > 0; --n) {
      if (pending_.compare(pending_.size() - n, n, s, 0, n) == 0) {
        keep_from = std::min(keep_from, pending_.size() - n);
        break;
      }
    }
  }
  result.text = pending_.substr(0, keep_from);
  pending_.erase(0, keep_from);
  if (may_stop_) released_ += result.text;
  return result;
}

std::string StopStringMatcher::Flush() {
  std::string out;
  out.swap(pending_);
  return stopped_ ? std::string() : out;
}

}  // namespace strata::runtime
