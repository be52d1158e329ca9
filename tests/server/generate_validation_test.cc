// ValidateGenerateRequest: every refusal names its field, and a valid request becomes the runtime's
// trusted struct with proto3 defaults mapped (absent top_p / repetition_penalty = 1).
#include "server/generate_validation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

namespace strata::server {
namespace {

GenerateLimits Limits() {
  GenerateLimits limits;
  limits.vocab_size = 100;
  limits.max_context = 32;
  limits.max_new_tokens = 16;
  return limits;
}

v1::GenerateRequest Valid() {
  v1::GenerateRequest request;
  request.add_prompt_ids(1);
  request.add_prompt_ids(2);
  request.set_max_new_tokens(4);
  return request;
}

void ExpectInvalid(const v1::GenerateRequest& request, const std::string& prefix) {
  absl::StatusOr<runtime::GenerationRequest> result = ValidateGenerateRequest(request, Limits(), nullptr);
  ASSERT_FALSE(result.ok()) << prefix;
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(result.status().message()).rfind(prefix + ": ", 0), 0u) << result.status();
}

TEST(GenerateValidation, ValidRequestMapsEveryField) {
  v1::GenerateRequest request = Valid();
  request.set_temperature(0.5f);
  request.set_top_k(500);  // above the vocabulary: clamped, same distribution
  request.set_seed(7);
  request.set_top_logprobs(3);
  request.set_request_id("r1");
  absl::StatusOr<runtime::GenerationRequest> out = ValidateGenerateRequest(request, Limits(), nullptr);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->prompt, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(out->sampling.max_new_tokens, 4);
  EXPECT_FLOAT_EQ(out->sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(out->sampling.top_p, 1.0f);
  EXPECT_FLOAT_EQ(out->sampling.repetition_penalty, 1.0f);
  EXPECT_EQ(out->sampling.top_k, 100);
  EXPECT_EQ(out->sampling.seed, 7u);
  EXPECT_EQ(out->sampling.top_logprobs, 3);
  EXPECT_EQ(out->request_id, "r1");
}

TEST(GenerateValidation, PromptMustBeOneOfTextOrIds) {
  v1::GenerateRequest none = Valid();
  none.clear_prompt_ids();
  ExpectInvalid(none, "prompt");
  v1::GenerateRequest both = Valid();
  both.set_prompt("hi");
  ExpectInvalid(both, "prompt");
}

TEST(GenerateValidation, TextPromptNeedsATokenizer) {
  v1::GenerateRequest request = Valid();
  request.clear_prompt_ids();
  request.set_prompt("hello");
  ExpectInvalid(request, "prompt");
}

TEST(GenerateValidation, TokenIdOutsideVocabularyNamesItsIndex) {
  v1::GenerateRequest request = Valid();
  request.add_prompt_ids(100);
  ExpectInvalid(request, "prompt_ids[2]");
  request.set_prompt_ids(0, -1);
  ExpectInvalid(request, "prompt_ids[0]");
}

TEST(GenerateValidation, PromptAndNewTokensMustFitTheContext) {
  v1::GenerateRequest request = Valid();
  for (int i = 0; i < 26; ++i) request.add_prompt_ids(3);  // 28 + max_new_tokens 4 = 32: fits
  EXPECT_TRUE(ValidateGenerateRequest(request, Limits(), nullptr).ok());
  request.add_prompt_ids(3);  // 29 + 4 = 33, though the KV cache would hold its 32 positions
  absl::StatusOr<runtime::GenerationRequest> result = ValidateGenerateRequest(request, Limits(), nullptr);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().message(),
            "prompt_ids: 29 tokens + max_new_tokens 4 = 33, more than the server's --max-context 32");
}

TEST(GenerateValidation, PromptTokensAreBounded) {
  GenerateLimits limits = Limits();
  limits.max_prompt_tokens = 3;
  v1::GenerateRequest request = Valid();
  request.add_prompt_ids(3);
  EXPECT_TRUE(ValidateGenerateRequest(request, limits, nullptr).ok());
  request.add_prompt_ids(4);
  absl::StatusOr<runtime::GenerationRequest> result = ValidateGenerateRequest(request, limits, nullptr);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(result.status().message(), "prompt_ids: 4 tokens, more than the server's limit of 3 prompt tokens");
}

// Messages print what the client sent (the shortest form that reads back as the same float) and count
// right: the binary before them said "top_p: 1 is outside (0, 1]" and "1 tokens".
TEST(GenerateValidation, MessagesPrintValuesExactlyAndCountRight) {
  v1::GenerateRequest top_p = Valid();
  top_p.set_top_p(1.0000001f);
  absl::StatusOr<runtime::GenerationRequest> result = ValidateGenerateRequest(top_p, Limits(), nullptr);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().message(), "top_p: 1.0000001 is outside (0, 1]");
  v1::GenerateRequest temperature = Valid();
  temperature.set_temperature(-1e-39f);
  result = ValidateGenerateRequest(temperature, Limits(), nullptr);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().message(), "temperature: -1e-39 is not a finite number >= 0");
  GenerateLimits limits = Limits();
  limits.max_context = 4;
  v1::GenerateRequest one;
  one.add_prompt_ids(3);
  one.set_max_new_tokens(4);
  result = ValidateGenerateRequest(one, limits, nullptr);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().message(),
            "prompt_ids: 1 token + max_new_tokens 4 = 5, more than the server's --max-context 4");
}

TEST(GenerateValidation, SamplingParametersOutOfRange) {
  for (float t : {-0.1f, NAN, INFINITY}) {
    v1::GenerateRequest request = Valid();
    request.set_temperature(t);
    ExpectInvalid(request, "temperature");
  }
  for (float p : {0.0f, 1.01f, NAN}) {
    v1::GenerateRequest request = Valid();
    request.set_top_p(p);
    ExpectInvalid(request, "top_p");
  }
  v1::GenerateRequest penalty = Valid();
  penalty.set_repetition_penalty(0);
  ExpectInvalid(penalty, "repetition_penalty");
  v1::GenerateRequest top = Valid();
  top.set_top_logprobs(21);
  ExpectInvalid(top, "top_logprobs");
}

TEST(GenerateValidation, MaxNewTokensZeroOrAboveTheLimit) {
  v1::GenerateRequest zero = Valid();
  zero.set_max_new_tokens(0);
  ExpectInvalid(zero, "max_new_tokens");
  v1::GenerateRequest above = Valid();
  above.set_max_new_tokens(17);
  ExpectInvalid(above, "max_new_tokens");
}

TEST(GenerateValidation, StopStrings) {
  v1::GenerateRequest many = Valid();
  for (int i = 0; i < 17; ++i) many.add_stop("x");
  ExpectInvalid(many, "stop");
  // Stop strings are matched on decoded text: without a tokenizer there is none.
  v1::GenerateRequest one = Valid();
  one.add_stop("x");
  ExpectInvalid(one, "stop");
}

TEST(GenerateValidation, RequestIdIsBounded) {
  v1::GenerateRequest at_limit = Valid();
  at_limit.set_request_id(std::string(256, 'r'));
  EXPECT_TRUE(ValidateGenerateRequest(at_limit, Limits(), nullptr).ok());
  v1::GenerateRequest above = Valid();
  above.set_request_id(std::string(257, 'r'));
  ExpectInvalid(above, "request_id");
}

TEST(GenerateValidation, InvalidUtf8OnTheWireNamesTheField) {
  // field 1 (prompt), length 3, "a\xff" + "b"; field 3 (max_new_tokens) = 4.
  const std::string prompt_wire = std::string(
      "\x0a\x03"
      "a\xff"
      "b\x18\x04",
      7);
  absl::StatusOr<runtime::GenerationRequest> prompt = ValidateGenerateRequest(prompt_wire, Limits(), nullptr);
  ASSERT_FALSE(prompt.ok());
  EXPECT_EQ(prompt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(prompt.status().message(), "prompt: invalid UTF-8 at byte 1");
  // field 9 (stop) twice, the second invalid.
  const std::string stop_wire = std::string("\x4a\x01x\x4a\x02\xc3z", 7);
  absl::StatusOr<runtime::GenerationRequest> stop = ValidateGenerateRequest(stop_wire, Limits(), nullptr);
  ASSERT_FALSE(stop.ok());
  EXPECT_EQ(stop.status().message(), "stop[1]: invalid UTF-8 at byte 0");
  absl::StatusOr<runtime::GenerationRequest> garbage = ValidateGenerateRequest("\xff\xff\xff", Limits(), nullptr);
  ASSERT_FALSE(garbage.ok());
  EXPECT_EQ(std::string(garbage.status().message()).rfind("request: ", 0), 0u);
}

}  // namespace
}  // namespace strata::server
