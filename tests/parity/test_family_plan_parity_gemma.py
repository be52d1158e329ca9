"""Planner parity for Gemma 2, Gemma 3 text and Phi-3: `strata-plan --model DIR` builds the module tree
transformers builds (names, classes, shapes, dtypes, tied weights, no-split classes) and places it
exactly as `from_pretrained(device_map=S, max_memory=M)` does, for three public configurations per family
x the four strategies x the layouts of test_plan_parity.py (reference computed live, as there).

The configurations carry the public config.json fields that shape the tree or that transformers reads
while building it. Phi-3-mini-128k's longrope short/long factor lists have their real length (48 = one
per rotary frequency) but not the published values: only their length shapes the tree.
"""

from __future__ import annotations

import copy
import functools
import itertools
import json

import pytest

import parity_helpers as H
import export_module_tree
from test_module_tree_parity import tree_diff

_GEMMA2 = {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "hidden_act": "gelu_pytorch_tanh",
           "hidden_activation": "gelu_pytorch_tanh", "vocab_size": 256000, "max_position_embeddings": 8192,
           "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "attention_bias": False, "attention_dropout": 0.0,
           "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0, "sliding_window": 4096,
           "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 1, "cache_implementation": "hybrid"}
_GEMMA3 = {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_activation": "gelu_pytorch_tanh",
           "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "attention_bias": False,
           "attention_dropout": 0.0, "final_logit_softcapping": None, "attn_logit_softcapping": None,
           "sliding_window_pattern": 6, "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 1}
_PHI3 = {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_act": "silu", "vocab_size": 32064,
         "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False, "attention_dropout": 0.0,
         "embd_pdrop": 0.0, "resid_pdrop": 0.0, "bos_token_id": 1, "eos_token_id": 32000, "pad_token_id": 32000}

FAMILY_CONFIGS: dict[str, dict] = {
    "Gemma-2-2B": dict(_GEMMA2, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26, num_attention_heads=8,
                       num_key_value_heads=4, head_dim=256, query_pre_attn_scalar=256, torch_dtype="float32"),
    "Gemma-2-9B": dict(_GEMMA2, hidden_size=3584, intermediate_size=14336, num_hidden_layers=42, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=256, query_pre_attn_scalar=256, torch_dtype="float32"),
    "Gemma-2-27B": dict(_GEMMA2, hidden_size=4608, intermediate_size=36864, num_hidden_layers=46,
                        num_attention_heads=32, num_key_value_heads=16, head_dim=128, query_pre_attn_scalar=144,
                        torch_dtype="bfloat16"),
    "Gemma-3-1B": dict(_GEMMA3, hidden_size=1152, intermediate_size=6912, num_hidden_layers=26, num_attention_heads=4,
                       num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256, vocab_size=262144,
                       max_position_embeddings=32768, sliding_window=512, rope_scaling=None, torch_dtype="bfloat16"),
    "Gemma-3-12B": dict(_GEMMA3, hidden_size=3840, intermediate_size=15360, num_hidden_layers=48,
                        num_attention_heads=16, num_key_value_heads=8, head_dim=256, query_pre_attn_scalar=256,
                        vocab_size=262208, max_position_embeddings=131072, sliding_window=1024,
                        rope_scaling={"factor": 8.0, "rope_type": "linear"}, torch_dtype="bfloat16"),
    "Gemma-3-27B": dict(_GEMMA3, hidden_size=5376, intermediate_size=21504, num_hidden_layers=62,
                        num_attention_heads=32, num_key_value_heads=16, head_dim=128, query_pre_attn_scalar=168,
                        vocab_size=262208, max_position_embeddings=131072, sliding_window=1024,
                        rope_scaling={"factor": 8.0, "rope_type": "linear"}, torch_dtype="bfloat16"),
    "Phi-3-mini-4k": dict(_PHI3, hidden_size=3072, intermediate_size=8192, num_hidden_layers=32, num_attention_heads=32,
                          num_key_value_heads=32, max_position_embeddings=4096, original_max_position_embeddings=4096,
                          rope_scaling=None, sliding_window=2047, torch_dtype="bfloat16"),
    "Phi-3-medium-4k": dict(_PHI3, hidden_size=5120, intermediate_size=17920, num_hidden_layers=40,
                            num_attention_heads=40, num_key_value_heads=10, max_position_embeddings=4096,
                            original_max_position_embeddings=4096, rope_scaling=None, sliding_window=2047,
                            torch_dtype="bfloat16"),
    "Phi-3-mini-128k": dict(_PHI3, hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
                            num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=131072,
                            original_max_position_embeddings=4096, sliding_window=262144,
                            rope_scaling={"type": "longrope", "short_factor": [1.0 + i / 100 for i in range(48)],
                                          "long_factor": [1.0 + i / 10 for i in range(48)]},
                            torch_dtype="bfloat16"),
}

DTYPE = "bfloat16"


@functools.lru_cache(maxsize=None)
def meta_model(name: str, dtype: str):
    from transformers import AutoConfig

    config = AutoConfig.for_model(**copy.deepcopy(FAMILY_CONFIGS[name]))
    return export_module_tree.build_meta_model(config, dtype)


@pytest.fixture(scope="module")
def family_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("family-configs")
    made = {}

    def get(name: str):
        if name not in made:
            made[name] = H.write_checkpoint_dir(root / name, FAMILY_CONFIGS[name])
        return made[name]

    return get


CASES = [pytest.param(c, l, s, id=f"{c}-{l}-{s}")
         for c, l, s in itertools.product(FAMILY_CONFIGS, H.LAYOUTS, H.STRATEGIES)]


@pytest.mark.parametrize("config,layout,strategy", CASES)
def test_family_device_map_matches_transformers(strata_plan, family_dir, config, layout, strategy):
    model = meta_model(config, DTYPE)
    max_memory = H.layout_for(model, layout)
    expected = H.reference_device_map(model, strategy, max_memory)
    out = H.strata_plan_json(strata_plan, "--model", family_dir(config), "--device-map", strategy,
                             "--max-memory", H.max_memory_arg(max_memory), "--dtype", DTYPE)
    actual = out["device_map"]
    assert actual == expected, (
        f"{config} {layout} {strategy}: max_memory={H.max_memory_arg(max_memory)}\n"
        f"{H.map_diff(expected, actual)}\ntransformers: {expected}\nstrata:       {actual}")


@pytest.mark.parametrize("config", list(FAMILY_CONFIGS))
def test_family_layouts_have_their_intended_character(config):
    """The harness: each layout really fits / offloads / needs disk for these models too."""
    model = meta_model(config, DTYPE)
    for layout, (kinds, unused) in H.LAYOUT_CHARACTER.items():
        dm = H.reference_device_map(model, "auto", H.layout_for(model, layout))
        got = {"gpu" if isinstance(v, int) else v for v in dm.values()}
        assert got == kinds, f"{layout}: {got} != {kinds}: {dm}"
        assert not (unused & set(dm.values())), dm


TREE_CASES = [pytest.param(c, d, id=f"{c}-{d}") for c in FAMILY_CONFIGS for d in (DTYPE,)] + [
    pytest.param(c, "float32", id=f"{c}-float32") for c in ("Gemma-2-2B", "Gemma-3-1B", "Phi-3-mini-128k")]


@pytest.mark.parametrize("config,dtype", TREE_CASES)
def test_family_module_tree_matches_export(strata_plan, family_dir, config, dtype):
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(**copy.deepcopy(FAMILY_CONFIGS[config]))
    expected = json.loads(json.dumps(export_module_tree.module_tree(meta_model(config, dtype), cfg, dtype)))
    proc = H.run_strata_plan(strata_plan, "--model", family_dir(config), "--dtype", dtype, "--print-module-tree")
    actual = json.loads(proc.stdout)
    assert actual == expected, "\n".join(tree_diff(expected, actual) or ["(order of keys or lists)"])


# Variations on one tiny config per family that change the tree: each is built by transformers and by
# strata-plan, and the trees must agree.
_TINY = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 128}
VARIANTS = {
    "gemma2-untied-bias": dict(_TINY, architectures=["Gemma2ForCausalLM"], model_type="gemma2", head_dim=16,
                               tie_word_embeddings=False, attention_bias=True),
    "gemma3-all-sliding": dict(_TINY, architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", head_dim=16),
    "gemma3-layer-types": dict(_TINY, architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", head_dim=16,
                               layer_types=["full_attention", "sliding_attention", "full_attention"]),
    "gemma3-pattern-2": dict(_TINY, architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", head_dim=16,
                             sliding_window_pattern=2, hidden_activation="gelu"),
    "phi3-gqa-tied": dict(_TINY, architectures=["Phi3ForCausalLM"], model_type="phi3", pad_token_id=0,
                          tie_word_embeddings=True),
    "phi3-partial-longrope": dict(_TINY, architectures=["Phi3ForCausalLM"], model_type="phi3", pad_token_id=0,
                                  partial_rotary_factor=0.5, original_max_position_embeddings=32,
                                  max_position_embeddings=128,
                                  rope_scaling={"type": "longrope", "short_factor": [1.0] * 4,
                                                "long_factor": [2.0] * 4}),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_family_variant_tree_matches_export(strata_plan, tmp_path, name):
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(**copy.deepcopy(VARIANTS[name]))
    model = export_module_tree.build_meta_model(cfg, "float32")
    expected = json.loads(json.dumps(export_module_tree.module_tree(model, cfg, "float32")))
    d = H.write_checkpoint_dir(tmp_path / name, VARIANTS[name])
    actual = json.loads(H.run_strata_plan(strata_plan, "--model", d, "--dtype", "float32", "--print-module-tree").stdout)
    assert actual == expected, "\n".join(tree_diff(expected, actual) or ["(order of keys or lists)"])


BAD = {
    "gemma-rope-type": ({"rope_scaling": {"rope_type": "yarn", "factor": 2.0}}, "gemma2", "rope_scaling.rope_type"),
    "gemma-layer-types": ({"layer_types": ["sliding_attention"]}, "gemma3", "layer_types"),
    "gemma-layer-type-name": ({"layer_types": ["local", "full_attention", "full_attention"]}, "gemma3", "layer_types[0]"),
    "gemma-activation": ({"hidden_activation": "prelu"}, "gemma2", "hidden_activation"),
    "gemma-kv-heads": ({"num_key_value_heads": 3}, "gemma2", "num_key_value_heads"),
    "gemma-pad": ({"pad_token_id": 500}, "gemma3", "pad_token_id"),
    "gemma-model-type": ({"model_type": "llama"}, "gemma2", "model_type"),
    "phi3-rope-type": ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "phi3", "rope_scaling.rope_type"),
    "phi3-short-factor-length": ({"rope_scaling": {"type": "longrope", "short_factor": [1.0] * 5,
                                                   "long_factor": [1.0] * 8}}, "phi3", "rope_scaling.short_factor"),
    "phi3-long-factor-missing": ({"rope_scaling": {"type": "longrope", "short_factor": [1.0] * 8}}, "phi3",
                                 "rope_scaling.long_factor"),
    "phi3-head-dim": ({"head_dim": 32}, "phi3", "head_dim"),
    "phi3-su-original": ({"rope_scaling": {"type": "su", "short_factor": [1.0] * 8, "long_factor": [1.0] * 8}},
                         "phi3", "rope_scaling.original_max_position_embeddings"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_family_bad_config_exits_2_naming_the_field(strata_plan, tmp_path, name):
    change, family, field = BAD[name]
    base = {"gemma2": VARIANTS["gemma2-untied-bias"], "gemma3": VARIANTS["gemma3-all-sliding"],
            "phi3": VARIANTS["phi3-gqa-tied"]}[family]
    d = H.write_checkpoint_dir(tmp_path / name, dict(base, **change))
    proc = H.run_strata_plan(d and strata_plan, "--model", d, "--json", expect_rc=2)
    assert field in proc.stderr, proc.stderr
