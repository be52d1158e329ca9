"""Gemma 2, Gemma 3 text and Phi-3 beyond test_generate_parity.py (which runs the CONFIGS rows
gemma2_softcap, gemma3_qknorm and phi3_longrope on 1-, 2- and 4-stage and offload plans): 3-stage plans,
longrope's long factors, batch invariance, bfloat16 under the margin rule, and bad configs (exit 2, the
field named)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

import runtime_helpers as H
from test_generate_parity import PROMPTS, NEW_TOKENS, assert_matches

FAMILIES = ["gemma2_softcap", "gemma3_qknorm", "phi3_longrope"]


def three_stage(name: str) -> list[str]:
    n = H.CONFIGS[name][1]["num_hidden_layers"]
    devices = [min(2, i * 3 // n) for i in range(n)]
    return ["--device-map", H.layer_device_map(name, devices, 2), "--physical-devices", "0=cpu,1=cpu,2=cpu",
            "--max-memory", "0=1GiB,1=1GiB,2=1GiB,cpu=1GiB"]


@pytest.fixture(scope="module")
def references(checkpoint):
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = H.reference_generate(checkpoint(name), PROMPTS, NEW_TOKENS)
        return cache[name]

    return get


@pytest.mark.parametrize("name", FAMILIES)
def test_three_stage_plan_matches_transformers(strata_generate, checkpoint, references, name):
    got = H.run_generate(checkpoint(name), PROMPTS, NEW_TOKENS, *three_stage(name))
    assert len({line.split(" on ")[0] for line in got["load"]["stages"].splitlines()}) >= 3, got["load"]["stages"]
    assert_matches(references(name), got)


def test_soft_caps_and_windows_are_exercised(checkpoint):
    """The tiny checkpoints really depend on what they test: Gemma 2's attention scores and final logits
    exceed their caps, and the sequences outgrow the sliding windows."""
    import transformers

    cfg = H.CONFIGS["gemma2_softcap"][1]
    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint("gemma2_softcap"), dtype=torch.float32)
    uncapped = transformers.AutoModelForCausalLM.from_pretrained(
        checkpoint("gemma2_softcap"), dtype=torch.float32, final_logit_softcapping=None, attn_logit_softcapping=None)
    ids = torch.tensor([PROMPTS[2]])
    with torch.no_grad():
        raw = uncapped(ids).logits
        capped = model(ids).logits
    assert raw.abs().max() > cfg["final_logit_softcapping"]
    assert not torch.allclose(raw.tanh(), capped.tanh())
    for name in FAMILIES:
        assert H.CONFIGS[name][1]["sliding_window"] < len(PROMPTS[2]) + NEW_TOKENS


def test_gemma3_ignores_attn_logit_softcapping_as_transformers_does(strata_generate, checkpoint, tmp_path):
    """Gemma3Attention (transformers 5.23) does not pass attn_logit_softcapping to its attention: a config
    that sets it generates as one that does not, on both sides."""
    target = tmp_path / "ckpt"
    shutil.copytree(checkpoint("gemma3_qknorm"), target)
    config = json.loads((target / "config.json").read_text())
    config["attn_logit_softcapping"] = 0.5
    (target / "config.json").write_text(json.dumps(config))
    reference = H.reference_generate(target, PROMPTS[:2], 8)
    assert reference == H.reference_generate(checkpoint("gemma3_qknorm"), PROMPTS[:2], 8)
    assert_matches(reference, H.run_generate(target, PROMPTS[:2], 8, "--device-map", '{"": "cpu"}'))


@pytest.mark.parametrize("config_class,name", [("Gemma2Config", "gemma2_softcap"), ("Gemma3TextConfig", "gemma3_qknorm")])
def test_gemma_attention_bias(strata_generate, tmp_path, config_class, name):
    """attention_bias puts a bias on q, k, v and o (no released Gemma uses it; transformers builds it)."""
    import transformers

    config = getattr(transformers, config_class)(**dict(H.CONFIGS[name][1], attention_bias=True))
    H.save_random_model(tmp_path, config)
    reference = H.reference_generate(tmp_path, PROMPTS[:3], 8)
    assert_matches(reference, H.run_generate(tmp_path, PROMPTS[:3], 8, "--device-map", '{"": "cpu"}'))


@pytest.mark.parametrize("name", ["gemma2_softcap", "gemma3_qknorm", "phi3_longrope"])
def test_batch_invariance(strata_generate, checkpoint, name):
    batch = H.run_generate(checkpoint(name), PROMPTS, 8, "--device-map", '{"": "cpu"}')
    for i, prompt in enumerate(PROMPTS[:3]):
        alone = H.run_generate(checkpoint(name), [prompt], 8, "--device-map", '{"": "cpu"}')
        assert alone["results"][0]["ids"] == batch["results"][i]["ids"], f"prompt {i}"


@pytest.mark.parametrize("name", FAMILIES)
def test_bfloat16_agrees_where_the_margin_exceeds_bf16_noise(strata_generate, checkpoint, name):
    ckpt = checkpoint(name, torch.bfloat16)
    reference = H.reference_generate(ckpt, PROMPTS, NEW_TOKENS, dtype=torch.bfloat16)
    got = H.run_generate(ckpt, PROMPTS, NEW_TOKENS, "--device-map", '{"": "cpu"}', "--dtype", "bfloat16")
    compared = H.compare_bfloat16_by_margin(reference, got["results"], NEW_TOKENS)
    print(f"bfloat16 {name}: {compared} of {NEW_TOKENS * len(PROMPTS)} steps above the noise margin, all identical")


# longrope's long factors: original_max_position_embeddings 4, so every prompt below starts beyond it
# and transformers uses the long factors from the first forward on (no cache recomputation happens).
LONG_PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112],
                [17, 200, 33, 64, 9]]


@pytest.fixture(scope="module")
def phi3_long(checkpoint, tmp_path_factory):
    target = tmp_path_factory.mktemp("phi3_long")
    shutil.copytree(checkpoint("phi3_longrope"), target, dirs_exist_ok=True)
    config = json.loads((target / "config.json").read_text())
    config["original_max_position_embeddings"] = 4
    config["rope_parameters"]["original_max_position_embeddings"] = 4
    (target / "config.json").write_text(json.dumps(config))
    return target


def test_longrope_long_factors_match_transformers(strata_generate, phi3_long):
    reference = H.reference_generate(phi3_long, LONG_PROMPTS, NEW_TOKENS)
    got = H.run_generate(phi3_long, LONG_PROMPTS, NEW_TOKENS, *three_stage("phi3_longrope"))
    assert_matches(reference, got)
    short = H.reference_generate(phi3_long, LONG_PROMPTS[:1], NEW_TOKENS)
    assert short[0]["ids"] == reference[0]["ids"]


CROSSING_PROMPTS = [[1, 2], [42], [3, 4, 5, 6], [9, 8, 7]]


def test_longrope_crossing_recomputes_the_cache_as_generate_does(strata_generate, phi3_long):
    """Prompts of at most original_max_position_embeddings (4) tokens grow past it while decoding:
    Phi3ForCausalLM.prepare_inputs_for_generation drops the cache there and recomputes the whole sequence
    with the long factors; strata recomputes those rows too. transformers decides per batch (its padded
    length), strata per sequence, so each prompt's reference is generated alone."""
    got = H.run_generate(phi3_long, CROSSING_PROMPTS, NEW_TOKENS, *three_stage("phi3_longrope"))
    for i, prompt in enumerate(CROSSING_PROMPTS):
        reference = H.reference_generate(phi3_long, [prompt], NEW_TOKENS)
        assert_matches(reference, {"results": [got["results"][i]]})
    # Without the recomputation transformers' own continuations differ: the case really needs it.
    from unittest import mock

    import transformers
    from transformers.generation.utils import GenerationMixin

    with mock.patch.object(transformers.Phi3ForCausalLM, "prepare_inputs_for_generation",
                           GenerationMixin.prepare_inputs_for_generation):
        kept = [H.reference_generate(phi3_long, [p], NEW_TOKENS)[0] for p in CROSSING_PROMPTS]
    assert any(k["ids"] != g["ids"] for k, g in zip(kept, got["results"])), "the cache drop changed nothing"


BAD = [
    ("gemma2_softcap", {"final_logit_softcapping": -30.0}, "final_logit_softcapping"),
    ("gemma2_softcap", {"attn_logit_softcapping": 0}, "attn_logit_softcapping"),
    ("gemma2_softcap", {"query_pre_attn_scalar": -1}, "query_pre_attn_scalar"),
    ("gemma2_softcap", {"hidden_activation": "gelu"}, "hidden_activation"),
    ("gemma2_softcap", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}},
     "rope_parameters.rope_type"),
    ("gemma3_qknorm", {"use_bidirectional_attention": True}, "use_bidirectional_attention"),
    ("gemma3_qknorm", {"rope_parameters": {"full_attention": {"rope_type": "yarn", "factor": 2.0},
                                           "sliding_attention": {"rope_type": "default"}}},
     "rope_parameters.full_attention.rope_type"),
    ("gemma3_qknorm", {"sliding_window": None}, "sliding_window"),
    ("phi3_longrope", {"rope_parameters": {"rope_type": "longrope", "short_factor": [1.0] * 3,
                                           "long_factor": [1.0] * 4}}, "rope_parameters.short_factor"),
    ("phi3_longrope", {"rope_parameters": {"rope_type": "su", "short_factor": [1.0] * 4,
                                           "long_factor": [1.0] * 4}}, "original_max_position_embeddings"),
    ("phi3_longrope", {"rope_parameters": {"rope_type": "llama3", "factor": 8.0}}, "rope_parameters.rope_type"),
    ("phi3_longrope", {"hidden_act": "gelu"}, "hidden_act"),
]


@pytest.mark.parametrize("name,change,field", BAD, ids=[f"{n}-{f}-{i}" for i, (n, c, f) in enumerate(BAD)])
def test_bad_config_exits_2_naming_the_field(strata_generate, checkpoint, tmp_path, name, change, field):
    target = tmp_path / "ckpt"
    shutil.copytree(checkpoint(name), target)
    config = json.loads((target / "config.json").read_text())
    config.update(change)
    (target / "config.json").write_text(json.dumps(config))
    proc = H.run_generate(target, [[1, 2, 3]], 2, "--device-map", '{"": "cpu"}', check=False)
    assert proc.returncode == 2, f"exit {proc.returncode}: {proc.stderr}"
    assert field in proc.stderr, proc.stderr
