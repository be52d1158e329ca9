"""Plans see the GPUs: `strata-plan --device-map STRATEGY --inventory 0=...,1=...,cpu=...` (no
--max-memory) produces exactly the device map transformers' `from_pretrained(device_map=STRATEGY)`
computes without max_memory on a machine whose GPUs have that much free memory and whose host has that
much available.

The reference is transformers' own placement (`_get_device_map(model, strategy, None, None)`, what
from_pretrained calls) on the meta model, with the machine stubbed (parity_helpers.stub_machine):
torch.cuda reports the inventory's GPUs and free memory, psutil the host's available memory, and no
other accelerator exists. Besides the map, the budgets strata placed with (--json "devices") must equal
the max_memory transformers handed infer_auto_device_map: this pins the default-budget rules (cpu at
90%, one GPU at 90% unless sequential, GPU 0 scaled even when it is not the GPU with memory) on their own.

Cases: machines with 0, 1, 2, 4 and 8 GPUs, of equal and of unequal free memory, with and without room
on the host, sized relative to each model (total size S, largest layer L) so that every model spreads
over several GPUs and spills to cpu or disk alike; x the four strategies x the configs of
parity_helpers.CONFIGS, each in its checkpoint dtype.
"""

from __future__ import annotations

import itertools

import pytest

import parity_helpers as H

# Unequal GPUs: relative weights, cycled over the GPU count.
_UNEQUAL = [1.0, 0.45, 1.6, 0.8, 1.25, 0.3, 0.9, 1.4]


def _machine(n_gpus: int, equal: bool, gpu_share: float, host: tuple[float, int]):
    """GPUs holding `gpu_share` x S together, split equally or by _UNEQUAL, GPU 0 with two largest
    layers more (the room transformers keeps there for an offloaded layer, and the embedding, often the
    largest layer, which comes first and would otherwise push the whole fill past GPU 0); host
    (fraction of S, multiple of L)."""
    def make(size: int, largest: int):
        weights = [1.0] * n_gpus if equal else (_UNEQUAL * 2)[:n_gpus]
        gpus = [int(gpu_share * size * w / sum(weights)) + (2 * largest if i == 0 else 0) for i, w in enumerate(weights)]
        return gpus, int(host[0] * size) + host[1] * largest
    return make


ROOMY_HOST = (2.0, 0)   # the host takes whatever the GPUs cannot: nothing goes to disk
TIGHT_HOST = (0.05, 1)  # the host takes a few layers, the rest goes to disk

MACHINES = {
    "0gpu-roomy": _machine(0, True, 0.0, ROOMY_HOST),
    "0gpu-tight": _machine(0, True, 0.0, TIGHT_HOST),
    # One GPU that holds the model (with transformers' 10% margin), one that holds about half of it,
    # one that holds a fifth on a host that holds a tenth.
    "1gpu-fits": _machine(1, True, 1.3, ROOMY_HOST),
    "1gpu-half-roomy": _machine(1, True, 0.5, ROOMY_HOST),
    "1gpu-small-tight": _machine(1, True, 0.2, TIGHT_HOST),
}
for _n in (2, 4, 8):
    for _equal in (True, False):
        _kind = "equal" if _equal else "unequal"
        # Together the GPUs hold the model with room to spare: it spreads over them. (Balancing
        # assumes equal GPUs: unequal ones need more room in total to hold everything.)
        MACHINES[f"{_n}gpu-{_kind}-fits"] = _machine(_n, _equal, 1.3 if _equal else 2.2, ROOMY_HOST)
        # Together they hold 40% (and GPU 0 the largest layer): the rest goes to the host.
        MACHINES[f"{_n}gpu-{_kind}-roomy"] = _machine(_n, _equal, 0.4, ROOMY_HOST)
        # Together they hold 20% (8 GPUs: 35%, so that each holds a layer), the host a little: the rest
        # goes to disk.
        MACHINES[f"{_n}gpu-{_kind}-tight"] = _machine(_n, _equal, 0.35 if _n == 8 else 0.2, TIGHT_HOST)


def _gpu0_busy(size: int, largest: int):
    """GPU 0 has no free memory, GPU 1 all the room: one GPU with memory, but GPU 0 is the one
    transformers scales by 0.9 (the first GPU in max_memory), not GPU 1."""
    return [0, int(1.2 * size)], 2 * size


MACHINES["2gpu-gpu0-busy"] = _gpu0_busy

# What transformers' own "auto" map must use on each machine (harness self-check, below): the kinds of
# device it must use and those it may use. On tight machines the host may be too small for even one
# layer next to the room kept for offloaded layers, so "cpu" is optional there.
_FITS, _ROOMY, _TIGHT = ({"gpu"}, {"gpu"}), ({"gpu", "cpu"}, {"gpu", "cpu"}), ({"gpu", "disk"}, {"gpu", "cpu", "disk"})
MACHINE_CHARACTER = {
    "0gpu-roomy": ({"cpu"}, {"cpu"}),
    "0gpu-tight": ({"disk"}, {"cpu", "disk"}),
    "1gpu-fits": _FITS,
    "1gpu-half-roomy": _ROOMY,
    "1gpu-small-tight": _TIGHT,
    "2gpu-gpu0-busy": _FITS,
    **{f"{n}gpu-{k}-{what}": character for n in (2, 4, 8) for k in ("equal", "unequal")
       for what, character in [("fits", _FITS), ("roomy", _ROOMY), ("tight", _TIGHT)]},
}
assert set(MACHINE_CHARACTER) == set(MACHINES)


def _dtype(config: str) -> str:
    return H.CONFIGS[config]["torch_dtype"]


def machine_for(model, machine: str):
    return MACHINES[machine](H.model_size(model), H.largest_layer(model))


CASES = [
    pytest.param(config, machine, strategy, id=f"{config}-{machine}-{strategy}")
    for config, machine, strategy in itertools.product(H.CONFIGS, MACHINES, H.STRATEGIES)
]


@pytest.mark.parametrize("config,machine,strategy", CASES)
def test_default_budgets_match_transformers(strata_plan, checkpoint_dir, config, machine, strategy):
    model = H.meta_model(config, _dtype(config))
    gpus, host = machine_for(model, machine)
    expected, expected_budgets = H.reference_default_placement(model, strategy, gpus, host)
    out = H.strata_plan_json(strata_plan, "--model", checkpoint_dir(config), "--device-map", strategy,
                             "--inventory", H.inventory_arg(gpus, host))
    actual = out["device_map"]
    where = f"{config} {machine} {strategy}: --inventory {H.inventory_arg(gpus, host)}"
    assert actual == expected, (
        f"{where}\nstrata differs from transformers:\n{H.map_diff(expected, actual)}\n"
        f"transformers: {expected}\nstrata:       {actual}")
    budgets = {d["device"]: d["budget_bytes"] for d in out["devices"] if d["device"] != "disk"}
    assert budgets == {str(k): v for k, v in expected_budgets.items()}, (
        f"{where}\nbudgets {budgets} != transformers' max_memory {expected_budgets}")
    assert out["inventory"] == {
        "gpus": [{"device": str(i), "free_bytes": b, "total_bytes": b, "integrated": False,
                  "compute_capability": None}
                 for i, b in enumerate(gpus)],
        "cpu_available_bytes": host,
    }, out["inventory"]


@pytest.mark.parametrize("config", list(H.CONFIGS))
def test_machines_have_their_intended_character(config):
    """The harness: on every machine, transformers' own "auto" map uses the intended kinds of device,
    and the multi-GPU machines spread the model over several GPUs. (Runs without the binary.)"""
    model = H.meta_model(config, _dtype(config))
    for machine, kinds in MACHINE_CHARACTER.items():
        dm, _ = H.reference_default_placement(model, "auto", *machine_for(model, machine))
        got = {"gpu" if isinstance(v, int) else v for v in dm.values()}
        required, allowed = kinds
        assert required <= got <= allowed, f"{machine}: transformers' auto map uses {got}, intended {kinds}: {dm}"
        n_gpus = len(machine_for(model, machine)[0])
        if n_gpus >= 2 and not machine.endswith(("busy", "tight")):
            used = {v for v in dm.values() if isinstance(v, int)}
            assert len(used) >= 2, f"{machine}: only GPUs {used} used: {dm}"


def test_bad_inventory_exits_2_naming_the_entry(strata_plan, checkpoint_dir):
    for spec, mentions in [("0=1GiB,2=1GiB,cpu=4GiB", '"2"'), ("0=1XB,cpu=4GiB", "1XB"), ("0=1GiB", "cpu"),
                           ("0=1GiB,cpu=4GiB,disk=1TB", "disk"), ("gpu0=1GiB,cpu=1GiB", "gpu0")]:
        proc = H.run_strata_plan(strata_plan, "--model", checkpoint_dir("SmolLM-135M"), "--inventory", spec,
                                 "--json", expect_rc=2)
        assert mentions in proc.stderr, f"{spec}: stderr does not name {mentions!r}: {proc.stderr}"


def test_max_memory_overrides_the_inventory(strata_plan, checkpoint_dir):
    out = H.strata_plan_json(strata_plan, "--model", checkpoint_dir("SmolLM-135M"), "--device-map", "sequential",
                             "--inventory", "0=1GiB,cpu=4GiB", "--max-memory", "0=123456789,cpu=987654321")
    budgets = {d["device"]: d["budget_bytes"] for d in out["devices"] if d["device"] != "disk"}
    assert budgets == {"0": 123456789, "cpu": 987654321}, budgets
    assert "inventory" not in out


def test_gpus_without_a_layer_warn_on_stderr(strata_plan, checkpoint_dir):
    """Budgets that leave every decoder layer off the GPUs give a plan and a warning naming the GPUs."""
    proc = H.run_strata_plan(strata_plan, "--model", checkpoint_dir("SmolLM-135M"), "--device-map", "auto",
                             "--inventory", "0=10MB,1=10MB,cpu=4GiB", "--json")
    out = H.json.loads(proc.stdout)
    assert out["warnings"] and "GPU 0" in out["warnings"][0] and "GPU 1" in out["warnings"][0], out["warnings"]
    assert "warning: no decoder layer is on a GPU" in proc.stderr, proc.stderr


# Groups of nodes (issue 24): one --inventory per node, each numbering its own GPUs from 0. The plan is transformers'
# on one machine holding every node's GPUs, node-major (16 GPUs for two nodes of 8), with the leader's host as cpu.
GROUPS = {
    "2x4-equal": (4, _machine(8, True, 1.3, ROOMY_HOST)),
    "2x8-unequal": (8, _machine(16, False, 2.2, TIGHT_HOST)),
}
GROUP_CASES = [
    pytest.param(config, group, strategy, id=f"{config}-{group}-{strategy}")
    for config, group, strategy in itertools.product(["Llama-3.1-70B", "Qwen2-1.5B"], GROUPS, H.STRATEGIES)
]


@pytest.mark.parametrize("config,group,strategy", GROUP_CASES)
def test_a_group_of_nodes_plans_as_transformers_on_their_union(strata_plan, checkpoint_dir, config, group, strategy):
    model = H.meta_model(config, _dtype(config))
    per_node, make = GROUPS[group]
    gpus, host = make(H.model_size(model), H.largest_layer(model))
    expected, expected_budgets = H.reference_default_placement(model, strategy, gpus, host)
    nodes = [gpus[n * per_node:(n + 1) * per_node] for n in range(len(gpus) // per_node)]
    # Every node has a host; only the leader's holds weights, so the others' may be anything.
    args = []
    for n, node in enumerate(nodes):
        args += ["--inventory", H.inventory_arg(node, host if n == 0 else 7 * host + 12345)]
    out = H.strata_plan_json(strata_plan, "--model", checkpoint_dir(config), "--device-map", strategy, *args)
    assert out["device_map"] == expected, f"{config} {group} {strategy}:\n{H.map_diff(expected, out['device_map'])}"
    budgets = {d["device"]: d["budget_bytes"] for d in out["devices"] if d["device"] != "disk"}
    assert budgets == {str(k): v for k, v in expected_budgets.items()}
    # Every device and stage names its node: GPU i on node i // per_node, cpu and disk on the leader's.
    for d in out["devices"]:
        assert d["node"] == (int(d["device"]) // per_node if d["device"].isdigit() else 0), d
    for s in out["stages"]:
        assert s["node"] == (int(s["device"]) // per_node if s["device"].isdigit() else 0), s
    assert [g["node"] for g in out["inventory"]["gpus"]] == [i // per_node for i in range(len(gpus))]
    assert out["inventory"]["cpu_available_bytes"] == host


def test_a_bad_node_inventory_exits_2_naming_the_node(strata_plan, checkpoint_dir):
    proc = H.run_strata_plan(strata_plan, "--model", checkpoint_dir("SmolLM-135M"), "--inventory", "0=1GiB,cpu=4GiB",
                             "--inventory", "0=1GiB,2=1GiB,cpu=4GiB", "--json", expect_rc=2)
    assert "--inventory (node 1)" in proc.stderr and '"2"' in proc.stderr, proc.stderr
