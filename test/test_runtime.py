"""Compiled kernels as callables: argument checking, results, caching, stages."""
from __future__ import annotations

import copy
import time

import ml_dtypes
import numpy as np
import pytest

import reference as ref
import tracea
from tracea import dialects as td


@pytest.fixture(scope="module")
def kernel():
    @td.function(td.tensor((4, 8)), td.tensor((8, 3)))
    def matmul(a, b):
        return td.gemm(a, b)

    return tracea.compile(matmul)


def test_kernel_describes_itself(kernel):
    assert repr(kernel) == "<tracea.Kernel matmul(a: tensor<4x8xf32>, b: tensor<8x3xf32>) -> tensor<4x3xf32> on cpu>"


@pytest.mark.parametrize("args,message", [
    ((np.zeros((4, 8), np.float32),), r"matmul takes 2 argument\(s\)"),
    ((np.zeros((4, 8)), np.zeros((8, 3), np.float32)), r"argument a must be a float32 array of shape \(4, 8\), got float64 \(4, 8\)"),
    ((np.zeros((4, 8), np.float32), np.zeros((3, 8), np.float32)), r"argument b must be a float32 array of shape \(8, 3\), got float32 \(3, 8\)"),
    ((np.zeros((4, 8), np.float32), "x"), r"argument b must be a numpy array, got str"),
])
def test_bad_arguments_are_rejected(kernel, args, message):
    with pytest.raises(tracea.ArgumentError, match=message):
        kernel(*args)


def test_non_contiguous_inputs_and_out_arrays(kernel, rng):
    a = ref.random(rng, (8, 4)).T  # a transposed view
    b = ref.random(rng, (8, 3))
    out = np.full((4, 3), np.nan, np.float32)
    result = kernel(a, b, out=out)
    assert result is out
    ref.assert_close(out, ref.gemm(a, b), "f32", 8)
    with pytest.raises(tracea.ArgumentError, match="output #0 must be a writeable C-contiguous array"):
        kernel(a, b, out=np.zeros((3, 4), np.float32).T)


def test_out_array_may_not_alias_an_input(rng):
    fn = td.function(td.tensor((4, 4)), td.tensor((4, 4)))(td.gemm)
    a, b = ref.random(rng, (4, 4)), ref.random(rng, (4, 4))
    with pytest.raises(tracea.ArgumentError, match="output #0 overlaps an input or another output"):
        tracea.compile(fn)(a, b, out=a)


def test_repeated_compile_is_a_cache_hit():
    @td.function(td.tensor((5, 6)))
    def sm(x):
        return td.softmax(x)

    first = tracea.compile(sm)
    start = time.perf_counter()
    again = tracea.compile(sm)
    assert again is first
    assert time.perf_counter() - start < 0.05  # a hash and a dict lookup, not a compile


def test_different_schedules_are_different_kernels():
    def build(stages):
        return td.function(td.tensor((4, 4)), td.tensor((4, 4)))(
            lambda a, b: td.gemm(a, b, schedule=td.Schedule(stages=stages)))

    assert tracea.compile(build(2)) is not tracea.compile(build(3))


def test_stages_are_kept_on_request(rng):
    fn = td.function(td.tensor((3, 3)))(lambda x: td.softmax(x, axis=0))  # axis 0: the linalg lowering
    k = tracea.compile(fn, keep_stages=True)
    assert list(k.stages) == ["linalg", "bufferized", "llvm"]
    assert "linalg.generic" in k.stages["linalg"]
    assert "memref<3x3xf32>" in k.stages["bufferized"]
    assert "llvm.func" in k.stages["llvm"]


def test_dump_dir_receives_every_stage(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEA_DUMP_DIR", str(tmp_path))
    fn = td.function(td.tensor((2, 7)))(lambda x: td.softmax(x, axis=0))
    tracea.compile(fn)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["lambda.0-input.mlir", "lambda.1-linalg.mlir", "lambda.2-bufferized.mlir", "lambda.3-llvm.mlir"]


def test_bf16_arrays_via_ml_dtypes(rng):
    fn = td.function(td.tensor((6, 5), "bf16"), td.tensor((5, 4), "bf16"))(
        lambda a, b: td.gemm(a, b, out_dtype="f32"))
    a, b = ref.random(rng, (6, 5), "bf16"), ref.random(rng, (5, 4), "bf16")
    assert a.dtype == ml_dtypes.bfloat16
    ref.assert_close(tracea.compile(fn)(a, b), ref.gemm(a, b), "f32", 5)


def test_compile_from_text_and_entry_selection():
    text = """
    func.func @one(%x: tensor<3xf32>) -> tensor<3xf32> {
      %y = "tracea.softmax"(%x) : (tensor<3xf32>) -> tensor<3xf32>
      return %y : tensor<3xf32>
    }
    func.func @two(%x: tensor<3xf32>) -> tensor<3xf32> {
      return %x : tensor<3xf32>
    }"""
    with pytest.raises(tracea.CompileError, match="has 2 public functions \\(one, two\\); name the one to run with entry="):
        tracea.compile(text)
    with pytest.raises(tracea.CompileError, match="no public function @three"):
        tracea.compile(text, entry="three")
    x = np.array([1.0, 2.0, 3.0], np.float32)
    ref.assert_close(tracea.compile(text, entry="one")(x), ref.softmax(x), "f32")
    np.testing.assert_array_equal(tracea.compile(text, entry="two")(x), x)


def test_unknown_target():
    fn = td.function(td.tensor((3,)))(lambda x: td.softmax(x))
    with pytest.raises(ValueError, match="unknown target 'tpu'; available: cpu"):
        tracea.compile(fn, target="tpu")


def test_data_address_is_where_numpy_keeps_the_data():
    """The address the entry taking arrays reads from the array object is numpy's own, for every
    kind of array a kernel is given: views into other arrays, read-only, bf16 / f16, 0-d, empty."""
    from tracea.runtime.kernel import DATA_OFFSET, data_address
    assert DATA_OFFSET is not None  # CPython + numpy: found, so kernels take their arrays directly
    base = np.arange(80, dtype=np.float32).reshape(10, 8)
    read_only = np.frombuffer(np.arange(6, dtype=np.float64).tobytes(), np.float64)
    arrays = [base, base[3:7], base[:, 2:], read_only, np.zeros((3, 5), ml_dtypes.bfloat16),
              np.ones(7, np.float16), np.array(2.5, np.float32), np.zeros((0, 4), np.float32)]
    for a in arrays:
        assert data_address(a) == a.ctypes.data


def test_each_call_reads_the_arrays_it_is_given(kernel, rng):
    """The entry taking arrays (targets/cpu/native.py: objects_entry) points the kernel at each
    call's arrays: views starting inside another array, read-only inputs, arrays freed and made
    anew between calls; the descriptor path it replaces gives the same results."""
    assert kernel._entry_on_arrays is not None
    big = ref.random(rng, (12, 8))
    b = ref.random(rng, (8, 3))
    read_only = np.frombuffer(ref.random(rng, (8, 3)).tobytes(), np.float32).reshape(8, 3)
    for start in range(0, 8, 3):
        a = big[start:start + 4]
        ref.assert_close(kernel(a, b), ref.gemm(a, b), "f32", 8)
        ref.assert_close(kernel(a, read_only), ref.gemm(a, read_only), "f32", 8)
        ref.assert_close(kernel(a * 1, b * 1), ref.gemm(a, b), "f32", 8)  # temporaries, freed after
    fast = kernel(big[2:6], b)
    slow_path = copy.copy(kernel)
    slow_path._entry_on_arrays = None  # as a kernel cached before the entry existed runs
    np.testing.assert_array_equal(slow_path(big[2:6], b), fast)


def test_results_are_independent_arrays(kernel, rng):
    a, b = ref.random(rng, (4, 8)), ref.random(rng, (8, 3))
    first = kernel(a, b)
    second = kernel(a * 2, b)
    ref.assert_close(first, ref.gemm(a, b), "f32", 8)
    ref.assert_close(second, ref.gemm(a * 2, b), "f32", 8)


def test_results_start_on_a_cache_line(kernel, rng):
    """Results are 64-byte aligned (numpy's own arrays start 16 bytes in), so that the next
    kernel reading one loads whole lines (vectors across two lines: a depthwise conv 1.85x
    slower); they stay ordinary arrays, and hold their data after the call returns."""
    from tracea.runtime.kernel import aligned_empty
    a, b = ref.random(rng, (4, 8)), ref.random(rng, (8, 3))
    results = [kernel(a, b) for _ in range(8)]
    for got in results:
        assert got.ctypes.data % 64 == 0 and got.flags.c_contiguous and got.flags.writeable
        ref.assert_close(got, ref.gemm(a, b), "f32", 8)
    for shape, dtype in [((), np.float32), ((3, 7), np.float16), ((5,), np.bool_), ((2, 3), np.int64), ((0, 5), np.float32)]:
        empty = aligned_empty(shape, dtype)
        assert empty.shape == shape and empty.dtype == dtype and empty.flags.c_contiguous
        assert empty.size == 0 or empty.ctypes.data % 64 == 0


def test_compiles_from_several_threads(rng):
    """Kernels compiled concurrently from Python threads are all correct, and no compiler child
    hangs: one thread forking while another is inside LLVM (linking a kernel) once left the
    child waiting for ever on llvmlite's lock."""
    from concurrent.futures import ThreadPoolExecutor

    def build_and_run(rep_n):
        rep, n = rep_n
        fn = td.function(td.tensor((n, 7)), td.tensor((7, 3)), name=f"mm{rep}_{n}")(td.gemm)
        a, b = np.ones((n, 7), np.float32), np.ones((7, 3), np.float32)
        return tracea.compile(fn, threads=1)(a, b)

    for rep in range(4):
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(build_and_run, [(rep, n) for n in range(1, 9)]))
        for n, out in enumerate(results, 1):
            assert out.shape == (n, 3) and (out == 7).all()


FAULTS = """
import resource, numpy as np, tracea
from tracea import dialects as td
n = 1024  # a 4 MiB intermediate and a kernel's own buffers, allocated and freed each call
fn = td.function(*[td.tensor((n, n))] * 3)(lambda a, b, c: td.softmax(td.gemm(td.softmax(td.gemm(a, b)), c)))
k = tracea.compile(fn, threads=2)
x = [np.random.default_rng(i).standard_normal((n, n)).astype(np.float32) for i in range(3)]
out = np.empty((n, n), np.float32)
for _ in range(3):
    k(*x, out=out)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    k(*x, out=out)
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10)
"""


def test_kernel_buffers_are_not_page_faulted_anew_each_call():
    """Counted, not timed: with malloc tuned (the default) a call's freed buffers stay mapped, so
    later calls touch no new page; TRACEA_TUNE_MALLOC=0, the control, faults thousands per call."""
    import os
    import subprocess
    import sys

    def faults(tune: str) -> float:
        done = subprocess.run([sys.executable, "-c", FAULTS], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "TRACEA_TUNE_MALLOC": tune})
        assert done.returncode == 0, done.stderr
        return float(done.stdout.split()[-1])

    tuned, control = faults("1"), faults("0")
    assert tuned < 50, tuned
    if control < 500:
        pytest.skip(f"this malloc does not fault anew even untuned ({control} faults a call)")


def test_softmax_of_a_gemm_of_a_softmax_from_the_api(rng):
    """softmax(gemm(softmax(gemm(a, b)), c)) written with the API: the attention raising read the
    softmax's axis attribute, which the API leaves out for -1 (an internal compiler error)."""
    a, b, c = (ref.random(rng, (16, 16)) for _ in range(3))
    fn = td.function(*[td.tensor((16, 16))] * 3)(lambda x, y, z: td.softmax(td.gemm(td.softmax(td.gemm(x, y)), z)))
    ref.assert_close(tracea.compile(fn)(a, b, c), ref.softmax(ref.softmax(ref.gemm(a, b)) @ ref.f64(c)), "f32", 16)


def test_a_second_copy_of_libomp_is_not_loaded(tmp_path):
    """A kernel from the disk cache names the libomp of the environment that compiled it (another
    checkout's venv shares ~/.cache/tracea); a second copy initialized in one process aborts it
    ("OMP: Error #15"). The copy loaded first serves every kernel; a threaded kernel still runs."""
    import shutil
    import subprocess
    import sys
    from tracea.targets.cpu.target import openmp_library
    libomp = openmp_library()
    if libomp is None:
        pytest.skip("no LLVM OpenMP runtime (cmeel-libomp) installed")
    other = tmp_path / "libomp.so"
    shutil.copy(libomp, other)
    script = f"""
import numpy as np, tracea
from tracea import dialects as td
from tracea.runtime.libraries import load_runtime_library, loaded_library
load_runtime_library({str(libomp)!r})
first = loaded_library({str(libomp)!r})
load_runtime_library({str(other)!r})
assert loaded_library({str(other)!r}) is first
fn = td.function(td.tensor((256, 256)), td.tensor((256, 256)), name="g")(td.gemm)
a = np.random.rand(256, 256).astype(np.float32)
assert np.allclose(tracea.compile(fn, threads=2)(a, a), a @ a, rtol=1e-4)
print("ok")
"""
    env = {**__import__("os").environ, "TRACEA_OPENMP": "llvm", "TRACEA_DISK_CACHE": "0"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-2000:]
