// planner/generation_config: generation_config.json's eos ids over config.json's, kept in the spec.
#include "planner/generation_config.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata::planner {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::filesystem::path TestDir() {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) /
      ("strata_genconfig_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// A spec whose config.json said eos_token_id: `ids` (ModelSpecFromConfig reads it; decoder_config_test.cc).
ModelSpec SpecWithEos(absl::StatusOr<std::vector<int32_t>> ids) {
  ModelSpec spec;
  spec.eos_token_ids = std::move(ids);
  return spec;
}

absl::StatusOr<std::vector<int32_t>> Eos(const std::filesystem::path& dir, ModelSpec spec) {
  ApplyGenerationConfig(dir, spec);
  return EosTokenIds(spec);
}

TEST(GenerationConfig, EosIdsComeFromGenerationConfigFirst) {
  const std::filesystem::path dir = TestDir();
  std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": [7, 8]})";
  absl::StatusOr<std::vector<int32_t>> eos = Eos(dir, SpecWithEos(std::vector<int32_t>{2}));
  ASSERT_TRUE(eos.ok()) << eos.status();
  EXPECT_THAT(*eos, ElementsAre(7, 8));
}

TEST(GenerationConfig, EosIdsFallBackToConfigJsonAndItsErrors) {
  const std::filesystem::path dir = TestDir();
  absl::StatusOr<std::vector<int32_t>> eos = Eos(dir, SpecWithEos(std::vector<int32_t>{2}));
  ASSERT_TRUE(eos.ok()) << eos.status();
  EXPECT_THAT(*eos, ElementsAre(2));
  eos = Eos(dir, ModelSpec{});
  ASSERT_TRUE(eos.ok()) << eos.status();
  EXPECT_THAT(*eos, ElementsAre());
  // config.json's bad id matters only when generation_config.json does not name the ids.
  const absl::Status bad = absl::InvalidArgumentError("config.json: eos_token_id must be ...");
  EXPECT_EQ(Eos(dir, SpecWithEos(bad)).status(), bad);
  std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": null})";
  eos = Eos(dir, SpecWithEos(bad));
  ASSERT_TRUE(eos.ok()) << eos.status();
  EXPECT_THAT(*eos, ElementsAre());
}

TEST(GenerationConfig, DeeplyNestedEosIsAnErrorNotAStackOverflow) {
  // Before: the message for an eos_token_id that is no integer printed the value, and printing recurses
  // once per level: a generation_config.json of a million "[" overflowed the stack.
  const std::filesystem::path dir = TestDir();
  std::ofstream(dir / "generation_config.json")
      << R"({"eos_token_id": )" << std::string(1000000, '[') << std::string(1000000, ']') << "}";
  absl::StatusOr<std::vector<int32_t>> eos = Eos(dir, ModelSpec{});
  ASSERT_FALSE(eos.ok());
  EXPECT_EQ(eos.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(eos.status().message()),
              HasSubstr("generation_config.json: JSON nests deeper than 127 levels at byte "));
}

TEST(GenerationConfig, LoadModelSpecKeepsTheFilesErrorForWhereTheIdsAreUsed) {
  const std::filesystem::path dir = TestDir();
  std::ofstream(dir / "config.json") << R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_hidden_layers": 2, "vocab_size": 256, "eos_token_id": 2})";
  std::ofstream(dir / "generation_config.json") << "{not json";
  absl::StatusOr<ModelSpec> spec = LoadModelSpec(dir, std::nullopt);
  ASSERT_TRUE(spec.ok()) << spec.status();  // planning does not need the ids
  absl::StatusOr<std::vector<int32_t>> eos = EosTokenIds(*spec);
  ASSERT_FALSE(eos.ok());
  EXPECT_THAT(std::string(eos.status().message()), HasSubstr("generation_config.json: not valid JSON"));
  std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": 5})";
  spec = LoadModelSpec(dir, std::nullopt);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(*EosTokenIds(*spec), ElementsAre(5));
}

}  // namespace
}  // namespace strata::planner
