"""Quantized test checkpoints, made offline from tiny random models by the formats' own code: FP8 with
transformers' FP8 quantizer (Fp8Quantize: per-block amax, float8_e4m3fn), compressed-tensors with the
compressed-tensors library's compressor, AWQ and GPTQ with packers checked against independent readers. And
strata's own dequantization of a checkpoint (tests/runtime/strata_dequantize_probe)."""

from __future__ import annotations

import json
import pathlib
import re
import subprocess

import torch

import runtime_helpers as H
from compressed_tensors_config import ct_config  # noqa: F401  (tests/: Q.ct_config for the suites and bench)

# Shapes whose every projection is a whole number of 128 x 128 FP8 blocks (hidden 256, heads of 64, 2 KV heads:
# k/v are [128, 256]); eos/bos None as in runtime_helpers.
_BLOCKS = dict(H._COMMON, hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
               head_dim=64)

CONFIGS = {
    "llama": ("LlamaConfig", dict(_BLOCKS)),
    "qwen3": ("Qwen3Config", dict(_BLOCKS, use_sliding_window=True, sliding_window=6,
                                  layer_types=["full_attention", "sliding_attention", "full_attention",
                                               "sliding_attention"])),
    "qwen3_moe": ("Qwen3MoeConfig", dict(_BLOCKS, moe_intermediate_size=128, num_experts=4, num_experts_per_tok=2,
                                         mlp_only_layers=[2], norm_topk_prob=True)),
    "phi3": ("Phi3Config", dict(_BLOCKS, num_key_value_heads=4)),
    # Not whole 128 x 128 blocks: gate/up [320, 256] (ragged rows), down [256, 320] (ragged columns).
    "llama_ragged": ("LlamaConfig", dict(_BLOCKS, intermediate_size=320)),
    # DeepSeek-V3 as its layers are shaped: kv_a_proj_with_mqa 96 rows (64 latent + 32 RoPE) and q_a_proj 96 rows of
    # 128-row blocks, kv_b_proj 64 columns: partial last blocks, as V3's 576-row kv_a_proj_with_mqa; experts and
    # shared experts of 128.
    "deepseek_v3": ("DeepseekV3Config", dict(
        {k: v for k, v in _BLOCKS.items() if k != "head_dim"}, num_key_value_heads=4, moe_intermediate_size=128, n_routed_experts=8, n_group=4, topk_group=2,
        num_experts_per_tok=2, first_k_dense_replace=1, kv_lora_rank=64, q_lora_rank=96, qk_rope_head_dim=32,
        qk_nope_head_dim=32, v_head_dim=64,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "original_max_position_embeddings": 64, "mscale": 1.0, "mscale_all_dim": 1.0})),
    "gemma3": ("Gemma3TextConfig", dict(_BLOCKS, sliding_window=5, sliding_window_pattern=2, query_pre_attn_scalar=64,
                                        final_logit_softcapping=6.0, tie_word_embeddings=True)),
}


def dense_model(name: str, seed: int = 1):
    """The random float32 model of CONFIGS[name] (runtime_helpers.random_model) the quantized checkpoints start from."""
    import transformers

    config_class, kwargs = CONFIGS[name]
    return H.random_model(getattr(transformers, config_class)(**kwargs), seed)


def saved_dense(directory: pathlib.Path, model) -> dict:
    """The model as save_pretrained writes it (sparse experts one tensor per expert and projection), read back."""
    from safetensors.torch import load_file

    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    return load_file(directory / "model.safetensors")


def linear_weights(model, saved: dict, skip=()) -> list[str]:
    """The checkpoint names of the weights of the model's linear layers (its nn.Linear modules, and each expert's
    projections as saved), minus the modules named in `skip`."""
    names = {module_name + ".weight" for module_name, module in model.named_modules()
             if isinstance(module, torch.nn.Linear) and module_name not in skip}
    names |= {k for k in saved if re.search(r"\.experts\.\d+\.\w+\.weight$", k)}
    return sorted(k for k in names if k in saved)


def fp8_quantizer(block=(128, 128), scale_fmt=None):
    import transformers
    from transformers.integrations.finegrained_fp8 import Fp8Quantize

    class _Quantizer:  # what Fp8Quantize reads of an HfQuantizer
        quantization_config = transformers.utils.quantization_config.FineGrainedFP8Config(
            weight_block_size=list(block), scale_fmt=scale_fmt or "float")

    return Fp8Quantize(_Quantizer())


def quantize_fp8_ragged(weight: torch.Tensor, block=(128, 128), ue8m0: bool = False):
    """The FP8 quantizer's math (per-block amax over the block's elements, scale = 448 / amax, clamp, cast) for
    shapes that are not whole blocks, which Fp8Quantize leaves unquantized: the last blocks are partial. `ue8m0`:
    the inverse scales rounded up to powers of two first, as Fp8Quantize does for scale_fmt ue8m0."""
    rows, cols = weight.shape
    bm, bn = block
    gr, gc = -(-rows // bm), -(-cols // bn)
    padded = torch.zeros(gr * bm, gc * bn)
    padded[:rows, :cols] = weight.float()
    tiles = padded.reshape(gr, bm, gc, bn)
    amax = tiles.abs().amax(dim=(1, 3))
    fp8_max = torch.finfo(torch.float8_e4m3fn).max
    scales = torch.where(amax > 0, fp8_max / torch.where(amax > 0, amax, torch.ones_like(amax)), torch.ones_like(amax))
    inv = (1.0 / scales).float()
    if ue8m0:
        inv = torch.pow(2.0, torch.ceil(torch.log2(inv.clamp(min=torch.finfo(torch.float32).tiny))))
        scales = 1.0 / inv
        inv = inv.to(torch.float8_e8m0fnu)
    q = torch.clamp(tiles * scales[:, None, :, None], -fp8_max, fp8_max).reshape(gr * bm, gc * bn)
    return q[:rows, :cols].to(torch.float8_e4m3fn).contiguous(), inv


def save_quantized(directory: pathlib.Path, model, tensors: dict, quantization_config: dict) -> pathlib.Path:
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(directory)
    config = json.loads((directory / "config.json").read_text())
    config["quantization_config"] = quantization_config
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.contiguous() for k, v in tensors.items()}, directory / "model.safetensors", metadata={"format": "pt"})
    return directory


def make_fp8_checkpoint(directory: pathlib.Path, name: str, scale_dtype=torch.float32, skip=("lm_head",),
                        scale_fmt=None, dense_dtype=torch.float32) -> pathlib.Path:
    """Every nn.Linear but `skip` quantized by transformers' Fp8Quantize with 128 x 128 blocks; the other tensors
    (embeddings, norms, skipped layers) in `dense_dtype`, as the checkpoint's declared dtype (transformers keeps a
    quantized checkpoint's other tensors in their stored dtype)."""
    return quantize_fp8(directory, dense_model(name), scale_dtype, skip, scale_fmt, dense_dtype)


def quantize_fp8(directory: pathlib.Path, model, scale_dtype=torch.float32, skip=("lm_head",), scale_fmt=None,
                 dense_dtype=torch.float32) -> pathlib.Path:
    """make_fp8_checkpoint of a given model (any float32 transformers model: the bench's ~125M Llama)."""
    state = saved_dense(directory, model)
    op = fp8_quantizer(scale_fmt=scale_fmt)
    tensors = {}
    quantized = set(linear_weights(model, state, skip))
    for key, value in state.items():
        if key in quantized:
            scale_key = key.removesuffix(".weight") + ".weight_scale_inv"
            out = op._quantize_one(key, value)
            if len(out) != 2:  # not whole blocks: the same math over partial last blocks
                out = dict(zip((key, scale_key), quantize_fp8_ragged(value, ue8m0=scale_fmt == "ue8m0")))
            if scale_fmt != "ue8m0":
                out[scale_key] = out[scale_key].to(scale_dtype)
            tensors.update(out)
        else:
            tensors[key] = value.to(dense_dtype)
    model.config.dtype = dense_dtype
    config = {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}
    if skip is not None:  # None: absent, and transformers then skips the output embedding by default
        config["modules_to_not_convert"] = list(skip)
    if scale_fmt:
        config["scale_fmt"] = scale_fmt
    return save_quantized(directory, model, tensors, config)


def fp8_dense_reference(checkpoint: pathlib.Path, name: str, directory: pathlib.Path) -> pathlib.Path:
    """A dense model whose quantized layers hold transformers' FP8 dequantization of `checkpoint`
    (_dequantize_fp8_weight with the 128 x 128 block: partial last blocks included, which its loader's
    grid-derived blocks get wrong), saved in `directory`."""
    from safetensors.torch import load_file
    from transformers.integrations.finegrained_fp8 import _dequantize_fp8_weight

    stored = load_file(checkpoint / "model.safetensors")
    model = dense_model(name)

    def dense(key):
        scale = key.removesuffix(".weight") + ".weight_scale_inv"
        if scale in stored:
            return _dequantize_fp8_weight(stored[key], stored[scale], [128, 128], torch.float32)
        return stored[key]

    with torch.no_grad():
        for key, value in model.state_dict().items():
            if key.endswith(".experts.gate_up_proj") or key.endswith(".experts.down_proj"):
                # Fused experts [E, ...], stored one tensor per expert and projection.
                prefix = key.rsplit(".", 1)[0]
                for e in range(value.shape[0]):
                    if key.endswith("gate_up_proj"):
                        value[e].copy_(torch.cat([dense(f"{prefix}.{e}.gate_proj.weight"),
                                                  dense(f"{prefix}.{e}.up_proj.weight")]))
                    else:
                        value[e].copy_(dense(f"{prefix}.{e}.down_proj.weight"))
            elif key in stored:
                value.copy_(dense(key))
    model.save_pretrained(directory, safe_serialization=True)
    return directory


def _converted(model, state: dict, method: str) -> list[str]:
    """The weights AWQ / GPTQ store quantized, as strata's planner picks them (planner/quantized_spec.cc): AWQ every
    nn.Linear but the output embeddings (the AWQ quantizer's default skip), GPTQ the nn.Linear layers inside
    model.layers (optimum's convert_model)."""
    names = linear_weights(model, state, skip=("lm_head",))
    return names if method == "awq" else [k for k in names if k.startswith("model.layers.")]


def _pack_along_last(codes: torch.Tensor, bits: int, order=None) -> torch.Tensor:
    """[R, C] codes in [0, 2^bits) -> int32 [R, C * bits / 32]: code `order[i]` of each run of 32 / bits at bits * i
    (in order when `order` is None)."""
    per_word = 32 // bits
    runs = codes.to(torch.int64).reshape(codes.shape[0], -1, per_word)
    if order is not None:
        runs = runs[:, :, order]
    shifts = torch.arange(0, 32, bits, dtype=torch.int64)
    words = (runs << shifts).sum(-1)
    return torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)


# AutoAWQ's GEMM packing order: nibble i of a word holds column AWQ_ORDER[i] of its run of 8.
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def awq_quantize(weight: torch.Tensor, group_size: int):
    """Round-to-nearest with AutoAWQ's asymmetric min/max (pseudo_quantize_tensor, zero_point=True) per group of
    `group_size` along K, scales rounded to float16 before the codes are taken from them: (codes [N, K],
    zeros [N, K/g] in [0, 15], float16 scales [N, K/g])."""
    n, k = weight.shape
    tiles = weight.float().reshape(n, k // group_size, group_size)
    low, high = tiles.amin(-1), tiles.amax(-1)
    scales = ((high - low).clamp(min=1e-5) / 15).half()
    zeros = (-torch.round(low / scales.float())).clamp(0, 15)
    codes = (torch.round(tiles / scales.float()[..., None]) + zeros[..., None]).clamp(0, 15)
    return codes.reshape(n, k).to(torch.int32), zeros.to(torch.int32), scales


def gptq_quantize(weight: torch.Tensor, bits: int, group_size: int, sym: bool, perm=None):
    """Round-to-nearest with GPTQ's quantizer (Quantizer.find_params: the range widened to hold 0, symmetric zero
    (maxq + 1) / 2) per group of `group_size` columns; with `perm` (act-order) group i // g holds columns
    perm[i], so g_idx[perm[i]] = i // g. GPTQ v1 stores zero - 1, so the zeros are kept in [1, maxq] (a zero of 0
    is not storable there). Returns (codes [N, K], zeros [N, G], float16 scales [N, G], g_idx [K])."""
    n, k = weight.shape
    maxq = 2 ** bits - 1
    perm = torch.arange(k) if perm is None else perm
    tiles = weight.float()[:, perm].reshape(n, k // group_size, group_size)
    low = tiles.amin(-1).clamp(max=0)
    high = tiles.amax(-1).clamp(min=0)
    if sym:
        high = torch.maximum(low.abs(), high)
        low = -high
    scales = ((high - low).clamp(min=1e-5) / maxq).half()
    if sym:
        zeros = torch.full_like(low, (maxq + 1) // 2)
    else:
        zeros = torch.round(-low / scales.float()).clamp(1, maxq)
    permuted = (torch.round(tiles / scales.float()[..., None]) + zeros[..., None]).clamp(0, maxq).reshape(n, k)
    codes = torch.empty_like(permuted)
    codes[:, perm] = permuted
    g_idx = torch.empty(k, dtype=torch.int32)
    g_idx[perm] = (torch.arange(k) // group_size).to(torch.int32)
    return codes.to(torch.int32), zeros.to(torch.int32), scales, g_idx


def int_dequantized(codes, zeros, scales, g_idx) -> torch.Tensor:
    """(q - z) * s as AutoAWQ's and GPTQ's readers compute it: the product in float16. [N, K] float16."""
    g = g_idx.long()
    return (codes - zeros[:, g]).half() * scales[:, g]


def awq_pack(codes, zeros, scales) -> dict:
    """AutoAWQ's GEMM layout (WQLinear_GEMM): qweight int32 [K, N / 8] and qzeros int32 [K / g, N / 8] packed along N
    in AWQ_ORDER, scales float16 [K / g, N]."""
    return {"qweight": _pack_along_last(codes.t(), 4, AWQ_ORDER), "qzeros": _pack_along_last(zeros.t(), 4, AWQ_ORDER),
            "scales": scales.t().contiguous()}


def gptq_pack(codes, zeros, scales, g_idx, bits: int) -> dict:
    """GPTQ v1 (AutoGPTQ's QuantLinear.pack): qweight int32 [K * bits / 32, N] packed along K, qzeros int32
    [G, N * bits / 32] packed along N holding zero - 1, scales float16 [G, N], g_idx int32 [K]."""
    return {"qweight": _pack_along_last(codes, bits).t().contiguous(),
            "qzeros": _pack_along_last(zeros.t() - 1, bits), "scales": scales.t().contiguous(), "g_idx": g_idx}


def _make_int_checkpoint(directory, name, method, quantize, pack, config, dense_dtype):
    model = dense_model(name)
    state = saved_dense(directory, model)
    tensors, expected = {}, {}
    converted = set(_converted(model, state, method))
    for key, value in state.items():
        if key not in converted:
            tensors[key] = value.to(dense_dtype)
            continue
        parts = quantize(key, value)
        expected[key] = int_dequantized(*parts)
        module = key.removesuffix(".weight")
        tensors.update({f"{module}.{k}": v for k, v in pack(*parts).items()})
    model.config.dtype = dense_dtype
    save_quantized(directory, model, tensors, config)
    # What the checkpoint's weights mean, for the tests: float16 (q - z) * s per converted weight.
    from safetensors.torch import save_file

    save_file(expected, directory / "expected-dequantized.safetensors")
    return directory


def make_awq_checkpoint(directory: pathlib.Path, name: str, group_size: int = 128,
                        dense_dtype=torch.float32) -> pathlib.Path:
    """AutoAWQ's GEMM checkpoint of the model: every nn.Linear but lm_head rounded to nearest (awq_quantize),
    packed as WQLinear_GEMM stores it, config as AutoAWQ writes it (to_transformers_dict). Beside it,
    expected-dequantized.safetensors: each converted weight's float16 (q - z) * s."""
    config = {"quant_method": "awq", "zero_point": True, "group_size": group_size, "bits": 4, "version": "gemm",
              "modules_to_not_convert": None}

    def quantize(key, value):
        codes, zeros, scales = awq_quantize(value, group_size)
        return codes, zeros, scales, (torch.arange(value.shape[1]) // group_size).to(torch.int32)

    return _make_int_checkpoint(directory, name, "awq", quantize, lambda c, z, s, g: awq_pack(c, z, s), config,
                                dense_dtype)


def make_gptq_checkpoint(directory: pathlib.Path, name: str, bits: int = 4, group_size: int = 128,
                         desc_act: bool = False, sym: bool = True, dense_dtype=torch.float32,
                         seed: int = 3) -> pathlib.Path:
    """A GPTQ v1 checkpoint of the model: the nn.Linear layers of model.layers rounded to nearest (gptq_quantize;
    with desc_act each layer's columns in a random act-order), packed as AutoGPTQ's QuantLinear stores them,
    config as AutoGPTQ's BaseQuantizeConfig writes it. Beside it, expected-dequantized.safetensors."""
    config = {"bits": bits, "group_size": group_size, "damp_percent": 0.01, "desc_act": desc_act,
              "static_groups": False, "sym": sym, "true_sequential": True, "model_name_or_path": None,
              "model_file_base_name": "model", "quant_method": "gptq", "checkpoint_format": "gptq"}
    generator = torch.Generator().manual_seed(seed)

    def quantize(key, value):
        perm = torch.randperm(value.shape[1], generator=generator) if desc_act else None
        return gptq_quantize(value, bits, group_size, sym, perm)

    return _make_int_checkpoint(directory, name, "gptq", quantize, lambda c, z, s, g: gptq_pack(c, z, s, g, bits),
                                config, dense_dtype)


def _oracle_module(package: str, relative: str):
    """One pure-Python file of an installed package, loaded by path: the package's __init__ (AutoAWQ's model
    registry, AutoGPTQ's CUDA modules) is never run. The packages are test oracles of scripts/requirements.txt."""
    import importlib.util

    found = importlib.util.find_spec(package)
    assert found is not None, f"{package} is not installed (pip install -r scripts/requirements.txt): a test oracle"
    path = pathlib.Path(found.submodule_search_locations[0]) / relative
    spec = importlib.util.spec_from_file_location(f"_oracle_{package}_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reader_dequantized(checkpoint: pathlib.Path) -> dict:
    """Every AWQ / GPTQ layer of the checkpoint dequantized by the formats' own readers, by the dense weight's name
    ([N, K] float16, the columns in the checkpoint's order): AutoAWQ's dequantize_gemm (awq/utils/packing_utils.py)
    and AutoGPTQ's QuantLinear (nn_modules/qlinear/qlinear_cuda.py: its CPU forward unpacks qweight and qzeros,
    adds v1's one and gathers scales and zeros by g_idx) applied to an identity matrix, which returns its weight."""
    from safetensors.torch import load_file

    config = json.loads((checkpoint / "config.json").read_text())["quantization_config"]
    tensors = load_file(checkpoint / "model.safetensors")
    bits, group = config["bits"], config["group_size"]
    out = {}
    if config["quant_method"] == "awq":
        awq = _oracle_module("awq", "utils/packing_utils.py")
        for key in (k for k in tensors if k.endswith(".qweight")):
            m = key.removesuffix(".qweight")
            w = awq.dequantize_gemm(tensors[key], tensors[m + ".qzeros"], tensors[m + ".scales"], bits, group)
            out[m + ".weight"] = w.t().contiguous()
        return out
    gptq = _oracle_module("auto_gptq", "nn_modules/qlinear/qlinear_cuda.py")
    for key in (k for k in tensors if k.endswith(".qweight")):
        m = key.removesuffix(".qweight")
        n, k = tensors[m + ".scales"].shape[1], tensors[m + ".g_idx"].shape[0]
        layer = gptq.QuantLinear(bits, group, k, n, bias=False)
        layer.load_state_dict({p: tensors[f"{m}.{p}"] for p in ("qweight", "qzeros", "scales", "g_idx")})
        with torch.no_grad():
            out[m + ".weight"] = layer(torch.eye(k, dtype=torch.float16)).t().contiguous()
    return out


def save_dense_with(directory: pathlib.Path, name: str, weights: dict, dtype=torch.float32) -> pathlib.Path:
    """The dense model of `name` as save_pretrained writes it (sparse experts one tensor per expert and projection,
    the layout of the published checkpoints, which transformers fuses at load), in `dtype`, with `weights` (by
    their saved names) in place of its own."""
    from safetensors.torch import save_file

    model = dense_model(name).to(dtype)
    state = saved_dense(directory, model)
    for key, value in weights.items():
        assert key in state, key
        state[key] = value.to(dtype)
    save_file(state, directory / "model.safetensors", metadata={"format": "pt"})
    return directory


def split_experts(model):
    """`model` with each fused experts module (transformers 5's gate_up_proj [E, 2I, H], down_proj [E, H, I]) replaced
    by one module per expert holding nn.Linear gate_proj / up_proj / down_proj: the modules the published
    compressed-tensors MoE checkpoints were quantized from (transformers 4's experts), so the library's compressor
    quantizes and names each expert's projections as those checkpoints store them
    (model.layers.N.mlp.experts.E.gate_proj.weight_packed). The model is for its state dict only."""
    for name, module in list(model.named_modules()):
        gate_up, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
        if not isinstance(gate_up, torch.nn.Parameter) or gate_up.dim() != 3:
            continue
        experts, inter = gate_up.shape[0], down.shape[-1]
        per_expert = torch.nn.ModuleList()
        for e in range(experts):
            one = torch.nn.Module()
            for part, weight in (("gate_proj", gate_up[e, :inter]), ("up_proj", gate_up[e, inter:]),
                                 ("down_proj", down[e])):
                linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False, dtype=weight.dtype)
                with torch.no_grad():
                    linear.weight.copy_(weight)
                one.add_module(part, linear)
            per_expert.append(one)
        parent, _, leaf = name.rpartition(".")
        model.get_submodule(parent).add_module(leaf, per_expert)
    return model


def probe_path() -> pathlib.Path:
    return H.build_dir() / "tests" / "runtime" / "strata_dequantize_probe"


def strata_dequantized(checkpoint: pathlib.Path, dtype: str, path: str = "kernels") -> dict:
    """strata's dequantization of every quantized layer (kernels/quantized.h, or the ATen ops a GPU runs)."""
    from safetensors.torch import load_file

    out = checkpoint / f"strata-dequantized-{dtype}-{path}.safetensors"
    proc = subprocess.run([str(probe_path()), str(checkpoint), str(out), dtype, path], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    return load_file(out)


def strata_mxfp4_dequantized(directory: pathlib.Path, dtype: str, path: str = "kernels", unchecked: bool = False,
                             check: bool = True):
    """strata's dequantization of every MXFP4 projection (`X_blocks` [E, N, K / 32, 16] with `X_scales`) in a
    directory, each expert through runtime::Mxfp4Linear (or without its checks: `unchecked`), as {X: [E, N, K]};
    with check=False the probe's CompletedProcess (a refused tensor exits 2)."""
    from safetensors.torch import load_file

    out = directory / f"strata-mxfp4-{dtype}-{path}{'-unchecked' if unchecked else ''}.safetensors"
    args = [str(probe_path()), "mxfp4", str(directory), str(out), dtype, path] + (["unchecked"] if unchecked else [])
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300)
    if not check:
        return proc
    assert proc.returncode == 0, proc.stderr
    return load_file(out)




def make_ct_checkpoint(directory: pathlib.Path, name: str, config: dict, dense_dtype=torch.float32) -> pathlib.Path:
    """The model quantized and compressed by the compressed-tensors library itself: its quantization config applied
    to the model, each layer's scale and zero point from its min/max observer values (calculate_qparams), then
    ModelCompressor's compress_model (pack-quantized: weight_packed, weight_scale, weight_zero_point, weight_shape;
    float-quantized: FP8 weight and weight_scale)."""
    return quantize_ct(directory, split_experts(dense_model(name).to(dense_dtype)), config, dense_dtype,
                       reference=name)


def quantize_ct(directory: pathlib.Path, model, config: dict, dense_dtype=torch.float32, reference=None) -> pathlib.Path:
    """make_ct_checkpoint of a given model (quantized in place); `reference`, the CONFIGS name of the model, asks for
    the library's decompression of it beside the checkpoint (ct_dense_reference), none without it."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, QuantizationStatus, apply_quantization_config
    from compressed_tensors.quantization.utils import calculate_qparams

    qconfig = QuantizationConfig.model_validate(dict(config, quantization_status="initialized"))
    apply_quantization_config(model, qconfig)
    with torch.no_grad():
        for module in model.modules():
            scheme = getattr(module, "quantization_scheme", None)
            if scheme is None or scheme.weights is None:
                continue
            args = scheme.weights
            w = module.weight.float()
            strategy = str(args.strategy.value if hasattr(args.strategy, "value") else args.strategy)
            if strategy == "group":
                tiles = w.reshape(w.shape[0], -1, args.group_size)
                low, high = tiles.amin(-1), tiles.amax(-1)
            elif strategy == "channel":
                low, high = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
            elif strategy == "tensor":
                low, high = w.amin().reshape(1), w.amax().reshape(1)
            else:
                raise ValueError(strategy)
            scale, zero = calculate_qparams(low, high, args)
            module.weight_scale.data = scale.to(module.weight_scale.dtype).reshape(module.weight_scale.shape)
            if hasattr(module, "weight_zero_point") and module.weight_zero_point is not None:
                module.weight_zero_point.data = zero.to(module.weight_zero_point.dtype).reshape(
                    module.weight_zero_point.shape)
            module.quantization_status = QuantizationStatus.FROZEN
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format=config["format"])
    compressor.compress_model(model)
    tensors = dict(model.state_dict())
    if model.config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    model.config.dtype = dense_dtype
    directory.mkdir(parents=True, exist_ok=True)
    save_quantized(directory, model, tensors, config)
    compressor.update_config(str(directory))
    if reference is None:
        return directory
    # The library's own decompression of the same layers, in a plain dense model beside the checkpoint
    # (ct_dense_reference): the reference of schemes transformers cannot load (packed asymmetric zero points) and
    # of weight-only generation (transformers runs FP8-dynamic's activations through FP8 too).
    compressor.decompress_model(model)
    decompressed = model.state_dict()
    weights = {k: v for k, v in decompressed.items()
               if k.endswith(".weight") and not (k == "lm_head.weight" and model.config.tie_word_embeddings)}
    save_dense_with(ct_dense_reference(directory), reference, weights, dense_dtype)
    return directory


def ct_dense_reference(checkpoint: pathlib.Path) -> pathlib.Path:
    """The dense model make_ct_checkpoint saved beside `checkpoint`: its weights decompressed by compressed-tensors."""
    return checkpoint.with_name(checkpoint.name + "-dense")


def assert_same_greedy(reference: list[dict], results: list[dict], tolerance: float, what: str = "") -> None:
    """strata-generate's results against reference_generate's: the same greedy ids for every prompt and every
    logprob within `tolerance`."""
    assert len(results) == len(reference)
    for i, (ref, res) in enumerate(zip(reference, results)):
        assert res["ids"] == ref["ids"], f"{what}prompt {i}: ids differ"
        worst = max(abs(a - b) for a, b in zip(ref["logprobs"], res["logprobs"]))
        assert worst <= tolerance, f"{what}prompt {i}: logprob differs by {worst}"
