// Post-processors: TemplateProcessing (the BOS/EOS templates), RobertaProcessing, BertProcessing,
// ByteLevel (offsets only: nothing to do for ids) and Sequence. strata encodes single sequences, so
// only the "single" template applies.
#ifndef STRATA_RUNTIME_TOKENIZER_POST_PROCESSORS_H_
#define STRATA_RUNTIME_TOKENIZER_POST_PROCESSORS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "tokenizer/json_path.h"

namespace strata::tokenizer {

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  // Rewrites the encoded sequence; special tokens are added only when `add_special_tokens`.
  virtual void Process(std::vector<int32_t>& ids, bool add_special_tokens) const = 0;
};

absl::StatusOr<std::unique_ptr<PostProcessor>> ParsePostProcessor(const JsonAt& json);

// Wraps the sequence in fixed ids: what tokenizer_config.json's add_bos_token/add_eos_token ask for
// when tokenizer.json has no post-processor.
std::unique_ptr<PostProcessor> MakeBosEosProcessor(std::vector<int32_t> prefix, std::vector<int32_t> suffix);

}  // namespace strata::tokenizer

#endif  // STRATA_RUNTIME_TOKENIZER_POST_PROCESSORS_H_
