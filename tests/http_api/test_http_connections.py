"""The HTTP API's connections under abuse (server/README.md, "Connection limits and deadlines"): clients that
trickle their request (slowloris) are closed at --http-read-timeout, clients that close a half-sent request
are released at once, one address holds at most --http-max-connections-per-peer, a port whose slots are all
taken still answers /health on the metrics port, every refusal and drop is counted in
strata_http_connections_dropped_total; a client that half-closes after its request (shutdown(SHUT_WR))
still gets its answer, and a request whose framing two parsers could read differently is refused (400).

Every server here runs on loopback, where all clients share one address: the tests set the per-peer cap
themselves. Bounds are generous and the checks wait on state (a refused connection, a counter), not on time,
for a loaded 2-core machine."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request

import pytest

import generate_helpers as GH

DROPPED = "strata_http_connections_dropped_total"
READ_TIMEOUT = 3  # --http-read-timeout of the slots server


@pytest.fixture(scope="module")
def slots_server(server_factory, chat_model):
    """320 connection slots (--max-streams 64 + 256), no per-peer cap, a 3 s read deadline."""
    return server_factory(["--model", str(chat_model), "--served-model-name", "tiny-llama", "--max-context", "512",
                           "--max-streams", "64", "--http-max-connections-per-peer", "0",
                           "--http-read-timeout", str(READ_TIMEOUT)])


def health(server, port: int | None = None, timeout: float = 5) -> int | None:
    """GET /health on the API port (or `port`): its status, None when the connection fails or times out."""
    url = f"http://127.0.0.1:{port or server.http_port}/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code
    except (OSError, urllib.error.URLError):
        return None


def wait_health(server, timeout_s: float) -> int | None:
    deadline = time.monotonic() + timeout_s
    status = health(server)
    while status != 200 and time.monotonic() < deadline:
        time.sleep(0.2)
        status = health(server)
    return status


def dropped(server, reason: str) -> float:
    return GH.metric(server.metrics_url, f'{DROPPED}{{reason="{reason}"}}')


def closed_by_server(sock: socket.socket, timeout_s: float) -> bool:
    """Whether the server closes `sock` (EOF or reset) within `timeout_s`, discarding what it sends."""
    sock.settimeout(timeout_s)
    try:
        while sock.recv(4096):
            pass
        return True
    except ConnectionResetError:
        return True
    except (socket.timeout, TimeoutError):
        return False


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=30)


def test_slowloris_is_closed_at_the_read_deadline(slots_server):
    """Every slot held by a client sending one header line a second: MHD's idle timeout (reset by each byte)
    would keep them for ever; the read deadline, counted from the accept, closes them and /health answers."""
    before = dropped(slots_server, "read_timeout")
    slow = []
    for _ in range(320):
        sock = connect(slots_server.http_port)
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        slow.append(sock)
    # Meanwhile the API port has no slot left; the metrics port's /health answers.
    assert health(slots_server, port=slots_server.metrics_port) == 200
    deadline = time.monotonic() + 30
    open_ = list(slow)
    i = 0
    while open_ and time.monotonic() < deadline:
        still = []
        for sock in open_:
            try:
                sock.sendall(f"X-Slow-{i}: 1\r\n".encode())
                still.append(sock)
            except OSError:
                sock.close()
        open_ = still
        i += 1
        time.sleep(1)
    assert not open_, f"{len(open_)} of 320 trickling connections still open after 30 s"
    assert wait_health(slots_server, 20) == 200
    assert GH.wait_metric(slots_server.metrics_url, f'{DROPPED}{{reason="read_timeout"}}',
                          lambda v: v >= before + 320) >= before + 320
    for sock in slow:
        sock.close()


def test_half_sent_then_closed_requests_are_released_at_once(slots_server):
    """600 requests cut in their body, then closed: each connection is released when its client's FIN comes
    (MHD's edge-triggered loop alone missed it and held it in CLOSE-WAIT until the idle timeout)."""
    timeouts = dropped(slots_server, "read_timeout")
    body = json.dumps({"prompt": "a", "max_tokens": 1}).encode()
    for _ in range(600):
        sock = connect(slots_server.http_port)
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body[:5])
        sock.close()
    # Well before the 3 s read deadline (or the 60 s idle timeout) would free them: released, not timed out.
    assert wait_health(slots_server, 10) == 200
    assert dropped(slots_server, "read_timeout") == timeouts


def test_health_on_the_metrics_port_answers_while_every_api_slot_is_taken(slots_server):
    refused = dropped(slots_server, "connection_limit")
    idle = [connect(slots_server.http_port) for _ in range(320)]
    # The port's slots are all taken once a connection beyond them is refused (closed at accept, counted).
    extra = connect(slots_server.http_port)
    assert closed_by_server(extra, 10)
    extra.close()
    assert GH.wait_metric(slots_server.metrics_url, f'{DROPPED}{{reason="connection_limit"}}',
                          lambda v: v >= refused + 1) >= refused + 1
    assert health(slots_server) != 200
    assert health(slots_server, port=slots_server.metrics_port) == 200
    # The idle connections never send a request: closed at the read deadline, after which the API answers.
    assert all(closed_by_server(sock, READ_TIMEOUT + 20) for sock in idle)
    assert wait_health(slots_server, 20) == 200
    for sock in idle:
        sock.close()


def test_one_address_holds_at_most_its_cap(server_factory, chat_model):
    server = server_factory(["--model", str(chat_model), "--served-model-name", "tiny-llama", "--max-context", "512",
                             "--http-max-connections-per-peer", "4"])
    held = [connect(server.http_port) for _ in range(4)]
    extra = connect(server.http_port)
    assert closed_by_server(extra, 10)
    extra.close()
    assert GH.wait_metric(server.metrics_url, f'{DROPPED}{{reason="peer_limit"}}', lambda v: v >= 1) == 1
    assert health(server) is None  # the address's fifth connection, refused too
    assert health(server, port=server.metrics_port) == 200
    for sock in held:
        sock.close()
    # Closed connections give their place back.
    assert wait_health(server, 20) == 200


def half_closed_exchange(port: int, body: dict) -> tuple[int, bytes]:
    """POST `body` to /v1/completions, shutdown(SHUT_WR), read to EOF: (final status, body bytes). Interim 1xx
    responses are skipped, as every HTTP/1.1 client does."""
    sock = connect(port)
    data = json.dumps(body).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
    sock.shutdown(socket.SHUT_WR)
    received = b""
    while chunk := sock.recv(1 << 16):
        received += chunk
    sock.close()
    while received.startswith(b"HTTP/1.1 1"):
        received = received.partition(b"\r\n\r\n")[2]
    head, _, rest = received.partition(b"\r\n\r\n")
    assert head, f"no response: {received!r}"
    return int(head.split(b" ", 2)[1]), rest


@pytest.mark.skip(reason="not reliable yet (issue 38 follow-up): run after test_grpc_messages.py's chat test on the "
                         "same server, the half-closed non-streamed request gets no response; alone it passes")
def test_a_half_closed_client_gets_its_whole_answer(http_server):
    status, body = half_closed_exchange(http_server.http_port, {"prompt": "a", "max_tokens": 200, "temperature": 0,
                                                                "ignore_eos": True})
    assert status == 200
    completion = json.loads(body)
    assert completion["choices"][0]["finish_reason"] == "length" and completion["usage"]["completion_tokens"] == 200


def test_a_half_closed_client_gets_its_whole_stream(http_server):
    status, body = half_closed_exchange(http_server.http_port, {"prompt": "a", "max_tokens": 200, "temperature": 0,
                                                                "ignore_eos": True, "stream": True})
    assert status == 200
    assert body.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")
    assert b'"finish_reason":"length"' in body


def raw_request(port: int, head: bytes, body: bytes) -> tuple[int, bytes]:
    """Sends `head` (request line and headers), an empty line and `body`: (status, response body)."""
    sock = connect(port)
    sock.sendall(head + b"\r\n" + body)
    received = b""
    while b"\r\n\r\n" not in received and (chunk := sock.recv(1 << 16)):
        received += chunk
    head_out, _, rest = received.partition(b"\r\n\r\n")
    lines = head_out.decode().split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    while len(rest) < int(headers.get("content-length", 0)) and (chunk := sock.recv(1 << 16)):
        rest += chunk
    sock.close()
    return int(lines[0].split()[1]), rest


@pytest.mark.parametrize("framing, header", [
    (b"Content-Length: 16\r\nContent-Length: 17\r\n", "Content-Length"),
    (b"Transfer-Encoding: chunked\r\nContent-Length: 16\r\n", "Transfer-Encoding"),
    (b"Transfer-Encoding: gzip, chunked\r\n", "Transfer-Encoding"),
])
def test_ambiguous_framing_is_refused(http_server, framing, header):
    body = b'{"prompt": "ab"}'
    status, rest = raw_request(http_server.http_port, b"POST /tokenize HTTP/1.1\r\nHost: x\r\n"
                               b"Content-Type: application/json\r\n" + framing, body)
    assert status == 400, rest
    error = json.loads(rest)["error"]
    assert error["message"].startswith(header + ":"), error
    assert error["code"] == "bad_request_framing"


@pytest.mark.parametrize("framing, body", [
    (b"Content-Length: 16\r\nContent-Length: 16\r\n", b'{"prompt": "ab"}'),  # the same value twice: one length
    (b"Transfer-Encoding: chunked\r\n", b'10\r\n{"prompt": "ab"}\r\n0\r\n\r\n'),
])
def test_unambiguous_framing_is_served(http_server, framing, body):
    status, rest = raw_request(http_server.http_port, b"POST /tokenize HTTP/1.1\r\nHost: x\r\n"
                               b"Content-Type: application/json\r\n" + framing, body)
    assert status == 200, rest
    assert json.loads(rest)["count"] >= 1
