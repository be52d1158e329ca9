// LoadModelSpec: config.json plus a check of the checkpoint's safetensors headers against the spec.
//
// Only headers are read (8-byte little-endian length, then that many bytes of JSON), never tensor data,
// so checking a 100 GB checkpoint costs a few reads. Safetensors format: huggingface/safetensors README.

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "planner/model_spec.h"

namespace strata::planner {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

constexpr char kSingleFile[] = "model.safetensors";
constexpr char kIndexFile[] = "model.safetensors.index.json";
// The safetensors library refuses headers above 100 MB; so do we, before allocating.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// Element sizes of the safetensors dtypes with whole-byte elements.
constexpr std::pair<absl::string_view, int64_t> kSafetensorsDTypes[] = {
    {"BOOL", 1}, {"U8", 1},   {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"F8_E8M0", 1}, {"I16", 2}, {"U16", 2},
    {"F16", 2},  {"BF16", 2}, {"I32", 4}, {"U32", 4},     {"F32", 4},     {"I64", 8},     {"U64", 8}, {"F64", 8},
};

struct HeaderTensor {
  std::vector<int64_t> shape;
  std::string dtype;
  std::string file;  // the file name within the checkpoint directory
};

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::Status CheckpointError(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("checkpoint: ", what));
}

absl::StatusOr<json> ReadJsonFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(path.string(), ": cannot open the file"));
  std::stringstream text;
  text << in.rdbuf();
  try {
    return json::parse(text.str());
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path.string(), ": invalid JSON: ", e.what()));
  }
}

std::optional<uint64_t> AsNonNegative(const json& v) {
  if (!v.is_number_integer()) return std::nullopt;
  if (!v.is_number_unsigned() && v.get<int64_t>() < 0) return std::nullopt;
  return v.get<uint64_t>();
}

// Reads one file's header into `tensors`, validating what the loader will rely on later: each entry's
// dtype, shape and data_offsets, and that the data lies inside the file with the size dtype × shape needs.
absl::Status ReadHeader(const fs::path& dir, const std::string& file, std::map<std::string, HeaderTensor>& tensors) {
  const fs::path path = dir / file;
  std::error_code ec;
  const uint64_t file_size = fs::file_size(path, ec);
  if (ec) return CheckpointError(absl::StrCat(file, ": cannot read the file (", ec.message(), ")"));
  if (file_size < 8) {
    return CheckpointError(absl::StrCat(file, ": ", file_size, " bytes is too short for a safetensors header"));
  }
  std::ifstream in(path, std::ios::binary);
  unsigned char length_bytes[8];
  if (!in || !in.read(reinterpret_cast<char*>(length_bytes), 8)) {
    return CheckpointError(absl::StrCat(file, ": cannot read the header length"));
  }
  uint64_t header_length = 0;
  for (int i = 7; i >= 0; --i) header_length = (header_length << 8) | length_bytes[i];  // little-endian
  if (header_length > file_size - 8 || header_length > kMaxHeaderBytes) {
    return CheckpointError(absl::StrCat(file, ": header length ", header_length, " exceeds the file size (", file_size,
                                        " bytes) or the 100 MB limit"));
  }
  std::string header(header_length, '\0');
  if (!in.read(header.data(), static_cast<std::streamsize>(header_length))) {
    return CheckpointError(absl::StrCat(file, ": cannot read the ", header_length, "-byte header"));
  }
  json parsed;
  try {
    parsed = json::parse(header);
  } catch (const json::exception& e) {
    return CheckpointError(absl::StrCat(file, ": the header is not valid JSON: ", e.what()));
  }
  if (!parsed.is_object()) return CheckpointError(absl::StrCat(file, ": the header is not a JSON object"));

  const uint64_t data_size = file_size - 8 - header_length;
  for (const auto& [name, entry] : parsed.items()) {
    if (name == "__metadata__") continue;
    const std::string where = absl::StrCat(file, ": tensor ", name);
    if (!entry.is_object()) return CheckpointError(absl::StrCat(where, ": header entry is not an object"));

    auto dtype_it = entry.find("dtype");
    if (dtype_it == entry.end() || !dtype_it->is_string()) {
      return CheckpointError(absl::StrCat(where, ": header entry has no dtype string"));
    }
    const std::string dtype = dtype_it->get<std::string>();
    int64_t element_size = 0;
    for (const auto& [known, size] : kSafetensorsDTypes) {
      if (known == dtype) element_size = size;
    }
    if (element_size == 0) return CheckpointError(absl::StrCat(where, ": unknown safetensors dtype \"", dtype, "\""));

    auto shape_it = entry.find("shape");
    if (shape_it == entry.end() || !shape_it->is_array()) {
      return CheckpointError(absl::StrCat(where, ": header entry has no shape array"));
    }
    HeaderTensor tensor{{}, dtype, file};
    for (const json& d : *shape_it) {
      std::optional<uint64_t> dim = AsNonNegative(d);
      if (!dim || *dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return CheckpointError(absl::StrCat(where, ": shape ", shape_it->dump(), " is not non-negative integers"));
      }
      tensor.shape.push_back(static_cast<int64_t>(*dim));
    }
    // The bytes dtype x shape needs; `too_large` when that overflows 64 bits (no file can hold it then).
    uint64_t bytes = static_cast<uint64_t>(element_size);
    bool too_large = false;
    if (std::find(tensor.shape.begin(), tensor.shape.end(), 0) != tensor.shape.end()) {
      bytes = 0;
    } else {
      for (int64_t dim : tensor.shape) too_large = too_large || __builtin_mul_overflow(bytes, dim, &bytes);
    }

    auto offsets_it = entry.find("data_offsets");
    std::optional<uint64_t> begin, end;
    if (offsets_it != entry.end() && offsets_it->is_array() && offsets_it->size() == 2) {
      begin = AsNonNegative((*offsets_it)[0]);
      end = AsNonNegative((*offsets_it)[1]);
    }
    if (!begin || !end || *begin > *end) {
      return CheckpointError(absl::StrCat(where, ": header entry needs data_offsets [begin, end] with begin <= end"));
    }
    if (*end > data_size) {
      return CheckpointError(absl::StrCat(where, ": data_offsets end ", *end, " is past the ", data_size,
                                          " data bytes in the file (truncated file?)"));
    }
    if (too_large || *end - *begin != bytes) {
      return CheckpointError(absl::StrCat(where, ": data_offsets span ", *end - *begin, " bytes, but ", dtype, " ",
                                          ShapeString(tensor.shape), " needs ",
                                          too_large ? std::string("more than 2^64") : absl::StrCat(bytes)));
    }

    auto [it, inserted] = tensors.emplace(name, std::move(tensor));
    if (!inserted) {
      return CheckpointError(absl::StrCat("tensor ", name, " appears in both ", it->second.file, " and ", file));
    }
  }
  return absl::OkStatus();
}

// The files to read, and for a sharded checkpoint the index's tensor -> shard map.
struct CheckpointFiles {
  std::vector<std::string> files;
  std::map<std::string, std::string> weight_map;  // empty for a single file
};

absl::StatusOr<std::optional<CheckpointFiles>> FindCheckpointFiles(const fs::path& dir) {
  CheckpointFiles found;
  std::error_code ec;
  if (fs::exists(dir / kIndexFile, ec)) {
    absl::StatusOr<json> index = ReadJsonFile(dir / kIndexFile);
    if (!index.ok()) return CheckpointError(index.status().message());
    auto map_it = index->is_object() ? index->find("weight_map") : index->end();
    if (!index->is_object() || map_it == index->end() || !map_it->is_object()) {
      return CheckpointError(absl::StrCat(kIndexFile, ": expected an object with a \"weight_map\" object"));
    }
    std::set<std::string> seen;
    for (const auto& [tensor, shard] : map_it->items()) {
      if (!shard.is_string()) {
        return CheckpointError(absl::StrCat(kIndexFile, ": weight_map[\"", tensor, "\"] is not a file name"));
      }
      const std::string file = shard.get<std::string>();
      // Shards are plain names in the directory; anything else would read outside the checkpoint.
      if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..") {
        return CheckpointError(absl::StrCat(kIndexFile, ": weight_map[\"", tensor, "\"] = \"", file,
                                            "\" is not a file name in the checkpoint directory"));
      }
      found.weight_map[tensor] = file;
      if (seen.insert(file).second) found.files.push_back(file);
    }
    for (const std::string& file : found.files) {
      if (!fs::is_regular_file(dir / file, ec)) {
        return CheckpointError(absl::StrCat("shard ", file, " listed in ", kIndexFile, " is missing"));
      }
    }
    return std::optional<CheckpointFiles>(std::move(found));
  }
  if (fs::is_regular_file(dir / kSingleFile, ec)) {
    found.files.push_back(std::string(kSingleFile));
    return std::optional<CheckpointFiles>(std::move(found));
  }
  // No weights: planning from config.json alone is allowed (e.g. before downloading the shards).
  return std::optional<CheckpointFiles>();
}

absl::Status CheckTensors(const ModelSpec& spec, const CheckpointFiles& files,
                          const std::map<std::string, HeaderTensor>& found) {
  const std::string source =
      files.weight_map.empty() ? std::string(kSingleFile) : absl::StrCat("the shards of ", kIndexFile);

  // The index must tell the truth about where each tensor is: the loader opens only the shard it names.
  for (const auto& [name, shard] : files.weight_map) {
    auto it = found.find(name);
    if (it == found.end() || it->second.file != shard) {
      return CheckpointError(absl::StrCat("tensor ", name, " is listed in ", kIndexFile, " under ", shard,
                                          ", but that shard does not hold it"));
    }
  }

  const std::map<std::string, ExpectedTensor> expected = CheckpointTensors(spec);
  // Tied keys share their target's storage; a checkpoint may still carry a copy (older exports do), which
  // is accepted when its shape matches.
  std::map<std::string, std::vector<int64_t>> tied_shapes;
  if (!spec.tied_weights.empty()) {
    std::map<std::string, std::vector<int64_t>> all_parameters;
    auto collect = [&](const auto& self, const ModuleSpec& module) -> void {
      for (const TensorSpec& p : module.parameters) all_parameters[module.ChildName(p.name)] = p.shape;
      for (const ModuleSpec& child : module.children) self(self, child);
    };
    collect(collect, spec.root);
    for (const auto& [tied, target] : spec.tied_weights) {
      if (auto it = all_parameters.find(tied); it != all_parameters.end()) tied_shapes[tied] = it->second;
    }
  }

  std::vector<std::string> unexpected;
  for (const auto& [name, tensor] : found) {
    const std::vector<int64_t>* want = nullptr;
    if (auto it = expected.find(name); it != expected.end()) {
      want = &it->second.shape;
    } else if (auto tied = tied_shapes.find(name); tied != tied_shapes.end()) {
      want = &tied->second;
    } else {
      unexpected.push_back(name);
      continue;
    }
    if (tensor.shape != *want) {
      return CheckpointError(absl::StrCat("tensor ", name, " has shape ", ShapeString(tensor.shape), " in ",
                                          tensor.file, ", expected ", ShapeString(*want)));
    }
  }
  if (!unexpected.empty()) {
    const HeaderTensor& first = found.at(unexpected.front());
    std::string more = unexpected.size() > 1 ? absl::StrCat(" (and ", unexpected.size() - 1, " more)") : "";
    return CheckpointError(absl::StrCat("unexpected tensor ", unexpected.front(), " in ", first.file,
                                        ": the model has no such parameter or persistent buffer", more));
  }

  std::vector<std::string> missing;
  for (const auto& [name, tensor] : expected) {
    if (!found.contains(name)) missing.push_back(name);
  }
  if (!missing.empty()) {
    const ExpectedTensor& first = expected.at(missing.front());
    std::string more = missing.size() > 1 ? absl::StrCat(" (and ", missing.size() - 1, " more)") : "";
    return CheckpointError(
        absl::StrCat("tensor ", missing.front(), " ", ShapeString(first.shape), " is missing from ", source, more));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelSpec> LoadModelSpec(const std::filesystem::path& checkpoint_dir, std::optional<DType> dtype) {
  std::error_code ec;
  if (!fs::is_directory(checkpoint_dir, ec)) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint ", checkpoint_dir.string(), ": not a directory"));
  }
  const fs::path config_path = checkpoint_dir / "config.json";
  if (!fs::exists(config_path, ec)) {
    return absl::InvalidArgumentError(absl::StrCat(config_path.string(), ": not found"));
  }
  absl::StatusOr<json> config = ReadJsonFile(config_path);
  if (!config.ok()) return config.status();

  // Config errors say "config.json: ..."; name the file the user passed instead.
  auto in_config_file = [&](const absl::Status& status) {
    absl::string_view message = status.message();
    constexpr absl::string_view kPrefix = "config.json: ";
    if (message.substr(0, kPrefix.size()) == kPrefix) message.remove_prefix(kPrefix.size());
    return absl::Status(status.code(), absl::StrCat(config_path.string(), ": ", message));
  };
  if (!dtype) {
    absl::StatusOr<DType> declared = ConfigDType(*config);
    if (!declared.ok()) return in_config_file(declared.status());
    dtype = *declared;
  }
  absl::StatusOr<ModelSpec> spec = ModelSpecFromConfig(*config, *dtype);
  if (!spec.ok()) return in_config_file(spec.status());

  absl::StatusOr<std::optional<CheckpointFiles>> files = FindCheckpointFiles(checkpoint_dir);
  if (!files.ok()) return files.status();
  if (!files->has_value()) return spec;

  std::map<std::string, HeaderTensor> found;
  for (const std::string& file : (*files)->files) {
    if (absl::Status s = ReadHeader(checkpoint_dir, file, found); !s.ok()) return s;
  }
  if (absl::Status s = CheckTensors(*spec, **files, found); !s.ok()) return s;
  return spec;
}

}  // namespace strata::planner
