"""Module trees: strata's own model builder (`strata-plan --model DIR --print-module-tree`) builds the
same tree as transformers (tools/export_module_tree.py), and `--module-tree FILE` plans any
architecture exactly as transformers places it."""

from __future__ import annotations

import copy
import itertools
import json
import subprocess
import sys

import pytest

import parity_helpers as H
import export_module_tree


def tree_diff(expected, actual, path="tree", out=None, limit=20):
    """Human-readable differences between two module-tree JSON values (first `limit`)."""
    out = [] if out is None else out
    if len(out) >= limit:
        return out
    if isinstance(expected, dict) and isinstance(actual, dict):
        if list(expected) != list(actual):
            out.append(f"{path}: keys {list(expected)} != {list(actual)}")
        for k in expected:
            if k in actual:
                tree_diff(expected[k], actual[k], path if k == "children" else f"{path}/{k}", out, limit)
    elif isinstance(expected, list) and isinstance(actual, list):
        named = all(isinstance(x, dict) and "name" in x for x in expected + actual)
        if named and [x["name"] for x in expected] != [x["name"] for x in actual]:
            out.append(f"{path}: names {[x['name'] for x in expected]} != {[x['name'] for x in actual]}")
            return out
        if len(expected) != len(actual):
            out.append(f"{path}: transformers {expected!r} != strata {actual!r}")
            return out
        for i, (e, a) in enumerate(zip(expected, actual)):
            if named and "class" in e:
                sub = f"{path}.{e['name']}" if path != "tree/root" else e["name"]
            elif named:
                sub = f"{path}[{e['name']}]"
            else:
                sub = f"{path}[{i}]"
            tree_diff(e, a, sub, out, limit)
    elif expected != actual:
        out.append(f"{path}: transformers {expected!r} != strata {actual!r}")
    return out


def exported_tree(config: str, dtype: str) -> dict:
    from transformers import AutoConfig

    model = H.meta_model(config, dtype)
    cfg = AutoConfig.for_model(**copy.deepcopy(H.CONFIGS[config]))
    # through JSON, as the tool writes it
    return json.loads(json.dumps(export_module_tree.module_tree(model, cfg, dtype)))


@pytest.mark.parametrize("dtype", H.DTYPES)
@pytest.mark.parametrize("config", list(H.CONFIGS))
def test_print_module_tree_matches_export(strata_plan, checkpoint_dir, config, dtype):
    expected = exported_tree(config, dtype)
    proc = H.run_strata_plan(strata_plan, "--model", checkpoint_dir(config), "--dtype", dtype, "--print-module-tree")
    actual = json.loads(proc.stdout)
    diff = tree_diff(expected, actual)
    assert actual == expected, f"{config} {dtype}: --print-module-tree differs:\n" + "\n".join(diff or ["(order of keys or lists)"])


def test_export_tool_cli(tmp_path, checkpoint_dir):
    """The script as users run it: a checkpoint dir or a config.json file, -o FILE."""
    exe = [sys.executable, str(H.REPO / "tools" / "export_module_tree.py")]
    d = checkpoint_dir("Qwen2-0.5B")
    subprocess.run([*exe, str(d), "--dtype", "float16", "-o", str(tmp_path / "a.json")], check=True)
    subprocess.run([*exe, str(d / "config.json"), "--dtype", "float16", "-o", str(tmp_path / "b.json")], check=True)
    a = json.loads((tmp_path / "a.json").read_text())
    b = json.loads((tmp_path / "b.json").read_text())
    assert a == b == exported_tree("Qwen2-0.5B", "float16")
    assert a["format"] == "strata.module_tree.v1"
    assert a["tied_weights"] == {"lm_head.weight": "model.embed_tokens.weight"}
    assert a["kv_cache"] == {"num_hidden_layers": 24, "num_key_value_heads": 2, "head_dim": 64}
    bad = subprocess.run([*exe, str(tmp_path / "nope"), "-o", str(tmp_path / "c.json")], capture_output=True, text=True)
    assert bad.returncode == 2 and "nope" in bad.stderr


TREE_VS_MODEL_CASES = [
    pytest.param(c, d, l, s, id=f"{c}-{d}-{l}-{s}")
    for c, d in [("Llama-3-8B", "bfloat16"), ("Qwen2-0.5B", "float16"), ("Mistral-7B-v0.1", "float32")]
    for l in ["uneven_4gpu", "disk_offload"]
    for s in ["auto", "balanced_low_0"]
]


@pytest.mark.parametrize("config,dtype,layout,strategy", TREE_VS_MODEL_CASES)
def test_module_tree_file_plans_like_model_dir(strata_plan, checkpoint_dir, tmp_path, config, dtype, layout, strategy):
    tree_file = tmp_path / "tree.json"
    tree_file.write_text(json.dumps(exported_tree(config, dtype)))
    model = H.meta_model(config, dtype)
    mm = H.max_memory_arg(H.layout_for(model, layout))
    from_dir = H.strata_plan_json(strata_plan, "--model", checkpoint_dir(config), "--dtype", dtype,
                                  "--device-map", strategy, "--max-memory", mm)
    from_tree = H.strata_plan_json(strata_plan, "--module-tree", tree_file, "--device-map", strategy, "--max-memory", mm)
    assert from_tree["device_map"] == from_dir["device_map"]
    assert list(from_tree["device_map"]) == list(from_dir["device_map"])
    expected = H.reference_device_map(model, strategy, H.layout_for(model, layout))
    assert from_tree["device_map"] == expected, H.map_diff(expected, from_tree["device_map"])


# Architectures strata has no builder for: small configs from transformers' config classes (library
# defaults, shrunk), exported with the tool and planned from the file.
OTHER_ARCHS = {
    "gpt2": ("GPT2Config", dict(n_layer=8, n_embd=256, n_head=8, vocab_size=2000, n_positions=512,
                                bos_token_id=0, eos_token_id=0)),
    "opt": ("OPTConfig", dict(num_hidden_layers=8, hidden_size=256, ffn_dim=1024, num_attention_heads=8,
                              vocab_size=2000, max_position_embeddings=512, word_embed_proj_dim=256)),
    "gpt_neox": ("GPTNeoXConfig", dict(num_hidden_layers=8, hidden_size=256, intermediate_size=1024,
                                      num_attention_heads=8, vocab_size=2000, max_position_embeddings=512,
                                      bos_token_id=0, eos_token_id=0)),
    "phi3": ("Phi3Config", dict(num_hidden_layers=8, hidden_size=256, intermediate_size=1024, num_attention_heads=8,
                                num_key_value_heads=4, vocab_size=2000, max_position_embeddings=512,
                                pad_token_id=0, bos_token_id=1, eos_token_id=2)),
}


@pytest.fixture(scope="module")
def other_arch(tmp_path_factory):
    """arch -> (tree file written by tools/export_module_tree.py, meta model built in-process)."""
    import transformers

    root = tmp_path_factory.mktemp("other_archs")
    cache = {}

    def get(arch: str, dtype: str):
        if (arch, dtype) not in cache:
            cls_name, kwargs = OTHER_ARCHS[arch]
            config = getattr(transformers, cls_name)(**kwargs)
            d = root / f"{arch}-{dtype}"
            d.mkdir()
            config.save_pretrained(d)
            tree = d / "tree.json"
            subprocess.run([sys.executable, str(H.REPO / "tools" / "export_module_tree.py"), str(d),
                            "--dtype", dtype, "-o", str(tree)], check=True)
            model = export_module_tree.build_meta_model(transformers.AutoConfig.from_pretrained(d), dtype)
            cache[(arch, dtype)] = (tree, model)
        return cache[(arch, dtype)]

    return get


OTHER_CASES = [
    pytest.param(a, d, l, s, id=f"{a}-{d}-{l}-{s}")
    for a, d in itertools.chain(((a, "bfloat16") for a in OTHER_ARCHS), [("gpt2", "float32"), ("opt", "float16")])
    for l in H.LAYOUTS
    for s in H.STRATEGIES
]


@pytest.mark.parametrize("arch,dtype,layout,strategy", OTHER_CASES)
def test_other_architecture_plan_matches_transformers(strata_plan, other_arch, arch, dtype, layout, strategy):
    tree, model = other_arch(arch, dtype)
    max_memory = H.layout_for(model, layout)
    expected = H.reference_device_map(model, strategy, max_memory)
    out = H.strata_plan_json(strata_plan, "--module-tree", tree, "--device-map", strategy,
                             "--max-memory", H.max_memory_arg(max_memory))
    assert out["device_map"] == expected, (
        f"{arch} {dtype} {layout} {strategy}: max_memory={H.max_memory_arg(max_memory)}\n"
        f"{H.map_diff(expected, out['device_map'])}")


@pytest.mark.parametrize("arch", list(OTHER_ARCHS))
def test_other_architecture_tree_round_trips(strata_plan, other_arch, arch):
    """--module-tree FILE --print-module-tree prints the file back unchanged."""
    tree, _ = other_arch(arch, "bfloat16")
    proc = H.run_strata_plan(strata_plan, "--module-tree", tree, "--print-module-tree")
    expected = json.loads(tree.read_text())
    actual = json.loads(proc.stdout)
    assert actual == expected, "\n".join(tree_diff(expected, actual))
