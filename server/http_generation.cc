#include "server/http_generation.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/grpc_status.h"
#include "server/http_responses.h"

namespace strata::server {
namespace {

using openai::Json;

// "cmpl-" / "chatcmpl-" and 32 hex digits.
std::string RandomId(absl::string_view prefix) {
  thread_local std::mt19937_64 generator{std::random_device{}()};
  return absl::StrCat(prefix, absl::Hex(generator(), absl::kZeroPad16), absl::Hex(generator(), absl::kZeroPad16));
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

// A chat choice's finish_reason: "tool_calls" when it holds calls; but calls a grammar forced are whole only when
// the grammar ended (a named function's arguments cut by max_tokens still go out as its call: "length").
const char* ChatFinishReason(runtime::FinishReason finish, bool has_calls, bool forced) {
  const bool ended = finish == runtime::FinishReason::kEos || finish == runtime::FinishReason::kStop;
  return has_calls && (!forced || ended) ? "tool_calls" : openai::FinishReasonText(finish);
}

}  // namespace

void RecordHttpRequest(Metrics* metrics, absl::StatusCode code, std::chrono::steady_clock::time_point start) {
  if (metrics != nullptr) {
    metrics->RecordRequest(Api::kHttp, ToGrpc(code),
                           std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
}

HttpGeneration::HttpGeneration(std::shared_ptr<HttpExchange> exchange, openai::ApiRequest request,
                               const tokenizer::Tokenizer* tokenizer, Metrics* metrics,
                               std::unique_ptr<OpenStream> open, std::chrono::steady_clock::time_point start,
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
  if (request_.forced_tool_calls) {
    for (Choice& choice : choices_) choice.forced_calls.emplace(request_.forced_tool_calls->name);
  } else if (request_.parse_tool_calls && tool_call_parser) {
    tool_call_format_ = tool_call_parser;
    for (Choice& choice : choices_) {
      choice.tool_calls.emplace(*tool_call_parser, chat_template::ToolCallIds(),
                                request_.tools ? *request_.tools : Json());
    }
  }
  // A constrained output has no reasoning to split off: its grammar holds from the first token.
  if (request_.route == openai::Route::kChatCompletions && reasoning_parser && request_.structured_kind == nullptr) {
    reasoning_format_ = reasoning_parser;
    for (Choice& choice : choices_) choice.reasoning.emplace(*reasoning_parser, request_.thinking_enabled);
  }
  // gpt-oss's channels are special tokens: the harmony parsers read the output decoded with them (vLLM's read the
  // token ids).
  special_text_ = tokenizer_ != nullptr && ((reasoning_format_ == chat_template::ReasoningFormat::kGptOss) ||
                                            (tool_call_format_ == chat_template::ToolCallFormat::kOpenAi));
  if (special_text_) {
    for (Choice& choice : choices_) choice.special_decoder.emplace(*tokenizer_, /*skip_special_tokens=*/false);
  }
}

std::string HttpGeneration::SpecialTextLocked(Choice& choice, const runtime::GenerationChunk& chunk) {
  std::string text;
  for (const runtime::GeneratedToken& token : chunk.tokens) text += choice.special_decoder->Step(token.id);
  if (chunk.finish) text += choice.special_decoder->Finish();
  return text;
}

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

void HttpGeneration::WriteEvent(const Json& event) {
  exchange_->Write(absl::StrCat("data: ", DumpJson(event), "\n\n"));
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
    if (special_text_) choice.special_text += SpecialTextLocked(choice, chunk);
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
  const std::string special = special_text_ ? SpecialTextLocked(choice, chunk) : std::string();
  const std::string& parsed_text = special_text_ ? special : chunk.text;
  // Tokens whose text is held back (an incomplete character, a possible stop string) make no event
  // unless their log-probabilities were asked for.
  if (parsed_text.empty() && (chunk.tokens.empty() || !request_.logprobs) && !ends_ok) return;
  if (chat && (choice.tool_calls || choice.reasoning || choice.forced_calls)) {
    StreamParsedLocked(index, chunk, parsed_text, ends_ok);
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

void HttpGeneration::StreamParsedLocked(size_t index, const runtime::GenerationChunk& chunk, const std::string& text,
                                        bool ends_ok) {
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
    if (choice.forced_calls) {
      add_tool_deltas(choice.forced_calls->Feed(text));
    } else if (choice.tool_calls) {
      add_tool_deltas(choice.tool_calls->Feed(text));
    } else if (!text.empty()) {
      deltas.push_back(Json{{"content", text}});
    }
  };
  // openai reads the whole output (the harmony channels): the reasoning parser gives only the reasoning then.
  const bool whole = choice.tool_calls && tool_call_format_ && chat_template::ReadsWholeOutput(*tool_call_format_);
  auto add_reasoning_deltas = [&](const std::vector<chat_template::ReasoningDelta>& parts) {
    for (const chat_template::ReasoningDelta& part : parts) {
      if (part.reasoning) {
        deltas.push_back(Json{{"reasoning_content", part.text}});
      } else if (!whole) {
        add_content(part.text);
      }
    }
  };
  if (choice.reasoning) {
    add_reasoning_deltas(choice.reasoning->Feed(text));
    if (chunk.finish) add_reasoning_deltas(choice.reasoning->Finish());
  }
  if (!choice.reasoning || whole) add_content(text);
  if (chunk.finish && choice.tool_calls) add_tool_deltas(choice.tool_calls->Finish());
  if (chunk.finish && choice.forced_calls) add_tool_deltas(choice.forced_calls->Finish());
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
    write(Json::object(), ChatFinishReason(*chunk.finish, choice.tool_calls_sent > 0, choice.forced_calls.has_value()));
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
    std::string text = special_text_ ? choice.special_text : choice.text;
    if (!chat && request_.echo) {
      const std::string& prompt = request_.prompt_texts[index / request_.n];
      if (choice.prompt_logprobs.empty()) choice.text_offset = CodePoints(prompt);
      text = prompt + text;
    }
    const char* finish_reason = choice.finish ? openai::FinishReasonText(*choice.finish) : "abort";
    const bool forced = request_.forced_tool_calls.has_value();
    if (chat && (tool_call_format_ || reasoning_format_ || forced)) {
      // As vLLM: the reasoning split off first (null where its parser says None), then the tool calls of the
      // content alone.
      std::optional<std::string> reasoning;
      std::optional<std::string> content = text;
      std::vector<chat_template::ToolCall> calls;
      if (forced) {
        chat_template::ToolCallIds ids;
        chat_template::ParsedToolCalls parsed =
            chat_template::ParseForcedToolCalls(text, request_.forced_tool_calls->name, ids);
        calls = std::move(parsed.calls);
        if (!calls.empty()) content.reset();
      }
      if (reasoning_format_) {
        chat_template::ParsedReasoning split =
            chat_template::ParseReasoning(*reasoning_format_, text, request_.thinking_enabled);
        reasoning = std::move(split.reasoning);
        content = std::move(split.content);
      }
      // openai reads the harmony channels of the whole output.
      const bool whole = tool_call_format_ && chat_template::ReadsWholeOutput(*tool_call_format_);
      if (whole) content = text;
      if (tool_call_format_ && content) {
        chat_template::ToolCallIds ids;
        chat_template::ParsedToolCalls parsed =
            chat_template::ParseToolCalls(*tool_call_format_, *content, ids, request_.tools.get());
        calls = std::move(parsed.calls);
        // Empty after a cut (calls, or a section marker with none) is vLLM's None.
        if (parsed.content.empty() && (!content->empty() || whole)) {
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
        if (choice.finish) finish_reason = ChatFinishReason(*choice.finish, true, forced);
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
  RecordHttpRequest(metrics_, code, start_);
  if (in_flight_ != nullptr) in_flight_->Remove(this, cut);
  in_flight_ = nullptr;
  open_.reset();
  // The engine's callbacks hold their own references: this object lives until the last returns.
  self_.reset();
}

}  // namespace strata::server
