"""THE acceptance test of the planner: `strata-plan --device-map STRATEGY --max-memory ...` produces
exactly the device map transformers' `from_pretrained(device_map=STRATEGY, max_memory=...)` computes.

The reference is transformers' own placement code, run live: the model is built on the meta device as
from_pretrained builds it (`with torch.device("meta"): AutoModelForCausalLM.from_config(config,
dtype=dtype)`) and placed with `transformers.integrations.accelerate._get_device_map(model, strategy,
max_memory, None)`, the function from_pretrained calls. GPU memory queries are stubbed
(parity_helpers.stub_accelerators): torch.cuda.is_available() is False, so no reserved-but-unused
memory is added, and torch.cuda.device_count() reports the layout's GPU count so accelerate does not
warn about unknown GPUs. The GPU budgets are therefore exactly the max_memory given, as on a machine
whose GPUs are empty.

Cases: real configurations (hyperparameters from the public config.json files) x the four strategies x
max_memory layouts sized relative to each model (so "needs disk" needs disk for every model and dtype;
the harness checks that) x float16 / bfloat16 / float32.
"""

from __future__ import annotations

import itertools

import pytest

import parity_helpers as H

CASES = [
    pytest.param(config, dtype, layout, strategy, id=f"{config}-{dtype}-{layout}-{strategy}")
    for config, dtype, layout, strategy in itertools.product(H.CONFIGS, H.DTYPES, H.LAYOUTS, H.STRATEGIES)
]


def _plan(strata_plan, checkpoint_dir, config, dtype, strategy, max_memory):
    return H.strata_plan_json(
        strata_plan, "--model", checkpoint_dir(config), "--device-map", strategy,
        "--max-memory", H.max_memory_arg(max_memory), "--dtype", dtype)


@pytest.mark.parametrize("config,dtype,layout,strategy", CASES)
def test_device_map_matches_transformers(strata_plan, checkpoint_dir, config, dtype, layout, strategy):
    model = H.meta_model(config, dtype)
    max_memory = H.layout_for(model, layout)
    expected = H.reference_device_map(model, strategy, max_memory)
    out = _plan(strata_plan, checkpoint_dir, config, dtype, strategy, max_memory)
    assert "device_map" in out, f"strata-plan --json has no device_map: keys {list(out)}"
    actual = out["device_map"]
    # Content only: upstream's key order depends on Python's randomised set iteration in
    # accelerate's clean_device_map, so it is not reproducible; strata's order is checked separately
    # (test_device_map_key_order_is_definition_order).
    assert actual == expected, (
        f"{config} {dtype} {layout} {strategy}: max_memory={H.max_memory_arg(max_memory)}\n"
        f"strata differs from transformers:\n{H.map_diff(expected, actual)}\n"
        f"transformers: {expected}\nstrata:       {actual}")


# The harness itself: every layout has its intended character in transformers' own map, so the cases
# above really cover "fits", "uneven GPUs", "CPU offload", "disk offload", "CPU only", "GPU 0 full".
# (Runs without the binary.)
@pytest.mark.parametrize("config", list(H.CONFIGS))
@pytest.mark.parametrize("dtype", H.DTYPES)
def test_layouts_have_their_intended_character(config, dtype):
    model = H.meta_model(config, dtype)
    for layout, (kinds, unused_gpus) in H.LAYOUT_CHARACTER.items():
        dm = H.reference_device_map(model, "auto", H.layout_for(model, layout))
        got = {"gpu" if isinstance(v, int) else v for v in dm.values()}
        assert got == kinds, f"{layout}: transformers' auto map uses {got}, intended {kinds}: {dm}"
        assert not (unused_gpus & set(dm.values())), f"{layout}: GPUs {unused_gpus} should be unused: {dm}"
        if layout == "cpu_only":
            assert dm == {"": "cpu"}
        if layout == "uneven_4gpu":
            assert len({v for v in dm.values() if isinstance(v, int)}) >= 3, dm


KEY_ORDER_CASES = [
    pytest.param(c, d, l, s, id=f"{c}-{d}-{l}-{s}")
    for c, d in [("Llama-3-8B", "bfloat16"), ("Qwen2-0.5B", "bfloat16"), ("SmolLM-135M", "float32"),
                 ("Llama-3.1-70B", "float16")]
    for l in ["uneven_4gpu", "cpu_offload", "disk_offload"]
    for s in ["auto", "balanced_low_0", "sequential"]
]


@pytest.mark.parametrize("config,dtype,layout,strategy", KEY_ORDER_CASES)
def test_device_map_key_order_is_definition_order(strata_plan, checkpoint_dir, config, dtype, layout, strategy):
    """strata's JSON device_map lists modules in module definition order (direct parameters, then
    children, then buffers, recursively): stable, unlike upstream's set-ordered clean_device_map."""
    model = H.meta_model(config, dtype)
    max_memory = H.layout_for(model, layout)
    out = _plan(strata_plan, checkpoint_dir, config, dtype, strategy, max_memory)
    order = {n: i for i, n in enumerate(H.definition_order_names(model))}
    keys = list(out["device_map"])
    unknown = [k for k in keys if k not in order]
    assert not unknown, f"names that are not modules/parameters/buffers of the model: {unknown}"
    positions = [order[k] for k in keys]
    bad = [(keys[i], keys[i + 1]) for i in range(len(keys) - 1) if positions[i] >= positions[i + 1]]
    assert not bad, f"keys out of definition order (first pairs): {bad[:5]}\nkeys: {keys}"


STRUCTURE_CASES = [
    pytest.param(c, d, l, s, id=f"{c}-{d}-{l}-{s}")
    for c, d in [("Llama-3-8B", "bfloat16"), ("Qwen2-0.5B", "float32"), ("Mistral-7B-v0.1", "float16")]
    for l in H.LAYOUTS
    for s in H.STRATEGIES
]


@pytest.mark.parametrize("config,dtype,layout,strategy", STRUCTURE_CASES)
def test_json_devices_and_stages(strata_plan, checkpoint_dir, config, dtype, layout, strategy):
    """The rest of --json: per-device budgets (transformers' balanced max_memory) and planned bytes
    (sum of transformers' module sizes of the entries placed there), and stages (consecutive entries
    on one device)."""
    from transformers.integrations.accelerate import compute_module_sizes, get_balanced_memory, get_max_memory
    import copy

    model = H.meta_model(config, dtype)
    max_memory = H.layout_for(model, layout)
    out = _plan(strata_plan, checkpoint_dir, config, dtype, strategy, max_memory)
    dm = out["device_map"]

    with H.stub_accelerators(H.num_gpus(max_memory)):
        if strategy == "sequential":
            budgets = get_max_memory(copy.deepcopy(max_memory))
        else:
            budgets = get_balanced_memory(model, copy.deepcopy(max_memory), model._no_split_modules,
                                          low_zero=(strategy == "balanced_low_0"))
    sizes, _ = compute_module_sizes(model, only_modules=False)

    devices = out["devices"]
    names = [d["device"] for d in devices]
    given = [str(k) for k in max_memory]
    assert names[:len(given)] == given, f"devices {names} do not start with max_memory's {given}"
    assert names[len(given):] in ([], ["disk"]), f"unexpected extra devices {names[len(given):]}"
    planned = {d["device"]: d["planned_bytes"] for d in devices}
    for key, dev in zip(given, max_memory):
        if key == "disk":
            continue
        b = devices[names.index(key)]["budget_bytes"]
        assert int(b) == int(budgets[dev]), f"{key}: budget_bytes {b} != transformers' {budgets[dev]}"
    want_planned = {n: 0 for n in names}
    for name, dev in dm.items():
        want_planned[str(dev)] = want_planned.get(str(dev), 0) + sizes[name]
    assert planned == want_planned, f"planned_bytes {planned} != sum of module sizes {want_planned}"
    assert sum(planned.values()) == H.model_size(model)

    stages = out["stages"]
    assert [m for s in stages for m in s["modules"]] == list(dm), "stages do not cover the map in order"
    for s in stages:
        assert all(str(dm[m]) == str(s["device"]) for m in s["modules"]), s
    for a, b in zip(stages, stages[1:]):
        assert str(a["device"]) != str(b["device"]), "two consecutive stages on one device"


# Strings accelerate's convert_file_size_to_int accepts, quirks included: a lowercase "b" means bits
# ("8Gb" is 10**9 bytes), units are case-insensitive otherwise, fractions are truncated.
SIZE_STRINGS = ["10GiB", "10GB", "1.5GiB", "2.5GB", "500MB", "750MiB", "3KiB", "64kB", "8Gb", "100Mb",
                "1.5gib", "0.3333GB", "12.5mb"]


@pytest.mark.parametrize("text", SIZE_STRINGS)
def test_max_memory_strings_parse_like_accelerate(strata_plan, checkpoint_dir, text):
    """max_memory sizes mean what accelerate's convert_file_size_to_int says (sequential: the budget
    is the parsed value)."""
    from accelerate.utils import convert_file_size_to_int

    out = H.strata_plan_json(strata_plan, "--model", checkpoint_dir("SmolLM-135M"), "--dtype", "bfloat16",
                             "--device-map", "sequential", "--max-memory", f"0={text},cpu={text}")
    budgets = {d["device"]: d["budget_bytes"] for d in out["devices"]}
    want = convert_file_size_to_int(text)
    assert int(budgets["0"]) == want and int(budgets["cpu"]) == want, f"{text}: {budgets} != {want}"


def test_terabytes_and_plain_bytes(strata_plan, checkpoint_dir):
    """Beyond accelerate (which has no TB unit; plain integers are bytes there): the CLI's
    "disk=1TB" example means 10**12 bytes, and digits alone are bytes."""
    out = H.strata_plan_json(strata_plan, "--model", checkpoint_dir("SmolLM-135M"), "--dtype", "bfloat16",
                             "--device-map", "sequential", "--max-memory", "0=1TB,cpu=123456789")
    budgets = {d["device"]: d["budget_bytes"] for d in out["devices"]}
    assert int(budgets["0"]) == 10**12 and int(budgets["cpu"]) == 123456789, budgets


@pytest.mark.parametrize("args,mentions", [
    (["--device-map", "fastest"], "fastest"),
    (["--max-memory", "0=20XB,cpu=1GB"], "20XB"),
    (["--max-memory", "gpu0=1GB"], "gpu0"),
    (["--dtype", "float13"], "float13"),
], ids=["bad-strategy", "bad-size", "bad-device", "bad-dtype"])
def test_bad_input_exits_2_naming_it(strata_plan, checkpoint_dir, args, mentions):
    proc = H.run_strata_plan(strata_plan, "--model", checkpoint_dir("SmolLM-135M"), *args, "--json", expect_rc=2)
    assert mentions in proc.stderr, f"stderr does not name {mentions!r}: {proc.stderr}"


def test_missing_model_dir_exits_2(strata_plan, tmp_path):
    proc = H.run_strata_plan(strata_plan, "--model", tmp_path / "no-such-model", "--json", expect_rc=2)
    assert "no-such-model" in proc.stderr, proc.stderr
