"""gpt-oss's harmony output (chat_template/harmony.h) against vLLM's `--reasoning-parser gpt_oss` (vLLM's name:
openai_gptoss) and `--tool-call-parser openai`, with the real harmony parser as the oracle.

vLLM reads gpt-oss's output with openai_harmony's StreamableParser (vllm/entrypoints/openai/parser/
harmony_utils.py: parse_output_into_messages, role assistant, strict), installed here (scripts/requirements.txt)
and fed the real o200k_base vocabulary, rebuilt from the copy quicktok-v1 ships and checked against the SHA-256
openai_harmony pins. On top of the parser, vLLM's two rules are restated: parse_chat_output (harmony_utils.py at
0142105b3ddf2edf4c1216ed593bdf9a06672b99: reasoning_content and content, the serving layer's gpt-oss reasoning)
and OpenAIToolParser.extract_tool_calls (vllm/tool_parsers/openai_tool_parser.py at
006b02433fbcd51997b2c0b707bfbe0a8c108b91: calls and content). The text goes to the parser as vLLM's token ids
would: encoded with every special token allowed (strata reads the decoded text with its special tokens kept).

A corpus generated here (analysis, preambles, calls to functions.NAME as the model writes them and as
templates/openai-gpt-oss-120b.jinja writes them back, final answers; JSON and other content types, broken
JSON, unicode, markers inside texts, odd headers, text between messages, cut anywhere) goes through
`strata-chat-template --parse-reasoning gpt_oss [--parse-tool-calls openai] --batch`, whole and streamed in 1-
and 7-byte chunks. Two differences are by design (chat_template/README.md) and counted apart, each checked
against strata's documented result: where harmony's parser raises, vLLM's request fails and strata keeps what
was read before; with several final messages, vLLM's content is the last one's and strata's the first's. And as
for every format, an empty content is null (vLLM's openai parser gives "" for an empty preamble).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.resources
import json
import os
import pathlib
import random
import struct
import subprocess

import pytest

from test_tool_call_parity import STRINGS, WORDS, break_text, random_value

O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"  # openai_harmony's own pin


def _o200k_base(directory: pathlib.Path) -> None:
    """Writes o200k_base.tiktoken (base64 token, rank) from quicktok's table ([u32 count] then [u16 length, bytes,
    u32 rank] each) and checks it is byte for byte the file openai_harmony would download."""
    data = importlib.resources.files("quicktok").joinpath("data/o200k.vocab").read_bytes()
    (count,), pos, entries = struct.unpack_from("<I", data, 0), 4, []
    for _ in range(count):
        (length,) = struct.unpack_from("<H", data, pos)
        token = data[pos + 2:pos + 2 + length]
        (rank,) = struct.unpack_from("<I", data, pos + 2 + length)
        entries.append((rank, token))
        pos += 6 + length
    text = "".join(f"{base64.b64encode(token).decode()} {rank}\n" for rank, token in sorted(entries)).encode()
    assert hashlib.sha256(text).hexdigest() == O200K_SHA256, "quicktok's o200k table is not o200k_base"
    (directory / "o200k_base.tiktoken").write_bytes(text)


@pytest.fixture(scope="module")
def harmony(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiktoken")
    _o200k_base(directory)
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(directory)
    import openai_harmony

    return openai_harmony, openai_harmony.load_harmony_encoding(openai_harmony.HarmonyEncodingName.HARMONY_GPT_OSS)


# --- vLLM's rules --------------------------------------------------------------------------------------------


def parse_output_into_messages(harmony, output: str):
    """The parser after every token of the output, and whether it raised on one (vLLM's request then fails;
    strata keeps the parser's state at that point)."""
    module, encoding = harmony
    parser = module.StreamableParser(encoding, module.Role.ASSISTANT)
    for token in encoding.encode(output, allowed_special="all"):
        try:
            parser.process(token)
        except module.HarmonyError:
            return parser, True
    return parser, False


def parse_chat_output(parser) -> tuple[str | None, str | None]:
    output_msgs = parser.messages
    reasoning_texts = [msg.content[0].text for msg in output_msgs if msg.channel == "analysis"]
    final_texts = [msg.content[0].text for msg in output_msgs
                   if msg.channel == "final" or (msg.channel == "commentary" and not msg.recipient)]
    if parser.current_channel == "analysis" and parser.current_content:
        reasoning_texts.append(parser.current_content)
    elif parser.current_channel == "final" and parser.current_content:
        final_texts.append(parser.current_content)
    elif parser.current_channel == "commentary" and not parser.current_recipient and parser.current_content:
        final_texts.append(parser.current_content)
    reasoning = "\n".join(reasoning_texts)
    final_content = "\n".join(final_texts)
    return reasoning or None, final_content or None


def openai_tool_parser(parser, first_final: bool = False) -> tuple[str | None, list[tuple[str, str]]]:
    """OpenAIToolParser.extract_tool_calls; first_final: strata's rule (the first final message, not the last)."""
    tool_calls = []
    final_content = None
    commentary_content = None
    if len(parser.messages) > 0:
        for msg in parser.messages:
            if len(msg.content) < 1:
                continue
            msg_text = msg.content[0].text
            if msg.recipient and msg.recipient.startswith("functions."):
                if not msg.content_type or "json" in msg.content_type:
                    try:
                        tool_args = json.dumps(json.loads(msg_text))
                    except json.JSONDecodeError:
                        tool_args = msg_text
                else:
                    tool_args = msg_text
                tool_calls.append((msg.recipient.split("functions.")[1], tool_args))
            elif msg.channel == "final":
                if not (first_final and final_content is not None):
                    final_content = msg_text
            elif msg.channel == "commentary" and not msg.recipient:
                commentary_content = msg_text
        if (parser.current_content and final_content is None and parser.current_recipient is None
                and parser.current_channel in [None, "final"]):
            final_content = parser.current_content
    return final_content or commentary_content, tool_calls


# --- the corpus -------------------------------------------------------------------------------------------------

TEXTS = ["The user asks about the weather.", "Let me think.\nStep 1: check.", "", "naïve 日本 😀", "a < b",
         "literal <|channel|>final<|message|> inside", "<|start|>assistant", "<|endoftext|> token", "x <|en",
         "tab\there", "  padded  ", "{\"json\": true}", "\u2028 line sep", "It is sunny, 21 °C."]
# A marker the model writes inside a text ends the message there: what follows is no `<|start|>` (an error).
RARE_TEXTS = ["ends <|end|> early", "ends <|call|>", "<|return|>"]
NAMES = ["get_weather", "search", "f", "läuft", "天気", "a.b", "x_1", ""]


def arguments(rng: random.Random) -> str:
    kind = rng.randrange(8)
    if kind < 4:
        value = {rng.choice(WORDS): random_value(rng) for _ in range(rng.randrange(4))}
        return json.dumps(value, ensure_ascii=rng.randrange(2) == 0, indent=rng.choice([None, None, 2]))
    if kind == 4:
        return json.dumps(random_value(rng))
    return rng.choice(["{\"city\": ", "not json", "{'single': 1}", "", " {} ", "[1, 2]", "\"s\"", "{\"a\": NaN}",
                       "{\"a\": 1e400}", rng.choice(STRINGS)])


def header(rng: random.Random, first: bool, channel: str, extra: str = "") -> str:
    role = "" if first else rng.choice(["<|start|>assistant", "<|start|>assistant", "<|start|>assistant",
                                        "<|start|>assistant ", "<|start|>tool", "<|start|>user"])
    return f"{role}<|channel|>{channel}{extra}<|message|>"


def message(rng: random.Random, first: bool) -> str:
    kind = rng.randrange(24)
    end = rng.choice(["<|end|>", "<|end|>", "<|end|>", "<|return|>", "<|call|>"])
    text = rng.choice(TEXTS) + rng.choice(["", "", rng.choice(TEXTS)])
    if rng.randrange(30) == 0:
        text += rng.choice(RARE_TEXTS)
    if kind < 6:
        return header(rng, first, "analysis") + text + "<|end|>"
    if kind < 10:
        name = rng.choice(NAMES)
        call_end = "<|call|>" if rng.randrange(6) else rng.choice(["<|end|>", "<|return|>"])
        style = rng.randrange(6)
        if style == 0 and not first:  # the template's own order: recipient before the channel
            head = f"<|start|>assistant to=functions.{name}<|channel|>commentary json<|message|>"
        elif style == 1:
            head = header(rng, first, "commentary", f" to=functions.{name}")
        elif style == 2:
            head = header(rng, first, "commentary", f" to=functions.{name} <|constrain|>" +
                          rng.choice(["json", "code", "text", "jsonl"]))
        else:
            head = header(rng, first, "commentary", f" to=functions.{name} <|constrain|>json")
        return head + arguments(rng) + call_end
    if kind < 12:
        return header(rng, first, "commentary") + text + "<|end|>"  # a preamble for the user
    if kind < 20:
        return header(rng, first, "final") + text + rng.choice(["<|return|>", "<|return|>", "<|end|>"])
    odd = rng.choice([
        "<|channel|>analysis to=python<|message|>",
        "<|channel|>commentary to=browser.search <|constrain|>json<|message|>",
        "<|channel|>commentary to=functions.<|message|>", "<|channel|>final stuff more<|message|>",
        "<|message|>", "<|channel|><|message|>", "<|channel|>final to=<|message|>", " to=functions.f<|message|>",
        "<|channel|>final<x<|message|>", "<|channel|>fin\u00a0al<|message|>",
        "<|channel|>commentary<|constrain|>json<|message|>",
        "<|channel|>final extra parts here<|message|>", "assistant<|channel|>final<|message|>"])
    if not first:
        odd = rng.choice(["<|start|>assistant", "<|start|>bogus", "<|start|>bogus to=x", "<|start|>",
                          "<|start|>functions.f to=assistant", "<|start|>Assistant", "<|start|>developer",
                          "\n<|start|>assistant", "garbage<|start|>assistant"]) + odd
    return odd + text + end


def output_of(rng: random.Random) -> str:
    text = ""
    for i in range(rng.randrange(1, 5)):
        text += message(rng, i == 0)
        if "<|channel|>final<|message|>" in text and rng.randrange(5):
            break  # gpt-oss ends its turn with its answer
        if rng.randrange(40) == 0:
            text += rng.choice(["\n", " ", "text", "<|start|", "<|return|>"])
    if rng.randrange(10) == 0:
        text = rng.choice(["Plain text, no harmony at all.", "", "<|channel|>final<|message|>cut"])
    return break_text(rng, text) if rng.randrange(3) == 0 else text


CORPUS_SIZE = 1500


def corpus() -> list[str]:
    rng = random.Random(61)
    return [output_of(rng) for _ in range(CORPUS_SIZE)]


def run(binary, args: list[str], outputs: list[str], chunk: int) -> list[dict]:
    stdin = "".join(json.dumps(o) + "\n" for o in outputs)
    proc = subprocess.run([str(binary), *args, "--batch", "--tool-call-seed", "1", "--stream-chunk", str(chunk)],
                          input=stdin.encode(), capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()
    lines = proc.stdout.decode().split("\n")[:-1]
    assert len(lines) == len(outputs)
    return [json.loads(line) for line in lines]


def expected(harmony, output: str, parsers: str) -> tuple[tuple, str | None]:
    """strata's documented result for `parsers` ("reasoning", "tools", "both"), and the name of the difference
    from vLLM's when there is one."""
    parser, failed = parse_output_into_messages(harmony, output)
    reasoning, content = parse_chat_output(parser)
    if parsers != "reasoning":
        vllm_content, calls = openai_tool_parser(parser)
        content, calls = openai_tool_parser(parser, first_final=True)
    difference = "vLLM's harmony parser raises" if failed else None
    if parsers != "reasoning" and not failed and (content, calls) != (vllm_content, calls):
        difference = "the output has several final messages"
    if parsers != "reasoning" and content == "":
        # vLLM's `final_content or commentary_content` is "" for an empty preamble; strata's empty content is null.
        content = None
        difference = difference or "vLLM's content is an empty preamble"
    if parsers == "reasoning":
        return (reasoning, content), difference
    if parsers == "tools":
        return (content, calls), difference
    return (reasoning, content, calls), difference


ARGS = {"reasoning": ["--parse-reasoning", "gpt_oss"], "tools": ["--parse-tool-calls", "openai"],
        "both": ["--parse-reasoning", "gpt_oss", "--parse-tool-calls", "openai"]}


@pytest.mark.parametrize("chunk", [0, 1, 7])
@pytest.mark.parametrize("parsers", list(ARGS))
def test_harmony_output_matches_vllm(strata_chat_template, harmony, record, parsers, chunk):
    outputs = corpus()
    got = run(strata_chat_template, ARGS[parsers], outputs, chunk)
    mismatches, differences, with_calls, with_reasoning, bad_under = [], {}, 0, 0, {}
    for output, result in zip(outputs, got):
        want, difference = expected(harmony, output, parsers)
        calls = [(c["function"]["name"], c["function"]["arguments"]) for c in result.get("tool_calls", [])]
        ours = {"reasoning": (result.get("reasoning_content"), result["content"]),
                "tools": (result["content"], calls),
                "both": (result.get("reasoning_content"), result["content"], calls)}[parsers]
        if chunk:  # streamed deltas cannot tell null from empty
            want = tuple(w or None if not isinstance(w, list) else w for w in want)
            ours = tuple(o or None if not isinstance(o, list) else o for o in ours)
        if ours != want:
            mismatches.append((output, want, ours))
            bad_under[difference] = bad_under.get(difference, 0) + 1
        if difference:
            differences[difference] = differences.get(difference, 0) + 1
        with_calls += parsers != "reasoning" and bool(want[-1])
        with_reasoning += parsers != "tools" and want[0] is not None
    how = "whole" if chunk == 0 else f"streamed in {chunk}-byte chunks"
    what = {"reasoning": "gpt_oss", "tools": "openai", "both": "gpt_oss + openai"}[parsers]
    same = CORPUS_SIZE - sum(differences.values())
    record(f"{what} outputs ({how}) identical to vLLM's", same - bad_under.get(None, 0), same)
    for name, count in sorted(differences.items()):
        record(f"{what} outputs ({how}) where {name}, as documented", count - bad_under.get(name, 0), count)
    assert not mismatches, "\n\n".join(f"output {o!r}\nwant   {w!r}\nstrata {g!r}" for o, w, g in mismatches[:5])
    # The corpus reaches every outcome often enough to mean something.
    if parsers != "reasoning":
        assert CORPUS_SIZE // 5 < with_calls < CORPUS_SIZE - CORPUS_SIZE // 10, with_calls
    if parsers != "tools":
        assert CORPUS_SIZE // 5 < with_reasoning < CORPUS_SIZE - CORPUS_SIZE // 10, with_reasoning
    assert differences.get("vLLM's harmony parser raises", 0) < CORPUS_SIZE // 3, differences


def test_the_templates_tool_call_reads_back(strata_chat_template, harmony):
    """What templates/openai-gpt-oss-120b.jinja writes for an assistant turn with a call (after its generation
    prompt `<|start|>assistant`) is read back as that call."""
    output = ('<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant to=functions.get_weather'
              '<|channel|>commentary json<|message|>{"city": "Paris", "unit": "celsius"}<|call|>')
    [result] = run(strata_chat_template, ARGS["both"], [output], 0)
    assert result["reasoning_content"] == "Need the weather."
    assert result["content"] is None
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in result["tool_calls"]] == [
        ("get_weather", '{"city": "Paris", "unit": "celsius"}')]
    parser, failed = parse_output_into_messages(harmony, output)
    assert not failed and openai_tool_parser(parser)[1] == [("get_weather", '{"city": "Paris", "unit": "celsius"}')]
