#pragma once
// Stop strings matched on decoded text (plain C++). Text arrives in pieces as the streaming detokenizer
// releases it; the matcher passes on only what can no longer turn out to be the start of a stop string,
// and on a match stops with the text before it: the stop string itself is never emitted (as vLLM and
// TGI do).

#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace strata::runtime {

class StopStringMatcher {
 public:
  explicit StopStringMatcher(std::vector<std::string> stop);
  // Only an occurrence where `may_stop(text before it, from the start of the stream)` holds ends the stream
  // (a constrained request's grammar must be complete there); the others pass as text.
  StopStringMatcher(std::vector<std::string> stop, std::function<bool(std::string_view)> may_stop);

  struct Result {
    std::string text;      // safe to emit now
    bool stopped = false;  // a stop string completed; `text` ends right before it
  };
  // Adds decoded text. After a stop, further calls return nothing.
  Result Push(const std::string& text);
  // The end of the stream: whatever was held back (no stop string can complete any more).
  std::string Flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stop_;
  std::function<bool(std::string_view)> may_stop_;
  std::string released_;  // with may_stop_: everything emitted so far
  std::string pending_;   // received, not yet emitted
  bool stopped_ = false;
};

}  // namespace strata::runtime
