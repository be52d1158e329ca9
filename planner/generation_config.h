#pragma once
// What generation needs from a checkpoint directory beyond the forward pass: generation_config.json, read
// with config.json by LoadModelSpec and kept in the spec. Plain C++.

#include <cstdint>
#include <filesystem>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/model_spec.h"

namespace strata::planner {

// transformers' generate takes generation_config.json's `eos_token_id` over config.json's: when the file
// in `checkpoint_dir` exists and sets it, that replaces spec.eos_token_ids. A file that cannot be read or
// parsed, or a bad id, is kept there as the error (reported where the ids are used, naming the file:
// planning does not need them).
void ApplyGenerationConfig(const std::filesystem::path& checkpoint_dir, ModelSpec& spec);

// The ids that end a sequence: spec.eos_token_ids, none when neither file names them, or their error.
absl::StatusOr<std::vector<int32_t>> EosTokenIds(const ModelSpec& spec);

}  // namespace strata::planner
