"""Shared pieces of the planner parity tests: real model configurations, size-relative max_memory
layouts, transformers' own placement (the reference) and the strata-plan CLI runner."""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import os
import pathlib
import subprocess
import sys
from unittest import mock

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))

import export_module_tree  # noqa: E402  (tools/export_module_tree.py)

STRATEGIES = ["auto", "balanced", "balanced_low_0", "sequential"]
DTYPES = ["float16", "bfloat16", "float32"]

# Hyperparameters copied from the public config.json of each checkpoint (only the fields that shape
# the module tree or that transformers reads while building it; all the rest are library defaults).
_LLAMA3_ROPE_8 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192, "rope_type": "llama3"}
_LLAMA3_ROPE_32 = dict(_LLAMA3_ROPE_8, factor=32.0)

CONFIGS: dict[str, dict] = {
    "Llama-2-7B": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 32, "vocab_size": 32000, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
        "torch_dtype": "float16",
    },
    "Llama-3-8B": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0, "tie_word_embeddings": False, "bos_token_id": 128000, "eos_token_id": 128001,
        "torch_dtype": "bfloat16",
    },
    "Llama-3.1-70B": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
        "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0, "rope_scaling": _LLAMA3_ROPE_8, "tie_word_embeddings": False,
        "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "torch_dtype": "bfloat16",
    },
    "Llama-3.2-1B": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256, "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "rope_scaling": _LLAMA3_ROPE_32,
        "tie_word_embeddings": True, "bos_token_id": 128000, "eos_token_id": 128001, "torch_dtype": "bfloat16",
    },
    "Mistral-7B-v0.1": {
        "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_act": "silu",
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "vocab_size": 32000, "max_position_embeddings": 32768, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": False, "bos_token_id": 1,
        "eos_token_id": 2, "torch_dtype": "bfloat16",
    },
    "Qwen2-0.5B": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
        "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
        "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 131072, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "sliding_window": 131072, "max_window_layers": 24, "use_sliding_window": False,
        "tie_word_embeddings": True, "bos_token_id": 151643, "eos_token_id": 151643, "torch_dtype": "bfloat16",
    },
    "Qwen2-1.5B": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
        "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
        "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 131072, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "sliding_window": 131072, "max_window_layers": 28, "use_sliding_window": False,
        "tie_word_embeddings": True, "bos_token_id": 151643, "eos_token_id": 151643, "torch_dtype": "bfloat16",
    },
    "Qwen2-7B": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
        "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
        "num_key_value_heads": 4, "vocab_size": 152064, "max_position_embeddings": 131072, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "sliding_window": 131072, "max_window_layers": 28, "use_sliding_window": False,
        "tie_word_embeddings": False, "bos_token_id": 151643, "eos_token_id": 151643, "torch_dtype": "bfloat16",
    },
    "SmolLM-135M": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
        "num_key_value_heads": 3, "vocab_size": 49152, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "tie_word_embeddings": True, "bos_token_id": 0, "eos_token_id": 0,
        "torch_dtype": "float32",
    },
    "TinyLlama-1.1B": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22, "num_attention_heads": 32,
        "num_key_value_heads": 4, "vocab_size": 32000, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
        "torch_dtype": "bfloat16",
    },
}

# The Llama-3.1-405B configuration (bench/plan_speed.py).
LLAMA_405B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
    "hidden_size": 16384, "intermediate_size": 53248, "num_hidden_layers": 126, "num_attention_heads": 128,
    "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0, "rope_scaling": _LLAMA3_ROPE_8, "tie_word_embeddings": False,
    "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "torch_dtype": "bfloat16",
}
ALL_CONFIGS = {**CONFIGS, "Llama-3.1-405B": LLAMA_405B}


# max_memory layouts, relative to the model's total size S (parameters + buffers, tied weights counted
# once: transformers' compute_module_sizes(model)[""]) in the dtype under test, and to its largest
# layer L (the biggest no-split block or leaf module: what transformers keeps free on GPU 0 and the CPU
# for offloaded layers), so that each layout has the same character for every model and dtype, even
# for small tied models whose embedding is a quarter of the model. GPUs are int keys, as transformers
# takes them. Each value: (fraction of S, multiple of L).
def _layout(**parts):
    def make(size: int, largest: int) -> dict:
        out = {}
        for key, (frac, n_largest) in parts.items():
            dev = int(key[1:]) if key.startswith("g") else key
            out[dev] = int(frac * size) + n_largest * largest
        return out
    return make


LAYOUTS = {
    # Both GPUs together hold everything with room to spare: no offload (balanced_low_0 still keeps
    # GPU 0 nearly empty, so it offloads what GPU 1 cannot take: that is transformers' behaviour).
    "fits_2gpu": _layout(g0=(0.8, 0), g1=(0.8, 0), cpu=(2.0, 0)),
    # Four GPUs of different sizes; together they hold the model, none alone does.
    "uneven_4gpu": _layout(g0=(0.45, 0), g1=(0.3, 0), g2=(0.5, 0), g3=(0.4, 0), cpu=(2.0, 0)),
    # GPUs hold about half: the rest is offloaded to the CPU (which is big enough).
    "cpu_offload": _layout(g0=(0.3, 1), g1=(0.25, 0), cpu=(2.0, 0)),
    # GPUs and CPU together are too small: part of the model goes to disk.
    "disk_offload": _layout(g0=(0.15, 1), g1=(0.15, 0), cpu=(0.1, 1), disk=(4.0, 0)),
    # No GPU at all: everything on the CPU ({"": "cpu"}).
    "cpu_only": _layout(cpu=(2.0, 0)),
    # GPU 0 is almost full already (smaller than the largest layer); GPUs 1 and 2 take the model.
    "tiny_gpu0": _layout(g0=(0.01, 0), g1=(0.7, 0), g2=(0.7, 0), cpu=(2.0, 0)),
}

# What each layout must produce in transformers' map for strategy "auto" (harness self-check):
# the set of device kinds used ("gpu", "cpu", "disk"), and the GPUs that must not be used.
LAYOUT_CHARACTER = {
    "fits_2gpu": ({"gpu"}, set()),
    "uneven_4gpu": ({"gpu"}, set()),
    "cpu_offload": ({"gpu", "cpu"}, set()),
    "disk_offload": ({"gpu", "cpu", "disk"}, set()),
    "cpu_only": ({"cpu"}, set()),
    "tiny_gpu0": ({"gpu"}, {0}),
}


def largest_layer(model) -> int:
    """transformers' 'largest layer' L: max(biggest no-split module, biggest leaf module)."""
    from transformers.integrations.accelerate import compute_module_sizes

    sizes, leaves = compute_module_sizes(model)
    no_split = set(model._no_split_modules or [])
    blocks = [sizes[n] for n, m in model.named_modules() if type(m).__name__ in no_split]
    return max(blocks + list(leaves.values()) + [0])


def layout_for(model, layout: str) -> dict:
    return LAYOUTS[layout](model_size(model), largest_layer(model))


def num_gpus(max_memory: dict) -> int:
    return sum(1 for k in max_memory if isinstance(k, int))


@contextlib.contextmanager
def stub_accelerators(n_gpus: int):
    """What 'stub its GPU memory queries' means here. On a GPU-less machine torch.cuda.is_available()
    is False, so transformers' get_max_memory adds zero reserved-but-unallocated memory and the GPU
    budgets are exactly the max_memory given. We pin is_available() to False (so a machine that does
    have a GPU computes the same reference) and make torch.cuda.device_count() report the layout's GPU
    count, so accelerate's get_max_memory does not warn that GPU i "is not available"."""
    import torch

    with mock.patch.object(torch.cuda, "is_available", lambda: False), \
         mock.patch.object(torch.cuda, "device_count", lambda: n_gpus):
        yield


@contextlib.contextmanager
def stub_machine(gpus_free: list[int], host_available: int):
    """A machine whose CUDA devices have `gpus_free` bytes free (and as many in total) and whose host
    has `host_available` bytes available, as the installed transformers/accelerate see it when
    from_pretrained gets no max_memory: accelerate's get_max_memory(None) probes each device with a
    tiny tensor (made harmless here), reads torch.cuda.mem_get_info(i)[0] and
    get_device_properties(i).is_integrated, and psutil.virtual_memory().available; transformers'
    wrapper adds torch.cuda.memory_reserved(i) - memory_allocated(i) (zero: a fresh process). Every
    other accelerator (npu, mlu, sdaa, musa, xpu, hpu, mps) is absent, as on a CUDA host."""
    import types

    import accelerate.utils.modeling as accelerate_modeling
    import psutil
    import torch
    import transformers.integrations.accelerate as hf_accelerate

    n = len(gpus_free)
    real_tensor = torch.tensor

    def tensor(*args, device=None, **kwargs):  # the probe torch.tensor([0], device=i)
        if isinstance(device, int):
            assert 0 <= device < n, device
            return real_tensor(*args, **kwargs)
        return real_tensor(*args, device=device, **kwargs)

    def mem_get_info(i):
        return gpus_free[i], gpus_free[i]

    real_vm = psutil.virtual_memory()
    with contextlib.ExitStack() as stack:
        patch = lambda target, name, value: stack.enter_context(mock.patch.object(target, name, value))
        for name in ["is_npu_available", "is_mlu_available", "is_sdaa_available", "is_musa_available",
                     "is_xpu_available", "is_hpu_available", "is_mps_available"]:
            patch(accelerate_modeling, name, lambda *a, **k: False)
        patch(hf_accelerate, "is_torch_xpu_available", lambda *a, **k: False)
        patch(torch, "tensor", tensor)
        patch(torch.cuda, "is_available", lambda: True)
        patch(torch.cuda, "device_count", lambda: n)
        patch(torch.cuda, "mem_get_info", mem_get_info)
        patch(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(is_integrated=False))
        patch(torch.cuda, "memory_reserved", lambda i=None: 0)
        patch(torch.cuda, "memory_allocated", lambda i=None: 0)
        patch(psutil, "virtual_memory", lambda: real_vm._replace(available=host_available))
        yield


def reference_default_placement(model, strategy: str, gpus_free: list[int], host_available: int):
    """transformers' from_pretrained placement with NO max_memory on the stubbed machine:
    (device map in hf_device_map JSON form, the max_memory infer_auto_device_map was given)."""
    import transformers.integrations.accelerate as hf_accelerate

    seen = {}
    real_infer = hf_accelerate.infer_auto_device_map

    def infer(model, max_memory=None, **kwargs):
        seen["max_memory"] = dict(max_memory)
        return real_infer(model, max_memory=max_memory, **kwargs)

    with stub_machine(gpus_free, host_available), mock.patch.object(hf_accelerate, "infer_auto_device_map", infer):
        dm = hf_accelerate._get_device_map(model, strategy, None, None)
    return {k: normalise_device(v) for k, v in dm.items()}, seen["max_memory"]


def inventory_arg(gpus_free: list[int], host_available: int) -> str:
    """[100, 200], 300 -> "0=100,1=200,cpu=300" (strata-plan --inventory)."""
    return ",".join([f"{i}={int(b)}" for i, b in enumerate(gpus_free)] + [f"cpu={int(host_available)}"])


@functools.lru_cache(maxsize=None)
def meta_model(name: str, dtype: str):
    """The model as from_pretrained builds it before placing it: on the meta device, in `dtype`."""
    from transformers import AutoConfig

    config = AutoConfig.for_model(**copy.deepcopy(ALL_CONFIGS[name]))
    return export_module_tree.build_meta_model(config, dtype)


def model_size(model) -> int:
    from transformers.integrations.accelerate import compute_module_sizes

    return compute_module_sizes(model)[0][""]


def reference_device_map(model, strategy: str, max_memory: dict) -> dict:
    """transformers' own from_pretrained placement (transformers.integrations.accelerate._get_device_map),
    values normalised to hf_device_map JSON form: ints for GPUs, "cpu", "disk"."""
    from transformers.integrations.accelerate import _get_device_map

    with stub_accelerators(num_gpus(max_memory)):
        dm = _get_device_map(model, strategy, copy.deepcopy(max_memory), None)
    return {k: normalise_device(v) for k, v in dm.items()}


def normalise_device(v):
    if isinstance(v, bool):
        raise TypeError(f"bad device {v!r}")
    if isinstance(v, int):
        return v
    s = str(v)
    if s in ("cpu", "disk"):
        return s
    if s.startswith("cuda:"):
        return int(s[5:])
    if s.isdigit():
        return int(s)
    raise ValueError(f"unexpected device {v!r}")


def max_memory_arg(max_memory: dict) -> str:
    """{0: 123, "cpu": 789} -> "0=123,cpu=789" (plain byte integers, GPUs first as given)."""
    return ",".join(f"{k}={int(v)}" for k, v in max_memory.items())


def write_checkpoint_dir(directory: pathlib.Path, config: dict) -> pathlib.Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return directory


def build_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("STRATA_BUILD_DIR", REPO / "build"))


def strata_plan_path() -> pathlib.Path:
    return build_dir() / "planner" / "strata-plan"


def run_strata_plan(binary, *args, expect_rc: int = 0, timeout: float = 120) -> subprocess.CompletedProcess:
    cmd = [str(binary), *[str(a) for a in args]]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != expect_rc:
        raise AssertionError(
            f"{' '.join(cmd)}\nexited {proc.returncode} (expected {expect_rc})\n"
            f"stderr:\n{proc.stderr[-4000:]}\nstdout:\n{proc.stdout[-2000:]}")
    return proc


def strata_plan_json(binary, *args) -> dict:
    proc = run_strata_plan(binary, *args, "--json")
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError as e:
        raise AssertionError(f"strata-plan --json printed invalid JSON ({e}):\n{proc.stdout[:2000]}") from None


def map_diff(expected: dict, actual: dict) -> str:
    """A readable diff of two device maps (content only)."""
    lines = []
    for k in expected:
        if k not in actual:
            lines.append(f"  missing in strata: {k!r}: {expected[k]!r}")
        elif actual[k] != expected[k]:
            lines.append(f"  {k!r}: transformers {expected[k]!r} != strata {actual[k]!r}")
    for k in actual:
        if k not in expected:
            lines.append(f"  extra in strata:   {k!r}: {actual[k]!r}")
    return "\n".join(lines)


def definition_order_names(model) -> list[str]:
    """Every module, parameter and buffer name in the order transformers' placement walks them
    (direct parameters, then children recursively, then direct buffers): module definition order."""
    out: list[str] = []

    def walk(module, prefix: str):
        for n, _ in module.named_parameters(recurse=False):
            out.append(prefix + n)
        for n, child in module.named_children():
            out.append(prefix + n)
            walk(child, prefix + n + ".")
        for n, _ in module.named_buffers(recurse=False):
            out.append(prefix + n)

    out.append("")
    walk(model, "")
    return out
