#pragma once
// The generations the engine is working on, for the graceful drain (server/README.md, "Behaviour"):
// how many are in flight, a wake-up when the last one ends, and a cut for those the drain timeout
// leaves running. A gRPC Generate call (GenerateReactor) or an HTTP API request (server/http_api.h) adds
// itself once its request is submitted and removes itself when its call or exchange ends.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <unordered_set>

namespace strata::server {

// One call or exchange the engine generates for.
class CuttableGeneration {
 public:
  // The drain timeout passed: cancel the generation; the call ends UNAVAILABLE (gRPC) or 503 (HTTP) once
  // the tokens generated before are delivered. Any thread; must not call back into InFlightGenerations.
  virtual void Cut() = 0;

 protected:
  ~CuttableGeneration() = default;
};

// What a drain did with the generations in flight when it began.
struct DrainCounts {
  int64_t in_flight = 0;  // when the drain began
  int64_t finished = 0;   // ended before the cut (normally, or by their client, or with an error)
  int64_t cut = 0;        // still running at the cut: ended UNAVAILABLE
};

class InFlightGenerations {
 public:
  void Add(CuttableGeneration* generation);
  // When its call ends, before it is deleted; `cut`: it ended because of Cut().
  void Remove(CuttableGeneration* generation, bool cut);

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
  std::unordered_set<CuttableGeneration*> generations_;
  bool draining_ = false;
  std::function<void()> on_empty_;
  DrainCounts counts_;
};

}  // namespace strata::server
