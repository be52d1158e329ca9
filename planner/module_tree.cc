// The module tree JSON format ("strata.module_tree.v1", see planner/README.md): how models that
// ModelSpecFromConfig does not know are described, and what `strata-plan --print-module-tree` prints.

#include <algorithm>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/file_reader.h"
#include "base/json.h"
#include "nlohmann/json.hpp"
#include "planner/model_spec.h"

namespace strata::planner {
namespace {

using json = nlohmann::json;

constexpr absl::string_view kFormat = "strata.module_tree.v1";
// Real models nest a handful of levels; the cap keeps a hostile file from exhausting the stack.
constexpr int kMaxDepth = 64;

// `path` is empty for the top-level object.
absl::Status PathError(absl::string_view path, absl::string_view what) {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat("module tree: ", what));
  return absl::InvalidArgumentError(absl::StrCat("module tree: ", path, ": ", what));
}

std::string Member(absl::string_view path, absl::string_view key) {
  return path.empty() ? std::string(key) : absl::StrCat(path, ".", key);
}

bool IsFloatingPoint(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat16 || dtype == DType::kBFloat16 || dtype == DType::kFloat64;
}

absl::StatusOr<std::string> StringAt(const json& object, absl::string_view key, absl::string_view path) {
  auto it = object.find(key);
  if (it == object.end()) return PathError(path, absl::StrCat("missing \"", key, "\""));
  if (!it->is_string()) return PathError(Member(path, key), "expected a string");
  return it->get<std::string>();
}

// An optional array member: absent or null reads as empty.
absl::StatusOr<const json*> ArrayAt(const json& object, absl::string_view key, absl::string_view path) {
  static const json kEmpty = json::array();
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return &kEmpty;
  if (!it->is_array()) return PathError(Member(path, key), "expected an array");
  return &*it;
}

absl::StatusOr<DType> DTypeAt(const json& object, absl::string_view path) {
  absl::StatusOr<std::string> name = StringAt(object, "dtype", path);
  if (!name.ok()) return name.status();
  absl::StatusOr<DType> dtype = ParseDType(*name);
  if (!dtype.ok()) return PathError(Member(path, "dtype"), dtype.status().message());
  return *dtype;
}

absl::StatusOr<int64_t> NonNegativeIntAt(const json& object, absl::string_view key, absl::string_view path) {
  auto it = object.find(key);
  if (it == object.end()) return PathError(path, absl::StrCat("missing \"", key, "\""));
  if (!it->is_number_integer() ||
      (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) ||
      (!it->is_number_unsigned() && it->get<int64_t>() < 0)) {
    return PathError(Member(path, key), "expected a non-negative integer");
  }
  return it->get<int64_t>();
}

absl::StatusOr<TensorSpec> ParseTensor(const json& entry, const std::string& path, bool is_buffer) {
  if (!entry.is_object()) return PathError(path, "expected an object");
  TensorSpec tensor;
  absl::StatusOr<std::string> name = StringAt(entry, "name", path);
  if (!name.ok()) return name.status();
  if (name->empty() || name->find('.') != std::string::npos) {
    return PathError(absl::StrCat(path, ".name"), "expected a non-empty local name without dots");
  }
  tensor.name = *name;

  auto shape = entry.find("shape");
  if (shape == entry.end()) return PathError(path, "missing \"shape\"");
  const std::string shape_path = absl::StrCat(path, ".shape");
  if (!shape->is_array()) return PathError(shape_path, "expected an array of non-negative integers");
  // Dimensions are capped so that sizes (numel times a dtype size) cannot overflow int64.
  constexpr uint64_t kMaxBytes = static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / 8;
  uint64_t numel = 1;
  for (const json& d : *shape) {
    if (!d.is_number_integer() || (!d.is_number_unsigned() && d.get<int64_t>() < 0)) {
      return PathError(shape_path, "expected an array of non-negative integers");
    }
    const uint64_t dim = d.get<uint64_t>();
    if (dim != 0 && numel > kMaxBytes / dim) return PathError(shape_path, "tensor is too large");
    numel *= dim;
    tensor.shape.push_back(static_cast<int64_t>(dim));
  }

  absl::StatusOr<DType> dtype = DTypeAt(entry, path);
  if (!dtype.ok()) return dtype.status();
  tensor.dtype = *dtype;

  if (auto it = entry.find("persistent"); it != entry.end()) {
    if (!is_buffer) return PathError(absl::StrCat(path, ".persistent"), "only buffers have a persistent flag");
    if (!it->is_boolean()) return PathError(absl::StrCat(path, ".persistent"), "expected true or false");
    tensor.persistent = it->get<bool>();
  }
  return tensor;
}

absl::Status ParseModule(const json& node, const std::string& path, int depth, ModuleSpec& module) {
  if (depth > kMaxDepth) return PathError(path, absl::StrCat("modules nest deeper than ", kMaxDepth, " levels"));
  if (!node.is_object()) return PathError(path, "expected an object");
  absl::StatusOr<std::string> class_name = StringAt(node, "class", path);
  if (!class_name.ok()) return class_name.status();
  if (class_name->empty()) return PathError(absl::StrCat(path, ".class"), "expected a non-empty string");
  module.class_name = *class_name;

  // nn.Module refuses a parameter, buffer or child named like another member; so does the tree.
  std::set<std::string> local_names;
  auto claim = [&](const std::string& name, const std::string& item_path) -> absl::Status {
    if (!local_names.insert(name).second) {
      return PathError(absl::StrCat(item_path, ".name"), absl::StrCat("\"", name, "\" is already a member of ",
                                                                      module.name.empty() ? "the root" : module.name));
    }
    return absl::OkStatus();
  };

  for (const auto& [key, is_buffer] : {std::pair<absl::string_view, bool>{"parameters", false}, {"buffers", true}}) {
    absl::StatusOr<const json*> entries = ArrayAt(node, key, path);
    if (!entries.ok()) return entries.status();
    for (size_t i = 0; i < (*entries)->size(); ++i) {
      const std::string item_path = absl::StrCat(path, ".", key, "[", i, "]");
      absl::StatusOr<TensorSpec> tensor = ParseTensor((**entries)[i], item_path, is_buffer);
      if (!tensor.ok()) return tensor.status();
      if (absl::Status s = claim(tensor->name, item_path); !s.ok()) return s;
      (is_buffer ? module.buffers : module.parameters).push_back(*std::move(tensor));
    }
  }

  absl::StatusOr<const json*> children = ArrayAt(node, "children", path);
  if (!children.ok()) return children.status();
  for (size_t i = 0; i < (*children)->size(); ++i) {
    const json& child_node = (**children)[i];
    const std::string child_path = absl::StrCat(path, ".children[", i, "]");
    if (!child_node.is_object()) return PathError(child_path, "expected an object");
    absl::StatusOr<std::string> local = StringAt(child_node, "name", child_path);
    if (!local.ok()) return local.status();
    if (local->empty() || local->find('.') != std::string::npos) {
      return PathError(absl::StrCat(child_path, ".name"), "expected a non-empty local name without dots");
    }
    if (absl::Status s = claim(*local, child_path); !s.ok()) return s;
    ModuleSpec child;
    child.name = module.ChildName(*local);
    if (absl::Status s = ParseModule(child_node, child_path, depth + 1, child); !s.ok()) return s;
    module.children.push_back(std::move(child));
  }
  return absl::OkStatus();
}

void Retype(ModuleSpec& module, DType dtype) {
  // As from_config(dtype=...) does: floating-point parameters take the serving dtype; buffers (rotary
  // tables) and integer parameters keep theirs.
  for (TensorSpec& p : module.parameters) {
    if (IsFloatingPoint(p.dtype)) p.dtype = dtype;
  }
  for (ModuleSpec& child : module.children) Retype(child, dtype);
}

std::optional<DType> FirstFloatingParameterDType(const ModuleSpec& module) {
  for (const TensorSpec& p : module.parameters) {
    if (IsFloatingPoint(p.dtype)) return p.dtype;
  }
  for (const ModuleSpec& child : module.children) {
    if (std::optional<DType> d = FirstFloatingParameterDType(child)) return d;
  }
  return std::nullopt;
}

void CollectParameterNames(const ModuleSpec& module, std::set<std::string>& out) {
  for (const TensorSpec& p : module.parameters) out.insert(module.ChildName(p.name));
  for (const ModuleSpec& child : module.children) CollectParameterNames(child, out);
}

json TensorToJson(const TensorSpec& tensor, bool is_buffer) {
  json out = {{"name", tensor.name}, {"shape", tensor.shape}, {"dtype", std::string(DTypeName(tensor.dtype))}};
  if (is_buffer) out["persistent"] = tensor.persistent;
  return out;
}

json ModuleToJson(const ModuleSpec& module, std::optional<absl::string_view> local_name) {
  json out = json::object();
  if (local_name) out["name"] = std::string(*local_name);
  out["class"] = module.class_name;
  out["parameters"] = json::array();
  for (const TensorSpec& p : module.parameters) out["parameters"].push_back(TensorToJson(p, false));
  out["buffers"] = json::array();
  for (const TensorSpec& b : module.buffers) out["buffers"].push_back(TensorToJson(b, true));
  out["children"] = json::array();
  for (const ModuleSpec& child : module.children) {
    // The local name is the last component of the full dotted name.
    const size_t dot = child.name.rfind('.');
    const absl::string_view local =
        dot == std::string::npos ? absl::string_view(child.name) : absl::string_view(child.name).substr(dot + 1);
    out["children"].push_back(ModuleToJson(child, local));
  }
  return out;
}

}  // namespace

absl::StatusOr<ModelSpec> ModelSpecFromModuleTree(const nlohmann::json& tree, std::optional<DType> dtype) {
  if (!tree.is_object()) return absl::InvalidArgumentError("module tree: expected a JSON object");
  absl::StatusOr<std::string> format = StringAt(tree, "format", "");
  if (!format.ok()) return format.status();
  if (*format != kFormat) {
    return PathError("format", absl::StrCat("expected \"", kFormat, "\", got \"", *format, "\""));
  }

  ModelSpec spec;
  auto root = tree.find("root");
  if (root == tree.end()) return PathError("", "missing \"root\"");
  if (absl::Status s = ParseModule(*root, "root", 0, spec.root); !s.ok()) return s;
  if (auto name = root->find("name"); name != root->end() && !(name->is_string() && name->get<std::string>().empty())) {
    return PathError("root.name", "the root module's name must be \"\" or absent");
  }

  spec.architecture = spec.root.class_name;
  if (auto it = tree.find("architecture"); it != tree.end() && !it->is_null()) {
    if (!it->is_string() || it->get<std::string>().empty())
      return PathError("architecture", "expected a non-empty string");
    spec.architecture = it->get<std::string>();
  }

  // The dtype the file was exported in; when absent, the parameters say it.
  std::optional<DType> file_dtype;
  if (auto it = tree.find("dtype"); it != tree.end() && !it->is_null()) {
    absl::StatusOr<DType> d = DTypeAt(tree, "");
    if (!d.ok()) return d.status();
    file_dtype = *d;
  }
  if (dtype) {
    Retype(spec.root, *dtype);
    spec.dtype = *dtype;
  } else {
    spec.dtype = file_dtype.value_or(FirstFloatingParameterDType(spec.root).value_or(DType::kFloat32));
  }

  absl::StatusOr<const json*> no_split = ArrayAt(tree, "no_split_modules", "");
  if (!no_split.ok()) return no_split.status();
  for (size_t i = 0; i < (*no_split)->size(); ++i) {
    const json& cls = (**no_split)[i];
    if (!cls.is_string()) return PathError(absl::StrCat("no_split_modules[", i, "]"), "expected a class name string");
    spec.no_split_classes.push_back(cls.get<std::string>());
  }
  std::sort(spec.no_split_classes.begin(), spec.no_split_classes.end());
  spec.no_split_classes.erase(std::unique(spec.no_split_classes.begin(), spec.no_split_classes.end()),
                              spec.no_split_classes.end());

  if (auto it = tree.find("tied_weights"); it != tree.end() && !it->is_null()) {
    if (!it->is_object()) return PathError("tied_weights", "expected an object of parameter name -> parameter name");
    std::set<std::string> parameters;
    CollectParameterNames(spec.root, parameters);
    for (const auto& [tied, target] : it->items()) {
      const std::string path = absl::StrCat("tied_weights[\"", tied, "\"]");
      if (!target.is_string()) return PathError(path, "expected a parameter name string");
      for (const std::string& name : {tied, target.get<std::string>()}) {
        if (!parameters.contains(name))
          return PathError(path, absl::StrCat("no parameter named ", name, " in the tree"));
      }
      spec.tied_weights[tied] = target.get<std::string>();
    }
  }

  if (auto it = tree.find("kv_cache"); it != tree.end() && !it->is_null()) {
    if (!it->is_object()) return PathError("kv_cache", "expected an object");
    struct KvField {
      const char* key;
      int64_t* field;
      int64_t max;  // the same caps as config.json's fields (model_spec.h)
    };
    for (auto [key, field, max] : {KvField{"num_hidden_layers", &spec.num_hidden_layers, kMaxHiddenLayers},
                                   KvField{"num_key_value_heads", &spec.num_key_value_heads, kMaxAttentionHeads},
                                   KvField{"head_dim", &spec.head_dim, kMaxHeadDim}}) {
      absl::StatusOr<int64_t> v = NonNegativeIntAt(*it, key, "kv_cache");
      if (!v.ok()) return v.status();
      if (*v > max) return PathError(Member("kv_cache", key), absl::StrCat("must be at most ", max));
      *field = *v;
    }
    if (auto latent = it->find("latent"); latent != it->end()) {
      if (!latent->is_boolean()) return PathError(Member("kv_cache", "latent"), "expected true or false");
      spec.kv_latent = latent->get<bool>();
    }
  }
  if (absl::StatusOr<int64_t> total = SpecBytes(spec); !total.ok()) return PathError("", total.status().message());
  return spec;
}

nlohmann::json ModuleTreeToJson(const ModelSpec& spec) {
  json out = json::object();
  out["format"] = std::string(kFormat);
  out["architecture"] = spec.architecture;
  out["dtype"] = std::string(DTypeName(spec.dtype));
  std::vector<std::string> no_split = spec.no_split_classes;
  std::sort(no_split.begin(), no_split.end());
  out["no_split_modules"] = no_split;
  out["tied_weights"] = json::object();
  for (const auto& [tied, target] : spec.tied_weights) out["tied_weights"][tied] = target;
  if (spec.num_hidden_layers > 0 || spec.num_key_value_heads > 0 || spec.head_dim > 0) {
    out["kv_cache"] = {{"num_hidden_layers", spec.num_hidden_layers},
                       {"num_key_value_heads", spec.num_key_value_heads},
                       {"head_dim", spec.head_dim}};
    if (spec.kv_latent) out["kv_cache"]["latent"] = true;
  }
  out["root"] = ModuleToJson(spec.root, std::nullopt);
  return out;
}

absl::StatusOr<ModelSpec> LoadModuleTree(const std::filesystem::path& file, std::optional<DType> dtype) {
  absl::StatusOr<std::string> text = base::ReadRegularFile(file, base::kMaxModuleTreeFileBytes);
  if (!text.ok()) return absl::InvalidArgumentError(absl::StrCat("module tree ", text.status().message()));
  // Modules nest kMaxDepth levels, each an object in a "children" array; a tensor's shape adds three more.
  absl::StatusOr<json> tree = base::ParseJson(*text, 2 * kMaxDepth + 5, absl::StrCat("module tree ", file.string()));
  if (!tree.ok()) return tree.status();
  absl::StatusOr<ModelSpec> spec = ModelSpecFromModuleTree(*tree, dtype);
  if (!spec.ok()) return absl::InvalidArgumentError(absl::StrCat(file.string(), ": ", spec.status().message()));
  return spec;
}

}  // namespace strata::planner
