// strata-chat-template: render a Hugging Face chat template as transformers' apply_chat_template
// (tokenize=False) does. Exit codes: 0 ok, 2 bad input (message on stderr), 1 anything else.

#include <cstdio>
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "chat_template/chat_template.h"
#include "chat_template/checkpoint_template.h"
#include "checkpoint/file_reader.h"
#include "checkpoint/json_depth.h"
#include "cli/flags.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, checkpoint, "",
          "checkpoint directory: chat_template.jinja or tokenizer_config.json's chat_template, and its special tokens");
ABSL_FLAG(std::string, template_file, "", "a template file to render (no checkpoint needed)");
ABSL_FLAG(std::string, chat_template, "", "with --checkpoint: this template file instead of the checkpoint's");
ABSL_FLAG(std::string, template_name, "",
          "one of the checkpoint's named templates (e.g. tool_use); default: transformers' choice");
ABSL_FLAG(std::string, messages, "",
          "JSON file: a list of messages, or an object {messages, tools, documents, add_generation_prompt, "
          "continue_final_message, ...other template variables}");
ABSL_FLAG(bool, add_generation_prompt, false, "set add_generation_prompt");
ABSL_FLAG(bool, continue_final_message, false, "continue the final message (its content)");
ABSL_FLAG(bool, batch, false,
          "read JSON Lines of such objects on stdin; write one JSON line each: {\"text\": ...} or {\"error\": ...}");
ABSL_FLAG(int64_t, max_steps, strata::chat_template::RenderLimits{}.max_steps, "render step budget");

namespace {

namespace ct = strata::chat_template;
using json = nlohmann::ordered_json;

const strata::cli::CommandLine& Command() {
  static const strata::cli::CommandLine command = [] {
    strata::cli::CommandLine command;
    command.usage = R"(usage: strata-chat-template (--checkpoint DIR | --template-file FILE) --messages FILE [options]
       strata-chat-template (--checkpoint DIR | --template-file FILE) --batch < contexts.jsonl

Renders a chat template as transformers' apply_chat_template(tokenize=False) and prints the text.
)";
    command.flags = {strata::cli::Flag(FLAGS_checkpoint, "DIR"),      strata::cli::Flag(FLAGS_template_file, "FILE"),
                     strata::cli::Flag(FLAGS_chat_template, "FILE"),  strata::cli::Flag(FLAGS_template_name, "NAME"),
                     strata::cli::Flag(FLAGS_messages, "FILE"),       strata::cli::Flag(FLAGS_add_generation_prompt),
                     strata::cli::Flag(FLAGS_continue_final_message), strata::cli::Flag(FLAGS_batch),
                     strata::cli::Flag(FLAGS_max_steps, "N")};
    return command;
  }();
  return command;
}

int Fail(int code, std::string_view message) {
  std::cerr << "strata-chat-template: " << message << "\n";
  return code;
}

int FailStatus(const absl::Status& status) {
  const bool bad_input = absl::IsInvalidArgument(status) || absl::IsNotFound(status);
  return Fail(bad_input ? 2 : 1, std::string(status.message()));
}

// A request from a context: a list is the messages; an object names its fields.
absl::StatusOr<ct::ChatRequest> RequestOf(const json& input) {
  ct::ChatRequest request;
  if (input.is_array()) {
    request.messages = input;
  } else if (input.is_object()) {
    for (const auto& [key, value] : input.items()) {
      if (key == "messages") {
        request.messages = value;
      } else if (key == "tools") {
        request.tools = value;
      } else if (key == "documents") {
        request.documents = value;
      } else if (key == "add_generation_prompt") {
        if (!value.is_boolean()) return absl::InvalidArgumentError("add_generation_prompt: expected true or false");
        request.add_generation_prompt = value.get<bool>();
      } else if (key == "continue_final_message") {
        if (value.is_boolean()) {
          request.continue_final_message = value.get<bool>() ? "content" : "";
        } else if (value.is_string()) {
          request.continue_final_message = value.get<std::string>();
        } else {
          return absl::InvalidArgumentError("continue_final_message: expected true, false or a field name");
        }
      } else {
        request.extra[key] = value;
      }
    }
  } else {
    return absl::InvalidArgumentError("expected a list of messages or an object with \"messages\"");
  }
  if (absl::GetFlag(FLAGS_add_generation_prompt)) request.add_generation_prompt = true;
  if (absl::GetFlag(FLAGS_continue_final_message) && request.continue_final_message.empty()) {
    request.continue_final_message = "content";
  }
  if (!request.messages.is_array()) return absl::InvalidArgumentError("messages: expected a list");
  if (!request.tools.is_null() && !request.tools.is_array())
    return absl::InvalidArgumentError("tools: expected a list");
  if (!request.documents.is_null() && !request.documents.is_array()) {
    return absl::InvalidArgumentError("documents: expected a list");
  }
  return request;
}

absl::StatusOr<std::string> RenderOne(const ct::CheckpointChatTemplate& loaded, const json& input,
                                      const ct::RenderLimits& limits) {
  absl::StatusOr<ct::ChatRequest> request = RequestOf(input);
  if (!request.ok()) return request.status();
  absl::StatusOr<const ct::Template*> tmpl =
      loaded.Select(absl::GetFlag(FLAGS_template_name), !request->tools.is_null());
  if (!tmpl.ok()) return tmpl.status();
  return ct::ApplyChatTemplate(**tmpl, *request, loaded.special_tokens, limits);
}

absl::StatusOr<json> ParseJson(const std::string& text, const std::string& where) {
  if (absl::Status depth = strata::checkpoint::CheckJsonDepth(text, strata::checkpoint::kMaxJsonDepth, where);
      !depth.ok()) {
    return depth;
  }
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(where, ": not valid JSON"));
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  absl::StatusOr<strata::cli::ParsedArgs> parsed = strata::cli::Parse(Command(), argc, argv);
  if (!parsed.ok()) return Fail(2, absl::StrCat(parsed.status().message(), " (see --help)"));
  if (parsed->help) {
    std::cout << strata::cli::Help(Command());
    return 0;
  }
  const std::string checkpoint = absl::GetFlag(FLAGS_checkpoint);
  const std::string template_file = absl::GetFlag(FLAGS_template_file);
  const std::string chat_template = absl::GetFlag(FLAGS_chat_template);
  const std::string messages = absl::GetFlag(FLAGS_messages);
  const bool batch = absl::GetFlag(FLAGS_batch);
  if (checkpoint.empty() == template_file.empty())
    return Fail(2, "give one of --checkpoint DIR and --template-file FILE");
  if (!chat_template.empty() && checkpoint.empty()) return Fail(2, "--chat-template applies to --checkpoint");
  if (batch == !messages.empty()) return Fail(2, "give one of --messages FILE and --batch");
  ct::RenderLimits limits;
  limits.max_steps = absl::GetFlag(FLAGS_max_steps);
  if (limits.max_steps < 1) return Fail(2, "--max-steps: expected a positive integer");

  absl::StatusOr<ct::CheckpointChatTemplate> loaded =
      ct::LoadChatTemplate(checkpoint, template_file.empty() ? chat_template : template_file);
  if (!loaded.ok()) return FailStatus(loaded.status());

  if (!batch) {
    absl::StatusOr<std::string> text =
        strata::checkpoint::ReadRegularFile(messages, strata::checkpoint::kMaxConfigFileBytes);
    if (!text.ok()) return FailStatus(text.status());
    absl::StatusOr<json> input = ParseJson(*text, messages);
    if (!input.ok()) return FailStatus(input.status());
    absl::StatusOr<std::string> rendered = RenderOne(*loaded, *input, limits);
    if (!rendered.ok()) return FailStatus(rendered.status());
    std::fwrite(rendered->data(), 1, rendered->size(), stdout);
    return 0;
  }
  std::string line;
  for (size_t n = 1; std::getline(std::cin, line); ++n) {
    absl::StatusOr<json> input = ParseJson(line, absl::StrCat("stdin line ", n));
    if (!input.ok()) return FailStatus(input.status());
    absl::StatusOr<std::string> rendered = RenderOne(*loaded, *input, limits);
    json out = json::object();
    if (rendered.ok()) {
      out["text"] = *rendered;
    } else {
      out["error"] = std::string(rendered.status().message());
    }
    std::string dumped = out.dump(-1, ' ', false, json::error_handler_t::replace);
    dumped.push_back('\n');
    std::fwrite(dumped.data(), 1, dumped.size(), stdout);
    std::fflush(stdout);
  }
  if (std::cin.bad()) return Fail(1, "error reading stdin");
  return 0;
}
