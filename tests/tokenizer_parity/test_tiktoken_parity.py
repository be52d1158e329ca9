"""strata-tokenize on a tiktoken vocabulary (Kimi K2's layout: tiktoken.model + tokenizer_config.json) vs the
`tiktoken` package, token for token: encode with special tokens in the text, decode with and without
skipping them, streaming decode; and malformed rank files exit 2 naming the file and line.

No vocabulary comes from a model hub: the rank files are written here, from a byte-level BPE that the
`tokenizers` trainer learns on a varied corpus with Kimi's pre-tokenizer pattern ("trained": ranks in merge
order, as real tiktoken files are), and from the same tokens with their ranks shuffled ("shuffled": ranks
that no training produces, so merges meet ties and pieces whose merging differs from their own token). The
oracle is `tiktoken.Encoding(pat_str=Kimi's pattern, mergeable_ranks=..., special_tokens=...)` with the
special tokens built as Kimi's tokenization_kimi.py builds them."""

from __future__ import annotations

import base64
import json
import random
import subprocess

import pytest
import tiktoken
from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

import tokenizer_fixtures as F

# tokenization_kimi.py's pat_str (moonshotai/Kimi-K2-Instruct), as strata's tokenizer/tiktoken.h has it.
KIMI_PATTERN = "|".join([
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])
NUM_RESERVED_SPECIAL_TOKENS = 256

# added_tokens_decoder entries, by offset from the first id after the ranks: Kimi K2's names, one spelt
# with non-ASCII characters (its text is its UTF-8 bytes), and one not special (kept by skip_special_tokens).
NAMED_SPECIALS = {0: "[BOS]", 1: "[EOS]", 2: "<|im_end|>", 3: "<|im_user|>", 4: "<|im_assistant|>",
                  5: "<|start_header_id|>", 6: "<|end_header_id|>", 7: "[EOT]", 8: "<|im_system|>",
                  9: "<|im_middle|>", 11: "<|tool_calls_section_begin|>", 12: "<|tool_calls_section_end|>",
                  13: "<|tool_call_begin|>", 14: "<|tool_call_argument_begin|>", 15: "<|tool_call_end|>",
                  40: "<｜end▁of▁sentence｜>", 41: "<think>"}
NOT_SPECIAL = {41}

EXTRA_LINES = [
    # Contractions in every case (Kimi's pattern matches them case-insensitively, glued to the word).
    "I'M here, YOU'RE there, he'S, They'Ll, we'VE, it'D, don'T", "'s 't 're 've 'm 'll 'd", "O'Neil's DON'T",
    "ABC'S abc's AbC'Re", "x'ſ y'K", "MixedCase WordsLikeThis andTHIS", "ǅemal ǈ Ǌ",
    # Han runs apart from kana, Hangul and Latin; full-width punctuation.
    "中文English混合テキスト", "日本語のテキストです。漢字とかな", "我爱北京天安门123abc", "汉字,汉字。汉字！", "한국어中文",
    "𠀀𠀁 CJK extension B", "〆々〇",
    # Digits (split in threes), whitespace runs, newlines.
    "1234567890", "12 345 6789 0", "٣٤٥ ४५६", "a  b   c    d", "   leading", "trailing   ", "x\n\ny", "\r\n\r\n",
    " \n \n ", "\t\t\tx", "line1\nline2\r\nline3\rline4", "a \n", "   \n\n   x", "\u3000\u3000y",
    # Emoji, marks, symbols.
    "😀😀 👍🏽 👨‍👩‍👧‍👦 🇫🇷", "e\u0301\u0301", "Ω≈ç√∫", "→←↑↓", "©®™",
    # Special tokens inside text, glued and repeated; reserved ones by name; a near miss.
    "hello<|im_end|>world", "[BOS][EOS]", "<|im_user|>user<|im_middle|>hi<|im_end|><|im_assistant|>",
    "<|im_end|><|im_end|>", "<|im_end|", "[BOS ]", "a<｜end▁of▁sentence｜>b", "<think>why</think>",
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{}<|tool_call_end|>",
    # Long pieces (merged through many steps) and code.
    "a" * 3000, "ab" * 1500, "ภาษาไทย" * 200, "def f(x):\n    return {'k': [1, 2, 3]}  # comment\n",
]


def _kimi_specials(named: dict[int, str], num_ranks: int) -> dict[str, int]:
    """tokenization_kimi.py: {added_tokens_decoder.get(i, f"<|reserved_token_{i}|>"): i} over the reserved ids."""
    return {named.get(i, f"<|reserved_token_{i}|>"): i for i in range(num_ranks, num_ranks + NUM_RESERVED_SPECIAL_TOKENS)}


def _bytes_to_unicode() -> list[str]:
    """GPT-2's byte-level alphabet: entry b is the character that stands for byte b."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


def _train_ranks(corpus: list[str]) -> dict[bytes, int]:
    """A byte-level BPE trained with Kimi's pre-tokenizer; its vocabulary in id order becomes the ranks."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(KIMI_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    trainer = trainers.BpeTrainer(vocab_size=5000, min_frequency=2, show_progress=False, max_token_length=24,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    byte_of = {ch: b for b, ch in enumerate(_bytes_to_unicode())}
    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    return {bytes(byte_of[c] for c in token): rank for rank, (token, _) in enumerate(vocab)}


def _write_checkpoint(directory, ranks: dict[bytes, int]) -> tuple[tiktoken.Encoding, set[int]]:
    """tiktoken.model + tokenizer_config.json in `directory`; returns the oracle and the ids decode skips."""
    directory.mkdir(parents=True)
    lines = [f"{base64.b64encode(token).decode()} {rank}" for token, rank in sorted(ranks.items(), key=lambda kv: kv[1])]
    (directory / "tiktoken.model").write_text("\n".join(lines) + "\n", encoding="ascii")
    n = len(ranks)
    named = {n + offset: content for offset, content in NAMED_SPECIALS.items()}
    config = {
        "tokenizer_class": "TikTokenTokenizer",
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
        "added_tokens_decoder": {
            str(i): {"content": c, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                     "special": i - n not in NOT_SPECIAL}
            for i, c in named.items()
        },
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")
    specials = _kimi_specials(named, n)
    skipped = {i for i in specials.values() if i - n not in NOT_SPECIAL}
    encoding = tiktoken.Encoding(name="kimi_test", pat_str=KIMI_PATTERN, mergeable_ranks=ranks, special_tokens=specials)
    return encoding, skipped


@pytest.fixture(scope="module")
def tiktoken_corpus(corpus) -> list[str]:
    n = 256 * 1024  # an id past the reserved window in any vocabulary here, named in text to show it is plain
    reserved = ["<|reserved_token_5100|>", f"<|reserved_token_{n}|>"]
    rng = random.Random(7)
    glued = []
    for _ in range(300):
        parts = [rng.choice(EXTRA_LINES[:-4] + list(NAMED_SPECIALS.values()) + reserved) for _ in range(rng.randint(2, 6))]
        glued.append(rng.choice(["", " ", "\n"]).join(parts))
    return corpus + EXTRA_LINES + reserved + glued


@pytest.fixture(scope="module")
def vocabularies(tmp_path_factory, tiktoken_corpus) -> dict[str, tuple]:
    """{name: (checkpoint directory, tiktoken oracle, ids skip_special_tokens drops)}"""
    root = tmp_path_factory.mktemp("tiktoken")
    train = F.training_text() + EXTRA_LINES * 20
    trained = _train_ranks(train)
    tokens = list(trained)
    random.Random(11).shuffle(tokens)
    shuffled = {token: rank for rank, token in enumerate(tokens)}
    out = {}
    for name, ranks in [("trained", trained), ("shuffled", shuffled)]:
        encoding, skipped = _write_checkpoint(root / name, ranks)
        out[name] = (root / name, encoding, skipped)
    return out


def test_the_vocabularies_exercise_merging(vocabularies, tiktoken_corpus):
    """Most lines need merges (pieces that are not whole tokens), and the reserved window sits after the ranks."""
    _, encoding, _ = vocabularies["trained"]
    n = encoding.n_vocab - NUM_RESERVED_SPECIAL_TOKENS
    assert n >= 4000
    assert encoding.encode("[BOS]", allowed_special="all") == [n]
    ids = [i for line in tiktoken_corpus for i in encoding.encode(line, allowed_special="all")]
    assert len(set(ids)) > n // 2


@pytest.mark.parametrize("name", ["trained", "shuffled"])
def test_encode_matches_tiktoken(strata_tokenize, vocabularies, tiktoken_corpus, name, record):
    directory, encoding, _ = vocabularies[name]
    mismatches = []
    for flags in ([], ["--add-special-tokens"]):  # Kimi's tokenizer adds nothing either way
        got = F.run_cli(strata_tokenize, directory, tiktoken_corpus, *flags)
        for line, ids in zip(tiktoken_corpus, got):
            want = encoding.encode(line, allowed_special="all")
            if ids != want:
                mismatches.append(f"  {line[:80]!r}\n    tiktoken {want[:24]}\n    strata   {ids[:24]}")
    total = 2 * len(tiktoken_corpus)
    record(f"tiktoken encode ({name})", total - len(mismatches), total)
    if mismatches:
        pytest.fail(f"{len(mismatches)}/{total} encodings differ from tiktoken; first ones:\n" + "\n".join(mismatches[:8]),
                    pytrace=False)


def _decode_inputs(encoding, corpus, seed: int) -> list[list[int]]:
    """Each line's ids, its last two thirds and its first half (cuts inside characters), and random id
    sequences over the whole vocabulary, special and reserved ids and ids past it included (invalid UTF-8)."""
    seqs = []
    for line in corpus:
        ids = encoding.encode(line, allowed_special="all")
        seqs += [ids, ids[len(ids) // 3:], ids[: len(ids) // 2]]
    rng = random.Random(seed)
    for _ in range(500):
        seqs.append([rng.randrange(encoding.n_vocab + 8) for _ in range(rng.randint(1, 12))])
    return seqs


def _tiktoken_decode(encoding, ids: list[int], skipped: set[int] | None) -> str:
    kept = [i for i in ids if i < encoding.n_vocab and (skipped is None or i not in skipped)]
    return encoding.decode(kept)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("skip_special_tokens", [False, True], ids=["keep", "skip"])
@pytest.mark.parametrize("name", ["trained", "shuffled"])
def test_decode_matches_tiktoken(strata_tokenize, vocabularies, tiktoken_corpus, name, skip_special_tokens, stream,
                                 record):
    directory, encoding, skipped = vocabularies[name]
    seqs = _decode_inputs(encoding, tiktoken_corpus, seed=len(name))
    flags = ["--decode"] + (["--skip-special-tokens"] if skip_special_tokens else []) + (["--stream"] if stream else [])
    got = F.run_cli(strata_tokenize, directory, seqs, *flags)
    mismatches = []
    for ids, answer in zip(seqs, got):
        want = _tiktoken_decode(encoding, ids, skipped if skip_special_tokens else None)
        # Streamed, only complete text comes out: no chunk carries U+FFFD unless the full decode has one.
        text = "".join(answer) if stream else answer
        if text != want or (stream and "\ufffd" not in want and any("\ufffd" in c for c in answer)):
            mismatches.append(f"  {ids[:16]}\n    tiktoken {want[:80]!r}\n    strata   {answer if stream else text[:80]!r}")
    record("tiktoken streaming decode" if stream else "tiktoken decode", len(seqs) - len(mismatches), len(seqs))
    if mismatches:
        pytest.fail(f"{len(mismatches)}/{len(seqs)} decodes differ from tiktoken; first ones:\n" + "\n".join(mismatches[:8]),
                    pytrace=False)


# ---------------------------------------------------------------------------------------------------
# Malformed checkpoints: exit 2, the message naming the file and line (or JSON path).

def _all_bytes() -> list[str]:
    """A minimal valid rank file: the 256 single bytes."""
    return [f"{base64.b64encode(bytes([b])).decode()} {b}" for b in range(256)]


@pytest.mark.parametrize("lines, message", [
    (_all_bytes() + ["!!!! 256"], "tiktoken.model: line 257: bad base64"),
    (_all_bytes() + ["QUI= x"], 'tiktoken.model: line 257: rank "x" is not a decimal integer'),
    (_all_bytes() + ["QUI= 255"], "tiktoken.model: line 257: rank 255 is already the rank of line 256"),
    (_all_bytes() + ["QUI= 300"], "tiktoken.model: line 257: rank 300 leaves a gap"),
    (_all_bytes() + ["QQ== 256"], "tiktoken.model: line 257: the token is already on line 66"),
    (_all_bytes() + ["QUI="], 'tiktoken.model: line 257: expected "<base64 token> <rank>"'),
    ([line.split()[0] + f" {rank}" for rank, line in enumerate(_all_bytes()[1:])],
     "tiktoken.model: no token for the byte 0x00"),
    (["Q" * 5000 + " 0"], "tiktoken.model: line 1: longer than 4096 bytes"),
])
def test_malformed_tiktoken_model_exits_2_naming_the_line(strata_tokenize, tmp_path, lines, message):
    directory = tmp_path / "ckpt"
    directory.mkdir()
    (directory / "tiktoken.model").write_text("\n".join(lines) + "\n", encoding="utf-8")
    proc = subprocess.run([str(strata_tokenize), "--tokenizer", str(directory)], input=b'"hi"\n', capture_output=True,
                          timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr.decode(), proc.stderr


def test_bad_added_tokens_decoder_names_the_json_path(strata_tokenize, tmp_path):
    directory = tmp_path / "ckpt"
    directory.mkdir()
    (directory / "tiktoken.model").write_text("\n".join(_all_bytes()) + "\n", encoding="utf-8")
    config = {"added_tokens_decoder": {"256": {"content": "[BOS]"}, "257": {"content": "[BOS]"}}}
    (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    proc = subprocess.run([str(strata_tokenize), "--tokenizer", str(directory)], input=b'"hi"\n', capture_output=True,
                          timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert 'tokenizer_config.json: added_tokens_decoder.257: "[BOS]" is the token of both id 256 and id 257' in \
        proc.stderr.decode(), proc.stderr
