"""deploy/k8s: every overlay renders, validates strictly against current Kubernetes schemas, and
holds together where no schema looks: probes on the gRPC port, grace covering the drain, GPUs as
limits, budgets inside the memory limit, Services matching the ServiceMonitor, alert and autoscaling
queries on metrics server/metrics.cc exports and parsed by promtool."""

import re
import shutil
import subprocess

import pytest
import yaml

from manifest_checks import (OVERLAYS, REPO, GRPC_PORT_NAME, HTTP_PORT_NAME, METRICS_PORT_NAME, by_kind, container_port, duration_seconds, flag,
                             max_memory, metrics_in_source, one, promql_metric_names, quantity_bytes, selects,
                             server_container)

# Schemas of kubernetes-validate (scripts/requirements.txt pins it): the oldest release still
# supported upstream that has everything used here (native gRPC probes: 1.27; preStop sleep: 1.30
# beta, 1.34 GA) and the newest.
KUBERNETES_VERSIONS = ("1.35.0", "1.37.0")
CORE_KINDS = {"Namespace", "PersistentVolumeClaim", "Deployment", "Service"}
CUSTOM_KINDS = {"ServiceMonitor", "PrometheusRule", "ScaledObject"}
EXPECTED_KINDS = {"cpu": CORE_KINDS, "gpu": CORE_KINDS | CUSTOM_KINDS, "multi-gpu": CORE_KINDS | CUSTOM_KINDS}
GPU_COUNT = {"cpu": 0, "gpu": 1, "multi-gpu": 4}
STARTUP_BUDGET_SECONDS = 30 * 60  # a large checkpoint's load
GRACE_MARGIN_SECONDS = 5  # after the drain, for the process to exit
METRICS_CC = REPO / "server" / "metrics.cc"


def kubernetes_validate() -> str:
    path = shutil.which("kubernetes-validate")
    if path is None:
        import sys
        candidate = __import__("pathlib").Path(sys.executable).parent / "kubernetes-validate"
        path = str(candidate) if candidate.exists() else None
    assert path, "kubernetes-validate is missing: scripts/setup.sh installs it from scripts/requirements.txt"
    return path


def deployment(objects):
    return one(objects, "Deployment")


# --- rendering and schema validation ------------------------------------------------------------

@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_its_kinds(docs, overlay):
    kinds = {o["kind"] for o in docs[overlay]}
    assert kinds == EXPECTED_KINDS[overlay]
    assert all(o["metadata"].get("namespace") == "strata" for o in docs[overlay] if o["kind"] != "Namespace")


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_validates_strictly(rendered, docs, overlay, version):
    run = subprocess.run([kubernetes_validate(), "--strict", "-k", version, str(rendered[overlay])],
                         capture_output=True, text=True, timeout=60)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    # Custom resources have no schema there and are skipped with a warning: only the expected ones
    # may be (test_*_fields below check them); anything else skipped is a failure.
    skipped = set(re.findall(r"Couldn't find schema for kind (\w+)", output))
    assert skipped == {o["kind"] for o in docs[overlay]} & CUSTOM_KINDS, output
    warnings = [line for line in output.splitlines()
                if not line.startswith("INFO ") and "Couldn't find schema for kind" not in line]
    assert warnings == [], output
    passed = set(re.findall(r"passed for resource (\S+) ", output))
    assert len(passed) == len([o for o in docs[overlay] if o["kind"] in CORE_KINDS]), output


def test_strict_validation_rejects_a_misspelled_field(docs, tmp_path):
    """The check above would pass a typo without --strict; make sure this setup catches one."""
    broken = yaml.safe_load(yaml.safe_dump(deployment(docs["cpu"])))
    container = server_container(broken)
    container["readinessProbes"] = container.pop("readinessProbe")
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(broken))
    run = subprocess.run([kubernetes_validate(), "--strict", "-k", KUBERNETES_VERSIONS[-1], str(path)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "readinessProbes" in run.stdout + run.stderr, run.stdout + run.stderr


# --- the Deployment -------------------------------------------------------------------------------

@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_use_the_grpc_port_and_health_services(docs, overlay):
    container = server_container(deployment(docs[overlay]))
    grpc_port = container_port(container, GRPC_PORT_NAME)
    assert flag(container, "listen") == f"0.0.0.0:{grpc_port}"
    assert flag(container, "metrics-listen") == f"0.0.0.0:{container_port(container, METRICS_PORT_NAME)}"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert probe in container, f"{probe} missing"
        assert set(container[probe]) & {"grpc", "httpGet", "tcpSocket", "exec"} == {"grpc"}, probe
        assert container[probe]["grpc"]["port"] == grpc_port, f"{probe} is not on the gRPC port"
    assert container["readinessProbe"]["grpc"]["service"] == "strata.v1.InferenceService"
    assert container["livenessProbe"]["grpc"].get("service", "") == ""
    startup = container["startupProbe"]
    assert startup["failureThreshold"] * startup["periodSeconds"] >= STARTUP_BUDGET_SECONDS


def drain_seconds(container) -> float:
    value = flag(container, "drain-timeout")
    assert value is not None, "--drain-timeout is not set: the grace period cannot be checked against it"
    return float(value)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_grace_covers_the_drain(docs, overlay):
    pod = deployment(docs[overlay])["spec"]["template"]["spec"]
    container = server_container(deployment(docs[overlay]))
    pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    grace = pod.get("terminationGracePeriodSeconds", 30)
    assert grace >= pre_stop + drain_seconds(container) + GRACE_MARGIN_SECONDS
    # A liveness restart must not cut a drain short (health is NOT_SERVING while draining).
    liveness = container["livenessProbe"]
    assert liveness["failureThreshold"] * liveness["periodSeconds"] > drain_seconds(container)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gpus_are_limits_on_gpu_nodes(docs, overlay):
    pod = deployment(docs[overlay])["spec"]["template"]["spec"]
    resources = server_container(deployment(docs[overlay]))["resources"]
    gpus = GPU_COUNT[overlay]
    if gpus == 0:
        assert "nvidia.com/gpu" not in resources.get("limits", {})
        assert "nvidia.com/gpu" not in resources.get("requests", {})
        return
    assert resources["limits"]["nvidia.com/gpu"] == gpus
    assert resources.get("requests", {}).get("nvidia.com/gpu", gpus) == gpus
    assert pod["nodeSelector"], "GPU pods need a node selector for GPU nodes"
    assert any(t["key"] == "nvidia.com/gpu" and t["effect"] == "NoSchedule" for t in pod["tolerations"])
    assert deployment(docs[overlay])["spec"]["template"]["spec"]["containers"][0]["image"].endswith(":cuda")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_budgets_fit_the_pod(docs, overlay):
    """The planner's default cpu budget reads the node's memory, not the container's limit, so every
    overlay states --max-memory: its cpu budget plus the in-memory /dev/shm fit the memory limit, and
    it names no GPU the pod does not get."""
    pod = deployment(docs[overlay])["spec"]["template"]["spec"]
    container = server_container(deployment(docs[overlay]))
    spec = flag(container, "max-memory")
    assert spec, "--max-memory is not set"
    budgets = max_memory(spec)
    shm = [v for v in pod["volumes"] if v["name"] == "dshm"][0]["emptyDir"]
    assert shm["medium"] == "Memory"
    assert any(m["mountPath"] == "/dev/shm" and m["name"] == "dshm" for m in container["volumeMounts"])
    limit = quantity_bytes(container["resources"]["limits"]["memory"])
    assert budgets["cpu"] + quantity_bytes(shm["sizeLimit"]) <= limit
    assert container["resources"]["requests"]["memory"] == container["resources"]["limits"]["memory"]
    gpu_budgets = {d for d in budgets if d.isdigit()}
    assert gpu_budgets == {str(i) for i in range(GPU_COUNT[overlay])}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_checkpoint_is_mounted_read_only(docs, overlay):
    objects = docs[overlay]
    pod = deployment(objects)["spec"]["template"]["spec"]
    container = server_container(deployment(objects))
    assert flag(container, "model") == "/model"
    mount = [m for m in container["volumeMounts"] if m["mountPath"] == "/model"][0]
    assert mount["readOnly"] is True
    volume = [v for v in pod["volumes"] if v["name"] == mount["name"]][0]
    claim = volume["persistentVolumeClaim"]
    assert claim["readOnly"] is True
    assert claim["claimName"] in {p["metadata"]["name"] for p in by_kind(objects, "PersistentVolumeClaim")}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_runs_as_non_root(docs, overlay):
    pod = deployment(docs[overlay])["spec"]["template"]["spec"]
    container = server_container(deployment(docs[overlay]))
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]


# --- Services and the ServiceMonitor ----------------------------------------------------------------

@pytest.mark.parametrize("overlay", OVERLAYS)
def test_services_reach_the_pods_named_ports(docs, overlay):
    objects = docs[overlay]
    template = deployment(objects)["spec"]["template"]
    container_ports = {p["name"] for p in server_container(deployment(objects))["ports"]}
    assert selects(deployment(objects)["spec"]["selector"]["matchLabels"], template["metadata"]["labels"])
    services = by_kind(objects, "Service")
    for service in services:
        assert selects(service["spec"]["selector"], template["metadata"]["labels"]), service["metadata"]["name"]
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in container_ports
            assert port["name"] == port["targetPort"]
    grpc = [p for s in services for p in s["spec"]["ports"] if p["name"] == GRPC_PORT_NAME]
    assert grpc and all(p["appProtocol"] == "kubernetes.io/h2c" for p in grpc)
    # The OpenAI-compatible API on the ClusterIP Service, at the container's port (tests/deploy/test_http_port.py
    # ties the number to --http-listen, the image and compose).
    (main,) = [s for s in services if s["metadata"]["name"] == "strata"]
    (http,) = [p for p in main["spec"]["ports"] if p["name"] == HTTP_PORT_NAME]
    assert http["appProtocol"] == "http" and http["protocol"] == "TCP"
    assert http["port"] == container_port(server_container(deployment(objects)), HTTP_PORT_NAME)
    # components/tls drops the gRPC port's appProtocol by index.
    assert main["spec"]["ports"][0]["name"] == GRPC_PORT_NAME
    headless = [s for s in services if s["spec"].get("clusterIP") == "None"]
    assert len(headless) == (0 if overlay == "cpu" else 1)


DURATION = re.compile(r"^(0|(\d+y)?(\d+w)?(\d+d)?(\d+h)?(\d+m)?(\d+s)?(\d+ms)?)$")


@pytest.mark.parametrize("overlay", [o for o in OVERLAYS if "ServiceMonitor" in EXPECTED_KINDS[o]])
def test_service_monitor_fields(docs, overlay):
    """monitoring.coreos.com/v1 ServiceMonitor, field by field (no schema checks it offline)."""
    objects = docs[overlay]
    monitor = one(objects, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(monitor) == {"apiVersion", "kind", "metadata", "spec"}
    spec = monitor["spec"]
    assert set(spec) <= {"jobLabel", "selector", "endpoints", "namespaceSelector", "targetLabels",
                         "podTargetLabels", "sampleLimit"}, set(spec)
    assert set(spec["selector"]) <= {"matchLabels", "matchExpressions"}
    # Exactly one Service is scraped (the headless one would scrape every pod a second time).
    chosen = [s for s in by_kind(objects, "Service")
              if selects(spec["selector"]["matchLabels"], s["metadata"]["labels"])]
    assert [s["metadata"]["name"] for s in chosen] == ["strata"]
    service = chosen[0]
    assert spec["jobLabel"] in service["metadata"]["labels"]
    assert service["metadata"]["labels"][spec["jobLabel"]] == "strata"  # job="strata" in the queries
    port_names = {p["name"] for p in service["spec"]["ports"]}
    assert spec["endpoints"], "no endpoints"
    for endpoint in spec["endpoints"]:
        assert set(endpoint) <= {"port", "path", "scheme", "interval", "scrapeTimeout", "honorLabels",
                                 "relabelings", "metricRelabelings"}, set(endpoint)
        assert endpoint["port"] in port_names, f"ServiceMonitor port {endpoint['port']!r} not in {port_names}"
        assert endpoint["port"] == METRICS_PORT_NAME
        assert endpoint.get("path", "/metrics") == "/metrics"
        assert endpoint.get("scheme", "http") in {"http", "https"}
        for key in ("interval", "scrapeTimeout"):
            assert DURATION.match(endpoint[key]), f"{key}: {endpoint[key]!r}"
        assert duration_seconds(endpoint["scrapeTimeout"]) <= duration_seconds(endpoint["interval"])


# --- PrometheusRule and ScaledObject --------------------------------------------------------------

SEVERITIES = {"critical", "warning", "info"}


@pytest.mark.parametrize("overlay", [o for o in OVERLAYS if "PrometheusRule" in EXPECTED_KINDS[o]])
def test_prometheus_rule_fields(docs, overlay):
    rule = one(docs[overlay], "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(rule["spec"]) == {"groups"}
    groups = rule["spec"]["groups"]
    assert len({g["name"] for g in groups}) == len(groups), "group names must be unique"
    alerts = []
    for group in groups:
        assert set(group) <= {"name", "interval", "rules", "limit", "partial_response_strategy"}, set(group)
        for r in group["rules"]:
            assert set(r) <= {"alert", "record", "expr", "for", "keep_firing_for", "labels", "annotations"}, r
            assert ("alert" in r) != ("record" in r)
            assert isinstance(r["expr"], str) and r["expr"].strip()
            if "for" in r:
                assert DURATION.match(r["for"]), r["for"]
            if "alert" in r:
                assert re.fullmatch(r"Strata[A-Za-z]+", r["alert"]), r["alert"]
                assert r["labels"]["severity"] in SEVERITIES
                assert {"summary", "description"} <= set(r["annotations"])
                assert all(isinstance(v, str) for v in {**r["labels"], **r["annotations"]}.values())
                alerts.append(r["alert"])
    assert len(set(alerts)) == len(alerts), "alert names must be unique"
    # What the issue asks to be alerted on: KV cache or memory near budget, queue, errors, not serving.
    assert {"StrataKvCacheNearBudget", "StrataDeviceMemoryNearBudget", "StrataQueueGrowing",
            "StrataHighErrorRate", "StrataEngineErrors", "StrataNotServing", "StrataTargetDown"} <= set(alerts)


@pytest.mark.parametrize("overlay", [o for o in OVERLAYS if "PrometheusRule" in EXPECTED_KINDS[o]])
def test_prometheus_rule_is_the_rules_file(docs, overlay):
    """Kubernetes alerts on the rules a plain Prometheus loads (deploy/prometheus/rules.yml, unit-tested by
    rules_test.yml, loaded live by tests/observe): the PrometheusRule carries the same groups."""
    rules = yaml.safe_load((REPO / "deploy" / "prometheus" / "rules.yml").read_text())
    assert one(docs[overlay], "PrometheusRule")["spec"]["groups"] == rules["groups"], \
        "deploy/k8s's PrometheusRule differs from deploy/prometheus/rules.yml: run scripts/render_prometheusrule.py"


@pytest.mark.parametrize("overlay", [o for o in OVERLAYS if "ScaledObject" in EXPECTED_KINDS[o]])
def test_scaled_object_fields(docs, overlay):
    """keda.sh/v1alpha1 ScaledObject, field by field."""
    objects = docs[overlay]
    scaled = one(objects, "ScaledObject")
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    spec = scaled["spec"]
    assert set(spec) <= {"scaleTargetRef", "minReplicaCount", "maxReplicaCount", "pollingInterval",
                         "cooldownPeriod", "idleReplicaCount", "initialCooldownPeriod", "fallback",
                         "advanced", "triggers"}, set(spec)
    target = spec["scaleTargetRef"]
    assert target == {"apiVersion": "apps/v1", "kind": "Deployment", "name": deployment(objects)["metadata"]["name"]}
    assert "replicas" not in deployment(objects)["spec"], "the autoscaler owns the replica count"
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
    assert spec["fallback"]["replicas"] <= spec["maxReplicaCount"]
    assert set(spec["advanced"]) <= {"horizontalPodAutoscalerConfig", "restoreToOriginalReplicaCount",
                                     "scalingModifiers"}
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    for direction in behavior.values():
        assert set(direction) <= {"stabilizationWindowSeconds", "policies", "selectPolicy"}
        for policy in direction["policies"]:
            assert policy["type"] in {"Pods", "Percent"} and policy["value"] > 0 and policy["periodSeconds"] > 0
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "prometheus"
    assert trigger["metricType"] == "AverageValue"  # per replica; fallback needs it too
    metadata = trigger["metadata"]
    assert all(isinstance(v, str) for v in metadata.values()), "KEDA's trigger metadata is string to string"
    assert set(metadata) <= {"serverAddress", "query", "threshold", "activationThreshold", "ignoreNullValues",
                             "unsafeSsl", "namespace", "customHeaders", "queryParameters"}
    assert re.fullmatch(r"https?://[^\s/]+(:\d+)?(/\S*)?", metadata["serverAddress"])
    assert float(metadata["threshold"]) > 0
    assert promql_metric_names(metadata["query"]) == {"strata_queue_depth"}  # requests waiting for a slot
    # The query names the namespace the objects are rendered into, and the ServiceMonitor's job.
    assert f'namespace="{scaled["metadata"]["namespace"]}"' in metadata["query"]
    assert 'job="strata"' in metadata["query"]


def queries(objects) -> dict[str, str]:
    """name -> PromQL of every alert, recording rule and autoscaling query of an overlay."""
    found = {}
    for rule in by_kind(objects, "PrometheusRule"):
        for group in rule["spec"]["groups"]:
            for r in group["rules"]:
                found[r.get("alert") or r["record"]] = r["expr"]
    for scaled in by_kind(objects, "ScaledObject"):
        for i, trigger in enumerate(scaled["spec"]["triggers"]):
            found[f"{scaled['metadata']['name']}.trigger{i}"] = trigger["metadata"]["query"]
    return found


@pytest.mark.parametrize("overlay", [o for o in OVERLAYS if CUSTOM_KINDS <= EXPECTED_KINDS[o]])
def test_queries_read_only_exported_metrics(docs, overlay):
    exported = metrics_in_source(METRICS_CC.read_text())
    assert "strata_queue_depth" in exported  # the reader of metrics.cc works
    # What the recording rules record is a series too (read only by the rules after them).
    recorded = {name for name in queries(docs[overlay]) if ":" in name}
    exported |= recorded
    for name, expr in queries(docs[overlay]).items():
        unknown = promql_metric_names(expr) - exported - {"up"}
        assert not unknown, f"{name} reads {sorted(unknown)}, which server/metrics.cc does not export"


def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool is missing: scripts/setup.sh installs Debian's prometheus package"
    return path


@pytest.mark.parametrize("overlay", [o for o in OVERLAYS if CUSTOM_KINDS <= EXPECTED_KINDS[o]])
def test_promtool_parses_the_rules_and_the_autoscaling_query(docs, overlay, tmp_path):
    objects = docs[overlay]
    groups = list(one(objects, "PrometheusRule")["spec"]["groups"])
    # The ScaledObject's query as a recording rule, so that promtool parses it too.
    groups.append({"name": "keda", "rules": [{"record": "strata:autoscaling:query", "expr": expr}
                                             for name, expr in queries(objects).items() if ".trigger" in name]})
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}))
    run = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"SUCCESS: {sum(len(g['rules']) for g in groups)} rules found" in run.stdout, run.stdout
