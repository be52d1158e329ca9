"""A stand-in for gptqmodel, which transformers' AWQ and GPTQ quantizers (and optimum's GPTQQuantizer) need but
which does not install on a CPU-only machine without replacing much of the virtualenv (an sdist requiring
torchao, datasets, pyarrow, protobuf >= 7, ...).

Only what the quantizers call before weights load is provided: hf_select_quant_linear_v2 returns a QuantLinear
that registers the buffers gptqmodel 7.7.0's base classes register on the meta device
(nn_modules/qlinear/__init__.py: AWQuantLinear and GPTQQuantLinear._register_gptq_buffers with
register_buffers=True, pack_dtype int32, float16 scales and bias). Everything else that decides the placement
-- which modules transformers / optimum replace, the skip lists, the sizes accelerate counts, _get_device_map --
runs as installed. Backend-specific extras (TorchQuantLinear's 64-byte non-persistent wf_unsqueeze_* buffers,
Marlin workspaces) are not reproduced."""

from __future__ import annotations

import contextlib
import importlib.machinery
import enum
import math
import sys
import types
from unittest import mock


class METHOD(str, enum.Enum):
    GPTQ = "gptq"
    AWQ = "awq"


def _quant_linear_classes():
    import torch
    from torch import nn

    class AwqQuantLinear(nn.Module):
        """AWQuantLinear(register_buffers=True)."""

        def __init__(self, bits, group_size, sym, desc_act, in_features, out_features, bias=False,
                     register_buffers=False, **kwargs):
            super().__init__()
            self.bits, self.group_size = bits, group_size if group_size != -1 else in_features
            self.in_features, self.out_features = in_features, out_features
            if register_buffers:
                packed = math.ceil(out_features * bits / 32)
                self.register_buffer("qweight", torch.zeros((in_features, packed), dtype=torch.int32))
                self.register_buffer("qzeros", torch.zeros((in_features // self.group_size, packed), dtype=torch.int32))
                self.register_buffer("scales", torch.zeros((in_features // self.group_size, out_features),
                                                           dtype=torch.float16))
                if bias:
                    self.register_buffer("bias", torch.zeros(out_features, dtype=torch.float16))
                else:
                    self.bias = None

    class GptqQuantLinear(nn.Module):
        """GPTQQuantLinear._register_gptq_buffers (TorchQuantLinear registers buffers by default)."""

        def __init__(self, bits, group_size, desc_act, sym, in_features, out_features, bias=False,
                     register_buffers=True, **kwargs):
            super().__init__()
            self.bits, self.group_size = bits, group_size if group_size != -1 else in_features
            self.in_features, self.out_features = in_features, out_features
            groups = math.ceil(in_features / self.group_size)
            self.register_buffer("qweight", torch.zeros((math.ceil(in_features * bits / 32), out_features),
                                                        dtype=torch.int32))
            self.register_buffer("qzeros", torch.zeros((groups, math.ceil(out_features * bits / 32)),
                                                       dtype=torch.int32))
            self.register_buffer("scales", torch.zeros((groups, out_features), dtype=torch.float16))
            self.register_buffer("g_idx", torch.tensor([i // self.group_size for i in range(in_features)],
                                                       dtype=torch.int32))
            if bias:
                self.register_buffer("bias", torch.zeros(out_features, dtype=torch.float16))
            else:
                self.bias = None

    return AwqQuantLinear, GptqQuantLinear


def _scaled_activation_class():
    """gptqmodel.quantization.awq.modules.act.ScaledActivation (for AWQ_SCALES_MAPPINGS' model types)."""
    from torch import nn

    class ScaledActivation(nn.Module):
        def __init__(self, module, scales):
            super().__init__()
            self.act = module
            self.scales = nn.Parameter(scales.data)

    return ScaledActivation


@contextlib.contextmanager
def installed():
    """gptqmodel importable (these modules only) and reported available to transformers and optimum."""
    awq, gptq = _quant_linear_classes()

    def select(quant_method=None, **kwargs):
        return awq if str(getattr(quant_method, "value", quant_method)) == "awq" else gptq

    modules = {name: types.ModuleType(name) for name in [
        "gptqmodel", "gptqmodel.quantization", "gptqmodel.utils", "gptqmodel.utils.importer",
        "gptqmodel.utils.model", "gptqmodel.version", "gptqmodel.quantization.awq", "gptqmodel.quantization.awq.modules",
        "gptqmodel.quantization.awq.modules.act"]}
    for name, module in modules.items():
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    modules["gptqmodel.quantization"].METHOD = METHOD
    modules["gptqmodel.quantization.awq.modules.act"].ScaledActivation = _scaled_activation_class()
    modules["gptqmodel.quantization"].FORMAT = lambda value: value
    modules["gptqmodel.quantization"].GPTQ = types.SimpleNamespace()
    modules["gptqmodel.utils.importer"].hf_select_quant_linear_v2 = select
    for name in ["hf_convert_gptq_v1_to_v2_format", "hf_convert_gptq_v2_to_v1_format", "hf_gptqmodel_post_init"]:
        setattr(modules["gptqmodel.utils.model"], name, lambda *a, **k: None)
    modules["gptqmodel.version"].__version__ = "7.7.0"
    modules["gptqmodel"].BACKEND = types.SimpleNamespace()
    modules["gptqmodel"].QuantizeConfig = lambda **kwargs: types.SimpleNamespace(**kwargs)
    with contextlib.ExitStack() as stack:
        # Only the stub's own entries come and go (patch.dict would also drop every module imported meanwhile,
        # and torch's operator libraries cannot be imported twice).
        added = [name for name in modules if name not in sys.modules]
        sys.modules.update({name: modules[name] for name in added})
        stack.callback(lambda: [sys.modules.pop(name, None) for name in added])
        import transformers.quantizers.quantizer_awq as awq_quantizer
        import transformers.quantizers.quantizer_gptq as gptq_quantizer

        stack.enter_context(mock.patch.object(awq_quantizer, "is_gptqmodel_available", lambda: True))
        stack.enter_context(mock.patch.object(gptq_quantizer, "is_gptqmodel_available", lambda: True))
        real_version = gptq_quantizer.metadata.version  # importlib.metadata's, shared by every module
        stack.enter_context(mock.patch.object(gptq_quantizer.metadata, "version",
                                              lambda name: "7.7.0" if name == "gptqmodel" else real_version(name)))
        import optimum.gptq.quantizer as optimum_quantizer
        import optimum.utils as optimum_utils

        stack.enter_context(mock.patch.object(optimum_utils, "is_gptqmodel_available", lambda: True))
        stack.enter_context(mock.patch.object(optimum_quantizer, "is_gptqmodel_available", lambda: True))
        for name in ["hf_select_quant_linear_v2"]:
            stack.enter_context(mock.patch.object(optimum_quantizer, name, select, create=True))
        stack.enter_context(mock.patch.object(optimum_quantizer, "METHOD", METHOD, create=True))
        stack.enter_context(mock.patch.object(optimum_quantizer, "FORMAT", lambda value: value, create=True))
        stack.enter_context(mock.patch.object(optimum_quantizer, "QuantizeConfig",
                                              lambda **kwargs: types.SimpleNamespace(**kwargs), create=True))
        stack.enter_context(mock.patch.object(optimum_quantizer, "gptqmodel_version", "7.7.0", create=True))
        yield
