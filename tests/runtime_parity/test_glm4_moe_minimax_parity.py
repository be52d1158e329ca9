"""GLM-4.5/4.6 (Glm4MoeForCausalLM) and MiniMax-M2 (MiniMaxM2ForCausalLM) beyond test_generate_parity.py (which runs
their CONFIGS rows on 1-, 2- and 4-stage plans and with cpu/disk offload): the cases the architectures exist for
(partial RoPE, q/k norms per head and across heads, routers whose choices the correction biases decide), a 3-stage
plan, experts apart from their layer, GLM's MTP layer in the checkpoint, bfloat16, block-FP8 checkpoints as both
families release them, and checkpoints the runtime refuses. The oracle is transformers' generate(do_sample=False) on
the same tiny random checkpoint (runtime_helpers)."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import torch

import runtime_helpers as H
from test_generate_parity import NEW_TOKENS, PROMPTS, assert_matches
from test_deepseek_parity import _agreement
from test_moe_parity import experts_apart_map, sparse_layers

FAMILIES = ["glm4_moe_qknorm", "glm4_moe_air", "minimax_m2_partial"]


@pytest.fixture(scope="module")
def references(checkpoint):
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = H.reference_generate(checkpoint(name), PROMPTS, NEW_TOKENS)
        return cache[name]

    return get


def _route(router, x, bias_owner):
    """The router's expert choices for x, with the correction biases as they are and zeroed."""
    _, _, with_bias = router(x) if bias_owner is router else router(x, bias_owner.e_score_correction_bias)
    saved = bias_owner.e_score_correction_bias.clone()
    with torch.no_grad():
        bias_owner.e_score_correction_bias.zero_()
        _, _, without = router(x) if bias_owner is router else router(x, bias_owner.e_score_correction_bias)
        bias_owner.e_score_correction_bias.copy_(saved)
    return with_bias.sort(-1).values, without.sort(-1).values


def test_tiny_models_reach_the_cases_they_exist_for(checkpoint):
    """Harness check: part of each head is left unrotated, GLM's first layers are dense, the correction biases change
    which experts the routers pick (GLM's through its groups, MiniMax's on the block), MiniMax's q/k norms span all
    heads."""
    import transformers

    torch.manual_seed(0)
    for name, rotated in [("glm4_moe_qknorm", 8), ("glm4_moe_air", 4), ("minimax_m2_partial", 8)]:
        model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint(name), dtype=torch.float32)
        assert model.model.rotary_emb.inv_freq.numel() * 2 == rotated, name
        layer = model.model.layers[-1]
        x = torch.randn(64, model.config.hidden_size) * 4
        if name.startswith("glm"):
            with_bias, without = _route(layer.mlp.gate, x, layer.mlp.gate)
            assert type(model.model.layers[0].mlp).__name__ == "Glm4MoeMLP"
        else:
            with_bias, without = _route(layer.mlp.gate, x, layer.mlp)
            heads = model.config.num_attention_heads * model.config.head_dim
            assert layer.self_attn.q_norm.weight.shape == (heads,)
        assert not torch.equal(with_bias, without), name
    glm = transformers.AutoModelForCausalLM.from_pretrained(checkpoint("glm4_moe_qknorm"), dtype=torch.float32)
    assert glm.model.layers[0].self_attn.q_proj.bias is not None and glm.model.layers[0].self_attn.o_proj.bias is None


@pytest.mark.parametrize("name", FAMILIES)
def test_three_stage_plan(strata_generate, checkpoint, references, name):
    got = H.run_generate(checkpoint(name), PROMPTS, NEW_TOKENS, "--device-map",
                         H.layer_device_map(name, [0, 1, 1, 2], 2), "--physical-devices", "0=cpu,1=cpu,2=cpu",
                         "--max-memory", "0=1GiB,1=1GiB,2=1GiB,cpu=1GiB", "--prefill-chunk", "3")
    assert_matches(references(name), got)


@pytest.mark.parametrize("experts", ["cpu", 1, "disk"], ids=["experts-on-cpu", "experts-on-gpu1", "experts-on-disk"])
@pytest.mark.parametrize("name", ["glm4_moe_qknorm", "minimax_m2_partial"])
def test_experts_apart_from_their_layer(strata_generate, checkpoint, references, name, experts):
    mapping = json.loads(experts_apart_map(name, [0, 0, 2, 2], experts, 2))
    # The rest of each block stays with its layer: GLM's shared experts, MiniMax's correction-bias buffer.
    for i in sparse_layers(name):
        rest = "mlp.shared_experts" if name.startswith("glm") else "mlp.e_score_correction_bias"
        mapping[f"model.layers.{i}.{rest}"] = mapping[f"model.layers.{i}.mlp.gate"]
    got = H.run_generate(checkpoint(name), PROMPTS, NEW_TOKENS, "--device-map", json.dumps(mapping),
                         "--physical-devices", "0=cpu,1=cpu,2=cpu",
                         "--max-memory", "0=1GiB,1=1GiB,2=1GiB,cpu=1GiB,disk=1GiB")
    assert_matches(references(name), got)


def test_glm_mtp_layer_in_the_checkpoint_is_ignored_and_named(strata_generate, checkpoint, references, tmp_path):
    """GLM checkpoints carry their multi-token-prediction layer as model.layers.<num_hidden_layers>.* (a whole decoder
    layer plus eh_proj, enorm, hnorm, shared_head): it plans and runs as the model without it, and the load names
    what it left out."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    name = "glm4_moe_qknorm"
    target = tmp_path / "with_mtp"
    shutil.copytree(checkpoint(name), target)
    kw = H.CONFIGS[name][1]
    n, hidden = kw["num_hidden_layers"], kw["hidden_size"]
    mtp = {f"model.layers.{n}.eh_proj.weight": torch.randn(hidden, 2 * hidden),
           f"model.layers.{n}.enorm.weight": torch.ones(hidden),
           f"model.layers.{n}.hnorm.weight": torch.ones(hidden),
           f"model.layers.{n}.shared_head.norm.weight": torch.ones(hidden),
           f"model.layers.{n}.self_attn.q_proj.weight": torch.randn(kw["num_attention_heads"] * 16, hidden),
           f"model.layers.{n}.mlp.experts.0.gate_proj.weight": torch.randn(kw["moe_intermediate_size"], hidden)}
    save_file(mtp, str(target / "model-mtp.safetensors"), metadata={"format": "pt"})
    with safe_open(str(target / "model.safetensors"), "pt") as f:
        weight_map = {k: "model.safetensors" for k in f.keys()}
    weight_map.update({k: "model-mtp.safetensors" for k in mtp})
    (target / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    got = H.run_generate(target, PROMPTS, NEW_TOKENS, "--device-map", '{"": "cpu"}')
    assert_matches(references(name), got)
    assert got["load"]["ignored_tensors"] == len(mtp), got["load"]


@pytest.mark.parametrize("name", ["glm4_moe_qknorm", "minimax_m2_partial"])
def test_bfloat16_agrees_where_the_margin_exceeds_bf16_noise(strata_generate, checkpoint, name):
    """A bfloat16 checkpoint served in bfloat16: ids identical to transformers' bfloat16 run up to the first step whose
    top-1/top-2 margin is within bf16 noise (the margin rule), and as close to the float32 model as transformers' own
    bfloat16 run is (steps of identical ids, mean logprob distance). A router choice between two experts whose biased
    scores tie within bf16 noise flips under any change of summation order, moving that step's logprobs by tenths on
    both sides: the distance to the float32 model is the measure that stays fair there (as for DeepSeek-V3)."""
    ckpt = checkpoint(name, torch.bfloat16)
    reference = H.reference_generate(ckpt, PROMPTS, NEW_TOKENS, dtype=torch.bfloat16)
    got = H.run_generate(ckpt, PROMPTS, NEW_TOKENS, "--device-map", '{"": "cpu"}', "--dtype", "bfloat16")
    assert got["load"]["dtype"] == "bfloat16"
    compared = 0
    for i, (ref, res) in enumerate(zip(reference, got["results"])):
        for step in range(NEW_TOKENS):
            if ref["margins"][step] < 2 ** -6 * max(1.0, abs(ref["top1"][step])):
                break
            assert res["ids"][step] == ref["ids"][step], f"prompt {i} step {step}: margin {ref['margins'][step]}"
            compared += 1
    assert compared >= len(PROMPTS), f"only {compared} steps were above the bf16 noise margin"
    truth = H.reference_generate(ckpt, PROMPTS, NEW_TOKENS, dtype=torch.float32)
    ours_steps, ours_distance = _agreement(truth, got["results"])
    theirs_steps, theirs_distance = _agreement(truth, reference)
    print(f"bfloat16 {name}: {compared} margin steps identical; vs float32 {ours_steps} steps, "
          f"mean |dlogprob| {ours_distance:.4f} (transformers bf16: {theirs_steps}, {theirs_distance:.4f})")
    assert ours_steps >= 0.9 * theirs_steps
    assert ours_distance <= 1.25 * theirs_distance + 1e-3


def _fp8_dense_twin(checkpoint, directory):
    """The FP8 checkpoint with every quantized weight replaced by transformers' own dequantization
    (_dequantize_fp8_weight, 128 x 128 blocks, partial last blocks included) under its stored name, and no
    quantization_config: transformers loads it as the dense model it stands for (renaming as it does any checkpoint)."""
    from safetensors.torch import load_file, save_file
    from transformers.integrations.finegrained_fp8 import _dequantize_fp8_weight

    stored = load_file(checkpoint / "model.safetensors")
    dense = {}
    for key, value in stored.items():
        if key.endswith(".weight_scale_inv"):
            continue
        scale = key.removesuffix(".weight") + ".weight_scale_inv"
        dense[key] = _dequantize_fp8_weight(value, stored[scale], [128, 128], torch.float32) if scale in stored else value
    directory.mkdir(parents=True)
    save_file(dense, str(directory / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((checkpoint / "config.json").read_text())
    del config["quantization_config"]
    (directory / "config.json").write_text(json.dumps(config))
    return directory


@pytest.mark.parametrize("name", ["glm4_moe_qknorm", "minimax_m2_partial"])
def test_block_fp8_checkpoints(strata_generate, tmp_path, name):
    """GLM-4.5-FP8 and MiniMax-M2 ship block FP8 (128 x 128, float32 scale_inv) on every linear layer and expert but
    the head: packed by strata, the same ids as the dense model of transformers' own dequantization."""
    import transformers

    import quantized_checkpoints as Q
    from test_quantized_parity import LOGPROB_TOLERANCE

    config_class, kwargs = H.CONFIGS[name]
    model = H.random_model(getattr(transformers, config_class)(**kwargs))
    checkpoint = Q.quantize_fp8(tmp_path / "fp8", model)
    reference = H.reference_generate(_fp8_dense_twin(checkpoint, tmp_path / "dense"), PROMPTS, NEW_TOKENS)
    for plan in (["--device-map", '{"": "cpu"}'],
                 ["--device-map", H.layer_device_map(name, [0, 0, 1, 1], 1), "--physical-devices", "0=cpu,1=cpu",
                  "--max-memory", "0=1GiB,1=1GiB,cpu=1GiB"]):
        got = H.run_generate(checkpoint, PROMPTS, NEW_TOKENS, *plan)
        kw = H.CONFIGS[name][1]
        experts = kw.get("n_routed_experts", kw.get("num_local_experts"))
        assert got["load"]["packed_tensors"] > 3 * experts, got["load"]
        Q.assert_same_greedy(reference, got["results"], LOGPROB_TOLERANCE, f"{plan[1][:20]}: ")


BAD = [
    ("glm4_moe_qknorm", {"n_group": 3}, "config.json: n_routed_experts"),
    ("glm4_moe_qknorm", {"topk_group": 3}, "config.json: topk_group"),
    ("glm4_moe_qknorm", {"num_experts_per_tok": 5}, "config.json: num_experts_per_tok"),
    ("glm4_moe_qknorm", {"use_qk_norm": 1}, "config.json: use_qk_norm"),
    ("glm4_moe_qknorm", {"partial_rotary_factor": 0.01, "rope_parameters": None}, "config.json: partial_rotary_factor"),
    ("glm4_moe_qknorm", {"head_dim": 8}, "self_attn.k_norm.weight has shape"),  # the projections' widths against the checkpoint
    ("minimax_m2_partial", {"rotary_dim": 64, "rope_parameters": None}, "config.json: rotary_dim"),
    ("minimax_m2_partial", {"num_experts_per_tok": 7}, "config.json: num_experts_per_tok"),
    ("minimax_m2_partial", {"head_dim": 8}, "self_attn.k_norm.weight has shape"),
]


@pytest.mark.parametrize("name,change,message", BAD, ids=[f"{i}-{n}" for i, (n, _, _) in enumerate(BAD)])
def test_bad_config_exits_2_naming_the_field(strata_generate, checkpoint, tmp_path, name, change, message):
    target = tmp_path / "ckpt"
    shutil.copytree(checkpoint(name), target)
    config = json.loads((target / "config.json").read_text())
    config.update(change)
    (target / "config.json").write_text(json.dumps(config))
    proc = subprocess.run([str(strata_generate), "--model", str(target), "--prompt-ids", "1,2", "--max-new-tokens", "1"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr, proc.stderr


@pytest.mark.parametrize("name,tensor", [("glm4_moe_qknorm", "model.layers.2.mlp.gate.e_score_correction_bias"),
                                         ("minimax_m2_partial", "model.layers.1.block_sparse_moe.e_score_correction_bias"),
                                         ("minimax_m2_partial", "model.layers.0.self_attn.k_norm.weight")])
def test_a_missing_tensor_exits_2_naming_it(strata_generate, checkpoint, tmp_path, name, tensor):
    from safetensors.torch import load_file, save_file

    target = tmp_path / "ckpt"
    shutil.copytree(checkpoint(name), target)
    tensors = load_file(str(target / "model.safetensors"))
    del tensors[tensor]
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    proc = subprocess.run([str(strata_generate), "--model", str(target), "--prompt-ids", "1,2", "--max-new-tokens", "1"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert tensor in proc.stderr, proc.stderr
