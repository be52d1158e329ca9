// strata-chat-template: render a Hugging Face chat template as transformers' apply_chat_template
// (tokenize=False) does. Exit codes: 0 ok, 2 bad input (message on stderr), 1 anything else.

#include <cstdio>
#include <iostream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/file_reader.h"
#include "base/json.h"
#include "chat_template/chat_template.h"
#include "chat_template/checkpoint_template.h"
#include "chat_template/reasoning.h"
#include "chat_template/tool_calls.h"
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
ABSL_FLAG(std::string, parse_tool_calls, "",
          "instead of rendering: read a model's output on stdin and print its tool calls as JSON, parsed as vLLM's "
          "--tool-call-parser FORMAT (hermes, llama3_json, deepseek_v3, kimi_k2, glm45, minimax_m2, openai); with "
          "--batch, one JSON string a line in (or {\"output\": string, \"tools\": [...]}), one result a line out");
ABSL_FLAG(std::string, tools, "",
          "with --parse-tool-calls: a JSON file with the request's \"tools\" list, whose schemas glm45 and "
          "minimax_m2 type the arguments by");
ABSL_FLAG(std::string, parse_reasoning, "",
          "instead of rendering: read a model's output on stdin and print its reasoning_content and content, "
          "split as vLLM's --reasoning-parser FORMAT (deepseek_r1, qwen3, glm45, gpt_oss); with --parse-tool-calls, "
          "the calls are parsed from the content (openai: from the whole output)");
ABSL_FLAG(bool, enable_thinking, true,
          "with --parse-reasoning qwen3: the request's chat_template_kwargs.enable_thinking (false: all content)");
ABSL_FLAG(int64_t, tool_call_seed, -1, "with --parse-tool-calls: seed of the tool-call ids (default: random)");
ABSL_FLAG(int64_t, stream_chunk, 0,
          "with --parse-tool-calls or --parse-reasoning: feed the output to the stream parsers in chunks of N bytes "
          "and print what the deltas add up to (an empty reasoning_content or content then prints as null)");
ABSL_FLAG(int64_t, max_steps, strata::chat_template::RenderLimits{}.max_steps, "render step budget");

namespace {

namespace ct = strata::chat_template;
using json = nlohmann::ordered_json;

const strata::cli::CommandLine& Command() {
  static const strata::cli::CommandLine command = [] {
    strata::cli::CommandLine command;
    command.usage = R"(usage: strata-chat-template (--checkpoint DIR | --template-file FILE) --messages FILE [options]
       strata-chat-template (--checkpoint DIR | --template-file FILE) --batch < contexts.jsonl
       strata-chat-template --parse-tool-calls FORMAT [--batch] [--tools FILE] [--tool-call-seed N] [--stream-chunk N] < output
       strata-chat-template --parse-reasoning FORMAT [--enable-thinking=false] [--parse-tool-calls FORMAT] ... < output

Renders a chat template as transformers' apply_chat_template(tokenize=False) and prints the text.
)";
    command.flags = {
        strata::cli::Flag(FLAGS_checkpoint, "DIR"),      strata::cli::Flag(FLAGS_template_file, "FILE"),
        strata::cli::Flag(FLAGS_chat_template, "FILE"),  strata::cli::Flag(FLAGS_template_name, "NAME"),
        strata::cli::Flag(FLAGS_messages, "FILE"),       strata::cli::Flag(FLAGS_add_generation_prompt),
        strata::cli::Flag(FLAGS_continue_final_message), strata::cli::Flag(FLAGS_batch),
        strata::cli::Flag(FLAGS_max_steps, "N"),         strata::cli::Flag(FLAGS_parse_tool_calls, "FORMAT"),
        strata::cli::Flag(FLAGS_tools, "FILE"),          strata::cli::Flag(FLAGS_tool_call_seed, "N"),
        strata::cli::Flag(FLAGS_stream_chunk, "N"),      strata::cli::Flag(FLAGS_parse_reasoning, "FORMAT"),
        strata::cli::Flag(FLAGS_enable_thinking)};
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
  return strata::base::ParseOrderedJson(text, strata::base::kMaxJsonDepth, where);
}

// An assistant message as the HTTP API builds it: {"reasoning_content": string|null (with a reasoning
// parser), "content": string|null, "tool_calls": [{id, type, function: {name, arguments}}] (with a tool-call
// parser)}. Content is null when the tool-call parser cut the output (calls, or a section marker) and left
// no text before the cut, or when the reasoning parser found none.
struct ParsedOutput {
  std::optional<std::string> reasoning;
  std::optional<std::string> content;
  std::vector<ct::ToolCall> calls;
};

json OutputJson(const ParsedOutput& parsed, bool reasoning, bool tool_calls) {
  json out = json::object();
  if (reasoning) out["reasoning_content"] = parsed.reasoning ? json(*parsed.reasoning) : json(nullptr);
  out["content"] = parsed.content ? json(*parsed.content) : json(nullptr);
  if (!tool_calls) return out;
  out["tool_calls"] = json::array();
  for (const ct::ToolCall& call : parsed.calls) {
    out["tool_calls"].push_back(
        {{"id", call.id}, {"type", "function"}, {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
  }
  return out;
}

struct OutputFormats {
  std::optional<ct::ReasoningFormat> reasoning;
  bool thinking_enabled = true;
  std::optional<ct::ToolCallFormat> tool_calls;
};

ParsedOutput ParseOutput(const OutputFormats& formats, std::string_view text, const json& tools, ct::ToolCallIds& ids) {
  ParsedOutput parsed;
  parsed.content = std::string(text);
  if (formats.reasoning) {
    ct::ParsedReasoning split = ct::ParseReasoning(*formats.reasoning, text, formats.thinking_enabled);
    parsed.reasoning = std::move(split.reasoning);
    parsed.content = std::move(split.content);
  }
  // openai reads the harmony channels of the whole output itself.
  if (formats.tool_calls && ct::ReadsWholeOutput(*formats.tool_calls)) parsed.content = std::string(text);
  if (formats.tool_calls && parsed.content) {
    ct::ParsedToolCalls found = ct::ParseToolCalls(*formats.tool_calls, *parsed.content, ids, &tools);
    parsed.calls = std::move(found.calls);
    // Empty after a cut (calls, or a section marker with none) is vLLM's None.
    if (found.content.empty() && (!parsed.content->empty() || ct::ReadsWholeOutput(*formats.tool_calls))) {
      parsed.content.reset();
    } else {
      parsed.content = std::move(found.content);
    }
  }
  return parsed;
}

// The stream parsers fed `chunk` bytes at a time (reasoning first, its content through the tool-call
// parser), their deltas added up; with a reasoning parser, empty texts come back null.
ParsedOutput StreamOutput(const OutputFormats& formats, std::string_view text, const json& tools, size_t chunk,
                          ct::ToolCallIds ids) {
  std::optional<ct::ReasoningStreamParser> reasoning;
  if (formats.reasoning) reasoning.emplace(*formats.reasoning, formats.thinking_enabled);
  std::optional<ct::ToolCallStreamParser> tool_calls;
  if (formats.tool_calls) tool_calls.emplace(*formats.tool_calls, ids, tools);
  const bool whole = formats.tool_calls && ct::ReadsWholeOutput(*formats.tool_calls);
  std::string reasoning_text, content;
  ParsedOutput parsed;
  auto add_tool_deltas = [&](const std::vector<ct::ToolCallDelta>& deltas) {
    for (const ct::ToolCallDelta& delta : deltas) {
      if (delta.tool_index < 0) {
        content += delta.content;
        continue;
      }
      if (static_cast<size_t>(delta.tool_index) >= parsed.calls.size()) parsed.calls.resize(delta.tool_index + 1);
      ct::ToolCall& call = parsed.calls[delta.tool_index];
      call.id += delta.id;
      call.name += delta.name;
      call.arguments += delta.arguments;
    }
  };
  auto add_content = [&](std::string_view piece) {
    if (tool_calls) {
      add_tool_deltas(tool_calls->Feed(piece));
    } else {
      content += piece;
    }
  };
  auto add_reasoning_deltas = [&](const std::vector<ct::ReasoningDelta>& deltas) {
    for (const ct::ReasoningDelta& delta : deltas) {
      if (delta.reasoning) {
        reasoning_text += delta.text;
      } else if (!whole) {
        add_content(delta.text);
      }
    }
  };
  for (size_t i = 0; i < text.size(); i += chunk) {
    if (reasoning) add_reasoning_deltas(reasoning->Feed(text.substr(i, chunk)));
    if (!reasoning || whole) add_content(text.substr(i, chunk));
  }
  if (reasoning) add_reasoning_deltas(reasoning->Finish());
  if (tool_calls) add_tool_deltas(tool_calls->Finish());
  if (!reasoning_text.empty()) parsed.reasoning = std::move(reasoning_text);
  // As ParseOutput, but that a reasoning parser's null content cannot be told from an empty one.
  if (!content.empty() || (!reasoning && !whole && text.empty())) parsed.content = std::move(content);
  return parsed;
}

int ParseOutputMain(const std::string& tool_call_flag, const std::string& reasoning_flag, bool batch) {
  OutputFormats formats;
  if (!tool_call_flag.empty()) {
    absl::StatusOr<ct::ToolCallFormat> format = ct::ParseToolCallFormat(tool_call_flag);
    if (!format.ok()) return Fail(2, absl::StrCat("--parse-tool-calls: ", format.status().message()));
    formats.tool_calls = *format;
  }
  if (!reasoning_flag.empty()) {
    absl::StatusOr<ct::ReasoningFormat> format = ct::ParseReasoningFormat(reasoning_flag);
    if (!format.ok()) return Fail(2, absl::StrCat("--parse-reasoning: ", format.status().message()));
    formats.reasoning = *format;
  }
  formats.thinking_enabled = absl::GetFlag(FLAGS_enable_thinking);
  const int64_t seed = absl::GetFlag(FLAGS_tool_call_seed);
  const int64_t chunk = absl::GetFlag(FLAGS_stream_chunk);
  if (chunk < 0) return Fail(2, "--stream-chunk: expected a positive integer (or 0: not streamed)");
  ct::ToolCallIds ids = seed >= 0 ? ct::ToolCallIds(static_cast<uint64_t>(seed)) : ct::ToolCallIds();
  json file_tools;
  if (const std::string path = absl::GetFlag(FLAGS_tools); !path.empty()) {
    absl::StatusOr<std::string> text = strata::base::ReadRegularFile(path, strata::base::kMaxConfigFileBytes);
    if (!text.ok()) return FailStatus(text.status());
    absl::StatusOr<json> parsed = ParseJson(*text, path);
    if (!parsed.ok()) return FailStatus(parsed.status());
    if (!parsed->is_array()) return Fail(2, absl::StrCat("--tools: ", path, " must hold a JSON list"));
    file_tools = *std::move(parsed);
  }
  auto parse = [&](std::string_view text, const json& tools) {
    ParsedOutput parsed;
    if (chunk > 0) {
      parsed = StreamOutput(formats, text, tools, static_cast<size_t>(chunk), ids);
      for (size_t i = 0; i < parsed.calls.size(); ++i) ids.Next();  // the next output gets fresh ids
    } else {
      parsed = ParseOutput(formats, text, tools, ids);
    }
    return OutputJson(parsed, formats.reasoning.has_value(), formats.tool_calls.has_value());
  };
  auto print = [](const json& out) {
    std::string dumped = out.dump(-1, ' ', false, json::error_handler_t::replace);
    dumped.push_back('\n');
    std::fwrite(dumped.data(), 1, dumped.size(), stdout);
  };
  if (!batch) {
    std::string text(std::istreambuf_iterator<char>(std::cin), {});
    if (std::cin.bad()) return Fail(1, "error reading stdin");
    print(parse(text, file_tools));
    return 0;
  }
  std::string line;
  for (size_t n = 1; std::getline(std::cin, line); ++n) {
    absl::StatusOr<json> input = ParseJson(line, absl::StrCat("stdin line ", n));
    if (!input.ok()) return FailStatus(input.status());
    // A string, or {"output": string, "tools": list} (the tools of that output's request).
    if (input->is_object()) {
      const auto output = input->find("output");
      const auto tools = input->find("tools");
      if (output == input->end() || !output->is_string() || (tools != input->end() && !tools->is_array())) {
        return Fail(2, absl::StrCat("stdin line ", n, ": expected {\"output\": string, \"tools\": list}"));
      }
      print(parse(output->get_ref<const std::string&>(), tools == input->end() ? file_tools : *tools));
      std::fflush(stdout);
      continue;
    }
    if (!input->is_string()) return Fail(2, absl::StrCat("stdin line ", n, ": expected a JSON string"));
    print(parse(input->get<std::string>(), file_tools));
    std::fflush(stdout);
  }
  if (std::cin.bad()) return Fail(1, "error reading stdin");
  return 0;
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
  const std::string tool_calls = absl::GetFlag(FLAGS_parse_tool_calls);
  const std::string reasoning = absl::GetFlag(FLAGS_parse_reasoning);
  if (!tool_calls.empty() || !reasoning.empty()) {
    if (!checkpoint.empty() || !template_file.empty() || !messages.empty()) {
      return Fail(2,
                  "--parse-tool-calls and --parse-reasoning read stdin: give no --checkpoint, --template-file or "
                  "--messages");
    }
    return ParseOutputMain(tool_calls, reasoning, batch);
  }
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
    absl::StatusOr<std::string> text = strata::base::ReadRegularFile(messages, strata::base::kMaxConfigFileBytes);
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
