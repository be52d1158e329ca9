"""Shared by the HTTP API tests (a module of its own: `from conftest import` would find another directory's
conftest when pytest collects several)."""

from __future__ import annotations

import pathlib

# Qwen3's chat template, committed in tests/chat_template_parity/templates (sources.json names its source).
TEMPLATE = pathlib.Path(__file__).resolve().parents[1] / "chat_template_parity" / "templates" / "Qwen-Qwen3-0.6B.jinja"
