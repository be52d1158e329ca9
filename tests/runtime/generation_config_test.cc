// runtime/engine/generation_config: the eos ids of a checkpoint directory.
#include "runtime/engine/generation_config.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata::runtime {
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

// A spec whose config.json said eos_token_id: `ids` (the planner reads it; planner/decoder_config_test.cc).
planner::ModelSpec SpecWithEos(absl::StatusOr<std::vector<int32_t>> ids) {
  planner::ModelSpec spec;
  spec.eos_token_ids = std::move(ids);
  return spec;
}

TEST(GenerationConfig, EosIdsComeFromGenerationConfigFirst) {
  const std::filesystem::path dir = TestDir();
  std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": [7, 8]})";
  absl::StatusOr<std::vector<int32_t>> eos = ReadEosTokenIds(dir, SpecWithEos(std::vector<int32_t>{2}));
  ASSERT_TRUE(eos.ok()) << eos.status();
  EXPECT_THAT(*eos, ElementsAre(7, 8));
}

TEST(GenerationConfig, EosIdsFallBackToConfigJsonAndItsErrors) {
  const std::filesystem::path dir = TestDir();
  absl::StatusOr<std::vector<int32_t>> eos = ReadEosTokenIds(dir, SpecWithEos(std::vector<int32_t>{2}));
  ASSERT_TRUE(eos.ok()) << eos.status();
  EXPECT_THAT(*eos, ElementsAre(2));
  eos = ReadEosTokenIds(dir, planner::ModelSpec{});
  ASSERT_TRUE(eos.ok()) << eos.status();
  EXPECT_THAT(*eos, ElementsAre());
  // config.json's bad id matters only when generation_config.json does not name the ids.
  const absl::Status bad = absl::InvalidArgumentError("config.json: eos_token_id must be ...");
  EXPECT_EQ(ReadEosTokenIds(dir, SpecWithEos(bad)).status(), bad);
  std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": null})";
  eos = ReadEosTokenIds(dir, SpecWithEos(bad));
  ASSERT_TRUE(eos.ok()) << eos.status();
  EXPECT_THAT(*eos, ElementsAre());
}

TEST(GenerationConfig, DeeplyNestedEosIsAnErrorNotAStackOverflow) {
  // Before: the message for an eos_token_id that is no integer printed the value, and printing recurses
  // once per level: a generation_config.json of a million "[" overflowed the stack.
  const std::filesystem::path dir = TestDir();
  std::ofstream(dir / "generation_config.json")
      << R"({"eos_token_id": )" << std::string(1000000, '[') << std::string(1000000, ']') << "}";
  absl::StatusOr<std::vector<int32_t>> eos = ReadEosTokenIds(dir, planner::ModelSpec{});
  ASSERT_FALSE(eos.ok());
  EXPECT_EQ(eos.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(eos.status().message()),
              HasSubstr("generation_config.json: JSON nests deeper than 127 levels at byte "));
}

}  // namespace
}  // namespace strata::runtime
