"""deploy/ tested for real: promtool accepts the Prometheus config and rules (and the rules' unit tests
pass); a real Debian Prometheus scraping a real strata-server under a short load (streams that finish,
one that fails INTERNAL on an injected stage fault, one INVALID_ARGUMENT) loads every rule, and every
query of the Grafana dashboard returns at least one series from it, while a misspelled metric name
returns none; compose.yaml's services, ports and mounted files are checked by structure (no compose
engine runs here)."""

from __future__ import annotations

import concurrent.futures
import re
import subprocess
import time

import grpc
import pytest
import yaml

import generate_helpers as GH
import observe_helpers as OH

# How long Prometheus may take to show what the load produced (1 s scrapes, 1 s rule evaluation).
SCRAPE_WAIT_S = 20


@pytest.fixture(scope="module")
def loaded(observed_server, observe_stubs, prometheus):
    """Drives the load, then waits until Prometheus has scraped its last effects (the rates of the
    dashboard need two samples of each counter within $__rate_interval)."""
    server, stubs = observed_server, observe_stubs
    # Alone first, so that the injected fault (stage 1, 3rd micro-batch) ends this one: INTERNAL.
    code, details = GH.status_of(lambda: GH.generate(stubs, server.channel, prompt_ids=[5, 6, 7], max_new_tokens=8))
    assert code == grpc.StatusCode.INTERNAL, (code, details)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda i: GH.generate(stubs, server.channel, prompt=f"Hello, world {i}",
                                                   max_new_tokens=12 + i), range(4)))
    assert [o["finish"] for o in outs] == ["LENGTH"] * 4
    code, _ = GH.status_of(lambda: GH.generate(stubs, server.channel, prompt_ids=[5], max_new_tokens=0))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    last = ['strata_requests_total{code="INVALID_ARGUMENT"}', "strata_engine_errors_total",
            'strata_stage_busy_seconds_total{stage="1"}']
    for expr in last:
        assert prometheus.wait_for_series(expr, SCRAPE_WAIT_S), f"Prometheus never scraped {expr}"
    time.sleep(2 * OH.SCRAPE_INTERVAL_S)  # a second sample of each after the load
    return prometheus


def test_promtool_accepts_the_config_the_rules_and_their_unit_tests():
    promtool = OH.require_tool("promtool")
    for args in (["check", "config", OH.PROMETHEUS_YML], ["check", "rules", OH.RULES_YML],
                 ["test", "rules", OH.RULES_TEST_YML]):
        done = subprocess.run([promtool, *map(str, args)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"promtool {args}:\n{done.stdout}{done.stderr}"


def test_live_prometheus_scrapes_the_server_and_loads_every_rule(loaded):
    up = loaded.query('up{job="strata"}')
    assert [s["value"][1] for s in up] == ["1"], up
    groups = loaded.api("rules")["groups"]
    want = {rule.get("record") or rule.get("alert"): group["name"]
            for group in yaml.safe_load(OH.RULES_YML.read_text())["groups"] for rule in group["rules"]}
    got = {rule["name"]: group["name"] for group in groups for rule in group["rules"]}
    assert got == want
    # Evaluated without error (rules are evaluated every second here; wait for a round after the load).
    deadline = time.monotonic() + SCRAPE_WAIT_S
    while True:
        bad = [(r["name"], r.get("health"), r.get("lastError")) for g in loaded.api("rules")["groups"]
               for r in g["rules"] if r.get("health") != "ok"]
        if not bad or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not bad, bad
    # Every recording rule has data from this server (the alerts use them).
    records = [name for name, group in want.items() if group == "strata.recording"]
    for record in records:
        assert loaded.wait_for_series(record, SCRAPE_WAIT_S), f"recording rule {record} has no series"


def test_every_dashboard_query_returns_a_series(loaded, dashboard):
    variables = OH.resolve_variables(dashboard, loaded)
    assert re.fullmatch(r"\(0\|1\|cpu\)", variables["device"]), variables["device"]
    targets = OH.dashboard_targets(dashboard)
    empty = []
    for title, expr in targets:
        query = OH.substitute(expr, variables)
        if not loaded.wait_for_series(query, 5):
            empty.append((title, query))
    assert not empty, f"{len(empty)} of {len(targets)} dashboard queries return no series: {empty}"
    # Every metric the dashboard names is one this server exports (a typo inside `or`, or in a
    # subexpression that does not empty the result, is caught here too).
    exported = set(loaded.api("label/__name__/values"))
    named = set().union(*(OH.metric_names(expr) for _, expr in targets))
    assert named <= exported, f"not exported by strata-server: {sorted(named - exported)}"
    print(f"{len(targets)} dashboard queries checked, {len(named)} metrics named")


def test_a_misspelled_metric_in_a_dashboard_query_is_caught(loaded, dashboard):
    variables = OH.resolve_variables(dashboard, loaded)
    title, expr = next((t, e) for t, e in OH.dashboard_targets(dashboard) if "strata_generated_tokens_total" in e)
    misspelled = OH.substitute(expr.replace("strata_generated_tokens_total", "strata_generated_token_total"), variables)
    assert loaded.query(OH.substitute(expr, variables)), title
    assert loaded.query(misspelled) == [], misspelled
    assert "strata_generated_token_total" not in set(loaded.api("label/__name__/values"))


def test_dashboard_first_row_is_memory_per_device(dashboard):
    assert dashboard["schemaVersion"] >= 36
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    panels = OH.dashboard_panels(dashboard)
    assert len({p["id"] for p in panels}) == len(panels), "panel ids must be unique"
    for p in panels:
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}", p["title"]
            assert all(t["datasource"]["uid"] == "${datasource}" for t in p["targets"]), p["title"]
    rows = [p for p in dashboard["panels"] if p["type"] == "row"]
    assert dashboard["panels"][0] is rows[0] and "Memory" in rows[0]["title"]
    # The first row's panels: everything above the second row.
    first = [p for p in dashboard["panels"][1:] if p["gridPos"]["y"] < rows[1]["gridPos"]["y"]]
    exprs = " ".join(t["expr"] for p in first for t in p["targets"])
    for needed in ("strata_device_budget_bytes", "strata_device_planned_bytes", "strata_device_kv_cache_bytes",
                   'kind=~"allocated|reserved"'):
        assert needed in exprs, needed
    assert first[0].get("repeat") == "device", "the first panel repeats per device"
    titles = " ".join(r["title"] for r in rows)
    for topic in ("Requests", "Latency", "Pipeline", "Errors"):
        assert topic in titles


def test_compose_services_ports_and_mounted_files():
    compose = yaml.safe_load(OH.COMPOSE_YAML.read_text())
    services = compose["services"]
    assert set(services) == {"strata", "prometheus", "grafana"}
    assert services["strata"]["image"] == "strata:latest"
    assert (OH.COMPOSE_YAML.parent / services["strata"]["build"]["context"] / "Dockerfile").resolve().parent == OH.REPO
    ports = {name: [p.rsplit(":", 2) for p in s["ports"]] for name, s in services.items()}
    for name, published in ports.items():
        for host, host_port, container_port in published:
            assert host == "127.0.0.1" and host_port == container_port, (name, host, host_port)
    assert {p[2] for p in ports["strata"]} == {"50051", "8000", "9464"}
    assert ports["prometheus"][0][2] == "9090" and ports["grafana"][0][2] == "3000"
    flags = services["strata"]["command"]
    assert "--metrics-listen=0.0.0.0:9464" in flags and "--listen=0.0.0.0:50051" in flags
    assert "--http-listen=0.0.0.0:8000" in flags
    # The scrape target is the compose service at its metrics port.
    targets = [t for job in yaml.safe_load(OH.PROMETHEUS_YML.read_text())["scrape_configs"]
               for sc in job["static_configs"] for t in sc["targets"]]
    assert targets == ["strata:9464"]
    # Bind mounts point at files that exist; named volumes are declared.
    mounted = {}
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source, target = volume.split(":")[:2] if not volume.startswith("${") else (None, volume.split(":")[-2])
            if source is None:
                continue  # the model directory, from $STRATA_MODEL_DIR
            if source.startswith("."):
                path = (OH.COMPOSE_YAML.parent / source).resolve()
                assert path.exists(), f"{name}: {source} does not exist"
                mounted[target] = path
            else:
                assert source in compose["volumes"], f"{name}: volume {source} is not declared"
    assert mounted["/etc/prometheus/prometheus.yml"] == OH.PROMETHEUS_YML
    assert mounted["/etc/prometheus/rules.yml"] == OH.RULES_YML
    assert mounted["/etc/grafana/dashboards/strata.json"] == OH.DASHBOARD_JSON
    # Prometheus is started with the mounted config; Grafana's providers point at the mounted paths.
    assert "--config.file=/etc/prometheus/prometheus.yml" in services["prometheus"]["command"]
    provisioning = mounted["/etc/grafana/provisioning/dashboards"]
    provider = yaml.safe_load((provisioning / "strata.yml").read_text())["providers"][0]
    assert provider["options"]["path"] == "/etc/grafana/dashboards"
    datasource = yaml.safe_load((mounted["/etc/grafana/provisioning/datasources"] / "prometheus.yml").read_text())
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"
    assert datasource["datasources"][0]["type"] == "prometheus"
