"""The Python client's tests start a real strata-server (the integration tests' helpers and the Generate
tests' tiny checkpoint) and use the package from this checkout."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(REPO / "tests" / "integration"))
sys.path.insert(0, str(REPO / "tests" / "runtime_parity"))
sys.path.insert(0, str(REPO / "tests" / "generate"))
sys.path.insert(0, str(REPO / "tests" / "auth"))
