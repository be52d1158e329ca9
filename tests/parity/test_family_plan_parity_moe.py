"""Qwen3, Qwen3-MoE, Mixtral, DeepSeek-V3, GLM-4.5/4.6, MiniMax-M2 and gpt-oss: strata's module tree is the one transformers builds (names, classes,
fused expert parameters, no-split classes), strata-plan's device map is transformers' own for every
strategy and memory layout of the plan parity suite, and bad MoE configs exit 2 naming the field.

The reference is computed live as in test_plan_parity.py (meta model, `_get_device_map` with GPU
queries stubbed). Configurations are copied from the public config.json files (the fields that shape
the tree); the dtype is bfloat16, the dtype these checkpoints ship in.
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

_QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_act": "silu", "head_dim": 128,
          "vocab_size": 151936, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 40960,
          "attention_bias": False, "use_sliding_window": False, "sliding_window": None, "bos_token_id": 151643,
          "eos_token_id": 151645, "torch_dtype": "bfloat16"}
_QWEN3_MOE = dict(_QWEN3, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", decoder_sparse_step=1,
                  mlp_only_layers=[], norm_topk_prob=True, num_experts_per_tok=8, tie_word_embeddings=False)
_MIXTRAL = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_act": "silu",
            "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2, "rms_norm_eps": 1e-5,
            "rope_theta": 1000000.0, "sliding_window": None, "tie_word_embeddings": False, "bos_token_id": 1,
            "eos_token_id": 2, "router_aux_loss_coef": 0.02, "torch_dtype": "bfloat16"}

# DeepSeek-V3's public config.json (its quantization_config left out: dense sizing); Kimi K2's shape (384 experts,
# 64 heads, one group) under deepseek_v3, the model type transformers knows for it.
_DEEPSEEK_V3 = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_act": "silu",
                "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
                "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
                "n_shared_experts": 1, "n_routed_experts": 256, "routed_scaling_factor": 2.5, "kv_lora_rank": 512,
                "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
                "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8,
                "moe_layer_freq": 1, "first_k_dense_replace": 3, "norm_topk_prob": True, "scoring_func": "sigmoid",
                "max_position_embeddings": 163840, "rms_norm_eps": 1e-6, "rope_theta": 10000,
                "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                                 "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"},
                "tie_word_embeddings": False, "vocab_size": 129280, "bos_token_id": 0, "eos_token_id": 1,
                "torch_dtype": "bfloat16"}

# GLM-4.6's and GLM-4.5-Air's public config.json (zai-org), MiniMax-M2's (MiniMaxAI; its FP8 quantization_config left
# out: dense sizing; its legacy MTP and routing fields kept, transformers ignores them).
_GLM4_MOE = {"architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "attention_bias": True,
             "head_dim": 128, "hidden_act": "silu", "partial_rotary_factor": 0.5, "norm_topk_prob": True,
             "num_key_value_heads": 8, "n_group": 1, "topk_group": 1, "n_shared_experts": 1, "num_experts_per_tok": 8,
             "rms_norm_eps": 1e-5, "rope_scaling": None, "rope_theta": 1000000, "num_nextn_predict_layers": 1,
             "tie_word_embeddings": False, "vocab_size": 151552, "pad_token_id": 151329,
             "eos_token_id": [151329, 151336, 151338], "torch_dtype": "bfloat16"}
_MINIMAX_M2 = {"architectures": ["MiniMaxM2ForCausalLM"], "model_type": "minimax_m2", "hidden_act": "silu",
               "hidden_size": 3072, "intermediate_size": 1536, "num_hidden_layers": 62, "num_attention_heads": 48,
               "num_key_value_heads": 8, "head_dim": 128, "rotary_dim": 64, "vocab_size": 200064,
               "num_local_experts": 256, "num_experts_per_tok": 8, "max_position_embeddings": 196608,
               "rms_norm_eps": 1e-6, "rope_theta": 5000000, "tie_word_embeddings": False, "qk_norm_type": "per_layer",
               "use_qk_norm": True, "scoring_func": "sigmoid", "use_routing_bias": True, "use_mtp": True,
               "num_mtp_modules": 3, "mtp_transformer_layers": 1, "bos_token_id": 200019, "eos_token_id": 200020,
               "torch_dtype": "bfloat16"}

# gpt-oss-120b's and -20b's public config.json (openai; the mxfp4 quantization_config left out: dense sizing).
_GPT_OSS = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 2880,
            "intermediate_size": 2880, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
            "num_experts_per_tok": 4, "vocab_size": 201088, "sliding_window": 128, "attention_bias": True,
            "attention_dropout": 0.0, "hidden_act": "silu", "initial_context_length": 4096,
            "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 150000,
            "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                             "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": False},
            "swiglu_limit": 7.0, "tie_word_embeddings": False, "router_aux_loss_coef": 0.9,
            "output_router_logits": False, "eos_token_id": 200002, "pad_token_id": 199999, "torch_dtype": "bfloat16"}

CONFIGS = {
    "gpt-oss-120b": dict(_GPT_OSS, num_hidden_layers=36, num_local_experts=128,
                         layer_types=["sliding_attention", "full_attention"] * 18),
    "gpt-oss-20b": dict(_GPT_OSS, num_hidden_layers=24, num_local_experts=32,
                        layer_types=["sliding_attention", "full_attention"] * 12),
    "GLM-4.6": dict(_GLM4_MOE, hidden_size=5120, intermediate_size=12288, moe_intermediate_size=1536,
                    num_hidden_layers=92, num_attention_heads=96, n_routed_experts=160, first_k_dense_replace=3,
                    routed_scaling_factor=2.5, use_qk_norm=True, max_position_embeddings=202752),
    "GLM-4.5-Air": dict(_GLM4_MOE, hidden_size=4096, intermediate_size=10944, moe_intermediate_size=1408,
                        num_hidden_layers=46, num_attention_heads=96, n_routed_experts=128, first_k_dense_replace=1,
                        routed_scaling_factor=1.0, use_qk_norm=False, max_position_embeddings=131072),
    "MiniMax-M2": _MINIMAX_M2,
    "DeepSeek-V3": _DEEPSEEK_V3,
    "Kimi-K2-shaped": dict(_DEEPSEEK_V3, num_attention_heads=64, num_key_value_heads=64, n_routed_experts=384,
                           n_group=1, topk_group=1, first_k_dense_replace=1, vocab_size=163840,
                           routed_scaling_factor=2.827, rope_scaling={
                               "beta_fast": 1.0, "beta_slow": 1.0, "factor": 32.0, "mscale": 1.0,
                               "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"}),
    "Qwen3-0.6B": dict(_QWEN3, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, max_window_layers=28, tie_word_embeddings=True),
    "Qwen3-8B": dict(_QWEN3, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, max_window_layers=36, tie_word_embeddings=False),
    "Qwen3-32B": dict(_QWEN3, hidden_size=5120, intermediate_size=25600, num_hidden_layers=64, num_attention_heads=64,
                      num_key_value_heads=8, max_window_layers=64, tie_word_embeddings=False),
    "Qwen3-30B-A3B": dict(_QWEN3_MOE, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                          num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, num_experts=128,
                          max_window_layers=48),
    "Qwen3-235B-A22B": dict(_QWEN3_MOE, hidden_size=4096, intermediate_size=12288, moe_intermediate_size=1536,
                            num_hidden_layers=94, num_attention_heads=64, num_key_value_heads=4, num_experts=128,
                            max_window_layers=94),
    "Qwen3-Coder-480B-A35B": dict(_QWEN3_MOE, hidden_size=6144, intermediate_size=8192, moe_intermediate_size=2560,
                                  num_hidden_layers=62, num_attention_heads=96, num_key_value_heads=8, num_experts=160,
                                  max_window_layers=62, max_position_embeddings=262144),
    "Mixtral-8x7B-v0.1": dict(_MIXTRAL, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                              num_attention_heads=32, vocab_size=32000, max_position_embeddings=32768),
    "Mixtral-8x22B-v0.1": dict(_MIXTRAL, hidden_size=6144, intermediate_size=16384, num_hidden_layers=56,
                               num_attention_heads=48, vocab_size=32000, max_position_embeddings=65536),
    "Mixtral-8x22B-Instruct-v0.1": dict(_MIXTRAL, hidden_size=6144, intermediate_size=16384, num_hidden_layers=56,
                                        num_attention_heads=48, vocab_size=32768, max_position_embeddings=65536),
}
# Tiny trees for the structure cases the real configurations do not reach: dense layers among sparse
# ones (mlp_only_layers, decoder_sparse_step), attention biases, an untied Qwen3 head_dim default.
TINY = {
    "qwen3-moe-mixed": dict(_QWEN3_MOE, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                            num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                            num_experts=6, num_experts_per_tok=2, decoder_sparse_step=2, mlp_only_layers=[3],
                            vocab_size=128, attention_bias=True),
    "qwen3-default-head-dim": {k: v for k, v in dict(_QWEN3, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                                      attention_bias=True).items() if k != "head_dim"},
    # save_pretrained writes Qwen3MoeConfig's num_experts under its attribute_map name
    "qwen3-moe-saved-names": {k: v for k, v in dict(_QWEN3_MOE, hidden_size=64, intermediate_size=96,
                                                     moe_intermediate_size=32, num_hidden_layers=2,
                                                     num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                                     num_local_experts=5, num_experts_per_tok=2).items()},
    # DeepSeek-V3 with the full-rank query (q_lora_rank null), attention biases, two shared experts,
    # a tied head and two dense layers.
    "deepseek-v3-tiny-plain": dict(_DEEPSEEK_V3, hidden_size=64, intermediate_size=96, moe_intermediate_size=16,
                                   num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
                                   n_routed_experts=8, n_group=2, topk_group=1, num_experts_per_tok=2,
                                   first_k_dense_replace=2, n_shared_experts=2, kv_lora_rank=24, q_lora_rank=None,
                                   qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=12, attention_bias=True,
                                   tie_word_embeddings=True, vocab_size=128, rope_scaling=None),
    # GLM without head_dim (hidden_size / heads), partial RoPE in the dict, groups, q/k norms, two shared experts, a tied
    # head; MiniMax-M2 with partial_rotary_factor over rotary_dim.
    "glm4-moe-tiny": {k: v for k, v in dict(_GLM4_MOE, hidden_size=64, intermediate_size=96, moe_intermediate_size=16,
                                             num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                                             n_routed_experts=8, n_group=2, topk_group=1, num_experts_per_tok=2,
                                             first_k_dense_replace=1, n_shared_experts=2, use_qk_norm=True,
                                             tie_word_embeddings=True, vocab_size=128, pad_token_id=0,
                                             rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                              "partial_rotary_factor": 0.25}).items()
                      if k not in ("head_dim", "rope_scaling", "rope_theta", "partial_rotary_factor")},
    "minimax-m2-tiny": dict(_MINIMAX_M2, hidden_size=64, intermediate_size=32, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                            num_experts_per_tok=2, vocab_size=128, bos_token_id=1, eos_token_id=2,
                            partial_rotary_factor=0.75),
    # gpt-oss without layer_types (alternating by default), head_dim (64 by default) or RoPE settings (YaRN by
    # default), no attention biases, a tied head.
    "gpt-oss-tiny": {k: v for k, v in dict(_GPT_OSS, hidden_size=64, intermediate_size=32, num_hidden_layers=3,
                                            num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                            num_experts_per_tok=2, vocab_size=128, eos_token_id=1, pad_token_id=0,
                                            attention_bias=False, tie_word_embeddings=True).items()
                     if k not in ("head_dim", "rope_scaling", "rope_theta")},
    "mixtral-alias-num-experts": {k: v for k, v in dict(_MIXTRAL, hidden_size=64, intermediate_size=96,
                                                         num_hidden_layers=2, num_attention_heads=4, vocab_size=128,
                                                         num_experts=3, num_experts_per_tok=3).items()
                                  if k != "num_local_experts"},
}
ALL = {**CONFIGS, **TINY}
DTYPE = "bfloat16"


@functools.lru_cache(maxsize=None)
def meta_model(name: str):
    from transformers import AutoConfig

    config = AutoConfig.for_model(**copy.deepcopy(ALL[name]))
    return export_module_tree.build_meta_model(config, DTYPE)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe_configs")
    made = {}

    def get(name, config=None):
        key = name if config is None else (name, json.dumps(config, sort_keys=True))
        if key not in made:
            made[key] = H.write_checkpoint_dir(root / f"{name}-{len(made)}", config or ALL[name])
        return made[key]

    return get


CASES = [pytest.param(c, l, s, id=f"{c}-{l}-{s}")
         for c, l, s in itertools.product(CONFIGS, H.LAYOUTS, H.STRATEGIES)]


@pytest.mark.parametrize("config,layout,strategy", CASES)
def test_moe_family_device_map_matches_transformers(strata_plan, model_dir, config, layout, strategy):
    model = meta_model(config)
    max_memory = H.layout_for(model, layout)
    expected = H.reference_device_map(model, strategy, max_memory)
    out = H.strata_plan_json(strata_plan, "--model", model_dir(config), "--device-map", strategy,
                             "--max-memory", H.max_memory_arg(max_memory), "--dtype", DTYPE)
    assert out["device_map"] == expected, (
        f"{config} {layout} {strategy}: max_memory={H.max_memory_arg(max_memory)}\n"
        f"strata differs from transformers:\n{H.map_diff(expected, out['device_map'])}")


@pytest.mark.parametrize("config", ["DeepSeek-V3", "Kimi-K2-shaped"])
@pytest.mark.parametrize("strategy", H.STRATEGIES)
def test_full_deepseek_over_eight_80gb_gpus_and_cpu_matches_transformers(strata_plan, model_dir, config, strategy):
    """The whole 671B model (1.3 TB in bfloat16) over 8 x 80 GB and a 1 TiB host: transformers' own map."""
    model = meta_model(config)
    max_memory = {**{i: 80 * 2**30 for i in range(8)}, "cpu": 2**40}
    expected = H.reference_device_map(model, strategy, max_memory)
    out = H.strata_plan_json(strata_plan, "--model", model_dir(config), "--device-map", strategy,
                             "--max-memory", H.max_memory_arg(max_memory), "--dtype", DTYPE)
    assert out["device_map"] == expected, f"{config} {strategy}:\n{H.map_diff(expected, out['device_map'])}"


@pytest.mark.parametrize("config", list(ALL))
def test_moe_family_module_tree_matches_export(strata_plan, model_dir, config):
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(**copy.deepcopy(ALL[config]))
    expected = json.loads(json.dumps(export_module_tree.module_tree(meta_model(config), cfg, DTYPE)))
    proc = H.run_strata_plan(strata_plan, "--model", model_dir(config), "--dtype", DTYPE, "--print-module-tree")
    actual = json.loads(proc.stdout)
    assert actual == expected, f"{config}: --print-module-tree differs:\n" + "\n".join(
        tree_diff(expected, actual) or ["(order of keys or lists)"])


def test_tiny_trees_reach_the_cases_they_exist_for():
    """Harness check: the mixed tree really has dense and sparse layers, biases, and the alias sets 3 experts."""
    model = meta_model("qwen3-moe-mixed")
    kinds = [type(layer.mlp).__name__ for layer in model.model.layers]
    assert kinds == ["Qwen3MoeMLP", "Qwen3MoeSparseMoeBlock", "Qwen3MoeMLP", "Qwen3MoeMLP", "Qwen3MoeMLP",
                     "Qwen3MoeSparseMoeBlock"], kinds
    assert model.model.layers[0].self_attn.o_proj.bias is not None
    assert meta_model("qwen3-default-head-dim").model.layers[0].self_attn.q_norm.weight.shape[0] == 128
    assert meta_model("mixtral-alias-num-experts").model.layers[0].mlp.experts.gate_up_proj.shape[0] == 3
    assert meta_model("qwen3-moe-saved-names").model.layers[0].mlp.experts.gate_up_proj.shape[0] == 5


BAD = [
    ("Qwen3-30B-A3B", {"num_experts": 0}, "num_experts"),
    ("Qwen3-30B-A3B", {"num_experts": -4}, "num_experts"),
    ("Qwen3-30B-A3B", {"num_experts_per_tok": 129}, "num_experts_per_tok"),
    ("Qwen3-30B-A3B", {"num_experts_per_tok": 0}, "num_experts_per_tok"),
    ("Qwen3-30B-A3B", {"moe_intermediate_size": -768}, "moe_intermediate_size"),
    ("Qwen3-30B-A3B", {"decoder_sparse_step": 0}, "decoder_sparse_step"),
    ("Qwen3-30B-A3B", {"mlp_only_layers": [1, "two"]}, "mlp_only_layers[1]"),
    ("Qwen3-30B-A3B", {"norm_topk_prob": "yes"}, "norm_topk_prob"),
    ("Qwen3-30B-A3B", {"num_experts": 1 << 40}, "num_experts"),
    ("Qwen3-30B-A3B", {"rope_scaling": {"rope_type": "spiral", "factor": 2.0}}, "rope_scaling.rope_type"),
    ("Qwen3-8B", {"head_dim": 0}, "head_dim"),
    ("Mixtral-8x7B-v0.1", {"num_local_experts": 0}, "num_local_experts"),
    ("Qwen3-30B-A3B", {"num_local_experts": 0}, "num_local_experts"),
    ("Mixtral-8x7B-v0.1", {"num_experts_per_tok": 9}, "num_experts_per_tok"),
    ("Mixtral-8x7B-v0.1", {"num_local_experts": 2.5}, "num_local_experts"),
    ("GLM-4.6", {"n_group": 3}, "n_routed_experts"),
    ("GLM-4.6", {"topk_group": 2}, "topk_group"),
    ("GLM-4.6", {"use_qk_norm": "yes"}, "use_qk_norm"),
    ("GLM-4.6", {"partial_rotary_factor": 1.5}, "partial_rotary_factor"),
    ("GLM-4.6", {"first_k_dense_replace": -1}, "first_k_dense_replace"),
    ("gpt-oss-20b", {"layer_types": ["sliding_attention"] * 3}, "layer_types"),
    ("gpt-oss-20b", {"num_experts_per_tok": 33}, "num_experts_per_tok"),
    ("gpt-oss-20b", {"sliding_window": 0}, "sliding_window"),
    ("gpt-oss-20b", {"swiglu_limit": -1}, "swiglu_limit"),
    ("MiniMax-M2", {"rotary_dim": 256}, "rotary_dim"),
    ("MiniMax-M2", {"num_experts_per_tok": 257}, "num_experts_per_tok"),
    ("MiniMax-M2", {"num_local_experts": 0}, "num_local_experts"),
]


@pytest.mark.parametrize("config,change,field", BAD, ids=[f"{c}-{f}-{i}" for i, (c, _, f) in enumerate(BAD)])
def test_bad_moe_config_exits_2_naming_the_field(strata_plan, model_dir, config, change, field):
    proc = H.run_strata_plan(strata_plan, "--model", model_dir(config, dict(ALL[config], **change)), "--json",
                             expect_rc=2)
    assert f"config.json: {field}" in proc.stderr, proc.stderr


# strata-plan --experts-on DEVICE (planner/experts_on.h): the rule computed here with transformers' own
# placement: plan; if something is off the GPUs, plan again with the experts of the last k layers
# weighing nothing (k = 1, 2, ...) until everything is on the GPUs; then split each moved layer so that
# exactly its experts module is on DEVICE.
def _experts_on_reference(config: str, strategy: str, max_memory: dict, device: str):
    import torch

    model = copy.deepcopy(meta_model(config))
    experts = [name for name, module in model.named_modules() if name.endswith(".mlp.experts")]
    on_gpus = lambda dm: all(isinstance(v, int) for v in dm.values())
    dm = H.reference_device_map(model, strategy, max_memory)
    moved: list[str] = []
    if not on_gpus(dm) and any(isinstance(k, int) for k in max_memory):
        for name in reversed(experts):
            module = model.get_submodule(name)
            for pname, p in list(module.named_parameters(recurse=False)):
                setattr(module, pname, torch.nn.Parameter(torch.empty((0, *p.shape[1:]), device="meta", dtype=p.dtype)))
            moved.append(name)
            dm = H.reference_device_map(model, strategy, max_memory)
            if on_gpus(dm):
                break
    original = meta_model(config)
    out = {}

    def walk(module, name, dev):
        if name in moved:
            out[name] = device
            return
        if not any(name == "" or m.startswith(name + ".") for m in moved):
            out[name] = dev
            return
        prefix = name + "." if name else ""
        for n, _ in module.named_parameters(recurse=False):
            out[prefix + n] = dev
        for n, child in module.named_children():
            walk(child, prefix + n, dev)
        for n, _ in module.named_buffers(recurse=False):
            out[prefix + n] = dev

    for key, dev in dm.items():
        if dev == device or not any(key == "" or m == key or m.startswith(key + ".") for m in moved):
            out[key] = dev
        else:
            walk(original.get_submodule(key) if key else original, key, dev)
    return out, sorted(moved)


EXPERTS_ON_CASES = [pytest.param(c, l, s, id=f"{c}-{l}-{s}")
                    for c in ["Qwen3-30B-A3B", "Mixtral-8x7B-v0.1", "DeepSeek-V3"]
                    for l in ["cpu_offload", "fits_2gpu", "cpu_only"]
                    for s in H.STRATEGIES]


@pytest.mark.parametrize("config,layout,strategy", EXPERTS_ON_CASES)
def test_experts_on_cpu_follows_its_rule_with_transformers_placement(strata_plan, model_dir, config, layout, strategy):
    model = meta_model(config)
    max_memory = H.layout_for(model, layout)
    expected, moved = _experts_on_reference(config, strategy, max_memory, "cpu")
    proc = H.run_strata_plan(strata_plan, "--model", model_dir(config), "--device-map", strategy, "--max-memory",
                             H.max_memory_arg(max_memory), "--dtype", DTYPE, "--experts-on", "cpu", "--json")
    actual = json.loads(proc.stdout)["device_map"]
    assert actual == expected, f"{config} {layout} {strategy}:\n{H.map_diff(expected, actual)}"
    if layout == "cpu_offload":
        assert moved and all(isinstance(v, int) for k, v in actual.items() if not k.endswith(".mlp.experts"))
        assert f"experts of {len(moved)} layers on cpu" in proc.stderr
    elif layout == "cpu_only":
        assert not moved and actual == {"": "cpu"}


@pytest.mark.parametrize("args,mentions", [
    (["--device-map", '{"": 0}', "--experts-on", "cpu"], "--experts-on: needs a strategy"),
    (["--experts-on", "gpu7"], "--experts-on: "),
], ids=["manual-map", "bad-device"])
def test_experts_on_bad_input_exits_2(strata_plan, model_dir, args, mentions):
    full = ["--model", model_dir("Qwen3-30B-A3B"), "--max-memory", "0=10GiB,cpu=1TB", *args]
    proc = H.run_strata_plan(strata_plan, *full, "--json", expect_rc=2)
    assert mentions in proc.stderr, proc.stderr


def test_experts_on_needs_experts(strata_plan, model_dir):
    proc = H.run_strata_plan(strata_plan, "--model", model_dir("Qwen3-8B"), "--experts-on", "cpu", "--max-memory",
                             "0=1GiB,cpu=1TB", "--json", expect_rc=2)
    assert "has no experts modules" in proc.stderr, proc.stderr


def test_experts_on_device_too_small_exits_2(strata_plan, model_dir):
    model = meta_model("Mixtral-8x7B-v0.1")
    size = H.model_size(model)
    proc = H.run_strata_plan(strata_plan, "--model", model_dir("Mixtral-8x7B-v0.1"), "--device-map", "sequential",
                             "--max-memory", f"0={size // 4},cpu={size // 100}", "--experts-on", "cpu", "--json",
                             expect_rc=2)
    assert "--experts-on cpu: the experts of" in proc.stderr and "over its max_memory" in proc.stderr, proc.stderr
