"""Shared by the observability tests: a real Debian Prometheus on loopback (PrometheusProcess) loading
deploy/prometheus/ with its target and intervals replaced, its HTTP API, and the dashboard's queries
(every target expression of deploy/grafana/strata.json with its variables substituted as Grafana would)."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
PROMETHEUS_YML = DEPLOY / "prometheus" / "prometheus.yml"
RULES_YML = DEPLOY / "prometheus" / "rules.yml"
RULES_TEST_YML = DEPLOY / "prometheus" / "rules_test.yml"
DASHBOARD_JSON = DEPLOY / "grafana" / "strata.json"
COMPOSE_YAML = DEPLOY / "compose.yaml"

SCRAPE_INTERVAL_S = 1
# What Grafana makes of $__rate_interval for a 1 s scrape interval: max($__interval + scrape, 4 * scrape).
RATE_INTERVAL = "5s"


def require_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is missing: scripts/setup.sh installs Debian's prometheus package (prometheus, promtool)")
    return path


def live_config(target: str) -> dict:
    """deploy/prometheus/prometheus.yml with the strata job pointed at `target`, 1 s scrape and rule
    evaluation, and rule files made absolute (the test's copy lives elsewhere)."""
    config = yaml.safe_load(PROMETHEUS_YML.read_text())
    config["global"]["scrape_interval"] = f"{SCRAPE_INTERVAL_S}s"
    config["global"]["evaluation_interval"] = f"{SCRAPE_INTERVAL_S}s"
    config["rule_files"] = [str((PROMETHEUS_YML.parent / f).resolve()) for f in config["rule_files"]]
    jobs = [job for job in config["scrape_configs"] if job["job_name"] == "strata"]
    assert len(jobs) == 1, "prometheus.yml: one scrape job named strata"
    jobs[0]["static_configs"] = [{"targets": [target]}]
    return config


class PrometheusProcess:
    """Debian's prometheus on 127.0.0.1:`port` with `config`, its TSDB in `work`."""

    def __init__(self, config: dict, work: Path, port: int):
        self.url = f"http://127.0.0.1:{port}"
        self.config_path = work / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.log_path = work / "prometheus.log"
        self.args = [require_tool("prometheus"), f"--config.file={self.config_path}",
                     f"--storage.tsdb.path={work / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                     "--log.level=warn"]
        self.process: subprocess.Popen | None = None

    def start(self, timeout_s: float = 20) -> "PrometheusProcess":
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise AssertionError(f"prometheus exited with {self.process.returncode}:\n{self.log_path.read_text()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as reply:
                    if reply.status == 200:
                        return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"prometheus not ready after {timeout_s}s:\n{self.log_path.read_text()}")
            time.sleep(0.1)

    def stop(self) -> int:
        if self.process is None or self.process.poll() is not None:
            return 0 if self.process is None else self.process.returncode
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError("prometheus ignored SIGTERM")

    def api(self, path: str, **params) -> dict:
        query = urllib.parse.urlencode(params, doseq=True)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as reply:
            body = json.loads(reply.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list:
        """The series an instant query returns now. A PromQL syntax error fails the test (HTTP 400)."""
        try:
            data = self.api("query", query=expr)
        except urllib.error.HTTPError as e:
            raise AssertionError(f"query {expr!r}: {e.code} {e.read().decode()}") from e
        return data["result"]

    def wait_for_series(self, expr: str, timeout_s: float) -> list:
        deadline = time.monotonic() + timeout_s
        while True:
            result = self.query(expr)
            if result or time.monotonic() > deadline:
                return result
            time.sleep(0.25)


def dashboard_panels(dashboard: dict) -> list[dict]:
    """Every panel, rows' nested panels (collapsed rows keep theirs inside) included."""
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def dashboard_targets(dashboard: dict) -> list[tuple[str, str]]:
    """(panel title, expr) of every Prometheus query of the dashboard."""
    return [(panel["title"], target["expr"]) for panel in dashboard_panels(dashboard)
            for target in panel.get("targets", []) if "expr" in target]


_LABEL_VALUES = re.compile(r"^label_values\((.+),\s*(\w+)\)$")


def prometheus_regex(values: list[str]) -> str:
    """A multi-value variable inside a PromQL =~ string, as Grafana's Prometheus datasource writes it:
    each value regex-escaped, alternatives in a group, backslashes doubled for the string literal."""
    escaped = [re.sub(r"([\\^$.|?*+()\[\]{}])", r"\\\1", v).replace("\\", "\\\\") for v in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def substitute(expr: str, variables: dict[str, str]) -> str:
    for name, value in variables.items():
        expr = expr.replace(f"${{{name}}}", value).replace(f"${name}", value)
    leftover = re.findall(r"\$\{?\w+", expr)
    assert not leftover, f"{expr!r}: unknown dashboard variables {leftover}"
    return expr


def resolve_variables(dashboard: dict, prometheus: PrometheusProcess) -> dict[str, str]:
    """Each query variable's values from the live Prometheus (in the dashboard's order, so later
    variables may use earlier ones); every variable must have at least one value."""
    variables = {"__rate_interval": RATE_INTERVAL}
    for var in dashboard["templating"]["list"]:
        if var["type"] != "query":
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        match = _LABEL_VALUES.match(query.strip())
        assert match, f"variable {var['name']}: only label_values(selector, label) is understood here: {query}"
        selector = substitute(match.group(1), variables)
        series = prometheus.api("series", **{"match[]": selector})
        values = sorted({s[match.group(2)] for s in series if match.group(2) in s})
        assert values, f"variable {var['name']}: {query} has no values"
        variables[var["name"]] = prometheus_regex(values)
    return variables


def metric_names(expr: str) -> set[str]:
    """The strata_ metric names an expression reads (recorded series and label values aside)."""
    without_strings = re.sub(r'"[^"]*"', '""', expr)
    return set(re.findall(r"\bstrata_[a-z_]+\b", without_strings))
