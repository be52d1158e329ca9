#pragma once
// What generation needs from a checkpoint directory beyond the forward pass (plain C++).

#include <cstdint>
#include <filesystem>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/model_spec.h"

namespace strata::runtime {

// The ids that end a sequence, as transformers' generate finds them: generation_config.json's
// `eos_token_id` when that file exists and sets it, else config.json's as the planner read it into
// `spec` (ModelSpec::eos_token_ids; none when neither says). Errors name the file and field.
absl::StatusOr<std::vector<int32_t>> ReadEosTokenIds(const std::filesystem::path& model_dir,
                                                     const planner::ModelSpec& spec);

}  // namespace strata::runtime
