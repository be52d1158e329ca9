#pragma once
// Internal to the engine: its output thread (vLLM's OutputProcessor). The engine thread hands it, in
// order, each stream's opening and then its steps (a token, an end); this thread detokenizes, matches
// stop strings and calls each request's ChunkCallback, so that neither text work nor a slow callback
// holds up the forward passes. A stop string it finds ends the request here at once; the engine learns
// of it through OutputStream::stopped and frees the request's KV blocks.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/stop_strings.h"
#include "tokenizer/streaming_decoder.h"

namespace strata::runtime {

// A request as the output thread sees it: its text state and where its chunks go.
struct OutputStream {
  ChunkCallback callback;
  std::shared_ptr<std::atomic<bool>> stopped;  // set here when a stop string ended the request
  std::optional<tokenizer::StreamingDecoder> decoder;
  std::optional<StopStringMatcher> stop;
  int64_t min_tokens = 0;  // stop strings are matched once this many tokens were emitted (vLLM)
  // Structured outputs: a stop string ends the request only where the output before it completes the grammar.
  std::shared_ptr<const structured::Grammar> grammar;
  int64_t prompt_tokens = 0;
  int64_t emitted = 0;  // tokens sent to the callback
  bool ended = false;   // its final chunk was sent
};

// Engine thread -> output thread, in order: a stream opens, then its tokens and its end.
struct OpenStream {
  uint64_t sequence = 0;
  std::unique_ptr<OutputStream> stream;
};
struct SequenceStep {
  uint64_t sequence = 0;
  std::optional<GeneratedToken> token;
  std::optional<FinishReason> finish;
  absl::Status error;
  std::vector<std::optional<GeneratedToken>> prompt_logprobs;  // on the request's first step, when asked for
};
using OutputEvent = std::variant<OpenStream, SequenceStep>;

class OutputProcessor {
 public:
  OutputProcessor();   // starts the thread
  ~OutputProcessor();  // Close()

  // Queues an event; never blocks on the output thread's work. Any thread (the engine's).
  void Emit(OutputEvent event);
  // Delivers what is queued, then joins the thread. Idempotent; no Emit after it.
  void Close();

 private:
  void Run();
  void Deliver(SequenceStep& step);

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<OutputEvent> queue_;
  bool closing_ = false;
  std::map<uint64_t, std::unique_ptr<OutputStream>> streams_;  // output thread only
  std::thread thread_;
};

}  // namespace strata::runtime
