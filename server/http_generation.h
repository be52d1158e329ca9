#pragma once
// One /v1/completions or /v1/chat/completions request as the engine generates it (server/http_api.h routes
// it here once its body is checked): every choice (prompt x n) an engine request, its chunks SSE events or,
// once all have finished, one whole response; the request counted in the metrics and --max-streams.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "chat_template/reasoning.h"
#include "chat_template/tool_calls.h"
#include "runtime/engine/engine.h"
#include "server/admission_pool.h"
#include "server/http_server.h"
#include "server/in_flight_generations.h"
#include "server/metrics.h"
#include "server/openai_protocol.h"
#include "tokenizer/streaming_decoder.h"
#include "tokenizer/tokenizer.h"

namespace strata::server {

// Generate calls and HTTP generations open, against --max-streams: counted from the request's arrival to
// its answer.
class OpenStream {
 public:
  explicit OpenStream(std::atomic<int64_t>* counter) : counter_(counter), open_(counter->fetch_add(1) + 1) {}
  ~OpenStream() { counter_->fetch_sub(1); }
  OpenStream(const OpenStream&) = delete;
  OpenStream& operator=(const OpenStream&) = delete;
  int64_t open_at_start() const { return open_; }

 private:
  std::atomic<int64_t>* counter_;
  int64_t open_;
};

// One HTTP generation request's end in the request metrics (none when `metrics` is null): its code and
// seconds since `start`.
void RecordHttpRequest(Metrics* metrics, absl::StatusCode code, std::chrono::steady_clock::time_point start);

// One generation request (this file's header). Kept alive by the engine's callbacks; listed in InFlightGenerations
// while it runs.
class HttpGeneration final : public CuttableGeneration, public std::enable_shared_from_this<HttpGeneration> {
 public:
  HttpGeneration(std::shared_ptr<HttpExchange> exchange, openai::ApiRequest request,
                 const tokenizer::Tokenizer* tokenizer, Metrics* metrics, std::unique_ptr<OpenStream> open,
                 std::chrono::steady_clock::time_point start,
                 std::optional<chat_template::ToolCallFormat> tool_call_parser,
                 std::optional<chat_template::ReasoningFormat> reasoning_parser, bool prefix_cache,
                 AdmissionPool* respond_pool);

  // Hands every choice to `engine` (the caller holds the service's mutex: SubmitUnlessDraining). Not OK:
  // nothing was submitted, the caller answers with the error.
  absl::Status Submit(runtime::Engine& engine, InFlightGenerations* in_flight);

  void Cut() override {
    cut_.store(true);
    CancelAll();
  }

 private:
  struct Choice {
    std::string text;
    std::vector<runtime::GeneratedToken> tokens;
    std::optional<runtime::FinishReason> finish;
    absl::Status error;
    int64_t prompt_tokens = 0;
    int64_t completion_tokens = 0;
    int64_t text_offset = 0;  // completions' logprobs: code points before the next token
    bool started = false;     // stream: its first event (the chat role, the echoed prompt) was sent
    std::optional<std::chrono::steady_clock::time_point> last_token;
    bool submitted = false;          // handed to the engine
    bool finished = false;           // its last chunk came (or it never started)
    bool followers_started = false;  // a prompt's first sample: its other samples were submitted
    std::optional<chat_template::ToolCallStreamParser> tool_calls;  // stream: tools parsed as text arrives
    // stream: the calls tool_choice forced ("required" or a named function), whatever --tool-call-parser says.
    std::optional<chat_template::ForcedToolCallStreamParser> forced_calls;
    // stream: reasoning split off as text arrives; its content then goes through tool_calls.
    std::optional<chat_template::ReasoningStreamParser> reasoning;
    // gpt-oss's harmony formats: the output decoded with its special tokens kept (`<|channel|>` and the rest are
    // special tokens the engine's text leaves out), which the parsers read instead; whole: all of it.
    std::optional<tokenizer::StreamingDecoder> special_decoder;
    std::string special_text;
    // echo with logprobs: the prompt's tokens scored (entry 0, the first token, has no score).
    std::vector<std::optional<runtime::GeneratedToken>> prompt_logprobs;
    int tool_calls_sent = 0;
  };

  // Hands choice `index` to the engine (its callbacks come to OnChunk).
  absl::Status SubmitChoice(size_t index);
  // A choice that will never run (the request failed or was cancelled first): finished without a chunk.
  void EndUnsubmittedLocked(Choice& choice);
  // The other samples of the prompt whose first sample is choice `first`.
  void SubmitFollowersLocked(size_t first);

  void CancelAll() {
    std::lock_guard lock(handles_mutex_);
    cancelled_ = true;
    for (const auto& handle : handles_) handle->Cancel();
  }
  void OnChunk(size_t index, runtime::GenerationChunk chunk);
  void StreamLocked(size_t index, const runtime::GenerationChunk& chunk);
  // A chat stream whose output is parsed for reasoning or tool calls: reasoning_content, content and tool-call
  // deltas (OpenAI's and vLLM's shapes).
  // `text`: what the parsers read of the chunk (its text, or for the harmony formats its text with the special
  // tokens kept).
  void StreamParsedLocked(size_t index, const runtime::GenerationChunk& chunk, const std::string& text, bool ends_ok);
  // The harmony formats' text of the chunk: its tokens decoded with their special tokens (and, on the last chunk,
  // what the decoder held).
  std::string SpecialTextLocked(Choice& choice, const runtime::GenerationChunk& chunk);
  void FinishLocked();
  // The whole response of a request that is not streamed, once every choice finished.
  openai::Json WholeBody();
  // The end of a request: counted, out of the in-flight set and the --max-streams count, released.
  void Retire(absl::StatusCode code, bool cut);
  openai::Json ChoiceLogprobs(Choice& choice, const std::vector<runtime::GeneratedToken>& tokens) const;
  // The first prompt token of `choice`'s prompt (its echo entry has no score, so no id of its own).
  int32_t first_prompt_token(const Choice& choice) const {
    const size_t index = static_cast<size_t>(&choice - choices_.data());
    return request_.prompts[index / request_.n].prompt.front();
  }
  openai::Json Usage() const;
  openai::Json ChunkEnvelope() const;
  void WriteEvent(const openai::Json& event);

  const std::shared_ptr<HttpExchange> exchange_;
  const openai::ApiRequest request_;
  const tokenizer::Tokenizer* const tokenizer_;
  Metrics* const metrics_;
  std::unique_ptr<OpenStream> open_;
  const std::chrono::steady_clock::time_point start_;
  const std::string id_;
  const int64_t created_;
  InFlightGenerations* in_flight_ = nullptr;
  runtime::Engine* engine_ = nullptr;  // set by Submit; lives while its callbacks can come
  AdmissionPool* const respond_pool_;  // builds whole responses off the engine's output thread
  const bool share_prefill_;           // n > 1 with the prefix cache: samples after the first wait for its prefill
  std::atomic<bool> cut_{false};
  std::optional<chat_template::ToolCallFormat> tool_call_format_;   // the request's output is parsed for tools
  std::optional<chat_template::ReasoningFormat> reasoning_format_;  // ... and first split into reasoning, content
  bool special_text_ = false;  // the parsers read the output with its special tokens (gpt_oss, openai)

  std::mutex handles_mutex_;  // taken after mutex_, never before it
  std::vector<std::shared_ptr<runtime::RequestHandle>> handles_;
  bool cancelled_ = false;

  std::mutex mutex_;
  std::vector<Choice> choices_;
  size_t finished_ = 0;
  bool submitting_ = true;
  bool done_ = false;
  std::shared_ptr<HttpGeneration> self_;  // held from Submit until the last choice finished
};

}  // namespace strata::server
