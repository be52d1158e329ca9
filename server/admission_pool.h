#pragma once
// The threads that validate and tokenize large Generate requests (server/README.md, "Limits"), and build
// the HTTP API's whole responses off the engine's output thread. gRPC's
// callback threads are few and shared by every call, health checks included: a handler that tokenizes
// megabytes of text on one holds up everything behind it. Requests above a small size are handed here
// instead; jobs run in arrival order on a fixed number of threads, so tokenizing work at once is bounded
// too (each job's text by --max-prompt-bytes). The threads run at nice 10 (kNice), below the engine.

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace strata::server {

class AdmissionPool {
 public:
  explicit AdmissionPool(int threads);
  // Runs the jobs still queued, then joins the threads.
  ~AdmissionPool();
  AdmissionPool(const AdmissionPool&) = delete;
  AdmissionPool& operator=(const AdmissionPool&) = delete;

  void Post(std::function<void()> job);
  // Returns once no job is queued or running (jobs posted meanwhile included).
  void WaitIdle();

 private:
  static constexpr int kNice = 10;
  void Run();

  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable idle_;
  std::deque<std::function<void()>> jobs_;
  int running_ = 0;
  bool closing_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace strata::server
