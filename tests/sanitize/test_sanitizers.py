"""The sanitizer lanes (tests/sanitize/README.md): strata's C++ suites and a concurrent-serving scenario run
by the builds of scripts/sanitize.sh, ASan + UBSan (build-asan/) and TSan (build-tsan/). Any sanitizer
report fails the test: the processes run with halt_on_error and a distinct exit code (sanitize_env.sh),
and their output is scanned for reports as well."""

from __future__ import annotations

import concurrent.futures
import random
import signal
import subprocess
import threading
import time
import urllib.request

import grpc
import pytest

import generate_helpers as GH
import integration_helpers as IH
import sanitize_helpers as SH

SERVICE = "strata.v1.InferenceService"


# One bug each sanitizer must report: proof that the options (sanitize_env.sh, suppressions included) and
# the scan of the output catch a report, and that the process then fails.
PLANTED = {
    "heap-overflow": ("asan", "#include <cstdlib>\nint main(int argc, char**) { char* p = (char*)malloc(4); "
                              "p[argc + 3] = 1; free(p); }\n"),
    "leak": ("asan", "#include <cstdlib>\n__attribute__((noinline)) void lose(int n) { void* volatile p = malloc(n); "
                     "p = nullptr; }\nint main(int argc, char**) { lose(64 * argc); }\n"),
    "signed-overflow": ("asan", "#include <climits>\nint main(int argc, char**) { int x = INT_MAX - 1 + argc; "
                                "return x + argc > 0; }\n"),
    # Both threads write many times: one write each was missed once in CI (TSan keeps a few accesses per
    # location; a thread that ends before the other starts writing can leave no overlapping history).
    "data-race": ("tsan", "#include <thread>\nvolatile int shared; int main() { std::thread t([] { "
                          "for (int i = 0; i < 100000; ++i) shared = i; }); for (int i = 0; i < 100000; ++i) "
                          "shared = -i; t.join(); }\n"),
}


@pytest.mark.parametrize("bug", list(PLANTED))
def test_lane_reports_a_planted_bug(bug, tmp_path):
    lane, source = PLANTED[bug]
    (tmp_path / "bug.cc").write_text(source)
    subprocess.run(["c++", "-std=c++20", "-O1", "-g1", *SH.FLAGS[lane], "bug.cc", "-o", "bug"], cwd=tmp_path,
                   check=True, timeout=120)
    done = subprocess.run(["./bug"], cwd=tmp_path, env=SH.lane_env(lane), capture_output=True, text=True, timeout=60)
    assert done.returncode == SH.REPORT_EXIT_CODE, (done.returncode, done.stderr)
    assert SH.reports(done.stderr), done.stderr


@pytest.mark.parametrize("lane,suite", [(lane, suite) for lane, suites in SH.SUITES.items() for suite in suites],
                         ids=lambda v: v.rsplit("/", 1)[-1])
def test_cpp_suite_has_no_sanitizer_report(lane, suite, tmp_path):
    """Every test of the suite passes in one process of the sanitized build, and no sanitizer reports."""
    binary = SH.lane_binary(lane, suite)
    started = time.monotonic()
    done = subprocess.run([str(binary), "--gtest_brief=1"], cwd=tmp_path, env=SH.lane_env(lane),
                          capture_output=True, text=True, timeout=900)
    output = done.stdout + done.stderr
    found = SH.reports(output)
    assert not found, f"{lane}: {suite} has sanitizer reports:\n" + "\n".join(found)
    assert done.returncode == 0, f"{lane}: {suite} exited {done.returncode}\n{output[-6000:]}"
    passed = [line for line in output.splitlines() if line.startswith("[  PASSED  ]")]
    assert passed, output[-3000:]
    print(f"\n{lane} {suite}: {passed[-1]} in {time.monotonic() - started:.1f} s")


class Stream:
    """One Generate stream on its own thread, ended by the server or by this client: `cancel_after`
    messages then call.cancel() (0: at once, before reading), or a deadline of `timeout` seconds."""

    def __init__(self, stubs, channel, request, timeout: float = 120, cancel_after: int | None = None):
        self.messages = 0
        self.ids: list[int] = []
        self.finish: str | None = None
        self.code: grpc.StatusCode | None = None
        self.details = ""
        call = stubs.strata_grpc.InferenceServiceStub(channel).Generate(request, timeout=timeout)
        names = stubs.strata.GenerateResponse.FinishReason

        def read():
            try:
                if cancel_after == 0:
                    call.cancel()
                for response in call:
                    self.messages += 1
                    self.ids += list(response.token_ids)
                    if response.finish_reason:
                        self.finish = names.Name(response.finish_reason)
                    if cancel_after is not None and self.messages >= cancel_after:
                        call.cancel()
            except grpc.RpcError as e:
                self.code, self.details = e.code(), e.details()

        self.thread = threading.Thread(target=read, daemon=True)
        self.thread.start()

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "a stream did not end"


def scrape_until(stop: threading.Event, stubs, server: IH.ServerProcess) -> dict[str, int]:
    """GetDeviceMap, health and /metrics in a loop until `stop`; the count of each, all answered."""
    counts = {"device_map": 0, "health": 0, "metrics": 0}
    inference = stubs.strata_grpc.InferenceServiceStub(server.channel)
    health = stubs.health_grpc.HealthStub(server.channel)
    while not stop.is_set():
        reply = inference.GetDeviceMap(stubs.strata.GetDeviceMapRequest(), timeout=30)
        assert reply.device_map["lm_head"] == "1" and len(reply.stages) == 2
        counts["device_map"] += 1
        status = health.Check(stubs.health.HealthCheckRequest(service=SERVICE), timeout=30).status
        assert status == stubs.health.HealthCheckResponse.SERVING
        counts["health"] += 1
        text = urllib.request.urlopen(server.metrics_url, timeout=30).read().decode()
        assert "\nstrata_serving 1\n" in text
        counts["metrics"] += 1
    return counts


def storm(stubs, server: IH.ServerProcess, seed: int) -> tuple[list[Stream], list[Stream], list[Stream]]:
    """Streams run to their end (sampled, stop strings, top logprobs), cancelled mid-flight, and ended by
    deadlines, all at once, some on channels of their own that close under them."""
    rng = random.Random(seed)
    request = stubs.strata.GenerateRequest
    complete = [
        Stream(stubs, server.channel, request(prompt="The quick brown fox", max_new_tokens=24, temperature=0.8,
                                              seed=i, top_logprobs=3, request_id=f"complete-{i}"))
        for i in range(4)
    ] + [
        Stream(stubs, server.channel, request(prompt="Hello, world!", max_new_tokens=24, stop=["o", "e"]))
        for _ in range(2)
    ]
    cancelled, expired = [], []
    own_channels = []
    for i in range(24):
        channel = server.channel
        if i % 4 == 3:
            channel = grpc.insecure_channel(server.grpc_address)
            own_channels.append(channel)
        cancelled.append(Stream(stubs, channel, request(prompt_ids=[1, 2, 3 + i], max_new_tokens=200),
                                cancel_after=rng.randrange(0, 4)))
        if i % 2 == 0:
            expired.append(Stream(stubs, server.channel,
                                  request(prompt=f"deadline {i}", max_new_tokens=200, top_logprobs=2),
                                  timeout=rng.uniform(0.05, 0.6)))
        time.sleep(rng.uniform(0, 0.02))
    # Channels closed under their streams: the server sees the transport go.
    time.sleep(0.2)
    for channel in own_channels:
        channel.close()
    for stream in complete + cancelled + expired:
        stream.join(180)
    return complete, cancelled, expired


@pytest.mark.parametrize("lane", list(SH.LANES))
def test_concurrent_serving_has_no_sanitizer_report(lane, stubs, text_model, tmp_path, monkeypatch):
    """strata-server of the lane on a 2-stage plan (two logical devices on the CPU, a stage worker each,
    micro-batches pipelined, chunked prefill): streams run to their end beside a cancellation storm and
    expiring deadlines while GetDeviceMap, health and /metrics are scraped; then a SIGTERM drains it with
    streams in flight. The server serves correctly throughout and exits 0 with no sanitizer report."""
    binary = SH.lane_binary(lane, "server/strata-server")
    flags = ["--model", str(text_model), *GH.TWO_STAGE_FLAGS, "--max-batch", "8", "--max-context", "512",
             "--max-new-tokens", "200", "--micro-batches", "2", "--prefill-chunk", "8", "--drain-timeout", "60"]
    if lane == "tsan":
        flags += ["--intra-op-threads", "1"]  # see the README: TSan and the wheel's libgomp
    server = IH.ServerProcess(binary, flags, tmp_path / "server", env=SH.lane_env(lane))
    monkeypatch.setattr(IH, "STARTUP_TIMEOUT_S", 180.0)
    started = time.monotonic()

    def failure(what: str) -> str:
        found = SH.reports(server.stderr_path.read_text())
        return f"{lane}: {what}\n" + ("\n".join(found) if found else server.output()[-8000:])

    try:
        server.start(stubs)
        load_seconds = time.monotonic() - started

        # The storm, with scrapers running through it.
        stop = threading.Event()
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            scrapers = [pool.submit(scrape_until, stop, stubs, server) for _ in range(2)]
            try:
                complete, cancelled, expired = storm(stubs, server, seed=10)
            finally:
                stop.set()
            scraped = [s.result(timeout=120) for s in scrapers]
        for s in complete:
            assert s.code is None and s.finish in ("LENGTH", "STOP"), failure(f"{s.code} {s.details} {s.finish}")
        assert [s.finish for s in complete[:4]] == ["LENGTH"] * 4 and all(len(s.ids) == 24 for s in complete[:4])
        for s in cancelled:
            assert s.code == grpc.StatusCode.CANCELLED or s.finish is not None, failure(f"{s.code} {s.details}")
        for s in expired:
            assert s.code == grpc.StatusCode.DEADLINE_EXCEEDED or s.finish == "LENGTH", failure(f"{s.code} {s.details}")
        assert sum(s.code == grpc.StatusCode.CANCELLED for s in cancelled) >= 12, "the storm cancelled too little"
        assert any(s.code == grpc.StatusCode.DEADLINE_EXCEEDED for s in expired), "no deadline expired mid-flight"

        # The server is whole after the storm: every slot comes back, the next request is served in full,
        # and the server counted what the clients saw.
        deadline = time.monotonic() + 60
        while GH.metric(server.metrics_url, "strata_active_sequences", default=0) > 0:
            assert time.monotonic() < deadline, failure("slots still held 60 s after the storm")
            time.sleep(0.3)
        out = GH.generate(stubs, server.channel, prompt_ids=[5, 6, 7], max_new_tokens=16)
        assert (out["finish"], len(out["ids"])) == ("LENGTH", 16), failure(str(out))
        # A call cancelled or expired before it reached the server is not counted there; one that streamed is,
        # once. An expiry may count as CANCELLED: the client's RST_STREAM at its deadline can reach a slow server
        # before the server's own copy of the deadline (set when the call arrived) passes. And a call may count
        # as OK although its client saw CANCELLED: the server coalesces the tokens a slow reader has not taken
        # into one message, so all 200 can be written and the call finished while the client, still reading,
        # cancels. So every call that streamed is among CANCELLED, DEADLINE_EXCEEDED and OK, next to the
        # complete streams and the request above. A call is counted when the engine's last chunk for it reaches
        # its reactor, which may be after its slot is free (the output thread delivers it): the count is awaited.
        streamed = sum(s.messages > 0 and s.code is not None for s in cancelled + expired)
        expected = streamed + len(complete) + 1

        def ended_count() -> float:
            return sum(GH.metric(server.metrics_url, f'strata_requests_total{{code="{code}"}}', default=0)
                       for code in ("CANCELLED", "DEADLINE_EXCEEDED", "OK"))

        deadline = time.monotonic() + 60
        while (ended := ended_count()) < expected and time.monotonic() < deadline:
            time.sleep(0.2)
        counted = [line for line in urllib.request.urlopen(server.metrics_url, timeout=30).read().decode().splitlines()
                   if line.startswith("strata_requests_total{")]
        assert ended >= expected, failure(f"{ended} calls counted CANCELLED, DEADLINE_EXCEEDED or OK; expected at least "
                                          f"{expected} ({streamed} streamed calls the client saw end with an error, "
                                          f"{len(complete)} complete, 1 after the storm); the server counted {counted}")

        # SIGTERM with streams in flight: they run to their end (--drain-timeout 60) and the process exits 0.
        draining = [Stream(stubs, server.channel, stubs.strata.GenerateRequest(prompt_ids=[9, i], max_new_tokens=60))
                    for i in range(4)]
        deadline = time.monotonic() + 60
        while not all(s.messages for s in draining):
            assert time.monotonic() < deadline and all(s.code is None for s in draining), failure("drain streams")
            time.sleep(0.01)
        server.process.send_signal(signal.SIGTERM)
        try:
            rc = server.process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            server.process.kill()
            raise AssertionError(failure("still running 120 s after SIGTERM"))
        for s in draining:
            s.join(30)
            assert (s.code, s.finish, len(s.ids)) == (None, "LENGTH", 60), failure(f"{s.code} {s.details}")
    except Exception as error:
        # A sanitizer report ends the server (halt_on_error): say so rather than how the clients saw it end.
        found = SH.reports(server.stderr_path.read_text()) if server.stderr_path.exists() else []
        if found:
            raise AssertionError(f"{lane}: strata-server has sanitizer reports:\n" + "\n".join(found)) from error
        raise
    finally:
        if server.process is not None and server.process.poll() is None:
            server.process.kill()
            server.process.wait()
        if server.channel is not None:
            server.channel.close()
    found = SH.reports(server.stderr_path.read_text())
    assert not found, f"{lane}: strata-server has sanitizer reports:\n" + "\n".join(found)
    assert rc == 0, failure(f"exit code {rc}" + (" (a sanitizer report)" if rc == SH.REPORT_EXIT_CODE else ""))
    totals = {k: sum(s[k] for s in scraped) for k in scraped[0]}
    print(f"\n{lane} scenario: loaded in {load_seconds:.1f} s; {len(complete)} complete, "
          f"{sum(s.code == grpc.StatusCode.CANCELLED for s in cancelled)} cancelled, "
          f"{sum(s.code == grpc.StatusCode.DEADLINE_EXCEEDED for s in expired)} past their deadline; scraped "
          f"{totals}; drained 4 streams; exit 0, no report, {time.monotonic() - started:.1f} s in all")
