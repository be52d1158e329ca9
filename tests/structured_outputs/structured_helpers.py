"""Shared by the structured-output tests: the checkpoints (a tiny random Llama beside a tokenizer of each kind strata
reads), the checks of what comes back (JSON Schema validation, JSON prefixes, small grammar recognisers) and the
request helpers (HTTP and gRPC).

The model. A random-weight model makes the grammar, not the model, responsible for validity; but a model whose
logits are noise wanders in a JSON string for hundreds of tokens before it meets one of the few tokens that close
it, so few samples would end. The checkpoint here is random in every weight but one direction: hidden dimension 0
is a constant the layers neither read nor write (their input norms weigh it 0, their output projections' rows 0
are 0), and the head's column 0 turns it into a fixed bias of `CLOSER_BIAS` on every token whose text holds one of
`"`, `}`, `]`, `,` (and EOS) and a small penalty on tokens of whitespace alone. Sampling stays random at every
step, driven by the prompt and the sequence; only its drift is towards closing what is open.

Formats. The engine's (xgrammar 0.2.8) `format` grammars are regular approximations: "date" and "date-time" take
day 01-31 in every month (RFC 3339's ABNF, without section 5.7's month lengths) and "ipv4" octets 0-255 with
leading zeros ("010.1.1.1"); Python's checkers (and JSON-Schema-Test-Suite) refuse both. FORMAT_CHECKER checks
each format as the grammar defines it (and refuses what neither allows): the gaps are named here, not hidden."""

from __future__ import annotations

import base64
import concurrent.futures
import json
import pathlib
import re
import shutil
import sys
import urllib.error
import urllib.request

import jsonschema

HERE = pathlib.Path(__file__).resolve().parent
TESTS = HERE.parent
for folder in ("integration", "runtime_parity", "tokenizer_parity", "generate", "group"):
    if str(TESTS / folder) not in sys.path:
        sys.path.insert(0, str(TESTS / folder))

import schema_corpus as SC  # noqa: E402

# Qwen3's chat template, committed in tests/chat_template_parity/templates (sources.json names its source).
TEMPLATE = TESTS / "chat_template_parity" / "templates" / "Qwen-Qwen3-0.6B.jinja"

MODEL_NAME = "jsonish"
MAX_GRAMMAR_BYTES = 64 * 1024  # the servers' --max-grammar-bytes: the refusal tests exceed it
# Flags every structured-output server gets: room for chat prompts with tools and 512 new tokens, 16 sequences at
# once, the Hermes tool-call parser (Qwen3's template), and the grammar-size cap.
SERVER_FLAGS = ["--served-model-name", MODEL_NAME, "--max-context", "2048", "--max-batch", "16",
                "--tool-call-parser", "hermes", "--max-grammar-bytes", str(MAX_GRAMMAR_BYTES)]
CLOSER_BIAS = 4.0  # the logit bias of closing tokens, in units where the noise of the other dimensions is ~2
WEIGHT_SCALE = 2.0  # matrices at 2x transformers' init: each step's distribution depends on the context

# --- tokenizers and checkpoints ---------------------------------------------------------------------------------


def training_text() -> list[str]:
    """tokenizer_parity's varied text (many scripts, code, prose) and the corpus's schemas as JSON, compact and
    indented, so that the vocabularies hold JSON pieces that span grammar boundaries (`{"`, `":`, `"},`)."""
    import tokenizer_fixtures as F

    schemas = [json.dumps(s.schema) for s in SC.CORPUS] + [json.dumps(s.schema, indent=2) for s in SC.CORPUS]
    return F.training_text() + schemas * 5


class Vocabulary:
    """A tokenizer written into a checkpoint directory: its files, the ids of BOS/EOS, how many ids it has and the
    text of each id (for the closing-token bias)."""

    def __init__(self, kind: str, size: int, bos: int, eos: int, texts: list[str]):
        self.kind, self.size, self.bos, self.eos, self.texts = kind, size, bos, eos, texts


def byte_level(directory: pathlib.Path, train: list[str]) -> Vocabulary:
    """Llama 3's layout (tokenizer_fixtures.build_llama3): its split regex, a byte-level BPE of 3500 ids."""
    import tokenizer_fixtures as F

    tok = F.build_llama3(train)
    tok.save(str(directory / "tokenizer.json"))
    texts = [tok.decode([i], skip_special_tokens=False) for i in range(tok.get_vocab_size())]
    return Vocabulary("byte_level", tok.get_vocab_size(), tok.token_to_id("<|begin_of_text|>"),
                      tok.token_to_id("<|end_of_text|>"), texts)


def byte_fallback(directory: pathlib.Path, train: list[str]) -> Vocabulary:
    """Mistral's / Llama-2's layout as transformers converts it today (tokenizer_fixtures.build_mistral): a BPE over
    a limited alphabet with byte_fallback and the 256 <0xAB> tokens, a Metaspace pre-tokenizer (prepend "first", no
    split), the Replace/ByteFallback/Fuse/Strip decoder; <s> before the prompt (its </s> after it left out)."""
    import tokenizer_fixtures as F
    from tokenizers import processors

    tok = F.build_mistral(train)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    tok.save(str(directory / "tokenizer.json"))
    texts = [tok.decode([i], skip_special_tokens=False) for i in range(tok.get_vocab_size())]
    return Vocabulary("byte_fallback", tok.get_vocab_size(), tok.token_to_id("<s>"), tok.token_to_id("</s>"), texts)


def tiktoken_vocabulary(directory: pathlib.Path, train: list[str]) -> Vocabulary:
    """Kimi K2's layout (tokenizer/tiktoken.h): tiktoken.model (base64 bytes and rank per line) from a byte-level
    BPE trained here, [BOS]/[EOS] in tokenizer_config.json's added_tokens_decoder at the first reserved ids."""
    import tokenizer_fixtures as F

    tok = F.build_llama3(train)
    alphabet = {ch: b for b, ch in enumerate(_bytes_to_unicode())}
    ranked = sorted(((t, i) for t, i in tok.get_vocab().items() if t not in _LLAMA3_SPECIALS), key=lambda kv: kv[1])
    ranks = [bytes(alphabet[c] for c in token) for token, _ in ranked]
    lines = [f"{base64.b64encode(token).decode()} {rank}" for rank, token in enumerate(ranks)]
    (directory / "tiktoken.model").write_text("\n".join(lines) + "\n", encoding="ascii")
    n = len(ranks)
    config = {
        "tokenizer_class": "TikTokenTokenizer", "bos_token": "[BOS]", "eos_token": "[EOS]",
        "added_tokens_decoder": {str(n + i): {"content": c, "lstrip": False, "normalized": False, "rstrip": False,
                                              "single_word": False, "special": True}
                                 for i, c in enumerate(["[BOS]", "[EOS]", "<|im_end|>"])},
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    reserved = 256  # Kimi's num_reserved_special_tokens: ids n .. n+255 are special
    texts = [t.decode("utf-8", errors="replace") for t in ranks] + [""] * reserved
    return Vocabulary("tiktoken", n + reserved, n, n + 1, texts)


_LLAMA3_SPECIALS = {"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                    *(f"<|reserved_special_token_{i}|>" for i in range(8))}


def _bytes_to_unicode() -> list[str]:
    """GPT-2's byte-level alphabet: entry b is the character that stands for byte b."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


TOKENIZERS = {"byte_level": byte_level, "byte_fallback": byte_fallback, "tiktoken": tiktoken_vocabulary}


def jsonish_checkpoint(directory: pathlib.Path, kind: str, train: list[str], seed: int = 0) -> Vocabulary:
    """A 4-layer Llama (hidden 64) beside a tokenizer of `kind`, with config.json's eos_token_id the tokenizer's
    EOS, a vocabulary of 64 padding ids beyond the tokenizer's (rounded up to 64: rows no grammar may allow), the
    closing-token bias described above, and Qwen3's chat template."""
    import torch
    import transformers

    directory.mkdir(parents=True, exist_ok=True)
    vocab = TOKENIZERS[kind](directory, train)
    rows = (vocab.size + 63) // 64 * 64 + 64
    config = transformers.LlamaConfig(vocab_size=rows, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                                      rms_norm_eps=1e-5, bos_token_id=vocab.bos, eos_token_id=vocab.eos,
                                      pad_token_id=None, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).eval()
    bias = torch.zeros(rows)
    for i, text in enumerate(vocab.texts):
        if any(c in text for c in '"}],'):
            bias[i] = 1.0
        elif text and not text.strip():
            bias[i] = -0.125
    bias[vocab.eos] = 1.0
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(WEIGHT_SCALE)
        for layer in model.model.layers:
            layer.input_layernorm.weight[0] = 0.0
            layer.post_attention_layernorm.weight[0] = 0.0
            layer.self_attn.o_proj.weight[0, :] = 0.0
            layer.mlp.down_proj.weight[0, :] = 0.0
        embed = model.model.embed_tokens.weight
        embed[:, 0] = 0.0
        # Dimension 0's constant: as large as the other dimensions together at the final norm (measured on random
        # prompts; it changes their scale through the norms, hence a few rounds), so that the normed dimension 0
        # is about sqrt(hidden / 2) whatever the context.
        seen = {}
        hook = model.model.norm.register_forward_pre_hook(lambda module, args: seen.__setitem__("x", args[0]))
        prompts = torch.randint(0, vocab.size, (4, 32), generator=torch.Generator().manual_seed(seed))
        for _ in range(3):
            model(prompts)
            embed[:, 0] = (seen["x"][..., 1:] ** 2).sum(-1).mean().sqrt()
        model(prompts)
        hook.remove()
        normed0 = (embed[0, 0] / seen["x"].pow(2).mean(-1).sqrt()).mean()
        model.lm_head.weight[:, 0] = bias * CLOSER_BIAS / normed0
    model.save_pretrained(directory, safe_serialization=True)
    shutil.copy(TEMPLATE, directory / "chat_template.jinja")
    return vocab


# --- what comes back ----------------------------------------------------------------------------------------------

_DATE = r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
_TIME = r"([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|0?[0-9][0-9]|0{0,2}[0-9])"
FORMAT_CHECKER = jsonschema.FormatChecker(formats=())
for _name, _pattern in {
    "date": _DATE,  # RFC 3339 full-date's ABNF (day 01-31 in every month, as the grammar)
    "date-time": f"{_DATE}[Tt]{_TIME}",
    "time": _TIME,
    "ipv4": rf"{_OCTET}(\.{_OCTET}){{3}}",  # dotted quad, octets 0-255 (leading zeros allowed, as the grammar)
    "uuid": r"[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}",
    "email": r"[^@\s\"]+@[^@\s\"]+",
}.items():
    FORMAT_CHECKER.checks(_name)(lambda value, _p=re.compile(_pattern): not isinstance(value, str) or
                                 _p.fullmatch(value) is not None)


def schema_errors(instance, schema: dict) -> list[str]:
    """Every way `instance` breaks `schema` (Draft 2020-12, formats as FORMAT_CHECKER checks them)."""
    validator = jsonschema.Draft202012Validator(schema, format_checker=FORMAT_CHECKER)
    return [f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message[:300]}" for e in validator.iter_errors(instance)]


class _Incomplete(Exception):
    pass


class _Invalid(Exception):
    pass


def json_prefix_error(text: str) -> str | None:
    """None when `text` is the beginning of some JSON value (whitespace around it allowed), else what is wrong and
    where. What a sample cut by max_tokens must be: not invalid before its cut."""
    pos = 0
    n = len(text)

    def peek() -> str:
        if pos >= n:
            raise _Incomplete()
        return text[pos]

    def ws():
        nonlocal pos
        while pos < n and text[pos] in " \t\n\r":
            pos += 1

    def literal(word: str):
        nonlocal pos
        for ch in word:
            if peek() != ch:
                raise _Invalid(f"expected {word!r} at {pos}")
            pos += 1

    def string():
        nonlocal pos
        literal('"')
        while True:
            ch = peek()
            if ch == '"':
                pos += 1
                return
            if ch == "\\":
                pos += 1
                esc = peek()
                if esc == "u":
                    pos += 1
                    for _ in range(4):
                        if peek() not in "0123456789abcdefABCDEF":
                            raise _Invalid(f"bad \\u escape at {pos}")
                        pos += 1
                elif esc in '"\\/bfnrt':
                    pos += 1
                else:
                    raise _Invalid(f"bad escape at {pos}")
            elif ord(ch) < 0x20:
                raise _Invalid(f"control character in a string at {pos}")
            else:
                pos += 1

    def number():
        nonlocal pos
        piece = re.compile(r"-?[0-9]*(\.[0-9]*)?([eE][+-]?[0-9]*)?").match(text, pos).group()
        if re.match(r"-?0[0-9]", piece):
            raise _Invalid(f"leading zero at {pos}")
        if pos + len(piece) == n:  # cut inside the number ("-", "1.", "1e+" are beginnings of numbers)
            if re.fullmatch(r"-?([0-9]+(\.[0-9]*)?([eE][+-]?[0-9]*)?)?", piece):
                raise _Incomplete()
            raise _Invalid(f"bad number at {pos}")
        if not re.fullmatch(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?", piece):
            raise _Invalid(f"bad number {piece!r} at {pos}")
        pos += len(piece)

    def value():
        nonlocal pos
        ws()
        ch = peek()
        if ch == "{":
            pos += 1
            ws()
            if peek() == "}":
                pos += 1
                return
            while True:
                ws()
                string()
                ws()
                literal(":")
                value()
                ws()
                ch = peek()
                pos += 1
                if ch == "}":
                    return
                if ch != ",":
                    raise _Invalid(f"expected , or }} at {pos - 1}")
        elif ch == "[":
            pos += 1
            ws()
            if peek() == "]":
                pos += 1
                return
            while True:
                value()
                ws()
                ch = peek()
                pos += 1
                if ch == "]":
                    return
                if ch != ",":
                    raise _Invalid(f"expected , or ] at {pos - 1}")
        elif ch == '"':
            string()
        elif ch in "-0123456789":
            number()
        elif ch in "tfn":
            literal({"t": "true", "f": "false", "n": "null"}[ch])
        else:
            raise _Invalid(f"unexpected {ch!r} at {pos}")

    try:
        value()
        ws()
        if pos < n:
            return f"text after the value at {pos}: {text[pos:pos + 20]!r}"
    except _Incomplete:
        return None
    except _Invalid as e:
        return f"{e} in {text[max(0, pos - 40):pos + 20]!r}"
    return None


def arithmetic_error(text: str) -> str | None:
    """None when `text` is a sentence of ARITHMETIC_EBNF (below): expr := term (("+"|"-") term)*, term := factor
    (("*"|"/") factor)*, factor := number | "(" expr ")", number := [0-9]+, with no spaces."""
    pos = 0

    def expr():
        nonlocal pos
        term()
        while pos < len(text) and text[pos] in "+-":
            pos += 1
            term()

    def term():
        nonlocal pos
        factor()
        while pos < len(text) and text[pos] in "*/":
            pos += 1
            factor()

    def factor():
        nonlocal pos
        if pos < len(text) and text[pos] == "(":
            pos += 1
            expr()
            if pos >= len(text) or text[pos] != ")":
                raise _Invalid(f"expected ) at {pos}")
            pos += 1
            return
        start = pos
        while pos < len(text) and text[pos].isdigit():
            pos += 1
        if pos == start:
            raise _Invalid(f"expected a number or ( at {pos}")

    try:
        expr()
    except _Invalid as e:
        return f"{e}: {text!r}"
    return None if pos == len(text) else f"text after the expression at {pos}: {text!r}"


# xgrammar's EBNF (vLLM's structured_outputs.grammar): arithmetic over non-negative integers, depth bounded by the
# model's will to close (the closing-token bias does not favour ")": the recursion is the grammar's own).
ARITHMETIC_EBNF = r"""root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= number | "(" expr ")"
number ::= [0-9]+
"""

# llama.cpp's GBNF (its `grammar` field): a JSON-ish list of 1 to 4 lowercase words, as llama.cpp's
# grammars/list.gbnf writes lists (bounded repetition {m,n}, character classes, literals).
WORD_LIST_GBNF = r"""root ::= "[" word ("," " "? word){0,3} "]"
word ::= "\"" [a-z]{1,8} "\""
"""
WORD_LIST_RE = re.compile(r'\["[a-z]{1,8}"(, ?"[a-z]{1,8}"){0,3}\]')


# --- requests ---------------------------------------------------------------------------------------------------


def post(url: str, body: dict, timeout: float = 120) -> tuple[int, dict]:
    """POST `body` as JSON: (status, the JSON reply), errors included."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def post_ok(url: str, body: dict, timeout: float = 120) -> dict:
    status, reply = post(url, body, timeout)
    assert status == 200, f"{status} for {json.dumps(body)[:2000]}\n{json.dumps(reply)[:2000]}"
    return reply


def stream(url: str, body: dict, timeout: float = 120) -> list[dict]:
    """POST with stream: true; the server-sent events' JSON objects up to [DONE]."""
    request = urllib.request.Request(url, data=json.dumps({**body, "stream": True}).encode(),
                                     headers={"Content-Type": "application/json"})
    events = []
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        assert reply.status == 200
        for raw in reply:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[len("data:"):].strip()
            if data == "[DONE]":
                return events
            events.append(json.loads(data))
    raise AssertionError(f"the stream ended without [DONE]: {events[-3:]}")


def run_all(calls, workers: int = 16):
    """Runs the zero-argument callables at once (the server batches them); their results in order."""
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        return [f.result() for f in [pool.submit(c) for c in calls]]


def choice_text(route: str, choice: dict) -> str:
    return choice["message"]["content"] if route == "chat" else choice["text"]


def grpc_constraint(stubs, kind: str, value) -> dict:
    """GenerateRequest keyword arguments for the constraint oneof (proto/strata/v1/strata.proto, structured_output):
    `kind` one of json_schema (a schema, sent as JSON text), json_object (True), regex, choice (a list), grammar,
    structural_tag (a dict, sent as JSON text)."""
    if kind == "choice":
        return {"choice": stubs.strata.Choices(choices=value)}
    if isinstance(value, (dict, list)) or value is None:
        value = json.dumps(value)
    return {kind: value}
