#pragma once
// The speculative-decoding flags (speculation.h), declared once for strata-server and strata-generate: the same
// names, help, defaults and errors in both.
//
//   --speculative none|ngram|draft, --draft-model DIR, --num-speculative-tokens K, --ngram-min N, --ngram-max N

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cli/flags.h"
#include "runtime/engine/speculation.h"

namespace strata::runtime {

// The flags in the order --help lists them; `section` heads the first (may be empty).
std::vector<cli::FlagSpec> SpeculativeFlagSpecs(const std::string& section);

// The flags' values after cli::Parse, checked (ValidateSpeculativeOptions): InvalidArgument naming the flag.
absl::StatusOr<SpeculativeOptions> ParseSpeculativeFlags();

}  // namespace strata::runtime
