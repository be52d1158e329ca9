// LoadModelSpec: config.json plus a check of the checkpoint's safetensors headers against the spec.
//
// Only headers are read (checkpoint/safetensors_header.h), never tensor data, so checking a 100 GB checkpoint
// costs a few reads.

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "base/file_reader.h"
#include "base/json.h"
#include "checkpoint/safetensors_header.h"
#include "nlohmann/json.hpp"
#include "planner/generation_config.h"
#include "planner/model_spec.h"
#include "planner/quantized_spec.h"

namespace strata::planner {

using checkpoint::CheckpointFiles;
using checkpoint::FindCheckpointFiles;
using checkpoint::kSafetensorsIndexFile;
using checkpoint::kSafetensorsSingleFile;
using checkpoint::ReadSafetensorsHeader;
using checkpoint::SafetensorsEntry;
using checkpoint::SafetensorsHeader;
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

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
  absl::StatusOr<std::string> text = base::ReadRegularFile(path, base::kMaxConfigFileBytes);
  if (!text.ok()) return text.status();
  return base::ParseJson(*text, base::kMaxJsonDepth, path.string());
}

// Reads one file's header (validated by ParseSafetensorsHeader) into `tensors`.
absl::Status ReadHeader(const fs::path& dir, const std::string& file, std::map<std::string, HeaderTensor>& tensors) {
  absl::StatusOr<SafetensorsHeader> header = ReadSafetensorsHeader(dir, file);
  if (!header.ok()) return header.status();
  for (SafetensorsEntry& entry : header->tensors) {
    auto [it, inserted] = tensors.emplace(entry.name, HeaderTensor{std::move(entry.shape), entry.dtype, file});
    if (!inserted) {
      return CheckpointError(absl::StrCat("tensor ", entry.name, " appears in both ", it->second.file, " and ", file));
    }
  }
  return absl::OkStatus();
}

// For a quantized checkpoint: which format the expectation came from.
std::string QuantizedHint(const ModelSpec& spec) {
  if (!spec.quantization) return "";
  return absl::StrCat(" (quantization_config: ", QuantizationConfigSummary(spec.quantization->config), ")");
}

// A tensor under one of the spec's ignored prefixes (DeepSeek-V3's MTP layer): not the model's.
bool Ignored(const ModelSpec& spec, const std::string& name) {
  return std::any_of(spec.ignored_prefixes.begin(), spec.ignored_prefixes.end(),
                     [&](const std::string& prefix) { return name.starts_with(prefix); });
}

absl::Status CheckTensors(const ModelSpec& spec, const CheckpointFiles& files,
                          const std::map<std::string, HeaderTensor>& found) {
  const std::string source = files.weight_map.empty() ? std::string(kSafetensorsSingleFile)
                                                      : absl::StrCat("the shards of ", kSafetensorsIndexFile);

  // The index must tell the truth about where each tensor is: the loader opens only the shard it names.
  for (const auto& [name, shard] : files.weight_map) {
    auto it = found.find(name);
    if (it == found.end() || it->second.file != shard) {
      return CheckpointError(absl::StrCat("tensor ", name, " is listed in ", kSafetensorsIndexFile, " under ", shard,
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
    if (Ignored(spec, name)) continue;
    const std::vector<int64_t>* want = nullptr;
    if (auto it = expected.find(name); it != expected.end()) {
      want = &it->second.shape;
      const std::vector<std::string>& dtypes = it->second.stored_dtypes;
      if (!dtypes.empty() && std::find(dtypes.begin(), dtypes.end(), tensor.dtype) == dtypes.end()) {
        return CheckpointError(absl::StrCat("tensor ", name, " has dtype ", tensor.dtype, " in ", tensor.file,
                                            ", expected ", absl::StrJoin(dtypes, " or "), QuantizedHint(spec)));
      }
    } else if (auto tied = tied_shapes.find(name); tied != tied_shapes.end()) {
      want = &tied->second;
    } else {
      unexpected.push_back(name);
      continue;
    }
    if (tensor.shape != *want) {
      return CheckpointError(absl::StrCat("tensor ", name, " has shape ", ShapeString(tensor.shape), " in ",
                                          tensor.file, ", expected ", ShapeString(*want), QuantizedHint(spec)));
    }
  }
  if (!unexpected.empty()) {
    const HeaderTensor& first = found.at(unexpected.front());
    std::string more = unexpected.size() > 1 ? absl::StrCat(" (and ", unexpected.size() - 1, " more)") : "";
    return CheckpointError(absl::StrCat("unexpected tensor ", unexpected.front(), " in ", first.file,
                                        ": the model has no such parameter or persistent buffer", more,
                                        QuantizedHint(spec)));
  }

  std::vector<std::string> missing;
  for (const auto& [name, tensor] : expected) {
    if (!found.contains(name)) missing.push_back(name);
  }
  if (!missing.empty()) {
    const ExpectedTensor& first = expected.at(missing.front());
    std::string more = missing.size() > 1 ? absl::StrCat(" (and ", missing.size() - 1, " more)") : "";
    return CheckpointError(absl::StrCat("tensor ", missing.front(), " ", ShapeString(first.shape), " is missing from ",
                                        source, more, QuantizedHint(spec)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelSpec> LoadModelSpec(const std::filesystem::path& checkpoint_dir, std::optional<DType> dtype,
                                        const SpecOptions& options) {
  std::error_code ec;
  if (!fs::is_directory(checkpoint_dir, ec)) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint ", checkpoint_dir.string(), ": not a directory"));
  }
  const fs::path config_path = checkpoint_dir / "config.json";
  if (!base::PathMayExist(config_path)) {
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
  // The declared dtype is checked even when the caller chose another: every binary gives the same
  // verdict on the same config.json.
  absl::StatusOr<DType> declared = ConfigDType(*config);
  if (!declared.ok()) return in_config_file(declared.status());
  if (!dtype) dtype = *declared;
  absl::StatusOr<ModelSpec> spec = ModelSpecFromConfig(*config, *dtype, options);
  if (!spec.ok()) return in_config_file(spec.status());
  // The errors kept for the runtime name the file too.
  if (!spec->decoder.ok()) spec->decoder = in_config_file(spec->decoder.status());
  if (spec->eos_token_ids && !spec->eos_token_ids->ok()) {
    *spec->eos_token_ids = in_config_file(spec->eos_token_ids->status());
  }
  ApplyGenerationConfig(checkpoint_dir, *spec);

  absl::StatusOr<std::optional<CheckpointFiles>> files = FindCheckpointFiles(checkpoint_dir);
  if (!files.ok()) return files.status();
  if (!files->has_value()) return spec;

  std::map<std::string, HeaderTensor> found;
  for (const std::string& file : (*files)->files) {
    if (absl::Status s = ReadHeader(checkpoint_dir, file, found); !s.ok()) return s;
  }
  if (spec->quantization) {
    std::map<std::string, std::string> dtypes;
    for (const auto& [name, tensor] : found) dtypes[name] = tensor.dtype;
    AdoptStoredScaleDTypes(*spec, dtypes);
  }
  if (absl::Status s = CheckTensors(*spec, **files, found); !s.ok()) return s;
  for (const auto& [name, tensor] : found) {
    if (Ignored(*spec, name)) spec->ignored_tensors.push_back(name);
  }
  return spec;
}

}  // namespace strata::planner
