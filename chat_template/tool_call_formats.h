#pragma once
// The tool-call formats that live in files of their own, as tool_calls.cc calls them (not a public header).
// Each returns false where vLLM's extract_tool_calls returns no calls (tools_called False: the output is all
// content); else the calls and where the content ends (the content is the text before `content_end`).

#include <cstddef>
#include <string_view>
#include <vector>

#include "chat_template/tool_calls.h"
#include "nlohmann/json.hpp"

namespace strata::chat_template {

// glm45_tool_calls.cc: vLLM's Glm4MoeModelToolParser.
bool ParseGlm45(std::string_view text, const nlohmann::ordered_json& tools, std::vector<ToolCall>& calls,
                size_t& content_end);

// minimax_m2_tool_calls.cc: vLLM's MinimaxM2ToolParser.
bool ParseMinimaxM2(std::string_view text, const nlohmann::ordered_json& tools, std::vector<ToolCall>& calls,
                    size_t& content_end);

// The request's tool named `name` as vLLM's pydantic model reads it ({"type": "function", "function": {"name",
// "parameters"}}): its function's "parameters", or null (no such tool, or no parameters); `found` tells
// the two apart. Tools that pydantic would refuse (vLLM answers those requests with an error) match no name.
const nlohmann::ordered_json* ToolParameters(const nlohmann::ordered_json& tools, std::string_view name, bool& found);

// Python's `key in container` for a JSON value: a dict's keys, a list's items, a string's substrings; the
// other kinds raise TypeError (*type_error).
bool PyContains(const nlohmann::ordered_json& container, std::string_view key, bool& type_error);

}  // namespace strata::chat_template
