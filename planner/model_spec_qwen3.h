#pragma once
// Internal to ModelSpecFromConfig: what Qwen3 (dense) and Qwen3-MoE change in the Llama-family layout that
// model_spec_llama.cc builds (model_spec_qwen3.cc): an RMSNorm over each query and key head and, for Qwen3-MoE, the
// sparse MoE blocks (model_spec_moe.h). Each edits the finished Llama-layout spec in place and sets the forward
// pass's settings that go with its changes (DecoderConfig::qk_norm, DecoderConfig::moe).

#include "absl/status/status.h"
#include "nlohmann/json.hpp"
#include "planner/decoder_config.h"
#include "planner/model_spec.h"

namespace strata::planner::internal {

absl::Status ExtendQwen3Spec(const nlohmann::json& config, ModelSpec& spec, DecoderConfig& decoder);
absl::Status ExtendQwen3MoeSpec(const nlohmann::json& config, ModelSpec& spec, DecoderConfig& decoder);

}  // namespace strata::planner::internal
