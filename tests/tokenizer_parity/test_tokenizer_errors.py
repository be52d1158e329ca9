"""strata-tokenize on bad input: a clear message naming what is wrong (the stdin line, the JSON path
of the tokenizer.json component) and exit status 2 — never a crash or silent garbage."""

from __future__ import annotations

import copy
import json
import subprocess

import pytest

import tokenizer_fixtures as F


def _run(binary, tokenizer, stdin: bytes, *flags):
    return subprocess.run([str(binary), "--tokenizer", str(tokenizer), *flags], input=stdin, capture_output=True,
                          timeout=60)


@pytest.fixture(scope="module")
def gpt2_json(families) -> dict:
    directory, _ = families["gpt2"]
    return json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("stdin, flags, message", [
    (b'"ok"\n"\xff\xfe bad"\n', [], "stdin line 2: invalid UTF-8 at byte 1"),  # invalid UTF-8 in a prompt
    (b'"\\ud800 lone surrogate"\n', [], "stdin line 1: not valid JSON"),     # a lone surrogate is not text
    (b'"half \xe4\xb8"\n', [], "stdin line 1: invalid UTF-8 at byte 6"),    # truncated character
    (b"[1, 2]\n", [], "stdin line 1: expected a JSON string to encode"),
    (b"not json\n", [], "stdin line 1: not valid JSON"),
    (b'"text"\n', ["--decode"], "stdin line 1: expected a JSON array of token ids"),
    (b"[1, -5]\n", ["--decode"], "stdin line 1: element 1: expected a token id"),
    (b'[1, "x"]\n', ["--decode"], "stdin line 1: element 1: expected a token id"),
])
def test_bad_input_lines_exit_2_naming_the_line(strata_tokenize, families, stdin, flags, message):
    directory, _ = families["gpt2"]
    proc = _run(strata_tokenize, directory, stdin, *flags)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr.decode(), proc.stderr


def _break(data: dict, how: str) -> dict:
    data = copy.deepcopy(data)
    if how == "no model":
        del data["model"]
    elif how == "unknown pre-tokenizer":
        data["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [data["pre_tokenizer"], {"type": "Whitespace"}]}
    elif how == "merge names unknown token":
        data["model"]["merges"][3] = "nosuchtoken Ġ"
    elif how == "merged token not in vocab":
        del data["model"]["vocab"]["he"]
        data["model"]["merges"] = ["h e"]
    elif how == "unigram model":
        data["model"]["type"] = "Unigram"
    elif how == "unknown decoder":
        data["decoder"] = {"type": "CTC", "pad_token": "<pad>"}
    elif how == "unknown normalizer":
        data["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "BertNormalizer"}]}
    elif how == "bad regex":
        data["pre_tokenizer"] = {"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated",
                                 "invert": False}
    elif how == "truncation":
        data["truncation"] = {"max_length": 8, "strategy": "LongestFirst", "stride": 0, "direction": "Right"}
    elif how == "vocab id not an integer":
        data["model"]["vocab"]["!"] = "one"
    return data


@pytest.mark.parametrize("how, message", [
    ("no model", "tokenizer.json: model: missing"),
    ("unknown pre-tokenizer", 'tokenizer.json: pre_tokenizer.pretokenizers[1].type: unsupported pre-tokenizer "Whitespace"'),
    ("merge names unknown token", 'tokenizer.json: model.merges[3]: token "nosuchtoken" is not in model.vocab'),
    ("merged token not in vocab", 'tokenizer.json: model.merges[0]: merged token "he" is not in model.vocab'),
    ("unigram model", 'tokenizer.json: model.type: unsupported model "Unigram"'),
    ("unknown decoder", 'tokenizer.json: decoder.type: unsupported decoder "CTC"'),
    ("unknown normalizer", 'tokenizer.json: normalizer.normalizers[1].type: unsupported normalizer "BertNormalizer"'),
    ("bad regex", "tokenizer.json: pre_tokenizer.pattern.Regex: invalid regex"),
    ("truncation", "tokenizer.json: truncation: unsupported"),
    ("vocab id not an integer", "tokenizer.json: model.vocab.!: expected a non-negative 32-bit integer id"),
])
def test_malformed_tokenizer_json_names_the_json_path(strata_tokenize, gpt2_json, tmp_path, how, message):
    directory = tmp_path / "broken"
    directory.mkdir()
    (directory / "tokenizer.json").write_text(json.dumps(_break(gpt2_json, how), ensure_ascii=False), encoding="utf-8")
    proc = _run(strata_tokenize, directory, b'"hello"\n')
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr.decode(), proc.stderr


def test_not_json_and_missing_file(strata_tokenize, tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{ not json", encoding="utf-8")
    proc = _run(strata_tokenize, bad, b'"x"\n')
    assert proc.returncode == 2 and "not valid JSON" in proc.stderr.decode(), proc.stderr
    proc = _run(strata_tokenize, tmp_path / "nowhere", b'"x"\n')
    assert proc.returncode == 2 and "cannot open" in proc.stderr.decode(), proc.stderr


def test_bad_flags_exit_2(strata_tokenize, families):
    directory, _ = families["gpt2"]
    proc = _run(strata_tokenize, directory, b"", "--no-such-flag")
    assert proc.returncode == 2 and "unknown flag --no-such-flag" in proc.stderr.decode()
    proc = subprocess.run([str(strata_tokenize)], input=b"", capture_output=True, timeout=60)
    assert proc.returncode == 2 and "--tokenizer PATH is required" in proc.stderr.decode()
