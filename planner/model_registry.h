#pragma once
// The one table of the model families strata builds from config.json: architecture name <-> model_type <->
// ModelFamily (which of the runtime's unit runners executes it, runtime/model/unit.h) <-> the planner's spec
// builder. Adding a family is one line here plus its own files (runtime/model/README.md, "Adding a model
// family"). Plain C++.

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "nlohmann/json_fwd.hpp"
#include "planner/decoder_config.h"
#include "planner/model_spec.h"

namespace strata::planner {

struct Architecture;

// Builds the module tree and the forward pass's settings (ModelSpec::decoder) for `arch` from config.json.
// `max_positions` is config.json's max_position_embeddings as ModelSpecFromConfig read it (0: not stated).
using SpecBuilder = absl::StatusOr<ModelSpec> (*)(const nlohmann::json& config, const Architecture& arch, DType dtype,
                                                  int64_t max_positions);

struct Architecture {
  absl::string_view name;        // config.json's architectures[0]: "LlamaForCausalLM"
  absl::string_view model_type;  // config.json's model_type: "llama" (what AutoModelForCausalLM builds from)
  ModelFamily family;            // the runtime's unit runner
  SpecBuilder build;             // model_spec_{llama,gemma,phi3}.cc
};

// Every supported architecture, in the order error messages list them.
absl::Span<const Architecture> Architectures();

// The architecture config.json names, as AutoModelForCausalLM resolves it: by model_type, and by
// architectures[0] when present, which must agree. Errors: "config.json: FIELD what", or an unsupported
// name with the list of supported ones and the module-tree hint.
absl::StatusOr<const Architecture*> ResolveArchitecture(const nlohmann::json& config);

// The family builders the table names (each in its family's file).
absl::StatusOr<ModelSpec> LlamaFamilySpecFromConfig(const nlohmann::json& config, const Architecture& arch, DType dtype,
                                                    int64_t max_positions);
absl::StatusOr<ModelSpec> GemmaSpecFromConfig(const nlohmann::json& config, const Architecture& arch, DType dtype,
                                              int64_t max_positions);
absl::StatusOr<ModelSpec> DeepseekV3SpecFromConfig(const nlohmann::json& config, const Architecture& arch, DType dtype,
                                                   int64_t max_positions);
absl::StatusOr<ModelSpec> Glm4MoeSpecFromConfig(const nlohmann::json& config, const Architecture& arch, DType dtype,
                                                int64_t max_positions);
absl::StatusOr<ModelSpec> MiniMaxM2SpecFromConfig(const nlohmann::json& config, const Architecture& arch, DType dtype,
                                                  int64_t max_positions);
absl::StatusOr<ModelSpec> GptOssSpecFromConfig(const nlohmann::json& config, const Architecture& arch, DType dtype,
                                               int64_t max_positions);
absl::StatusOr<ModelSpec> Phi3SpecFromConfig(const nlohmann::json& config, const Architecture& arch, DType dtype,
                                             int64_t max_positions);

}  // namespace strata::planner
