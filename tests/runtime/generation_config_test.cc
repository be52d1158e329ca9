// runtime/engine/generation_config: the eos ids of a checkpoint directory.
#include "runtime/engine/generation_config.h"

#include <filesystem>
#include <fstream>
#include <string>

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

TEST(GenerationConfig, EosIdsComeFromGenerationConfigFirst) {
  const std::filesystem::path dir = TestDir();
  std::ofstream(dir / "config.json") << R"({"eos_token_id": 2})";
  std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": [7, 8]})";
  absl::StatusOr<std::vector<int32_t>> eos = ReadEosTokenIds(dir);
  ASSERT_TRUE(eos.ok()) << eos.status();
  EXPECT_THAT(*eos, ElementsAre(7, 8));
}

TEST(GenerationConfig, DeeplyNestedEosIsAnErrorNotAStackOverflow) {
  // Before: the message for an eos_token_id that is no integer printed the value, and printing recurses
  // once per level: a generation_config.json of a million "[" overflowed the stack.
  const std::filesystem::path dir = TestDir();
  std::ofstream(dir / "generation_config.json")
      << R"({"eos_token_id": )" << std::string(1000000, '[') << std::string(1000000, ']') << "}";
  absl::StatusOr<std::vector<int32_t>> eos = ReadEosTokenIds(dir);
  ASSERT_FALSE(eos.ok());
  EXPECT_EQ(eos.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(eos.status().message()),
              HasSubstr("generation_config.json: JSON nests deeper than 127 levels at byte "));
}

}  // namespace
}  // namespace strata::runtime
