"""DeepSeek-V3 (MLA + DeepSeekMoE) beyond test_generate_parity.py (which runs the two CONFIGS rows on 1-, 2- and
4-stage plans and with cpu/disk offload): the cases the architecture exists for (group-limited routing decided by
the correction biases, YaRN's two mscales), a 3-stage plan, experts apart from their layer, the latent KV cache's
size, an MTP layer in the checkpoint, bfloat16, Kimi K2's model type, and checkpoints the runtime refuses. The
oracle is transformers' generate(do_sample=False) on the same tiny random checkpoint (runtime_helpers)."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import torch

import runtime_helpers as H
from test_generate_parity import NEW_TOKENS, PROMPTS, assert_matches
from test_moe_parity import experts_apart_map, sparse_layers

FAMILIES = ["deepseek_v3_yarn", "deepseek_v3_plain"]


@pytest.fixture(scope="module")
def references(checkpoint):
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = H.reference_generate(checkpoint(name), PROMPTS, NEW_TOKENS)
        return cache[name]

    return get


def test_tiny_models_reach_the_cases_they_exist_for(checkpoint):
    """Harness check: dense layers before sparse ones, the correction biases change which groups the router keeps
    (so group selection and the biases matter), YaRN's attention factor is not 1 and its softmax scale differs from
    qk_head_dim^-1/2."""
    import transformers

    assert sparse_layers("deepseek_v3_yarn") == [1, 2, 3]
    assert sparse_layers("deepseek_v3_plain") == [2, 3]
    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint("deepseek_v3_yarn"), dtype=torch.float32)
    router = model.model.layers[1].mlp.gate
    assert router.e_score_correction_bias.abs().max() > 0.1
    torch.manual_seed(0)
    x = torch.randn(64, model.config.hidden_size) * 4
    _, _, with_bias = router(x)
    saved = router.e_score_correction_bias.clone()
    with torch.no_grad():
        router.e_score_correction_bias.zero_()
        _, _, without = router(x)
        router.e_score_correction_bias.copy_(saved)
    assert not torch.equal(with_bias.sort(-1).values, without.sort(-1).values)
    attention = model.model.layers[0].self_attn
    assert model.model.rotary_emb.attention_scaling != 1.0
    assert abs(attention.scaling - attention.qk_head_dim ** -0.5) > 1e-3


@pytest.mark.parametrize("name", FAMILIES)
def test_three_stage_plan(strata_generate, checkpoint, references, name):
    got = H.run_generate(checkpoint(name), PROMPTS, NEW_TOKENS, "--device-map",
                         H.layer_device_map(name, [0, 1, 1, 2], 2), "--physical-devices", "0=cpu,1=cpu,2=cpu",
                         "--max-memory", "0=1GiB,1=1GiB,2=1GiB,cpu=1GiB")
    assert_matches(references(name), got)


@pytest.mark.parametrize("form", ["absorbed", "expanded"])
@pytest.mark.parametrize("name", FAMILIES)
def test_both_attention_forms_match_transformers(strata_generate, checkpoint, references, name, form, monkeypatch):
    """Every group absorbed (prefill chunks too) and every group expanded (decode too): both at float32 parity. The
    default picks per group (test_generate_parity.py runs it)."""
    monkeypatch.setenv("STRATA_MLA_ATTENTION", form)
    got = H.run_generate(checkpoint(name), PROMPTS, NEW_TOKENS, "--device-map", '{"": "cpu"}', "--prefill-chunk", "3")
    assert_matches(references(name), got)


@pytest.mark.parametrize("experts", ["cpu", 1, "disk"], ids=["experts-on-cpu", "experts-on-gpu1", "experts-on-disk"])
def test_experts_apart_from_their_layer(strata_generate, checkpoint, references, experts):
    name = "deepseek_v3_yarn"
    mapping = json.loads(experts_apart_map(name, [0, 0, 2, 2], experts, 2))
    # DeepSeekMoE's block also holds the shared experts: they stay with the layer.
    for i in sparse_layers(name):
        mapping[f"model.layers.{i}.mlp.shared_experts"] = mapping[f"model.layers.{i}.mlp.gate"]
    got = H.run_generate(checkpoint(name), PROMPTS, NEW_TOKENS, "--device-map", json.dumps(mapping),
                         "--physical-devices", "0=cpu,1=cpu,2=cpu",
                         "--max-memory", "0=1GiB,1=1GiB,2=1GiB,cpu=1GiB,disk=1GiB")
    assert_matches(references(name), got)


def test_latent_kv_cache_is_sized_by_the_latent_row(checkpoint):
    """strata-plan's KV reserve counts kv_lora_rank + qk_rope_head_dim values per token and layer (keys and
    values alike), not 2 x heads x head_dim."""
    name = "deepseek_v3_yarn"
    kw = H.CONFIGS[name][1]
    plan_bin = H.build_dir() / "planner" / "strata-plan"
    proc = subprocess.run([str(plan_bin), "--model", str(checkpoint(name)), "--device-map", '{"": 0}',
                           "--max-memory", "0=1GiB,cpu=1GiB", "--kv-cache-tokens", "1000", "--json"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    per_token = (kw["kv_lora_rank"] + kw["qk_rope_head_dim"]) * kw["num_hidden_layers"] * 4  # float32
    kv = [d.get("kv_cache_bytes", 0) for d in plan["devices"]]
    assert max(kv) == 1000 * per_token, plan["devices"]


def test_an_mtp_layer_in_the_checkpoint_is_ignored_and_named(strata_generate, checkpoint, references, tmp_path):
    """A checkpoint carrying DeepSeek's multi-token-prediction layer (model.layers.<num_hidden_layers>.*, in its
    own shard) plans and runs as the model without it, and the load names what it left out."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    name = "deepseek_v3_yarn"
    target = tmp_path / "with_mtp"
    shutil.copytree(checkpoint(name), target)
    n = H.CONFIGS[name][1]["num_hidden_layers"]
    hidden = H.CONFIGS[name][1]["hidden_size"]
    mtp = {f"model.layers.{n}.eh_proj.weight": torch.randn(hidden, 2 * hidden),
           f"model.layers.{n}.enorm.weight": torch.ones(hidden),
           f"model.layers.{n}.hnorm.weight": torch.ones(hidden),
           f"model.layers.{n}.shared_head.norm.weight": torch.ones(hidden)}
    save_file(mtp, str(target / "model-mtp.safetensors"), metadata={"format": "pt"})
    with safe_open(str(target / "model.safetensors"), "pt") as f:
        weight_map = {k: "model.safetensors" for k in f.keys()}
    weight_map.update({k: "model-mtp.safetensors" for k in mtp})
    (target / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    got = H.run_generate(target, PROMPTS, NEW_TOKENS, "--device-map", '{"": "cpu"}')
    assert_matches(references(name), got)
    assert got["load"]["ignored_tensors"] == len(mtp), got["load"]


def _agreement(reference: list[dict], results: list[dict]) -> tuple[int, float]:
    """Steps of identical ids from the start of each prompt, and the mean |logprob difference| over them."""
    steps, diffs = 0, []
    for ref, res in zip(reference, results):
        for step in range(NEW_TOKENS):
            if res["ids"][step] != ref["ids"][step]:
                break
            steps += 1
            diffs.append(abs(res["logprobs"][step] - ref["logprobs"][step]))
    return steps, sum(diffs) / max(1, len(diffs))


@pytest.mark.parametrize("name", FAMILIES)
def test_bfloat16_agrees_where_the_margin_exceeds_bf16_noise(strata_generate, checkpoint, name, monkeypatch):
    """Expanded decode (transformers' arithmetic) under the project's margin rule against transformers' bfloat16;
    the absorbed decode strata serves rounds elsewhere (its latent products in float32), so it is held to the
    float32 model instead: at least as close to it as transformers' own bfloat16 run (steps of identical ids, mean
    logprob distance)."""
    ckpt = checkpoint(name, torch.bfloat16)
    reference = H.reference_generate(ckpt, PROMPTS, NEW_TOKENS, dtype=torch.bfloat16)
    monkeypatch.setenv("STRATA_MLA_ATTENTION", "expanded")
    got = H.run_generate(ckpt, PROMPTS, NEW_TOKENS, "--device-map", '{"": "cpu"}', "--dtype", "bfloat16")
    assert got["load"]["dtype"] == "bfloat16"
    compared = H.compare_bfloat16_by_margin(reference, got["results"], NEW_TOKENS)
    monkeypatch.delenv("STRATA_MLA_ATTENTION")
    absorbed = H.run_generate(ckpt, PROMPTS, NEW_TOKENS, "--device-map", '{"": "cpu"}', "--dtype", "bfloat16")
    truth = H.reference_generate(ckpt, PROMPTS, NEW_TOKENS, dtype=torch.float32)
    ours_steps, ours_distance = _agreement(truth, absorbed["results"])
    theirs_steps, theirs_distance = _agreement(truth, reference)
    print(f"bfloat16 {name}: expanded {compared} margin steps identical; absorbed vs float32 {ours_steps} steps, "
          f"mean |dlogprob| {ours_distance:.4f} (transformers bf16: {theirs_steps}, {theirs_distance:.4f})")
    assert ours_steps >= 0.9 * theirs_steps
    assert ours_distance <= 1.25 * theirs_distance + 1e-3


def test_kimi_k2_model_type_runs_as_deepseek_v3(strata_generate, checkpoint, references, tmp_path):
    """Kimi K2's checkpoints name DeepseekV3ForCausalLM with model_type kimi_k2: the same model."""
    name = "deepseek_v3_yarn"
    target = tmp_path / "kimi"
    shutil.copytree(checkpoint(name), target)
    config = json.loads((target / "config.json").read_text())
    config["model_type"] = "kimi_k2"
    (target / "config.json").write_text(json.dumps(config))
    got = H.run_generate(target, PROMPTS, NEW_TOKENS, "--device-map", '{"": "cpu"}')
    assert_matches(references(name), got)


BAD = [
    ({"topk_group": 5}, "config.json: topk_group"),
    ({"n_group": 3}, "config.json: n_routed_experts"),
    ({"n_routed_experts": 6, "n_group": 4}, "config.json: n_routed_experts"),
    ({"num_experts_per_tok": 5}, "config.json: num_experts_per_tok"),
    ({"kv_lora_rank": 40}, "self_attn.kv_a"),  # the latent's width against kv_a_proj_with_mqa / kv_a_layernorm
    ({"q_lora_rank": -1}, "config.json: q_lora_rank"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": -4.0,
                          "original_max_position_embeddings": 64}}, "rope_parameters.factor"),
]


@pytest.mark.parametrize("change,message", BAD, ids=[f"{i}-{m.split()[-1]}" for i, (_, m) in enumerate(BAD)])
def test_bad_config_exits_2_naming_the_field(strata_generate, checkpoint, tmp_path, change, message):
    target = tmp_path / "ckpt"
    shutil.copytree(checkpoint("deepseek_v3_yarn"), target)
    config = json.loads((target / "config.json").read_text())
    config.update(change)
    (target / "config.json").write_text(json.dumps(config))
    proc = subprocess.run([str(strata_generate), "--model", str(target), "--prompt-ids", "1,2", "--max-new-tokens", "1"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr, proc.stderr


def test_a_missing_correction_bias_exits_2_naming_the_tensor(strata_generate, checkpoint, tmp_path):
    from safetensors.torch import load_file, save_file

    target = tmp_path / "ckpt"
    shutil.copytree(checkpoint("deepseek_v3_yarn"), target)
    tensors = load_file(str(target / "model.safetensors"))
    del tensors["model.layers.2.mlp.gate.e_score_correction_bias"]
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    proc = subprocess.run([str(strata_generate), "--model", str(target), "--prompt-ids", "1,2", "--max-new-tokens", "1"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "model.layers.2.mlp.gate.e_score_correction_bias" in proc.stderr, proc.stderr


@pytest.mark.parametrize("scales", ["float32", "bfloat16", "ue8m0"])
def test_fp8_block_weights_with_partial_blocks(strata_generate, tmp_path, scales):
    """DeepSeek's block FP8 (V3.1's ue8m0 scales too) on every linear layer MLA and the experts have, with partial last
    blocks (kv_a_proj_with_mqa's 96 rows of 128-row blocks, as V3's 576): transformers 5.23 refuses those on the CPU,
    so the oracle is the dense model the test dequantizes with the quantizer's own block math. kv_b_proj, which
    decode reads per head, is dequantized at load; the others run packed."""
    import quantized_checkpoints as Q
    from test_quantized_parity import LOGPROB_TOLERANCE, plan_args

    scale_dtype = torch.bfloat16 if scales == "bfloat16" else torch.float32
    checkpoint = Q.make_fp8_checkpoint(tmp_path / "fp8", "deepseek_v3", scale_dtype=scale_dtype,
                                       scale_fmt="ue8m0" if scales == "ue8m0" else None)
    dense = Q.fp8_dense_reference(checkpoint, "deepseek_v3", tmp_path / "dense")
    reference = H.reference_generate(dense, PROMPTS, NEW_TOKENS)
    for stages in (1, 2):
        got = H.run_generate(checkpoint, PROMPTS, NEW_TOKENS, *plan_args("deepseek_v3", stages))
        assert got["load"]["packed_tensors"] > 0, got["load"]
        Q.assert_same_greedy(reference, got["results"], LOGPROB_TOLERANCE, f"{stages} stages, ")


@pytest.mark.parametrize("experts_only", [True, False], ids=["experts-only", "every-linear"])
def test_int4_compressed_tensors_experts(strata_generate, tmp_path, experts_only):
    """Kimi K2-Thinking's format: W4A16 group 32 symmetric compressed-tensors, pack-quantized, on the routed experts
    alone (attention, shared experts and dense MLPs ignored, as its config lists them), and on every linear layer
    (kv_b_proj dequantized at load): the same ids as the dense model of the library's own decompression."""
    import quantized_checkpoints as Q
    from test_quantized_parity import LOGPROB_TOLERANCE, plan_args

    ignore = ["lm_head"]
    if experts_only:
        ignore += [r"re:.*self_attn.*", r"re:.*shared_experts.*", r"re:.*\.mlp\.(gate|up|down)_proj$",
                   r"re:.*mlp\.gate$"]
    config = Q.ct_config({"group_size": 32}, "pack-quantized", ignore=ignore)
    checkpoint = Q.make_ct_checkpoint(tmp_path / "w4a16", "deepseek_v3", config)
    reference = H.reference_generate(Q.ct_dense_reference(checkpoint), PROMPTS, NEW_TOKENS)
    for stages in (1, 2):
        got = H.run_generate(checkpoint, PROMPTS, NEW_TOKENS, *plan_args("deepseek_v3", stages))
        kw = Q.CONFIGS["deepseek_v3"][1]
        experts = 3 * kw["n_routed_experts"] * (kw["num_hidden_layers"] - kw["first_k_dense_replace"])
        if experts_only:
            assert got["load"]["packed_tensors"] == experts, got["load"]
        else:
            assert got["load"]["packed_tensors"] > experts, got["load"]
        Q.assert_same_greedy(reference, got["results"], LOGPROB_TOLERANCE, f"{stages} stages, ")
