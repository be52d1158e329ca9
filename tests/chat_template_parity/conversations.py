"""The conversations every template is rendered with: what the issue lists (system prompts, multi-turn,
tool definitions, assistant tool calls and tool results, add_generation_prompt on and off,
continue_final_message, content as a list of text parts, documents) and text that stresses printing
(quotes, backslashes, newlines, non-ASCII, surrounding whitespace).

Each entry is the keyword arguments of `apply_chat_template(conversation, ...)` with the conversation
under "messages", exactly what `strata-chat-template --batch` reads on a line."""

from __future__ import annotations

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Temperature unit"},
            },
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What to look for"},
                "max_results": {"type": "integer", "description": "How many results"},
                "safe": {"type": "boolean", "description": "Safe search"},
                "tags": {"type": "array", "items": {"type": "string"}, "description": "Filters"},
            },
            "required": ["query"],
        },
    },
}

SYSTEM = {"role": "system", "content": "You are a helpful assistant. Answer briefly."}
USER_1 = {"role": "user", "content": "What is the capital of France?"}
ASSISTANT_1 = {"role": "assistant", "content": "The capital of France is Paris."}
USER_2 = {"role": "user", "content": "And of Germany?"}
TOOL_CALL = {
    "role": "assistant",
    "content": "",
    "tool_calls": [{"id": "call12345", "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}],
}
TOOL_RESULT = {"role": "tool", "tool_call_id": "call12345", "name": "get_weather",
               "content": '{"temperature": 21, "condition": "sunny"}'}

CONVERSATIONS: dict[str, dict] = {
    "single_user": {"messages": [USER_1]},
    "single_user_generation_prompt": {"messages": [USER_1], "add_generation_prompt": True},
    "system_user_generation_prompt": {"messages": [SYSTEM, USER_1], "add_generation_prompt": True},
    "multi_turn_generation_prompt": {"messages": [SYSTEM, USER_1, ASSISTANT_1, USER_2], "add_generation_prompt": True},
    "multi_turn_ends_with_assistant": {"messages": [USER_1, ASSISTANT_1, USER_2,
                                                    {"role": "assistant", "content": "Berlin."}]},
    "continue_final_message": {"messages": [SYSTEM, USER_1, {"role": "assistant", "content": "The capital is"}],
                               "continue_final_message": True},
    "tools_defined": {"messages": [SYSTEM, {"role": "user", "content": "What's the weather in Paris?"}],
                      "tools": [WEATHER_TOOL, SEARCH_TOOL], "add_generation_prompt": True},
    "tool_call_and_result": {"messages": [{"role": "user", "content": "What's the weather in Paris?"}, TOOL_CALL,
                                          TOOL_RESULT],
                             "tools": [WEATHER_TOOL], "add_generation_prompt": True},
    "tool_call_string_arguments": {
        "messages": [SYSTEM, {"role": "user", "content": "Search for jinja"},
                     {"role": "assistant", "content": "",
                      "tool_calls": [{"id": "abc123def", "type": "function",
                                      "function": {"name": "search",
                                                   "arguments": '{"query": "jinja", "max_results": 3}'}}]},
                     {"role": "tool", "tool_call_id": "abc123def", "content": "1. Jinja docs"},
                     {"role": "assistant", "content": "Here is what I found: Jinja docs."}],
        "tools": [SEARCH_TOOL]},
    "content_parts": {"messages": [{"role": "user", "content": [{"type": "text", "text": "Describe this."},
                                                                 {"type": "text", "text": "Be short."}]}],
                      "add_generation_prompt": True},
    "documents": {"messages": [USER_1],
                  "documents": [{"title": "Geography", "text": "Paris is the capital of France."},
                                {"title": "History", "text": "Paris was founded in the 3rd century BC."}],
                  "add_generation_prompt": True},
    "tricky_text": {"messages": [
        {"role": "system", "content": "  Padded system prompt with 'quotes' and \"double quotes\".\n"},
        {"role": "user", "content": "Ünïcödé ✓ 日本語 🙂\n\nback\\slash {{ not a tag }} {% neither %}\t"},
        {"role": "assistant", "content": "  spaces  \n"},
        {"role": "user", "content": "<|im_end|> </s> [INST] literal specials"}],
        "add_generation_prompt": True},
    "reasoning_content": {"messages": [USER_1, {"role": "assistant", "content": "Paris.",
                                                "reasoning_content": "The user asks about France."}, USER_2],
                          "add_generation_prompt": True},
    "thinking_disabled": {"messages": [SYSTEM, USER_1], "add_generation_prompt": True, "enable_thinking": False},
    # gpt-oss's template reads an assistant turn's analysis from "thinking" (transformers also passes
    # "reasoning_content" as is): a call made while thinking, its result, then the final answer.
    "thinking_tool_call_final": {"messages": [
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "thinking": "I should call get_weather.", "tool_calls": TOOL_CALL["tool_calls"]},
        TOOL_RESULT,
        {"role": "assistant", "content": "It is sunny, 21 °C.", "thinking": "The tool says sunny."}],
        "tools": [WEATHER_TOOL], "add_generation_prompt": False},
    "reasoning_tool_call_generation_prompt": {"messages": [
        SYSTEM, {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": "", "reasoning_content": "Weather lookup needed.",
         "tool_calls": TOOL_CALL["tool_calls"]},
        TOOL_RESULT], "tools": [WEATHER_TOOL], "add_generation_prompt": True},
    "no_system_multi_turn": {"messages": [USER_1, ASSISTANT_1, USER_2, {"role": "assistant", "content": "Berlin."},
                                          {"role": "user", "content": "Thanks!"}], "add_generation_prompt": False},
}
