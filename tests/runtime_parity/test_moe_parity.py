"""Qwen3, Qwen3-MoE and Mixtral beyond test_generate_parity.py (which runs them on 1-, 2- and 4-stage
plans and with cpu/disk offload): a 3-stage plan, experts placed apart from their layer (a manual map,
and strata-plan --experts-on), bfloat16, and configs the runtime refuses. The oracle is transformers'
generate(do_sample=False) on the same tiny random checkpoint (runtime_helpers)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

import runtime_helpers as H
from test_generate_parity import LOGPROB_TOLERANCE, NEW_TOKENS, PROMPTS, assert_matches

FAMILIES = ["qwen3_sliding", "qwen3_moe_mixed", "qwen3_moe_step_tied", "mixtral_sliding"]
MOE = ["qwen3_moe_mixed", "qwen3_moe_step_tied", "mixtral_sliding"]


@pytest.fixture(scope="module")
def references(checkpoint):
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = H.reference_generate(checkpoint(name), PROMPTS, NEW_TOKENS)
        return cache[name]

    return get


def sparse_layers(name: str) -> list[int]:
    """The layers transformers builds a sparse MoE block for (from the checkpoint's own model)."""
    import transformers

    config_class, kwargs = H.CONFIGS[name]
    config = getattr(transformers, config_class)(**kwargs)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return [i for i, layer in enumerate(model.model.layers) if hasattr(layer.mlp, "experts")]


def experts_apart_map(name: str, layer_devices: list, experts_device, head) -> str:
    """layer_device_map, with each sparse layer split so that its experts sit on `experts_device`."""
    entries = json.loads(H.layer_device_map(name, layer_devices, head))
    sparse = set(sparse_layers(name))
    out = {}
    for key, device in entries.items():
        parts = key.split(".")
        if len(parts) == 3 and parts[1] == "layers" and int(parts[2]) in sparse:
            for child in ["self_attn", "mlp.gate", "input_layernorm", "post_attention_layernorm"]:
                out[f"{key}.{child}"] = device
            out[f"{key}.mlp.experts"] = experts_device
        else:
            out[key] = device
    return json.dumps(out)


def test_tiny_models_reach_the_cases_they_exist_for():
    """Harness check: more experts than top_k, dense layers among sparse ones, norm_topk_prob both ways,
    windows shorter than the sequences."""
    assert sparse_layers("qwen3_moe_mixed") == [0, 1, 3]       # mlp_only_layers=[2]
    assert sparse_layers("qwen3_moe_step_tied") == [1, 3]      # decoder_sparse_step=2
    assert sparse_layers("mixtral_sliding") == [0, 1, 2, 3]
    for name in MOE:
        kw = H.CONFIGS[name][1]
        assert kw.get("num_experts", kw.get("num_local_experts")) > kw["num_experts_per_tok"]
    assert H.CONFIGS["qwen3_moe_mixed"][1]["attention_bias"]  # q, k, v and o biases
    assert {H.CONFIGS[n][1].get("norm_topk_prob") for n in ["qwen3_moe_mixed", "qwen3_moe_step_tied"]} == {True, False}
    longest = max(len(p) for p in PROMPTS) + NEW_TOKENS
    for name in ["qwen3_sliding", "qwen3_moe_mixed", "mixtral_sliding"]:
        assert H.CONFIGS[name][1]["sliding_window"] < longest


@pytest.mark.parametrize("name", FAMILIES)
def test_three_stage_plan(strata_generate, checkpoint, references, name):
    got = H.run_generate(checkpoint(name), PROMPTS, NEW_TOKENS, "--device-map",
                         H.layer_device_map(name, [0, 1, 1, 2], 2), "--physical-devices", "0=cpu,1=cpu,2=cpu",
                         "--max-memory", "0=1GiB,1=1GiB,2=1GiB,cpu=1GiB")
    assert_matches(references(name), got)
    stages = [s for s in got["load"]["stages"].splitlines() if s.startswith("stage")]
    tied = H.CONFIGS[name][1].get("tie_word_embeddings")
    assert len(stages) == 3 + (1 if tied else 0), got["load"]["stages"]


@pytest.mark.parametrize("name", MOE)
def test_experts_on_disk_stay_in_the_file(strata_generate, checkpoint, references, name):
    """Each sparse layer's experts placed on "disk": the same ids and logprobs, and every expert projection is a
    view of the file (the load's disk tensors), none fused into memory."""
    mapping = experts_apart_map(name, [0, 0, 0, 0], "disk", 0)
    got = H.run_generate(checkpoint(name), PROMPTS, NEW_TOKENS, "--device-map", mapping, "--physical-devices", "0=cpu",
                         "--max-memory", "0=1GiB,cpu=1GiB,disk=1GiB")
    assert_matches(references(name), got)
    kwargs = H.CONFIGS[name][1]
    experts = kwargs.get("num_experts", kwargs.get("num_local_experts"))
    assert got["load"]["disk_tensors"] == 3 * experts * len(sparse_layers(name)), got["load"]


def _peak_rss_generate(model, *args) -> int:
    """strata-generate's peak RSS in bytes (VmHWM, /usr/bin/time -f %M), 4 prompt tokens, 2 new."""
    import subprocess

    cmd = ["/usr/bin/time", "-f", "%M", str(H.generate_path()), "--model", str(model), "--prompt-ids", "1,2,3,4",
           "--max-new-tokens", "2", "--json", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return int(proc.stderr.strip().splitlines()[-1]) * 1024


def test_disk_experts_cost_no_memory(strata_generate, tmp_path):
    """A Qwen3-MoE whose experts are 400 MB of its file (2 sparse layers of 64 experts): with the experts on "disk"
    strata-generate's peak RSS stays below the same model's with them on "cpu" by most of their size. What remains
    of them is the pages of the experts the 6 tokens were routed to (2 of 64 each), read from the page cache."""
    import transformers

    config = transformers.Qwen3MoeConfig(**dict(H._COMMON, hidden_size=256, num_hidden_layers=2, head_dim=64,
                                                 moe_intermediate_size=1024, num_experts=64, num_experts_per_tok=2))
    model = H.save_random_model(tmp_path / "moe", config)
    experts_bytes = 2 * 64 * 3 * 256 * 1024 * 4
    memory = ["--physical-devices", "0=cpu", "--max-memory", "0=4GiB,cpu=4GiB,disk=4GiB"]

    def placed(where):
        entries = {"model.embed_tokens": 0, "model.norm": 0, "model.rotary_emb": 0, "lm_head": 0}
        for i in range(2):
            for child in ["self_attn", "mlp.gate", "input_layernorm", "post_attention_layernorm"]:
                entries[f"model.layers.{i}.{child}"] = 0
            entries[f"model.layers.{i}.mlp.experts"] = where
        return json.dumps(entries)

    on_cpu = _peak_rss_generate(model, "--device-map", placed("cpu"), *memory)
    on_disk = _peak_rss_generate(model, "--device-map", placed("disk"), *memory)
    print(f"experts {experts_bytes / 2**20:.0f} MiB: peak RSS {on_cpu / 2**20:.0f} MiB on cpu, {on_disk / 2**20:.0f} MiB on disk")
    assert on_cpu - on_disk > 0.6 * experts_bytes, (on_cpu / 2**20, on_disk / 2**20, experts_bytes / 2**20)


@pytest.mark.parametrize("experts", ["cpu", 1], ids=["experts-on-cpu", "experts-on-gpu1"])
@pytest.mark.parametrize("name", MOE)
def test_experts_apart_from_their_layer(strata_generate, checkpoint, references, name, experts):
    """Attention on logical GPU 0 (layers 0-1) and 2 (layers 2-3), each sparse layer's experts on `experts`:
    the same ids and logprobs, and the load description says where the experts run."""
    mapping = experts_apart_map(name, [0, 0, 2, 2], experts, 2)
    got = H.run_generate(checkpoint(name), PROMPTS, NEW_TOKENS, "--device-map", mapping,
                         "--physical-devices", "0=cpu,1=cpu,2=cpu", "--max-memory", "0=1GiB,1=1GiB,2=1GiB,cpu=1GiB")
    assert_matches(references(name), got)
    apart = [s for s in got["load"]["stages"].splitlines() if s.startswith("experts of")]
    assert [s.split()[2] for s in apart] == [f"model.layers.{i}" for i in sparse_layers(name)], got["load"]["stages"]
    assert all(f"plan device {experts} " in s for s in apart), apart


@pytest.mark.parametrize("name", ["qwen3_moe_mixed", "mixtral_sliding"])
def test_experts_on_cpu_plan_runs_at_parity(strata_generate, checkpoint, references, name):
    """strata-plan --experts-on cpu over two logical GPUs too small for the model: the experts of the last
    layers go to cpu, the layers stay on the GPUs, and the plan runs with the same results."""
    import subprocess

    budgets = "0=320KB,1=320KB,cpu=1GiB"
    plan_bin = H.build_dir() / "planner" / "strata-plan"
    base = ["--model", str(checkpoint(name)), "--device-map", "sequential", "--max-memory", budgets, "--json"]
    plain = json.loads(subprocess.run([str(plan_bin), *base], capture_output=True, text=True, check=True).stdout)
    assert any(v == "cpu" for k, v in plain["device_map"].items() if k.startswith("model.layers")), plain
    proc = subprocess.run([str(plan_bin), *base, "--experts-on", "cpu"], capture_output=True, text=True, check=True)
    apart = json.loads(proc.stdout)["device_map"]
    moved = [k for k, v in apart.items() if k.endswith(".mlp.experts") and v == "cpu"]
    assert moved, apart
    assert f"experts of {len(moved)} layers on cpu" in proc.stderr
    assert not any(v == "cpu" for k, v in apart.items() if k.startswith("model.layers") and ".mlp.experts" not in k)
    got = H.run_generate(checkpoint(name), PROMPTS, NEW_TOKENS, "--device-map", json.dumps(apart),
                         "--physical-devices", "0=cpu,1=cpu", "--max-memory", budgets)
    assert_matches(references(name), got)


@pytest.mark.parametrize("name", FAMILIES)
def test_bfloat16_agrees_where_the_margin_exceeds_bf16_noise(strata_generate, checkpoint, name):
    ckpt = checkpoint(name, torch.bfloat16)
    reference = H.reference_generate(ckpt, PROMPTS, NEW_TOKENS, dtype=torch.bfloat16)
    got = H.run_generate(ckpt, PROMPTS, NEW_TOKENS, "--device-map", '{"": "cpu"}', "--dtype", "bfloat16")
    assert got["load"]["dtype"] == "bfloat16"
    compared = H.compare_bfloat16_by_margin(reference, got["results"], NEW_TOKENS)
    print(f"bfloat16 {name}: {compared} of {NEW_TOKENS * len(PROMPTS)} steps above the noise margin, all identical")


BAD = [
    ("qwen3_moe_mixed", {"num_local_experts": 0}, "config.json: num_local_experts"),
    ("qwen3_moe_mixed", {"num_experts_per_tok": 7}, "config.json: num_experts_per_tok"),
    ("qwen3_moe_mixed", {"moe_intermediate_size": -32}, "config.json: moe_intermediate_size"),
    ("qwen3_moe_mixed", {"decoder_sparse_step": 0}, "config.json: decoder_sparse_step"),
    ("qwen3_moe_mixed", {"rope_parameters": {"rope_type": "spiral", "rope_theta": 10000.0}}, "rope_type"),
    ("mixtral_sliding", {"num_local_experts": -1}, "config.json: num_local_experts"),
    ("mixtral_sliding", {"num_experts_per_tok": 5}, "config.json: num_experts_per_tok"),
    ("mixtral_sliding", {"sliding_window": -3}, "config.json: sliding_window"),
    ("qwen3_sliding", {"layer_types": ["full_attention"]}, "config.json: layer_types"),
    ("mixtral_sliding", {"hidden_act": "gelu"}, "config.json: hidden_act"),
]


@pytest.mark.parametrize("name,change,message", BAD, ids=[f"{n}-{m.split()[-1]}-{i}" for i, (n, _, m) in enumerate(BAD)])
def test_bad_config_exits_2_naming_the_field(strata_generate, checkpoint, tmp_path, name, change, message):
    target = tmp_path / "ckpt"
    shutil.copytree(checkpoint(name), target)
    config = json.loads((target / "config.json").read_text())
    config.update(change)
    (target / "config.json").write_text(json.dumps(config))
    proc = H.run_generate(target, [[1, 2, 3]], 2, "--device-map", '{"": "cpu"}', check=False)
    assert proc.returncode == 2, f"exit {proc.returncode}: {proc.stderr}"
    assert message in proc.stderr, proc.stderr
