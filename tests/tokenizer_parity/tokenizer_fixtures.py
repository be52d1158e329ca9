"""Tokenizers and corpus for the tokenizer parity tests, built live with the `tokenizers` library.

No files come from a model hub: each family's tokenizer.json is trained here on text this module
writes, in that family's real layout (normalizer, pre-tokenizer, model options, decoder,
post-processor, special tokens), with vocabularies of a few thousand tokens so that merges matter.
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import subprocess
import unicodedata

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

REPO = pathlib.Path(__file__).resolve().parents[2]

LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Special-token strings of every family; the corpus glues them into text so that each tokenizer
# meets its own tokens and the others' (which it must treat as plain text).
ALL_SPECIAL_STRINGS = [
    "<|endoftext|>", "<s>", "</s>", "<unk>", "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>",
    "<|start_header_id|>", "<|end_header_id|>", "<|im_start|>", "<|im_end|>", "[INST]", "[/INST]",
    "<tool>", "<|fim|>", "zz",
]


def strata_tokenize_path() -> pathlib.Path:
    build = pathlib.Path(os.environ.get("STRATA_BUILD_DIR", REPO / "build"))
    return build / "tokenizer" / "strata-tokenize"


# ---------------------------------------------------------------------------------------------------
# Text

FRAGMENTS = {
    "latin": ["café", "naïve", "résumé", "façade", "Ångström", "Øresund", "São Paulo", "Kraków", "Dvořák",
              "Straße", "œuvre", "İstanbul", "ÉCOLE", "garçon", "jalapeño", "Škoda", "Łódź", "fjörður"],
    "english": ["The quick brown fox jumps over the lazy dog.", "I'm sure they'll say we've done it.",
                "Don't STOP; it's FINE, isn't it?", "She'S here—WE'LL see.", "hello world", "Hello, World!",
                "tokenization matters", "A man, a plan, a canal: Panama.", "e-mail me at foo.bar@example.com",
                "https://example.org/path?query=1&x=y#frag", "the the the", "pizzazz", "zz top", "buzz zz!"],
    "cyrillic": ["Привет, как дела?", "Съешь же ещё этих мягких французских булок.", "Москва", "ЁЛКА ёлка"],
    "greek": ["Καλημέρα κόσμε", "ξεσκεπάζω την ψυχοφθόρα βδελυγμία", "ΣΊΣΥΦΟΣ σοφός"],
    "arabic": ["مرحبا بالعالم، كيف حالك؟", "اللغة العربية جميلة", "١٢٣ ٤٥٦"],
    "hebrew": ["שלום עולם, מה שלומך?", "עברית"],
    "devanagari": ["नमस्ते दुनिया, आप कैसे हैं?", "हिन्दी भाषा", "१२३४"],
    "thai": ["สวัสดีชาวโลก", "ภาษาไทยไม่มีช่องว่าง"],
    "cjk": ["你好，世界！", "今天天气很好。", "こんにちは世界、カタカナとひらがな。", "漢字も。", "中文分词很难"],
    "korean": ["안녕하세요 세계", "한국어 문장입니다.", "ㄱㄴㄷ"],
    "emoji": ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇫🇷🇯🇵", "❤️", "🧑🏿‍💻", "🤖🤖🤖", "✨", "👩🏻‍🔬"],
    "combining": ["e\u0301", "a\u0308o\u0308u\u0308", "n\u0303", "Z\u0334\u0321\u032aa\u0338\u031fl\u0335g\u0336o\u0337",
                  "\u0301leading mark", "q\u0307\u0323"],
    "code": ["def f(x):\n    return x**2  # square", "for (int i = 0; i < n; ++i) { sum += a[i]; }",
             '{"a": [1, 2, 3], "b": null}', '<div class="x">&amp;</div>', "SELECT * FROM t WHERE id=42;",
             "x = y ** 2 // 3 % 4", "#include <vector>", "fn main() -> Result<(), Box<dyn Error>> {}",
             "    indented\n\tand tabbed", "a\\nb\\tc"],
    "numbers": ["3.14159", "1,234,567", "1e-9", "0x1F", "2024-06-01", "+44 20 7946 0958", "99.9%", "-0.5",
                "12345678901234567890"],
    "odd": ["▁", "▁▁x", "Ġ", "<0x41>", "\ufffd", "\x00", "\x1b[31mred\x1b[0m", "\u00a0nbsp", "\u3000ideographic",
            "\u200bzero width", "\u2028line sep", "ﬁ ligature", "①②③", "Ⅻ", "㎞", "ｆｕｌｌｗｉｄｔｈ"],
}
WHITESPACE = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", " \t \n ", "\u00a0", "    "]


def _number(rng: random.Random) -> str:
    return str(rng.randrange(10 ** rng.randint(0, 20)))


def _long_word(rng: random.Random) -> str:
    kind = rng.randrange(5)
    if kind == 0:
        return rng.choice("abcxyz") * rng.randint(50, 400)
    if kind == 1:
        return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(60, 300)))
    if kind == 2:
        return "supercalifragilistic" * rng.randint(3, 12)
    if kind == 3:
        return "".join(rng.choice("0123456789") for _ in range(rng.randint(40, 120)))
    return "".join(rng.choice("中文한국어😀é") for _ in range(rng.randint(30, 100)))


def _fragment(rng: random.Random, specials: bool) -> str:
    r = rng.random()
    if r < 0.08:
        return _number(rng)
    if r < 0.11:
        return _long_word(rng)
    if specials and r < 0.22:
        return rng.choice(ALL_SPECIAL_STRINGS)
    group = rng.choice(list(FRAGMENTS))
    text = rng.choice(FRAGMENTS[group])
    if group in ("latin", "english", "combining") and rng.random() < 0.3:
        text = unicodedata.normalize(rng.choice(["NFD", "NFC", "NFKD"]), text)
    return text


def make_line(rng: random.Random, specials: bool = True) -> str:
    parts = []
    for _ in range(rng.randint(1, 7)):
        parts.append(_fragment(rng, specials))
        # Glue: usually a space, sometimes nothing (special tokens glued to words), sometimes runs.
        g = rng.random()
        parts.append(" " if g < 0.6 else "" if g < 0.8 else rng.choice(WHITESPACE))
    line = "".join(parts[:-1])
    if rng.random() < 0.15:
        line = rng.choice(WHITESPACE) + line
    if rng.random() < 0.15:
        line = line + rng.choice(WHITESPACE)
    return line


def build_corpus(n: int = 2400, seed: int = 1234) -> list[str]:
    """The parity corpus: n lines (n >= 2000), every line a string a tokenizer must encode."""
    rng = random.Random(seed)
    lines = ["", " ", "  ", "\n", "\t", "a", "<s>", "<s><s>", "<|endoftext|>", "hello<|endoftext|>world",
             " <|im_start|>user\nhi<|im_end|> ", "[INST] hi [/INST]", "zz", "zz zz", "pizzazz", " <tool> ",
             "<tool>x<tool>", "<|fim|>  spaced  <|fim|>", "▁hello ▁▁world", "\ufffd", "x" * 1000]
    # Every fragment on its own, then random mixtures.
    for group in FRAGMENTS.values():
        lines.extend(group)
    lines.extend(ALL_SPECIAL_STRINGS)
    while len(lines) < n:
        lines.append(make_line(rng))
    return lines


def training_text(seed: int = 99, n: int = 4000) -> list[str]:
    rng = random.Random(seed)
    text = [make_line(rng, specials=False) for _ in range(n)]
    # Plain prose repeated so common words get whole-word tokens, as in real vocabularies.
    prose = " ".join(FRAGMENTS["english"]) + " " + " ".join(FRAGMENTS["latin"])
    text.extend([prose] * 50)
    return text


# ---------------------------------------------------------------------------------------------------
# Tokenizers, one builder per family


def _byte_level_trainer(vocab_size: int, specials: list[str]) -> trainers.BpeTrainer:
    return trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=specials,
                               initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)


def _with_json(tok: Tokenizer, edit) -> Tokenizer:
    data = json.loads(tok.to_str())
    edit(data)
    return Tokenizer.from_str(json.dumps(data, ensure_ascii=False))


def _merges_as_strings(data: dict) -> None:
    """Older files (GPT-2's, Llama-2's) write merges as "left right" strings; newer ones as pairs.
    (`tokenizers` writes pairs, so build_all rewrites the file for the families that use strings.)"""
    merges = data["model"]["merges"]
    assert all(" " not in a and " " not in b for a, b in merges)
    data["model"]["merges"] = [f"{a} {b}" for a, b in merges]


def build_gpt2(train: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.train_from_iterator(train, _byte_level_trainer(3000, ["<|endoftext|>"]))
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_tokens([AddedToken("<tool>"), AddedToken("zz", single_word=True, normalized=False)])
    tok.add_special_tokens([AddedToken("<|fim|>", lstrip=True, rstrip=True, special=True, normalized=False)])
    return tok


def build_llama3(train: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    specials += [f"<|reserved_special_token_{i}|>" for i in range(8)]
    tok.train_from_iterator(train, _byte_level_trainer(3500, specials))
    tok.decoder = decoders.ByteLevel()
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos)]),
    ])

    def edit(data):
        data["model"]["ignore_merges"] = True
    return _with_json(tok, edit)


def build_qwen2(train: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.train_from_iterator(train, _byte_level_trainer(3000, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]))
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_tokens([AddedToken("<tool>", normalized=True, lstrip=True)])
    return tok


def _sentencepiece_style(train: list[str], vocab_size: int, specials: list[str]) -> Tokenizer:
    """A Llama-2 style BPE: words marked with "▁", a limited alphabet, byte_fallback and the 256
    "<0xAB>" tokens right after the special tokens, as Llama-2's and Mistral's vocabularies have."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tok.train_from_iterator(train, trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=specials,
                                                       limit_alphabet=120, show_progress=False))
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    ordered = sorted(vocab.items(), key=lambda kv: kv[1])
    head = [t for t, _ in ordered if t in specials]
    rest = [t for t, _ in ordered if t not in specials]
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    new_vocab = {t: i for i, t in enumerate(head + byte_tokens + rest)}
    data["model"]["vocab"] = new_vocab
    data["model"]["byte_fallback"] = True
    data["model"]["fuse_unk"] = True
    data["model"]["unk_token"] = "<unk>"
    for added in data["added_tokens"]:
        added["id"] = new_vocab[added["content"]]
    return Tokenizer.from_str(json.dumps(data, ensure_ascii=False))


def _llama_decoder():
    return decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                              decoders.Strip(content=" ", left=1, right=0)])


def build_llama2(train: list[str]) -> Tokenizer:
    """Llama-2 / Mistral-7B-v0.1 (legacy): Prepend("▁") + Replace(" ", "▁") normalizer, no
    pre-tokenizer (a whole piece is one BPE word), merges as strings."""
    tok = _sentencepiece_style(train, 3000, ["<unk>", "<s>", "</s>"])
    tok.pre_tokenizer = None
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = _llama_decoder()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B:1",
                                                       special_tokens=[("<s>", tok.token_to_id("<s>"))])
    tok.add_special_tokens(["[INST]", "[/INST]"])
    return tok


def build_mistral(train: list[str]) -> Tokenizer:
    """Mistral / Llama-2 as converted today (legacy=false): a Metaspace pre-tokenizer that prepends
    "▁" only at the start of the input (prepend_scheme "first") and does not split."""
    tok = _sentencepiece_style(train, 3000, ["<unk>", "<s>", "</s>"])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.decoder = _llama_decoder()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", pair="<s> $A $B:1",
                                                       special_tokens=[("<s>", tok.token_to_id("<s>")),
                                                                       ("</s>", tok.token_to_id("</s>"))])
    tok.add_special_tokens([AddedToken("[INST]", special=True, normalized=False, rstrip=True),
                            AddedToken("[/INST]", special=True, normalized=False, lstrip=True)])
    return tok


def build_metaspace_split(train: list[str]) -> Tokenizer:
    """Metaspace that splits words (prepend_scheme "always"), Digits, a Metaspace decoder."""
    tok = _sentencepiece_style(train, 2500, ["<unk>", "<s>", "</s>"])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True),
        pre_tokenizers.Digits(individual_digits=True),
    ])
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace(replacement="▁", prepend_scheme="always")])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    tok.add_tokens([AddedToken("<tool>", normalized=True)])
    return tok


# family -> (builder, whether its file writes merges as "left right" strings)
FAMILIES = {
    "gpt2": (build_gpt2, True),
    "llama3": (build_llama3, False),
    "qwen2": (build_qwen2, False),
    "llama2": (build_llama2, True),
    "mistral": (build_mistral, False),
    "metaspace_split": (build_metaspace_split, False),
}


def build_all(root: pathlib.Path) -> dict[str, tuple[pathlib.Path, Tokenizer]]:
    """Trains every family, writes <root>/<family>/tokenizer.json, returns {family: (dir, tokenizer)}."""
    train = training_text()
    out = {}
    for name, (build, string_merges) in FAMILIES.items():
        data = json.loads(build(train).to_str())
        if string_merges:
            _merges_as_strings(data)
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False, indent=1), encoding="utf-8")
        # Re-read what was written, so the oracle is exactly the file strata reads.
        out[name] = (d, Tokenizer.from_file(str(d / "tokenizer.json")))
    return out


# ---------------------------------------------------------------------------------------------------
# Running strata-tokenize


def run_cli(binary: pathlib.Path, tokenizer_dir: pathlib.Path, inputs: list, *flags: str) -> list:
    """Sends `inputs` (strings to encode or id lists to decode) as JSON Lines, returns the parsed
    answers, one per input. Raw UTF-8 on the wire, as a real caller sends it."""
    payload = "".join(json.dumps(x, ensure_ascii=False) + "\n" for x in inputs)
    proc = subprocess.run([str(binary), "--tokenizer", str(tokenizer_dir), *flags], input=payload.encode("utf-8"),
                          capture_output=True, timeout=600)
    assert proc.returncode == 0, f"strata-tokenize {' '.join(flags)} exited {proc.returncode}: {proc.stderr.decode()}"
    # Split on "\n" only: answers may hold U+2028 and other characters str.splitlines() breaks at.
    lines = proc.stdout.decode("utf-8").split("\n")
    assert lines[-1] == "", "output does not end with a newline"
    answers = [json.loads(line) for line in lines[:-1]]
    assert len(answers) == len(inputs), f"{len(inputs)} inputs, {len(answers)} answers"
    return answers
