#pragma once
// Every GenerateRequest is validated here, once, at the edge (STYLE.md, TGI's router): the wire bytes
// become a trusted runtime::GenerationRequest, or an error whose code is the gRPC status to answer and
// whose message names the field. Nothing after this point checks a request again.

#include <string_view>

#include "absl/status/statusor.h"
#include "runtime/engine/engine.h"
#include "server/served_model.h"
#include "strata/v1/strata.pb.h"
#include "tokenizer/tokenizer.h"

namespace strata::server {

// From a parsed message. `tokenizer` may be null (then text prompts and stop strings are refused).
absl::StatusOr<runtime::GenerationRequest> ValidateGenerateRequest(const v1::GenerateRequest& request,
                                                                   const GenerateLimits& limits,
                                                                   const tokenizer::Tokenizer* tokenizer);

// From the wire bytes: protobuf refuses to parse a proto3 string that is not UTF-8, so the bytes are
// read here, and such a request is INVALID_ARGUMENT naming the field (prompt, stop[i]) instead of the
// INTERNAL "failed to parse" gRPC would answer.
absl::StatusOr<runtime::GenerationRequest> ValidateGenerateRequest(std::string_view wire, const GenerateLimits& limits,
                                                                   const tokenizer::Tokenizer* tokenizer);

}  // namespace strata::server
