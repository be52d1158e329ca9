"""Fixtures for the deploy/k8s tests: every overlay rendered once with `kubectl kustomize`, and the
strata image (built by tests/image/image_helpers.py) for `podman kube play`."""

import pathlib
import shutil
import subprocess
import sys

import pytest
import yaml

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from manifest_checks import K8S, OVERLAYS, REPO, kubectl  # noqa: E402


@pytest.fixture(scope="session")
def rendered(tmp_path_factory) -> dict[str, pathlib.Path]:
    """overlay name -> the file holding its rendered manifests."""
    out = tmp_path_factory.mktemp("rendered")
    files = {}
    for overlay in OVERLAYS:
        run = subprocess.run([kubectl(), "kustomize", str(K8S / "overlays" / overlay)],
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, f"kubectl kustomize overlays/{overlay}:\n{run.stderr}"
        files[overlay] = out / f"{overlay}.yaml"
        files[overlay].write_text(run.stdout)
    return files


@pytest.fixture(scope="session")
def docs(rendered) -> dict[str, list[dict]]:
    """overlay name -> its rendered objects."""
    return {overlay: [d for d in yaml.safe_load_all(path.read_text()) if d] for overlay, path in rendered.items()}


# The image: tests/image/image_helpers.py builds ./Dockerfile once per pytest process (the same module
# object as tests/image's, so a run of both builds it once) and skips, saying why, where podman cannot run.
sys.path.insert(0, str(REPO / "tests" / "image"))
import image_helpers as IMG  # noqa: E402


@pytest.fixture(scope="session")
def strata_image() -> str:
    return IMG.strata_image()
