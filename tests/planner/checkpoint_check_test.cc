// LoadModelSpec: config.json errors, and safetensors headers checked against the spec. The tests write tiny
// fake checkpoints (a real header followed by zero bytes) into a temporary directory.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "planner/model_spec.h"

namespace strata::planner {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;

struct FakeTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::string dtype = "BF16";
};

int64_t ElementSize(const std::string& dtype) {
  if (dtype == "F32" || dtype == "I32") return 4;
  if (dtype == "F64" || dtype == "I64") return 8;
  if (dtype == "U8" || dtype == "I8" || dtype == "BOOL") return 1;
  return 2;
}

// One layer, hidden 8, 2 heads, 1 KV head, intermediate 16, vocab 10.
json TinyConfig() {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"hidden_size", 8},
          {"intermediate_size", 16},
          {"num_hidden_layers", 1},
          {"num_attention_heads", 2},
          {"num_key_value_heads", 1},
          {"vocab_size", 10},
          {"torch_dtype", "bfloat16"}};
}

class CheckpointCheckTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("strata_checkpoint_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  void WriteText(const std::string& name, const std::string& text) { std::ofstream(dir_ / name) << text; }
  void WriteConfig(const json& config) { WriteText("config.json", config.dump(2)); }

  // Writes a safetensors file: 8-byte little-endian header length, the JSON header, then zeroed data.
  void WriteRaw(const std::string& name, const std::string& header, uint64_t declared_length, uint64_t data_bytes) {
    std::ofstream out(dir_ / name, std::ios::binary);
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>((declared_length >> (8 * i)) & 0xff));
    out << header;
    out << std::string(data_bytes, '\0');
  }
  void WriteSafetensors(const std::string& name, const std::vector<FakeTensor>& tensors, bool with_metadata = true) {
    json header = json::object();
    if (with_metadata) header["__metadata__"] = {{"format", "pt"}};
    uint64_t offset = 0;
    for (const FakeTensor& t : tensors) {
      uint64_t bytes = ElementSize(t.dtype);
      for (int64_t d : t.shape) bytes *= d;
      header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
      offset += bytes;
    }
    const std::string text = header.dump();
    WriteRaw(name, text, text.size(), offset);
  }

  // Every tensor the tiny config's checkpoint holds, in BF16.
  std::vector<FakeTensor> CompleteTensors(const json& config = TinyConfig()) {
    absl::StatusOr<ModelSpec> spec = ModelSpecFromConfig(config, DType::kBFloat16);
    EXPECT_TRUE(spec.ok()) << spec.status();
    std::vector<FakeTensor> out;
    for (const auto& [name, expected] : CheckpointTensors(*spec)) out.push_back({name, expected.shape, "BF16"});
    return out;
  }

  std::string LoadError() {
    absl::StatusOr<ModelSpec> spec = LoadModelSpec(dir_, std::nullopt);
    EXPECT_FALSE(spec.ok());
    if (spec.ok()) return "";
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(spec.status().message());
  }

  std::filesystem::path dir_;
};

TEST_F(CheckpointCheckTest, ConfigOnlyDirectoryLoads) {
  WriteConfig(TinyConfig());
  absl::StatusOr<ModelSpec> spec = LoadModelSpec(dir_, std::nullopt);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->architecture, "LlamaForCausalLM");
  EXPECT_EQ(spec->dtype, DType::kBFloat16);  // from torch_dtype
}

TEST_F(CheckpointCheckTest, DtypeOverrideWinsOverConfig) {
  WriteConfig(TinyConfig());
  absl::StatusOr<ModelSpec> spec = LoadModelSpec(dir_, DType::kFloat32);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->dtype, DType::kFloat32);
  EXPECT_EQ(spec->root.children[1].parameters[0].dtype, DType::kFloat32);
}

TEST_F(CheckpointCheckTest, CompleteSingleFileCheckpointLoads) {
  WriteConfig(TinyConfig());
  WriteSafetensors("model.safetensors", CompleteTensors());
  absl::StatusOr<ModelSpec> spec = LoadModelSpec(dir_, std::nullopt);
  EXPECT_TRUE(spec.ok()) << spec.status();
}

TEST_F(CheckpointCheckTest, FileDtypeMayDifferFromServingDtype) {
  WriteConfig(TinyConfig());
  std::vector<FakeTensor> tensors = CompleteTensors();
  for (FakeTensor& t : tensors) t.dtype = "F32";  // cast to bfloat16 at load time
  WriteSafetensors("model.safetensors", tensors, /*with_metadata=*/false);
  absl::StatusOr<ModelSpec> spec = LoadModelSpec(dir_, std::nullopt);
  EXPECT_TRUE(spec.ok()) << spec.status();
}

TEST_F(CheckpointCheckTest, CompleteShardedCheckpointLoads) {
  WriteConfig(TinyConfig());
  std::vector<FakeTensor> all = CompleteTensors();
  std::vector<FakeTensor> first(all.begin(), all.begin() + 3), second(all.begin() + 3, all.end());
  WriteSafetensors("model-00001-of-00002.safetensors", first);
  WriteSafetensors("model-00002-of-00002.safetensors", second);
  json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", json::object()}};
  for (const FakeTensor& t : first) index["weight_map"][t.name] = "model-00001-of-00002.safetensors";
  for (const FakeTensor& t : second) index["weight_map"][t.name] = "model-00002-of-00002.safetensors";
  WriteText("model.safetensors.index.json", index.dump());
  absl::StatusOr<ModelSpec> spec = LoadModelSpec(dir_, std::nullopt);
  EXPECT_TRUE(spec.ok()) << spec.status();
}

TEST_F(CheckpointCheckTest, MissingTensorIsNamed) {
  WriteConfig(TinyConfig());
  std::vector<FakeTensor> tensors = CompleteTensors();
  std::erase_if(tensors, [](const FakeTensor& t) { return t.name == "model.layers.0.mlp.up_proj.weight"; });
  WriteSafetensors("model.safetensors", tensors);
  EXPECT_EQ(LoadError(),
            "checkpoint: tensor model.layers.0.mlp.up_proj.weight [16, 8] is missing from model.safetensors");
}

TEST_F(CheckpointCheckTest, SeveralMissingTensorsAreCounted) {
  WriteConfig(TinyConfig());
  std::vector<FakeTensor> tensors = CompleteTensors();
  std::erase_if(tensors, [](const FakeTensor& t) { return t.name.find("self_attn") != std::string::npos; });
  WriteSafetensors("model.safetensors", tensors);
  EXPECT_THAT(LoadError(), HasSubstr("is missing from model.safetensors (and 3 more)"));
}

TEST_F(CheckpointCheckTest, UnexpectedTensorIsNamed) {
  WriteConfig(TinyConfig());
  std::vector<FakeTensor> tensors = CompleteTensors();
  tensors.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", {2}, "F32"});
  WriteSafetensors("model.safetensors", tensors);
  EXPECT_THAT(LoadError(),
              HasSubstr("unexpected tensor model.layers.0.self_attn.rotary_emb.inv_freq in model.safetensors"));
}

TEST_F(CheckpointCheckTest, MisShapedTensorIsNamedWithFileAndShapes) {
  WriteConfig(TinyConfig());
  std::vector<FakeTensor> tensors = CompleteTensors();
  for (FakeTensor& t : tensors) {
    if (t.name == "model.layers.0.mlp.up_proj.weight") t.shape = {8, 8};
  }
  WriteSafetensors("model.safetensors", tensors);
  EXPECT_EQ(
      LoadError(),
      "checkpoint: tensor model.layers.0.mlp.up_proj.weight has shape [8, 8] in model.safetensors, expected [16, 8]");
}

TEST_F(CheckpointCheckTest, TiedWeightMayBeAbsentOrPresent) {
  json config = TinyConfig();
  config["tie_word_embeddings"] = true;
  WriteConfig(config);
  std::vector<FakeTensor> tensors = CompleteTensors(config);
  WriteSafetensors("model.safetensors", tensors);
  EXPECT_TRUE(LoadModelSpec(dir_, std::nullopt).ok());

  // Some exports still write the tied copy; it is accepted when its shape is right.
  tensors.push_back({"lm_head.weight", {10, 8}, "BF16"});
  WriteSafetensors("model.safetensors", tensors);
  absl::StatusOr<ModelSpec> spec = LoadModelSpec(dir_, std::nullopt);
  EXPECT_TRUE(spec.ok()) << spec.status();

  tensors.back().shape = {8, 10};
  WriteSafetensors("model.safetensors", tensors);
  EXPECT_THAT(LoadError(), HasSubstr("tensor lm_head.weight has shape [8, 10]"));
}

TEST_F(CheckpointCheckTest, UnknownSafetensorsDtypeIsRejected) {
  WriteConfig(TinyConfig());
  std::vector<FakeTensor> tensors = CompleteTensors();
  tensors[0].dtype = "Q4";
  WriteSafetensors("model.safetensors", tensors);
  EXPECT_THAT(LoadError(),
              HasSubstr("model.safetensors: tensor " + tensors[0].name + ": unknown safetensors dtype \"Q4\""));
}

TEST_F(CheckpointCheckTest, HeaderLengthBeyondFileIsRejected) {
  WriteConfig(TinyConfig());
  WriteRaw("model.safetensors", "{}", 4096, 0);
  EXPECT_THAT(LoadError(), HasSubstr("model.safetensors: header length 4096 exceeds the file size"));
}

TEST_F(CheckpointCheckTest, TooShortFileIsRejected) {
  WriteConfig(TinyConfig());
  WriteText("model.safetensors", "abc");
  EXPECT_THAT(LoadError(), HasSubstr("model.safetensors: 3 bytes is too short"));
}

TEST_F(CheckpointCheckTest, InvalidJsonHeaderIsRejected) {
  WriteConfig(TinyConfig());
  WriteRaw("model.safetensors", "{\"a\": ", 6, 0);
  EXPECT_THAT(LoadError(), HasSubstr("model.safetensors: the header: not valid JSON"));
}

TEST_F(CheckpointCheckTest, HeaderEntryWithoutDataOffsetsIsRejected) {
  WriteConfig(TinyConfig());
  const std::string header = R"({"model.norm.weight": {"dtype": "BF16", "shape": [8]}})";
  WriteRaw("model.safetensors", header, header.size(), 16);
  EXPECT_THAT(LoadError(), HasSubstr("model.safetensors: tensor model.norm.weight: header entry needs data_offsets"));
}

TEST_F(CheckpointCheckTest, HeaderEntryWithoutShapeIsRejected) {
  WriteConfig(TinyConfig());
  const std::string header = R"({"model.norm.weight": {"dtype": "BF16", "data_offsets": [0, 16]}})";
  WriteRaw("model.safetensors", header, header.size(), 16);
  EXPECT_THAT(LoadError(), HasSubstr("tensor model.norm.weight: header entry has no shape array"));
}

TEST_F(CheckpointCheckTest, TruncatedDataIsRejected) {
  WriteConfig(TinyConfig());
  const std::string header = R"({"model.norm.weight": {"dtype": "BF16", "shape": [8], "data_offsets": [0, 16]}})";
  WriteRaw("model.safetensors", header, header.size(), 10);
  EXPECT_THAT(LoadError(), HasSubstr("tensor model.norm.weight: data_offsets end 16 is past the 10 data bytes"));
}

TEST_F(CheckpointCheckTest, DataOffsetsMustMatchShapeAndDtype) {
  WriteConfig(TinyConfig());
  const std::string header = R"({"model.norm.weight": {"dtype": "F32", "shape": [8], "data_offsets": [0, 16]}})";
  WriteRaw("model.safetensors", header, header.size(), 16);
  EXPECT_THAT(LoadError(), HasSubstr("data_offsets span 16 bytes, but F32 [8] needs 32"));
}

TEST_F(CheckpointCheckTest, OverlappingDataOffsetsAreRejected) {
  WriteConfig(TinyConfig());
  const std::string header = R"({"model.norm.weight": {"dtype": "BF16", "shape": [8], "data_offsets": [0, 16]},
      "model.embed_tokens.weight": {"dtype": "BF16", "shape": [4], "data_offsets": [8, 16]}})";
  WriteRaw("model.safetensors", header, header.size(), 16);
  EXPECT_THAT(LoadError(), HasSubstr("tensor model.embed_tokens.weight: data_offsets [8, 16) overlap tensor "
                                     "model.norm.weight [0, 16)"));
}

TEST_F(CheckpointCheckTest, OverflowingShapeIsRejected) {
  WriteConfig(TinyConfig());
  const std::string header =
      R"({"model.norm.weight": {"dtype": "F32", "shape": [1099511627776, 1099511627776], "data_offsets": [0, 16]}})";
  WriteRaw("model.safetensors", header, header.size(), 16);
  EXPECT_THAT(LoadError(), HasSubstr("needs more than 2^64"));
}

TEST_F(CheckpointCheckTest, MissingShardIsNamed) {
  WriteConfig(TinyConfig());
  std::vector<FakeTensor> all = CompleteTensors();
  WriteSafetensors("model-00001-of-00002.safetensors", all);
  json index = {{"weight_map", json::object()}};
  for (const FakeTensor& t : all) index["weight_map"][t.name] = "model-00001-of-00002.safetensors";
  index["weight_map"]["model.norm.weight"] = "model-00002-of-00002.safetensors";
  WriteText("model.safetensors.index.json", index.dump());
  EXPECT_EQ(LoadError(),
            "checkpoint: shard model-00002-of-00002.safetensors listed in model.safetensors.index.json is missing");
}

TEST_F(CheckpointCheckTest, IndexNamingTheWrongShardIsRejected) {
  WriteConfig(TinyConfig());
  std::vector<FakeTensor> all = CompleteTensors();
  std::vector<FakeTensor> first(all.begin(), all.begin() + 3), second(all.begin() + 3, all.end());
  WriteSafetensors("a.safetensors", first);
  WriteSafetensors("b.safetensors", second);
  json index = {{"weight_map", json::object()}};
  for (const FakeTensor& t : all) index["weight_map"][t.name] = "a.safetensors";
  index["weight_map"][second[0].name] = "b.safetensors";
  index["weight_map"][second[1].name] = "a.safetensors";  // wrong: it lives in b
  WriteText("model.safetensors.index.json", index.dump());
  EXPECT_THAT(LoadError(), HasSubstr("tensor " + second[1].name +
                                     " is listed in model.safetensors.index.json under "
                                     "a.safetensors, but that shard does not hold it"));
}

TEST_F(CheckpointCheckTest, TensorInTwoShardsIsRejected) {
  WriteConfig(TinyConfig());
  std::vector<FakeTensor> all = CompleteTensors();
  WriteSafetensors("a.safetensors", all);
  WriteSafetensors("b.safetensors", {all[0]});
  json index = {{"weight_map", json::object()}};
  for (const FakeTensor& t : all) index["weight_map"][t.name] = "a.safetensors";
  index["weight_map"][all[1].name] = "b.safetensors";
  WriteText("model.safetensors.index.json", index.dump());
  EXPECT_THAT(LoadError(), HasSubstr("tensor " + all[0].name + " appears in both a.safetensors and b.safetensors"));
}

TEST_F(CheckpointCheckTest, MalformedIndexIsRejected) {
  WriteConfig(TinyConfig());
  WriteText("model.safetensors.index.json", R"({"weight_map": ["a"]})");
  EXPECT_THAT(LoadError(), HasSubstr("model.safetensors.index.json: expected an object with a \"weight_map\""));
  WriteText("model.safetensors.index.json", R"({"weight_map": {"x": "../escape.safetensors"}})");
  EXPECT_THAT(LoadError(), HasSubstr("is not a file name in the checkpoint directory"));
}

TEST_F(CheckpointCheckTest, MissingConfigIsNamed) { EXPECT_THAT(LoadError(), HasSubstr("config.json: not found")); }

TEST_F(CheckpointCheckTest, MissingDirectoryIsNamed) {
  absl::StatusOr<ModelSpec> spec = LoadModelSpec(dir_ / "nope", std::nullopt);
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(), HasSubstr("nope: not a directory"));
}

TEST_F(CheckpointCheckTest, InvalidConfigJsonNamesTheFile) {
  WriteText("config.json", "{ not json");
  EXPECT_THAT(LoadError(), HasSubstr((dir_ / "config.json").string() + ": not valid JSON"));
}

TEST_F(CheckpointCheckTest, ConfigFieldErrorsNameTheFile) {
  json config = TinyConfig();
  config["hidden_size"] = "eight";
  WriteConfig(config);
  EXPECT_EQ(LoadError(), (dir_ / "config.json").string() + ": hidden_size must be a positive integer, got \"eight\"");
}

TEST_F(CheckpointCheckTest, BadConfigDtypeNamesTheFile) {
  json config = TinyConfig();
  config["torch_dtype"] = "float4";
  WriteConfig(config);
  EXPECT_THAT(LoadError(), HasSubstr("config.json: torch_dtype: unknown dtype \"float4\""));
}

}  // namespace
}  // namespace strata::planner
