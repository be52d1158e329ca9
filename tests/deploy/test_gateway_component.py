"""deploy/k8s/components/gateway added to each overlay's own `components`: it renders, the core objects
(the endpoint picker's Deployment, Service, ConfigMap and RBAC) validate strictly, and the custom
resources are checked field by field against the schemas they were written to, encoded below since no
CRD can be fetched here:

  - InferencePool: inference.networking.k8s.io/v1, the CRD of kubernetes-sigs/gateway-api-inference-extension
    v1.5.0 (config/crd/bases/inference.networking.k8s.io_inferencepools.yaml, bundle-version v1.5.0);
  - HTTPRoute: gateway.networking.k8s.io/v1, kubernetes-sigs/gateway-api v1.6.1, standard channel
    (config/crd/standard/gateway.networking.k8s.io_httproutes.yaml);
  - EndpointPickerConfig (the EPP's config file, in a ConfigMap): inference.networking.x-k8s.io/v1alpha1 of
    gateway-api-inference-extension v1.5.0 (apix/config/v1alpha1/endpointpickerconfig_types.go, and
    pkg/epp/framework/plugins/datalayer/extractor/metrics/factories.go for core-metrics-extractor's
    parameters); the EPP's flags are those of its pkg/epp/server/options.go.

Then what ties them together: the pool selects strata's pods (not the picker's) at the container port
named http; endpointPickerRef names the picker's Service and port; the picker scrapes strata's /metrics
port and reads metric names server/metrics.cc exports."""

import copy
import pathlib
import re
import shutil
import subprocess

import pytest
import yaml

from manifest_checks import (HTTP_PORT_NAME, K8S, METRICS_PORT_NAME, OVERLAYS, REPO, by_kind, container_port, flag,
                             kubectl, metrics_in_source, one, selects, server_container)
from test_manifests import CUSTOM_KINDS, EXPECTED_KINDS, KUBERNETES_VERSIONS, kubernetes_validate

COMPONENT = K8S / "components" / "gateway"
EPP_CONFIG = COMPONENT / "epp-config.yaml"
METRICS_CC = REPO / "server" / "metrics.cc"
GATEWAY_CORE_KINDS = {"ServiceAccount", "Role", "RoleBinding", "ConfigMap"}
GATEWAY_CUSTOM_KINDS = {"InferencePool", "HTTPRoute"}
EPP_NAME = "strata-epp"


@pytest.fixture(scope="module")
def rendered_gateway(tmp_path_factory) -> dict[str, pathlib.Path]:
    """overlay -> its render with the component in the overlay's own `components` (as an overlay that
    wants it would write it: the overlay's namespace then reaches the component's objects)."""
    tree = tmp_path_factory.mktemp("k8s") / "k8s"
    shutil.copytree(K8S, tree)
    files = {}
    for overlay in OVERLAYS:
        path = tree / "overlays" / overlay / "kustomization.yaml"
        kustomization = yaml.safe_load(path.read_text())
        kustomization.setdefault("components", []).append("../../components/gateway")
        path.write_text(yaml.safe_dump(kustomization))
        run = subprocess.run([kubectl(), "kustomize", str(path.parent)], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, f"overlays/{overlay} + components/gateway:\n{run.stderr}"
        files[overlay] = tree / f"{overlay}-gateway.yaml"
        files[overlay].write_text(run.stdout)
    return files


@pytest.fixture(scope="module")
def gateway_docs(rendered_gateway) -> dict[str, list[dict]]:
    return {o: [d for d in yaml.safe_load_all(p.read_text()) if d] for o, p in rendered_gateway.items()}


def named(objects: list[dict], kind: str, name: str) -> dict:
    found = [o for o in by_kind(objects, kind) if o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def strata_deployment(objects):
    return named(objects, "Deployment", "strata")


def epp_deployment(objects):
    return named(objects, "Deployment", EPP_NAME)


def epp_container(objects) -> dict:
    (container,) = epp_deployment(objects)["spec"]["template"]["spec"]["containers"]
    return container


# --- rendering and schema validation ------------------------------------------------------------

@pytest.mark.parametrize("overlay", OVERLAYS)
def test_renders_beside_every_overlay(gateway_docs, overlay):
    objects = gateway_docs[overlay]
    assert {o["kind"] for o in objects} == EXPECTED_KINDS[overlay] | GATEWAY_CORE_KINDS | GATEWAY_CUSTOM_KINDS
    assert all(o["metadata"].get("namespace") == "strata" for o in objects if o["kind"] != "Namespace")
    assert sorted(d["metadata"]["name"] for d in by_kind(objects, "Deployment")) == ["strata", EPP_NAME]
    # The overlays patch the Deployment `strata` only: the picker gets no GPU, node selector or strata flags.
    epp = epp_deployment(objects)["spec"]["template"]["spec"]
    assert "nodeSelector" not in epp and "tolerations" not in epp
    assert "nvidia.com/gpu" not in epp_container(objects)["resources"].get("limits", {})
    assert epp_container(objects)["image"].startswith("registry.k8s.io/gateway-api-inference-extension/epp:v")


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_validates_strictly(rendered_gateway, gateway_docs, overlay, version):
    run = subprocess.run([kubernetes_validate(), "--strict", "-k", version, str(rendered_gateway[overlay])],
                         capture_output=True, text=True, timeout=60)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    skipped = set(re.findall(r"Couldn't find schema for kind (\w+)", output))
    custom = (EXPECTED_KINDS[overlay] & CUSTOM_KINDS) | GATEWAY_CUSTOM_KINDS
    assert skipped == custom, output
    passed = set(re.findall(r"passed for resource (\S+) ", output))
    assert len(passed) == len([o for o in gateway_docs[overlay] if o["kind"] not in custom]), output
    assert [line for line in output.splitlines()
            if not line.startswith("INFO ") and "Couldn't find schema for kind" not in line] == [], output


# --- InferencePool (inference.networking.k8s.io/v1, CRD of gateway-api-inference-extension v1.5.0) --

LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
GROUP = re.compile(r"^$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
KIND = re.compile(r"^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$")


def inference_pool_schema_errors(pool: dict) -> list[str]:
    """What the v1 CRD's openAPIV3Schema and its CEL rules would reject (fields, types, enums, bounds)."""
    errors = []
    if pool.get("apiVersion") != "inference.networking.k8s.io/v1":
        errors.append(f"apiVersion {pool.get('apiVersion')!r}")
    if set(pool) - {"apiVersion", "kind", "metadata", "spec", "status"}:
        errors.append(f"top-level fields {sorted(set(pool) - {'apiVersion', 'kind', 'metadata', 'spec'})}")
    spec = pool.get("spec", {})
    unknown = set(spec) - {"selector", "targetPorts", "appProtocol", "endpointPickerRef"}
    if unknown:
        errors.append(f"spec: unknown fields {sorted(unknown)}")  # e.g. v1alpha2's targetPortNumber, extensionRef
    missing = {"selector", "targetPorts", "endpointPickerRef"} - set(spec)
    if missing:
        errors.append(f"spec: missing required {sorted(missing)}")
    selector = spec.get("selector", {})
    if set(selector) != {"matchLabels"}:
        errors.append(f"selector: only matchLabels, got {sorted(selector)}")  # no matchExpressions in v1
    labels = selector.get("matchLabels", {})
    if not 1 <= len(labels) <= 64 or not all(isinstance(v, str) and len(v) <= 63 and LABEL_VALUE.match(v)
                                              for v in labels.values()):
        errors.append(f"selector.matchLabels: {labels}")
    ports = spec.get("targetPorts", [])
    if not isinstance(ports, list) or not 1 <= len(ports) <= 8:
        errors.append(f"targetPorts: 1 to 8 items, got {ports}")
    else:
        for port in ports:
            if set(port) != {"number"} or not isinstance(port["number"], int) or not 1 <= port["number"] <= 65535:
                errors.append(f"targetPorts: {port}")
        if len({p.get("number") for p in ports}) != len(ports):
            errors.append("targetPorts: port number must be unique")
    if spec.get("appProtocol", "http") not in {"http", "kubernetes.io/h2c"}:
        errors.append(f"appProtocol: {spec['appProtocol']!r}")
    ref = spec.get("endpointPickerRef", {})
    unknown = set(ref) - {"group", "kind", "name", "port", "failureMode"}
    if unknown:
        errors.append(f"endpointPickerRef: unknown fields {sorted(unknown)}")
    if not isinstance(ref.get("name"), str) or not 1 <= len(ref["name"]) <= 253:
        errors.append("endpointPickerRef.name is required")
    if not GROUP.match(ref.get("group", "")) or not KIND.match(ref.get("kind", "Service")):
        errors.append(f"endpointPickerRef group/kind: {ref.get('group')!r} {ref.get('kind')!r}")
    if ref.get("kind", "Service") == "Service":
        port = ref.get("port")
        if not isinstance(port, dict) or set(port) != {"number"} or not 1 <= port["number"] <= 65535:
            errors.append("endpointPickerRef.port.number is required when kind is Service")
    if ref.get("failureMode", "FailClose") not in {"FailOpen", "FailClose"}:
        errors.append(f"endpointPickerRef.failureMode: {ref['failureMode']!r}")
    return errors


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_inference_pool_fields(gateway_docs, overlay):
    pool = one(gateway_docs[overlay], "InferencePool")
    assert inference_pool_schema_errors(pool) == []


def test_inference_pool_checker_rejects_the_older_api():
    """v1alpha2's fields (targetPortNumber, extensionRef) and a misspelling fail the check above."""
    pool = yaml.safe_load((COMPONENT / "inferencepool.yaml").read_text())
    assert inference_pool_schema_errors(pool) == []
    old = copy.deepcopy(pool)
    old["spec"]["targetPortNumber"] = old["spec"].pop("targetPorts")[0]["number"]
    old["spec"]["extensionRef"] = old["spec"].pop("endpointPickerRef")
    assert len(inference_pool_schema_errors(old)) >= 3
    typo = copy.deepcopy(pool)
    typo["spec"]["endpointPickerRef"]["failuremode"] = typo["spec"]["endpointPickerRef"].pop("failureMode")
    assert inference_pool_schema_errors(typo)
    expressions = copy.deepcopy(pool)
    expressions["spec"]["selector"]["matchExpressions"] = []
    assert inference_pool_schema_errors(expressions)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_inference_pool_targets_strata_pods_at_the_http_port(gateway_docs, overlay):
    objects = gateway_docs[overlay]
    spec = one(objects, "InferencePool")["spec"]
    chosen = [d["metadata"]["name"] for d in by_kind(objects, "Deployment")
              if selects(spec["selector"]["matchLabels"], d["spec"]["template"]["metadata"]["labels"])]
    assert chosen == ["strata"], "the pool must hold strata's pods and not the picker's"
    http_port = container_port(server_container(strata_deployment(objects)), HTTP_PORT_NAME)
    assert [p["number"] for p in spec["targetPorts"]] == [http_port]
    assert spec["appProtocol"] == "http"
    # The picker's Service and port.
    ref = spec["endpointPickerRef"]
    assert ref.get("kind", "Service") == "Service" and ref.get("group", "") == ""
    service = named(objects, "Service", ref["name"])
    (port,) = [p for p in service["spec"]["ports"] if p["port"] == ref["port"]["number"]]
    epp = epp_container(objects)
    assert container_port(epp, port["targetPort"]) == int(flag(epp, "grpc-port"))
    assert port["appProtocol"] == "kubernetes.io/h2c"  # ext_proc is gRPC
    assert ref["failureMode"] == "FailOpen"


# --- HTTPRoute (gateway.networking.k8s.io/v1, Gateway API v1.6.1 standard channel) ----------------

GATEWAY_DURATION = re.compile(r"^([0-9]{1,5}(h|m|s|ms)){1,4}$")


def http_route_schema_errors(route: dict) -> list[str]:
    errors = []
    if route.get("apiVersion") != "gateway.networking.k8s.io/v1":
        errors.append(f"apiVersion {route.get('apiVersion')!r}")
    spec = route.get("spec", {})
    if set(spec) - {"parentRefs", "hostnames", "rules"}:
        errors.append(f"spec: unknown fields {sorted(set(spec) - {'parentRefs', 'hostnames', 'rules'})}")
    for ref in spec.get("parentRefs", []):
        if set(ref) - {"group", "kind", "namespace", "name", "sectionName", "port"} or "name" not in ref:
            errors.append(f"parentRef: {ref}")
    rules = spec.get("rules", [])
    if len(rules) > 16:
        errors.append("rules: at most 16")
    for rule in rules:
        unknown = set(rule) - {"name", "matches", "filters", "backendRefs", "timeouts"}
        if unknown:
            errors.append(f"rule: unknown fields {sorted(unknown)}")
        for match in rule.get("matches", []):
            if set(match) - {"path", "headers", "queryParams", "method"}:
                errors.append(f"match: {match}")
            path = match.get("path", {})
            if set(path) - {"type", "value"} or path.get("type", "PathPrefix") not in {"Exact", "PathPrefix",
                                                                                     "RegularExpression"}:
                errors.append(f"match.path: {path}")
            if not path.get("value", "/").startswith("/"):
                errors.append(f"match.path.value: {path}")
        for backend in rule.get("backendRefs", []):
            fields = {"group", "kind", "name", "namespace", "port", "weight", "filters"}
            if set(backend) - fields or "name" not in backend:
                errors.append(f"backendRef: {backend}")
        timeouts = rule.get("timeouts", {})
        if (set(timeouts) - {"request", "backendRequest"}
                or not all(GATEWAY_DURATION.match(v) for v in timeouts.values())):
            errors.append(f"timeouts: {timeouts}")
    return errors


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_http_route_fields(gateway_docs, overlay):
    objects = gateway_docs[overlay]
    route = one(objects, "HTTPRoute")
    assert http_route_schema_errors(route) == []
    # A Gateway users name (deploy/README.md): one parent, a Gateway.
    (parent,) = route["spec"]["parentRefs"]
    assert parent.get("group") == "gateway.networking.k8s.io" and parent.get("kind") == "Gateway"
    pool = one(objects, "InferencePool")
    backends = [b for rule in route["spec"]["rules"] for b in rule["backendRefs"]]
    assert backends == [{"group": "inference.networking.k8s.io", "kind": "InferencePool",
                         "name": pool["metadata"]["name"]}]
    paths = [m["path"] for rule in route["spec"]["rules"] for m in rule["matches"]]
    assert {"type": "PathPrefix", "value": "/v1"} in paths  # /v1/completions, /v1/chat/completions, /v1/models


def test_http_route_checker_rejects_a_misspelled_field():
    route = yaml.safe_load((COMPONENT / "httproute.yaml").read_text())
    assert http_route_schema_errors(route) == []
    route["spec"]["rules"][0]["backendRef"] = route["spec"]["rules"][0].pop("backendRefs")
    assert http_route_schema_errors(route)


# --- the endpoint picker: flags, config, RBAC ---------------------------------------------------

# pkg/epp/server/options.go (v1.5.0) and the logging/zap flags it adds.
EPP_FLAGS = {"grpc-port", "pool-group", "pool-namespace", "pool-name", "endpoint-selector", "endpoint-target-ports",
             "model-server-metrics-scheme", "model-server-metrics-path", "model-server-metrics-port",
             "model-server-metrics-https-insecure-skip-verify", "refresh-metrics-interval",
             "refresh-prometheus-metrics-interval", "metrics-staleness-threshold", "tracing", "health-checking",
             "metrics-port", "grpc-health-port", "enable-pprof", "cert-path", "enable-cert-reload", "secure-serving",
             "metrics-endpoint-auth", "config-file", "config-text", "ha-enable-leader-election",
             "disable-endpoint-subset-filter", "v", "zap-devel", "zap-encoder", "zap-log-level",
             "zap-stacktrace-level", "zap-time-encoding"}
# Refused at start since v1.4.0 ("deprecated and cannot be used; configure metrics via engineConfigs").
EPP_REFUSED_FLAGS = {"total-queued-requests-metric", "total-running-requests-metric",
                     "kv-cache-usage-percentage-metric", "lora-info-metric", "cache-info-metric"}


def flag_names(args: list[str]) -> list[str]:
    return [a[2:].split("=", 1)[0] for a in args if a.startswith("--")]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_epp_flags_ports_and_probes(gateway_docs, overlay):
    objects = gateway_docs[overlay]
    epp = epp_container(objects)
    names = flag_names(epp["args"])
    assert set(names) <= EPP_FLAGS, sorted(set(names) - EPP_FLAGS)
    assert not set(names) & EPP_REFUSED_FLAGS
    assert len(names) == len(set(names))
    assert flag(epp, "pool-name") == one(objects, "InferencePool")["metadata"]["name"]
    assert flag(epp, "pool-group") in (None, "inference.networking.k8s.io")
    # Without --pool-namespace the EPP reads NAMESPACE: its own, where the pool is rendered.
    env = {e["name"]: e for e in epp["env"]}
    assert flag(epp, "pool-namespace") is None
    assert env["NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    # strata's /metrics is on its own port, not the pool's target port.
    strata = server_container(strata_deployment(objects))
    assert int(flag(epp, "model-server-metrics-port")) == container_port(strata, METRICS_PORT_NAME)
    assert container_port(strata, METRICS_PORT_NAME) not in [p["number"] for p in
                                                              one(objects, "InferencePool")["spec"]["targetPorts"]]
    assert int(flag(epp, "grpc-port")) == container_port(epp, "grpc-ext-proc")
    assert int(flag(epp, "metrics-port")) == container_port(epp, "metrics")
    health = int(flag(epp, "grpc-health-port"))
    assert health == container_port(epp, "grpc-health")
    for probe in ("readinessProbe", "livenessProbe"):
        assert epp[probe]["grpc"]["port"] == health, probe
    # One replica (no leader election): the in-memory prefix index stays with one picker.
    assert epp_deployment(objects)["spec"].get("replicas", 1) == 1
    assert "ha-enable-leader-election" not in names
    assert epp_deployment(objects)["spec"]["strategy"]["type"] == "Recreate"
    # The picker's Service reaches its pods' named ports.
    service = named(objects, "Service", EPP_NAME)
    assert selects(service["spec"]["selector"], epp_deployment(objects)["spec"]["template"]["metadata"]["labels"])
    strata_labels = strata_deployment(objects)["spec"]["template"]["metadata"]["labels"]
    assert not selects(service["spec"]["selector"], strata_labels)
    for port in service["spec"]["ports"]:
        assert port["name"] == port["targetPort"] and container_port(epp, port["targetPort"]) == port["port"]
    # Non-root, read-only root, no privilege escalation (distroless nonroot: uid 65532).
    pod = epp_deployment(objects)["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert epp["securityContext"]["readOnlyRootFilesystem"] is True
    assert epp["securityContext"]["allowPrivilegeEscalation"] is False


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_epp_reads_its_config_from_the_config_map(gateway_docs, overlay):
    objects = gateway_docs[overlay]
    epp = epp_container(objects)
    pod = epp_deployment(objects)["spec"]["template"]["spec"]
    path = pathlib.PurePosixPath(flag(epp, "config-file"))
    (mount,) = [m for m in epp["volumeMounts"] if m["mountPath"] == str(path.parent)]
    assert mount.get("readOnly") is True
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    config_map = named(objects, "ConfigMap", volume["configMap"]["name"])
    assert config_map["metadata"]["name"].startswith(EPP_NAME + "-")  # the generator's hash: a change rolls the EPP
    assert yaml.safe_load(config_map["data"][path.name]) == yaml.safe_load(EPP_CONFIG.read_text())


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_epp_rbac_is_namespaced_and_bound(gateway_docs, overlay):
    objects = gateway_docs[overlay]
    account = named(objects, "ServiceAccount", EPP_NAME)
    assert epp_deployment(objects)["spec"]["template"]["spec"]["serviceAccountName"] == account["metadata"]["name"]
    binding = named(objects, "RoleBinding", EPP_NAME)
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": EPP_NAME}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": account["metadata"]["namespace"]}]
    rules = named(objects, "Role", EPP_NAME)["rules"]
    granted = {(group, resource, verb) for r in rules for group in r["apiGroups"] for resource in r["resources"]
               for verb in r["verbs"]}
    for group, resource in (("", "pods"), ("inference.networking.k8s.io", "inferencepools")):
        assert {(group, resource, v) for v in ("get", "list", "watch")} <= granted, resource
    assert all(v in {"get", "list", "watch"} for (_, _, v) in granted), "the picker only reads"
    assert not by_kind(objects, "ClusterRole") and not by_kind(objects, "ClusterRoleBinding")


# EndpointPickerConfig (inference.networking.x-k8s.io/v1alpha1, v1.5.0): the fields of its Go types, the
# plugin types registered by cmd/epp (those used here), and core-metrics-extractor's parameters.
EPC_FIELDS = {"apiVersion", "kind", "featureGates", "plugins", "schedulingProfiles", "saturationDetector", "dataLayer",
              "flowControl", "parser"}
PLUGIN_TYPES = {"queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer", "max-score-picker",
                "metrics-data-source", "core-metrics-extractor"}
EXTRACTOR_PARAMETERS = {"engineLabelKey", "defaultEngine", "engineConfigs"}
ENGINE_FIELDS = {"name", "queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec", "loraSpec", "cacheInfoSpec",
                 "cacheBlockSizeLabelName", "cacheNumBlocksLabelName", "cacheBlockSizeSpec", "cacheNumBlocksSpec"}
METRIC_SPEC = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?$")  # family_name{label=value}


def epp_config() -> dict:
    return yaml.safe_load(EPP_CONFIG.read_text())


def test_epp_config_fields():
    config = epp_config()
    assert config["apiVersion"] == "inference.networking.x-k8s.io/v1alpha1"
    assert config["kind"] == "EndpointPickerConfig"
    assert set(config) <= EPC_FIELDS, sorted(set(config) - EPC_FIELDS)
    plugins = {p.get("name", p["type"]): p for p in config["plugins"]}
    assert len(plugins) == len(config["plugins"]), "plugin names must be unique"
    for plugin in config["plugins"]:
        assert set(plugin) <= {"name", "type", "parameters"}, plugin
        assert plugin["type"] in PLUGIN_TYPES, plugin["type"]
    for profile in config["schedulingProfiles"]:
        assert set(profile) <= {"name", "plugins"}
        for ref in profile["plugins"]:
            assert set(ref) <= {"pluginRef", "weight"} and ref["pluginRef"] in plugins, ref
    assert set(config["dataLayer"]) == {"sources"}
    for source in config["dataLayer"]["sources"]:
        assert set(source) == {"pluginRef", "extractors"}
        assert plugins[source["pluginRef"]]["type"] == "metrics-data-source"
        assert [plugins[e["pluginRef"]]["type"] for e in source["extractors"]] == ["core-metrics-extractor"]
    (source,) = [p for p in config["plugins"] if p["type"] == "metrics-data-source"]
    assert set(source.get("parameters", {})) <= {"scheme", "path", "insecureSkipVerify"}
    assert source["parameters"]["scheme"] == "http" and source["parameters"]["path"] == "/metrics"
    assert "enableLegacyMetrics" not in config.get("featureGates", [])  # the flags' path: would ignore engineConfigs


def strata_engine() -> dict:
    (extractor,) = [p for p in epp_config()["plugins"] if p["type"] == "core-metrics-extractor"]
    parameters = extractor["parameters"]
    assert set(parameters) <= EXTRACTOR_PARAMETERS
    engines = {e["name"]: e for e in parameters["engineConfigs"]}
    assert all(set(e) <= ENGINE_FIELDS for e in engines.values())
    assert "default" not in engines  # reserved by the extractor
    # Every pod without the engine-type label (strata's carry none) uses strata's names.
    return engines[parameters["defaultEngine"]]


def test_epp_reads_metrics_strata_exports():
    """The names the picker is told exist in server/metrics.cc, with the meaning it expects (vLLM's
    counterparts: num_requests_waiting, num_requests_running, kv_cache_usage_perc as a 0..1 fraction)."""
    engine = strata_engine()
    exported = metrics_in_source(METRICS_CC.read_text())
    expected = {"queuedRequestsSpec": "strata_requests_waiting", "runningRequestsSpec": "strata_requests_running",
                "kvUsageSpec": "strata_kv_cache_usage_ratio"}
    for field, name in expected.items():
        m = METRIC_SPEC.match(engine[field])
        assert m, f"{field}: {engine[field]!r} is not a metric selector"
        assert m.group(1) == name, field
        assert m.group(1) in exported, f"{field}: server/metrics.cc does not export {m.group(1)}"
    for field in ENGINE_FIELDS - {"name"} - set(expected):
        spec = engine.get(field, "")
        if field.endswith("Spec") and spec:
            assert METRIC_SPEC.match(spec).group(1) in exported, f"{field}: {spec!r}"
    # Off on purpose (strata has neither): an empty spec, not the vLLM default the engine would inherit.
    assert engine["loraSpec"] == "" and engine["cacheInfoSpec"] == ""
    # The KV usage is a fraction in 0..1 (the EPP's unit; a _ratio by Prometheus' naming), and both counts
    # are plain gauges of requests, as their help text in metrics.cc says.
    source = METRICS_CC.read_text()
    assert re.search(r'\.Name\("strata_kv_cache_usage_ratio"\)\s*\.Help\("Fraction of', source)
    assert re.search(r'BuildGauge\(\)\s*\.Name\("strata_requests_waiting"\)', source)
    assert re.search(r'BuildGauge\(\)\s*\.Name\("strata_requests_running"\)', source)
