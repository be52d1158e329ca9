"""The HTTP API at the byte level, with curl and raw sockets: SSE framing, OpenAI's error bodies for every
kind of bad request, the request-body and nesting limits, a disconnecting client (its generation cancelled
and its KV blocks freed at once), a client that stops reading (cut after a bounded buffer), and the drain."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
import urllib.request

import pytest

import generate_helpers as GH


def curl(url: str, *args: str, body: str | bytes | None = None) -> tuple[int, dict, str]:
    """(status, headers, body) of one curl call; `body` is POSTed as JSON."""
    cmd = ["curl", "-sS", "-N", "-D", "-", url, *args]
    data = None
    if body is not None:
        cmd += ["-H", "Content-Type: application/json", "--data-binary", "@-"]
        data = body.encode() if isinstance(body, str) else body
    out = subprocess.run(cmd, input=data, capture_output=True, timeout=60, check=True).stdout.decode()
    head, _, rest = out.partition("\r\n\r\n")
    lines = head.split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return status, headers, rest


def error_of(status_body: tuple[int, dict, str]) -> tuple[int, dict]:
    status, headers, body = status_body
    assert headers["content-type"] == "application/json"
    parsed = json.loads(body)
    assert list(parsed) == ["error"] and list(parsed["error"]) == ["message", "type", "param", "code"]
    return status, parsed["error"]


def test_sse_framing(http_server):
    status, headers, body = curl(f"{http_server.http_url}/v1/chat/completions", body=json.dumps({
        "model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "temperature": 0,
        "stream": True, "stream_options": {"include_usage": True}}))
    assert status == 200 and headers["content-type"] == "text/event-stream"
    assert headers.get("transfer-encoding") == "chunked"
    events = body.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert all(e.startswith("data: {") for e in events[:-2])
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5
    assert len({c["id"] for c in chunks}) == 1


@pytest.mark.parametrize("body, param, words", [
    ("{not json", None, "request body: not valid JSON"),
    ("[1, 2]", None, "request body: must be a JSON object"),
    ("[" * 65 + "]" * 65, None, "request body: JSON nests deeper than 64 levels"),
    ('{"prompt": 5}', "prompt", "must be a string or a list"),
    ('{"prompt": [1, "a"]}', "prompt[1]", "must be an integer"),
    ('{"prompt": "hi", "max_tokens": "3"}', "max_tokens", "must be an integer"),
    ('{"prompt": "hi", "stream_options": {"include_usage": true}}', "stream_options", "only with stream"),
    ('{"prompt": [[1], "a"]}', "prompt[1]", "all of one kind"),
    ('{"prompt": [999999]}', "prompt[0]", "outside the vocabulary"),
    ('{"prompt": "hi", "n": 0}', "n", "less than 1"),
    ('{"prompt": "hi", "n": 200}', "n", "more than the limit"),
    ('{"prompt": "hi", "stop": [""]}', "stop[0]", "empty"),
])
def test_bad_completion_bodies(http_server, body, param, words):
    status, error = error_of(curl(f"{http_server.http_url}/v1/completions", body=body))
    assert status == 400 and error["param"] == param and words in error["message"], error


@pytest.mark.parametrize("body, param, words", [
    ('{"messages": [{"content": "x"}]}', "messages[0].role", "missing"),
    ('{"messages": [{"role": "user", "content": 5}]}', "messages[0].content", "must be a string"),
    ('{"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}', "top_logprobs", "only with logprobs"),
    ('{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}]}',
     "tool_choice", "--tool-call-parser"),
    ('{"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema"}}',
     "response_format.json_schema", "missing"),
    ('{"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}', "tool_choice",
     "needs tools to call"),
    ('{"messages": [{"role": "assistant", "content": "x"}], "add_generation_prompt": true, '
     '"continue_final_message": true}', "continue_final_message", "cannot be true"),
])
def test_bad_chat_bodies(http_server, body, param, words):
    status, error = error_of(curl(f"{http_server.http_url}/v1/chat/completions", body=body))
    assert status == 400 and error["param"] == param and words in error["message"], error


def test_routes_methods_and_sizes(http_server):
    url = http_server.http_url
    status, error = error_of(curl(f"{url}/v2/nothing"))
    assert status == 404 and "/v1/completions" in error["message"]
    status, headers, _ = curl(f"{url}/v1/completions")
    assert status == 405 and headers["allow"] == "POST"
    status, error = error_of(curl(f"{url}/v1/completions", body=b'{"prompt": "' + b"a" * (5 << 20) + b'"}'))
    assert status == 413 and error["code"] == "request_too_large" and "--max-message-bytes" in error["message"]
    # The connection survives a refused request: the next one is answered.
    assert curl(f"{url}/health")[0] == 200
    status, _, body = curl(f"{url}/tokenize", body=json.dumps({"prompt": "round trip", "add_special_tokens": False}))
    tokens = json.loads(body)["tokens"]
    status, _, body = curl(f"{url}/detokenize", body=json.dumps({"tokens": tokens}))
    assert status == 200 and json.loads(body) == {"prompt": "round trip"}


def raw_stream(port: int, body: dict) -> socket.socket:
    """A socket that POSTed `body` to /v1/completions and read the response head."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    data = json.dumps(body).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
    return sock


def active(server) -> float:
    return GH.metric(server.metrics_url, "strata_active_sequences")


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_disconnects_frees_its_sequence_at_once(server_factory, chat_model, stream):
    server = server_factory(["--model", str(chat_model), "--served-model-name", "tiny-llama", "--max-context", "4096",
                             "--max-new-tokens", "4000"])
    cancelled = GH.metric(server.metrics_url, 'strata_requests_total{code="CANCELLED"}', default=0)
    sock = raw_stream(server.http_port, {"prompt": "a", "max_tokens": 4000, "temperature": 0, "stream": stream,
                                         "ignore_eos": True})
    assert GH.wait_metric(server.metrics_url, "strata_active_sequences", lambda v: v == 1) == 1
    if stream:
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
    sock.close()
    # The order is the check, not a clock (the gauge is sampled every 250 ms, and a busy machine slows the steps):
    # the sequence left before its 4000 tokens ran out. HttpGeneration::OnChunk counts every token the engine made
    # for it, delivered or not, and this server served nothing else.
    assert GH.wait_metric(server.metrics_url, "strata_active_sequences", lambda v: v == 0, timeout_s=60) == 0
    made = GH.metric(server.metrics_url, "strata_generated_tokens_total", default=0)
    print(f"\n{made:.0f} of 4000 tokens made before the sequence left")
    assert made < 4000, f"the sequence ran its {made:.0f} tokens out after the client left"
    assert GH.wait_metric(server.metrics_url, 'strata_requests_total{code="CANCELLED"}',
                          lambda v: v == cancelled + 1) == cancelled + 1


def test_a_client_that_stops_reading_is_cut(server_factory, chat_model):
    server = server_factory(["--model", str(chat_model), "--served-model-name", "tiny-llama", "--max-context", "8192",
                             "--max-new-tokens", "8000", "--max-stream-buffer-bytes", "65536"])
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", server.http_port))
    data = json.dumps({"prompt": "a", "max_tokens": 8000, "stream": True, "logprobs": 20, "temperature": 0,
                       "ignore_eos": True}).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + str(len(data)).encode() +
                 b"\r\n\r\n" + data)
    # Never read: the kernel's buffers fill (strata caps the socket's at 256 KiB), then strata's 64 KiB; the
    # generation is cancelled long before its 8000 tokens (each event carries 20 alternatives: ~1 KB).
    assert GH.wait_metric(server.metrics_url, 'strata_requests_total{code="RESOURCE_EXHAUSTED"}',
                          lambda v: v == 1, timeout_s=60) == 1
    assert GH.wait_metric(server.metrics_url, "strata_active_sequences", lambda v: v == 0) == 0
    generated = GH.metric(server.metrics_url, "strata_generated_tokens_total")
    assert generated < 4000
    sock.close()


def read_chunked_to_end(sock: socket.socket) -> bytes:
    received = b""
    while not received.endswith(b"0\r\n\r\n"):  # the chunked encoding's last chunk
        chunk = sock.recv(1 << 20)
        if not chunk:
            break
        received += chunk
    return received


@pytest.mark.parametrize("drain_timeout", ["60", "0.5"])
def test_drain_finishes_or_cuts_http_streams_and_refuses_new_requests(server_factory, chat_model, drain_timeout):
    server = server_factory(["--model", str(chat_model), "--served-model-name", "tiny-llama", "--drain-timeout",
                             drain_timeout, "--max-context", "8192", "--max-new-tokens", "8000"])
    # ~2,000 tokens a second here: 3000 (or 8000, to be cut) outlast the checks below.
    cut = drain_timeout != "60"
    sock = raw_stream(server.http_port, {"prompt": "a", "max_tokens": 8000 if cut else 3000, "temperature": 0,
                                         "stream": True, "ignore_eos": True})
    assert sock.recv(4096).startswith(b"HTTP/1.1 200")
    server.process.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    status, error = error_of(curl(f"{server.http_url}/v1/completions", body='{"prompt": "b", "max_tokens": 1}'))
    assert status == 503 and "draining" in error["message"]
    assert curl(f"{server.http_url}/health")[0] == 503
    received = read_chunked_to_end(sock)
    assert received.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")
    if cut:
        # The tokens before the cut reached the client; then an error event (503, as OpenAI shapes errors).
        assert b'"finish_reason":"length"' not in received
        assert b'"code":"service_unavailable"' in received and b"--drain-timeout ended this generation" in received
    else:
        assert b'"finish_reason":"length"' in received
    assert server.process.wait(timeout=30) == 0
    summary = "0 of 1 generations finished, 1 cut" if cut else "1 of 1 generations finished, 0 cut"
    assert summary in server.stderr_path.read_text()


def test_metrics_carry_the_api_label(http_server, stubs):
    url = http_server.metrics_url
    before = {api: GH.metric(url, f'strata_requests_total{{api="{api}",code="OK"}}') for api in ("grpc", "http")}
    ttft = GH.metric(url, 'strata_time_to_first_token_seconds_count{api="http"}')
    status, _, _ = curl(f"{http_server.http_url}/v1/completions", body='{"prompt": "a", "max_tokens": 3}')
    assert status == 200
    bad, _ = error_of(curl(f"{http_server.http_url}/v1/completions", body='{"prompt": "a", "max_tokens": -1}'))
    assert bad == 400
    assert GH.wait_metric(url, 'strata_requests_total{api="http",code="OK"}', lambda v: v == before["http"] + 1) == \
        before["http"] + 1
    assert GH.metric(url, 'strata_requests_total{api="http",code="INVALID_ARGUMENT"}') >= 1
    assert GH.metric(url, 'strata_time_to_first_token_seconds_count{api="http"}') == ttft + 1
    assert GH.metric(url, 'strata_inter_token_latency_seconds_count{api="http"}') >= 2
    GH.generate(stubs, http_server.channel, prompt_ids=[5, 6], max_new_tokens=2)
    assert GH.wait_metric(url, 'strata_requests_total{api="grpc",code="OK"}', lambda v: v == before["grpc"] + 1) == \
        before["grpc"] + 1
    assert GH.metric(url, 'strata_requests_total{api="http",code="OK"}') == before["http"] + 1


def test_n_samples_prefill_their_prompt_once(http_server):
    url = http_server.metrics_url
    hits = GH.metric(url, "strata_prefix_cache_hits_total")
    prompt = [(7 * i) % 250 + 3 for i in range(70)]  # 70 tokens: 4 whole blocks of 16
    status, _, body = curl(f"{http_server.http_url}/v1/completions", body=json.dumps(
        {"prompt": prompt, "max_tokens": 4, "n": 4, "temperature": 1, "seed": 3}))
    assert status == 200 and len(json.loads(body)["choices"]) == 4
    # The first sample prefilled all 70; the other three found its 4 whole blocks in the prefix cache.
    assert GH.wait_metric(url, "strata_prefix_cache_hits_total", lambda v: v >= hits + 3 * 64) >= hits + 3 * 64
