"""Fixtures and the session summary of the chat-template parity tests.

The tests compare `strata-chat-template` ($STRATA_BUILD_DIR/chat_template/strata-chat-template, default
<repo>/build) with transformers' apply_chat_template(tokenize=False), live in this process, on the real
templates in templates/ (sources.json names where each one comes from). A missing binary is a failure,
not a skip.
"""

from __future__ import annotations

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from parity_counts import ParityCounts  # noqa: E402

from chat_template_helpers import SPECIAL_TOKENS, strata_binary

_parity = ParityCounts("chat template parity vs transformers", "")


@pytest.fixture(scope="session")
def strata_chat_template():
    path = strata_binary()
    if not path.is_file():
        pytest.fail(f"strata-chat-template is not built: {path} does not exist (build the project first, "
                    f"or point STRATA_BUILD_DIR at the build folder)", pytrace=False)
    return path


@pytest.fixture(scope="session")
def tokenizer():
    """A transformers tokenizer whose only role is apply_chat_template (no vocabulary is needed for
    tokenize=False); its special tokens are SPECIAL_TOKENS."""
    from tokenizers import Tokenizer
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(BPE()), **SPECIAL_TOKENS)


record = _parity.fixture()
pytest_terminal_summary = _parity.terminal_summary
