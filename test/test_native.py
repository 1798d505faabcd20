"""Host code generation (tracea/targets/cpu/native.py): LLVM dialect -> object code -> linked in-process."""
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
from tracea.targets.cpu import native


def _jit(llvm_dialect: str, symbol: str, prototype):
    with shared_context("host"):
        module = ir.Module.parse(llvm_dialect)
        code = native.object_code(module, [])
    library = native.JitLibrary(code, [symbol])
    return prototype(library.addresses[symbol]), library


BF16_CONVERSIONS = ("avx512bf16", "avxneconvert", "amx-bf16")  # LLVM features that convert f32 to bf16


def _without_bf16_conversions():
    """The host's target machine less AVX512-BF16 / AVX-NE-CONVERT: fptrunc to bf16 calls
    __truncsfbf2 (Tracea's definition), as on CPUs that have no bf16 conversions."""
    llvm = native._llvm()
    features = llvm.get_host_cpu_features()
    for feature in BF16_CONVERSIONS:
        if feature in features:
            features[feature] = False
    return llvm.Target.from_default_triple().create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=features.flatten(), opt=2, reloc="pic")


def _host_converts_bf16() -> bool:
    features = native._llvm().get_host_cpu_features()
    return any(features.get(feature, False) for feature in BF16_CONVERSIONS)


@pytest.mark.parametrize("machine", ["software", "host"])
def test_f32_to_bf16_rounds_to_nearest_even(machine, monkeypatch):
    """fptrunc to bf16 becomes a call of __truncsfbf2 on CPUs without bf16 conversions; Tracea's
    own definition must round like IEEE (ties to even) and keep NaN a NaN. On the host as LLVM
    sees it (AVX512-BF16's vcvtneps2bf16 where it exists) the same, except that the instruction
    takes a subnormal f32 as zero."""
    if machine == "software":
        monkeypatch.setattr(native, "host_machine", _without_bf16_conversions)
    to_bf16, keep = _jit("""
        llvm.func @to_bf16(%x: f32) -> i16 {
          %y = llvm.fptrunc %x : f32 to bf16
          %bits = llvm.bitcast %y : bf16 to i16
          llvm.return %bits : i16
        }""", "to_bf16", ctypes.CFUNCTYPE(ctypes.c_uint16, ctypes.c_float))
    rng = np.random.default_rng(0)
    ties = np.array([0x3F808000, 0x3F818000, 0xBF808000, 0x7F7F8000], dtype=np.uint32).view(np.float32)
    values = np.concatenate([rng.standard_normal(500).astype(np.float32) * 1e3, ties,
                             np.array([0.0, -0.0, np.inf, -np.inf, 3.4e38, 1e-40, -3e-39], dtype=np.float32)])
    expected = values.astype(ml_dtypes.bfloat16).view(np.uint16)
    if machine == "host" and _host_converts_bf16():
        subnormal = (values != 0) & (np.abs(values) < np.finfo(np.float32).tiny)
        expected = np.where(subnormal, np.signbit(values).astype(np.uint16) << 15, expected)
    got = np.array([to_bf16(float(v)) for v in values], dtype=np.uint16)
    np.testing.assert_array_equal(got, expected)
    nan = to_bf16(float("nan"))
    assert nan & 0x7F80 == 0x7F80 and nan & 0x7F, f"NaN became {nan:#06x}"


def test_kernel_keeps_its_object_code():
    kernel = tracea.compile(td.function(td.tensor((8, 8)), td.tensor((8, 8)), name="small")(td.gemm))
    assert kernel.object_code.startswith(b"\x7fELF")
    assert kernel.entry_symbol.encode() in kernel.object_code


def test_perf_map_names_every_function_of_a_jit_kernel(monkeypatch):
    """TRACEA_PERF_MAP=1: /tmp/perf-<pid>.map places every function of the kernel's object (the
    outlined loop nests too) where the JIT put it, so perf names them."""
    import os
    monkeypatch.setenv("TRACEA_PERF_MAP", "1")
    monkeypatch.setenv("TRACEA_DISK_CACHE", "0")
    kernel = tracea.compile(td.function(td.tensor((48, 40)), td.tensor((40, 24)), name="mapped")(td.gemm))
    functions = {name for name, *_ in native.elf_functions(kernel.object_code)}
    assert kernel.entry_symbol in functions and any(n.startswith("_tracea_loop_") for n in functions)
    with open(f"/tmp/perf-{os.getpid()}.map") as f:
        lines = [line.split() for line in f]
    placed = {name.removeprefix("tracea:"): int(start, 16) for start, _, name in lines}
    assert functions <= set(placed)
    for name, address in kernel._keep_alive.addresses.items():  # what the JIT itself reports
        assert placed[name] == address


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


def test_a_large_module_compiles_in_parts_that_link_into_one(monkeypatch):
    """parallel_parts: every function defined in exactly one part, internal ones callable from
    the others, the one mutable global shared (not copied); the joined object runs as the whole."""
    from tracea.doctor.capabilities import machine_cores
    if machine_cores() < 2:
        pytest.skip("one core: modules are compiled whole")
    functions = "\n".join(f"""
        llvm.func internal @step{k}(%x: i64) -> i64 {{
          %counter = llvm.mlir.addressof @counter : !llvm.ptr
          %one = llvm.mlir.constant(1 : i32) : i32
          %old = llvm.atomicrmw add %counter, %one monotonic : !llvm.ptr, i32
          %k = llvm.mlir.constant({k + 2} : i64) : i64
          %y = llvm.mul %x, %k : i64
          %z = llvm.add %y, %k : i64
          llvm.return %z : i64
        }}""" for k in range(9))
    calls = "\n".join(f"%v{k + 1} = llvm.call @step{k}(%v{k}) : (i64) -> i64" for k in range(9))
    source = f"""
        llvm.mlir.global internal @counter(0 : i32) : i32
        {functions}
        llvm.func @chain(%v0: i64) -> i64 {{
          {calls}
          llvm.return %v9 : i64
        }}
        llvm.func @count() -> i32 {{
          %counter = llvm.mlir.addressof @counter : !llvm.ptr
          %n = llvm.load %counter : !llvm.ptr -> i32
          llvm.return %n : i32
        }}"""
    with shared_context("host"):
        llvm_ir = native.translate_to_llvm_ir(ir.Module.parse(source).operation)
    monkeypatch.setattr(native, "PARALLEL_MIN_BYTES", 0)
    parts = native.parallel_parts(llvm_ir, [])
    assert parts is not None and len(parts) == min(machine_cores(), 8)
    for k in range(9):
        assert sum(f"@step{k}(" in p and f"define hidden i64 @step{k}(" in p for p in parts) == 1
    assert sum("@counter = hidden global i32 0" in p for p in parts) == 1
    code = native._compile_parts(parts, [], optimize=False)
    assert code is not None
    library = native.JitLibrary(code, ["chain", "count"])
    chain = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(library.addresses["chain"])
    count = ctypes.CFUNCTYPE(ctypes.c_int32)(library.addresses["count"])
    expected = 3
    for k in range(9):
        expected = expected * (k + 2) + k + 2
    assert chain(3) == expected
    assert count() == 9  # one counter for all the parts


def test_a_kernel_compiled_in_parts_runs_and_exports(tmp_path):
    """Softmax kernels: a module large enough to be compiled on several cores (in the compiler
    process), checked against numpy, then linked into a shared library and loaded."""
    from tracea.doctor.capabilities import machine_cores
    shapes = [(k, 40 + k) for k in range(1, 25)]
    fn = td.function(*[td.tensor(s) for s in shapes], name="many")(
        lambda *xs: tuple(td.softmax(x, axis=1) for x in xs))
    kernel = tracea.compile(fn, keep_stages=True)
    with shared_context("host"):
        llvm_ir = native.translate_to_llvm_ir(ir.Module.parse(kernel.stages["llvm"]).operation)
    if machine_cores() >= 2:
        assert native.parallel_parts(llvm_ir, []) is not None  # (else this test misses its point)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(s).astype(np.float32) * 20 for s in shapes]
    expected = [np.exp(x - x.max(1, keepdims=True)) / np.exp(x - x.max(1, keepdims=True)).sum(1, keepdims=True)
                for x in xs]
    for got, want in zip(kernel(*xs), expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    loaded = tracea.Kernel.load(kernel.export(tmp_path / "many.so"))
    for got, want in zip(loaded(*xs), expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
