#pragma once
// What generation needs from a checkpoint directory beyond the forward pass (plain C++).

#include <cstdint>
#include <filesystem>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::runtime {

// The ids that end a sequence, as transformers' generate finds them: generation_config.json's
// `eos_token_id` when that file exists and sets it, else config.json's (an int, a list, or null/absent
// for none). Errors name the file and field.
absl::StatusOr<std::vector<int32_t>> ReadEosTokenIds(const std::filesystem::path& model_dir);

}  // namespace strata::runtime
