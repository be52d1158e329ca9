"""Reasoning parsing (chat_template/reasoning.h) against vLLM's `--reasoning-parser deepseek_r1`, `qwen3` and
`glm45`, alone and before a tool-call parser (gpt_oss: test_harmony_parity.py).

vLLM cannot be installed here, so the rules of its DeepSeekR1ReasoningParser (BaseThinkingReasoningParser.
extract_reasoning) and Qwen3ReasoningParser.extract_reasoning (vllm/reasoning/) are restated below, and
the serving layer's order: the reasoning is split off first, the tool calls parsed from the content alone.
A corpus of outputs generated here (thinking blocks as R1 and Qwen3 write them, with the opening tag in
the prompt or the output, cut anywhere, Qwen3.5 calls from inside the thinking, stray tags) goes through
`strata-chat-template --parse-reasoning FORMAT --batch`, whole and streamed in chunks.

Two differences are by design (chat_template/README.md, "Reasoning"), because a stream cannot follow
vLLM's whole-output rule there: a `<think>` is dropped only where it opens the output (after whitespace),
where vLLM drops the text before the first `<think>` anywhere; and qwen3 with thinking off is all content,
as vLLM streams it, where its non-streamed parse still splits at a `</think>` the model writes anyway. glm45
(GLM-4.5/4.6, whose template leaves `<think>` to the model): no opening `<think>` is all content, and an output
cut while thinking is reasoning, as vLLM's stream has it, where its whole-output rule makes it all content. The
test counts the outputs each difference touches and checks strata's documented result for them.
"""

from __future__ import annotations

import json
import random
import re
import subprocess

import pytest

from test_tool_call_parity import vllm_deepseek_v3, vllm_hermes

FUNCTION_OPEN = re.compile(r"<function[\s=]")


def vllm_r1(output: str) -> tuple[str | None, str | None]:
    parts = output.partition("<think>")
    output = parts[2] if parts[1] else parts[0]
    if "</think>" not in output:
        return output, None
    reasoning, _, content = output.partition("</think>")
    return reasoning, content or None


def vllm_qwen3(output: str, thinking_enabled: bool) -> tuple[str | None, str | None]:
    parts = output.partition("<think>")
    output = parts[2] if parts[1] else parts[0]
    if "</think>" in output:
        reasoning, _, content = output.partition("</think>")
        return reasoning, content or None
    if not thinking_enabled:
        return None, output
    index = output.find("<tool_call>")
    if index != -1 and FUNCTION_OPEN.match(output[index + len("<tool_call>"):].lstrip()):
        return output[:index] or None, output[index:] or None
    return output, None


def vllm_glm45(output: str) -> tuple[str | None, str | None]:
    """Glm4MoeModelReasoningParser.extract_reasoning (vllm/reasoning/glm4_moe_reasoning_parser.py at
    c9e9c484932eb025a29752972a29047802bc1bbb)."""
    if "<think>" not in output or "</think>" not in output:
        return None, output
    parts = output.partition("<think>")
    output = parts[2] if parts[1] else parts[0]
    if "</think>" not in output:
        return None, output
    reasoning, _, content = output.partition("</think>")
    return reasoning, content or None


def opens_with_think(output: str) -> bool:
    return output.lstrip(" \t\n\r").startswith("<think>")


def expected(fmt: str, output: str, thinking_enabled: bool) -> tuple[tuple[str | None, str | None], str | None]:
    """strata's documented split, and the name of the difference when it is not vLLM's."""
    if fmt == "glm45":
        vllm = vllm_glm45(output)
        if not opens_with_think(output):
            return (None, output), (None if vllm == (None, output) else "<think> not opening")
        # An opening <think>: the rest is reasoning up to </think> (R1's rule), where vLLM's whole-output rule
        # makes an output cut while thinking (no </think>) all content; its stream, like strata, reasoning.
        strata = vllm_r1(output)
        return strata, (None if strata == vllm else "cut while thinking")
    rule = vllm_r1 if fmt == "deepseek_r1" else lambda o: vllm_qwen3(o, thinking_enabled)
    vllm = rule(output)
    if fmt == "qwen3" and not thinking_enabled:
        strata, difference = (None, output), "thinking off"
    elif "<think>" in output and not opens_with_think(output):
        # strata keeps the text: vLLM's rule on the output with its `<think>` tags made plain text.
        reasoning, content = rule(output.replace("<think>", "\0"))
        restore = (lambda t: None if t is None else t.replace("\0", "<think>"))
        strata, difference = (restore(reasoning), restore(content)), "<think> not opening"
    else:
        return vllm, None
    return strata, (difference if strata != vllm else None)


PIECES = ["reasoning", " about it", "\n", "\n\n", "naïve 日本 😀", "</think>", "<tool_call>", "<function=f>",
          "\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n", "</tool_call>", "The answer",
          "<", "</", "<think", "{\"name\": \"f\", \"arguments\": {}}", "\u3000"]


def output_of(rng: random.Random) -> str:
    text = rng.choice(["", "", "<think>\n", "<think>", "\n<think>", " "]) if rng.randrange(10) else rng.choice(PIECES)
    for _ in range(rng.randrange(8)):
        text += rng.choice(PIECES)
    if rng.randrange(12) == 0:
        text += "<think>"  # a stray tag later on
    if rng.randrange(4) == 0:
        text = text[: rng.randrange(len(text) + 1)]
    return text


CORPUS_SIZE = 1500


def run(binary, args: list[str], outputs: list[str], chunk: int) -> list[dict]:
    stdin = "".join(json.dumps(o) + "\n" for o in outputs)
    proc = subprocess.run([str(binary), *args, "--batch", "--tool-call-seed", "1", "--stream-chunk", str(chunk)],
                          input=stdin.encode(), capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    lines = proc.stdout.decode().split("\n")[:-1]
    assert len(lines) == len(outputs)
    return [json.loads(line) for line in lines]


@pytest.mark.parametrize("chunk", [0, 1, 5])
@pytest.mark.parametrize("fmt, thinking_enabled", [("deepseek_r1", True), ("qwen3", True), ("qwen3", False),
                                                   ("glm45", True)])
def test_reasoning_matches_vllms_extraction(strata_chat_template, record, fmt, thinking_enabled, chunk):
    rng = random.Random(31 + thinking_enabled)
    outputs = [output_of(rng) for _ in range(CORPUS_SIZE)]
    args = ["--parse-reasoning", fmt, f"--enable-thinking={str(thinking_enabled).lower()}"]
    got = run(strata_chat_template, args, outputs, chunk)
    mismatches, differences = [], {}
    for output, result in zip(outputs, got):
        (reasoning, content), difference = expected(fmt, output, thinking_enabled)
        ours = (result["reasoning_content"], result["content"])
        if chunk:  # streamed deltas cannot tell null from empty
            reasoning, content, ours = reasoning or None, content or None, (ours[0] or None, ours[1] or None)
        if ours != (reasoning, content):
            mismatches.append((output, (reasoning, content), ours))
        if difference:
            differences[difference] = differences.get(difference, 0) + 1
    how = "whole" if chunk == 0 else f"streamed in {chunk}-byte chunks"
    what = f"{fmt}{'' if thinking_enabled else ' (thinking off)'}"
    same = CORPUS_SIZE - sum(differences.values())
    record(f"{what} outputs ({how}) identical to vLLM's extraction", same - len(mismatches), same)
    record(f"{what} outputs ({how}) under a documented difference, as documented",
           sum(differences.values()), sum(differences.values()))
    assert not mismatches, "\n\n".join(f"output {o!r}\nwant   {w!r}\nstrata {g!r}" for o, w, g in mismatches[:5])


def vllm_message(reasoning_fmt: str, tool_fmt: str, output: str) -> tuple[str | None, str | None, list]:
    """vLLM's serving order: the reasoning split off, then the tool calls of the content."""
    reasoning, content = vllm_r1(output) if reasoning_fmt == "deepseek_r1" else vllm_qwen3(output, True)
    parse = vllm_deepseek_v3 if tool_fmt == "deepseek_v3" else vllm_hermes
    tool_content, calls = parse(content if content is not None else "")
    if calls or (tool_fmt == "deepseek_v3" and "<｜tool▁calls▁begin｜>" in (content or "")):
        content = tool_content
    return reasoning, content, calls


@pytest.mark.parametrize("chunk", [0, 3])
@pytest.mark.parametrize("reasoning_fmt, tool_fmt", [("deepseek_r1", "deepseek_v3"), ("qwen3", "hermes")])
def test_tool_calls_come_from_the_content_after_the_reasoning(strata_chat_template, record, reasoning_fmt, tool_fmt,
                                                               chunk):
    rng = random.Random(41)
    hermes = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    deepseek = ('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n'
                '{"city": "Paris"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>')
    call = hermes if tool_fmt == "hermes" else deepseek
    outputs = []
    for _ in range(300):
        text = rng.choice(["", "<think>\n"]) + rng.choice(["I should check.", "hmm " + call])
        text += rng.choice(["</think>\n\n", "", "\n</think>"]) + rng.choice(["", "Sure. ", "\n\n"])
        text += rng.choice(["", call, call + call])
        outputs.append(text[: rng.randrange(len(text) + 1)] if rng.randrange(5) == 0 else text)
    got = run(strata_chat_template, ["--parse-reasoning", reasoning_fmt, "--parse-tool-calls", tool_fmt], outputs,
              chunk)
    mismatches = []
    for output, result in zip(outputs, got):
        reasoning, content, calls = vllm_message(reasoning_fmt, tool_fmt, output)
        ours = (result["reasoning_content"], result["content"],
                [(c["function"]["name"], c["function"]["arguments"]) for c in result["tool_calls"]])
        want = (reasoning, content, calls)
        if chunk:
            want = (reasoning or None, content or None, calls)
            ours = (ours[0] or None, ours[1] or None, ours[2])
        if ours != want:
            mismatches.append((output, want, ours))
    how = "whole" if chunk == 0 else f"streamed in {chunk}-byte chunks"
    record(f"{reasoning_fmt} + {tool_fmt} messages ({how}) identical to vLLM's", len(outputs) - len(mismatches),
           len(outputs))
    assert not mismatches, "\n\n".join(f"output {o!r}\nvLLM   {w!r}\nstrata {g!r}" for o, w, g in mismatches[:5])


def test_unknown_reasoning_parser_exits_2_naming_the_valid_ones(strata_chat_template):
    proc = subprocess.run([str(strata_chat_template), "--parse-reasoning", "granite"], input=b"",
                          capture_output=True, timeout=60)
    assert proc.returncode == 2
    assert "deepseek_r1, qwen3, glm45, gpt_oss" in proc.stderr.decode()
