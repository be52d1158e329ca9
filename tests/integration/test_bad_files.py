"""Hostile files where a checkpoint's files should be (issue 10, part 1): FIFOs, devices, directories,
symlink loops, oversize files and out-of-range config fields. strata-plan, strata-generate and
strata-server give the same verdict on the same directory: exit 2 with the file (and field) named on
stderr, never a hang, a signal or an out-of-memory kill. Every run is bounded by a timeout, so a
regression to a blocking open fails instead of hanging the suite.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
from pathlib import Path

import pytest

from integration_helpers import BUILD_DIR, PLAN_BIN, SERVER_BIN, SMALL_LLAMA_CONFIG, free_port, require_binary

GENERATE_BIN = BUILD_DIR / "runtime" / "strata-generate"
TIMEOUT_S = 30


# Root reads files and directories whatever their permission bits (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH).
# Dropped from the bounding set, they are gone from the binary's capabilities after exec, so root gets
# "Permission denied" like any user and the permission cases run in CI (which runs as root) too.
AS_UNPRIVILEGED_ROOT = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--"]


def run_binary(which: str, model: Path, extra: list[str] = (), device_map: str | None = None) -> subprocess.CompletedProcess:
    prefix = AS_UNPRIVILEGED_ROOT if os.geteuid() == 0 else []
    if which == "plan":
        args = [str(require_binary(PLAN_BIN)), "--model", str(model), "--max-memory", "0=1GiB,cpu=1GiB"]
    elif which == "generate":
        args = [str(require_binary(GENERATE_BIN)), "--model", str(model), "--prompt-ids", "1,2",
                "--max-new-tokens", "1", "--device-map", device_map or '{"": "cpu"}']
        device_map = None
    else:
        args = [str(require_binary(SERVER_BIN)), "--model", str(model), "--max-memory", "0=1GiB,cpu=1GiB",
                "--listen", f"127.0.0.1:{free_port()}", "--metrics-listen", f"127.0.0.1:{free_port()}"]
    if device_map is not None:
        args += ["--device-map", device_map]
    try:
        return subprocess.run([*prefix, *args, *extra], capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"strata-{which} on {model} did not finish in {TIMEOUT_S} s (blocked on a file?)")


def expect_bad_input(which: str, model: Path, *named: str, extra: list[str] = (), device_map: str | None = None) -> str:
    done = run_binary(which, model, list(extra), device_map)
    assert done.returncode == 2, f"strata-{which} exited {done.returncode}: {done.stderr}"
    for part in named:
        assert part in done.stderr, done.stderr
    return done.stderr


BINARIES = ["plan", "generate", "server"]


@pytest.fixture
def model(tmp_path) -> Path:
    """A checkpoint directory with a valid config.json (no weights: every binary plans from it)."""
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(SMALL_LLAMA_CONFIG))
    return d


def add_weights(model: Path) -> Path:
    """Zero float32 weights for the config (model.safetensors), so that strata-server loads the model
    and reads tokenizer.json and generation_config.json instead of serving the plan only."""
    tree = json.loads(subprocess.run([str(require_binary(PLAN_BIN)), "--model", str(model), "--print-module-tree"],
                                     capture_output=True, text=True, timeout=TIMEOUT_S, check=True).stdout)
    header, offset = {}, 0

    def walk(node, prefix):
        nonlocal offset
        name = f"{prefix}{node['name']}" if node.get("name") else prefix.rstrip(".")
        for tensor in node.get("parameters", []) + [b for b in node.get("buffers", []) if b.get("persistent", True)]:
            size = 4
            for d in tensor["shape"]:
                size *= d
            full = f"{name}.{tensor['name']}" if name else tensor["name"]
            header[full] = {"dtype": "F32", "shape": tensor["shape"], "data_offsets": [offset, offset + size]}
            offset += size
        for child in node.get("children", []):
            walk(child, f"{name}." if name else "")

    walk(tree["root"], "")
    text = json.dumps(header).encode()
    (model / "model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + bytes(offset))
    return model


def with_config(model: Path, **changes) -> Path:
    config = dict(SMALL_LLAMA_CONFIG)
    for key, value in changes.items():
        if value is ...:
            config.pop(key, None)
        else:
            config[key] = value
    (model / "config.json").write_text(json.dumps(config))
    return model


@pytest.mark.parametrize("which", BINARIES)
def test_fifo_config_json_is_refused_without_blocking(which, model):
    (model / "config.json").unlink()
    os.mkfifo(model / "config.json")
    expect_bad_input(which, model, "config.json", "FIFO")


@pytest.mark.parametrize("which", BINARIES)
def test_dev_zero_config_json_is_refused(which, model):
    (model / "config.json").unlink()
    (model / "config.json").symlink_to("/dev/zero")
    expect_bad_input(which, model, "config.json", "character device")


@pytest.mark.parametrize("which", BINARIES)
def test_directory_named_config_json_is_refused(which, model):
    (model / "config.json").unlink()
    (model / "config.json").mkdir()
    expect_bad_input(which, model, "config.json", "directory")


@pytest.mark.parametrize("which", BINARIES)
def test_oversize_config_json_is_refused(which, model):
    config = dict(SMALL_LLAMA_CONFIG)
    config["padding"] = "x" * (17 << 20)  # over the 16 MiB cap for config.json
    (model / "config.json").write_text(json.dumps(config))
    expect_bad_input(which, model, "config.json", "over the limit")


@pytest.mark.parametrize("which", BINARIES)
def test_symlink_loop_config_json_is_refused(which, model):
    (model / "config.json").unlink()
    (model / "config.json").symlink_to(model / "config.json")
    expect_bad_input(which, model, "config.json")


CPU_MAP = '{"": "cpu"}'


@pytest.mark.parametrize("which", ["generate", "server"])
def test_fifo_tokenizer_json_is_refused_without_blocking(which, model):
    os.mkfifo(add_weights(model) / "tokenizer.json")
    expect_bad_input(which, model, "tokenizer.json", "FIFO", device_map=CPU_MAP)


@pytest.mark.parametrize("which", ["generate", "server"])
def test_symlink_loop_tokenizer_json_exits_2(which, model):
    # Before: std::filesystem::exists threw filesystem_error (ELOOP) and the binary aborted.
    (add_weights(model) / "tokenizer.json").symlink_to(model / "tokenizer.json")
    expect_bad_input(which, model, "tokenizer.json", device_map=CPU_MAP)


@pytest.mark.parametrize("which", ["generate", "server"])
def test_dangling_tokenizer_json_exits_2(which, model):
    # An unreadable tokenizer.json is bad input like any other (the server exited 1 on it).
    (add_weights(model) / "tokenizer.json").symlink_to(model / "no_such_file.json")
    expect_bad_input(which, model, "tokenizer.json", device_map=CPU_MAP)


@pytest.mark.parametrize("which", ["generate", "server"])
def test_unreadable_tokenizer_json_exits_2(which, model):
    (add_weights(model) / "tokenizer.json").write_text("{}")
    (model / "tokenizer.json").chmod(0)
    expect_bad_input(which, model, "tokenizer.json", device_map=CPU_MAP)


@pytest.mark.parametrize("which", BINARIES)
def test_checkpoint_directory_without_permission_exits_2(which, model):
    model.chmod(0)
    try:
        expect_bad_input(which, model, str(model))
    finally:
        model.chmod(0o755)


def test_fifo_generation_config_is_refused_by_the_server(model):
    os.mkfifo(add_weights(model) / "generation_config.json")
    expect_bad_input("server", model, "generation_config.json", "FIFO", device_map=CPU_MAP)


@pytest.mark.parametrize("which", BINARIES)
def test_bogus_dtype_gets_the_same_verdict(which, model):
    with_config(model, dtype="bogus")
    expect_bad_input(which, model, "dtype", "bogus")


@pytest.mark.parametrize("which", BINARIES)
@pytest.mark.parametrize(
    "field, value",
    [
        ("num_hidden_layers", 1000000),
        ("hidden_size", 1 << 30),
        ("vocab_size", 1 << 31),
        ("num_attention_heads", 1 << 20),
        ("intermediate_size", 1 << 31),
    ],
)
def test_huge_sizes_are_errors_naming_the_field(which, field, value, model):
    with_config(model, **{field: value})
    expect_bad_input(which, model, field)


@pytest.mark.parametrize("which", ["generate", "server"])
def test_max_batch_times_max_context_overflow_is_an_error(which, model):
    # With weights, so that the server loads the model (and sizes its KV cache) instead of serving the plan.
    extra = ["--max-batch", str(1 << 40), "--max-context", str(1 << 40)]
    expect_bad_input(which, add_weights(model), "--max-context", "does not fit in 64 bits", extra=extra,
                     device_map=CPU_MAP)


@pytest.mark.parametrize("which", BINARIES)
def test_device_index_past_int_is_an_error(which, model):
    # Before: the index was cast to int, so 2**32 meant GPU 0.
    expect_bad_input(which, model, "4294967296", device_map='{"": 4294967296}')


def test_device_map_file_that_is_a_fifo_is_refused(model, tmp_path):
    fifo = tmp_path / "map.json"
    os.mkfifo(fifo)
    expect_bad_input("plan", model, "map.json", "FIFO", extra=["--device-map", f"@{fifo}"])


def test_module_tree_that_is_a_directory_is_refused(tmp_path):
    tree = tmp_path / "tree.json"
    tree.mkdir()
    args = [str(require_binary(PLAN_BIN)), "--module-tree", str(tree), "--max-memory", "0=1GiB,cpu=1GiB"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 2, done.stderr
    assert "tree.json" in done.stderr and "directory" in done.stderr, done.stderr


def test_module_tree_without_tensors_is_an_error(tmp_path):
    tree = tmp_path / "tree.json"
    tree.write_text(json.dumps({"format": "strata.module_tree.v1", "root": {"class": "Empty"}}))
    args = [str(require_binary(PLAN_BIN)), "--module-tree", str(tree), "--max-memory", "0=1GiB,cpu=1GiB"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 2, f"exit {done.returncode}: {done.stderr}"
    assert "no parameters or buffers" in done.stderr, done.stderr


# The chat template is parsed at start: one that does not parse stops strata-server (exit 2) naming its
# file and line; --chat-template names the flag; a good one is named on the start-up line.
def test_chat_template_that_does_not_parse_exits_2_naming_file_and_line(model):
    (add_weights(model) / "chat_template.jinja").write_text("{{ bos_token }}\n{% for m in messages %}\n{{ m.content }")
    stderr = expect_bad_input("server", model, "chat_template.jinja:3", device_map=CPU_MAP)
    assert "chat template" in stderr, stderr


def test_chat_template_flag_to_a_missing_file_exits_2(model, tmp_path):
    missing = tmp_path / "no-such-template.jinja"
    expect_bad_input("server", add_weights(model), "--chat-template", str(missing), extra=["--chat-template", str(missing)],
                     device_map=CPU_MAP)


def test_good_chat_template_is_named_at_start(model, tmp_path):
    (add_weights(model) / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "chat_template": [{"name": "default", "template": "{{ bos_token }}{{ messages }}"},
                                               {"name": "tool_use", "template": "{{ tools }}"}]}))
    args = [str(require_binary(SERVER_BIN)), "--model", str(model), "--device-map", CPU_MAP,
            "--listen", f"127.0.0.1:{free_port()}", "--metrics-listen", f"127.0.0.1:{free_port()}"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "serving Generate" in line:
                break
        loaded = [line for line in lines if "loaded in" in line]
        assert loaded and "chat template default, tool_use" in loaded[0], "".join(lines) + proc.stderr.read()
    finally:
        proc.terminate()
        proc.wait(timeout=TIMEOUT_S)
