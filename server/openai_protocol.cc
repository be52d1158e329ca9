#include "server/openai_protocol.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/json.h"
#include "server/chat_prompt.h"
#include "server/constraint_fields.h"
#include "server/generate_validation.h"

namespace strata::server::openai {
namespace {

using json_fields::Bool;
using json_fields::Field;
using json_fields::Integer;
using json_fields::IntegerValue;
using json_fields::Invalid;
using json_fields::Number;
using json_fields::String;
using json_fields::TypeName;

#define STRATA_ASSIGN_OR_RETURN(lhs, expr)      \
  auto lhs##_or = (expr);                       \
  if (!lhs##_or.ok()) return lhs##_or.status(); \
  auto lhs = *std::move(lhs##_or)

// The top-level field of `body` (a JSON object's text) whose value nests deeper than `max_depth` levels (counted
// as base::CheckJsonDepth counts them: the body itself is level 1), or "". Run only on a body the bounded parser
// refused.
std::string FieldNestingDeeper(std::string_view body, int max_depth) {
  int depth = 0;
  bool in_string = false;
  size_t string_start = 0;
  std::string_view last_string, key;
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character cannot end the string
      } else if (c == '"') {
        in_string = false;
        last_string = body.substr(string_start, i - string_start);
      }
    } else if (c == '"') {
      in_string = true;
      string_start = i + 1;
    } else if (c == ':' && depth == 1) {
      key = last_string;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) {
        if (depth == 1 || key.empty()) return "";
        return key.size() > 64 ? absl::StrCat(absl::string_view(key.data(), 64), "...") : std::string(key);
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return "";
}

// "stop": a string or a list of strings.
absl::Status ReadStop(const Json& request, GenerateInput& input) {
  const Json* stop = Field(request, "stop");
  if (stop == nullptr) return absl::OkStatus();
  if (stop->is_string()) {
    input.stop.push_back(stop->get<std::string>());
    return absl::OkStatus();
  }
  if (!stop->is_array())
    return Invalid("stop", absl::StrCat("must be a string or a list of strings, not ", TypeName(*stop)));
  for (size_t i = 0; i < stop->size(); ++i) {
    if (!(*stop)[i].is_string()) return Invalid(absl::StrCat("stop[", i, "]"), "must be a string");
    input.stop.push_back((*stop)[i].get<std::string>());
  }
  return absl::OkStatus();
}

// The sampling fields both routes share, into `input`; `n`, the stream flags.
absl::Status ReadSampling(const Json& request, const ApiLimits& api, GenerateInput& input, ApiRequest& out) {
  STRATA_ASSIGN_OR_RETURN(temperature, Number(request, "temperature"));
  // OpenAI's default is 1 (sampling); 0 is greedy.
  input.temperature = static_cast<float>(temperature.value_or(1.0));
  STRATA_ASSIGN_OR_RETURN(top_p, Number(request, "top_p"));
  if (top_p) input.top_p = static_cast<float>(*top_p);
  STRATA_ASSIGN_OR_RETURN(top_k, Integer(request, "top_k"));
  // vLLM's extra: 0 or -1 turn top-k off.
  if (top_k) input.top_k = *top_k == -1 ? 0 : *top_k;
  STRATA_ASSIGN_OR_RETURN(repetition_penalty, Number(request, "repetition_penalty"));
  if (repetition_penalty) input.repetition_penalty = static_cast<float>(*repetition_penalty);
  STRATA_ASSIGN_OR_RETURN(seed, Integer(request, "seed"));
  if (seed) input.seed = static_cast<uint64_t>(*seed);
  STRATA_ASSIGN_OR_RETURN(ignore_eos, Bool(request, "ignore_eos"));
  input.ignore_eos = ignore_eos.value_or(false);
  STRATA_ASSIGN_OR_RETURN(speculative, Bool(request, "speculative"));
  input.speculative = speculative.value_or(true);
  if (absl::Status stop = ReadStop(request, input); !stop.ok()) return stop;
  STRATA_ASSIGN_OR_RETURN(user, String(request, "user"));
  (void)user;  // accepted, as OpenAI's: strata has no per-user policy
  STRATA_ASSIGN_OR_RETURN(presence_penalty, Number(request, "presence_penalty"));
  input.presence_penalty = static_cast<float>(presence_penalty.value_or(0));
  STRATA_ASSIGN_OR_RETURN(frequency_penalty, Number(request, "frequency_penalty"));
  input.frequency_penalty = static_cast<float>(frequency_penalty.value_or(0));
  STRATA_ASSIGN_OR_RETURN(min_tokens, Integer(request, "min_tokens"));
  input.min_tokens = min_tokens.value_or(0);
  if (const Json* bias = Field(request, "logit_bias"); bias != nullptr) {
    if (!bias->is_object()) return Invalid("logit_bias", "must be an object {\"token id\": bias}");
    if (static_cast<int64_t>(bias->size()) > api.max_logit_bias) {
      return Invalid("logit_bias", absl::StrCat(bias->size(), " entries, more than the limit of ", api.max_logit_bias));
    }
    for (const auto& [key, value] : bias->items()) {
      const std::string field = absl::StrCat("logit_bias[\"", key, "\"]");
      int64_t id = 0;
      if (!absl::SimpleAtoi(key, &id)) return Invalid(field, "the key must be a token id");
      if (!value.is_number()) return Invalid(field, "must be a number");
      input.logit_bias.emplace_back(id, value.get<float>());
    }
  }
  STRATA_ASSIGN_OR_RETURN(n, Integer(request, "n"));
  out.n = n.value_or(1);
  if (out.n < 1) return Invalid("n", absl::StrCat(out.n, " is less than 1"));
  // Alone first: every product of request sizes below is then of bounded factors (no wrap-around).
  if (out.n > api.max_choices) {
    return Invalid("n", absl::StrCat(out.n, " choices, more than the limit of ", api.max_choices));
  }
  STRATA_ASSIGN_OR_RETURN(best_of, Integer(request, "best_of"));
  if (best_of && *best_of != out.n) return Invalid("best_of", "is not supported (give n alone)");
  STRATA_ASSIGN_OR_RETURN(stream, Bool(request, "stream"));
  out.stream = stream.value_or(false);
  if (const Json* options = Field(request, "stream_options"); options != nullptr) {
    if (!out.stream) return Invalid("stream_options", "only with stream: true");
    if (!options->is_object())
      return Invalid("stream_options", absl::StrCat("must be an object, not ", TypeName(*options)));
    STRATA_ASSIGN_OR_RETURN(include_usage, Bool(*options, "include_usage", "stream_options.include_usage"));
    out.include_usage = include_usage.value_or(false);
  }
  return absl::OkStatus();
}

absl::Status CheckModel(const Json& request, const ApiContext& context, ApiRequest& out) {
  STRATA_ASSIGN_OR_RETURN(model, String(request, "model"));
  out.model = model.value_or(context.model_name);
  if (out.model != context.model_name) {
    return absl::NotFoundError(
        absl::StrCat("model: '", out.model, "' is not served here; this server serves '", context.model_name, "'"));
  }
  return absl::OkStatus();
}

// One prompt of /v1/completions: text, or token ids.
struct CompletionPrompt {
  std::optional<std::string> text;
  std::vector<int32_t> ids;
};

absl::StatusOr<std::vector<int32_t>> TokenIds(const Json& list, absl::string_view field) {
  std::vector<int32_t> ids;
  ids.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    absl::StatusOr<int64_t> id = IntegerValue(list[i], absl::StrCat(field, "[", i, "]"));
    if (!id.ok()) return id.status();
    if (*id < 0 || *id > std::numeric_limits<int32_t>::max()) {
      return Invalid(absl::StrCat(field, "[", i, "]"), absl::StrCat("token id ", *id, " is out of range"));
    }
    ids.push_back(static_cast<int32_t>(*id));
  }
  return ids;
}

// "prompt": a string, a list of strings, a list of token ids or a list of such lists.
absl::StatusOr<std::vector<CompletionPrompt>> ReadPrompts(const Json& request, const ApiContext& context) {
  const Json* prompt = Field(request, "prompt");
  if (prompt == nullptr) return Invalid("prompt", "missing: give a string, a list of strings or token ids");
  std::vector<CompletionPrompt> prompts;
  if (prompt->is_string()) {
    prompts.push_back({prompt->get<std::string>(), {}});
    return prompts;
  }
  if (!prompt->is_array())
    return Invalid("prompt", absl::StrCat("must be a string or a list, not ", TypeName(*prompt)));
  if (prompt->empty()) return Invalid("prompt", "is an empty list");
  const Json& first = prompt->front();
  if (first.is_number()) {
    STRATA_ASSIGN_OR_RETURN(ids, TokenIds(*prompt, "prompt"));
    prompts.push_back({std::nullopt, std::move(ids)});
    return prompts;
  }
  if (static_cast<int64_t>(prompt->size()) > context.api.max_choices) {
    return Invalid("prompt",
                   absl::StrCat(prompt->size(), " prompts, more than the limit of ", context.api.max_choices));
  }
  for (size_t i = 0; i < prompt->size(); ++i) {
    const Json& item = (*prompt)[i];
    const std::string field = absl::StrCat("prompt[", i, "]");
    if (first.is_string() && item.is_string()) {
      prompts.push_back({item.get<std::string>(), {}});
    } else if (first.is_array() && item.is_array()) {
      if (item.empty()) return Invalid(field, "an empty list of token ids");
      STRATA_ASSIGN_OR_RETURN(ids, TokenIds(item, field));
      prompts.push_back({std::nullopt, std::move(ids)});
    } else {
      return Invalid(field, "a list of prompts holds strings or lists of token ids, all of one kind");
    }
  }
  return prompts;
}

std::string Count(int64_t n, absl::string_view noun) { return absl::StrCat(n, " ", noun, n == 1 ? "" : "s"); }

// The fields each route reads. Any other is refused, as OpenAI refuses an unrecognized argument: a field a
// client expects to act (suffix, vLLM's guided_decoding_backend) must not be dropped silently. The structured-output
// fields (server/constraint_fields.h) are read on both routes.
// clang-format off
constexpr std::string_view kSharedFields[] = {
    "model", "temperature", "top_p", "top_k", "repetition_penalty", "seed", "ignore_eos", "stop", "user", "n",
    "stream", "stream_options", "presence_penalty", "frequency_penalty", "best_of", "min_tokens", "logit_bias",
    "speculative",
    "response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
    "json_schema", "grammar"};
constexpr std::string_view kCompletionFields[] = {
    "prompt", "max_tokens", "logprobs", "echo", "add_special_tokens", "suffix"};
constexpr std::string_view kChatFields[] = {
    "messages", "max_tokens", "max_completion_tokens", "logprobs", "top_logprobs", "tools", "tool_choice",
    "parallel_tool_calls", "documents", "add_generation_prompt", "continue_final_message",
    "chat_template_kwargs", "chat_template_name"};
// clang-format on

absl::Status CheckFieldNames(const Json& request, Route route) {
  const absl::Span<const std::string_view> own =
      route == Route::kCompletions ? absl::MakeConstSpan(kCompletionFields) : absl::MakeConstSpan(kChatFields);
  for (auto it = request.begin(); it != request.end(); ++it) {
    const std::string& key = it.key();
    auto known = [&key](std::string_view name) { return key == name; };
    if (std::any_of(std::begin(kSharedFields), std::end(kSharedFields), known) ||
        std::any_of(own.begin(), own.end(), known)) {
      continue;
    }
    // A key is client text of any length: quoted in part.
    const std::string shown = key.size() > 64 ? absl::StrCat(key.substr(0, 64), "...") : key;
    return Invalid(shown, absl::StrCat("is not a field of ",
                                       route == Route::kCompletions ? "/v1/completions" : "/v1/chat/completions",
                                       " that strata reads (server/README.md lists them)"));
  }
  return absl::OkStatus();
}

// a x b, or INT64_MAX when it does not fit.
int64_t SaturatingProduct(int64_t a, int64_t b) {
  int64_t product = 0;
  return __builtin_mul_overflow(a, b, &product) ? std::numeric_limits<int64_t>::max() : product;
}

// The tokens a response may list: per choice, its echoed prompt and max new tokens, each with its
// alternatives when logprobs are asked for.
int64_t ResponseTokens(const ApiRequest& request) {
  const int64_t per_token = 1 + request.logprobs.value_or(0);
  int64_t total = 0;
  for (const runtime::GenerationRequest& prompt : request.prompts) {
    const int64_t tokens =
        (request.echo ? static_cast<int64_t>(prompt.prompt.size()) : 0) + prompt.sampling.max_new_tokens;
    const int64_t one = SaturatingProduct(SaturatingProduct(request.n, tokens), per_token);
    if (__builtin_add_overflow(total, one, &total)) return std::numeric_limits<int64_t>::max();
  }
  return total;
}

// What a request may make the server build: n x (echoed prompt + max new tokens) x (1 + logprobs), summed
// over its prompts, within --max-response-tokens.
absl::Status CheckResponseSize(const ApiRequest& request, const ApiLimits& api, const char* max_tokens_field) {
  const int64_t tokens = ResponseTokens(request);
  if (tokens <= api.max_response_tokens) return absl::OkStatus();
  const bool chat = request.route == Route::kChatCompletions;
  return Invalid(
      max_tokens_field,
      absl::StrCat("with n ", request.n, request.prompts.size() > 1 ? " per prompt" : "", request.echo ? ", echo" : "",
                   request.logprobs ? ", " : "", request.logprobs ? (chat ? "top_logprobs " : "logprobs ") : "",
                   request.logprobs ? absl::StrCat(*request.logprobs) : "", " the response would list ", tokens,
                   " tokens (n x (", request.echo ? "prompt tokens + " : "", max_tokens_field, ") x (1 + ",
                   chat ? "top_logprobs" : "logprobs", ")), more than the server's limit of ", api.max_response_tokens,
                   " (--max-response-tokens)"));
}

// /v1/completions: one or more prompts, echo, logprobs as a count of alternatives.
absl::Status ReadCompletion(const Json& request, const ApiContext& context, GenerateInput& input, ApiRequest& out) {
  input.names.max_new_tokens = "max_tokens";
  input.names.top_logprobs = "logprobs";
  STRATA_ASSIGN_OR_RETURN(suffix, String(request, "suffix"));
  if (suffix && !suffix->empty()) {
    return Invalid("suffix", "is not supported: strata completes after the prompt only (no fill-in-the-middle)");
  }
  STRATA_ASSIGN_OR_RETURN(max_tokens, Integer(request, "max_tokens"));
  input.max_new_tokens = max_tokens.value_or(16);  // OpenAI's default
  STRATA_ASSIGN_OR_RETURN(logprobs, Integer(request, "logprobs"));
  if (logprobs) {
    input.top_logprobs = *logprobs;
    out.logprobs = *logprobs;
  }
  STRATA_ASSIGN_OR_RETURN(echo, Bool(request, "echo"));
  out.echo = echo.value_or(false);
  // echo with logprobs: the prompt's tokens are scored too, computed in the prefill (lm-evaluation-harness
  // reads log-likelihoods this way, with max_tokens 0 or 1).
  if (out.echo && out.logprobs) input.prompt_logprobs = *out.logprobs;
  STRATA_ASSIGN_OR_RETURN(add_special_tokens, Bool(request, "add_special_tokens"));
  input.add_special_tokens = add_special_tokens.value_or(true);  // vLLM's default for completions
  STRATA_ASSIGN_OR_RETURN(prompts, ReadPrompts(request, context));
  // Both factors are bounded by max_choices (ReadPrompts, ReadSampling): the product cannot wrap.
  if (static_cast<int64_t>(prompts.size()) * out.n > context.api.max_choices) {
    return Invalid("n", absl::StrCat(Count(static_cast<int64_t>(prompts.size()), "prompt"), " x n ", out.n,
                                     " choices, more than the limit of ", context.api.max_choices));
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerateInput one = input;
    const std::string field = prompts.size() == 1 ? "prompt" : absl::StrCat("prompt[", i, "]");
    one.names.prompt = field.c_str();
    one.names.prompt_ids = field.c_str();
    if (prompts[i].text) {
      one.prompt_text = *prompts[i].text;
    } else {
      one.prompt_ids = prompts[i].ids;
    }
    absl::StatusOr<runtime::GenerationRequest> valid = ValidateGenerateInput(one, context.limits, context.tokenizer);
    if (!valid.ok()) return valid.status();
    out.prompt_texts.push_back(prompts[i].text                ? *prompts[i].text
                               : context.tokenizer != nullptr ? context.tokenizer->Decode(valid->prompt, false)
                                                              : std::string());
    out.prompts.push_back(*std::move(valid));
  }
  return absl::OkStatus();
}

// bool(value) in Python of the value json.loads gives.
bool PythonTruthy(const Json& v) {
  if (v.is_null()) return false;
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number_integer()) return v.get<int64_t>() != 0;
  if (v.is_number_float()) return v.get<double>() != 0.0;
  if (v.is_string()) return !v.get_ref<const std::string&>().empty();
  return !v.empty();  // lists and objects
}

// Chat's options besides the messages and the constraint: logprobs, tool_choice "auto" and enable_thinking.
absl::Status ReadChatOptions(const Json& request, const ApiContext& context, const ToolChoice& tool_choice,
                             GenerateInput& input, ApiRequest& out) {
  STRATA_ASSIGN_OR_RETURN(logprobs, Bool(request, "logprobs"));
  STRATA_ASSIGN_OR_RETURN(top_logprobs, Integer(request, "top_logprobs"));
  if (top_logprobs && !logprobs.value_or(false)) return Invalid("top_logprobs", "only with logprobs: true");
  if (logprobs.value_or(false)) {
    out.logprobs = top_logprobs.value_or(0);
    input.top_logprobs = *out.logprobs;
  }
  const Json* tools = Field(request, "tools");
  const bool has_tools = tools != nullptr && tools->is_array() && !tools->empty();
  if (has_tools && tool_choice.kind == ToolChoice::Kind::kAuto) {
    if (!context.parse_tool_calls) {
      return Invalid("tool_choice",
                     "\"auto\" needs strata-server started with --tool-call-parser (hermes, llama3_json, "
                     "deepseek_v3, kimi_k2, glm45, minimax_m2, openai); or give \"none\", \"required\" or a named "
                     "function");
    }
    out.parse_tool_calls = true;
    out.tools = std::make_shared<const Json>(*tools);
  }
  // vLLM's Qwen3ReasoningParser: `chat_template_kwargs.get("enable_thinking", True)`, tested as Python does.
  if (const Json* kwargs = Field(request, "chat_template_kwargs"); kwargs != nullptr && kwargs->is_object()) {
    if (auto thinking = kwargs->find("enable_thinking"); thinking != kwargs->end()) {
      out.thinking_enabled = PythonTruthy(*thinking);
    }
  }
  STRATA_ASSIGN_OR_RETURN(parallel, Bool(request, "parallel_tool_calls"));
  if (parallel && !*parallel && out.parse_tool_calls) {
    return Invalid("parallel_tool_calls",
                   "false is not supported: strata returns every tool call the model writes (give true or omit it)");
  }
  return absl::OkStatus();
}

// /v1/chat/completions: the messages rendered by the chat template, one prompt.
absl::Status ReadChat(const Json& request, const ApiContext& context, const ToolChoice& tool_choice,
                      GenerateInput& input, ApiRequest& out) {
  const GenerateLimits& limits = context.limits;
  input.names.prompt = "messages";
  input.names.prompt_ids = "messages";
  input.names.top_logprobs = "top_logprobs";
  if (absl::Status options = ReadChatOptions(request, context, tool_choice, input, out); !options.ok()) return options;
  STRATA_ASSIGN_OR_RETURN(rendered, RenderChat(request, context.chat_template, context.limits.max_messages));
  if (static_cast<int64_t>(rendered.size()) > limits.max_prompt_bytes) {
    return Invalid("messages", absl::StrCat(Count(static_cast<int64_t>(rendered.size()), "byte"),
                                            " rendered by the chat template, more than the server's limit of ",
                                            Count(limits.max_prompt_bytes, "byte")));
  }
  if (context.tokenizer == nullptr) return Invalid("messages", "the model has no tokenizer.json");
  // The template wrote the special tokens: none are added (transformers' apply_chat_template, vLLM).
  absl::StatusOr<std::vector<int32_t>> ids = context.tokenizer->Encode(rendered, /*add_special_tokens=*/false);
  if (!ids.ok()) return Invalid("messages", ids.status().message());
  if (ids->empty()) return Invalid("messages", "the chat template rendered no tokens");
  input.prompt_ids = *std::move(ids);
  STRATA_ASSIGN_OR_RETURN(max_completion_tokens, Integer(request, "max_completion_tokens"));
  STRATA_ASSIGN_OR_RETURN(max_tokens, Integer(request, "max_tokens"));
  if (max_completion_tokens) {
    input.names.max_new_tokens = "max_completion_tokens";
    input.max_new_tokens = *max_completion_tokens;
  } else if (max_tokens) {
    input.names.max_new_tokens = "max_tokens";
    input.max_new_tokens = *max_tokens;
  } else {
    // As vLLM: what the context leaves after the prompt, within the server's limit, and within what the
    // response may hold (--max-response-tokens) for these n and top_logprobs.
    input.names.max_new_tokens = "max_completion_tokens";
    int64_t room = limits.max_context - static_cast<int64_t>(input.prompt_ids.size());
    if (limits.kv_cache_tokens > 0)
      room = std::min(room, limits.kv_cache_tokens + 1 - static_cast<int64_t>(input.prompt_ids.size()));
    const int64_t alternatives = std::clamp<int64_t>(out.logprobs.value_or(0), 0, limits.max_top_logprobs);
    room = std::min(room, context.api.max_response_tokens / SaturatingProduct(out.n, 1 + alternatives));
    input.max_new_tokens = std::clamp<int64_t>(room, 1, limits.max_new_tokens);
  }
  absl::StatusOr<runtime::GenerationRequest> valid = ValidateGenerateInput(input, limits, context.tokenizer);
  if (!valid.ok()) return valid.status();
  out.prompt_texts.push_back(std::move(rendered));
  out.prompts.push_back(*std::move(valid));
  return absl::OkStatus();
}

}  // namespace

Json ErrorJson(const ApiError& error) {
  return {{"error",
           {{"message", error.message},
            {"type", error.type},
            {"param", error.param.empty() ? Json() : Json(error.param)},
            {"code", error.code.empty() ? Json() : Json(error.code)}}}};
}

std::string ErrorBody(const ApiError& error) {
  return ErrorJson(error).dump(-1, ' ', false, Json::error_handler_t::replace);
}

ApiError ErrorFromStatus(const absl::Status& status) {
  ApiError error;
  error.message = std::string(status.message());
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange: {
      error.status = 400;
      // "field: why": the field is the param.
      const size_t colon = error.message.find(": ");
      if (colon != std::string::npos && error.message.find(' ') > colon) error.param = error.message.substr(0, colon);
      break;
    }
    case absl::StatusCode::kNotFound:
      error.status = 404;
      error.code = "model_not_found";
      break;
    case absl::StatusCode::kUnauthenticated:
      error.status = 401;
      error.code = "invalid_api_key";
      break;
    case absl::StatusCode::kResourceExhausted:
      error.status = 429;
      error.type = "rate_limit_exceeded";
      error.code = "rate_limit_exceeded";
      break;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kFailedPrecondition:
      error.status = 503;
      error.type = "server_error";
      error.code = "service_unavailable";
      break;
    default:
      error.status = 500;
      error.type = "server_error";
      error.code = "internal_error";
      break;
  }
  return error;
}

absl::StatusOr<Json> ParseJsonObject(std::string_view body, int64_t max_depth, absl::string_view what) {
  const int depth = static_cast<int>(std::clamp<int64_t>(max_depth, 1, base::kMaxJsonDepth));
  absl::StatusOr<Json> parsed = base::ParseOrderedJson(body, depth, std::string_view(what.data(), what.size()));
  if (!parsed.ok()) {
    // Too deep: named by the field that nests so (a deep JSON schema), as every other refusal is.
    if (const std::string field = FieldNestingDeeper(body, depth); !field.empty()) {
      return Invalid(field, absl::StrCat("JSON nests deeper than ", depth, " levels, more than the ", what, " may"));
    }
    return parsed.status();
  }
  if (!parsed->is_object()) return Invalid(what, absl::StrCat("must be a JSON object, not ", TypeName(*parsed)));
  return parsed;
}

absl::StatusOr<ApiRequest> ParseApiRequest(Route route, std::string_view body, const ApiContext& context) {
  STRATA_ASSIGN_OR_RETURN(request, ParseJsonObject(body, context.api.max_json_depth));
  return ReadApiRequest(route, request, context);
}

absl::StatusOr<ApiRequest> ReadApiRequest(Route route, const Json& request, const ApiContext& context) {
  if (absl::Status fields = CheckFieldNames(request, route); !fields.ok()) return fields;
  ApiRequest out;
  out.route = route;
  if (absl::Status model = CheckModel(request, context, out); !model.ok()) return model;
  GenerateInput input;
  if (absl::Status sampling = ReadSampling(request, context.api, input, out); !sampling.ok()) {
    return sampling;
  }
  ToolChoice tool_choice;
  if (route == Route::kChatCompletions) {
    STRATA_ASSIGN_OR_RETURN(choice, ReadToolChoice(request));
    tool_choice = std::move(choice);
  }
  STRATA_ASSIGN_OR_RETURN(constraint,
                          ReadConstraintFields(request, route == Route::kChatCompletions ? &tool_choice : nullptr));
  input.constraint = std::move(constraint.constraint);
  out.forced_tool_calls = std::move(constraint.forced_tool_calls);
  out.structured_kind = constraint.kind;
  absl::Status parsed = route == Route::kCompletions ? ReadCompletion(request, context, input, out)
                                                     : ReadChat(request, context, tool_choice, input, out);
  if (!parsed.ok()) return parsed;
  if (absl::Status size = CheckResponseSize(out, context.api, input.names.max_new_tokens); !size.ok()) return size;
  return out;
}

const char* FinishReasonText(runtime::FinishReason reason) {
  switch (reason) {
    case runtime::FinishReason::kLength:
      return "length";
    case runtime::FinishReason::kStop:
    case runtime::FinishReason::kEos:
      return "stop";
    case runtime::FinishReason::kCancelled:
    case runtime::FinishReason::kError:
      break;
  }
  return "abort";
}

std::string TokenText(const tokenizer::Tokenizer* tokenizer, int32_t id) {
  if (tokenizer == nullptr) return "";
  const int32_t ids[] = {id};
  return tokenizer->Decode(ids, /*skip_special_tokens=*/false);
}

}  // namespace strata::server::openai
