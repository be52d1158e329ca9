#include "server/generate_validation.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/unknown_field_set.h>

#include <charconv>
#include <cmath>
#include <map>
#include <tuple>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/json.h"
#include "server/chat_prompt.h"
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
    const std::map<int, std::string> names = {{1, "prompt"},      {9, "stop"},           {12, "request_id"},
                                              {14, "tools_json"}, {17, "json_schema"},   {19, "regex"},
                                              {21, "grammar"},    {22, "structural_tag"}};
    const std::map<int, std::string> message_names = {
        {1, "role"}, {2, "content"}, {3, "name"}, {4, "tool_call_id"}, {5, "tool_calls_json"}};
    int stop_index = 0;
    int message_index = 0;
    for (int i = 0; i < fields.field_count(); ++i) {
      const google::protobuf::UnknownField& field = fields.field(i);
      if (field.number() == 13 && field.type() == google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) {
        // A ChatMessage: its string fields.
        google::protobuf::UnknownFieldSet message;
        const std::string& bytes = field.length_delimited();
        const int index = message_index++;
        if (!message.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) continue;
        for (int j = 0; j < message.field_count(); ++j) {
          const google::protobuf::UnknownField& part = message.field(j);
          auto part_name = message_names.find(part.number());
          if (part_name == message_names.end() ||
              part.type() != google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) {
            continue;
          }
          if (size_t at = tokenizer::FindInvalidUtf8(part.length_delimited()); at != std::string_view::npos) {
            return Invalid(absl::StrCat("messages[", index, "].", part_name->second),
                           absl::StrCat("invalid UTF-8 at byte ", at));
          }
        }
        continue;
      }
      if (field.number() == 20 && field.type() == google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) {
        // Choices: its strings.
        google::protobuf::UnknownFieldSet choices;
        const std::string& bytes = field.length_delimited();
        if (!choices.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) continue;
        for (int j = 0; j < choices.field_count(); ++j) {
          const google::protobuf::UnknownField& choice = choices.field(j);
          if (choice.type() != google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) continue;
          if (size_t at = tokenizer::FindInvalidUtf8(choice.length_delimited()); at != std::string_view::npos) {
            return Invalid(absl::StrCat("choice.choices[", j, "]"), absl::StrCat("invalid UTF-8 at byte ", at));
          }
        }
        continue;
      }
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
absl::Status ReadPrompt(const GenerateInput& in, const GenerateLimits& limits, const tokenizer::Tokenizer* tokenizer,
                        runtime::GenerationRequest& out) {
  const bool has_text = in.prompt_text.has_value() && !in.prompt_text->empty();
  const bool has_ids = !in.prompt_ids.empty();
  const char* text_field = in.names.prompt;
  if (has_text && has_ids) {
    return Invalid(text_field, absl::StrCat("give ", in.names.prompt, " or ", in.names.prompt_ids, ", not both"));
  }
  if (!has_text && !has_ids) {
    // One field for both (the HTTP API's "prompt"): say what it may hold.
    if (std::string_view(in.names.prompt) == in.names.prompt_ids)
      return Invalid(text_field, "empty: give text or token ids");
    return Invalid(text_field, absl::StrCat("empty: give ", in.names.prompt, " text or ", in.names.prompt_ids));
  }
  const char* prompt_field = has_text ? in.names.prompt : in.names.prompt_ids;
  if (has_text) {
    if (tokenizer == nullptr) {
      return Invalid(text_field, absl::StrCat("the model has no tokenizer.json: send ", in.names.prompt_ids));
    }
    // Before tokenizing: the work is bounded by the limit, not by what a client sends.
    const int64_t bytes = static_cast<int64_t>(in.prompt_text->size());
    if (bytes > limits.max_prompt_bytes) {
      return Invalid(text_field,
                     absl::StrCat(Count(bytes, "byte"), in.prompt_is_rendered ? " rendered by the chat template" : "",
                                  ", more than the server's limit of ", Count(limits.max_prompt_bytes, "byte")));
    }
    absl::StatusOr<std::vector<int32_t>> ids = tokenizer->Encode(*in.prompt_text, in.add_special_tokens);
    if (!ids.ok()) return Invalid(text_field, ids.status().message());
    if (ids->empty()) return Invalid(text_field, "encodes to no tokens");
    out.prompt = *std::move(ids);
  } else {
    out.prompt = in.prompt_ids;
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
          has_text ? std::string(text_field) : absl::StrCat(in.names.prompt_ids, "[", i, "]"),
          absl::StrCat("token id ", out.prompt[i], " is outside the vocabulary [0, ", limits.vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

// max_new_tokens, and the prompt with it against --max-context and the KV cache. `prompt_field` names
// the prompt as the request gave it.
absl::Status ReadLength(const GenerateInput& in, const GenerateLimits& limits, absl::string_view prompt_field,
                        runtime::GenerationRequest& out) {
  runtime::SamplingParams& s = out.sampling;
  const char* field = in.names.max_new_tokens;
  // A request that only scores its prompt (echo with logprobs, max_tokens 0) generates nothing.
  const int64_t least = in.prompt_logprobs >= 0 ? 0 : 1;
  if (in.max_new_tokens < least) return Invalid(field, absl::StrCat("must be at least ", least));
  if (in.max_new_tokens > limits.max_new_tokens) {
    return Invalid(field, absl::StrCat(in.max_new_tokens, " is above the server's limit ", limits.max_new_tokens));
  }
  s.max_new_tokens = static_cast<int32_t>(in.max_new_tokens);
  // What counts against --max-context (as vLLM's max_model_len and OpenAI's context length count): every
  // prompt token and every token the request may generate.
  const int64_t prompt_tokens = static_cast<int64_t>(out.prompt.size());
  const int64_t context = prompt_tokens + s.max_new_tokens;
  if (context > limits.max_context) {
    return Invalid(prompt_field, absl::StrCat(Count(prompt_tokens, "token"), " + ", field, " ", s.max_new_tokens, " = ",
                                              context, ", more than the server's --max-context ", limits.max_context));
  }
  // The KV cache holds one position fewer: the last new token is never fed back.
  const int64_t positions = context - 1;
  if (limits.kv_cache_tokens > 0 && positions > limits.kv_cache_tokens) {
    return Invalid(prompt_field,
                   absl::StrCat(Count(prompt_tokens, "token"), " and ", field, " ", s.max_new_tokens, " need ",
                                positions, " positions of KV cache, more than the whole cache holds (",
                                limits.kv_cache_tokens, " tokens, --kv-cache-tokens)"));
  }
  return absl::OkStatus();
}

// temperature, top_p, repetition_penalty, top_k, seed and top_logprobs.
absl::Status ReadSampling(const GenerateInput& in, const GenerateLimits& limits, runtime::SamplingParams& s) {
  if (!(in.temperature >= 0) || std::isinf(in.temperature)) {
    return Invalid("temperature", absl::StrCat(Number(in.temperature), " is not a finite number >= 0"));
  }
  s.temperature = in.temperature;
  if (in.top_p) {
    if (!(*in.top_p > 0 && *in.top_p <= 1))
      return Invalid("top_p", absl::StrCat(Number(*in.top_p), " is outside (0, 1]"));
    s.top_p = *in.top_p;
  }
  if (in.repetition_penalty) {
    if (!(*in.repetition_penalty > 0) || std::isinf(*in.repetition_penalty)) {
      return Invalid("repetition_penalty", absl::StrCat(Number(*in.repetition_penalty), " is not a finite number > 0"));
    }
    s.repetition_penalty = *in.repetition_penalty;
  }
  if (in.top_k < 0) return Invalid("top_k", absl::StrCat(in.top_k, " is negative (0 or -1: no top-k)"));
  s.top_k = static_cast<int32_t>(std::min<int64_t>(in.top_k, limits.vocab_size));
  s.seed = in.seed;
  if (in.top_logprobs < 0) return Invalid(in.names.top_logprobs, absl::StrCat(in.top_logprobs, " is negative"));
  if (in.top_logprobs > limits.max_top_logprobs) {
    return Invalid(in.names.top_logprobs,
                   absl::StrCat(in.top_logprobs, " is above the limit ", limits.max_top_logprobs));
  }
  s.top_logprobs = static_cast<int32_t>(in.top_logprobs);
  s.ignore_eos = in.ignore_eos;
  s.speculative = in.speculative;
  for (auto [field, value, out] : {std::tuple{"presence_penalty", in.presence_penalty, &s.presence_penalty},
                                   std::tuple{"frequency_penalty", in.frequency_penalty, &s.frequency_penalty}}) {
    if (!(value >= -2 && value <= 2)) return Invalid(field, absl::StrCat(Number(value), " is outside [-2, 2]"));
    *out = value;
  }
  for (const auto& [id, bias] : in.logit_bias) {
    const std::string field = absl::StrCat("logit_bias[\"", id, "\"]");
    if (id < 0 || id >= limits.vocab_size) {
      return Invalid(field, absl::StrCat("token id ", id, " is outside the vocabulary [0, ", limits.vocab_size, ")"));
    }
    if (!(bias >= -100 && bias <= 100)) return Invalid(field, absl::StrCat(Number(bias), " is outside [-100, 100]"));
    s.logit_bias.emplace_back(static_cast<int32_t>(id), bias);
  }
  if (in.min_tokens < 0 || in.min_tokens > s.max_new_tokens) {
    return Invalid("min_tokens", absl::StrCat(in.min_tokens, " is outside [0, max_tokens ", s.max_new_tokens, "]"));
  }
  s.min_tokens = static_cast<int32_t>(in.min_tokens);
  if (in.prompt_logprobs > limits.max_top_logprobs) {
    return Invalid(in.names.top_logprobs,
                   absl::StrCat(in.prompt_logprobs, " is above the limit ", limits.max_top_logprobs));
  }
  s.prompt_logprobs = static_cast<int32_t>(std::max<int64_t>(in.prompt_logprobs, -1));
  return absl::OkStatus();
}

// The stop strings: how many, how long, and a tokenizer to decode text with.
absl::Status ReadStops(const GenerateInput& in, const GenerateLimits& limits, const tokenizer::Tokenizer* tokenizer,
                       runtime::SamplingParams& s) {
  const int64_t stops = static_cast<int64_t>(in.stop.size());
  if (stops > limits.max_stop_strings) {
    return Invalid(in.names.stop,
                   absl::StrCat(Count(stops, "stop string"), ", more than the limit ", limits.max_stop_strings));
  }
  if (stops > 0 && tokenizer == nullptr) {
    return Invalid(in.names.stop, "the model has no tokenizer.json to decode text with");
  }
  for (int64_t i = 0; i < stops; ++i) {
    const std::string& stop = in.stop[i];
    const std::string field = absl::StrCat(in.names.stop, "[", i, "]");
    if (stop.empty()) return Invalid(field, "empty");
    if (static_cast<int64_t>(stop.size()) > limits.max_stop_bytes) {
      return Invalid(
          field, absl::StrCat(Count(static_cast<int64_t>(stop.size()), "byte"), ", more than ", limits.max_stop_bytes));
    }
    if (size_t at = tokenizer::FindInvalidUtf8(stop); at != std::string_view::npos) {
      return Invalid(field, absl::StrCat("invalid UTF-8 at byte ", at));
    }
    s.stop.push_back(stop);
  }
  return absl::OkStatus();
}

// The constraint compiled into the request's grammar: last, as the costliest check (a compile may take up to
// --max-grammar-compile-seconds; a cached grammar is found at once).
absl::Status ReadConstraint(const GenerateInput& in, const GenerateLimits& limits, runtime::GenerationRequest& out) {
  if (!in.constraint) return absl::OkStatus();
  const structured::Constraint& constraint = *in.constraint;
  if (limits.grammar_compiler == nullptr) {
    return Invalid(constraint.field, absl::StrCat("structured outputs are off on this server: ",
                                                  limits.grammar_unavailable.empty() ? "no grammar compiler"
                                                                                     : limits.grammar_unavailable));
  }
  absl::StatusOr<std::shared_ptr<const structured::Grammar>> grammar = limits.grammar_compiler->Compile(constraint);
  if (!grammar.ok()) {
    // The compiler names the field; the HTTP API's error param is read from the message's start.
    const absl::Status& error = grammar.status();
    if (absl::IsInvalidArgument(error) && !absl::StartsWith(error.message(), absl::StrCat(constraint.field, ": "))) {
      return Invalid(constraint.field, error.message());
    }
    return error;
  }
  out.grammar = *std::move(grammar);
  return absl::OkStatus();
}

// A request's messages as the chat template renders them, tokenized without added special tokens (the
// template wrote them).
absl::StatusOr<std::vector<int32_t>> ChatPromptIds(const v1::GenerateRequest& request, const GenerateLimits& limits,
                                                   const tokenizer::Tokenizer* tokenizer,
                                                   const chat_template::CheckpointChatTemplate* chat_template) {
  using Json = nlohmann::ordered_json;
  Json chat = {{"messages", Json::array()}};
  for (int i = 0; i < request.messages_size(); ++i) {
    const v1::ChatMessage& m = request.messages(i);
    if (m.role().empty()) return Invalid(absl::StrCat("messages[", i, "].role"), "missing");
    Json message = {{"role", m.role()}, {"content", m.content()}};
    if (!m.name().empty()) message["name"] = m.name();
    if (!m.tool_call_id().empty()) message["tool_call_id"] = m.tool_call_id();
    if (!m.tool_calls_json().empty()) {
      const std::string field = absl::StrCat("messages[", i, "].tool_calls_json");
      absl::StatusOr<Json> calls = base::ParseOrderedJson(m.tool_calls_json(), kMaxEmbeddedJsonDepth, field);
      if (!calls.ok()) return calls.status();
      if (!calls->is_array()) return Invalid(field, "not a JSON list of tool calls");
      message["tool_calls"] = *std::move(calls);
    }
    chat["messages"].push_back(std::move(message));
  }
  if (!request.tools_json().empty()) {
    absl::StatusOr<Json> tools = base::ParseOrderedJson(request.tools_json(), kMaxEmbeddedJsonDepth, "tools_json");
    if (!tools.ok()) return tools.status();
    if (!tools->is_array()) return Invalid("tools_json", "not a JSON list of tools");
    chat["tools"] = *std::move(tools);
  }
  if (request.has_add_generation_prompt()) chat["add_generation_prompt"] = request.add_generation_prompt();
  if (tokenizer == nullptr) return Invalid("messages", "the model has no tokenizer.json");
  absl::StatusOr<std::string> rendered = RenderChat(chat, chat_template, limits.max_messages);
  if (!rendered.ok()) return rendered.status();
  if (static_cast<int64_t>(rendered->size()) > limits.max_prompt_bytes) {
    return Invalid("messages", absl::StrCat(Count(static_cast<int64_t>(rendered->size()), "byte"),
                                            " rendered by the chat template, more than the server's limit of ",
                                            Count(limits.max_prompt_bytes, "byte")));
  }
  absl::StatusOr<std::vector<int32_t>> ids = tokenizer->Encode(*rendered, /*add_special_tokens=*/false);
  if (!ids.ok()) return Invalid("messages", ids.status().message());
  if (ids->empty()) return Invalid("messages", "the chat template rendered no tokens");
  return ids;
}

}  // namespace

absl::StatusOr<std::string> ConstraintJsonText(std::string_view text, absl::string_view field) {
  absl::StatusOr<nlohmann::ordered_json> value =
      base::ParseOrderedJson(text, kMaxEmbeddedJsonDepth, std::string_view(field.data(), field.size()));
  if (!value.ok()) return value.status();
  return JsonObjectText(*value, field);
}

absl::StatusOr<std::string> JsonObjectText(const nlohmann::ordered_json& value, absl::string_view field) {
  if (!value.is_object()) {
    return Invalid(field, absl::StrCat("must be a JSON object, not ", json_fields::TypeName(value)));
  }
  return value.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

absl::StatusOr<std::optional<structured::Constraint>> GenerateRequestConstraint(const v1::GenerateRequest& request) {
  using Case = v1::GenerateRequest::StructuredOutputCase;
  structured::Constraint constraint;
  constraint.strict = !request.has_strict() || request.strict();
  auto json_text = [&](const std::string& text, const char* field) -> absl::Status {
    absl::StatusOr<std::string> compact = ConstraintJsonText(text, field);
    if (!compact.ok()) return compact.status();
    constraint.text = *std::move(compact);
    constraint.field = field;
    return absl::OkStatus();
  };
  switch (request.structured_output_case()) {
    case Case::STRUCTURED_OUTPUT_NOT_SET:
      return std::nullopt;
    case Case::kJsonSchema:
      constraint.kind = structured::ConstraintKind::kJsonSchema;
      if (absl::Status text = json_text(request.json_schema(), "json_schema"); !text.ok()) return text;
      break;
    case Case::kJsonObject:
      if (!request.json_object()) return std::nullopt;
      constraint.kind = structured::ConstraintKind::kJsonObject;
      constraint.field = "json_object";
      break;
    case Case::kRegex:
      constraint.kind = structured::ConstraintKind::kRegex;
      constraint.text = request.regex();
      constraint.field = "regex";
      break;
    case Case::kChoice:
      if (request.choice().choices().empty()) return Invalid("choice", "an empty list: give at least one string");
      constraint.kind = structured::ConstraintKind::kChoice;
      constraint.choices.assign(request.choice().choices().begin(), request.choice().choices().end());
      constraint.field = "choice";
      break;
    case Case::kGrammar:
      constraint.kind = structured::ConstraintKind::kGrammar;
      constraint.text = request.grammar();
      constraint.field = "grammar";
      break;
    case Case::kStructuralTag:
      constraint.kind = structured::ConstraintKind::kStructuralTag;
      if (absl::Status text = json_text(request.structural_tag(), "structural_tag"); !text.ok()) return text;
      break;
  }
  return constraint;
}

absl::StatusOr<v1::GenerateRequest> ParseGenerateRequest(std::string_view wire) {
  v1::GenerateRequest request;
  if (!request.ParseFromArray(wire.data(), static_cast<int>(wire.size()))) return DiagnoseUnparsable(wire);
  return request;
}

absl::StatusOr<runtime::GenerationRequest> ValidateGenerateRequest(
    std::string_view wire, const GenerateLimits& limits, const tokenizer::Tokenizer* tokenizer,
    const chat_template::CheckpointChatTemplate* chat_template) {
  absl::StatusOr<v1::GenerateRequest> request = ParseGenerateRequest(wire);
  if (!request.ok()) return request.status();
  return ValidateGenerateRequest(*request, limits, tokenizer, chat_template);
}

absl::StatusOr<runtime::GenerationRequest> ValidateGenerateInput(const GenerateInput& in, const GenerateLimits& limits,
                                                                 const tokenizer::Tokenizer* tokenizer) {
  runtime::GenerationRequest out;
  if (static_cast<int64_t>(in.request_id.size()) > limits.max_request_id_bytes) {
    return Invalid("request_id", absl::StrCat(Count(static_cast<int64_t>(in.request_id.size()), "byte"),
                                              ", more than the limit ", limits.max_request_id_bytes));
  }
  out.request_id = in.request_id;
  if (absl::Status prompt = ReadPrompt(in, limits, tokenizer, out); !prompt.ok()) return prompt;
  // ReadPrompt accepted exactly one of the two.
  const char* prompt_field = in.prompt_ids.empty() ? in.names.prompt : in.names.prompt_ids;
  if (absl::Status length = ReadLength(in, limits, prompt_field, out); !length.ok()) return length;
  if (absl::Status sampling = ReadSampling(in, limits, out.sampling); !sampling.ok()) return sampling;
  if (absl::Status stops = ReadStops(in, limits, tokenizer, out.sampling); !stops.ok()) return stops;
  if (absl::Status constraint = ReadConstraint(in, limits, out); !constraint.ok()) return constraint;
  return out;
}

absl::StatusOr<runtime::GenerationRequest> ValidateGenerateRequest(
    const v1::GenerateRequest& request, const GenerateLimits& limits, const tokenizer::Tokenizer* tokenizer,
    const chat_template::CheckpointChatTemplate* chat_template) {
  GenerateInput in;
  if (request.messages_size() > 0) {
    if (!request.prompt().empty() || request.prompt_ids_size() > 0) {
      return Invalid("messages", "give prompt, prompt_ids or messages, only one");
    }
    absl::StatusOr<std::vector<int32_t>> ids = ChatPromptIds(request, limits, tokenizer, chat_template);
    if (!ids.ok()) return ids.status();
    in.prompt_ids = *std::move(ids);
    in.names.prompt = "messages";
    in.names.prompt_ids = "messages";
  } else {
    if (!request.prompt().empty()) in.prompt_text = request.prompt();
    in.prompt_ids.assign(request.prompt_ids().begin(), request.prompt_ids().end());
    in.add_special_tokens = request.add_special_tokens();
  }
  in.max_new_tokens = request.max_new_tokens();
  in.temperature = request.temperature();
  if (request.has_top_p()) in.top_p = request.top_p();
  in.top_k = request.top_k();
  if (request.has_repetition_penalty()) in.repetition_penalty = request.repetition_penalty();
  if (request.has_seed()) in.seed = request.seed();
  in.stop.assign(request.stop().begin(), request.stop().end());
  in.top_logprobs = request.top_logprobs();
  if (request.has_prompt_logprobs()) in.prompt_logprobs = request.prompt_logprobs();
  if (request.has_speculative()) in.speculative = request.speculative();
  in.request_id = request.request_id();
  absl::StatusOr<std::optional<structured::Constraint>> constraint = GenerateRequestConstraint(request);
  if (!constraint.ok()) return constraint.status();
  in.constraint = *std::move(constraint);
  return ValidateGenerateInput(in, limits, tokenizer);
}

}  // namespace strata::server
