"""What the chat-template parity tests share (conftest.py holds the fixtures): where the templates and the
binary are, the special tokens both sides render with, and `run_batch` (strata-chat-template --batch)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

REPO = pathlib.Path(__file__).resolve().parents[2]
TEMPLATE_DIR = pathlib.Path(__file__).resolve().parent / "templates"
# The special tokens both sides render with (apply_chat_template passes the tokenizer's).
SPECIAL_TOKENS = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}


def strata_binary() -> pathlib.Path:
    build = pathlib.Path(os.environ.get("STRATA_BUILD_DIR", REPO / "build"))
    return build / "chat_template" / "strata-chat-template"


def run_batch(binary, args: list[str], contexts: list[dict]) -> list[dict]:
    """strata-chat-template --batch: one {"text"} or {"error"} per context."""
    stdin = "".join(json.dumps(c, ensure_ascii=False) + "\n" for c in contexts)
    proc = subprocess.run([str(binary), *args, "--batch"], input=stdin.encode(), capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    # One JSON object per "\n" (not str.splitlines: U+2028 in a rendering is text, not a line break).
    lines = proc.stdout.decode().split("\n")[:-1]
    assert len(lines) == len(contexts), proc.stdout.decode()[-2000:]
    return [json.loads(line) for line in lines]
