#include "planner/generation_config.h"

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/file_reader.h"
#include "base/json.h"
#include "nlohmann/json.hpp"

namespace strata::planner {
namespace {

// generation_config.json's eos_token_id, or nothing when the file is absent or does not set it.
absl::StatusOr<std::optional<std::vector<int32_t>>> EosFrom(const std::filesystem::path& file) {
  absl::StatusOr<std::optional<std::string>> text = base::ReadRegularFileIfPresent(file, base::kMaxConfigFileBytes);
  if (!text.ok()) return text.status();
  if (!text->has_value()) return std::optional<std::vector<int32_t>>();
  // The message below quotes a bad eos_token_id (printing recurses): bound the depth first.
  absl::StatusOr<nlohmann::json> parsed = base::ParseJson(**text, base::kMaxJsonDepth, file.string());
  if (!parsed.ok()) return parsed.status();
  const nlohmann::json& json = *parsed;
  if (!json.is_object() || !json.contains("eos_token_id")) return std::optional<std::vector<int32_t>>();
  absl::StatusOr<std::vector<int32_t>> ids = EosTokenIdsFromJson(json["eos_token_id"], file.string());
  if (!ids.ok()) return ids.status();
  return std::optional<std::vector<int32_t>>(*std::move(ids));
}

}  // namespace

void ApplyGenerationConfig(const std::filesystem::path& checkpoint_dir, ModelSpec& spec) {
  absl::StatusOr<std::optional<std::vector<int32_t>>> ids = EosFrom(checkpoint_dir / "generation_config.json");
  if (!ids.ok()) {
    spec.eos_token_ids = ids.status();
  } else if (ids->has_value()) {
    spec.eos_token_ids = **std::move(ids);
  }
}

absl::StatusOr<std::vector<int32_t>> EosTokenIds(const ModelSpec& spec) {
  if (spec.eos_token_ids.has_value()) return *spec.eos_token_ids;
  return std::vector<int32_t>();
}

}  // namespace strata::planner
