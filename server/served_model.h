#pragma once
// The weights strata-server generates with: the loaded model (runtime::LoadedModel, placed by the
// runtime's own plan with a KV reserve of --max-batch x --max-context), the checkpoint's tokenizer and
// the engine. Plain C++ from runtime/: no torch headers reach server/.

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "chat_template/checkpoint_template.h"
#include "runtime/engine/engine.h"
#include "runtime/executor/loaded_model.h"
#include "server/flags.h"
#include "server/served_plan.h"
#include "structured/structured.h"
#include "tokenizer/tokenizer.h"

namespace strata::server {

// What a GenerateRequest may ask for, from the flags and the loaded model (server/generate_validation.h).
struct GenerateLimits {
  int64_t vocab_size = 0;
  int64_t max_context = 0;
  // What the paged KV cache holds (blocks x block tokens): one sequence can never need more. 0: unchecked.
  int64_t kv_cache_tokens = 0;
  int64_t max_new_tokens = 0;
  int64_t max_prompt_bytes = 1 << 20;  // prompt text, checked before it is tokenized
  int64_t max_prompt_tokens = 0;       // text prompts after tokenizing, prompt_ids as given; 0: max_context
  int64_t max_stop_strings = 16;
  int64_t max_stop_bytes = 256;  // per stop string
  int64_t max_top_logprobs = 20;
  int64_t max_messages = 4096;  // chat messages of one request (either API)
  // request_id is echoed in every streamed message: bounded so it cannot multiply a response's size.
  int64_t max_request_id_bytes = 256;
  // What structured-output constraints compile against: the model's vocabulary, with --max-grammar-bytes and
  // --max-grammar-compile-seconds (structured/structured.h). Null (no tokenizer.json, or a test): a request
  // with a constraint is refused naming its field. Not owned; thread-safe.
  structured::Compiler* grammar_compiler = nullptr;
  std::string grammar_unavailable;  // why grammar_compiler is null, for the refusal
};

// Whether `dir` holds weights to load (*.safetensors or an index); without them the server only plans.
bool HasWeights(const std::filesystem::path& dir);

// What start-up says about the flags against the planned model, each line naming the flag: a --max-context
// beyond the positions the model was trained for (a WARNING), a --kv-cache-tokens rounded up to whole
// blocks (a note).
struct ServingNotes {
  std::vector<std::string> warnings;
  std::vector<std::string> notes;
};
ServingNotes NotesOnServing(const planner::Placement& placement, const ServingFlags& serving,
                            const runtime::LoadOptions& load);

// What a serving process plans, from its flags: runtime::PlanLoad makes the one plan it uses (GetDeviceMap shows it,
// the weights are placed by it: the spec in the serving dtype, a KV reserve of --max-batch x --max-context tokens;
// errors name the flag or file); a group's nodes plan through runtime/executor/group_load.h with it.
// `inventory`: the machine as discovered at start-up (used when --max-memory is absent). Errors: no --model.
absl::StatusOr<runtime::ServingRequest> ServingRequestOf(const planner::Placement& placement,
                                                         const ServingFlags& serving,
                                                         const std::optional<planner::MachineInventory>& inventory);

class ServedModel {
 public:
  // Loads the weights by `load` (runtime::PlanLoad), the tokenizer (tokenizer.json or tiktoken.model) when
  // present and the EOS ids, and starts the engine. `on_device_lost` is called (on the engine thread) when
  // a failure leaves a device unusable. The leader of a group passes its group: every worker must have
  // loaded its stages (AwaitGroupReady) before the engine starts; a lost node is then a lost device.
  static absl::StatusOr<std::unique_ptr<ServedModel>> Load(const ServerOptions& options,
                                                           const runtime::LoadOptions& load,
                                                           const runtime::LoadOptions* draft,
                                                           std::function<void(const absl::Status&)> on_device_lost = {},
                                                           runtime::NodeGroup* group = nullptr);

  runtime::Engine& engine() { return *engine_; }
  runtime::LoadedModel& model() { return *model_; }
  const runtime::LoadedModel* draft() const { return draft_.get(); }  // --draft-model, or null
  const tokenizer::Tokenizer* tokenizer() const { return tokenizer_.get(); }
  // The checkpoint's chat template(s) (or --chat-template's), null when there is none.
  const chat_template::CheckpointChatTemplate* chat_template() const {
    return chat_template_ ? &*chat_template_ : nullptr;
  }
  const GenerateLimits& limits() const { return limits_; }
  // Structured outputs' compiler (null without a tokenizer): limits().grammar_compiler; /metrics reads its stats.
  structured::Compiler* grammar_compiler() { return grammar_compiler_.get(); }
  // The runtime's plan, as GetDeviceMap and /metrics show it.
  const ServedPlan& plan() const { return plan_; }
  // Stops the engine (every running request ends CANCELLED). Idempotent.
  void StopEngine() { engine_.reset(); }

 private:
  ServedModel() = default;
  std::unique_ptr<runtime::LoadedModel> model_;
  std::unique_ptr<runtime::LoadedModel> draft_;  // --draft-model (runtime/engine/draft_model.h)
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  std::optional<chat_template::CheckpointChatTemplate> chat_template_;
  // Before the engine: destroyed after it (its running requests hold compiled grammars).
  std::unique_ptr<structured::Compiler> grammar_compiler_;
  std::unique_ptr<runtime::Engine> engine_;
  GenerateLimits limits_;
  ServedPlan plan_;
};

}  // namespace strata::server
