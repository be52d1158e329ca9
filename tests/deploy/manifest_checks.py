"""Small readers over rendered manifests, shared by the deploy tests."""

import pathlib
import re
import shutil

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent.parent
K8S = REPO / "deploy" / "k8s"
OVERLAYS = ("cpu", "gpu", "multi-gpu")

GRPC_PORT_NAME = "grpc"
HTTP_PORT_NAME = "http"  # the OpenAI-compatible API (--http-listen)
METRICS_PORT_NAME = "metrics"


def by_kind(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict], kind: str) -> dict:
    found = by_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def server_container(deployment: dict) -> dict:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    named = [c for c in containers if c["name"] == "strata"]
    assert len(named) == 1, "the Deployment has one container named strata"
    return named[0]


def container_port(container: dict, name: str) -> int:
    ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    assert name in ports, f"container port {name!r} missing (has {sorted(ports)})"
    return ports[name]


def flag(container: dict, name: str) -> str | None:
    """The value of --name=VALUE or --name VALUE in the container's args (None when absent)."""
    args = container.get("args", [])
    for i, arg in enumerate(args):
        if arg.startswith(f"--{name}="):
            return arg.split("=", 1)[1]
        if arg == f"--{name}" and i + 1 < len(args):
            return args[i + 1]
    return None


_UNITS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
          "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def quantity_bytes(quantity: str) -> int:
    """A Kubernetes memory quantity ("4Gi", "512M", "1073741824") in bytes."""
    m = re.fullmatch(r"([0-9.]+)([kMGT]i?)?", str(quantity))
    assert m, f"cannot read quantity {quantity!r}"
    return int(float(m.group(1)) * _UNITS[m.group(2) or ""])


_BUDGET_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
                 "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def max_memory(spec: str) -> dict[str, int]:
    """--max-memory as accelerate writes it (0=70GiB,cpu=16GiB) -> device -> bytes."""
    budgets = {}
    for entry in spec.split(","):
        device, size = entry.split("=", 1)
        m = re.fullmatch(r"([0-9.]+)\s*([A-Za-z]*)", size)
        assert m, f"cannot read budget {size!r}"
        budgets[device] = int(float(m.group(1)) * _BUDGET_UNITS[(m.group(2) or "B").upper()])
    return budgets


def duration_seconds(text: str) -> float:
    """A Prometheus duration (1h30m, 15s, 500ms) in seconds."""
    m = re.fullmatch(r"((\d+)y)?((\d+)w)?((\d+)d)?((\d+)h)?((\d+)m)?((\d+)s)?((\d+)ms)?", text)
    assert m and text, f"not a Prometheus duration: {text!r}"
    y, w, d, h, mi, s, ms = (int(g or 0) for g in m.groups()[1::2])
    return (((y * 365 + w * 7 + d) * 24 + h) * 60 + mi) * 60 + s + ms / 1000


def selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


# PromQL words that are not metric names: keywords, aggregation modifiers.
_PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
                 "and", "or", "unless", "inf", "nan", "atan2"}


def promql_metric_names(expr: str) -> set[str]:
    """The metric names an expression reads: what is left after removing strings, label matchers,
    ranges, label lists of by/on/without/ignoring/group_*, function names and keywords."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        rest = text[m.end():].lstrip()
        if rest.startswith("("):  # a function
            continue
        if m.group(0) in _PROMQL_WORDS:
            continue
        if m.start() > 0 and (text[m.start() - 1].isdigit() or text[m.start() - 1] == "."):
            continue  # the exponent or unit of a number (1e3)
        names.add(m.group(0))
    return names


def metrics_in_source(source: str) -> set[str]:
    """Every series name server/metrics.cc exports: .Name("...") plus the histogram suffixes."""
    names = set()
    for m in re.finditer(r'\.Name\("([a-z_:][a-z0-9_:]*)"\)', source):
        names.add(m.group(1))
    histograms = set(re.findall(r'BuildHistogram\(\)\s*\.Name\("([a-z_:][a-z0-9_:]*)"\)', source))
    for h in histograms:
        names.discard(h)  # a histogram is only its _bucket, _sum and _count series
        names |= {f"{h}_bucket", f"{h}_sum", f"{h}_count"}
    return names


def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        pytest.skip("kubectl is not installed (scripts/setup.sh installs the apt package kubectl where "
                    "an apt source offers it; Debian's own kubernetes-client 1.20 is too old for kustomize v5)")
    return path
