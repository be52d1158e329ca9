"""What one HTTP request may make the server do (issue 38): sizes whose product overflowed, JSON nested inside a
string, a response that would be built whole on the engine's output thread, fields strata does not read, and
the messages that named the wrong field. Each case failed (crashed, hung, answered wrongly or named the wrong
field) on the server before these checks; the server must answer 400 naming the field, and go on serving."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest


def post(url: str, body: dict | str) -> tuple[int, dict]:
    data = (body if isinstance(body, str) else json.dumps(body)).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def refused(url: str, body: dict | str) -> dict:
    status, answer = post(url, body)
    assert status == 400, (status, answer)
    return answer["error"]


def serving(http_server) -> bool:
    with urllib.request.urlopen(f"{http_server.http_url}/health", timeout=30) as response:
        return response.status == 200


@pytest.mark.parametrize("prompts, n", [
    (["a", "b", "c", "d"], 4611686018427387905),  # 4 x n wraps to 4 in 64 bits: was SIGSEGV, or 4 choices of prompt[0]
    (["a", "b"], 2**63 - 1),                       # 2 x n wraps to -2: was std::length_error, terminate
    ([[5], [6], [7]], 2**62),
])
def test_n_times_prompts_cannot_wrap_around(http_server, prompts, n):
    error = refused(f"{http_server.http_url}/v1/completions",
                    {"model": "tiny-llama", "prompt": prompts, "n": n, "max_tokens": 3})
    assert error["param"] == "n" and "more than the limit of 128" in error["message"], error
    assert serving(http_server)


def test_deep_json_inside_tool_call_arguments_is_refused(http_server):
    # 200 KB: 100,000 levels inside a string the body's own nesting check does not look into; parsed and
    # copied recursively, it overflowed the stack (the server died with nothing in its log).
    arguments = '{"a":' + "[" * 100000 + "]" * 100000 + "}"
    body = {"model": "tiny-llama", "max_tokens": 2, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}]}
    error = refused(f"{http_server.http_url}/v1/chat/completions", body)
    assert error["param"] == "messages[1].tool_calls[0].function.arguments", error
    assert "JSON nests deeper than 64 levels" in error["message"], error
    assert serving(http_server)


def test_shallow_tool_call_arguments_still_reach_the_template(http_server):
    body = {"model": "tiny-llama", "max_tokens": 2, "temperature": 0, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "f", "arguments": '{"a": [[1]], "b": "x"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}]}
    status, answer = post(f"{http_server.http_url}/v1/chat/completions", body)
    assert status == 200 and answer["usage"]["completion_tokens"] == 2, answer


def test_a_response_larger_than_the_cap_is_refused_before_it_runs(http_server):
    # n 128 x max_tokens 200 x (1 + logprobs 20) = 537,600 tokens listed, above the default 524,288.
    error = refused(f"{http_server.http_url}/v1/completions",
                    {"model": "tiny-llama", "prompt": "hello", "n": 128, "max_tokens": 200, "logprobs": 20})
    assert error["param"] == "max_tokens", error
    assert "537600 tokens" in error["message"] and "--max-response-tokens" in error["message"], error


@pytest.fixture(scope="module")
def capped_server(server_factory, chat_model):
    return server_factory(["--model", str(chat_model), "--served-model-name", "tiny-llama", "--max-context", "512",
                           "--max-batch", "8", "--max-response-tokens", "100"])


def test_echo_counts_the_prompt_against_the_cap(capped_server):
    url = f"{capped_server.http_url}/v1/completions"
    prompt = list(range(5, 45))  # 40 tokens
    # 2 x (40 + 1) x (1 + 1) = 164 > 100
    error = refused(url, {"model": "tiny-llama", "prompt": prompt, "n": 2, "echo": True, "logprobs": 1,
                          "max_tokens": 1})
    assert error["param"] == "max_tokens" and "164 tokens" in error["message"], error
    assert "prompt tokens + max_tokens" in error["message"], error
    # Without echo: 2 x 1 x 2 = 4.
    status, answer = post(url, {"model": "tiny-llama", "prompt": prompt, "n": 2, "logprobs": 1, "max_tokens": 1})
    assert status == 200 and len(answer["choices"]) == 2, answer


def test_chat_without_max_tokens_is_held_within_the_cap(capped_server):
    # No max_tokens: what the context leaves (512 - prompt), cut to 100 / (n 2 x (1 + top_logprobs 0)) = 50.
    status, answer = post(f"{capped_server.http_url}/v1/chat/completions",
                          {"model": "tiny-llama", "n": 2, "logprobs": True, "temperature": 0,
                           "messages": [{"role": "user", "content": "hi"}]})
    assert status == 200, answer
    assert [len(c["logprobs"]["content"]) for c in answer["choices"]] == [50, 50], answer
    assert all(c["finish_reason"] == "length" for c in answer["choices"]), answer


@pytest.mark.parametrize("route, body, param, words", [
    # OpenAI's rule: a field the server does not read is refused (vLLM would silently ignore it).
    ("completions", {"prompt": "hi", "guided_decoding_backend": "outlines"}, "guided_decoding_backend",
     "is not a field of /v1/completions"),
    ("chat", {"messages": [{"role": "user", "content": "x"}], "echo": True}, "echo",
     "is not a field of /v1/chat/completions"),
    ("completions", {"prompt": "hi", "suffix": "end"}, "suffix", "no fill-in-the-middle"),
    ("chat", {"messages": [{"role": "user", "content": "x"}], "response_format": "json_object"}, "response_format",
     "must be an object"),
    # Messages that named the wrong field.
    ("completions", {"prompt": [[]]}, "prompt[0]", "an empty list of token ids"),
    ("completions", {"prompt": ""}, "prompt", "empty: give text or token ids"),
    ("chat", {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
     "messages[0].content[0].text", "must be a string"),
    ("completions", {"prompt": "hi", "stream": True, "stream_options": {"include_usage": "yes"}},
     "stream_options.include_usage", "must be a boolean"),
])
def test_fields_strata_does_not_read_and_misnamed_fields(http_server, route, body, param, words):
    path = "/v1/completions" if route == "completions" else "/v1/chat/completions"
    error = refused(f"{http_server.http_url}{path}", {"model": "tiny-llama", **body})
    assert error["param"] == param and words in error["message"], error


def test_suffix_empty_or_null_and_text_response_format_are_accepted(http_server):
    status, answer = post(f"{http_server.http_url}/v1/completions",
                          {"model": "tiny-llama", "prompt": "hi", "suffix": None, "max_tokens": 1})
    assert status == 200, answer
    status, answer = post(f"{http_server.http_url}/v1/chat/completions",
                          {"model": "tiny-llama", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1,
                           "response_format": {"type": "text"}})
    assert status == 200, answer
