// checkpoint/safetensors: the mmap reader. Files are written byte for byte by the tests, so every header
// claim the reader must check can be made false on purpose.

#include "checkpoint/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace strata::checkpoint {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("strata_st_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // 8-byte little-endian length (declared), the header text, then `data`.
  void WriteRaw(const std::string& name, const std::string& header, uint64_t declared, const std::string& data) {
    std::ofstream out(dir_ / name, std::ios::binary);
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>((declared >> (8 * i)) & 0xff));
    out << header << data;
  }
  void Write(const std::string& name, const std::string& header, const std::string& data) {
    WriteRaw(name, header, header.size(), data);
  }
  std::string OpenError(const std::string& file = "model.safetensors") {
    absl::StatusOr<std::vector<TensorView>> views = OpenSafetensors(dir_, file);
    EXPECT_FALSE(views.ok());
    if (views.ok()) return "";
    EXPECT_EQ(views.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(views.status().message());
  }

  fs::path dir_;
};

std::string Floats(std::vector<float> values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
}

TEST_F(SafetensorsTest, ViewsPointIntoTheMappingWithoutCopies) {
  const std::string header =
      R"({"__metadata__": {"format": "pt"}, "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
      R"( "b": {"dtype": "BF16", "shape": [2, 1], "data_offsets": [8, 12]}})";
  Write("model.safetensors", header, Floats({1.5f, -2.0f}) + std::string("\x80\x3f\x00\x40", 4));
  absl::StatusOr<std::vector<TensorView>> views = OpenSafetensors(dir_, "model.safetensors");
  ASSERT_TRUE(views.ok()) << views.status();
  ASSERT_EQ(views->size(), 2u);
  const TensorView& a = (*views)[0];
  EXPECT_EQ(a.name, "a");
  EXPECT_EQ(a.dtype, DType::kFloat32);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2}));
  EXPECT_EQ(a.offset, 8 + header.size());
  EXPECT_EQ(a.data(), a.file->data() + 8 + header.size());  // inside the mapping: no copy was made
  float values[2];
  std::memcpy(values, a.data(), 8);
  EXPECT_EQ(values[0], 1.5f);
  EXPECT_EQ(values[1], -2.0f);
  EXPECT_EQ((*views)[1].dtype, DType::kBFloat16);
  EXPECT_EQ((*views)[1].bytes, 4u);
  // Dropping resident pages of a private read-only mapping loses nothing: the bytes read back.
  a.file->Release(a.offset, a.bytes);
  std::memcpy(values, a.data(), 8);
  EXPECT_EQ(values[0], 1.5f);
}

TEST_F(SafetensorsTest, UnsupportedDtypeNamesTensorAndDtype) {
  // I32, U8 and the float8 dtypes load (quantized checkpoints); U16 is in no format strata reads.
  Write("model.safetensors", R"({"ids": {"dtype": "U16", "shape": [2], "data_offsets": [0, 4]}})", Floats({0}));
  EXPECT_THAT(OpenError(), HasSubstr("model.safetensors: tensor ids: dtype U16 is not one the runtime loads"));
}

TEST_F(SafetensorsTest, UnknownDtypeNamesTensorAndDtype) {
  Write("model.safetensors", R"({"w": {"dtype": "Q4_K", "shape": [1], "data_offsets": [0, 4]}})", Floats({0}));
  EXPECT_THAT(OpenError(), HasSubstr("tensor w: unknown safetensors dtype \"Q4_K\""));
}

TEST_F(SafetensorsTest, FileShorterThanTheLengthFieldIsRejected) {
  std::ofstream(dir_ / "model.safetensors", std::ios::binary) << "abc";
  EXPECT_THAT(OpenError(), HasSubstr("model.safetensors: 3 bytes is too short for a safetensors header"));
}

TEST_F(SafetensorsTest, HeaderLengthPastEndOfFileIsRejected) {
  const std::string header = R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})";
  WriteRaw("model.safetensors", header, 1 << 20, Floats({0}));
  EXPECT_THAT(OpenError(), HasSubstr("header length 1048576 exceeds the file size"));
}

TEST_F(SafetensorsTest, TruncatedDataIsRejected) {
  Write("model.safetensors", R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", Floats({0, 1}));
  EXPECT_THAT(OpenError(), HasSubstr("tensor w: data_offsets end 16 is past the 8 data bytes"));
}

TEST_F(SafetensorsTest, OffsetsOutOfRangeAreRejected) {
  Write("model.safetensors", R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [100, 104]}})", Floats({0}));
  EXPECT_THAT(OpenError(), HasSubstr("tensor w: data_offsets end 104 is past the 4 data bytes"));
  Write("model.safetensors", R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}})", Floats({0}));
  EXPECT_THAT(OpenError(), HasSubstr("tensor w: header entry needs data_offsets [begin, end] with begin <= end"));
}

TEST_F(SafetensorsTest, OverlappingTensorsAreRejected) {
  Write("model.safetensors",
        R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
        R"( "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
        Floats({0, 1, 2}));
  EXPECT_THAT(OpenError(), HasSubstr("tensor b: data_offsets [4, 12) overlap tensor a [0, 8)"));
}

TEST_F(SafetensorsTest, ByteLengthMustBeDtypeSizeTimesShape) {
  Write("model.safetensors", R"({"w": {"dtype": "F16", "shape": [3], "data_offsets": [0, 8]}})", Floats({0, 1}));
  EXPECT_THAT(OpenError(), HasSubstr("tensor w: data_offsets span 8 bytes, but F16 [3] needs 6"));
}

TEST_F(SafetensorsTest, ShardedCheckpointMapsEveryShard) {
  Write("a.safetensors", R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", Floats({3}));
  Write("b.safetensors", R"({"y": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", Floats({4}));
  std::ofstream(dir_ / "model.safetensors.index.json")
      << R"({"metadata": {}, "weight_map": {"x": "a.safetensors", "y": "b.safetensors"}})";
  absl::StatusOr<Checkpoint> checkpoint = Checkpoint::Open(dir_);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  ASSERT_NE(checkpoint->Find("y"), nullptr);
  EXPECT_EQ(checkpoint->Find("y")->file->name(), "b.safetensors");
  EXPECT_EQ(checkpoint->Find("z"), nullptr);
  float y = 0;
  std::memcpy(&y, checkpoint->Find("y")->data(), 4);
  EXPECT_EQ(y, 4.0f);
}

TEST_F(SafetensorsTest, IndexNamingTheWrongShardIsRejected) {
  Write("a.safetensors", R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", Floats({3}));
  Write("b.safetensors", R"({"y": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", Floats({4}));
  std::ofstream(dir_ / "model.safetensors.index.json")
      << R"({"weight_map": {"x": "b.safetensors", "y": "b.safetensors", "q": "a.safetensors"}})";
  absl::StatusOr<Checkpoint> checkpoint = Checkpoint::Open(dir_);
  ASSERT_FALSE(checkpoint.ok());
  EXPECT_THAT(checkpoint.status().message(), HasSubstr("tensor q is listed in model.safetensors.index.json under "
                                                       "a.safetensors, but that shard does not hold it"));
}

TEST_F(SafetensorsTest, MissingShardIsNamed) {
  std::ofstream(dir_ / "model.safetensors.index.json") << R"({"weight_map": {"x": "gone.safetensors"}})";
  absl::StatusOr<Checkpoint> checkpoint = Checkpoint::Open(dir_);
  ASSERT_FALSE(checkpoint.ok());
  EXPECT_THAT(checkpoint.status().message(), HasSubstr("shard gone.safetensors listed in"));
}

TEST_F(SafetensorsTest, DirectoryWithoutWeightsIsAnError) {
  absl::StatusOr<Checkpoint> checkpoint = Checkpoint::Open(dir_);
  ASSERT_FALSE(checkpoint.ok());
  EXPECT_THAT(checkpoint.status().message(), HasSubstr("no model.safetensors"));
}

TEST_F(SafetensorsTest, DeeplyNestedHeaderIsAnErrorNotAStackOverflow) {
  // Before: the error for a shape that is no list of integers printed the shape, and printing recurses once
  // per level: a header of a million "[" overflowed the stack. Found by tests/fuzz/fuzz_safetensors_header.
  const std::string deep = std::string(1000000, '[') + std::string(1000000, ']');
  Write("model.safetensors", R"({"t": {"dtype": "F32", "shape": )" + deep + R"(, "data_offsets": [0, 0]}})", "");
  EXPECT_THAT(OpenError(), HasSubstr("model.safetensors: the header: JSON nests deeper than 127 levels at byte "));
  // The same limit for the index.
  std::ofstream(dir_ / "model.safetensors.index.json") << R"({"weight_map": {"x": )" << deep << "}}";
  absl::StatusOr<Checkpoint> checkpoint = Checkpoint::Open(dir_);
  ASSERT_FALSE(checkpoint.ok());
  EXPECT_THAT(checkpoint.status().message(),
              HasSubstr("model.safetensors.index.json: JSON nests deeper than 127 levels"));
}

}  // namespace
}  // namespace strata::checkpoint
