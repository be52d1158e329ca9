#include "server/generate_validation.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/unknown_field_set.h>

#include <charconv>
#include <cmath>
#include <map>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "tokenizer/utf8.h"

namespace strata::server {
namespace {

absl::Status Invalid(absl::string_view field, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", message));
}

// A float as the client sent it: the shortest decimal that reads back as the same float (absl's StrCat
// keeps 6 significant digits, which prints 1.0000001 as "1").
std::string Number(float value) {
  char text[32];
  const std::to_chars_result end = std::to_chars(text, text + sizeof(text), value);
  return std::string(text, end.ptr);
}

// "1 token", "2 tokens".
std::string Count(int64_t n, absl::string_view noun) { return absl::StrCat(n, " ", noun, n == 1 ? "" : "s"); }

// Which string field of a request that protobuf could not parse is not UTF-8.
absl::Status DiagnoseUnparsable(std::string_view wire) {
  google::protobuf::UnknownFieldSet fields;
  if (fields.ParseFromArray(wire.data(), static_cast<int>(wire.size()))) {
    const std::map<int, std::string> names = {{1, "prompt"}, {9, "stop"}, {12, "request_id"}};
    int stop_index = 0;
    for (int i = 0; i < fields.field_count(); ++i) {
      const google::protobuf::UnknownField& field = fields.field(i);
      auto name = names.find(field.number());
      if (name == names.end() || field.type() != google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) continue;
      const std::string& bytes = field.length_delimited();
      const std::string label = field.number() == 9 ? absl::StrCat("stop[", stop_index++, "]") : name->second;
      if (size_t at = tokenizer::FindInvalidUtf8(bytes); at != std::string_view::npos) {
        return Invalid(label, absl::StrCat("invalid UTF-8 at byte ", at));
      }
    }
  }
  return Invalid("request", "not a valid strata.v1.GenerateRequest");
}

// The prompt, as text (tokenized here) or as ids, within the limits and the vocabulary.
absl::Status ReadPrompt(const v1::GenerateRequest& request, const GenerateLimits& limits,
                        const tokenizer::Tokenizer* tokenizer, runtime::GenerationRequest& out) {
  const bool has_text = !request.prompt().empty();
  const bool has_ids = request.prompt_ids_size() > 0;
  if (has_text && has_ids) return Invalid("prompt", "give prompt or prompt_ids, not both");
  if (!has_text && !has_ids) return Invalid("prompt", "empty: give prompt text or prompt_ids");
  const char* prompt_field = has_text ? "prompt" : "prompt_ids";
  if (has_text) {
    if (tokenizer == nullptr) return Invalid("prompt", "the model has no tokenizer.json: send prompt_ids");
    // Before tokenizing: the work is bounded by the limit, not by what a client sends.
    if (static_cast<int64_t>(request.prompt().size()) > limits.max_prompt_bytes) {
      return Invalid("prompt",
                     absl::StrCat(Count(static_cast<int64_t>(request.prompt().size()), "byte"),
                                  ", more than the server's limit of ", Count(limits.max_prompt_bytes, "byte")));
    }
    absl::StatusOr<std::vector<int32_t>> ids = tokenizer->Encode(request.prompt(), request.add_special_tokens());
    if (!ids.ok()) return Invalid("prompt", ids.status().message());
    if (ids->empty()) return Invalid("prompt", "encodes to no tokens");
    out.prompt = *std::move(ids);
  } else {
    out.prompt.assign(request.prompt_ids().begin(), request.prompt_ids().end());
  }
  const int64_t max_prompt_tokens = limits.max_prompt_tokens > 0 ? limits.max_prompt_tokens : limits.max_context;
  if (static_cast<int64_t>(out.prompt.size()) > max_prompt_tokens) {
    return Invalid(prompt_field,
                   absl::StrCat(Count(static_cast<int64_t>(out.prompt.size()), "token"),
                                ", more than the server's limit of ", Count(max_prompt_tokens, "prompt token")));
  }
  for (size_t i = 0; i < out.prompt.size(); ++i) {
    if (out.prompt[i] < 0 || out.prompt[i] >= limits.vocab_size) {
      return Invalid(
          has_text ? "prompt" : absl::StrCat("prompt_ids[", i, "]"),
          absl::StrCat("token id ", out.prompt[i], " is outside the vocabulary [0, ", limits.vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

// max_new_tokens, and the prompt with it against --max-context and the KV cache. `prompt_field` names
// the prompt as the request gave it.
absl::Status ReadLength(const v1::GenerateRequest& request, const GenerateLimits& limits,
                        absl::string_view prompt_field, runtime::GenerationRequest& out) {
  runtime::SamplingParams& s = out.sampling;
  if (request.max_new_tokens() == 0) return Invalid("max_new_tokens", "must be at least 1");
  if (request.max_new_tokens() > limits.max_new_tokens) {
    return Invalid("max_new_tokens",
                   absl::StrCat(request.max_new_tokens(), " is above the server's limit ", limits.max_new_tokens));
  }
  s.max_new_tokens = static_cast<int32_t>(request.max_new_tokens());
  // What counts against --max-context (as vLLM's max_model_len and OpenAI's context length count): every
  // prompt token and every token the request may generate.
  const int64_t prompt_tokens = static_cast<int64_t>(out.prompt.size());
  const int64_t context = prompt_tokens + s.max_new_tokens;
  if (context > limits.max_context) {
    return Invalid(prompt_field,
                   absl::StrCat(Count(prompt_tokens, "token"), " + max_new_tokens ", s.max_new_tokens, " = ", context,
                                ", more than the server's --max-context ", limits.max_context));
  }
  // The KV cache holds one position fewer: the last new token is never fed back.
  const int64_t positions = context - 1;
  if (limits.kv_cache_tokens > 0 && positions > limits.kv_cache_tokens) {
    return Invalid(prompt_field,
                   absl::StrCat(Count(prompt_tokens, "token"), " and max_new_tokens ", s.max_new_tokens, " need ",
                                positions, " positions of KV cache, more than the whole cache holds (",
                                limits.kv_cache_tokens, " tokens, --kv-cache-tokens)"));
  }
  return absl::OkStatus();
}

// temperature, top_p, repetition_penalty, top_k, seed and top_logprobs.
absl::Status ReadSampling(const v1::GenerateRequest& request, const GenerateLimits& limits,
                          runtime::SamplingParams& s) {
  if (!(request.temperature() >= 0) || std::isinf(request.temperature())) {
    return Invalid("temperature", absl::StrCat(Number(request.temperature()), " is not a finite number >= 0"));
  }
  s.temperature = request.temperature();
  if (request.has_top_p()) {
    if (!(request.top_p() > 0 && request.top_p() <= 1)) {
      return Invalid("top_p", absl::StrCat(Number(request.top_p()), " is outside (0, 1]"));
    }
    s.top_p = request.top_p();
  }
  if (request.has_repetition_penalty()) {
    if (!(request.repetition_penalty() > 0) || std::isinf(request.repetition_penalty())) {
      return Invalid("repetition_penalty",
                     absl::StrCat(Number(request.repetition_penalty()), " is not a finite number > 0"));
    }
    s.repetition_penalty = request.repetition_penalty();
  }
  s.top_k = static_cast<int32_t>(std::min<int64_t>(request.top_k(), limits.vocab_size));
  if (request.has_seed()) s.seed = request.seed();
  if (request.top_logprobs() > limits.max_top_logprobs) {
    return Invalid("top_logprobs",
                   absl::StrCat(request.top_logprobs(), " is above the limit ", limits.max_top_logprobs));
  }
  s.top_logprobs = static_cast<int32_t>(request.top_logprobs());
  return absl::OkStatus();
}

// The stop strings: how many, how long, and a tokenizer to decode text with.
absl::Status ReadStops(const v1::GenerateRequest& request, const GenerateLimits& limits,
                       const tokenizer::Tokenizer* tokenizer, runtime::SamplingParams& s) {
  if (request.stop_size() > limits.max_stop_strings) {
    return Invalid("stop", absl::StrCat(Count(request.stop_size(), "stop string"), ", more than the limit ",
                                        limits.max_stop_strings));
  }
  if (request.stop_size() > 0 && tokenizer == nullptr) {
    return Invalid("stop", "the model has no tokenizer.json to decode text with");
  }
  for (int i = 0; i < request.stop_size(); ++i) {
    const std::string& stop = request.stop(i);
    if (stop.empty()) return Invalid(absl::StrCat("stop[", i, "]"), "empty");
    if (static_cast<int64_t>(stop.size()) > limits.max_stop_bytes) {
      return Invalid(absl::StrCat("stop[", i, "]"), absl::StrCat(Count(static_cast<int64_t>(stop.size()), "byte"),
                                                                 ", more than ", limits.max_stop_bytes));
    }
    s.stop.push_back(stop);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<runtime::GenerationRequest> ValidateGenerateRequest(std::string_view wire, const GenerateLimits& limits,
                                                                   const tokenizer::Tokenizer* tokenizer) {
  v1::GenerateRequest request;
  if (!request.ParseFromArray(wire.data(), static_cast<int>(wire.size()))) return DiagnoseUnparsable(wire);
  return ValidateGenerateRequest(request, limits, tokenizer);
}

absl::StatusOr<runtime::GenerationRequest> ValidateGenerateRequest(const v1::GenerateRequest& request,
                                                                   const GenerateLimits& limits,
                                                                   const tokenizer::Tokenizer* tokenizer) {
  runtime::GenerationRequest out;
  if (static_cast<int64_t>(request.request_id().size()) > limits.max_request_id_bytes) {
    return Invalid("request_id", absl::StrCat(Count(static_cast<int64_t>(request.request_id().size()), "byte"),
                                              ", more than the limit ", limits.max_request_id_bytes));
  }
  out.request_id = request.request_id();
  if (absl::Status prompt = ReadPrompt(request, limits, tokenizer, out); !prompt.ok()) return prompt;
  // ReadPrompt accepted exactly one of the two.
  const char* prompt_field = request.prompt().empty() ? "prompt_ids" : "prompt";
  if (absl::Status length = ReadLength(request, limits, prompt_field, out); !length.ok()) return length;
  if (absl::Status sampling = ReadSampling(request, limits, out.sampling); !sampling.ok()) return sampling;
  if (absl::Status stops = ReadStops(request, limits, tokenizer, out.sampling); !stops.ok()) return stops;
  return out;
}

}  // namespace strata::server
