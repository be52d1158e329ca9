"""strata-chat-template on bad input (exit 2 and a message naming what is wrong: the file and line of a
syntax error, the JSON that is not a conversation), and loading a checkpoint's template and special
tokens as transformers' AutoTokenizer does (chat_template.jinja, tokenizer_config.json's string or named
list, AddedToken special tokens), compared live."""

from __future__ import annotations

import json
import subprocess

import pytest

from chat_template_helpers import run_batch
from conversations import CONVERSATIONS, WEATHER_TOOL


def _run(binary, *args, stdin: bytes = b""):
    return subprocess.run([str(binary), *args], input=stdin, capture_output=True, timeout=60)


@pytest.mark.parametrize("source", [
    "{% for m in messages %}\n{{ m.content }}\n",   # unclosed for
    "line\n\n{{ messages[0] + }}",                 # expression cut short
    "{% if x %}\n\n{% endfor %}",                  # mismatched end tag
    "a\n{{ x }\n",                                 # unbalanced brace
    "\n\n\n{% do x %}",                           # a tag transformers' environment lacks
    "{% macro m(a=1, b) %}{% endmacro %}",        # non-default argument after a default one
])
def test_syntax_errors_exit_2_naming_the_file_and_jinja2s_line(strata_chat_template, tmp_path, tokenizer, source):
    import jinja2

    template = tmp_path / "t.jinja"
    template.write_text(source, encoding="utf-8")
    messages = tmp_path / "m.json"
    messages.write_text(json.dumps([{"role": "user", "content": "hi"}]), encoding="utf-8")
    proc = _run(strata_chat_template, "--template-file", str(template), "--messages", str(messages))
    assert proc.returncode == 2, proc.stderr
    with pytest.raises(jinja2.TemplateSyntaxError) as refused:
        tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, chat_template=source)
    assert f"{template}:{refused.value.lineno}:" in proc.stderr.decode(), (proc.stderr, refused.value)


@pytest.mark.parametrize("payload, message", [
    (b"not json", "not valid JSON"),
    (b'{"messages": {"role": "user"}}', "messages: expected a list"),
    (b"[]", "empty conversation"),
    (b'[{"role": "user", "content": "hi"}, 3]', "messages[1]: Chat messages should be dicts"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": "yes"}', "add_generation_prompt"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "tools": {}}', "tools: expected a list"),
])
def test_bad_conversations_exit_2_naming_the_problem(strata_chat_template, tmp_path, payload, message):
    template = tmp_path / "t.jinja"
    template.write_text("{{ messages }}", encoding="utf-8")
    messages = tmp_path / "m.json"
    messages.write_bytes(payload)
    proc = _run(strata_chat_template, "--template-file", str(template), "--messages", str(messages))
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr.decode(), proc.stderr


def test_render_errors_exit_2_with_the_templates_message(strata_chat_template, tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text("{% if messages[0].role == 'system' %}\n{{ raise_exception('System role not supported') }}"
                        "{% endif %}", encoding="utf-8")
    messages = tmp_path / "m.json"
    messages.write_text(json.dumps([{"role": "system", "content": "x"}]), encoding="utf-8")
    proc = _run(strata_chat_template, "--template-file", str(template), "--messages", str(messages))
    assert proc.returncode == 2
    assert "t.jinja:2: TemplateError: System role not supported" in proc.stderr.decode()


def test_flags_are_checked(strata_chat_template, tmp_path):
    assert _run(strata_chat_template).returncode == 2
    assert _run(strata_chat_template, "--template-file", "/nonexistent.jinja", "--batch").returncode == 2
    assert b"--checkpoint" in _run(strata_chat_template, "--help").stdout


# --- checkpoints, as transformers loads them

TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{{ eos_token }}{% endfor %}"
            "{% if tools %}[{{ tools|length }} tools]{% endif %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
            "{{ pad_token }}")


def _save_checkpoint(directory, layout: str):
    from tokenizers import AddedToken, Tokenizer
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(BPE()),
                                  bos_token=AddedToken("<|begin|>", special=True),
                                  eos_token=AddedToken("<|end|>", special=True), pad_token="<pad>")
    tok.chat_template = TEMPLATE
    tok.save_pretrained(directory)
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    jinja = directory / "chat_template.jinja"
    if layout == "chat_template.jinja":
        assert jinja.is_file(), "transformers saves chat_template.jinja"
        return
    jinja.unlink(missing_ok=True)
    if layout == "config string":
        config["chat_template"] = TEMPLATE
    elif layout == "config named list":
        config["chat_template"] = [{"name": "default", "template": TEMPLATE},
                                   {"name": "tool_use", "template": "TOOLS " + TEMPLATE}]
    config_path.write_text(json.dumps(config), encoding="utf-8")


@pytest.mark.parametrize("layout", ["chat_template.jinja", "config string", "config named list"])
def test_checkpoint_template_and_special_tokens_as_autotokenizer_loads_them(strata_chat_template, tmp_path, layout,
                                                                            record):
    from transformers import AutoTokenizer

    _save_checkpoint(tmp_path, layout)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    contexts = [CONVERSATIONS["multi_turn_generation_prompt"], CONVERSATIONS["no_system_multi_turn"],
                {"messages": [{"role": "user", "content": "weather?"}], "tools": [WEATHER_TOOL],
                 "add_generation_prompt": True}]
    got = run_batch(strata_chat_template, ["--checkpoint", str(tmp_path)], contexts)
    identical = 0
    for context, g in zip(contexts, got):
        kwargs = dict(context)
        messages = kwargs.pop("messages")
        want = tok.apply_chat_template(messages, tokenize=False, **kwargs)
        assert g == {"text": want}, (layout, context, want, g)
        identical += 1
    record("checkpoint loading (layouts x conversations) identical", identical, len(contexts))
