"""deploy/k8s/overlays/multi-node (issue 24): a LeaderWorkerSet whose groups serve one model over several nodes.
It renders; the LeaderWorkerSet's fields are those of leaderworkerset.x-k8s.io/v1 (no schema is installed here
for a custom resource, so they are checked field by field against the API's types); each pod template validates
strictly as a Pod; and it holds together where no schema looks: probes on the gRPC port (the leader's readiness
on strata.v1.InferenceService, a worker's on its health port), grace covering the drain, GPUs as limits, budgets
inside the memory limit, the checkpoint and the group secret mounted read-only, the leader alone behind the
client Service, the data port named alike in the flags, the containers and the group Service, and every flag
one strata-server takes."""

import re
import subprocess

import pytest
import yaml

from manifest_checks import K8S, flag, kubectl, max_memory, quantity_bytes

OVERLAY = K8S / "overlays" / "multi-node"
# leaderworkerset.x-k8s.io/v1 (sigs.k8s.io/lws api/leaderworkerset/v1/leaderworkerset_types.go): the fields of
# each object, and the values of its enums.
LWS_SPEC = {"replicas", "leaderWorkerTemplate", "rolloutStrategy", "startupPolicy", "networkConfig"}
LWS_TEMPLATE = {"leaderTemplate", "workerTemplate", "size", "restartPolicy", "subGroupPolicy"}
LWS_ROLLOUT = {"type", "rollingUpdateConfiguration"}
LWS_ROLLING = {"partition", "maxUnavailable", "maxSurge"}
RESTART_POLICIES = {"RecreateGroupOnPodRestart", "None"}
STARTUP_POLICIES = {"LeaderCreated", "LeaderReady"}
GROUP_FLAGS_FROM_LWS = {"group-size", "rank", "leader"}  # LWS_GROUP_SIZE, LWS_WORKER_INDEX, LWS_LEADER_ADDRESS


@pytest.fixture(scope="module")
def objects(tmp_path_factory):
    run = subprocess.run([kubectl(), "kustomize", str(OVERLAY)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    return [d for d in yaml.safe_load_all(run.stdout) if d]


def lws(objects) -> dict:
    found = [o for o in objects if o["kind"] == "LeaderWorkerSet"]
    assert len(found) == 1
    return found[0]


def templates(objects) -> dict[str, dict]:
    t = lws(objects)["spec"]["leaderWorkerTemplate"]
    return {"leader": t["leaderTemplate"], "worker": t["workerTemplate"]}


def container(template: dict) -> dict:
    (c,) = [c for c in template["spec"]["containers"] if c["name"] == "strata"]
    return c


def test_it_renders_a_leaderworkerset_and_no_deployment(objects):
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == ["LeaderWorkerSet", "Namespace", "PersistentVolumeClaim", "Service", "Service"]
    assert all(o["metadata"].get("namespace") == "strata" for o in objects if o["kind"] != "Namespace")


def test_the_leaderworkerset_fields_are_the_apis(objects):
    obj = lws(objects)
    assert obj["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    spec = obj["spec"]
    assert set(spec) <= LWS_SPEC, set(spec) - LWS_SPEC
    assert spec["startupPolicy"] in STARTUP_POLICIES
    assert set(spec["rolloutStrategy"]) <= LWS_ROLLOUT
    assert spec["rolloutStrategy"]["type"] == "RollingUpdate"
    assert set(spec["rolloutStrategy"]["rollingUpdateConfiguration"]) <= LWS_ROLLING
    template = spec["leaderWorkerTemplate"]
    assert set(template) <= LWS_TEMPLATE, set(template) - LWS_TEMPLATE
    assert isinstance(template["size"], int) and template["size"] >= 2
    # A group that lost a node cannot serve: any pod's restart must recreate its group.
    assert template["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert isinstance(spec["replicas"], int) and spec["replicas"] >= 1


@pytest.mark.parametrize("role", ["leader", "worker"])
def test_each_pod_template_validates_strictly_as_a_pod(objects, role, tmp_path):
    from test_manifests import KUBERNETES_VERSIONS, kubernetes_validate

    template = templates(objects)[role]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"strata-{role}", "namespace": "strata",
                                                           "labels": template["metadata"]["labels"]},
           "spec": template["spec"]}
    path = tmp_path / f"{role}.yaml"
    path.write_text(yaml.safe_dump(pod))
    for version in KUBERNETES_VERSIONS:
        run = subprocess.run([kubernetes_validate(), "--strict", "-k", version, str(path)], capture_output=True,
                             text=True, timeout=60)
        assert run.returncode == 0, run.stdout + run.stderr
        assert "passed" in run.stdout + run.stderr


@pytest.mark.parametrize("role", ["leader", "worker"])
def test_probes_grace_gpus_and_budgets(objects, role):
    template = templates(objects)[role]
    pod, c = template["spec"], container(template)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert flag(c, "listen") == f"0.0.0.0:{ports['grpc']}"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert set(c[probe]) & {"grpc", "httpGet", "tcpSocket", "exec"} == {"grpc"}, probe
        assert c[probe]["grpc"]["port"] == ports["grpc"], probe
    # The leader is ready when Generate can run; a worker when its stages are loaded (its health port's "").
    want = "strata.v1.InferenceService" if role == "leader" else ""
    assert c["readinessProbe"]["grpc"].get("service", "") == want
    assert c["startupProbe"]["failureThreshold"] * c["startupProbe"]["periodSeconds"] >= 30 * 60
    # The group may take --group-timeout to form, plan and load: the startup probe waits that long.
    assert c["startupProbe"]["failureThreshold"] * c["startupProbe"]["periodSeconds"] >= float(
        flag(c, "group-timeout"))
    if role == "leader":
        pre_stop = c["lifecycle"]["preStop"]["sleep"]["seconds"]
        assert pod["terminationGracePeriodSeconds"] >= pre_stop + float(flag(c, "drain-timeout")) + 5
    limits = c["resources"]["limits"]
    budgets = max_memory(flag(c, "max-memory"))
    assert {d for d in budgets if d.isdigit()} == {str(i) for i in range(limits["nvidia.com/gpu"])}
    shm = [v for v in pod["volumes"] if v["name"] == "dshm"][0]["emptyDir"]
    assert budgets["cpu"] + quantity_bytes(shm["sizeLimit"]) <= quantity_bytes(limits["memory"])
    assert any(t["key"] == "nvidia.com/gpu" and t["effect"] == "NoSchedule" for t in pod["tolerations"])
    assert c["image"].endswith(":cuda")


@pytest.mark.parametrize("role", ["leader", "worker"])
def test_the_checkpoint_and_the_secret_are_mounted_read_only(objects, role):
    template = templates(objects)[role]
    pod, c = template["spec"], container(template)
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert flag(c, "model") == "/model"
    assert mounts["/model"]["readOnly"] and volumes[mounts["/model"]["name"]]["persistentVolumeClaim"]["readOnly"]
    secret_file = flag(c, "group-secret-file")
    directory, name = secret_file.rsplit("/", 1)
    mount = mounts[directory]
    assert mount["readOnly"]
    secret = volumes[mount["name"]]["secret"]
    assert secret["secretName"] == "strata-group"
    # Readable by the pod's group only (fsGroup), the user strata runs as.
    assert secret["defaultMode"] & 0o007 == 0 and pod["securityContext"]["fsGroup"] == pod["securityContext"][
        "runAsGroup"]
    assert pod["securityContext"]["runAsNonRoot"]
    assert c["securityContext"]["readOnlyRootFilesystem"]


@pytest.mark.parametrize("role", ["leader", "worker"])
def test_the_group_flags_come_from_the_leaderworkerset(objects, role):
    c = container(templates(objects)[role])
    given = {a[2:].split("=", 1)[0] for a in c["args"]}
    assert not given & GROUP_FLAGS_FROM_LWS, "LWS's environment gives these; a flag would override it"
    # The data port: the flag, the container port and the group Service agree.
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert int(flag(c, "group-port")) == ports["group"]
    # It binds the pod's IP (the downward API), not every interface: --group-bind defaults to loopback.
    assert flag(c, "group-bind") == "$(POD_IP)"
    env = {e["name"]: e for e in c.get("env", [])}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"


def test_clients_reach_the_leaders_and_the_group_service_every_pod(objects):
    services = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Service"}
    client = services["strata"]["spec"]
    assert client["selector"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"
    leader = container(templates(objects)["leader"])
    leader_ports = {p["name"] for p in leader["ports"]}
    assert {p["targetPort"] for p in client["ports"]} <= leader_ports
    group = services["strata-group"]["spec"]
    assert group["clusterIP"] == "None" and group["publishNotReadyAddresses"]
    assert "leaderworkerset.sigs.k8s.io/worker-index" not in group["selector"]
    for role in ("leader", "worker"):
        labels = templates(objects)[role]["metadata"]["labels"]
        # LWS adds leaderworkerset.sigs.k8s.io/name (and worker-index) itself; the rest must match.
        rest = {k: v for k, v in group["selector"].items() if not k.startswith("leaderworkerset.sigs.k8s.io/")}
        assert rest.items() <= labels.items(), role
        names = {p["name"] for p in container(templates(objects)[role])["ports"]}
        assert {p["targetPort"] for p in group["ports"]} <= names


def test_every_flag_is_one_strata_server_takes(objects):
    from manifest_checks import REPO as repo

    server = repo / "build" / "server" / "strata-server"
    if not server.is_file():
        import os
        import pathlib
        server = pathlib.Path(os.environ.get("STRATA_BUILD_DIR", repo / "build")) / "server" / "strata-server"
    if not server.is_file():
        pytest.fail(f"{server} is missing: build it first (scripts/test.sh)")
    usage = subprocess.run([str(server), "--help"], capture_output=True, text=True, timeout=30).stdout
    known = set(re.findall(r"--([a-z0-9-]+)", usage))
    for role in ("leader", "worker"):
        for arg in container(templates(objects)[role])["args"]:
            name = arg[2:].split("=", 1)[0]
            assert name in known, f"{role}: --{name} is not a strata-server flag"
