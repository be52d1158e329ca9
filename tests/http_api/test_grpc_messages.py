"""gRPC Generate's `messages` (rendered by the same chat template code as the HTTP API's chat) and its prompt
log-probabilities, against transformers; their errors name the message."""

from __future__ import annotations

import json
import math

import grpc
import pytest

import generate_helpers as GH

CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say something."}]


def messages(stubs, chat):
    return [stubs.strata.ChatMessage(**m) for m in chat]


def test_grpc_messages_equal_transformers_and_http_chat(stubs, http_server, client, reference):
    ids = reference.tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True, return_dict=False)
    want = reference.generate(ids, 10)
    got = GH.generate(stubs, http_server.channel, messages=messages(stubs, CHAT), max_new_tokens=10)
    assert got["ids"] == want["ids"]
    assert got["usage"] == (len(ids), 10)
    http = client.chat.completions.create(model="tiny-llama", messages=CHAT, max_tokens=10, temperature=0)
    assert got["text"] == http.choices[0].message.content


def test_grpc_tool_calls_tools_and_generation_prompt_reach_the_template(stubs, http_server, reference):
    chat = [{"role": "user", "content": "Time?"},
            {"role": "assistant", "content": "",
             "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "t", "arguments": "{}"}}]},
            {"role": "tool", "content": "noon", "tool_call_id": "call_1"}]
    # transformers' templates take the arguments as an object (strata parses the JSON text, as vLLM does).
    as_objects = [dict(m, tool_calls=[dict(c, function=dict(c["function"], arguments={})) for c in m["tool_calls"]])
                  if "tool_calls" in m else m for m in chat]
    ids = reference.tokenizer.apply_chat_template(as_objects, add_generation_prompt=False, tokenize=True,
                                                  return_dict=False)
    wire = [stubs.strata.ChatMessage(role=m["role"], content=m["content"], tool_call_id=m.get("tool_call_id", ""),
                                     tool_calls_json=json.dumps(m["tool_calls"]) if "tool_calls" in m else "")
            for m in chat]
    got = GH.generate(stubs, http_server.channel, messages=wire, add_generation_prompt=False, max_new_tokens=3)
    assert got["usage"] == (len(ids), 3)
    assert got["ids"] == reference.generate(ids, 3)["ids"]
    # Tools: Qwen3's tool preamble is longer than this server's 512-token limit, and the refusal counts
    # exactly the tokens transformers renders.
    tools = [{"type": "function", "function": {"name": "t", "description": "the time",
                                               "parameters": {"type": "object", "properties": {}}}}]
    with_tools = reference.tokenizer.apply_chat_template(as_objects, tools=tools, add_generation_prompt=False,
                                                         tokenize=True, return_dict=False)
    assert len(with_tools) > 512
    code, details = GH.status_of(lambda: GH.generate(stubs, http_server.channel, messages=wire, max_new_tokens=3,
                                                     tools_json=json.dumps(tools), add_generation_prompt=False))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details == f"messages: {len(with_tools)} tokens, more than the server's limit of 512 prompt tokens"


def test_grpc_prompt_logprobs_equal_transformers(stubs, http_server, reference):
    import torch
    ids = reference.tokenizer.encode("hello world, this is strata")
    with torch.no_grad():
        want = torch.log_softmax(reference.model(torch.tensor([ids])).logits[0].double(), -1)
    stub = stubs.strata_grpc.InferenceServiceStub(http_server.channel)
    for new_tokens in (0, 2):
        responses = list(stub.Generate(stubs.strata.GenerateRequest(prompt_ids=ids, max_new_tokens=new_tokens,
                                                                    prompt_logprobs=2), timeout=60))
        scored = [lp for r in responses for lp in r.prompt_logprobs]
        assert len(responses[0].prompt_logprobs) == len(ids) - 1 == len(scored)
        for i, lp in enumerate(scored, start=1):
            assert lp.token_id == ids[i]
            assert math.isclose(lp.logprob, want[i - 1, ids[i]].item(), abs_tol=1e-4)
            assert len(lp.top_logprobs) == 2 and lp.top_logprobs[0].logprob >= lp.top_logprobs[1].logprob
        assert sum(len(r.token_ids) for r in responses) == new_tokens


@pytest.mark.parametrize("fields, named", [
    ({"messages": [{"role": "user", "content": "x"}], "prompt": "y"}, "messages: give prompt, prompt_ids or messages"),
    ({"messages": [{"content": "x"}]}, "messages[0].role: missing"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls_json": "{"}]},
     "messages[0].tool_calls_json: not valid JSON"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls_json": "{}"}]},
     "messages[0].tool_calls_json: not a JSON list"),
    ({"messages": [{"role": "user", "content": "x"}], "tools_json": "[1"}, "tools_json: not valid JSON"),
    ({"messages": [{"role": "user", "content": "x"}], "tools_json": "{}"}, "tools_json: not a JSON list"),
    # JSON inside a string is parsed by the same bounded parser as a body: 100,000 levels are refused, not
    # copied recursively (which overflowed the stack).
    ({"messages": [{"role": "assistant", "content": "x",
                    "tool_calls_json": '[{"a":' + "[" * 100000 + "]" * 100000 + "}]"}]},
     "messages[0].tool_calls_json: JSON nests deeper than 64 levels"),
    ({"messages": [{"role": "user", "content": "x"}], "tools_json": "[" * 100000 + "]" * 100000},
     "tools_json: JSON nests deeper than 64 levels"),
    ({"prompt_ids": [5], "max_new_tokens": 0}, "max_new_tokens: must be at least 1"),
    ({"prompt_ids": [5], "prompt_logprobs": 21}, "top_logprobs: 21 is above the limit 20"),
])
def test_grpc_chat_errors_name_the_field(stubs, http_server, fields, named):
    wire = dict(fields)
    if "messages" in wire:
        wire["messages"] = [stubs.strata.ChatMessage(**m) for m in wire["messages"]]
    wire.setdefault("max_new_tokens", 2)
    code, details = GH.status_of(lambda: GH.generate(stubs, http_server.channel, **wire))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and named in details, details


def test_grpc_invalid_utf8_in_a_message_names_it(stubs, http_server):
    good = stubs.strata.GenerateRequest(messages=[stubs.strata.ChatMessage(role="user", content="ab")],
                                        max_new_tokens=1).SerializeToString()
    bad = good.replace(b"ab", b"a\xff")
    call = http_server.channel.unary_stream("/strata.v1.InferenceService/Generate",
                                            request_serializer=lambda b: b, response_deserializer=lambda b: b)
    with pytest.raises(grpc.RpcError) as caught:
        list(call(bad, timeout=30))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == "messages[0].content: invalid UTF-8 at byte 1"
