"""Host code generation (tracea/targets/native.py): LLVM dialect -> object code -> linked in-process."""
from __future__ import annotations

import ctypes

import ml_dtypes
import mlir.ir as ir
import numpy as np
import pytest

import tracea
from tracea import dialects as td
from tracea.dialects.context import shared_context
from tracea.errors import CompileError
from tracea.targets import native


def _jit(llvm_dialect: str, symbol: str, prototype):
    with shared_context("host"):
        module = ir.Module.parse(llvm_dialect)
        code = native.object_code(module, [])
    library = native.JitLibrary(code, [symbol])
    return prototype(library.addresses[symbol]), library


def test_f32_to_bf16_rounds_to_nearest_even():
    """fptrunc to bf16 becomes a call of __truncsfbf2 on CPUs without bf16 conversions; Tracea's
    own definition must round like IEEE (ties to even) and keep NaN a NaN."""
    to_bf16, keep = _jit("""
        llvm.func @to_bf16(%x: f32) -> i16 {
          %y = llvm.fptrunc %x : f32 to bf16
          %bits = llvm.bitcast %y : bf16 to i16
          llvm.return %bits : i16
        }""", "to_bf16", ctypes.CFUNCTYPE(ctypes.c_uint16, ctypes.c_float))
    rng = np.random.default_rng(0)
    ties = np.array([0x3F808000, 0x3F818000, 0xBF808000, 0x7F7F8000], dtype=np.uint32).view(np.float32)
    values = np.concatenate([rng.standard_normal(500).astype(np.float32) * 1e3, ties,
                             np.array([0.0, -0.0, np.inf, -np.inf, 3.4e38, 1e-40], dtype=np.float32)])
    expected = values.astype(ml_dtypes.bfloat16).view(np.uint16)
    got = np.array([to_bf16(float(v)) for v in values], dtype=np.uint16)
    np.testing.assert_array_equal(got, expected)
    nan = to_bf16(float("nan"))
    assert nan & 0x7F80 == 0x7F80 and nan & 0x7F, f"NaN became {nan:#06x}"


def test_kernel_keeps_its_object_code():
    kernel = tracea.compile(td.function(td.tensor((8, 8)), td.tensor((8, 8)), name="small")(td.gemm))
    assert kernel.object_code.startswith(b"\x7fELF")
    assert kernel.entry_symbol.encode() in kernel.object_code


def test_unresolved_symbol_is_a_compile_error():
    with pytest.raises(CompileError, match="linking the kernel's object code failed"):
        _jit("""
            llvm.func @tracea_no_such_function() -> ()
            llvm.func @calls() {
              llvm.call @tracea_no_such_function() : () -> ()
              llvm.return
            }""", "calls", ctypes.CFUNCTYPE(None))


def test_only_generic_loop_nests_get_llvm_optimizations():
    """Tracea's kernels arrive tiled and vectorized (a clean-up is enough); a module with loops
    MLIR lowered generically is marked for LLVM's -O1."""
    gemm = tracea.compile(td.function(td.tensor((64, 64)), td.tensor((64, 64)), name="k")(td.gemm), keep_stages=True)
    generic = tracea.compile(td.function(td.tensor((32, 48)), name="g")(lambda a: td.softmax(a, axis=0)),
                             keep_stages=True)
    assert "tracea.generic_loops" not in gemm.stages["llvm"]
    assert "tracea.generic_loops" in generic.stages["llvm"]
    x = np.random.default_rng(1).standard_normal((32, 48)).astype(np.float32)
    e = np.exp(x - x.max(axis=0))
    np.testing.assert_allclose(generic(x), e / e.sum(axis=0), rtol=1e-5, atol=1e-6)
