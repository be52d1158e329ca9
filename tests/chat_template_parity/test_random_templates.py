"""Differential test: random templates (random_templates.py, fixed seeds) rendered by jinja2 as
transformers compiles them and by strata-chat-template with the same context must agree: the same text,
or an error on both sides."""

from __future__ import annotations

import copy

import pytest

import random_templates as RT
from chat_template_helpers import run_batch

SEEDS = [101, 202, 303]
PER_SEED = 150


@pytest.mark.parametrize("seed", SEEDS)
def test_random_templates_render_like_jinja2(strata_chat_template, tmp_path, seed, record):
    from transformers.utils.chat_template_utils import _compile_jinja_template

    mismatches = []
    for i, source in enumerate(RT.templates(seed, PER_SEED)):
        try:
            # A fresh copy each time: jinja2's indent filter appends to a list it is given.
            want = {"text": _compile_jinja_template(source).render(**copy.deepcopy(RT.CONTEXT))}
        except Exception as e:  # noqa: BLE001 - a refusal on both sides is agreement
            want = {"error": f"{type(e).__name__}: {e}"}
        template = tmp_path / f"t{i}.jinja"
        template.write_text(source, encoding="utf-8")
        try:
            got = run_batch(strata_chat_template, ["--template-file", str(template)], [RT.CONTEXT])[0]
        except AssertionError as e:  # the template did not load: a syntax error
            got = {"error": str(e)}
        if got == want or ("error" in got and "error" in want):
            continue
        mismatches.append(f"  {source!r}\n    jinja2 {want}\n    strata {got}")
    record("random templates identical to jinja2", PER_SEED - len(mismatches), PER_SEED)
    assert not mismatches, f"{len(mismatches)}/{PER_SEED} differ:\n" + "\n".join(mismatches[:5])
