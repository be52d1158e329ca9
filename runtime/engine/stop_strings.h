#pragma once
// Stop strings matched on decoded text (plain C++). Text arrives in pieces as the streaming detokenizer
// releases it; the matcher passes on only what can no longer turn out to be the start of a stop string,
// and on a match stops with the text before it: the stop string itself is never emitted (as vLLM and
// TGI do).

#include <string>
#include <vector>

namespace strata::runtime {

class StopStringMatcher {
 public:
  explicit StopStringMatcher(std::vector<std::string> stop);

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
  std::string pending_;  // received, not yet emitted
  bool stopped_ = false;
};

}  // namespace strata::runtime
