"""Drop-in PyTorch ops computed by Tracea kernels, falling back to PyTorch where Tracea has none.

    from tracea import ops, patch_conv2d, unpatch_conv2d, TraceaConv2d
    y = ops.conv2d(x, w, b, stride=(1, 1), padding=(1, 1))

Fallbacks (to torch.nn.functional.conv2d) happen when groups != 1, dilation != 1, dtype is not
float32, a tensor is not contiguous, a tensor is not on the CPU, autograd needs a gradient, or the
padding is a string or not zero-padding. Each one is counted in `fallback_counts` (reason ->
calls) and logged at DEBUG level on the "tracea.ops" logger; `reset_fallback_counts()` clears them.
Importing this module does not import torch; using it does.
"""
from __future__ import annotations

import functools
import logging
import threading
from collections import Counter

log = logging.getLogger("tracea.ops")
fallback_counts: Counter = Counter()
_kernels: dict[tuple, object] = {}
_lock = threading.Lock()
_original_conv_forward = None


def reset_fallback_counts() -> None:
    fallback_counts.clear()


def _pair(v, name: str) -> tuple[int, int]:
    if isinstance(v, int):
        return (v, v)
    v = tuple(int(x) for x in v)
    if len(v) == 1:
        return (v[0], v[0])
    if len(v) != 2:
        raise ValueError(f"conv2d {name} must be an int or a pair, got {v}")
    return v


def _fallback_reason(x, w, b, dilation, groups) -> str | None:
    import torch
    tensors = [t for t in (x, w, b) if t is not None]
    if groups != 1:
        return "groups != 1"
    if dilation != (1, 1):
        return "dilation != 1"
    if any(t.dtype != torch.float32 for t in tensors):
        return "dtype is not float32"
    if any(not t.is_contiguous() for t in tensors):
        return "tensor is not contiguous"
    if any(t.device.type != "cpu" for t in tensors):
        return "tensor is not on the CPU (Tracea has no compiled kernel for its device)"
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return "autograd needs a gradient (Tracea kernels are inference-only)"
    if x.dim() != 4 or w.dim() != 4 or x.shape[1] != w.shape[1]:
        return "shapes are not [N, C, H, W] x [F, C, KH, KW]"  # PyTorch raises its own error for these
    if any(t.numel() == 0 for t in tensors):
        return "a tensor is empty (PyTorch returns the empty result)"
    return None


def _kernel(x_shape, w_shape, has_bias: bool, stride, padding):
    key = (x_shape, w_shape, has_bias, stride, padding)
    with _lock:
        kernel = _kernels.get(key)
    if kernel is None:
        from . import compile as tracea_compile
        from . import dialects as td
        specs = [td.tensor(x_shape), td.tensor(w_shape)] + ([td.tensor(w_shape[0])] if has_bias else [])

        def body(x, w, b=None):
            return td.conv2d(x, w, b, stride=stride, padding=padding)

        kernel = tracea_compile(td.function(*specs, name="conv2d")(body))
        with _lock:
            _kernels[key] = kernel
    return kernel


def conv2d(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    """torch.nn.functional.conv2d computed by a Tracea kernel (compiled once per shape), or by
    PyTorch in the cases listed in the module's docstring."""
    import torch
    import torch.nn.functional as F
    stride, dilation = _pair(stride, "stride"), _pair(dilation, "dilation")
    reason = "padding is a string" if isinstance(padding, str) else _fallback_reason(x, w, b, dilation, groups)
    if reason is not None:
        fallback_counts[reason] += 1
        log.debug("conv2d falls back to PyTorch: %s", reason)
        return F.conv2d(x, w, b, stride, padding, dilation, groups)
    padding = _pair(padding, "padding")
    kernel = _kernel(tuple(x.shape), tuple(w.shape), b is not None, stride, padding)
    arrays = [t.detach().numpy() for t in (x, w, b) if t is not None]
    return torch.from_numpy(kernel(*arrays))


def _conv_module_forward(self, input):
    """nn.Conv2d.forward through `conv2d`."""
    if self.padding_mode != "zeros":
        fallback_counts["padding_mode is not 'zeros'"] += 1
        return self._conv_forward(input, self.weight, self.bias)
    padding = (0, 0) if self.padding == "valid" else self.padding
    return conv2d(input, self.weight, self.bias, self.stride, padding, self.dilation, self.groups)


def patch_conv2d() -> None:
    """Route every torch.nn.Conv2d forward through `conv2d` (with its fallbacks); `unpatch_conv2d`
    restores PyTorch's."""
    import torch
    global _original_conv_forward
    if _original_conv_forward is None:
        _original_conv_forward = torch.nn.Conv2d.forward
        torch.nn.Conv2d.forward = _conv_module_forward


def unpatch_conv2d() -> None:
    import torch
    global _original_conv_forward
    if _original_conv_forward is not None:
        torch.nn.Conv2d.forward = _original_conv_forward
        _original_conv_forward = None


@functools.cache
def _tracea_conv2d_class() -> type:
    import torch

    class TraceaConv2d(torch.nn.Conv2d):
        """An nn.Conv2d (same constructor and state dict) whose forward runs `tracea.ops.conv2d`."""

        forward = _conv_module_forward

    TraceaConv2d.__module__ = __name__
    return TraceaConv2d


def __getattr__(name: str):
    """TraceaConv2d is built on first use, so that importing tracea does not import torch."""
    if name == "TraceaConv2d":
        return _tracea_conv2d_class()
    raise AttributeError(f"module 'tracea.ops' has no attribute '{name}'")
