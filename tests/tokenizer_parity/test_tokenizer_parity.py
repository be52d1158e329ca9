"""strata-tokenize vs HF `tokenizers`, token for token, on a corpus of >= 2,000 lines in six tokenizer
layouts (GPT-2, Llama-3, Qwen2, Llama-2 legacy, Mistral, Metaspace+Digits): encode with and without
special tokens, decode with and without skip_special_tokens, and streaming decode."""

from __future__ import annotations

import pytest

import tokenizer_fixtures as F

FAMILIES = list(F.FAMILIES)


def _report(mismatches: list[str], total: int, what: str) -> None:
    if mismatches:
        shown = "\n".join(mismatches[:8])
        pytest.fail(f"{len(mismatches)}/{total} {what} differ from tokenizers; first ones:\n{shown}", pytrace=False)


def test_corpus_covers_what_the_issue_lists(corpus):
    assert len(corpus) >= 2000
    text = "".join(corpus)
    for sample in ["é", "Привет", "Καλημέρα", "مرحبا", "שלום", "नमस्ते", "สวัสดี", "你好", "안녕", "👨‍👩‍👧‍👦", "👍🏽",
                   "\u0301", "\t\t", "\n\n", "def f(x)", "<|endoftext|>", "<s>", "[INST]"]:
        assert sample in text, sample
    assert "" in corpus
    assert any(len(line) >= 300 and " " not in line for line in corpus), "no very long word"
    assert any(line != line.strip() for line in corpus), "no leading/trailing whitespace"


@pytest.mark.parametrize("add_special_tokens", [False, True], ids=["plain", "special"])
@pytest.mark.parametrize("family", FAMILIES)
def test_encode_matches_tokenizers(strata_tokenize, families, corpus, family, add_special_tokens, record):
    directory, oracle = families[family]
    flags = ["--add-special-tokens"] if add_special_tokens else []
    got = F.run_cli(strata_tokenize, directory, corpus, *flags)
    mismatches = []
    for line, ids in zip(corpus, got):
        want = oracle.encode(line, add_special_tokens=add_special_tokens).ids
        if ids != want:
            mismatches.append(f"  {line[:80]!r}\n    tokenizers {want[:24]}\n    strata     {ids[:24]}")
    record(f"encode ({'with' if add_special_tokens else 'without'} special tokens)",
           len(corpus) - len(mismatches), len(corpus))
    _report(mismatches, len(corpus), f"{family} encodings")


def _decode_inputs(oracle, corpus) -> list[list[int]]:
    """Each line's ids (with special tokens), plus its last two thirds and its first half: cuts that
    split characters across byte tokens and drop the leading "▁" context."""
    seqs = []
    for line in corpus:
        ids = oracle.encode(line, add_special_tokens=True).ids
        seqs += [ids, ids[len(ids) // 3:], ids[: len(ids) // 2]]
    return seqs


@pytest.mark.parametrize("skip_special_tokens", [False, True], ids=["keep", "skip"])
@pytest.mark.parametrize("family", FAMILIES)
def test_decode_matches_tokenizers(strata_tokenize, families, corpus, family, skip_special_tokens, record):
    directory, oracle = families[family]
    seqs = _decode_inputs(oracle, corpus)
    flags = ["--decode"] + (["--skip-special-tokens"] if skip_special_tokens else [])
    got = F.run_cli(strata_tokenize, directory, seqs, *flags)
    mismatches = []
    for ids, text in zip(seqs, got):
        want = oracle.decode(ids, skip_special_tokens=skip_special_tokens)
        if text != want:
            mismatches.append(f"  {ids[:16]}\n    tokenizers {want[:80]!r}\n    strata     {text[:80]!r}")
    record("decode", len(seqs) - len(mismatches), len(seqs))
    _report(mismatches, len(seqs), f"{family} decodes")


@pytest.mark.parametrize("skip_special_tokens", [False, True], ids=["keep", "skip"])
@pytest.mark.parametrize("family", FAMILIES)
def test_streaming_decode_concatenates_to_full_decode(strata_tokenize, families, corpus, family,
                                                      skip_special_tokens, record):
    directory, oracle = families[family]
    seqs = _decode_inputs(oracle, corpus)
    flags = ["--decode", "--stream"] + (["--skip-special-tokens"] if skip_special_tokens else [])
    got = F.run_cli(strata_tokenize, directory, seqs, *flags)
    mismatches = []
    for ids, chunks in zip(seqs, got):
        want = oracle.decode(ids, skip_special_tokens=skip_special_tokens)
        # Only complete text comes out: no chunk carries U+FFFD unless the full decode has one.
        if "".join(chunks) != want or ("\ufffd" not in want and any("\ufffd" in c for c in chunks)):
            mismatches.append(f"  {ids[:16]}\n    tokenizers {want[:80]!r}\n    strata     {chunks[:8]!r}")
    record("streaming decode", len(seqs) - len(mismatches), len(seqs))
    _report(mismatches, len(seqs), f"{family} streamed decodes")


def test_streaming_emits_as_it_goes(strata_tokenize, families, corpus):
    """Streaming is incremental, not everything at Finish: over the corpus most tokens that complete
    text emit it at once, so there are many more chunks than lines."""
    directory, oracle = families["gpt2"]
    seqs = [oracle.encode(line).ids for line in corpus if len(line) > 20]
    got = F.run_cli(strata_tokenize, directory, seqs, "--decode", "--stream")
    chunks = sum(len(c) for c in got)
    tokens = sum(len(s) for s in seqs)
    assert chunks > 0.5 * tokens, f"{chunks} chunks for {tokens} tokens"
