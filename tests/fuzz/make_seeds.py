"""Seed corpora for the libFuzzer harnesses, generated (nothing is committed but this script).

    python tests/fuzz/make_seeds.py HARNESS OUT_DIR

writes valid inputs for HARNESS (safetensors_header, config, tokenizer, device_map, generate_request,
chat_template, tool_calls, group_message) into
OUT_DIR, one file per seed, named after what it is. libFuzzer mutates from there: seeds that are real
(real model configs, tokenizers trained by the `tokenizers` library in each family's layout, requests
serialized by protobuf) reach the deep paths at once instead of after hours of guessing JSON.
"""

from __future__ import annotations

import copy
import hashlib
import hmac
import json
import pathlib
import random
import struct
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
HARNESSES = ["safetensors_header", "config", "tokenizer", "device_map", "generate_request", "http_request", "http_head",
             "chat_template",
             "tool_calls", "group_message", "group_handshake", "structured"]


def _safetensors(tensors: dict, metadata: dict | None = None, pad_to: int = 8, data_extra: int = 0) -> bytes:
    """A safetensors file: {name: (dtype, shape)} laid out back to back as the format's writer does."""
    sizes = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
             "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
    header: dict = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    offset = 0
    for name, (dtype, shape) in tensors.items():
        n = sizes[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % pad_to)  # the writer pads the header with spaces to 8 bytes
    return struct.pack("<Q", len(text)) + text + bytes(offset + data_extra)


def safetensors_header_seeds() -> dict[str, bytes]:
    layer = {
        "model.layers.0.self_attn.q_proj.weight": ("BF16", [8, 8]),
        "model.layers.0.self_attn.k_proj.weight": ("BF16", [4, 8]),
        "model.layers.0.mlp.down_proj.weight": ("BF16", [8, 16]),
        "model.layers.0.input_layernorm.weight": ("BF16", [8]),
    }
    seeds = {
        "empty_header.safetensors": _safetensors({}),
        "one_f32.safetensors": _safetensors({"weight": ("F32", [2, 3])}),
        "llama_layer.safetensors": _safetensors(layer, metadata={"format": "pt"}),
        "every_dtype.safetensors": _safetensors(
            {f"t_{d.lower()}": (d, [3, 2]) for d in ["BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16",
                                                     "BF16", "I32", "U32", "F32", "I64", "U64", "F64"]}),
        "scalar_and_empty.safetensors": _safetensors({"scalar": ("F32", []), "empty": ("F16", [0, 4]),
                                                      "vector": ("I64", [5])}),
        "unpadded_trailing_bytes.safetensors": _safetensors({"a": ("F16", [4])}, pad_to=1, data_extra=16),
    }
    # A real file from the safetensors library itself, when numpy is there.
    try:
        import numpy as np
        from safetensors.numpy import save

        seeds["library_written.safetensors"] = save(
            {"embed.weight": np.zeros((4, 2), dtype=np.float16), "norm.weight": np.ones((2,), dtype=np.float32)},
            metadata={"format": "np"})
    except ImportError:
        pass
    return seeds


def config_seeds() -> dict[str, bytes]:
    sys.path.insert(0, str(REPO / "tests" / "parity"))
    import parity_helpers  # the real configs the planner parity tests use

    configs = dict(parity_helpers.ALL_CONFIGS)
    # Small variants of each family (fast to plan, so the fuzzer spends its time on the parser), and the
    # optional fields each family reads.
    for name, config in list(parity_helpers.CONFIGS.items()):
        small = copy.deepcopy(config)
        small.update(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                     num_key_value_heads=2, vocab_size=256)
        small.pop("head_dim", None)
        configs[f"{name}-small"] = small
    qwen = copy.deepcopy(configs["Qwen2-0.5B-small"])
    qwen.update(use_sliding_window=True, max_window_layers=1, dtype="float16")
    configs["Qwen2-sliding"] = qwen
    llama = copy.deepcopy(configs["Llama-3.2-1B-small"])
    llama.update(head_dim=32, attention_bias=True, mlp_bias=True, model_type="llama", dtype="bfloat16")
    configs["Llama-head-dim-bias"] = llama
    mistral = copy.deepcopy(configs["Mistral-7B-v0.1-small"])
    del mistral["architectures"]  # model_type alone
    mistral["torch_dtype"] = "float32"
    configs["Mistral-model-type-only"] = mistral
    # Qwen3 / Qwen3-MoE / Mixtral: the parity suite's tiny trees (dense layers among sparse ones, biases,
    # the num_local_experts alias).
    import test_family_plan_parity_moe as moe

    configs.update(moe.TINY)
    # Quantized checkpoints (planner/quantization.h): each format's quantization_config on a small Llama.
    quantized = {
        "fp8": {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic",
                "modules_to_not_convert": ["lm_head"], "scale_fmt": "ue8m0"},
        "ct-w4a16": {"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head", "re:.*gate$"],
                     "quantization_status": "compressed", "sparsity_config": {}, "kv_cache_scheme": None,
                     "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None,
                                                   "weights": {"num_bits": 4, "type": "int", "symmetric": False,
                                                               "strategy": "group", "group_size": 128}}}},
        "awq": {"quant_method": "awq", "version": "gemm", "bits": 4, "group_size": 128, "zero_point": True},
        "gptq": {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": True, "sym": True,
                 "checkpoint_format": "gptq"},
    }
    for name, quantization in quantized.items():
        config = copy.deepcopy(configs["Llama-3.2-1B-small"])
        config["quantization_config"] = quantization
        configs[f"Llama-{name}"] = config
    return {f"{name}.json": json.dumps(c, indent=2).encode() for name, c in configs.items()}


def tokenizer_seeds() -> dict[str, bytes]:
    sys.path.insert(0, str(REPO / "tests" / "tokenizer_parity"))
    import tokenizer_fixtures as tf  # each family's layout, as the tokenizer parity tests train them

    rng = random.Random(7)
    # Little training text: vocabularies of a few hundred merges keep each seed near 20 KB, so that the
    # fuzzer loads thousands of tokenizers a second.
    train = [tf.make_line(rng, specials=False) for _ in range(25)]
    texts = [tf.make_line(random.Random(i)) for i in range(3)] + ["Hello world", "<s>[INST] hi [/INST]"]
    seeds = {}
    for i, (name, (build, string_merges)) in enumerate(tf.FAMILIES.items()):
        data = json.loads(build(train).to_str())
        if string_merges:
            tf._merges_as_strings(data)
        text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
        seeds[f"{name}.bin"] = text.encode() + b"\0" + texts[i % len(texts)].encode()
    return seeds


def device_map_seeds() -> dict[str, bytes]:
    # MAX_MEMORY \n INVENTORY \n PHYSICAL_DEVICES \n DEVICE_MAP (fuzz_device_map.cc); the model is a
    # 4-layer Llama with tied embeddings.
    layers = {f"model.layers.{i}": i % 2 for i in range(4)}
    manual = {"model.embed_tokens": 0, **layers, "model.norm": 1, "model.rotary_emb": 1, "lm_head": 0}
    cases = {
        "balanced_low_0": ("0=1MB,1=1MB,cpu=4MB", "0=2MiB,1=2MiB,cpu=8MiB", "0=cpu,1=cpu", "balanced_low_0"),
        "sequential_disk": ("0=300KB,cpu=600KB,disk=1TB", "cpu=64GiB", "0=cuda:0", "sequential"),
        "auto_inventory_only": ("", "0=79GiB,1=79GiB,cpu=200GiB", "0=cuda:0,1=cuda:0", "auto"),
        "balanced_units": ("0=1.5GiB,1=20GB,2=1024,cpu=2TiB", "", "0=cpu,1=cuda:1,2=cpu", "balanced"),
        "manual_whole_model": ("0=1GiB", "", "", json.dumps({"": 0})),
        "manual_layers": ("0=1GiB,1=1GiB,cpu=1GiB", "", "1=cpu", json.dumps(manual)),
        "manual_cpu_disk": ("", "", "", json.dumps({"model": "cpu", "lm_head": "disk"})),
        "manual_cuda_names": ("cuda:0=1GiB,cpu=1GiB", "", "", json.dumps({"model": "cuda:0", "lm_head": "cuda:0"})),
    }
    return {f"{name}.txt": "\n".join(parts).encode() for name, parts in cases.items()}


def generate_request_seeds() -> dict[str, bytes]:
    sys.path.insert(0, str(REPO / "clients" / "python"))
    from strata_client import stubs  # the proto compiled by grpcio-tools, as the Python client uses it

    pb2, _ = stubs()
    requests = {
        "text": pb2.GenerateRequest(prompt="hello world", max_new_tokens=16, add_special_tokens=True),
        "ids": pb2.GenerateRequest(prompt_ids=[1, 300, 42, 7], max_new_tokens=4, temperature=0.7, top_p=0.9,
                                   top_k=40, seed=1234),
        "sampling": pb2.GenerateRequest(prompt="hi", max_new_tokens=8, temperature=1.0, repetition_penalty=1.1,
                                        top_logprobs=5, request_id="req-1"),
        "stops": pb2.GenerateRequest(prompt="hello hello", max_new_tokens=32, stop=["\n", "hello", "</s>"]),
        "long_ids": pb2.GenerateRequest(prompt_ids=list(range(300)), max_new_tokens=1),
        "unicode": pb2.GenerateRequest(prompt="naïve café 你好 😀 <s>", max_new_tokens=2, add_special_tokens=False),
    }
    return {f"{name}.pb": r.SerializeToString() for name, r in requests.items()}


def http_request_seeds() -> dict[str, bytes]:
    # ROUTE_BYTE BODY (fuzz_http_request.cc): an even byte /v1/completions, an odd one /v1/chat/completions.
    completions = {
        "text": {"model": "fuzz", "prompt": "hello world", "max_tokens": 16, "temperature": 0},
        "lists": {"prompt": [[1, 300, 42], [7, 8]], "n": 2, "seed": 5, "stop": ["\n", "hello"], "logprobs": 3},
        "echo": {"prompt": "hi", "echo": True, "logprobs": 1, "max_tokens": 0},
        "sampling": {"prompt": "naïve café 你好 😀", "top_p": 0.9, "top_k": 40, "presence_penalty": 0.5,
                     "frequency_penalty": -0.5, "logit_bias": {"42": 5, "7": -100}, "min_tokens": 2,
                     "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True},
    }
    chats = {
        "chat": {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}],
                 "max_completion_tokens": 8, "logprobs": True, "top_logprobs": 2},
        "parts": {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                            {"type": "text", "text": "b"}]}],
                  "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
                  "tool_choice": "auto"},
        "continue": {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
                     "add_generation_prompt": False, "continue_final_message": True,
                     "chat_template_kwargs": {"enable_thinking": False}},
    }
    seeds = {f"completions-{k}.json": b"\x00" + json.dumps(v).encode() for k, v in completions.items()}
    seeds.update({f"chat-{k}.json": b"\x01" + json.dumps(v).encode() for k, v in chats.items()})
    return seeds


def http_head_seeds() -> dict[str, bytes]:
    # What a client sends on the HTTP API's port (fuzz_http_head.cc): whole requests, pipelined ones, cut
    # ones, and each framing the server must refuse.
    body = b'{"prompt": "hello", "max_tokens": 4}'
    length = str(len(body)).encode()
    post = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    return {
        "get.http": b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
        "get-1.0.http": b"GET /v1/models HTTP/1.0\r\n\r\n",
        "head.http": b"HEAD /health?x=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        "post.http": post + b"Content-Length: " + length + b"\r\n\r\n" + body,
        "chunked.http": post + b"Transfer-Encoding: chunked\r\n\r\n" + hex(len(body))[2:].encode() + b"\r\n" + body
        + b"\r\n0\r\nX-Trailer: 1\r\n\r\n",
        "expect.http": post + b"Expect: 100-continue\r\nContent-Length: " + length + b"\r\n\r\n" + body,
        "stream.http": b"POST /stream HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
        "pipelined.http": b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n" + post + b"Content-Length: " + length + b"\r\n\r\n"
        + body + b"GET /stream/b HTTP/1.1\r\nHost: x\r\n\r\n",
        "two-lengths.http": post + b"Content-Length: " + length + b"\r\nContent-Length: 5\r\n\r\n" + body,
        "same-lengths.http": post + b"Content-Length: " + length + b"\r\ncontent-length:  " + length + b"\r\n\r\n" + body,
        "te-and-length.http": post + b"Transfer-Encoding: chunked\r\nContent-Length: " + length + b"\r\n\r\n" + body,
        "te-gzip.http": post + b"Transfer-Encoding: gzip\r\n\r\n" + body,
        "too-large.http": post + b"Content-Length: 99999\r\n\r\n" + body,
        "folded.http": b"GET / HTTP/1.1\r\nHost: x\r\nX-Folded: a\r\n b\r\n\r\n",
        "cut-head.http": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le",
        "cut-body.http": post + b"Content-Length: " + length + b"\r\n\r\n" + body[:7],
    }


def chat_template_seeds() -> dict[str, bytes]:
    # TEMPLATE \0 CONTEXT_JSON (fuzz_chat_template.cc): the parity suite's real templates, each with two of
    # its conversations (tool calls and results; text parts and documents), plus small templates that
    # reach the rest of the engine (macros, call blocks, namespaces, filters, slices, errors).
    sys.path.insert(0, str(REPO / "tests" / "chat_template_parity"))
    import conversations as conv  # the conversations the parity tests render

    special = {"bos_token": "<s>", "eos_token": "</s>"}
    contexts = [conv.CONVERSATIONS["tool_call_and_result"], conv.CONVERSATIONS["content_parts"],
                conv.CONVERSATIONS["continue_final_message"], conv.CONVERSATIONS["documents"]]
    seeds = {}
    templates = sorted((REPO / "tests" / "chat_template_parity" / "templates").glob("*.jinja"))
    for i, path in enumerate(templates):
        for j in range(2):
            context = {**special, **contexts[(i + j) % len(contexts)]}
            seeds[f"{path.stem}-{j}.bin"] = path.read_bytes() + b"\0" + json.dumps(context).encode()
    small = {
        "macro_call": "{% macro m(a, b=2) %}[{{ a }}{{ b }}{{ caller() }}]{% endmacro %}{% call m(1) %}x{% endcall %}",
        "namespace_loop": "{% set ns = namespace(n=0) %}{% for m in messages if m.role %}{% set ns.n = ns.n + 1 %}"
                          "{{ loop.index }}{{ loop.cycle('a', 'b') }}{% endfor %}{{ ns.n }}",
        "filters": "{{ messages|map(attribute='role')|join(', ')|upper }}{{ messages|tojson(indent=2) }}"
                   "{{ messages[::-1]|selectattr('role', 'eq', 'user')|list|length }}{{ 'a b'.split()|sort }}",
        "errors": "{% if messages|length > 1 %}{{ raise_exception('too many') }}{% endif %}{{ x.y.z }}",
        "whitespace": "  {%- for m in messages -%}\n  {{ m.content | trim }}\n{%+ endfor %}{# c #}{% raw %}{{ }}{% endraw %}",
    }
    context = json.dumps({**special, **conv.CONVERSATIONS["multi_turn_generation_prompt"]}).encode()
    for name, source in small.items():
        seeds[f"{name}.bin"] = source.encode() + b"\0" + context
    return seeds


def tool_calls_seeds() -> dict[str, bytes]:
    # CONTROL_BYTE MODEL_OUTPUT (fuzz_tool_calls.cc): bits 0-2 pick hermes, llama3_json, deepseek_v3, kimi_k2,
    # glm45, minimax_m2 or openai, bits 3-5 the reasoning parser before it (none, deepseek_r1, qwen3, qwen3 with
    # thinking off, glm45, gpt_oss), bits 6-7 seed the chunking. Outputs shaped as Qwen2.5/Qwen3, Llama 3.1,
    # DeepSeek-V3/R1, Kimi K2, GLM-4.6, MiniMax-M2 and gpt-oss write them, whole and cut.
    weather = {"name": "get_weather", "arguments": {"city": "東京", "unit": "celsius", "days": [1, 2.5, -0.0],
                                                    "opts": {"s": "a\"b</tool_call>\n", "n": None, "t": True}}}
    call = json.dumps(weather, ensure_ascii=False)
    hermes = {
        "single": f"<tool_call>\n{call}\n</tool_call>",
        "parallel": f"I'll check.\n\n<tool_call>\n{call}\n</tool_call>\n<tool_call>\n"
                    f"{json.dumps({'name': 'now', 'arguments': {}})}\n</tool_call>",
        "thinking": f"<think>\nhmm\n</think>\n\n<tool_call>\n{call}\n</tool_call>",
        "truncated": f"<tool_call>\n{call}\n</tool_call>\n<tool_call>\n{call[:40]}",
        "unclosed": f"<tool_call>\n{call}",
        "prose": "Use the <tool_call> tag. <tool_",
        "qwen35": "I need the weather.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
                  "</parameter>\n</function>\n</tool_call>",
    }
    params = json.dumps({"name": "search", "parameters": {"q": "llama 😀", "k": 1e-7}}, ensure_ascii=True)
    llama = {
        "single": f"<|python_tag|>{params}",
        "several": f"{params}; {call}; {params}",
        "leading": f"Calling now. {params}",
        "code": "int main() {\n  return 0;\n}",
        "truncated": f"{params}; {params[:30]}",
        "adjacent": f"{params}{params}",
    }
    args = json.dumps(weather["arguments"], ensure_ascii=False)

    def deepseek_call(name: str, arguments: str, kind: str = "function") -> str:
        return f"<｜tool▁call▁begin｜>{kind}<｜tool▁sep｜>{name}\n```json\n{arguments}\n```<｜tool▁call▁end｜>"

    deepseek_section = ("<｜tool▁calls▁begin｜>" + deepseek_call("get_weather", args) + deepseek_call("now", "{}") +
                        "<｜tool▁calls▁end｜>")
    deepseek = {
        "r1": "Okay, the weather.\n</think>\n\nLet me check." + deepseek_section,
        "single": "<｜tool▁calls▁begin｜>" + deepseek_call("get_weather", args) + "<｜tool▁calls▁end｜>",
        "truncated": deepseek_section[:120],
        "type": "<｜tool▁calls▁begin｜>" + deepseek_call("f", "{}", "tool"),
        "multiline": "<｜tool▁calls▁begin｜>" + deepseek_call("f", '{\n  "a": 1\n}'),
    }

    def kimi_call(call_id: str, arguments: str) -> str:
        return f"<|tool_call_begin|>{call_id}<|tool_call_argument_begin|>{arguments}<|tool_call_end|>"

    kimi_section = ("<|tool_calls_section_begin|>" + kimi_call("functions.get_weather:0", args) +
                    kimi_call(" functions.now:1 ", " {} ") + "<|tool_calls_section_end|>")
    kimi = {
        "several": "I'll check." + kimi_section,
        "thinking": "<think>\nhmm\n</think>\n" + kimi_section,
        "truncated": kimi_section[:90],
        "bad-id": "<|tool_calls_section_begin|>" + kimi_call("functions.f", "{}") + kimi_call("g:1", "{}"),
    }
    def glm_call(name: str, pairs: list[tuple[str, str]]) -> str:
        return (f"<tool_call>{name}\n" + "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n"
                                                 for k, v in pairs) + "</tool_call>")

    glm_weather = glm_call("get_weather", [("city", "東京"), ("days", "3"), ("ratio", "(1, 2.5)"), ("metric", "True")])
    glm = {
        "thinking": "\n<think>The user wants the weather.</think>\n" + glm_weather,
        "several": "Sure.\n" + glm_weather + "\n" + glm_call("now", []),
        "literals": glm_call("f", [("a", "{'k': [1, None]}"), ("b", "0x1F"), ("c", "1+2j"), ("c", "b'x'")]),
        "truncated": glm_weather[:60],
        "nested-key": "<tool_call>f\n<arg_key>a</arg_key>\n<arg_key>b</arg_key>\n<arg_value>1</arg_value></tool_call>",
    }

    def minimax_invoke(name: str, pairs: list[tuple[str, str]]) -> str:
        return (f'<invoke name="{name}">\n' + "".join(f'<parameter name="{k}">{v}</parameter>\n' for k, v in pairs) +
                "</invoke>\n")

    minimax_calls = ("<minimax:tool_call>\n" + minimax_invoke("get_weather", [("city", "Paris"), ("days", "3"),
                                                                               ("ratio", "2.0"), ("metric", "yes"),
                                                                               ("when", "none"), ("unit", "1")]) +
                     minimax_invoke("other", [("x", "[1, 2]")]) + "</minimax:tool_call>")
    minimax = {
        "thinking": "The user wants the weather.\n</think>\n\n" + minimax_calls,
        "single": minimax_calls,
        "inf": "<minimax:tool_call>\n" + minimax_invoke("get_weather", [("ratio", "inf")]) + "</minimax:tool_call>",
        "truncated": minimax_calls[:90],
    }
    analysis = "<|channel|>analysis<|message|>The user wants the weather.<|end|>"
    harmony_call = ("<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
                    + args + "<|call|>")
    harmony = {
        "call": analysis + harmony_call,
        "template-call": analysis + "<|start|>assistant to=functions.get_weather<|channel|>commentary json"
                         "<|message|>" + args + "<|call|>",
        "final": analysis + "<|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>",
        "preamble": analysis + "<|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>" + harmony_call,
        "cut": (analysis + "<|start|>assistant<|channel|>final<|message|>It is sunny.")[:-5],
        "bad-header": analysis + "<|start|>bogus<|message|>x<|end|>",
    }
    seeds = {}
    for control, (prefix, outputs) in enumerate([("hermes", hermes), ("llama", llama), ("deepseek", deepseek),
                                                 ("kimi", kimi), ("glm", glm), ("minimax", minimax),
                                                 ("harmony", harmony)]):
        for name, text in outputs.items():
            for reasoning in (0, 1, 2, 3, 4, 5):
                for chunking in (0, 2):
                    control_byte = control | reasoning << 3 | chunking << 6
                    seeds[f"{prefix}-{name}-r{reasoning}-{chunking}.bin"] = bytes([control_byte]) + text.encode()
    return seeds


def group_message_seeds() -> dict[str, bytes]:
    # KIND_BYTE MESSAGE (fuzz_group_message.cc): one valid message of each kind, laid out as
    # runtime/executor/group_wire.cc writes them (little-endian fixed widths, uint64 lengths before elements).
    def u8(v): return struct.pack("<B", v)
    def i32(v): return struct.pack("<i", v)
    def u32(v): return struct.pack("<I", v)
    def i64(v): return struct.pack("<q", v)
    def u64(v): return struct.pack("<Q", v)
    def f32(v): return struct.pack("<f", v)
    def f64(v): return struct.pack("<d", v)
    def text(b: bytes): return u64(len(b)) + b
    def vec(fmt, values): return u64(len(values)) + b"".join(struct.pack("<" + fmt, v) for v in values)

    row = (vec("i", [3, 4]) + i64(16) + vec("i", [11, 12]) + u8(1) + f32(0.7) + i32(5) + f32(0.9) + f32(1.1) +
           f32(0.2) + f32(0.3) + u64(1) + i32(2) + f32(-1.5) + f64(0.25) + i32(3) + u8(1) + vec("i", [-1, 7]) + u64(42) +
           vec("i", [1, 2]) +
           vec("i", [2]) + u8(1) + i32(-1) + vec("i", []) + i64(18))
    work = u64(7) + u64(1) + row + vec("Q", [5])
    activation = struct.pack("<4f", 0.5, -1.0, 2.0, 0.0)
    hop = u32(1) + work + i32(6) + vec("q", [1, 2, 2]) + u64(len(activation)) + activation
    token = i32(5) + f64(-0.25) + u64(1) + i32(5) + f64(-0.25)
    result = (u64(7) + u64(2) + u8(1) + token + u8(0) + u64(0) + i32(14) + text(b"node 1 is gone") + text(b"1") +
              text(b"1") + u8(1) + u64(1) + i32(13) + text(b"not finite") + text(b"1") + text(b"1"))
    join = vec("q", [100, 200]) + vec("q", [150, 250]) + vec("B", [1, 0]) + i64(4096) + u8(1) + i32(12080) + i32(41000)
    plan = (text(b'{"model.embed_tokens": 0, "model.layers.0": 1, "lm_head": 0}') + vec("i", [0, 1]) +
            text(b"bfloat16") + i64(64) + i64(16) + i64(8) + i64(2048) + u64(2) + text(b"") + text(b"10.0.0.2:41000"))
    heartbeat = (u64(1) + i32(1) + i32(0) + u64(3) + u64(4096) + f64(0.5) + u64(1) + text(b"1") + text(b"cuda:0") +
                 i64(10) + i64(20) + i64(80) + i64(60))
    return {"hop.bin": u8(0) + hop, "result.bin": u8(1) + result, "join.bin": u8(2) + join, "plan.bin": u8(3) + plan,
            "heartbeat.bin": u8(4) + heartbeat}


def structured_seeds() -> dict[str, bytes]:
    # CONTROL_BYTE TEXT (fuzz_structured.cc): bits 0-2 the kind (0 json_schema, 1 regex, 2 choice, 3 grammar,
    # 4 structural_tag, 5 json_object), bit 3 strict, bit 4 any_whitespace, bits 5-7 the walk's seed.
    person = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 130},
                                               "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
              "required": ["name", "age"], "additionalProperties": False}
    ref = {"$defs": {"p": {"type": "object", "properties": {"x": {"type": "number"}}}},
           "type": "array", "items": {"$ref": "#/$defs/p"}, "minItems": 1, "maxItems": 2}
    any_of = {"anyOf": [{"type": "string", "pattern": "^[a-z]+$"}, {"type": "null"}, {"type": "boolean"}]}
    refused = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
    tag = {"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": ["<f>"], "tags": [
        {"begin": "<f>", "content": {"type": "json_schema", "json_schema": {"type": "object"}}, "end": "</f>"}]}}
    seeds = {
        "schema-person": bytes([8 | 16]) + json.dumps(person).encode(),
        "schema-person-compact": bytes([8 | 32]) + json.dumps(person).encode(),
        "schema-ref": bytes([8 | 64]) + json.dumps(ref).encode(),
        "schema-anyof": bytes([8]) + json.dumps(any_of).encode(),
        "schema-refused": bytes([8]) + json.dumps(refused).encode(),
        "schema-not-strict": bytes([0]) + json.dumps(refused).encode(),
        "regex-date": bytes([1]) + rb"\d{4}-\d{2}-\d{2}",
        "regex-alt": bytes([1 | 32]) + rb"(yes|no|maybe)!?",
        "choice": bytes([2]) + b"red\ngreen\nblue",
        "grammar-list": bytes([3]) + b'root ::= "[" item ("," item)* "]"\nitem ::= [a-z]+',
        "grammar-expr": bytes([3 | 64]) + b'root ::= expr\nexpr ::= term (("+" | "-") term)*\nterm ::= [0-9]+ | "(" expr ")"',
        "structural-tag": bytes([4]) + json.dumps(tag).encode(),
        "json-object": bytes([5 | 16]),
    }
    return {name + ".bin": value for name, value in seeds.items()}


def group_handshake_seeds() -> dict[str, bytes]:
    # MODE CHUNK BYTES (fuzz_group_handshake.cc): honest transcripts of transport/group_handshake.cc's frames
    # with the harness's fixed nonces and secret (MACs included, so every step is reachable), and strangers' bytes.
    secret, a, b = b"the group secret, 16+ bytes", b"A" * 32, b"B" * 32
    def be32(v): return struct.pack(">I", v)
    def field(v: bytes): return be32(len(v)) + v
    def frame(step: int, body: bytes): return be32(1 + len(body)) + bytes([step]) + body
    def mac(label: bytes, rest: bytes): return hmac.new(secret, label + a + b + be32(1) + rest, hashlib.sha256).digest()
    facts = field(b"strata version") + field(b"fuzz") + field(b"model") + field(b"sha256:aa")
    other_facts = field(b"strata version") + field(b"fuzz") + field(b"model") + field(b"sha256:bb")
    hello = frame(1, field(b"strata-group-v2") + field(a) + field(be32(0)))
    auth = frame(2, field(be32(1)) + field(b) + field(mac(b"strata-group-v2 connect", b"")))
    def sealed(step: int, label: bytes, side: int, fact_fields: bytes) -> bytes:
        rest = field(bytes([ord("a") + side]) * 64) + field(struct.pack(">Q", 0x1000 + side)) + fact_fields
        return frame(step, field(mac(label, rest)) + rest)
    accept = sealed(3, b"strata-group-v2 accept", 0, facts)
    facts_frame = sealed(5, b"strata-group-v2 facts", 1, facts)
    ready, refuse = frame(6, b""), frame(4, field(b"the group secret differs"))
    return {
        "stranger-16-ff.bin": bytes([0, 255]) + b"\xff" * 16,
        "stranger-ucx-tcp-magic.bin": bytes([0, 255]) + bytes.fromhex("78563412bebafeca") + b"\xff" * 64,
        "acceptor-whole.bin": bytes([0, 255]) + auth + facts_frame,
        "acceptor-split.bin": bytes([0, 2]) + auth + facts_frame,
        "connector-whole.bin": bytes([1, 255]) + hello + accept + ready,
        "connector-refused.bin": bytes([1, 255]) + hello + refuse,
        "acceptor-facts.bin": bytes([2, 255]) + facts_frame,
        "acceptor-other-facts.bin": bytes([2, 255]) + sealed(5, b"strata-group-v2 facts", 1, other_facts),
        "connector-accept.bin": bytes([3, 255]) + accept + ready,
        "connector-other-facts.bin": bytes([3, 7]) + sealed(3, b"strata-group-v2 accept", 0, other_facts) + refuse,
    }


def seeds_for(harness: str) -> dict[str, bytes]:
    return globals()[f"{harness}_seeds"]()


def main() -> int:
    if len(sys.argv) != 3 or sys.argv[1] not in HARNESSES:
        print(f"usage: make_seeds.py {{{','.join(HARNESSES)}}} OUT_DIR", file=sys.stderr)
        return 2
    out = pathlib.Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    for name, data in seeds_for(sys.argv[1]).items():
        (out / name).write_bytes(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
