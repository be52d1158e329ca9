#pragma once
// The Generate calls the engine is working on, for the graceful drain (server/README.md, "Behaviour"):
// how many are in flight, a wake-up when the last one ends, and a cut for those the drain timeout
// leaves running. GenerateReactor adds itself once its request is submitted and removes itself in OnDone.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <unordered_set>

namespace strata::server {

class GenerateReactor;

// What a drain did with the generations in flight when it began.
struct DrainCounts {
  int64_t in_flight = 0;  // when the drain began
  int64_t finished = 0;   // ended before the cut (normally, or by their client, or with an error)
  int64_t cut = 0;        // still running at the cut: ended UNAVAILABLE
};

class InFlightGenerations {
 public:
  void Add(GenerateReactor* reactor);
  // From OnDone, before the reactor deletes itself; `cut`: it ended UNAVAILABLE because of Cut().
  void Remove(GenerateReactor* reactor, bool cut);

  // From now on removals are counted; `on_empty` is called (once, on whichever thread removes the last
  // generation, or here when none is in flight) when no generation is left. Returns the count in flight.
  int64_t BeginDrain(std::function<void()> on_empty);
  int64_t size() const;
  // Cancels every generation still in flight: each ends UNAVAILABLE within one engine iteration.
  void CutAll();
  // Waits until none is in flight or `timeout` passed; whether none is.
  bool WaitEmpty(std::chrono::milliseconds timeout);
  // Generations still in flight count as cut (they were).
  DrainCounts counts() const;

 private:
  mutable std::mutex mutex_;
  std::condition_variable empty_;
  std::unordered_set<GenerateReactor*> reactors_;
  bool draining_ = false;
  std::function<void()> on_empty_;
  DrainCounts counts_;
};

}  // namespace strata::server
