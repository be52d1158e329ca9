#include "planner/model_spec.h"

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace strata::planner {
namespace {

struct DTypeInfo {
  DType dtype;
  std::string_view name;  // torch's name, what DTypeName returns
  int64_t size;
};

constexpr DTypeInfo kDTypes[] = {
    {DType::kFloat32, "float32", 4}, {DType::kFloat16, "float16", 2}, {DType::kBFloat16, "bfloat16", 2},
    {DType::kFloat64, "float64", 8}, {DType::kInt64, "int64", 8},     {DType::kInt32, "int32", 4},
    {DType::kInt8, "int8", 1},       {DType::kUInt8, "uint8", 1},     {DType::kBool, "bool", 1},
};

// torch's aliases for the same dtypes (torch.half is torch.float16, ...) and the short forms people type.
constexpr std::pair<std::string_view, DType> kDTypeAliases[] = {
    {"float", DType::kFloat32}, {"fp32", DType::kFloat32},  {"half", DType::kFloat16},
    {"fp16", DType::kFloat16},  {"bf16", DType::kBFloat16}, {"double", DType::kFloat64},
    {"fp64", DType::kFloat64},  {"long", DType::kInt64},    {"int", DType::kInt32},
};

void CollectCheckpointTensors(const ModuleSpec& module, std::map<std::string, ExpectedTensor>& out) {
  for (const TensorSpec& p : module.parameters) out[module.ChildName(p.name)] = {p.shape, p.dtype};
  for (const TensorSpec& b : module.buffers) {
    if (b.persistent) out[module.ChildName(b.name)] = {b.shape, b.dtype};
  }
  for (const ModuleSpec& child : module.children) CollectCheckpointTensors(child, out);
}

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

int64_t TensorSpec::numel() const {
  int64_t n = 1;  // a 0-d tensor (shape []) holds one element
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ModuleSpec::ChildName(std::string_view local) const {
  if (name.empty()) return std::string(local);
  std::string full = name;
  full += '.';
  full += local;
  return full;
}

absl::StatusOr<DType> ConfigDType(const nlohmann::json& config) {
  if (!config.is_object()) return absl::InvalidArgumentError("config.json: expected a JSON object");
  // transformers 5 writes "dtype"; older versions wrote "torch_dtype". A null value means "not set".
  for (const char* key : {"dtype", "torch_dtype"}) {
    auto it = config.find(key);
    if (it == config.end() || it->is_null()) continue;
    if (!it->is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat("config.json: ", key, " must be a dtype name such as \"bfloat16\""));
    }
    absl::StatusOr<DType> dtype = ParseDType(it->get<std::string>());
    if (!dtype.ok())
      return absl::InvalidArgumentError(absl::StrCat("config.json: ", key, ": ", dtype.status().message()));
    return *dtype;
  }
  return DType::kFloat32;
}

std::map<std::string, ExpectedTensor> CheckpointTensors(const ModelSpec& spec) {
  std::map<std::string, ExpectedTensor> out;
  CollectCheckpointTensors(spec.root, out);
  // A tied parameter shares storage with its target; save_pretrained writes only the target.
  for (const auto& [tied, target] : spec.tied_weights) out.erase(tied);
  return out;
}

}  // namespace strata::planner
