"""Fixtures and the session summary of the chat-template parity tests.

The tests compare `strata-chat-template` ($STRATA_BUILD_DIR/chat_template/strata-chat-template, default
<repo>/build) with transformers' apply_chat_template(tokenize=False), live in this process, on the real
templates in templates/ (sources.json names where each one comes from). A missing binary is a failure,
not a skip.
"""

from __future__ import annotations

import collections
import json
import os
import pathlib
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
TEMPLATE_DIR = pathlib.Path(__file__).resolve().parent / "templates"
# The special tokens both sides render with (apply_chat_template passes the tokenizer's).
SPECIAL_TOKENS = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}

# kind -> Counter(identical=..., total=...), filled by the tests through `record`.
_counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)


def strata_binary() -> pathlib.Path:
    build = pathlib.Path(os.environ.get("STRATA_BUILD_DIR", REPO / "build"))
    return build / "chat_template" / "strata-chat-template"


@pytest.fixture(scope="session")
def strata_chat_template():
    path = strata_binary()
    if not path.is_file():
        pytest.fail(f"strata-chat-template is not built: {path} does not exist (build the project first, "
                    f"or point STRATA_BUILD_DIR at the build folder)", pytrace=False)
    return path


@pytest.fixture(scope="session")
def tokenizer():
    """A transformers tokenizer whose only role is apply_chat_template (no vocabulary is needed for
    tokenize=False); its special tokens are SPECIAL_TOKENS."""
    from tokenizers import Tokenizer
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(BPE()), **SPECIAL_TOKENS)


def run_batch(binary, args: list[str], contexts: list[dict]) -> list[dict]:
    """strata-chat-template --batch: one {"text"} or {"error"} per context."""
    stdin = "".join(json.dumps(c, ensure_ascii=False) + "\n" for c in contexts)
    proc = subprocess.run([str(binary), *args, "--batch"], input=stdin.encode(), capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    # One JSON object per "\n" (not str.splitlines: U+2028 in a rendering is text, not a line break).
    lines = proc.stdout.decode().split("\n")[:-1]
    assert len(lines) == len(contexts), proc.stdout.decode()[-2000:]
    return [json.loads(line) for line in lines]


@pytest.fixture
def record():
    def add(kind: str, identical: int, total: int) -> None:
        _counts[kind]["identical"] += identical
        _counts[kind]["total"] += total
    return add


def pytest_terminal_summary(terminalreporter):
    if not _counts:
        return
    terminalreporter.section("chat template parity vs transformers")
    for kind, c in _counts.items():
        terminalreporter.write_line(f"{kind}: {c['identical']}/{c['total']}")
