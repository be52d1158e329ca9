// libFuzzer harness: a GenerateRequest as the server receives it, raw wire bytes, through the one
// validation at the edge (server/generate_validation.h), once with a tokenizer and a chat template (its
// messages rendered) and once with neither. Links the proto library, the tokenizer, the chat templates,
// generate_validation.cc and chat_prompt.cc only: no torch, no gRPC server. A request the validation
// accepts must keep what the rest of the server assumes of it (fuzz_fixtures.h's CheckAccepted).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "server/generate_validation.h"
#include "tests/fuzz/fuzz_fixtures.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view wire(reinterpret_cast<const char*>(data), size);
  static const strata::server::GenerateLimits limits = strata::fuzz::SmallLimits();
  // With a tokenizer and a chat template, and with neither (a checkpoint without tokenizer.json).
  const strata::tokenizer::Tokenizer* tokenizer = &strata::fuzz::SmallTokenizer();
  const strata::chat_template::CheckpointChatTemplate* chat = &strata::fuzz::SmallChatTemplate();
  for (int with = 0; with < 2; ++with) {
    absl::StatusOr<strata::runtime::GenerationRequest> request = strata::server::ValidateGenerateRequest(
        wire, limits, with == 0 ? tokenizer : nullptr, with == 0 ? chat : nullptr);
    if (request.ok()) strata::fuzz::CheckAccepted(*request, limits);
  }
  return 0;
}
