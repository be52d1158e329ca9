#pragma once
// Element types as torch names them, shared by the checkpoint reader, the planner and the runtime.

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

namespace strata::checkpoint {

// kFloat8E4M3 is torch's float8_e4m3fn (safetensors F8_E4M3): FP8 checkpoints' weights (planner/quantization.h).
enum class DType { kFloat32, kFloat16, kBFloat16, kFloat64, kInt64, kInt32, kInt8, kUInt8, kBool, kFloat8E4M3 };

absl::StatusOr<DType> ParseDType(std::string_view name);  // "float16", "bfloat16", "float32", ...
std::string_view DTypeName(DType dtype);                  // torch's name: "bfloat16"
int64_t DTypeSize(DType dtype);                           // bytes per element

}  // namespace strata::checkpoint
