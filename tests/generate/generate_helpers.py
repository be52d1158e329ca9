"""Shared by the Generate tests: the 2-stage logical plan, the tokenizer the tests train, and calls that
collect one Generate stream."""

from __future__ import annotations

import json
import re
import time
import urllib.request

import grpc

import integration_helpers as IH

# Layers 0-1 (and the embedding) on logical GPU 0, layers 2-3, norm and head on logical GPU 1; both run
# on the CPU (--physical-devices), so a 2-stage pipeline is tested without a GPU.
TWO_STAGE_MAP = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": 0, "model.layers.2": 1,
                 "model.layers.3": 1, "model.norm": 1, "model.rotary_emb": 1, "lm_head": 1}
TWO_STAGE_FLAGS = ["--device-map", json.dumps(TWO_STAGE_MAP), "--physical-devices", "0=cpu,1=cpu",
                   "--max-memory", "0=1GiB,1=1GiB,cpu=1GiB"]


def generate(stubs, channel, timeout: float = 60, **fields) -> dict:
    """One Generate call read to its end: ids, text, logprobs, finish reason, usage, message count."""
    stub = stubs.strata_grpc.InferenceServiceStub(channel)
    out = {"ids": [], "text": "", "logprobs": [], "top": [], "messages": 0, "finish": None, "usage": None}
    for response in stub.Generate(stubs.strata.GenerateRequest(**fields), timeout=timeout):
        out["messages"] += 1
        out["ids"] += list(response.token_ids)
        out["text"] += response.text
        out["logprobs"] += [lp.logprob for lp in response.logprobs]
        out["top"] += [[(t.token_id, t.logprob) for t in lp.top_logprobs] for lp in response.logprobs]
        if response.finish_reason:
            out["finish"] = stubs.strata.GenerateResponse.FinishReason.Name(response.finish_reason)
            out["usage"] = (response.usage.prompt_tokens, response.usage.completion_tokens)
    return out


def parse_sample(sample: str) -> tuple[str, dict]:
    """'strata_requests_total{code="OK"}' -> ('strata_requests_total', {'code': 'OK'})."""
    name, _, labels = sample.partition("{")
    return name, dict(re.findall(r'(\w+)="([^"]*)"', labels))


def metric(url: str, sample: str, default: float | None = None) -> float:
    """The value of a sample on /metrics, named with some of its labels as Prometheus prints them:
    'strata_queue_depth', 'strata_requests_total{code="OK"}'. Samples whose labels include the given ones
    are summed, as PromQL's sum() would (strata_requests_total{code="OK"} counts both APIs, grpc and http).
    `default` when none is present (else a failure)."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    name, want = parse_sample(sample)
    total, found = 0.0, False
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        line_name, labels = parse_sample(key)
        if line_name == name and all(labels.get(k) == v for k, v in want.items()):
            total += float(value)
            found = True
    if not found and default is not None:
        return default
    assert found, f"{sample} is not on {url}"
    return total


def wait_metric(url: str, sample: str, predicate, timeout_s: float = 10.0) -> float:
    """The sample's value (0 while absent) once `predicate` holds for it, or after `timeout_s`: engine and
    stream gauges and counters are sampled a few times a second."""
    deadline = time.monotonic() + timeout_s
    value = metric(url, sample, default=0)
    while not predicate(value) and time.monotonic() < deadline:
        time.sleep(0.05)
        value = metric(url, sample, default=0)
    return value


def status_of(call_fn) -> tuple[grpc.StatusCode, str]:
    """Runs a call expected to fail and returns its status code and details."""
    try:
        call_fn()
    except grpc.RpcError as e:
        return e.code(), e.details()
    raise AssertionError("the call succeeded")


def big_zero_checkpoint(directory):
    """A Llama of about 200M parameters, all zero, in bfloat16: its load (a cast to float32 on the CPU)
    lasts long enough to be watched. Zeros keep writing it fast."""
    import torch
    from safetensors.torch import save_file

    hidden, inter, layers, vocab, heads, kv_heads = 1024, 4096, 8, 32000, 16, 4
    head_dim = hidden // heads
    config = dict(IH.SMALL_LLAMA_CONFIG, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=vocab, torch_dtype="bfloat16")
    (directory / "config.json").write_text(json.dumps(config))
    z = lambda *shape: torch.zeros(shape, dtype=torch.bfloat16)  # noqa: E731
    tensors = {"model.embed_tokens.weight": z(vocab, hidden), "model.norm.weight": z(hidden),
               "lm_head.weight": z(vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors.update({
            p + "self_attn.q_proj.weight": z(heads * head_dim, hidden),
            p + "self_attn.k_proj.weight": z(kv_heads * head_dim, hidden),
            p + "self_attn.v_proj.weight": z(kv_heads * head_dim, hidden),
            p + "self_attn.o_proj.weight": z(hidden, heads * head_dim),
            p + "mlp.gate_proj.weight": z(inter, hidden),
            p + "mlp.up_proj.weight": z(inter, hidden),
            p + "mlp.down_proj.weight": z(hidden, inter),
            p + "input_layernorm.weight": z(hidden),
            p + "post_attention_layernorm.weight": z(hidden),
        })
    save_file(tensors, str(directory / "model.safetensors"))
    return directory


def start_loading_server(server_bin, tmp_path, deadline_s: float = 60) -> IH.ServerProcess:
    """strata-server on big_zero_checkpoint (a load that lasts), started and returned as soon as its gRPC
    port accepts connections, i.e. while it loads. Plain connects, not a gRPC channel: a channel refused
    at first would back off for a second. The caller stops it."""
    import socket
    import subprocess
    import time

    model = big_zero_checkpoint(tmp_path)
    server = IH.ServerProcess(server_bin, ["--model", str(model), "--device-map", '{"": "cpu"}',
                                           "--dtype", "float32", "--max-batch", "1", "--max-context", "64"],
                              tmp_path / "logs")
    with open(server.stdout_path, "w") as out, open(server.stderr_path, "w") as err:
        server.process = subprocess.Popen(server.args, stdout=out, stderr=err)
    deadline = time.monotonic() + deadline_s
    while True:
        if server.process.poll() is not None or time.monotonic() > deadline:
            server.process.kill()
            raise AssertionError(f"the gRPC port never opened\n{server.output()}")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", server.grpc_port)) == 0:
                return server
        time.sleep(0.005)
