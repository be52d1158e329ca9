"""A group of strata-server processes on this machine (issue 24): the leader (rank 0) through
integration_helpers.ServerProcess, the workers as plain processes (they serve no gRPC)."""

from __future__ import annotations

import json
import pathlib
import signal
import subprocess
import time

import integration_helpers as IH


class Worker:
    """strata-server --rank R: joins the leader, runs its stages; stdout/stderr to files."""

    def __init__(self, server_bin: pathlib.Path, flags: list[str], log_dir: pathlib.Path, env: dict | None = None,
                 prefix: list[str] = ()):
        """`prefix`: a command the server runs under (e.g. ip netns exec NS)."""
        log_dir.mkdir(parents=True, exist_ok=True)
        self.stdout_path = log_dir / "stdout.txt"
        self.stderr_path = log_dir / "stderr.txt"
        with open(self.stdout_path, "w") as out, open(self.stderr_path, "w") as err:
            self.process = subprocess.Popen([*prefix, str(server_bin), *flags], stdout=out, stderr=err, env=env)

    def output(self) -> str:
        return f"stdout:\n{self.stdout_path.read_text()}\nstderr:\n{self.stderr_path.read_text()}"

    def wait(self, timeout: float) -> int:
        return self.process.wait(timeout=timeout)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


class Group:
    """A leader and its workers. `map_json`: the leader's --device-map over the group's GPUs, node-major;
    `gpus[n]`: how many GPUs node n has (each on the CPU, --physical-devices); `extra[n]`: more flags for node n."""

    def __init__(self, server_bin, stubs, log_dir: pathlib.Path, model_dir, secret_file, gpus: list[int],
                 map_json: str | None = None, common: list[str] = (), extra: dict | None = None,
                 deadline_s: float = 3.0, timeout_s: float = 60.0):
        self.size = len(gpus)
        self.data_port = IH.free_port()
        extra = extra or {}
        self.workers: list[Worker] = []

        def node_flags(n: int) -> list[str]:
            physical = ",".join(f"{g}=cpu" for g in range(gpus[n]))
            memory = ",".join([*(f"{g}=1GiB" for g in range(gpus[n])), "cpu=1GiB"])
            flags = ["--model", str(model_dir), "--group-size", str(self.size), "--rank", str(n),
                     "--leader", f"127.0.0.1:{self.data_port}", "--group-bind", "127.0.0.1",
                     "--group-secret-file", str(secret_file), "--group-deadline", str(deadline_s),
                     "--group-timeout", str(timeout_s), "--max-memory", memory, *common, *extra.get(n, [])]
            if physical:
                flags += ["--physical-devices", physical]
            return flags

        for n in range(1, self.size):
            # A worker's --listen serves gRPC health checks alone (its pod's probes).
            health = f"127.0.0.1:{IH.free_port()}"
            self.workers.append(Worker(server_bin, [*node_flags(n), "--listen", health], log_dir / f"node{n}"))
            self.workers[-1].health_address = health
        leader_flags = node_flags(0)
        if map_json is not None:
            leader_flags += ["--device-map", map_json]
        self.leader = IH.ServerProcess(server_bin, leader_flags, log_dir / "node0")
        try:
            self.leader.start(stubs)
        except BaseException:
            for w in self.workers:
                w.stop(signal.SIGKILL)
            raise AssertionError("the group did not start\n" + self.output())

    def output(self) -> str:
        parts = [f"--- node 0 (leader)\n{self.leader.output()}"]
        parts += [f"--- node {n + 1}\n{w.output()}" for n, w in enumerate(self.workers)]
        return "\n".join(parts)

    def stop(self) -> list[int]:
        codes = [self.leader.stop()]
        for w in self.workers:
            try:
                codes.append(w.wait(timeout=15))
            except subprocess.TimeoutExpired:
                codes.append(w.stop(signal.SIGKILL))
        return codes


def layer_map(layers: int, nodes: list[int], head_node: int | None = None, tied: bool = False) -> str:
    """A device map over plan GPUs: the embedding on GPU nodes[0]'s..., layer i on plan GPU nodes[i * len // layers]
    (one GPU per node, so plan GPU n is node n); the norm and head on the last layer's, or the head on
    `head_node`."""
    m = {"model.embed_tokens": nodes[0]}
    for i in range(layers):
        m[f"model.layers.{i}"] = nodes[min(len(nodes) - 1, i * len(nodes) // layers)]
    m["model.norm"] = m[f"model.layers.{layers - 1}"]
    m["model.rotary_emb"] = m["model.norm"]
    m["lm_head"] = nodes[0] if tied else (head_node if head_node is not None else m["model.norm"])
    return json.dumps(m)


def wait_exit(process, timeout: float) -> tuple[int | None, float]:
    """(exit code or None, seconds waited)."""
    start = time.monotonic()
    try:
        code = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        code = None
    return code, time.monotonic() - start
