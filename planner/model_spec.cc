#include "planner/model_spec.h"

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace strata::planner {
namespace {

void CollectCheckpointTensors(const ModuleSpec& module, std::map<std::string, ExpectedTensor>& out) {
  for (const TensorSpec& p : module.parameters) out[module.ChildName(p.name)] = {p.shape, p.dtype};
  for (const TensorSpec& b : module.buffers) {
    if (b.persistent) out[module.ChildName(b.name)] = {b.shape, b.dtype};
  }
  for (const ModuleSpec& child : module.children) CollectCheckpointTensors(child, out);
}

}  // namespace

int64_t TensorSpec::numel() const {
  int64_t n = 1;  // a 0-d tensor (shape []) holds one element
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<int64_t> CheckedMul(int64_t a, int64_t b, absl::string_view what) {
  int64_t product = 0;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &product)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", a, " x ", b, " does not fit in 64 bits"));
  }
  return product;
}

absl::StatusOr<int64_t> TensorSpec::CheckedBytes() const {
  int64_t n = DTypeSize(dtype);
  for (int64_t d : shape) {
    absl::StatusOr<int64_t> next = CheckedMul(n, d, absl::StrCat("tensor ", name, " bytes"));
    if (!next.ok()) return next.status();
    n = *next;
  }
  return n;
}

absl::StatusOr<int64_t> SpecBytes(const ModelSpec& spec) {
  int64_t total = 0;
  std::vector<const ModuleSpec*> stack = {&spec.root};
  while (!stack.empty()) {
    const ModuleSpec* m = stack.back();
    stack.pop_back();
    for (const std::vector<TensorSpec>* tensors : {&m->parameters, &m->buffers}) {
      for (const TensorSpec& t : *tensors) {
        absl::StatusOr<int64_t> bytes = t.CheckedBytes();
        if (!bytes.ok()) return bytes.status();
        if (__builtin_add_overflow(total, *bytes, &total)) {
          return absl::InvalidArgumentError("the model's total size in bytes does not fit in 64 bits");
        }
      }
    }
    for (const ModuleSpec& c : m->children) stack.push_back(&c);
  }
  return total;
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
  for (const auto& [name, stored] : spec.stored_names) {
    auto it = out.find(name);
    if (it == out.end()) continue;
    ExpectedTensor t = it->second;
    out.erase(it);
    out[stored] = t;
  }
  for (const ExpertsStorage& e : spec.per_expert_storage) {
    out.erase(e.module + ".gate_up_proj");
    out.erase(e.module + ".down_proj");
    for (int64_t i = 0; i < e.num_experts; ++i) {
      const std::string p = absl::StrCat(e.stored_prefix, ".", i, ".");
      out[p + e.gate] = {{e.intermediate, e.hidden}, e.dtype};
      out[p + e.up] = {{e.intermediate, e.hidden}, e.dtype};
      out[p + e.down] = {{e.hidden, e.intermediate}, e.dtype};
    }
  }
  return out;
}

}  // namespace strata::planner
