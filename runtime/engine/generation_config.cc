#include "runtime/engine/generation_config.h"

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/file_reader.h"
#include "checkpoint/json_depth.h"
#include "nlohmann/json.hpp"

namespace strata::runtime {
namespace {

// The file's eos_token_id, or nothing when the file is absent or does not set it.
absl::StatusOr<std::optional<std::vector<int32_t>>> EosFrom(const std::filesystem::path& file) {
  absl::StatusOr<std::optional<std::string>> text =
      checkpoint::ReadRegularFileIfPresent(file, checkpoint::kMaxConfigFileBytes);
  if (!text.ok()) return text.status();
  if (!text->has_value()) return std::optional<std::vector<int32_t>>();
  // The message below quotes a bad eos_token_id (printing recurses): bound the depth first.
  if (absl::Status s = checkpoint::CheckJsonDepth(**text, checkpoint::kMaxJsonDepth, file.string()); !s.ok()) return s;
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(**text);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(file.string(), ": invalid JSON: ", e.what()));
  }
  if (!json.is_object() || !json.contains("eos_token_id")) return std::optional<std::vector<int32_t>>();
  const nlohmann::json& eos = json["eos_token_id"];
  std::vector<int32_t> ids;
  auto add = [&](const nlohmann::json& value) -> absl::Status {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() > INT32_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat(file.string(), ": eos_token_id: ", value.dump(), " is not a non-negative 32-bit integer"));
    }
    ids.push_back(value.get<int32_t>());
    return absl::OkStatus();
  };
  if (eos.is_null()) return std::optional<std::vector<int32_t>>(ids);
  if (eos.is_array()) {
    for (const nlohmann::json& value : eos) {
      if (absl::Status s = add(value); !s.ok()) return s;
    }
  } else if (absl::Status s = add(eos); !s.ok()) {
    return s;
  }
  return std::optional<std::vector<int32_t>>(ids);
}

}  // namespace

absl::StatusOr<std::vector<int32_t>> ReadEosTokenIds(const std::filesystem::path& model_dir) {
  for (const char* name : {"generation_config.json", "config.json"}) {
    absl::StatusOr<std::optional<std::vector<int32_t>>> ids = EosFrom(model_dir / name);
    if (!ids.ok()) return ids.status();
    if (ids->has_value()) return **ids;
  }
  return std::vector<int32_t>();
}

}  // namespace strata::runtime
