#include "runtime/engine/speculation_flags.h"

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, speculative, "none",
          "speculative decoding: none | ngram (each sequence proposes what followed the latest earlier occurrence of "
          "its last tokens) | draft (a smaller model of the same vocabulary proposes them, --draft-model) | mtp (the "
          "checkpoint's multi-token-prediction layer, DeepSeek-V3's, proposes one token a step; planned with lm_head); "
          "one forward pass verifies them all: greedy ids are those of decoding without it, sampled tokens are "
          "distributed alike");
ABSL_FLAG(std::string, draft_model, "",
          "the draft model's checkpoint folder (same tokenizer as the model; implies --speculative draft): planned "
          "with the model's --device-map, --max-memory and --dtype, with a KV pool of as many blocks");
ABSL_FLAG(int32_t, num_speculative_tokens, 4, "tokens a sequence proposes per step at most (1 to 64)");
ABSL_FLAG(bool, speculative_cost_aware, true,
          "propose only in steps where the measured time of verifying (and drafting) is expected to be repaid by the "
          "tokens kept (large batches on compute-bound devices stop proposing); false: whenever acceptance allows");
ABSL_FLAG(int32_t, ngram_min, 1, "--speculative ngram: the shortest suffix looked up");
ABSL_FLAG(int32_t, ngram_max, 4, "--speculative ngram: the longest suffix looked up (tried first)");

namespace strata::runtime {

std::vector<cli::FlagSpec> SpeculativeFlagSpecs(const std::string& section) {
  std::vector<cli::FlagSpec> specs;
  specs.push_back(cli::Flag(FLAGS_speculative, "METHOD"));
  if (!section.empty()) specs.back().section = section;
  specs.push_back(cli::Flag(FLAGS_draft_model, "DIR"));
  specs.push_back(cli::Flag(FLAGS_num_speculative_tokens, "K"));
  specs.push_back(cli::Flag(FLAGS_speculative_cost_aware));
  specs.push_back(cli::Flag(FLAGS_ngram_min, "N"));
  specs.push_back(cli::Flag(FLAGS_ngram_max, "N"));
  return specs;
}

absl::StatusOr<SpeculativeOptions> ParseSpeculativeFlags() {
  SpeculativeOptions options;
  absl::StatusOr<SpeculativeOptions::Method> method = ParseSpeculativeMethod(absl::GetFlag(FLAGS_speculative));
  if (!method.ok()) return method.status();
  options.method = *method;
  options.draft_model = absl::GetFlag(FLAGS_draft_model);
  // --draft-model alone means --speculative draft.
  if (!options.draft_model.empty() && options.method == SpeculativeOptions::Method::kNone) {
    options.method = SpeculativeOptions::Method::kDraft;
  }
  options.tokens = absl::GetFlag(FLAGS_num_speculative_tokens);
  options.cost_aware = absl::GetFlag(FLAGS_speculative_cost_aware);
  options.ngram_min = absl::GetFlag(FLAGS_ngram_min);
  options.ngram_max = absl::GetFlag(FLAGS_ngram_max);
  if (absl::Status valid = ValidateSpeculativeOptions(options); !valid.ok()) return valid;
  return options;
}

}  // namespace strata::runtime
