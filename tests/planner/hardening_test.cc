// Hostile inputs to the planner (issue 10): each is an InvalidArgument naming what is wrong, never a
// crash, a truncation or an allocation sized by an attacker.
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "planner/manual_device_map.h"
#include "planner/plan.h"

namespace strata::planner {
namespace {

using ::testing::HasSubstr;

TEST(Hardening, ModuleTreeWithoutTensorsIsAnErrorNotACrash) {
  // Before: PlaceSpec called front() on the empty device map the placement produced.
  nlohmann::json tree = {{"format", "strata.module_tree.v1"},
                         {"root", {{"class", "Empty"}, {"children", {{{"name", "inner"}, {"class", "Inner"}}}}}}};
  absl::StatusOr<ModelSpec> spec = ModelSpecFromModuleTree(tree, std::nullopt);
  ASSERT_TRUE(spec.ok()) << spec.status();
  for (const char* strategy : {"auto", "balanced", "balanced_low_0", "sequential", R"({"": 0})"}) {
    PlanRequest request;
    request.device_map = *ParseDeviceMapChoice(strategy);
    request.max_memory = *ParseMaxMemory("0=1GiB,cpu=1GiB");
    absl::StatusOr<Plan> plan = PlaceSpec(*spec, request);
    ASSERT_FALSE(plan.ok()) << strategy;
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(plan.status().message()), HasSubstr("no parameters or buffers"));
  }
}

TEST(Hardening, DeviceIndexPastIntIsAnErrorNotGpu0) {
  for (const char* text : {R"({"": 4294967296})", R"({"": 2147483648})", R"({"": 18446744073709551615})"}) {
    absl::StatusOr<DeviceMap> map = ParseDeviceMap(text);
    ASSERT_FALSE(map.ok()) << text << " parsed as GPU " << (*map)[0].second.index;
    EXPECT_THAT(std::string(map.status().message()), HasSubstr("unknown device")) << text;
  }
  absl::StatusOr<DeviceMap> largest = ParseDeviceMap(R"({"": 2147483647})");
  ASSERT_TRUE(largest.ok()) << largest.status();
  EXPECT_EQ((*largest)[0].second.index, 2147483647);
}

nlohmann::json SmallLlama() {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"hidden_size", 64},
          {"intermediate_size", 128},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 4},
          {"vocab_size", 1000}};
}

TEST(Hardening, HugeConfigSizesAreErrorsNamingTheFieldNotAnOutOfMemoryKill) {
  // Before: num_hidden_layers 1000000 built a million layers' modules (gigabytes) before any check.
  for (const auto& [field, value] :
       std::vector<std::pair<std::string, int64_t>>{{"num_hidden_layers", 1000000},
                                                    {"num_hidden_layers", kMaxHiddenLayers + 1},
                                                    {"hidden_size", kMaxHiddenSize * 64},
                                                    {"intermediate_size", kMaxHiddenSize + 1},
                                                    {"vocab_size", kMaxVocabSize + 1},
                                                    {"num_key_value_heads", kMaxAttentionHeads + 1},
                                                    {"head_dim", kMaxHeadDim + 1}}) {
    nlohmann::json config = SmallLlama();
    config[field] = value;
    absl::StatusOr<ModelSpec> spec = ModelSpecFromConfig(config, DType::kFloat32);
    ASSERT_FALSE(spec.ok()) << field << " = " << value;
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(spec.status().message()), HasSubstr(absl::StrCat(field, " must be at most ")));
  }
}

TEST(Hardening, LargestAllowedSizesStillGiveASpecWhoseBytesFit) {
  nlohmann::json config = SmallLlama();
  config["num_hidden_layers"] = kMaxHiddenLayers;
  config["hidden_size"] = 4096;
  config["num_attention_heads"] = 32;
  absl::StatusOr<ModelSpec> spec = ModelSpecFromConfig(config, DType::kFloat32);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(SpecBytes(*spec).ok());
}

TEST(Hardening, TensorBytesAreCheckedArithmetic) {
  TensorSpec t{"weight", {int64_t{1} << 40, int64_t{1} << 30}, DType::kFloat32};
  absl::StatusOr<int64_t> bytes = t.CheckedBytes();
  ASSERT_FALSE(bytes.ok());
  EXPECT_THAT(std::string(bytes.status().message()), HasSubstr("tensor weight bytes"));
  EXPECT_FALSE(CheckedMul(int64_t{1} << 62, 4, "x").ok());
  EXPECT_FALSE(CheckedMul(-1, 4, "x").ok());
  EXPECT_EQ(*CheckedMul(int64_t{1} << 31, int64_t{1} << 31, "x"), int64_t{1} << 62);
}

TEST(Hardening, KvCacheBytesThatOverflowAreAnErrorNamingTheField) {
  absl::StatusOr<ModelSpec> spec = ModelSpecFromConfig(SmallLlama(), DType::kFloat32);
  ASSERT_TRUE(spec.ok()) << spec.status();
  PlanRequest request;
  request.device_map = *ParseDeviceMapChoice("auto");
  request.max_memory = *ParseMaxMemory("0=1GiB,cpu=1GiB");
  request.kv_cache_tokens = int64_t{1} << 60;
  absl::StatusOr<Plan> plan = PlaceSpec(*spec, request);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(plan.status().message()), HasSubstr("kv_cache_tokens"));
}

TEST(Hardening, ModuleTreeKvFieldsAndSizesAreBounded) {
  nlohmann::json tree = {{"format", "strata.module_tree.v1"},
                         {"root",
                          {{"class", "M"},
                           {"parameters",
                            {{{"name", "a"}, {"shape", {int64_t{1} << 40}}, {"dtype", "float32"}},
                             {{"name", "b"}, {"shape", {int64_t{1} << 40}}, {"dtype", "float32"}}}}}}};
  tree["kv_cache"] = {{"num_hidden_layers", 2}, {"num_key_value_heads", 2}, {"head_dim", int64_t{1} << 40}};
  absl::StatusOr<ModelSpec> spec = ModelSpecFromModuleTree(tree, std::nullopt);
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("kv_cache.head_dim"));
}

// A JSON value nested `levels` deep: "[[[...]]]", written as text (nlohmann's dump would recurse too).
std::string Nested(int levels) { return std::string(levels, '[') + std::string(levels, ']'); }

// A fresh temporary directory named after the running test.
std::filesystem::path TestDir() {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) /
      ("strata_hardening_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

TEST(Hardening, DeeplyNestedConfigIsAnErrorNotAStackOverflow) {
  // Before: the error for a hidden_size that is no integer printed the value, and printing recurses once
  // per level: a 2 MB config.json of "[" overflowed the stack. Found by tests/fuzz/fuzz_config.
  const std::filesystem::path dir = TestDir();
  std::ofstream(dir / "config.json") << R"({"architectures": ["LlamaForCausalLM"], "hidden_size": )" << Nested(1000000)
                                     << "}";
  absl::StatusOr<ModelSpec> spec = LoadModelSpec(dir, std::nullopt);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()),
              HasSubstr((dir / "config.json").string() + ": JSON nests deeper than 127 levels at byte "));
  // Nesting that real files have is untouched.
  std::ofstream(dir / "config.json") << SmallLlama().dump();
  EXPECT_TRUE(LoadModelSpec(dir, std::nullopt).ok());
}

TEST(Hardening, DeeplyNestedDeviceMapIsAnErrorNotAStackOverflow) {
  // Before: "unknown device [[[[...": the message printed the value. Found by tests/fuzz/fuzz_device_map.
  absl::StatusOr<DeviceMap> map = ParseDeviceMap(R"({"model": )" + Nested(1000000) + "}");
  ASSERT_FALSE(map.ok());
  EXPECT_THAT(std::string(map.status().message()), HasSubstr("device_map: JSON nests deeper than 127 levels"));
  absl::StatusOr<DeviceMapChoice> choice = ParseDeviceMapChoice(R"({"model": )" + Nested(126) + "}");
  ASSERT_FALSE(choice.ok());
  EXPECT_THAT(std::string(choice.status().message()), HasSubstr("unknown device [[["));
}

TEST(Hardening, DeeplyNestedModuleTreeIsAnErrorNotAStackOverflow) {
  const std::filesystem::path file = TestDir() / "tree.json";
  std::ofstream(file) << R"({"format": )" << Nested(1000000) << "}";
  absl::StatusOr<ModelSpec> spec = LoadModuleTree(file, std::nullopt);
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("JSON nests deeper than 133 levels"));
}

}  // namespace
}  // namespace strata::planner
