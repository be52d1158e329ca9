#pragma once
// A checkpoint's chat template(s) and special tokens, found where transformers finds them:
//   1. --chat-template FILE (the override), else
//   2. chat_template.jinja (what transformers saves today) and additional_chat_templates/NAME.jinja, else
//   3. tokenizer_config.json's "chat_template": a string, or a list of {"name", "template"}.
// Special tokens are transformers' special_tokens_map: bos_token, eos_token, unk_token, sep_token,
// pad_token, cls_token, mask_token and any other "*_token" key of tokenizer_config.json whose value is a
// string or an AddedToken object ({"content": ...}), plus a dict-valued "extra_special_tokens".

#include <filesystem>
#include <map>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "chat_template/chat_template.h"
#include "nlohmann/json.hpp"

namespace strata::chat_template {

struct CheckpointChatTemplate {
  // Named templates; "default" is the one used unless another is asked for (a lone template is "default").
  std::map<std::string, Template> templates;
  nlohmann::ordered_json special_tokens = nlohmann::ordered_json::object();  // {"bos_token": "<s>", ...}

  // transformers' get_chat_template: `name` when given (an unknown name is NotFound listing the known
  // ones); else "tool_use" when the request has tools and the checkpoint has one; else "default".
  absl::StatusOr<const Template*> Select(std::string_view name, bool has_tools) const;
};

// `checkpoint_dir` may be empty when `override_file` is given (then there are no special tokens). A
// checkpoint without any template is NotFound; a template that does not parse is InvalidArgument naming
// the file and line ("DIR/tokenizer_config.json[chat_template]:3:7: ...").
absl::StatusOr<CheckpointChatTemplate> LoadChatTemplate(const std::filesystem::path& checkpoint_dir,
                                                        const std::filesystem::path& override_file = {});

}  // namespace strata::chat_template
