"""strata-chat-template vs transformers' apply_chat_template(tokenize=False), character for character, on
every real template in templates/ × every conversation in conversations.py. A conversation the template
refuses (raise_exception, a missing variable it requires, transformers' own checks) must be an error on
both sides."""

from __future__ import annotations

import json

import pytest

from chat_template_helpers import SPECIAL_TOKENS, TEMPLATE_DIR, run_batch
from conversations import CONVERSATIONS

TEMPLATES = sorted(TEMPLATE_DIR.glob("*.jinja"))
SOURCES = json.loads((TEMPLATE_DIR.parent / "sources.json").read_text(encoding="utf-8"))


def _transformers(tokenizer, template: str, context: dict) -> dict:
    kwargs = dict(context)
    messages = kwargs.pop("messages")
    try:
        return {"text": tokenizer.apply_chat_template(messages, tokenize=False, chat_template=template, **kwargs)}
    except Exception as e:  # noqa: BLE001 - any refusal counts as an error, as strata's does
        return {"error": f"{type(e).__name__}: {e}"}


def test_templates_are_real_and_name_their_source():
    assert len(TEMPLATES) >= 30, f"only {len(TEMPLATES)} templates"
    names = {t.name for t in TEMPLATES}
    assert names == set(SOURCES), f"templates without a source: {names - set(SOURCES)}; " \
                                  f"sources without a file: {set(SOURCES) - names}"
    for name, source in SOURCES.items():
        assert source.get("repository") and source.get("path") and source.get("model"), name
    # The families strata runs.
    joined = " ".join(sorted(names)).lower()
    for family in ["llama-3", "qwen3", "mistral", "mixtral", "gemma-2", "gemma-3", "phi-3"]:
        assert family in joined, f"no {family} template"


@pytest.mark.parametrize("template", TEMPLATES, ids=[t.stem for t in TEMPLATES])
def test_template_renders_like_transformers(strata_chat_template, tokenizer, template, record):
    source = template.read_text(encoding="utf-8")
    names = list(CONVERSATIONS)
    contexts = [dict(CONVERSATIONS[n]) for n in names]
    want = [_transformers(tokenizer, source, c) for c in contexts]
    got = run_batch(strata_chat_template, ["--template-file", str(template)],
                    [{**SPECIAL_TOKENS, **c} for c in contexts])
    mismatches = []
    for name, w, g in zip(names, want, got):
        if "text" in w and g.get("text") == w["text"]:
            continue
        if "error" in w and "error" in g:
            continue
        mismatches.append(f"  {name}:\n    transformers {json.dumps(w, ensure_ascii=False)[:600]}\n"
                          f"    strata       {json.dumps(g, ensure_ascii=False)[:600]}")
    record("templates x conversations identical", len(names) - len(mismatches), len(names))
    record("of them rendered by transformers (the rest refused on both sides)", sum("text" in w for w in want),
           len(names))
    if mismatches:
        pytest.fail(f"{len(mismatches)}/{len(names)} conversations differ from transformers:\n" +
                    "\n".join(mismatches), pytrace=False)
