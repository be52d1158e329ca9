"""gpt-oss (GptOssForCausalLM) beyond test_generate_parity.py (which runs its CONFIGS row on 1-, 2- and 4-stage plans
and with cpu/disk offload): the cases the architecture exists for (attention sinks, sliding and full layers, YaRN past
its original length, a biased router, the clamped SwiGLU reached), prefill chunks (the sink path of attention) against
decode rows (the kernel's), a 3-stage plan, experts apart from their layer, bfloat16, and checkpoints the runtime
refuses. The oracle is transformers' generate(do_sample=False) on the same tiny random checkpoint (runtime_helpers)."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import torch

import runtime_helpers as H
from test_deepseek_parity import _agreement
from test_generate_parity import NEW_TOKENS, PROMPTS, assert_matches
from test_moe_parity import experts_apart_map

NAME = "gpt_oss_sinks"


@pytest.fixture(scope="module")
def reference(checkpoint):
    return H.reference_generate(checkpoint(NAME), PROMPTS, NEW_TOKENS)


def test_tiny_model_reaches_the_cases_it_exists_for(checkpoint):
    """Harness check: sinks are non-zero and change the attention, layers alternate sliding (window 5) and full, the
    sequences pass the window and YaRN's 32 original positions, and the SwiGLU clamp cuts some gate values."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint(NAME), dtype=torch.float32)
    config = model.config
    assert config.layer_types[:2] == ["sliding_attention", "full_attention"]
    assert max(len(p) for p in PROMPTS) + NEW_TOKENS > max(config.sliding_window,
                                                           config.rope_parameters["original_max_position_embeddings"])
    sinks = model.model.layers[0].self_attn.sinks
    assert sinks.abs().min() > 0 and sinks.std() > 0.1
    clamped = []

    def gate_hook(module, args, out):
        hidden = args[0]
        gate_up = hidden @ module.gate_up_proj[0] + module.gate_up_proj_bias[0]
        clamped.append(bool((gate_up[..., ::2] > config.swiglu_limit).any()))

    hooks = [layer.mlp.experts.register_forward_hook(gate_hook) for layer in model.model.layers]
    with torch.no_grad():
        model(torch.tensor([PROMPTS[0]]))
    for h in hooks:
        h.remove()
    assert any(clamped), "no gate value reached swiglu_limit"


@pytest.mark.parametrize("chunk", ["1", "4", "64"])
def test_prefill_chunks_and_decode_rows_agree(strata_generate, checkpoint, reference, chunk):
    """Chunks of 4 and 64 tokens take attention's sink path (SDPA has no sinks), chunks of 1 the decode kernel's."""
    got = H.run_generate(checkpoint(NAME), PROMPTS, NEW_TOKENS, "--device-map", '{"": "cpu"}', "--prefill-chunk", chunk)
    assert_matches(reference, got)


def test_three_stage_plan(strata_generate, checkpoint, reference):
    got = H.run_generate(checkpoint(NAME), PROMPTS, NEW_TOKENS, "--device-map",
                         H.layer_device_map(NAME, [0, 1, 1, 2], 2), "--physical-devices", "0=cpu,1=cpu,2=cpu",
                         "--max-memory", "0=1GiB,1=1GiB,2=1GiB,cpu=1GiB", "--prefill-chunk", "3")
    assert_matches(reference, got)


@pytest.mark.parametrize("experts", ["cpu", 1], ids=["experts-on-cpu", "experts-on-gpu1"])
def test_experts_apart_from_their_layer(strata_generate, checkpoint, reference, experts):
    mapping = json.loads(experts_apart_map(NAME, [0, 0, 2, 2], experts, 2))
    for key in list(mapping):  # gpt-oss's block is router + experts
        if key.endswith(".mlp.gate"):
            mapping[key.removesuffix(".gate") + ".router"] = mapping.pop(key)
    got = H.run_generate(checkpoint(NAME), PROMPTS, NEW_TOKENS, "--device-map", json.dumps(mapping),
                         "--physical-devices", "0=cpu,1=cpu,2=cpu", "--max-memory", "0=1GiB,1=1GiB,2=1GiB,cpu=1GiB")
    assert_matches(reference, got)


def test_bfloat16_is_as_close_to_float32_as_transformers_bfloat16(strata_generate, checkpoint):
    """A bfloat16 checkpoint served in bfloat16, held to the float32 model: at least as close to it as transformers'
    own bfloat16 run (steps of identical ids, mean logprob distance). transformers runs gpt-oss's attention eagerly
    with its softmax in bfloat16 (strata's is float32), so the margin rule against its bfloat16 ids would compare
    against its own rounding noise (it flipped a step whose margin was 0.19)."""
    ckpt = checkpoint(NAME, torch.bfloat16)
    reference = H.reference_generate(ckpt, PROMPTS, NEW_TOKENS, dtype=torch.bfloat16)
    got = H.run_generate(ckpt, PROMPTS, NEW_TOKENS, "--device-map", '{"": "cpu"}', "--dtype", "bfloat16")
    assert got["load"]["dtype"] == "bfloat16"
    truth = H.reference_generate(ckpt, PROMPTS, NEW_TOKENS, dtype=torch.float32)
    ours_steps, ours_distance = _agreement(truth, got["results"])
    theirs_steps, theirs_distance = _agreement(truth, reference)
    print(f"bfloat16 gpt-oss vs float32: {ours_steps} steps, mean |dlogprob| {ours_distance:.4f} "
          f"(transformers bf16: {theirs_steps}, {theirs_distance:.4f})")
    # Router logits in bfloat16 tie exactly more often than in float32, and top-k breaks a tie by its own order: one
    # early flip ends a prompt's run of identical steps, so the step count is the noisier measure (transformers'
    # bfloat16 run itself kept 44-48 of 128 steps across seeds here); the mean distance is held as DeepSeek's is.
    assert ours_steps >= 0.7 * theirs_steps
    assert ours_distance <= 1.25 * theirs_distance + 1e-3


def _rewrite(checkpoint, target, edit):
    from safetensors.torch import load_file, save_file

    shutil.copytree(checkpoint, target)
    tensors = load_file(str(target / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    return target


def _run(strata_generate, directory):
    return subprocess.run([str(strata_generate), "--model", str(directory), "--prompt-ids", "1,2", "--max-new-tokens",
                           "1"], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("tensor,change", [
    ("model.layers.1.self_attn.sinks", lambda t: t[:-1]),
    ("model.layers.0.mlp.experts.gate_up_proj", lambda t: t[:, :, :-2]),
    ("model.layers.2.mlp.experts.down_proj_bias", lambda t: t[:-1]),
    ("model.layers.3.mlp.router.bias", None),
], ids=["sinks-length", "gate-up-shape", "down-bias-shape", "router-bias-missing"])
def test_a_bad_tensor_exits_2_naming_it(strata_generate, checkpoint, tmp_path, tensor, change):
    def edit(tensors):
        if change is None:
            del tensors[tensor]
        else:
            tensors[tensor] = change(tensors[tensor]).contiguous()

    proc = _run(strata_generate, _rewrite(checkpoint(NAME), tmp_path / "ckpt", edit))
    assert proc.returncode == 2, proc.stderr
    assert tensor in proc.stderr, proc.stderr


@pytest.mark.parametrize("change,message", [
    ({"layer_types": ["sliding_attention"]}, "config.json: layer_types"),
    ({"layer_types": ["sliding_attention", "local", "full_attention", "full_attention"]}, "config.json: layer_types[1]"),
    ({"num_experts_per_tok": 7}, "config.json: num_experts_per_tok"),
    ({"swiglu_limit": "7"}, "config.json: swiglu_limit"),
    ({"head_dim": None}, "config.json: head_dim"),
], ids=["layer-types-length", "layer-type-name", "top-k", "swiglu-limit", "head-dim-null"])
def test_bad_config_exits_2_naming_the_field(strata_generate, checkpoint, tmp_path, change, message):
    target = tmp_path / "ckpt"
    shutil.copytree(checkpoint(NAME), target)
    config = json.loads((target / "config.json").read_text())
    config.update(change)
    (target / "config.json").write_text(json.dumps(config))
    proc = _run(strata_generate, target)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr, proc.stderr


# --- MXFP4 experts (gpt-oss's release format) ---------------------------------------------------------------------

MXFP4_CONFIG = {"quant_method": "mxfp4",
                "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                           "model.embed_tokens", "lm_head"]}


def _mxfp4_checkpoint(dense_dir, target, seed=3):
    """The tiny model with every layer's experts replaced by MXFP4 codes and scales the test draws itself (not
    strata's code): uniform random E2M1 nibbles, E8M0 scales of 2^-6 .. 2^-3, the biases kept dense; and its dense
    twin, whose experts are transformers' own dequantization of those bytes (convert_moe_packed_tensors, float32)."""
    from safetensors.torch import load_file, save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    generator = torch.Generator().manual_seed(seed)
    kw = H.CONFIGS[NAME][1]
    experts, hidden, inter = kw["num_local_experts"], kw["hidden_size"], kw["intermediate_size"]
    tensors = load_file(str(dense_dir / "model.safetensors"))
    dense = dict(tensors)
    for layer in range(kw["num_hidden_layers"]):
        prefix = f"model.layers.{layer}.mlp.experts."
        for name, rows, cols in (("gate_up_proj", 2 * inter, hidden), ("down_proj", hidden, inter)):
            blocks = torch.randint(0, 256, (experts, rows, cols // 32, 16), generator=generator, dtype=torch.uint8)
            scales = torch.randint(121, 125, (experts, rows, cols // 32), generator=generator, dtype=torch.uint8)
            del tensors[prefix + name]
            tensors[prefix + name + "_blocks"], tensors[prefix + name + "_scales"] = blocks, scales
            dense[prefix + name] = convert_moe_packed_tensors(blocks.clone(), scales.clone(), dtype=torch.float32)
    config = json.loads((dense_dir / "config.json").read_text())
    packed, twin = target / "mxfp4", target / "dense"
    for directory, data, quantization in ((packed, tensors, MXFP4_CONFIG), (twin, dense, None)):
        directory.mkdir(parents=True)
        save_file({k: v.contiguous() for k, v in data.items()}, str(directory / "model.safetensors"),
                  metadata={"format": "pt"})
        (directory / "config.json").write_text(json.dumps(dict(config, quantization_config=quantization)
                                                          if quantization else config))
    return packed, twin


@pytest.fixture(scope="module")
def mxfp4(checkpoint, tmp_path_factory):
    packed, twin = _mxfp4_checkpoint(checkpoint(NAME), tmp_path_factory.mktemp("gpt_oss_mxfp4"))
    return packed, twin, H.reference_generate(twin, PROMPTS, NEW_TOKENS)


@pytest.mark.parametrize("plan", ["cpu", "two_stage", "experts_apart"])
def test_mxfp4_experts_generate_as_transformers_dequantized_model(strata_generate, mxfp4, plan):
    """The MXFP4 checkpoint served packed (0.53 bytes per expert weight; the kernels read the codes) gives the ids and
    logprobs of transformers' generate() on the dense model its own dequantization makes."""
    packed, _, reference = mxfp4
    args = {"cpu": ["--device-map", '{"": "cpu"}'],
            "two_stage": ["--device-map", H.layer_device_map(NAME, [0, 0, 1, 1], 1), "--physical-devices",
                          "0=cpu,1=cpu", "--max-memory", "0=1GiB,1=1GiB,cpu=1GiB", "--prefill-chunk", "3"],
            "experts_apart": ["--device-map", experts_apart_map(NAME, [0, 0, 1, 1], "cpu", 1).replace(
                ".mlp.gate\"", ".mlp.router\""), "--physical-devices", "0=cpu,1=cpu",
                              "--max-memory", "0=1GiB,1=1GiB,cpu=1GiB"]}[plan]
    got = H.run_generate(packed, PROMPTS, NEW_TOKENS, *args)
    kw = H.CONFIGS[NAME][1]
    assert got["load"]["packed_tensors"] == 3 * kw["num_local_experts"] * kw["num_hidden_layers"], got["load"]
    assert_matches(reference, got)


def test_mxfp4_plan_counts_the_packed_bytes(strata_generate, mxfp4):
    """strata-plan sizes MXFP4 experts as stored (blocks and scales: 17 bytes per 32 weights); --quantized-sizing
    transformers as transformers' quantizer leaves them on a machine without its GPU kernels (dequantized to
    bfloat16)."""
    packed, _, _ = mxfp4
    plan = strata_generate.parent.parent / "planner" / "strata-plan"
    kw = H.CONFIGS[NAME][1]
    experts_weights = kw["num_hidden_layers"] * kw["num_local_experts"] * 3 * kw["intermediate_size"] * kw["hidden_size"]
    sizes = {}
    for sizing in ("packed", "transformers"):
        proc = subprocess.run([str(plan), "--model", str(packed), "--json", "--quantized-sizing", sizing],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        sizes[sizing] = sum(d["planned_bytes"] for d in json.loads(proc.stdout)["devices"])
    # bfloat16 (2 bytes) against 17 / 32 bytes per expert weight; everything else is counted alike.
    assert sizes["transformers"] - sizes["packed"] == experts_weights * 2 - experts_weights * 17 // 32, sizes


@pytest.mark.parametrize("change,message", [
    (lambda t: t.__setitem__("model.layers.1.mlp.experts.down_proj_scales",
                             t["model.layers.1.mlp.experts.down_proj_scales"][:, :-1].contiguous()),
     "model.layers.1.mlp.experts.down_proj_scales"),
    (lambda t: t.__setitem__("model.layers.0.mlp.experts.gate_up_proj_scales",
                             torch.full_like(t["model.layers.0.mlp.experts.gate_up_proj_scales"], 255)),
     "model.layers.0.mlp.experts.gate_up_proj_blocks[0] (MXFP4) holds the scale 255"),
    (lambda t: t.__setitem__("model.layers.2.mlp.experts.gate_up_proj",
                             torch.zeros(6, 64, 64, dtype=torch.bfloat16)) or
     t.pop("model.layers.2.mlp.experts.gate_up_proj_blocks"),
     "unexpected tensor model.layers.2.mlp.experts.gate_up_proj in model.safetensors"),
], ids=["scales-shape", "scale-255", "bf16-expert-in-mxfp4-config"])
def test_a_bad_mxfp4_checkpoint_exits_2_naming_the_tensor(strata_generate, mxfp4, tmp_path, change, message):
    packed, _, _ = mxfp4
    proc = _run(strata_generate, _rewrite(packed, tmp_path / "ckpt", change))
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr, proc.stderr
