// config.json fields the forward pass reads: every one type-checked and bounded, errors naming the field
// (issue 10: a null use_sliding_window threw nlohmann's type_error; a negative max_window_layers wrote
// out of bounds).
#include "runtime/model/model_config.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace strata::runtime {
namespace {

using ::testing::HasSubstr;

nlohmann::json Qwen2() {
  return {{"architectures", {"Qwen2ForCausalLM"}},
          {"num_hidden_layers", 4},
          {"use_sliding_window", true},
          {"sliding_window", 16},
          {"max_window_layers", 2}};
}

std::string ErrorOf(const nlohmann::json& config) {
  absl::StatusOr<DecoderConfig> parsed = DecoderConfigFromJson(config);
  EXPECT_FALSE(parsed.ok());
  if (parsed.ok()) return "";
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(parsed.status().message());
}

TEST(ModelConfig, Qwen2SlidingLayersFromMaxWindowLayers) {
  absl::StatusOr<DecoderConfig> parsed = DecoderConfigFromJson(Qwen2());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->sliding_window, (std::vector<int64_t>{0, 0, 16, 16}));
}

TEST(ModelConfig, NegativeMaxWindowLayersIsAnErrorNotAnOutOfBoundsWrite) {
  nlohmann::json config = Qwen2();
  config["max_window_layers"] = -3;
  EXPECT_THAT(ErrorOf(config), HasSubstr("max_window_layers"));
}

TEST(ModelConfig, WrongTypedSlidingWindowFieldsNameTheField) {
  for (const nlohmann::json& bad : {nlohmann::json("yes"), nlohmann::json(1)}) {
    nlohmann::json config = Qwen2();
    config["use_sliding_window"] = bad;
    EXPECT_THAT(ErrorOf(config), HasSubstr("use_sliding_window"));
  }
  for (const nlohmann::json& bad : {nlohmann::json("2"), nlohmann::json(2.5), nlohmann::json::array()}) {
    nlohmann::json config = Qwen2();
    config["max_window_layers"] = bad;
    EXPECT_THAT(ErrorOf(config), HasSubstr("max_window_layers"));
  }
  nlohmann::json config = Qwen2();
  config["layer_types"] = {"sliding_attention", 3, "full_attention", "full_attention"};
  EXPECT_THAT(ErrorOf(config), HasSubstr("layer_types[1]"));
}

TEST(ModelConfig, NullSlidingWindowFieldsTakeTheDefaults) {
  nlohmann::json config = Qwen2();
  config["use_sliding_window"] = nullptr;
  config["max_window_layers"] = nullptr;
  absl::StatusOr<DecoderConfig> parsed = DecoderConfigFromJson(config);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->sliding_window, (std::vector<int64_t>{0, 0, 0, 0}));
}

TEST(ModelConfig, ValuesThatCannotMakeAModelAreRefusedNamingTheField) {
  // Before: accepted, and the model streamed token 0 with NaN logprobs under status OK.
  for (double eps : {0.0, -1e-6}) {
    nlohmann::json config = Qwen2();
    config["rms_norm_eps"] = eps;
    EXPECT_THAT(ErrorOf(config), HasSubstr("rms_norm_eps")) << eps;
  }
  for (double theta : {0.0, -10000.0}) {
    nlohmann::json config = Qwen2();
    config["rope_theta"] = theta;
    EXPECT_THAT(ErrorOf(config), HasSubstr("rope_theta")) << theta;
    config.erase("rope_theta");
    config["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", theta}};
    EXPECT_THAT(ErrorOf(config), HasSubstr("rope_parameters.rope_theta")) << theta;
  }
}

}  // namespace
}  // namespace strata::runtime
