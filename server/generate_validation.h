#pragma once
// Every GenerateRequest is validated here, once, at the edge (STYLE.md, TGI's router): the wire bytes
// become a trusted runtime::GenerationRequest, or an error whose code is the gRPC status to answer and
// whose message names the field. Nothing after this point checks a request again.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "chat_template/checkpoint_template.h"
#include "nlohmann/json.hpp"
#include "runtime/engine/engine.h"
#include "server/served_model.h"
#include "strata/v1/strata.pb.h"
#include "structured/structured.h"
#include "tokenizer/tokenizer.h"

namespace strata::server {

// A generation request as either API gives it (gRPC's GenerateRequest, the HTTP API's JSON), before it is
// checked. `names` are the API's own field names, which every error uses.
struct GenerateInput {
  struct FieldNames {
    const char* prompt = "prompt";
    const char* prompt_ids = "prompt_ids";
    const char* max_new_tokens = "max_new_tokens";
    const char* top_logprobs = "top_logprobs";
    const char* stop = "stop";
  };
  FieldNames names;
  // Exactly one of the two: text (tokenized here, with the tokenizer's special tokens when
  // add_special_tokens) or token ids. `prompt_text` set but empty counts as no text.
  std::optional<std::string_view> prompt_text;
  std::vector<int32_t> prompt_ids;
  bool add_special_tokens = false;
  // The prompt is a chat template's rendering (its special tokens are in the text): errors say so.
  bool prompt_is_rendered = false;
  int64_t max_new_tokens = 0;
  float temperature = 0;
  std::optional<float> top_p;
  int64_t top_k = 0;
  std::optional<float> repetition_penalty;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  int64_t top_logprobs = 0;
  bool ignore_eos = false;
  bool speculative = true;  // false: no speculative decoding for this request (the server's --speculative)
  // OpenAI's (the HTTP API's): penalties in [-2, 2], logit_bias ids in the vocabulary and biases in
  // [-100, 100], min_tokens at most max_new_tokens, prompt log-probabilities (-1 off, else 0-20 alternatives).
  float presence_penalty = 0;
  float frequency_penalty = 0;
  std::vector<std::pair<int64_t, float>> logit_bias;
  int64_t min_tokens = 0;
  int64_t prompt_logprobs = -1;
  // max_new_tokens 0 is allowed (a prompt scored, nothing generated) when prompt_logprobs >= 0.
  std::string request_id;
  // A structured-output constraint (its `field` names the API's field), compiled last, once every cheaper check
  // passed, by limits.grammar_compiler into the request's grammar. Absent: free text.
  std::optional<structured::Constraint> constraint;
};

// The one check of a request, whichever API it came from. A request with a constraint blocks the calling thread
// while its grammar compiles (at most --max-grammar-compile-seconds): callers run such requests on a thread that may
// wait (InferenceService::grammar_pool).
absl::StatusOr<runtime::GenerationRequest> ValidateGenerateInput(const GenerateInput& input,
                                                                 const GenerateLimits& limits,
                                                                 const tokenizer::Tokenizer* tokenizer);

// From a parsed message. `tokenizer` may be null (then text prompts and stop strings are refused);
// `chat_template` too (then `messages` are).
absl::StatusOr<runtime::GenerationRequest> ValidateGenerateRequest(
    const v1::GenerateRequest& request, const GenerateLimits& limits, const tokenizer::Tokenizer* tokenizer,
    const chat_template::CheckpointChatTemplate* chat_template = nullptr);

// The JSON text of a schema or a structural tag, as a constraint's text: JSON from a client, so read by the one
// bounded parser (base/json.h); an object, else InvalidArgument naming `field`; written compact, so that one schema
// sent with other spacing finds its grammar in the compiler's cache.
absl::StatusOr<std::string> ConstraintJsonText(std::string_view text, absl::string_view field);
absl::StatusOr<std::string> JsonObjectText(const nlohmann::ordered_json& value, absl::string_view field);

// The constraint of a parsed message (its structured_output oneof and strict), or none. Errors name the field
// (a choice that is not UTF-8 is caught by the parse).
absl::StatusOr<std::optional<structured::Constraint>> GenerateRequestConstraint(const v1::GenerateRequest& request);

// The message in `wire`, or the error ValidateGenerateRequest(wire, ...) answers for bytes that do not parse.
absl::StatusOr<v1::GenerateRequest> ParseGenerateRequest(std::string_view wire);

// From the wire bytes: protobuf refuses to parse a proto3 string that is not UTF-8, so the bytes are
// read here, and such a request is INVALID_ARGUMENT naming the field (prompt, stop[i]) instead of the
// INTERNAL "failed to parse" gRPC would answer.
absl::StatusOr<runtime::GenerationRequest> ValidateGenerateRequest(
    std::string_view wire, const GenerateLimits& limits, const tokenizer::Tokenizer* tokenizer,
    const chat_template::CheckpointChatTemplate* chat_template = nullptr);

}  // namespace strata::server
