"""AWQ (GEMM) and GPTQ (v1) checkpoints made offline from tiny random models (round-to-nearest, packed by
quantized_checkpoints), checked three ways: the formats' own readers (AutoAWQ's dequantize_gemm, AutoGPTQ's CPU
QuantLinear) dequantize every packed layer to the float16 (q - z) * s the packer started from, bit for bit; strata's
dequantization (kernels and ATen paths) equals the readers' in float32; strata-generate on the packed checkpoint
matches transformers' greedy generation on a dense model holding the readers' weights (transformers runs neither
format on a CPU without gptqmodel). Broken checkpoints exit 2 naming the tensor or field."""

from __future__ import annotations

import pytest
import torch

import quantized_checkpoints as Q
import runtime_helpers as H
from test_quantized_parity import NEW_TOKENS, PROMPTS, _broken_copy, _set, plan_args

# variant -> (maker, its arguments): the configurations the issue names.
VARIANTS = {
    "awq_g128": (Q.make_awq_checkpoint, {}),
    "gptq_g128_sym": (Q.make_gptq_checkpoint, {}),
    "gptq_desc_act": (Q.make_gptq_checkpoint, dict(desc_act=True)),
    "gptq_asym": (Q.make_gptq_checkpoint, dict(sym=False)),
    "gptq_int8": (Q.make_gptq_checkpoint, dict(bits=8)),
}
FAMILIES = ["llama", "qwen3", "qwen3_moe"]
# The readers round each product (q - z) * s to float16 (the scales' dtype: 2^-11 relative) before the matmul;
# strata's kernels keep the float32 products (sum of x * code per group, times the scale), as llama.cpp does. On
# these scaled-up random weights that is up to ~2e-3 in a logprob, with identical greedy ids; against a dense model
# of the unrounded products strata is within 3e-6 (checked while this test was written).
FLOAT16_PRODUCTS_TOLERANCE = 3e-3


@pytest.fixture(scope="module")
def int_checkpoint(tmp_path_factory):
    cache = {}

    def get(variant, name="llama"):
        if (variant, name) not in cache:
            maker, kwargs = VARIANTS[variant]
            cache[variant, name] = maker(tmp_path_factory.mktemp(f"{variant}-{name}"), name, **kwargs)
        return cache[variant, name]

    return get


@pytest.fixture(scope="module")
def reader(int_checkpoint):
    cache = {}

    def get(variant, name="llama"):
        if (variant, name) not in cache:
            cache[variant, name] = Q.reader_dequantized(int_checkpoint(variant, name))
        return cache[variant, name]

    return get


@pytest.fixture(scope="module")
def reference(int_checkpoint, reader, tmp_path_factory):
    """transformers' greedy generation on the dense model holding the readers' weights (float32)."""
    cache = {}

    def get(variant, name):
        if (variant, name) not in cache:
            dense = Q.save_dense_with(tmp_path_factory.mktemp(f"{variant}-{name}-dense"), name, reader(variant, name))
            cache[variant, name] = H.reference_generate(dense, PROMPTS, NEW_TOKENS)
        return cache[variant, name]

    return get


def _stored(checkpoint):
    from safetensors.torch import load_file

    return load_file(checkpoint / "model.safetensors")


def _linears_in_layers(name):
    """The linear layers of model.layers: 4 attention projections a layer, and 3 MLP projections per expert (3 in a
    dense MLP layer)."""
    config = Q.CONFIGS[name][1]
    experts = config.get("num_experts", 0)
    return sum(4 + 3 * (experts if experts and i not in config.get("mlp_only_layers", ()) else 1)
               for i in range(config["num_hidden_layers"]))


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_reader_dequantizes_to_the_weights_packed(int_checkpoint, reader, variant, name):
    """The writer is ours, the reader the format's: a wrong nibble order, K/N packing or zero offset shows here."""
    from safetensors.torch import load_file

    checkpoint = int_checkpoint(variant, name)
    expected = load_file(checkpoint / "expected-dequantized.safetensors")
    got = reader(variant, name)
    assert sorted(got) == sorted(expected)
    # AWQ: every nn.Linear but lm_head; GPTQ: the layers' (lm_head is outside model.layers).
    assert len(got) == _linears_in_layers(name) and "lm_head.weight" not in got
    dense = Q.split_experts(Q.dense_model(name)).state_dict()
    stored = _stored(checkpoint)
    for key, value in expected.items():
        assert got[key].dtype == torch.float16 and torch.equal(got[key], value), key
        # And the quantization is a real one: within a group's step of the dense weight.
        module = key.removesuffix(".weight")
        scales = stored[module + ".scales"].float()
        g_idx = stored.get(module + ".g_idx", torch.arange(value.shape[1]) // (value.shape[1] // scales.shape[0]))
        step = scales[g_idx.long()].t()
        assert ((value.float() - dense[key]).abs() <= step * 1.01 + 1e-3).all(), key


@pytest.mark.parametrize("path", ["kernels", "aten"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_strata_dequantizes_as_the_reader(int_checkpoint, reader, variant, path):
    """strata's dequantized weights (float32) are the readers' float16 products widened. An act-order layer comes
    out with its columns sorted by group (stable), as strata keeps it (x's columns follow at run time)."""
    checkpoint = int_checkpoint(variant)
    ours = Q.strata_dequantized(checkpoint, "float32", path)
    theirs = reader(variant)
    assert sorted(ours) == sorted(theirs)
    stored = _stored(checkpoint)
    for key, value in theirs.items():
        g_idx = stored.get(key.removesuffix(".weight") + ".g_idx")
        want = value.float()
        if g_idx is not None:
            want = want[:, torch.sort(g_idx, stable=True).indices]
        assert ours[key].dtype == torch.float32, key
        assert torch.equal(ours[key], want), f"{path}: {key} differs by {(ours[key] - want).abs().max()}"


@pytest.mark.parametrize("stages", [1, 2])
@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_greedy_matches_the_reader_weights_dense(strata_generate, int_checkpoint, reference, variant, name, stages):
    got = H.run_generate(int_checkpoint(variant, name), PROMPTS, NEW_TOKENS, *plan_args(name, stages))
    assert got["load"]["packed_tensors"] == _linears_in_layers(name), got["load"]
    assert len(got["load"]["stages"].splitlines()) >= stages
    Q.assert_same_greedy(reference(variant, name), got["results"], FLOAT16_PRODUCTS_TOLERANCE)


MODULE = "model.layers.1.self_attn.q_proj"


def _nan_first(s):
    s = s.clone()
    s.view(-1)[3] = float("nan")
    return s


def _out_of_range_group(g):
    g = g.clone()
    g[5] = 2  # q_proj has K 256, so groups 0 and 1
    return g


def _two_groups_swapped_one_column(g):
    g = g.clone()
    g[int((g == 0).nonzero()[0])] = 1  # group 0 then holds 127 columns, group 1 129
    return g


# case -> (variant, edits, what the message names)
BAD = {
    "awq_qweight_shape": ("awq_g128", dict(edit_tensors=_set(f"{MODULE}.qweight", lambda w: w[:-1])),
                          [f"{MODULE}.qweight", "shape"]),
    "awq_nan_scale": ("awq_g128", dict(edit_tensors=_set(f"{MODULE}.scales", _nan_first)),
                      [f"{MODULE}.scales", "non-finite"]),
    "awq_qzeros_dtype": ("awq_g128", dict(edit_tensors=_set(f"{MODULE}.qzeros", lambda z: z.float())),
                         [f"{MODULE}.qzeros", "dtype"]),
    "awq_gemv": ("awq_g128", dict(edit_config=lambda c: c.update(version="gemv")), ["version", "gemv"]),
    "gptq_qweight_shape": ("gptq_g128_sym",
                           dict(edit_tensors=_set(f"{MODULE}.qweight", lambda w: w[:, :-8].contiguous())),
                           [f"{MODULE}.qweight", "shape"]),
    "gptq_g_idx_range": ("gptq_g128_sym", dict(edit_tensors=_set(f"{MODULE}.g_idx", _out_of_range_group)),
                         [f"{MODULE}.g_idx", "group 2"]),
    "gptq_g_idx_counts": ("gptq_desc_act", dict(edit_tensors=_set(f"{MODULE}.g_idx", _two_groups_swapped_one_column)),
                          [f"{MODULE}.g_idx", "columns"]),
    "gptq_missing_g_idx": ("gptq_g128_sym", dict(edit_tensors=lambda t: t.pop(f"{MODULE}.g_idx")),
                           [f"{MODULE}.g_idx"]),
    "gptq_bits_3": ("gptq_g128_sym", dict(edit_config=lambda c: c.update(bits=3)), ["bits", "3"]),
    "gptq_v2": ("gptq_g128_sym", dict(edit_config=lambda c: c.update(checkpoint_format="gptq_v2")),
                ["checkpoint_format", "gptq_v2"]),
}


@pytest.mark.parametrize("case", list(BAD))
def test_int_bad_checkpoint_exits_2_naming_what_is_wrong(strata_generate, int_checkpoint, tmp_path, case):
    variant, edits, names = BAD[case]
    directory = _broken_copy(int_checkpoint(variant), tmp_path / case, **edits)
    proc = H.run_generate(directory, PROMPTS[:1], 2, "--device-map", '{"": "cpu"}', check=False)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    for name in names:
        assert name in proc.stderr, proc.stderr
