"""Fixtures for the deploy/k8s tests: every overlay rendered once with `kubectl kustomize`, and the
strata image (built by tests/image's `strata_image` fixture) for `podman kube play`."""

import importlib.util
import pathlib
import shutil
import subprocess
import sys

import pytest
import yaml

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from manifest_checks import K8S, OVERLAYS, REPO  # noqa: E402


def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        pytest.skip("kubectl is not installed (scripts/setup.sh installs the apt package kubectl where "
                    "an apt source offers it; Debian's own kubernetes-client 1.20 is too old for kustomize v5)")
    return path


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


# The image is built by the image test's session fixture (tests/image/conftest.py). Its fixtures are
# re-exported here so that tests/deploy can ask for `strata_image`; where that file is not in the
# checkout, `strata_image` skips and says why.
_IMAGE_CONFTEST = REPO / "tests" / "image" / "conftest.py"
if _IMAGE_CONFTEST.exists():
    _spec = importlib.util.spec_from_file_location("strata_image_conftest", _IMAGE_CONFTEST)
    _image_conftest = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_image_conftest)
    for _name in dir(_image_conftest):
        _value = getattr(_image_conftest, _name)
        if type(_value).__name__ == "FixtureFunctionDefinition" or hasattr(_value, "_pytestfixturefunction"):
            globals()[_name] = _value
if "strata_image" not in globals():

    @pytest.fixture(scope="session")
    def strata_image() -> str:
        pytest.skip(f"no strata image to run: {_IMAGE_CONFTEST.relative_to(REPO)} (the image test's "
                    "`strata_image` fixture, branch image) is not in this checkout")
