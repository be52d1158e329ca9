#include "server/http_api.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/chat_prompt.h"
#include "server/generate_validation.h"
#include "tokenizer/utf8.h"

namespace strata::server {
namespace {

using openai::Json;

constexpr char kJson[] = "application/json";

std::string Dump(const Json& json) { return json.dump(-1, ' ', false, Json::error_handler_t::replace); }

HttpResponse JsonResponse(const Json& body, int status = 200) {
  HttpResponse response;
  response.status = status;
  response.body = Dump(body);
  return response;
}

HttpResponse ErrorResponse(const openai::ApiError& error) {
  HttpResponse response;
  response.status = error.status;
  response.body = openai::ErrorBody(error);
  if (error.status == 401) response.headers.emplace_back("WWW-Authenticate", "Bearer");
  return response;
}

HttpResponse ErrorResponse(const absl::Status& status) { return ErrorResponse(openai::ErrorFromStatus(status)); }

grpc::StatusCode ToGrpc(absl::StatusCode code) { return static_cast<grpc::StatusCode>(static_cast<int>(code)); }

// "cmpl-" / "chatcmpl-" and 32 hex digits.
std::string RandomId(absl::string_view prefix) {
  thread_local std::mt19937_64 generator{std::random_device{}()};
  return absl::StrCat(prefix, absl::Hex(generator(), absl::kZeroPad16), absl::Hex(generator(), absl::kZeroPad16));
}

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// JSON has no infinities: a log-probability of -inf (a token the model rules out) is written as vLLM
// writes it.
double Logprob(double value) { return std::isfinite(value) ? value : -9999.0; }

Json Bytes(std::string_view text) {
  Json bytes = Json::array();
  for (unsigned char c : text) bytes.push_back(static_cast<int>(c));
  return bytes;
}

int64_t CodePoints(std::string_view text) {
  int64_t n = 0;
  for (unsigned char c : text) n += (c & 0xC0) != 0x80;
  return n;
}

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

// One /v1/completions or /v1/chat/completions request the engine generates for: every choice (prompt x
// n) is an engine request; their chunks become SSE events (stream) or, once all have finished, one
// response. Kept alive by the engine's callbacks; listed in InFlightGenerations while it runs.
class HttpGeneration final : public CuttableGeneration, public std::enable_shared_from_this<HttpGeneration> {
 public:
  HttpGeneration(std::shared_ptr<HttpExchange> exchange, openai::ApiRequest request,
                 const tokenizer::Tokenizer* tokenizer, Metrics* metrics, std::unique_ptr<OpenStream> open,
                 std::chrono::steady_clock::time_point start,
                 std::optional<chat_template::ToolCallFormat> tool_call_parser,
                 std::optional<chat_template::ReasoningFormat> reasoning_parser, bool prefix_cache,
                 AdmissionPool* respond_pool)
      : exchange_(std::move(exchange)),
        request_(std::move(request)),
        tokenizer_(tokenizer),
        metrics_(metrics),
        open_(std::move(open)),
        start_(start),
        id_(RandomId(request_.route == openai::Route::kChatCompletions ? "chatcmpl-" : "cmpl-")),
        created_(UnixSeconds()),
        respond_pool_(respond_pool),
        share_prefill_(prefix_cache && request_.n > 1),
        choices_(static_cast<size_t>(request_.choices())) {
    if (request_.parse_tool_calls && tool_call_parser) {
      tool_call_format_ = tool_call_parser;
      for (Choice& choice : choices_) choice.tool_calls.emplace(*tool_call_parser);
    }
    if (request_.route == openai::Route::kChatCompletions && reasoning_parser) {
      reasoning_format_ = reasoning_parser;
      for (Choice& choice : choices_) choice.reasoning.emplace(*reasoning_parser, request_.thinking_enabled);
    }
  }

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
    // stream: reasoning split off as text arrives; its content then goes through tool_calls.
    std::optional<chat_template::ReasoningStreamParser> reasoning;
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
  void StreamParsedLocked(size_t index, const runtime::GenerationChunk& chunk, bool ends_ok);
  void FinishLocked();
  // The whole response of a request that is not streamed, once every choice finished.
  Json WholeBody();
  // The end of a request: counted, out of the in-flight set and the --max-streams count, released.
  void Retire(absl::StatusCode code, bool cut);
  Json ChoiceLogprobs(Choice& choice, const std::vector<runtime::GeneratedToken>& tokens) const;
  // The first prompt token of `choice`'s prompt (its echo entry has no score, so no id of its own).
  int32_t first_prompt_token(const Choice& choice) const {
    const size_t index = static_cast<size_t>(&choice - choices_.data());
    return request_.prompts[index / request_.n].prompt.front();
  }
  Json Usage() const;
  Json ChunkEnvelope() const;
  void WriteEvent(const Json& event) { exchange_->Write(absl::StrCat("data: ", Dump(event), "\n\n")); }
  void Record(absl::StatusCode code);

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

absl::Status HttpGeneration::Submit(runtime::Engine& engine, InFlightGenerations* in_flight) {
  self_ = shared_from_this();
  engine_ = &engine;
  in_flight_ = in_flight;
  in_flight->Add(this);
  // Weak: the exchange (its connection) may outlive this generation, and its client may leave after the last
  // choice finished and this object is gone (a whole response still being sent when the socket closes).
  exchange_->OnClientGone([weak = weak_from_this()] {
    if (std::shared_ptr<HttpGeneration> self = weak.lock()) self->CancelAll();
  });
  if (request_.stream) {
    exchange_->BeginStream("text/event-stream", {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}});
  }
  absl::Status refused;
  for (size_t index = 0; index < choices_.size() && refused.ok(); ++index) {
    // With the prefix cache, a prompt's other samples wait for its first one's prefill (OnChunk submits
    // them): they then find its blocks in the cache, so the prompt is prefilled once.
    if (share_prefill_ && index % request_.n != 0) continue;
    refused = SubmitChoice(index);
  }
  std::lock_guard lock(mutex_);
  submitting_ = false;
  if (!refused.ok()) {
    bool any_submitted = false;
    for (const Choice& choice : choices_) any_submitted |= choice.submitted;
    if (!any_submitted) {
      // No callback will come: the caller answers.
      in_flight_->Remove(this, false);
      in_flight_ = nullptr;
      done_ = true;
      self_.reset();
      return refused;
    }
    // The queue filled up midway: the choices already queued are cancelled; the answer is the refusal.
    for (Choice& choice : choices_) {
      if (choice.error.ok()) choice.error = refused;
      if (!choice.submitted && !choice.finished) EndUnsubmittedLocked(choice);
    }
    CancelAll();
  }
  if (finished_ == choices_.size()) FinishLocked();
  return absl::OkStatus();
}

absl::Status HttpGeneration::SubmitChoice(size_t index) {
  runtime::GenerationRequest one = request_.prompts[index / request_.n];
  const int64_t sample = static_cast<int64_t>(index % request_.n);
  // n samples of one seeded prompt: each its own reproducible draw.
  if (one.sampling.seed && sample > 0) *one.sampling.seed += static_cast<uint64_t>(sample);
  one.request_id = absl::StrCat(id_, "-", index);
  const int64_t prompt_tokens = static_cast<int64_t>(one.prompt.size());
  absl::StatusOr<std::shared_ptr<runtime::RequestHandle>> handle = engine_->Submit(
      std::move(one),
      [self = shared_from_this(), index](runtime::GenerationChunk chunk) { self->OnChunk(index, std::move(chunk)); });
  if (!handle.ok()) return handle.status();
  choices_[index].submitted = true;
  if (metrics_ != nullptr && sample == 0) metrics_->RecordPromptTokens(prompt_tokens);
  std::lock_guard lock(handles_mutex_);
  handles_.push_back(*handle);
  if (cancelled_) handles_.back()->Cancel();
  return absl::OkStatus();
}

void HttpGeneration::EndUnsubmittedLocked(Choice& choice) {
  choice.finished = true;
  choice.finish = runtime::FinishReason::kCancelled;
  ++finished_;
}

void HttpGeneration::SubmitFollowersLocked(size_t first) {
  // The prompt's blocks are in the prefix cache now (its first sample produced a token, or ended).
  bool cancelled = cut_.load();
  {
    std::lock_guard lock(handles_mutex_);
    cancelled |= cancelled_;
  }
  for (size_t index = first + 1; index < first + static_cast<size_t>(request_.n); ++index) {
    Choice& choice = choices_[index];
    if (choice.submitted || choice.finished) continue;
    absl::Status submitted =
        cancelled || !choices_[first].error.ok() ? absl::CancelledError("not started") : SubmitChoice(index);
    if (!submitted.ok()) {
      if (!cancelled && choices_[first].error.ok()) choice.error = submitted;
      EndUnsubmittedLocked(choice);
    }
  }
}

void HttpGeneration::OnChunk(size_t index, runtime::GenerationChunk chunk) {
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard lock(mutex_);
  Choice& choice = choices_[index];
  if (metrics_ != nullptr && !chunk.tokens.empty()) {
    if (!choice.last_token) {
      metrics_->ObserveTimeToFirstToken(Api::kHttp, std::chrono::duration<double>(now - start_).count());
    } else {
      metrics_->ObserveInterTokenLatency(Api::kHttp, std::chrono::duration<double>(now - *choice.last_token).count());
    }
    metrics_->RecordGeneratedTokens(static_cast<int64_t>(chunk.tokens.size()));
    choice.last_token = now;
  }
  choice.prompt_tokens = chunk.prompt_tokens;
  choice.completion_tokens = chunk.completion_tokens;
  if (!chunk.prompt_logprobs.empty()) choice.prompt_logprobs = std::move(chunk.prompt_logprobs);
  if (chunk.finish) {
    choice.finish = chunk.finish;
    if (*chunk.finish == runtime::FinishReason::kError && choice.error.ok()) choice.error = chunk.error;
  }
  if (request_.stream) {
    StreamLocked(index, chunk);
  } else {
    choice.text += chunk.text;
    if (request_.logprobs) choice.tokens.insert(choice.tokens.end(), chunk.tokens.begin(), chunk.tokens.end());
  }
  if (share_prefill_ && index % request_.n == 0 && !choice.followers_started) {
    choice.followers_started = true;
    SubmitFollowersLocked(index);
  }
  if (chunk.finish) {
    choice.finished = true;
    ++finished_;
  }
  if (finished_ == choices_.size() && !submitting_) FinishLocked();
}

Json HttpGeneration::ChoiceLogprobs(Choice& choice, const std::vector<runtime::GeneratedToken>& tokens) const {
  if (request_.route == openai::Route::kChatCompletions) {
    Json content = Json::array();
    for (const runtime::GeneratedToken& token : tokens) {
      const std::string text = openai::TokenText(tokenizer_, token.id);
      Json top = Json::array();
      for (const auto& [id, logprob] : token.top) {
        const std::string top_text = openai::TokenText(tokenizer_, id);
        top.push_back({{"token", top_text}, {"logprob", Logprob(logprob)}, {"bytes", Bytes(top_text)}});
      }
      content.push_back(
          {{"token", text}, {"logprob", Logprob(token.logprob)}, {"bytes", Bytes(text)}, {"top_logprobs", top}});
    }
    return Json{{"content", content}};
  }
  Json out = {{"tokens", Json::array()},
              {"token_logprobs", Json::array()},
              {"top_logprobs", Json::array()},
              {"text_offset", Json::array()}};
  // echo: the prompt's tokens first, once (the first has no score: null, as OpenAI writes it).
  for (const std::optional<runtime::GeneratedToken>& token : std::exchange(choice.prompt_logprobs, {})) {
    const int32_t id = token ? token->id : first_prompt_token(choice);
    const std::string text = openai::TokenText(tokenizer_, id);
    out["tokens"].push_back(text);
    out["text_offset"].push_back(choice.text_offset);
    choice.text_offset += CodePoints(text);
    if (!token) {
      out["token_logprobs"].push_back(nullptr);
      out["top_logprobs"].push_back(nullptr);
      continue;
    }
    out["token_logprobs"].push_back(Logprob(token->logprob));
    Json top = Json::object();
    for (const auto& [top_id, logprob] : token->top) top[openai::TokenText(tokenizer_, top_id)] = Logprob(logprob);
    top[text] = Logprob(token->logprob);
    out["top_logprobs"].push_back(std::move(top));
  }
  for (const runtime::GeneratedToken& token : tokens) {
    const std::string text = openai::TokenText(tokenizer_, token.id);
    out["tokens"].push_back(text);
    out["token_logprobs"].push_back(Logprob(token.logprob));
    // The k most likely tokens, and the one sampled (as vLLM lists them).
    Json top = Json::object();
    for (const auto& [id, logprob] : token.top) top[openai::TokenText(tokenizer_, id)] = Logprob(logprob);
    top[text] = Logprob(token.logprob);
    out["top_logprobs"].push_back(std::move(top));
    out["text_offset"].push_back(choice.text_offset);
    choice.text_offset += CodePoints(text);
  }
  return out;
}

Json HttpGeneration::Usage() const {
  int64_t prompt = 0;
  int64_t completion = 0;
  for (size_t index = 0; index < choices_.size(); ++index) {
    // Each prompt counts once, however many samples it has (OpenAI's usage).
    if (index % request_.n == 0) prompt += choices_[index].prompt_tokens;
    completion += choices_[index].completion_tokens;
  }
  return {{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion}};
}

Json HttpGeneration::ChunkEnvelope() const {
  const bool chat = request_.route == openai::Route::kChatCompletions;
  Json event = {{"id", id_},
                {"object", chat ? "chat.completion.chunk" : "text_completion"},
                {"created", created_},
                {"model", request_.model},
                {"choices", Json::array()}};
  if (request_.include_usage) event["usage"] = nullptr;
  return event;
}

void HttpGeneration::StreamLocked(size_t index, const runtime::GenerationChunk& chunk) {
  Choice& choice = choices_[index];
  const bool chat = request_.route == openai::Route::kChatCompletions;
  if (!choice.started) {
    choice.started = true;
    const std::string& prompt = request_.prompt_texts[index / request_.n];
    if (chat || request_.echo) {
      Json event = ChunkEnvelope();
      Json c = {{"index", index}};
      if (chat) {
        c["delta"] = {{"role", "assistant"}, {"content", ""}};
      } else {
        c["text"] = prompt;
        if (request_.logprobs && !choice.prompt_logprobs.empty()) {
          c["logprobs"] = ChoiceLogprobs(choice, {});
        } else {
          choice.text_offset = CodePoints(prompt);
        }
      }
      if (!c.contains("logprobs")) c["logprobs"] = nullptr;
      c["finish_reason"] = nullptr;
      event["choices"].push_back(std::move(c));
      WriteEvent(event);
    }
  }
  const bool ends_ok = chunk.finish && choice.error.ok() && *chunk.finish != runtime::FinishReason::kCancelled;
  // Tokens whose text is held back (an incomplete character, a possible stop string) make no event
  // unless their log-probabilities were asked for.
  if (chunk.text.empty() && (chunk.tokens.empty() || !request_.logprobs) && !ends_ok) return;
  if (chat && (choice.tool_calls || choice.reasoning)) {
    StreamParsedLocked(index, chunk, ends_ok);
    return;
  }
  Json event = ChunkEnvelope();
  Json c = {{"index", index}};
  if (chat) {
    c["delta"] = chunk.text.empty() && chunk.finish ? Json::object() : Json{{"content", chunk.text}};
  } else {
    c["text"] = chunk.text;
  }
  c["logprobs"] = request_.logprobs && !chunk.tokens.empty() ? ChoiceLogprobs(choice, chunk.tokens) : Json();
  c["finish_reason"] = ends_ok ? Json(openai::FinishReasonText(*chunk.finish)) : Json();
  event["choices"].push_back(std::move(c));
  WriteEvent(event);
}

void HttpGeneration::StreamParsedLocked(size_t index, const runtime::GenerationChunk& chunk, bool ends_ok) {
  Choice& choice = choices_[index];
  // The chunk's events' deltas, in order: the reasoning parser's first, its content through the tool-call
  // parser (tool calls come from the content alone, as vLLM parses them).
  std::vector<Json> deltas;
  auto add_tool_deltas = [&](std::vector<chat_template::ToolCallDelta> parts) {
    for (chat_template::ToolCallDelta& delta : parts) {
      if (delta.tool_index < 0) {
        if (!delta.content.empty()) deltas.push_back(Json{{"content", std::move(delta.content)}});
        continue;
      }
      Json call = {{"index", delta.tool_index}};
      if (!delta.id.empty()) {
        call["id"] = delta.id;
        call["type"] = "function";
        call["function"] = {{"name", delta.name}, {"arguments", delta.arguments}};
        choice.tool_calls_sent = std::max(choice.tool_calls_sent, delta.tool_index + 1);
      } else {
        call["function"] = {{"arguments", delta.arguments}};
      }
      deltas.push_back(Json{{"tool_calls", Json::array({call})}});
    }
  };
  auto add_content = [&](const std::string& text) {
    if (choice.tool_calls) {
      add_tool_deltas(choice.tool_calls->Feed(text));
    } else if (!text.empty()) {
      deltas.push_back(Json{{"content", text}});
    }
  };
  auto add_reasoning_deltas = [&](const std::vector<chat_template::ReasoningDelta>& parts) {
    for (const chat_template::ReasoningDelta& part : parts) {
      if (part.reasoning) {
        deltas.push_back(Json{{"reasoning_content", part.text}});
      } else {
        add_content(part.text);
      }
    }
  };
  if (choice.reasoning) {
    add_reasoning_deltas(choice.reasoning->Feed(chunk.text));
    if (chunk.finish) add_reasoning_deltas(choice.reasoning->Finish());
  } else {
    add_content(chunk.text);
  }
  if (chunk.finish && choice.tool_calls) add_tool_deltas(choice.tool_calls->Finish());
  // Log-probabilities ride on the first event of the chunk (or one of their own).
  Json logprobs = request_.logprobs && !chunk.tokens.empty() ? ChoiceLogprobs(choice, chunk.tokens) : Json();
  auto write = [&](Json delta, Json finish_reason) {
    Json event = ChunkEnvelope();
    event["choices"].push_back(
        {{"index", index}, {"delta", std::move(delta)}, {"logprobs", logprobs}, {"finish_reason", finish_reason}});
    logprobs = Json();
    WriteEvent(event);
  };
  for (Json& delta : deltas) write(std::move(delta), Json());
  if (ends_ok) {
    write(Json::object(), choice.tool_calls_sent > 0 ? "tool_calls" : openai::FinishReasonText(*chunk.finish));
  } else if (!logprobs.is_null()) {
    write(Json::object(), Json());
  }
}

Json HttpGeneration::WholeBody() {
  const bool chat = request_.route == openai::Route::kChatCompletions;
  Json choices = Json::array();
  for (size_t index = 0; index < choices_.size(); ++index) {
    Choice& choice = choices_[index];
    Json c = {{"index", index}};
    std::string text = choice.text;
    if (!chat && request_.echo) {
      const std::string& prompt = request_.prompt_texts[index / request_.n];
      if (choice.prompt_logprobs.empty()) choice.text_offset = CodePoints(prompt);
      text = prompt + text;
    }
    const char* finish_reason = choice.finish ? openai::FinishReasonText(*choice.finish) : "abort";
    if (chat && (tool_call_format_ || reasoning_format_)) {
      // As vLLM: the reasoning split off first (null where its parser says None), then the tool calls of the
      // content alone.
      std::optional<std::string> reasoning;
      std::optional<std::string> content = text;
      if (reasoning_format_) {
        chat_template::ParsedReasoning split =
            chat_template::ParseReasoning(*reasoning_format_, text, request_.thinking_enabled);
        reasoning = std::move(split.reasoning);
        content = std::move(split.content);
      }
      std::vector<chat_template::ToolCall> calls;
      if (tool_call_format_ && content) {
        chat_template::ToolCallIds ids;
        chat_template::ParsedToolCalls parsed = chat_template::ParseToolCalls(*tool_call_format_, *content, ids);
        calls = std::move(parsed.calls);
        // Empty after a cut (calls, or a section marker with none) is vLLM's None.
        if (parsed.content.empty() && !content->empty()) {
          content.reset();
        } else {
          content = std::move(parsed.content);
        }
      }
      Json message = {{"role", "assistant"}, {"content", content ? Json(*content) : Json()}};
      if (reasoning_format_) message["reasoning_content"] = reasoning ? Json(*reasoning) : Json();
      if (!calls.empty()) {
        Json tool_calls = Json::array();
        for (const chat_template::ToolCall& call : calls) {
          tool_calls.push_back({{"id", call.id},
                                {"type", "function"},
                                {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
        }
        message["tool_calls"] = std::move(tool_calls);
        finish_reason = "tool_calls";
      }
      c["message"] = std::move(message);
    } else if (chat) {
      c["message"] = {{"role", "assistant"}, {"content", text}};
    } else {
      c["text"] = text;
    }
    c["logprobs"] = request_.logprobs ? ChoiceLogprobs(choice, choice.tokens) : Json();
    c["finish_reason"] = finish_reason;
    choices.push_back(std::move(c));
  }
  return Json{{"id", id_},
              {"object", chat ? "chat.completion" : "text_completion"},
              {"created", created_},
              {"model", request_.model},
              {"choices", std::move(choices)},
              {"usage", Usage()}};
}

void HttpGeneration::Record(absl::StatusCode code) {
  if (metrics_ != nullptr) {
    metrics_->RecordRequest(Api::kHttp, ToGrpc(code),
                            std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
  }
}

void HttpGeneration::FinishLocked() {
  if (done_) return;
  done_ = true;
  // Why the request as a whole did not complete, if it did not: a refusal or an engine error of any
  // choice, the drain's cut, or the client gone.
  absl::Status failure;
  for (const Choice& choice : choices_) {
    if (!choice.error.ok()) {
      failure = choice.error;
      break;
    }
  }
  const bool cut = cut_.load();
  if (failure.ok() && cut) {
    failure = absl::UnavailableError("the server is draining: its --drain-timeout ended this generation");
  }
  const bool gone = exchange_->client_gone();
  if (gone && failure.ok()) {
    // Counted as gRPC counts a stream cut for the same reasons: RESOURCE_EXHAUSTED for a client that did not
    // read, CANCELLED for one that left.
    failure = exchange_->overflowed()
                  ? absl::ResourceExhaustedError("the client did not read: more than --max-stream-buffer-bytes unread")
                  : absl::CancelledError("the client disconnected");
  }

  if (request_.stream) {
    if (!failure.ok()) {
      if (!gone) WriteEvent(openai::ErrorJson(openai::ErrorFromStatus(failure)));
    } else if (request_.include_usage) {
      Json event = ChunkEnvelope();
      event["usage"] = Usage();
      WriteEvent(event);
    }
    exchange_->Write("data: [DONE]\n\n");
    exchange_->End();
  } else if (!failure.ok()) {
    exchange_->Respond(ErrorResponse(failure));
  } else {
    // Built off the engine's output thread, which feeds every other stream: n choices with logprobs and an
    // echoed prompt make megabytes of JSON (bounded by --max-response-tokens). Nothing else touches the
    // choices once all have finished.
    respond_pool_->Post([self = shared_from_this(), cut] {
      self->exchange_->Respond(JsonResponse(self->WholeBody()));
      self->Retire(absl::StatusCode::kOk, cut);
    });
    return;
  }
  Retire(failure.code(), cut);
}

void HttpGeneration::Retire(absl::StatusCode code, bool cut) {
  Record(code);
  if (in_flight_ != nullptr) in_flight_->Remove(this, cut);
  in_flight_ = nullptr;
  open_.reset();
  // The engine's callbacks hold their own references: this object lives until the last returns.
  self_.reset();
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpApi>> HttpApi::Start(HttpApiOptions options, InferenceService* service) {
  std::unique_ptr<HttpApi> api(new HttpApi(std::move(options), service));
  const_cast<int64_t&>(api->created_) = UnixSeconds();
  HttpApi* raw = api.get();
  absl::StatusOr<std::unique_ptr<HttpServer>> http =
      HttpServer::Start(api->options_.address, api->options_.http,
                        [raw](std::shared_ptr<HttpExchange> exchange) { raw->Handle(exchange); });
  if (!http.ok()) return http.status();
  api->http_ = *std::move(http);
  return api;
}

HttpApi::~HttpApi() {
  // Closing the port cuts every exchange (its client counted gone), so an admission still queued on the
  // pool returns at once; one running finishes against this object first.
  http_.reset();
  while (pool_jobs_.load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

openai::ApiContext HttpApi::Context(const ServedModel& model) const {
  openai::ApiContext context;
  context.model_name = options_.model_name;
  context.limits = model.limits();
  context.api = options_.limits;
  context.tokenizer = model.tokenizer();
  context.chat_template = model.chat_template();
  context.parse_tool_calls = options_.tool_call_parser.has_value();
  return context;
}

void HttpApi::Handle(const std::shared_ptr<HttpExchange>& exchange) {
  const HttpRequest& request = exchange->request();
  const std::string& path = request.path;
  const bool get = request.method == "GET" || request.method == "HEAD";
  const bool post = request.method == "POST";
  auto wrong_method = [&](const char* allowed) {
    openai::ApiError error;
    error.status = 405;
    error.message = absl::StrCat(request.method, " ", path, ": use ", allowed);
    HttpResponse response = ErrorResponse(error);
    response.headers.emplace_back("Allow", allowed);
    exchange->Respond(std::move(response));
  };
  if (path == "/health") {
    if (!get) return wrong_method("GET");
    HttpResponse response;
    response.status = serving_.load() ? 200 : 503;
    response.content_type = "text/plain";
    exchange->Respond(std::move(response));
    return;
  }
  // Every other route needs a key when the server has them.
  if (options_.api_keys != nullptr) {
    const absl::Status verdict = CheckAuthorization(
        *options_.api_keys,
        [&] {
          std::vector<absl::string_view> values;
          for (std::string_view value : request.Header("authorization"))
            values.emplace_back(value.data(), value.size());
          return values;
        }(),
        KeyCarrier::kHttpHeader);
    if (!verdict.ok()) {
      if (Metrics* metrics = service_->metrics()) metrics->RecordUnauthenticated(Api::kHttp);
      exchange->Respond(ErrorResponse(absl::UnauthenticatedError(verdict.message())));
      return;
    }
  }
  if (path == "/v1/models") {
    if (!get) return wrong_method("GET");
    absl::StatusOr<ServedModel*> model = service_->ModelForGeneration();
    Json entry = {{"id", options_.model_name}, {"object", "model"},           {"created", created_},
                  {"owned_by", "strata"},      {"root", options_.model_name}, {"parent", nullptr}};
    if (model.ok()) entry["max_model_len"] = (*model)->limits().max_context;
    exchange->Respond(JsonResponse({{"object", "list"}, {"data", Json::array({entry})}}));
    return;
  }
  if (path == "/v1/completions" || path == "/v1/chat/completions") {
    if (!post) return wrong_method("POST");
    Generate(exchange, path == "/v1/completions" ? openai::Route::kCompletions : openai::Route::kChatCompletions);
    return;
  }
  if (path == "/tokenize" || path == "/detokenize") {
    if (!post) return wrong_method("POST");
    Tokenize(exchange, path == "/detokenize");
    return;
  }
  openai::ApiError error;
  error.status = 404;
  error.message = absl::StrCat(path,
                               ": not found; strata serves /v1/completions, /v1/chat/completions, /v1/models, "
                               "/tokenize, /detokenize and /health");
  error.code = "not_found";
  exchange->Respond(ErrorResponse(error));
}

void HttpApi::Refuse(HttpExchange& exchange, const absl::Status& status, std::chrono::steady_clock::time_point start) {
  if (Metrics* metrics = service_->metrics()) {
    metrics->RecordRequest(Api::kHttp, ToGrpc(status.code()),
                           std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  exchange.Respond(ErrorResponse(status));
}

void HttpApi::Generate(const std::shared_ptr<HttpExchange>& exchange, openai::Route route) {
  const auto start = std::chrono::steady_clock::now();
  auto refuse = [&](const absl::Status& status) { Refuse(*exchange, status, start); };
  absl::StatusOr<ServedModel*> model = service_->ModelForGeneration();
  if (!model.ok()) return refuse(model.status());
  if (static_cast<int64_t>(exchange->request().body.size()) <= kInlineAdmissionBytes) {
    Admit(exchange, route, *model, start);
  } else {
    pool_jobs_.fetch_add(1);
    service_->admission_pool().Post([this, exchange, route, model = *model, start] {
      if (!exchange->client_gone()) Admit(exchange, route, model, start);
      pool_jobs_.fetch_sub(1);
    });
  }
}

void HttpApi::Admit(const std::shared_ptr<HttpExchange>& exchange, openai::Route route, ServedModel* model,
                    std::chrono::steady_clock::time_point start) {
  Metrics* metrics = service_->metrics();
  auto open = std::make_unique<OpenStream>(&service_->open_streams_counter());
  auto refuse = [&](const absl::Status& status) { Refuse(*exchange, status, start); };
  const int64_t max_streams = service_->limits().max_streams;
  if (open->open_at_start() > max_streams) {
    return refuse(absl::ResourceExhaustedError(absl::StrCat(
        open->open_at_start() - 1, " generations are open, the server's limit is ", max_streams, " (--max-streams)")));
  }
  absl::StatusOr<openai::ApiRequest> request =
      openai::ParseApiRequest(route, exchange->request().body, Context(*model));
  if (!request.ok()) return refuse(request.status());
  auto generation = std::make_shared<HttpGeneration>(
      exchange, *std::move(request), model->tokenizer(), metrics, std::move(open), start, options_.tool_call_parser,
      options_.reasoning_parser, options_.prefix_cache, &service_->admission_pool());
  const absl::Status submitted = service_->SubmitUnlessDraining(
      model, [&] { return generation->Submit(model->engine(), &service_->in_flight()); });
  if (!submitted.ok()) refuse(submitted);
}

void HttpApi::Tokenize(const std::shared_ptr<HttpExchange>& exchange, bool detokenize) {
  absl::StatusOr<ServedModel*> model = service_->ModelForGeneration();
  if (!model.ok()) return exchange->Respond(ErrorResponse(model.status()));
  const openai::ApiContext context = Context(**model);
  absl::StatusOr<Json> request = openai::ParseJsonObject(exchange->request().body, context.api.max_json_depth);
  if (!request.ok()) return exchange->Respond(ErrorResponse(request.status()));
  const tokenizer::Tokenizer* tokenizer = context.tokenizer;
  if (tokenizer == nullptr) {
    return exchange->Respond(ErrorResponse(absl::FailedPreconditionError("the model has no tokenizer.json")));
  }
  if (detokenize) {
    auto tokens = request->find("tokens");
    if (tokens == request->end() || !tokens->is_array()) {
      return exchange->Respond(ErrorResponse(absl::InvalidArgumentError("tokens: missing: a list of token ids")));
    }
    std::vector<int32_t> ids;
    for (size_t i = 0; i < tokens->size(); ++i) {
      const Json& id = (*tokens)[i];
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= context.limits.vocab_size) {
        return exchange->Respond(ErrorResponse(absl::InvalidArgumentError(
            absl::StrCat("tokens[", i, "]: not a token id in [0, ", context.limits.vocab_size, ")"))));
      }
      ids.push_back(id.get<int32_t>());
    }
    return exchange->Respond(JsonResponse({{"prompt", tokenizer->Decode(ids, /*skip_special_tokens=*/false)}}));
  }
  std::string text;
  bool add_special_tokens = true;
  if (request->contains("messages")) {
    absl::StatusOr<std::string> rendered = RenderChat(*request, context.chat_template, context.limits.max_messages);
    if (!rendered.ok()) return exchange->Respond(ErrorResponse(rendered.status()));
    text = *std::move(rendered);
    add_special_tokens = false;
  } else {
    auto prompt = request->find("prompt");
    if (prompt == request->end() || !prompt->is_string()) {
      return exchange->Respond(
          ErrorResponse(absl::InvalidArgumentError("prompt: missing: a string (or give messages)")));
    }
    text = prompt->get<std::string>();
  }
  if (auto add = request->find("add_special_tokens"); add != request->end()) {
    if (!add->is_boolean()) {
      return exchange->Respond(ErrorResponse(absl::InvalidArgumentError("add_special_tokens: must be a boolean")));
    }
    add_special_tokens = add->get<bool>();
  }
  if (static_cast<int64_t>(text.size()) > context.limits.max_prompt_bytes) {
    return exchange->Respond(ErrorResponse(
        absl::InvalidArgumentError(absl::StrCat("prompt: ", text.size(), " bytes, more than the server's limit of ",
                                                context.limits.max_prompt_bytes, " bytes"))));
  }
  absl::StatusOr<std::vector<int32_t>> ids = tokenizer->Encode(text, add_special_tokens);
  if (!ids.ok()) return exchange->Respond(ErrorResponse(absl::InvalidArgumentError(ids.status().message())));
  exchange->Respond(JsonResponse({{"count", ids->size()},
                                  {"max_model_len", context.limits.max_context},
                                  {"tokens", *ids},
                                  {"token_strs", nullptr}}));
}

}  // namespace strata::server
