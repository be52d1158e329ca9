#include "planner/model_spec.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "planner/quantized_spec.h"

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

absl::StatusOr<std::vector<int32_t>> EosTokenIdsFromJson(const nlohmann::json& value, absl::string_view file) {
  std::vector<int32_t> ids;
  auto add = [&](const nlohmann::json& id) -> absl::Status {
    // The value is quoted: callers bound the JSON's depth first (base/json.h).
    if (!id.is_number_integer() || (id.is_number_unsigned() && id.get<uint64_t>() > INT32_MAX) ||
        (!id.is_number_unsigned() && (id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX))) {
      return absl::InvalidArgumentError(absl::StrCat(
          file, ": eos_token_id must be a non-negative 32-bit integer, a list of them or null, got ", id.dump()));
    }
    ids.push_back(id.get<int32_t>());
    return absl::OkStatus();
  };
  if (value.is_null()) return ids;
  if (value.is_array()) {
    for (const nlohmann::json& id : value) {
      if (absl::Status s = add(id); !s.ok()) return s;
    }
  } else if (absl::Status s = add(value); !s.ok()) {
    return s;
  }
  return ids;
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
    if (e.fused_interleaved) continue;  // stored as the tree has them
    // The fused parameters (and a quantized tree's scales beside them) are stored one tensor per expert.
    const std::string own = e.module + ".";
    for (auto it = out.lower_bound(own); it != out.end() && it->first.starts_with(own);) {
      it = it->first.find('.', own.size()) == std::string::npos ? out.erase(it) : std::next(it);
    }
    for (int64_t i = 0; i < e.num_experts; ++i) {
      const std::string p = absl::StrCat(e.stored_prefix, ".", i, ".");
      out[p + e.gate] = {{e.intermediate, e.hidden}, e.dtype};
      out[p + e.up] = {{e.intermediate, e.hidden}, e.dtype};
      out[p + e.down] = {{e.hidden, e.intermediate}, e.dtype};
    }
  }
  AddQuantizedCheckpointTensors(spec, out);
  return out;
}

std::vector<const ModuleSpec*> NoSplitModules(const ModelSpec& spec) {
  std::vector<const ModuleSpec*> layers;
  std::vector<const ModuleSpec*> stack = {&spec.root};
  while (!stack.empty()) {
    const ModuleSpec* m = stack.back();
    stack.pop_back();
    if (std::find(spec.no_split_classes.begin(), spec.no_split_classes.end(), m->class_name) !=
        spec.no_split_classes.end()) {
      layers.push_back(m);
      continue;
    }
    for (auto c = m->children.rbegin(); c != m->children.rend(); ++c) stack.push_back(&*c);
  }
  return layers;
}

}  // namespace strata::planner
