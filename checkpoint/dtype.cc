#include "checkpoint/dtype.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace strata::checkpoint {
namespace {

struct DTypeInfo {
  DType dtype;
  std::string_view name;  // torch's name, what DTypeName returns
  int64_t size;
};

constexpr DTypeInfo kDTypes[] = {
    {DType::kFloat32, "float32", 4},   {DType::kFloat16, "float16", 2},
    {DType::kBFloat16, "bfloat16", 2}, {DType::kFloat64, "float64", 8},
    {DType::kInt64, "int64", 8},       {DType::kInt32, "int32", 4},
    {DType::kInt8, "int8", 1},         {DType::kUInt8, "uint8", 1},
    {DType::kBool, "bool", 1},         {DType::kFloat8E4M3, "float8_e4m3fn", 1},
};

// torch's aliases for the same dtypes (torch.half is torch.float16, ...) and the short forms people type.
constexpr std::pair<std::string_view, DType> kDTypeAliases[] = {
    {"float", DType::kFloat32}, {"fp32", DType::kFloat32},  {"half", DType::kFloat16},
    {"fp16", DType::kFloat16},  {"bf16", DType::kBFloat16}, {"double", DType::kFloat64},
    {"fp64", DType::kFloat64},  {"long", DType::kInt64},    {"int", DType::kInt32},
};

}  // namespace

absl::StatusOr<DType> ParseDType(std::string_view name) {
  std::string_view bare = name;
  // config.json files written by old transformers versions sometimes hold "torch.bfloat16".
  if (bare.substr(0, 6) == "torch.") bare.remove_prefix(6);
  for (const DTypeInfo& info : kDTypes) {
    if (info.name == bare) return info.dtype;
  }
  for (const auto& [alias, dtype] : kDTypeAliases) {
    if (alias == bare) return dtype;
  }
  std::vector<std::string> known;
  for (const DTypeInfo& info : kDTypes) known.emplace_back(info.name);
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype \"", std::string(name), "\" (expected one of ", absl::StrJoin(known, ", "), ")"));
}

std::string_view DTypeName(DType dtype) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.dtype == dtype) return info.name;
  }
  return "unknown";
}

int64_t DTypeSize(DType dtype) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.dtype == dtype) return info.size;
  }
  return 0;
}

}  // namespace strata::checkpoint
