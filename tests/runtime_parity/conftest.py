"""Fixtures of the runtime parity tests: the strata-generate binary (missing = failure, not a skip) and
tiny random checkpoints saved by transformers, made once per session."""

from __future__ import annotations

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import runtime_helpers as H  # noqa: E402


@pytest.fixture(scope="session")
def strata_generate() -> pathlib.Path:
    path = H.generate_path()
    if not path.is_file():
        pytest.fail(f"strata-generate is not built: {path} does not exist (build the project first, "
                    f"or point STRATA_BUILD_DIR at the build folder)", pytrace=False)
    return path


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """checkpoint(name, dtype=float32) -> a directory with config.json and safetensors."""
    import torch

    made: dict = {}

    def get(name: str, dtype=torch.float32) -> pathlib.Path:
        key = (name, dtype)
        if key not in made:
            made[key] = H.make_checkpoint(tmp_path_factory.mktemp(f"{name}_{str(dtype).split('.')[-1]}"), name, dtype)
        return made[key]

    return get
