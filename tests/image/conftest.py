"""Fixtures of the image tests: the image built from the repository's Dockerfile (`strata_image`, also
for other tests: see image_helpers), the Generate tests' tiny checkpoint with a trained tokenizer, and
a container of the image serving it on published loopback ports."""

from __future__ import annotations

import pathlib
import sys
import types

import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "integration"))
sys.path.insert(0, str(HERE.parent / "runtime_parity"))
sys.path.insert(0, str(HERE.parent / "generate"))
sys.path.insert(0, str(HERE))
import integration_helpers as IH  # noqa: E402
import runtime_helpers as RH  # noqa: E402
import generate_helpers as GH  # noqa: E402
import image_helpers as IMG  # noqa: E402


@pytest.fixture(scope="session")
def strata_image() -> str:
    """The tag of the image built from ./Dockerfile on the local Debian base (built once per session)."""
    return IMG.strata_image()


@pytest.fixture(scope="session")
def image_stubs(tmp_path_factory) -> types.SimpleNamespace:
    return IH.generate_stubs(tmp_path_factory.mktemp("image_proto_src"), tmp_path_factory.mktemp("image_proto_py"))


@pytest.fixture(scope="session")
def image_model(tmp_path_factory):
    """(directory, tokenizers.Tokenizer): the llama_text checkpoint and its tokenizer.json, world-readable
    for the image's non-root user."""
    directory = RH.make_checkpoint(tmp_path_factory.mktemp("image_llama_text"), "llama_text")
    tok = RH.train_tokenizer(vocab_size=300)
    tok.save(str(directory / "tokenizer.json"))
    return IMG.readable_by_all(directory), tok


# The image's CMD (--model /model, ports 50051/8000/9464 on 0.0.0.0) plus the 2-stage CPU plan of the Generate
# tests, so the pipeline across stages is what runs in the container.
SERVE_ARGS = [*IMG.IMAGE_CMD, *GH.TWO_STAGE_FLAGS, "--max-batch", "8", "--max-context", "2048"]


@pytest.fixture(scope="session")
def serve_args() -> list[str]:
    return list(SERVE_ARGS)


@pytest.fixture(scope="module")
def container(strata_image, image_stubs, image_model):
    """A container of the image serving the checkpoint (mounted read-only), SERVING; removed at the end."""
    c = IMG.Container(strata_image, image_model[0], SERVE_ARGS)
    try:
        yield c.start(image_stubs)
    finally:
        c.remove()
