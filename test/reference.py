"""float64 numpy references for every tracea op, and test helpers."""
from __future__ import annotations

import importlib.util
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
from scipy.special import erf

from tracea.runtime.dtypes import to_numpy

# Tolerances relative to the result's magnitude, by the result's element type: f32 accumulates
# rounding over K terms; f16/bf16 results are rounded once at the end.
TOLERANCE = {"f32": 2e-5, "f16": 2e-3, "bf16": 1.6e-2}


def bench_module(name: str):
    """bench/<name>.py, imported (the benchmarks are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", Path(__file__).parent.parent / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def machine_code(kernel) -> str:
    """A CPU kernel's object code disassembled (AT&T syntax); skips where binutils is missing."""
    import pytest
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("objdump (binutils) is not installed: cannot read the machine code")
    with tempfile.NamedTemporaryFile(suffix=".o") as f:
        f.write(kernel.object_code)
        f.flush()
        return subprocess.run([objdump, "-d", "--no-show-raw-insn", f.name], capture_output=True, text=True,
                              check=True).stdout


def random(rng: np.random.Generator, shape, dtype: str = "f32", scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(to_numpy(dtype))


def assert_close(out: np.ndarray, ref: np.ndarray, dtype: str, k: int = 1) -> None:
    """`k`: how many products each output sums (error grows like sqrt(k) for random data)."""
    tol = TOLERANCE[dtype] * max(1.0, np.sqrt(k) / 4)
    out = np.asarray(out, dtype=np.float64)
    scale = max(1.0, float(np.abs(ref).max()))
    np.testing.assert_allclose(out, ref, rtol=tol, atol=tol * scale)


def f64(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def gemm(a, b, transpose_a=False, transpose_b=False):
    a, b = f64(a), f64(b)
    if transpose_a:
        a = np.swapaxes(a, -1, -2)
    if transpose_b:
        b = np.swapaxes(b, -1, -2)
    return a @ b


def epilogue(x, steps, bias=None, residual=None):
    for kind, param in steps:
        if kind == "bias_add":
            x = x + f64(bias)
        elif kind == "residual_add":
            x = x + f64(residual)
        elif kind == "scale":
            x = x * param
        elif kind == "relu":
            x = np.maximum(x, 0)
        elif kind == "gelu" and param == "tanh":
            x = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
        elif kind == "gelu":
            x = 0.5 * x * (1 + erf(x / np.sqrt(2)))
        elif kind == "sigmoid":
            x = 1 / (1 + np.exp(-x))
        elif kind == "silu":
            x = x / (1 + np.exp(-x))
        elif kind == "hardsigmoid":
            x = np.clip(x + 3, 0, 6) / 6
        elif kind == "hardswish":
            x = x * np.clip(x + 3, 0, 6) / 6
        else:
            raise ValueError(kind)
    return x


def softmax(x, axis=-1):
    x = f64(x)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def conv2d(x, w, bias=None, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1, layout="nchw"):
    """Direct convolution; NCHW input with FCHW filter, or NHWC with HWCF."""
    x, w = f64(x), f64(w)
    if layout == "nhwc":
        x = x.transpose(0, 3, 1, 2)
        w = w.transpose(3, 2, 0, 1)
    if len(padding) == 2:
        padding = (padding[0], padding[0], padding[1], padding[1])
    top, bottom, left, right = padding
    x = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    n, c, h, wd = x.shape
    f, cg, kh, kw = w.shape
    (sh, sw), (dh, dw) = stride, dilation
    oh = (h - dh * (kh - 1) - 1) // sh + 1
    ow = (wd - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, groups, f // groups, oh, ow))
    wg = w.reshape(groups, f // groups, cg, kh, kw)
    for i in range(kh):
        for j in range(kw):
            patch = x[:, :, i * dh: i * dh + sh * (oh - 1) + 1: sh, j * dw: j * dw + sw * (ow - 1) + 1: sw]
            patch = patch.reshape(n, groups, cg, oh, ow)
            out += np.einsum("ngchw,gfc->ngfhw", patch, wg[:, :, :, i, j])
    out = out.reshape(n, f, oh, ow)
    if bias is not None:
        out += f64(bias)[None, :, None, None]
    return out.transpose(0, 2, 3, 1) if layout == "nhwc" else out


def attention(q, k, v, scale=None, causal=False):
    q, k, v = f64(q), f64(k), f64(v)
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ np.swapaxes(k, -1, -2)) * scale
    if causal:
        sq, skv = s.shape[-2:]
        s = np.where(np.tril(np.ones((sq, skv), bool)), s, -np.inf)
    return softmax(s) @ v
