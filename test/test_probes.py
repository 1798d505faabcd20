"""Probes that keep issue 22 so: no input, argument or damaged file crashes Tracea or gets a
silent wrong answer.

Each probe runs in a process of its own (`sys.executable -c ...` or a command-line tool, the
disk cache off unless it is the subject) with a timeout, and passes only if that process was not
killed by a signal, did not hang, printed no Python traceback, and either computed the right
result (checked against numpy or eager PyTorch inside the process) or failed with the documented
error naming the problem. The classification is scripts/fuzz_ir.py's (`run_command`,
`classify`), checked first against processes that do crash, hang and raise.

- indices out of range, positive and negative (embedding, x[idx], index_select, gather from
  PyTorch; a gather in linalg): IndexError (tracea.IndexOutOfRangeError), where eager raises;
- integer division and remainder by zero (PyTorch, linalg): ZeroDivisionError;
- AOT libraries called through their C entry (ctypes) with hostile descriptors (other sizes,
  negative or huge sizes, column-major or zero strides, an offset, a wrong output, NULL): the
  1-based position of the refused descriptor, nothing written; faults: -1 / -2;
- compiled kernels called with the wrong count, shapes, dtypes, objects, read-only or
  overlapping outputs: ArgumentError; strided inputs: the right result;
- files: non-UTF-8 input to `tracea-opt` (file and stdin) and `tracea compile-gpu`, a directory
  or a missing file as input, `-o` into a missing directory or under a file, NUL bytes, bad
  pipelines: exit 1 and one error line (MLIR's pipeline parser adds a caret line);
- absurd sizes: a 2^40 x 2^40 GEMM, results past 64-bit sizes, negative, zero, non-integral and
  non-numeric dims, unknown dtypes, from the builders and from MLIR text (tracea ops and plain
  linalg): OpError / CompileError naming the problem, or the right (empty) result;
- damaged cache entries beyond the ten kinds test/test_disk_cache.py already makes in fresh
  processes (truncated, bit-flipped, zeroed, deleted or foreign libraries; null, list, edited
  descriptions): descriptions empty, not UTF-8, nested past Python's recursion limit or a
  directory; the library empty or a directory; the header gone before an export; the cache
  directory a file; `damaged/` a file; damaged linalg-import text entries;
- a sample of scripts/fuzz_ir.py's mutation fuzzing of tracea-opt over the lit corpus (a fixed
  seed, and a few seeds drawn per run: a failure names its seed); the long run over the lit
  corpus and PyTorch models' IR is the script itself.

A defect a probe finds is fixed, not marked: every probe passes.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import random
import re
import shutil
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 120


def _script(name: str):
    """scripts/<name>.py, imported (the scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(f"scripts_{name}", ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


fuzz = _script("fuzz_ir")

HAVE_TORCH = all(importlib.util.find_spec(m) is not None for m in ("torch", "torch_mlir"))
needs_torch = pytest.mark.skipif(not HAVE_TORCH,
                                 reason="torch / torch-mlir are not installed (pip install 'tracea[torch]')")
needs_cc = pytest.mark.skipif(not any(shutil.which(c) for c in ("cc", "gcc", "clang")),
                              reason="exporting a library needs a C compiler (cc)")

# Run before each probe's code: `raises` checks an error's type and message, `done` marks the end.
PRELUDE = textwrap.dedent('''
    import re, sys

    def raises(errors, pattern, fn, *args, **kwargs):
        """fn(*args, **kwargs) must raise one of `errors` saying `pattern`; another error propagates
        (a traceback: the probe fails)."""
        try:
            fn(*args, **kwargs)
        except errors as e:
            if not re.search(pattern, str(e)):
                sys.exit(f"PROBE FAILED: {type(e).__name__} without {pattern!r}: {e}")
            print(f"raised {type(e).__name__}: {str(e).splitlines()[0]}")
            return e
        sys.exit(f"PROBE FAILED: nothing raised, expected {errors} saying {pattern!r}")

    def done():
        print("PROBE OK")
''')


def probe_env(**extra) -> dict:
    return {**os.environ, "TRACEA_DISK_CACHE": "0", "TRACEA_PROGRESS": "0", **extra}


def run_code(code: str, *argv, env: dict | None = None, timeout: float = TIMEOUT):
    command = [sys.executable, "-c", PRELUDE + textwrap.dedent(code), *map(str, argv)]
    return fuzz.run_command(command, timeout, env or probe_env())


def explain(run) -> str:
    command = " ".join(map(str, run.command))[:300]
    return (f"\n$ {command}\n--- stdout ---\n{run.stdout.decode(errors='replace')[-3000:]}"
            f"\n--- stderr ---\n{run.stderr[-6000:]}")


def assert_probe(run) -> str:
    """Not killed, no hang, no traceback, exit 0 and 'PROBE OK' printed; returns stdout."""
    assert run.kind == "ok", f"{run.kind}: {run.reason}{explain(run)}"
    out = run.stdout.decode(errors="replace")
    assert out.rstrip().endswith("PROBE OK"), f"the probe did not finish{explain(run)}"
    return out


def probe(code: str, *argv, **kwargs) -> str:
    return assert_probe(run_code(code, *argv, **kwargs))


# --- the classification itself ---------------------------------------------------------------------
CLASSIFIER = {  # code -> the kind scripts/fuzz_ir.py must see
    "abort": ("import os; os.abort()", "crash"),
    "segfault": ("import ctypes; ctypes.string_at(0)", "crash"),
    "hang": ("import time; time.sleep(60)", "hang"),
    "hang-in-a-child": ("import os, time; pid = os.fork(); pid and print(pid, flush=True); time.sleep(60)", "hang"),
    "traceback": ("raise KeyError('x')", "traceback"),
    "clean-error": ("import sys; sys.exit('tracea-opt: error: bad input')", "error"),
    "odd-exit-status": ("import sys; sys.exit(3)", "crash"),
    "silent-failure": ("import sys; sys.exit(1)", "crash"),
    "ice": ("import sys; print('tracea-opt: internal compiler error: the MLIR pass pipeline was killed by signal 6 "
            "(SIGABRT)\\n  Assertion `x' failed.\\n  the input was saved to r.mlir', file=sys.stderr); sys.exit(2)",
            "ice"),
    "python-error-in-the-compiler": (
        "import sys; print('tracea-opt: internal compiler error: the MLIR pass pipeline exited with status 1\\n"
        "  KeyError: 1\\n  the input was saved to r.mlir', file=sys.stderr); sys.exit(2)", "traceback"),
}


@pytest.mark.parametrize("case", list(CLASSIFIER))
def test_the_classification_sees_crashes_hangs_and_tracebacks(case):
    code, kind = CLASSIFIER[case]
    run = fuzz.run_command([sys.executable, "-c", code], timeout=1.5 if kind == "hang" else 30)
    assert run.kind == kind, f"{run.kind} ({run.reason}){explain(run)}"
    if case == "hang-in-a-child":  # killed with its parent (as a hung tracea-opt's compiler process must be)
        stat = Path(f"/proc/{int(run.stdout)}/stat")
        for _ in range(50):  # SIGKILL is sent; dying takes a moment
            try:
                if stat.read_text().split(")")[-1].split()[0] == "Z":
                    break
            except OSError:
                break
            time.sleep(0.05)
        else:
            pytest.fail(f"the hung process's child {stat.parent.name} still runs")


# --- indices ---------------------------------------------------------------------------------------
TORCH_PRELUDE = '''
    import torch, tracea

    class Fn(torch.nn.Module):
        def __init__(self, fn):
            super().__init__()
            self.fn = fn

        def forward(self, *args):
            return self.fn(*args)

    torch.manual_seed(0)
'''

INDEXING = {  # name -> (model, fixed inputs, example indices, indices to try: eager decides which are bad)
    "embedding": ("torch.nn.Embedding(100, 8)", "()", "torch.tensor([[1, 2, 3]])",
                  "[[[0, 99, 50]], [[100, 1, 2]], [[-1, 0, 0]], [[0, 0, 2**40]], [[0, -2**63, 0]]]"),
    "x[idx]": ("Fn(lambda x, i: x[i] + 1)", "(torch.randn(10, 4),)", "torch.tensor([1, 2])",
               "[[-1, -10], [9, 0], [10, 0], [-11, 0], [2**62, 0], [-2**63, 0]]"),
    "index_select": ("Fn(lambda x, i: torch.index_select(x, 1, i))", "(torch.randn(3, 6),)", "torch.tensor([0, 5, 2])",
                     "[[5, 5, 0], [6, 0, 0], [0, 0, -1], [0, -7, 0], [2**40, 0, 0]]"),
    "gather": ("Fn(lambda x, i: torch.gather(x, 1, i))", "(torch.randn(4, 5),)", "torch.zeros(4, 2, dtype=torch.long)",
               "[[[4, 0], [1, 2], [3, 3], [0, 4]], [[0, 5], [1, 2], [3, 3], [0, 4]], [[0, 0], [0, 0], [0, 0], [-1, 0]],"
               " [[0, 0], [0, 0], [0, 0], [0, -2**63]]]"),
}


@needs_torch
@pytest.mark.parametrize("op", list(INDEXING))
def test_indices_out_of_range_raise_index_error(op):
    """Every index eager accepts gives eager's result exactly; every one it refuses raises
    IndexError (also a RuntimeError) saying so, and the next call is clean again."""
    model, fixed, example, tries = INDEXING[op]
    out = probe(TORCH_PRELUDE + f'''
    model, fixed = {model}.eval(), {fixed}
    compiled = tracea.compile(model, (*fixed, {example}))
    good = None
    for indices in {tries}:
        i = torch.tensor(indices)
        try:
            expected = model(*fixed, i)
        except (IndexError, RuntimeError):
            e = raises(IndexError, "index out of range", compiled, *fixed, i)
            assert isinstance(e, RuntimeError), type(e).__mro__
        else:
            torch.testing.assert_close(compiled(*fixed, i), expected, rtol=0, atol=0)
            good = i
    torch.testing.assert_close(compiled(*fixed, good), model(*fixed, good), rtol=0, atol=0)
    done()
    ''')
    assert out.count("raised IndexOutOfRangeError") >= 2, out


CHECKED_GATHER = '''
#map = affine_map<(d0, d1) -> (d0)>
#map1 = affine_map<(d0, d1) -> (d0, d1)>
func.func @embedding(%arg0: tensor<100x8xf32>, %arg1: tensor<3xi64>) -> tensor<3x8xf32> {
  %c100 = arith.constant 100 : index
  %c0_i64 = arith.constant 0 : i64
  %0 = tensor.empty() : tensor<3x8xf32>
  %1 = linalg.generic {indexing_maps = [#map, #map1], iterator_types = ["parallel", "parallel"]} ins(%arg1 : tensor<3xi64>) outs(%0 : tensor<3x8xf32>) {
  ^bb0(%in: i64, %out: f32):
    %2 = arith.index_cast %in : i64 to index
    %3 = linalg.index 1 : index
    %4 = arith.cmpi slt, %2, %c100 : index
    cf.assert %4, "index must be smaller than dim size"
    %5 = arith.cmpi sge, %in, %c0_i64 : i64
    cf.assert %5, "index must be larger or equal to 0"
    %extracted = tensor.extract %arg0[%2, %3] : tensor<100x8xf32>
    linalg.yield %extracted : f32
  } -> tensor<3x8xf32>
  return %1 : tensor<3x8xf32>
}
'''


def test_a_gather_in_linalg_raises_index_error():
    """torch-mlir's form of an embedding (its cf.asserts would abort()), compiled as text."""
    probe(f'''
    import numpy as np, tracea
    k = tracea.compile({CHECKED_GATHER!r})
    table = np.arange(800, dtype=np.float32).reshape(100, 8)
    for bad in ([100, 0, 0], [0, -1, 0], [0, 0, 2**62], [-2**63, 0, 0]):
        raises(IndexError, "index out of range", k, table, np.array(bad, np.int64))
    ids = np.array([99, 0, 42], np.int64)
    np.testing.assert_array_equal(k(table, ids), table[ids])
    done()
    ''')


# --- integer division --------------------------------------------------------------------------------
@needs_torch
def test_integer_division_by_zero_raises_zero_division_error():
    probe(TORCH_PRELUDE + '''
    op = lambda a, b: (torch.floor_divide(a, b), torch.remainder(a, b.to(torch.int32)))
    a = torch.randint(-1000, 1000, (37,))
    b = torch.randint(1, 50, (37,)) * torch.where(torch.arange(37) % 2 == 0, 1, -1)
    compiled = tracea.compile(Fn(op).eval(), (a, b))
    torch.testing.assert_close(compiled(a, b), op(a, b), rtol=0, atol=0)
    zero = b.clone()
    zero[36] = 0
    raises(ZeroDivisionError, "division or remainder by zero", compiled, a, zero)
    torch.testing.assert_close(compiled(a, b), op(a, b), rtol=0, atol=0)  # the fault was that call's
    done()
    ''')


DIVIDE = '''
#map = affine_map<(d0) -> (d0)>
func.func @divide(%a: tensor<37xi32>, %b: tensor<37xi32>) -> (tensor<37xi32>, tensor<37xi32>) {
  %e0 = tensor.empty() : tensor<37xi32>
  %e1 = tensor.empty() : tensor<37xi32>
  %r:2 = linalg.generic {indexing_maps = [#map, #map, #map, #map], iterator_types = ["parallel"]}
      ins(%a, %b : tensor<37xi32>, tensor<37xi32>) outs(%e0, %e1 : tensor<37xi32>, tensor<37xi32>) {
  ^bb0(%x: i32, %y: i32, %o0: i32, %o1: i32):
    %q = arith.divsi %x, %y : i32
    %r = arith.remsi %x, %y : i32
    linalg.yield %q, %r : i32, i32
  } -> (tensor<37xi32>, tensor<37xi32>)
  return %r#0, %r#1 : tensor<37xi32>, tensor<37xi32>
}
'''


def test_integer_division_by_zero_in_linalg_raises_zero_division_error():
    probe(f'''
    import numpy as np, tracea
    k = tracea.compile({DIVIDE!r})
    rng = np.random.default_rng(0)
    a = rng.integers(-1000, 1000, 37).astype(np.int32)
    b = rng.integers(1, 50, 37).astype(np.int32) * np.where(np.arange(37) % 2, 1, -1).astype(np.int32)
    q, r = k(a, b)
    np.testing.assert_array_equal(q, np.trunc(a / b).astype(np.int32))
    np.testing.assert_array_equal(r, np.fmod(a, b))
    zero = b.copy()
    zero[17] = 0
    raises(ZeroDivisionError, "division or remainder by zero", k, a, zero)
    np.testing.assert_array_equal(k(a, b)[0], q)
    done()
    ''')


# --- AOT libraries called through their C entry ----------------------------------------------------------
@pytest.fixture(scope="module")
def libraries(tmp_path_factory):
    """Three exported kernels (compiled in this process: only calling them is hostile)."""
    import tracea
    from tracea import dialects as td
    directory = tmp_path_factory.mktemp("aot-probes")
    dense = td.function(td.tensor((37, 29)), td.tensor((29, 45)), td.tensor(45), name="dense")(
        lambda x, w, b: td.fused_gemm(x, w, [td.bias_add(b), td.relu()]))
    tracea.compile(dense, threads=2).export(directory / "dense.so")
    tracea.compile(DIVIDE, threads=1).export(directory / "divide.so")
    tracea.compile(CHECKED_GATHER, threads=1).export(directory / "embedding.so")
    return directory


CTYPES = '''
import ctypes, sys
import numpy as np

lib = ctypes.CDLL(sys.argv[1])

def memref(a, sizes=None, strides=None, offset=0, null=False):
    """A pointer to MLIR's ranked descriptor of `a`, with any field overridden."""
    rank = max(a.ndim, 1)
    class MemRef(ctypes.Structure):
        _fields_ = [("allocated", ctypes.c_void_p), ("aligned", ctypes.c_void_p), ("offset", ctypes.c_int64),
                    ("sizes", ctypes.c_int64 * rank), ("strides", ctypes.c_int64 * rank)]
    sizes = tuple(a.shape) if sizes is None else sizes
    strides = tuple(s // a.itemsize for s in a.strides) if strides is None else strides
    pointer = None if null else a.ctypes.data
    return ctypes.pointer(MemRef(pointer, pointer, offset, sizes, strides))

def call(name, *descriptors):
    entry = getattr(lib, name)
    entry.restype = ctypes.c_int32
    return entry(*descriptors)
'''

# name -> the arguments of tracea_dense (x 37x29, w 29x45, b 45, y 37x45) and its status
DENSE_CALLS = {
    "ok": ("memref(x), memref(w), memref(b), memref(y)", 0),
    "other-sizes": ("memref(x, sizes=(29, 37), strides=(37, 1)), memref(w), memref(b), memref(y)", 1),
    "negative-size": ("memref(x, sizes=(-37, 29)), memref(w), memref(b), memref(y)", 1),
    "huge-size": ("memref(x, sizes=(2**62, 29), strides=(29, 1)), memref(w), memref(b), memref(y)", 1),
    "column-major": ("memref(x), memref(w, strides=(1, 29)), memref(b), memref(y)", 2),
    "zero-strides": ("memref(x), memref(w, strides=(0, 0)), memref(b), memref(y)", 2),
    "offset": ("memref(x), memref(w), memref(b, offset=1), memref(y)", 3),
    "negative-offset": ("memref(x), memref(w), memref(b, offset=-8), memref(y)", 3),
    "output-sizes": ("memref(x), memref(w), memref(b), memref(y, sizes=(45, 37), strides=(37, 1))", 4),
    "output-strides": ("memref(x), memref(w), memref(b), memref(y, strides=(1, 37))", 4),
}


@needs_cc
@pytest.mark.parametrize("case", list(DENSE_CALLS))
def test_the_c_entry_refuses_hostile_descriptors(libraries, case):
    """The refused descriptor's position, and nothing written; the right result when nothing is
    wrong."""
    arguments, status = DENSE_CALLS[case]
    probe(CTYPES + textwrap.dedent(f'''
    rng = np.random.default_rng(0)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((37, 29), (29, 45), (45,)))
    y = np.full((37, 45), np.nan, np.float32)
    status = call("tracea_dense", {arguments})
    assert status == {status}, f"status {{status}}, expected {status}"
    if status:
        assert np.isnan(y).all(), "a refused call wrote its output"
    else:
        np.testing.assert_allclose(y, np.maximum(x.astype(np.float64) @ w + b, 0), rtol=1e-4, atol=1e-4)
    done()
    '''), libraries / "dense.so")


@needs_cc
def test_the_c_entry_refuses_a_null_descriptor(libraries):
    probe(CTYPES + textwrap.dedent('''
    x, w, b = np.ones((37, 29), np.float32), np.ones((29, 45), np.float32), np.ones(45, np.float32)
    y = np.zeros((37, 45), np.float32)
    assert call("tracea_dense", memref(x), None, memref(b), memref(y)) == 2
    done()
    '''), libraries / "dense.so")


@needs_cc
def test_the_c_entry_reports_faults_as_negative_codes(libraries):
    """-1 a division by zero, -2 an index out of range; the next call runs clean."""
    probe(CTYPES + textwrap.dedent('''
    a = np.arange(-18, 19, dtype=np.int32) * 7
    b = np.where(np.arange(37) % 2, 3, -5).astype(np.int32)
    q, r = np.empty(37, np.int32), np.empty(37, np.int32)
    assert call("tracea_divide", memref(a), memref(b), memref(q), memref(r)) == 0
    np.testing.assert_array_equal(q, np.trunc(a / b).astype(np.int32))
    zero = b.copy()
    zero[5] = 0
    assert call("tracea_divide", memref(a), memref(zero), memref(q), memref(r)) == -1
    assert call("tracea_divide", memref(a), memref(b), memref(q), memref(r)) == 0

    lib = ctypes.CDLL(sys.argv[2])
    table = np.arange(800, dtype=np.float32).reshape(100, 8)
    out = np.empty((3, 8), np.float32)
    for bad in ([100, 0, 0], [0, -1, 0], [0, 0, -2**63]):
        ids = np.array(bad, np.int64)
        assert call("tracea_embedding", memref(table), memref(ids), memref(out)) == -2, bad
    ids = np.array([99, 0, 42], np.int64)
    assert call("tracea_embedding", memref(table), memref(ids), memref(out)) == 0
    np.testing.assert_array_equal(out, table[ids])
    done()
    '''), libraries / "divide.so", libraries / "embedding.so")


# --- kernels called from Python with wrong arguments -----------------------------------------------------
ARGUMENTS = {  # name -> (call of k, a gemm of x 8x8 by w 8x8, or None when it must compute x @ w; error pattern)
    "too-few": ("k(x)", "takes 2 argument"),
    "shape": ("k(x[:4], w)", "must be a float32 array of shape"),
    "dtype": ("k(x.astype(np.float64), w)", "must be a float32 array of shape"),
    "object": ("k(object(), w)", "must be a numpy array"),
    "out-overlaps-an-input": ("k(x, w, out=x)", "overlaps an input"),
    "out-read-only": ("k(x, w, out=readonly)", "writeable C-contiguous"),
    "strided-input": (None, None),
}


@pytest.mark.parametrize("case", list(ARGUMENTS))
def test_kernel_arguments_are_checked(case):
    call, pattern = ARGUMENTS[case]
    check = (f"raises(tracea.errors.ArgumentError, {pattern!r}, lambda: {call})" if call else
             "np.testing.assert_allclose(k(big[:, ::2], w[::-1].copy()[::-1]), x.astype(np.float64) @ w, rtol=1e-5)")
    probe(f'''
    import numpy as np, tracea
    from tracea import dialects as td
    k = tracea.compile(td.function(td.tensor((8, 8)), td.tensor((8, 8)), name="mm")(td.gemm))
    rng = np.random.default_rng(0)
    big = rng.standard_normal((8, 16)).astype(np.float32)
    x, w = big[:, ::2].copy(), rng.standard_normal((8, 8)).astype(np.float32)
    readonly = np.empty((8, 8), np.float32)
    readonly.flags.writeable = False
    {check}
    done()
    ''')


# --- files and the command-line tools -------------------------------------------------------------------
def _tool(name: str) -> list[str]:
    script = Path(sys.executable).parent / name
    module = {"tracea-opt": "tracea.tools.opt", "tracea": "tracea.tools.cli"}[name]
    return [str(script)] if script.exists() else [sys.executable, "-m", module]


VALID = "func.func @f(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {\n  return %x : tensor<4x4xf32>\n}\n"
CLI = {  # name -> (tool, arguments with {tmp}, stdin, files to write first, stderr pattern)
    "opt-non-utf8-file": ("tracea-opt", ["{tmp}/binary.mlir"], None, {"binary.mlir": b"\xff\xfe\x00 not text"},
                          r"binary\.mlir is not UTF-8 text \(byte 0\)"),
    "opt-non-utf8-late": ("tracea-opt", ["{tmp}/late.mlir"], None, {"late.mlir": VALID.encode() + b"// \xc3\x28\n"},
                          rf"late\.mlir is not UTF-8 text \(byte {len(VALID) + 3}\)"),
    "opt-non-utf8-stdin": ("tracea-opt", [], b"func.func @f() {\n  return\n}\n// \xff\xfe\n", {},
                           r"<stdin> is not UTF-8 text"),
    "opt-nul-bytes": ("tracea-opt", ["{tmp}/nul.mlir"], None, {"nul.mlir": VALID.encode() + b"\0\0garbage"}, r"error:"),
    "opt-directory-input": ("tracea-opt", ["{tmp}"], None, {}, r"cannot read .*: Is a directory"),
    "opt-missing-input": ("tracea-opt", ["{tmp}/nothing.mlir"], None, {}, r"cannot read .*nothing\.mlir"),
    "opt-output-in-missing-directory": ("tracea-opt", ["{tmp}/ok.mlir", "-o", "{tmp}/missing/out.mlir"], None,
                                        {"ok.mlir": VALID.encode()}, r"cannot write .*missing/out\.mlir"),
    "opt-unknown-pass": ("tracea-opt", ["{tmp}/ok.mlir", "--pass-pipeline=builtin.module(no-such-pass)"], None,
                         {"ok.mlir": VALID.encode()}, r"no-such-pass"),
    "opt-bad-pass-option": ("tracea-opt", ["{tmp}/ok.mlir",
                                           "--pass-pipeline=builtin.module(tracea-cpu-kernels{{threads=x}})"],
                            None, {"ok.mlir": VALID.encode()}, r"error:"),
    "compile-gpu-non-utf8": ("tracea", ["compile-gpu", "{tmp}/binary.mlir", "-o", "{tmp}/out"], None,
                             {"binary.mlir": b"\xff\xfe\x00"}, r"binary\.mlir is not UTF-8 text"),
    "compile-gpu-missing-input": ("tracea", ["compile-gpu", "{tmp}/nothing.mlir", "-o", "{tmp}/out"], None, {},
                                  r"no such file: .*nothing\.mlir"),
    "compile-gpu-output-under-a-file": ("tracea", ["compile-gpu", "{tmp}/ok.mlir", "-o", "{tmp}/a-file/out"], None,
                                        {"ok.mlir": VALID.encode(), "a-file": b""}, r"error:"),
}
MULTI_LINE = {"opt-unknown-pass", "opt-bad-pass-option"}  # MLIR's pipeline parser points at the text


@pytest.mark.parametrize("case", list(CLI))
def test_the_command_line_tools_report_bad_files_in_one_line(case, tmp_path):
    tool, arguments, stdin, files, pattern = CLI[case]
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    command = _tool(tool) + [a.format(tmp=tmp_path) for a in arguments]
    run = fuzz.run_command(command, TIMEOUT, probe_env(TRACEA_CRASH_DIR=str(tmp_path / "crashes")), stdin)
    assert run.kind == "error" and run.returncode == 1, f"{run.kind} ({run.reason}){explain(run)}"
    lines = run.stderr.strip().splitlines()
    assert lines and (len(lines) == 1 or case in MULTI_LINE) and re.search(pattern, lines[0]), \
        f"expected one line saying {pattern!r}{explain(run)}"


# --- absurd sizes ---------------------------------------------------------------------------------------
HUGE_TEXT = '''
func.func @g(%a: tensor<1099511627776x1099511627776xf32>, %b: tensor<1099511627776x8xf32>) -> tensor<1099511627776x8xf32> {
  %c = "tracea.gemm"(%a, %b) : (tensor<1099511627776x1099511627776xf32>, tensor<1099511627776x8xf32>) -> tensor<1099511627776x8xf32>
  return %c : tensor<1099511627776x8xf32>
}
'''
HUGE_LINALG = '''
#map = affine_map<(d0, d1) -> (d0, d1)>
func.func @twice(%a: tensor<4294967296x4294967296xf32>) -> tensor<4294967296x4294967296xf32> {
  %e = tensor.empty() : tensor<4294967296x4294967296xf32>
  %r = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%a : tensor<4294967296x4294967296xf32>) outs(%e : tensor<4294967296x4294967296xf32>) {
  ^bb0(%x: f32, %o: f32):
    %y = arith.addf %x, %x : f32
    linalg.yield %y : f32
  } -> tensor<4294967296x4294967296xf32>
  return %r : tensor<4294967296x4294967296xf32>
}
'''
ZERO_TEXT = '''
func.func @g(%a: tensor<0x8xf32>, %b: tensor<8x5xf32>) -> tensor<0x5xf32> {
  %c = "tracea.gemm"(%a, %b) : (tensor<0x8xf32>, tensor<8x5xf32>) -> tensor<0x5xf32>
  return %c : tensor<0x5xf32>
}
'''
ZERO_ROWS_LINALG = '''
#map = affine_map<(d0, d1) -> (d0, d1)>
func.func @f(%a: tensor<0x64xf32>) -> tensor<0x64xf32> {
  %e = tensor.empty() : tensor<0x64xf32>
  %r = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]}
      ins(%a : tensor<0x64xf32>) outs(%e : tensor<0x64xf32>) {
  ^bb0(%x: f32, %o: f32):
    %y = arith.addf %x, %x : f32
    linalg.yield %y : f32
  } -> tensor<0x64xf32>
  return %r : tensor<0x64xf32>
}
'''
SIZES = {  # name -> (code, after `import numpy as np, tracea` and `from tracea import dialects as td`)
    "gemm-2^40-by-2^40": "raises(tracea.OpError, 'too large for 64-bit sizes', lambda: td.function("
                         "td.tensor((2**40, 2**40)), td.tensor((2**40, 8)), name='g')(td.gemm))",
    "gemm-result-past-64-bits": "raises(tracea.OpError, 'too large for 64-bit sizes', lambda: td.function("
                                "td.tensor((2**40, 8)), td.tensor((8, 2**40)), name='g')(td.gemm))",
    "size-2^63": "raises(tracea.OpError, 'too large for 64-bit sizes', td.tensor, (2**63, 4))",
    "negative-dim": "raises(tracea.OpError, 'must have positive sizes', td.tensor, (-1, 4))",
    "zero-dim": "raises(tracea.OpError, 'must have positive sizes', td.tensor, (4, 0))",
    "text-gemm-2^40": f"raises(tracea.CompileError, 'too large for 64-bit sizes', tracea.compile, {HUGE_TEXT!r})",
    "text-linalg-2^64-elements": f"raises(tracea.CompileError, 'too large for 64-bit sizes', tracea.compile, "
                                 f"{HUGE_LINALG!r})",
    # an empty operand: refused by name, or computed (an empty result)
    "text-gemm-zero-rows": f'''
try:
    k = tracea.compile({ZERO_TEXT!r})
except tracea.CompileError as e:
    assert "size 0" in str(e) or "positive" in str(e), e
else:
    assert k(np.zeros((0, 8), np.float32), np.ones((8, 5), np.float32)).shape == (0, 5)''',
    "text-elementwise-zero-rows": f'''
try:
    k = tracea.compile({ZERO_ROWS_LINALG!r})
except tracea.CompileError as e:
    assert "size 0" in str(e), e
else:
    assert k(np.zeros((0, 64), np.float32)).shape == (0, 64)''',
    "non-integral-size": "raises(tracea.OpError, 'size', td.tensor, (2.5, 4))",
    "size-not-a-number": "raises(tracea.OpError, 'size', td.tensor, ('a', 4))",
    "unknown-dtype": "raises(tracea.OpError, 'f8', lambda: td.function(td.tensor((4, 4), 'f8'), name='s')(td.softmax))",
}


@pytest.mark.parametrize("case", list(SIZES))
def test_absurd_sizes_are_refused_by_name(case):
    probe("import numpy as np, tracea\nfrom tracea import dialects as td\n" + SIZES[case] + "\ndone()\n")


HUGE_K = '''
func.func @gemm(%a: tensor<128x1099511627776xf16>, %b: tensor<1099511627776x256xf16>) -> tensor<128x256xf32> {
  %c = "tracea.gemm"(%a, %b) : (tensor<128x1099511627776xf16>, tensor<1099511627776x256xf16>) -> tensor<128x256xf32>
  return %c : tensor<128x256xf32>
}
'''


def test_a_gpu_gemm_with_a_huge_k_is_no_hang(tmp_path):
    """A clean error or a kernel within seconds (a normal compile of this pass takes one)."""
    (tmp_path / "k.mlir").write_text(HUGE_K)
    run = fuzz.run_command(_tool("tracea-opt") + [str(tmp_path / "k.mlir"),
                                                  "--pass-pipeline=builtin.module(tracea-gpu-kernels)"],
                           8, probe_env(TRACEA_CRASH_DIR=str(tmp_path / "crashes")))
    assert run.kind in ("ok", "error"), f"{run.kind} ({run.reason}){explain(run)}"


# --- damaged cache entries (ten more kinds: test/test_disk_cache.py) ------------------------------------------------
CACHE_PROBE = '''
import os, warnings
from pathlib import Path
import numpy as np, tracea
from tracea import dialects as td

cache = Path(os.environ["TRACEA_CACHE_DIR"])
fn = td.function(td.tensor((37, 29)), td.tensor((29, 45)), name="mm")(td.gemm)
rng = np.random.default_rng(0)
a, b = rng.standard_normal((37, 29)).astype(np.float32), rng.standard_normal((29, 45)).astype(np.float32)

def compile_again():
    """(origin, warnings about unusable entries): a new process's compile, the result checked."""
    tracea.clear_cache()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        k = tracea.compile(fn)
        np.testing.assert_allclose(k(a, b), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    return k, [str(w.message) for w in caught if "unusable" in str(w.message)]

k, warned = compile_again()
assert k.origin == "compiled" and not warned, (k.origin, warned)
keys = {p.name.split(".")[0] for p in cache.glob("*.so.json")}
key = keys.pop() if keys else None
def entry(suffix):
    return cache / f"{key}{suffix}"
'''
CACHE = {  # name -> (damage, after CACHE_PROBE; warnings expected at the next compile)
    "description-empty": ("entry('.so.json').write_bytes(b'')", 1),
    "description-not-utf8": ("entry('.so.json').write_bytes(b'\\xff\\xfe{\\x00}')", 1),
    "description-nested-too-deep": ("entry('.so.json').write_text('[' * 100000)", 1),
    "description-is-a-directory": ("entry('.so.json').unlink(); entry('.so.json').mkdir()", 1),
    "library-is-a-directory": ("entry('.so').unlink(); entry('.so').mkdir()", 1),
    "library-empty": ("entry('.so').write_bytes(b'')", 1),
    "damaged-is-a-file": ("(cache / 'damaged').write_text('not a directory'); entry('.so').write_bytes(b'x')", 1),
}


@pytest.mark.parametrize("case", list(CACHE))
def test_a_damaged_cache_entry_is_compiled_again(case, tmp_path):
    """One warning, the right result, and the entry usable again by the compile after."""
    damage, warnings_expected = CACHE[case]
    probe(CACHE_PROBE + f'''
{damage}
k, warned = compile_again()
assert k.origin == "compiled" and len(warned) == {warnings_expected}, (k.origin, warned)
k, warned = compile_again()
assert k.origin == "disk cache" and not warned, (k.origin, warned)
done()
''', env=probe_env(TRACEA_DISK_CACHE="1", TRACEA_CACHE_DIR=str(tmp_path / "cache")))


def test_a_cached_kernel_whose_header_is_gone_still_exports(tmp_path):
    """The header is not checked on load (nothing reads it); exporting such a kernel copies the
    entry: a missing header must be written again or refused by name, not a FileNotFoundError."""
    probe(CACHE_PROBE + '''
entry('.so.h').unlink()
k, warned = compile_again()
assert k.origin == "disk cache", k.origin
out = cache.parent / "out"
out.mkdir()
try:
    k.export(out / "mm.so")
except tracea.TraceaError as e:
    print("refused:", e)
else:
    assert (out / "mm.so.h").exists()
done()
''', env=probe_env(TRACEA_DISK_CACHE="1", TRACEA_CACHE_DIR=str(tmp_path / "cache")))


def test_a_cache_directory_that_is_a_file_only_turns_the_cache_off(tmp_path):
    (tmp_path / "cache").write_text("a file where the cache directory should be")
    probe(CACHE_PROBE + '''
k, warned = compile_again()
assert k.origin == "compiled" and not warned, (k.origin, warned)
done()
''', env=probe_env(TRACEA_DISK_CACHE="1", TRACEA_CACHE_DIR=str(tmp_path / "cache")))


def test_a_damaged_import_text_entry_is_ignored(tmp_path):
    """The linalg-import cache (PyTorch models' IR): damaged, it is a miss, never wrong text."""
    probe('''
import os
from pathlib import Path
from tracea.runtime import disk_cache
cache = Path(os.environ["TRACEA_CACHE_DIR"])
text = "func.func @f() {\\n  return\\n}\\n"
damages = {"not-utf8": lambda d: b"\\xff" + d[1:], "truncated": lambda d: d[:len(d) // 2], "empty": lambda d: b"",
           "digest-only": lambda d: d.split(b"\\n")[0], "other-text": lambda d: d.replace(b"return", b"retxrn")}
for name, damage in damages.items():
    disk_cache.store_text(name, text)
    assert disk_cache.lookup_text(name) == text
    path = cache / f"{name}.text"
    path.write_bytes(damage(path.read_bytes()))
    assert disk_cache.lookup_text(name) is None, name
    disk_cache.store_text(name, text)
    assert disk_cache.lookup_text(name) == text, name
done()
''', env=probe_env(TRACEA_DISK_CACHE="1", TRACEA_CACHE_DIR=str(tmp_path / "cache")))


# --- a sample of the mutation fuzzing (scripts/fuzz_ir.py) -----------------------------------------------------
FUZZ_SEED = 22
FUZZ_FIXED = 16  # mutants of the lit corpus from FUZZ_SEED, the same in every run
FUZZ_DRAWN = 2  # and from seeds drawn per run


@functools.lru_cache(maxsize=1)
def _lit_corpus():
    return fuzz.lit_corpus(ROOT)


def _check_mutant(seed_number: int, index: int, tmp_path: Path) -> None:
    corpus = _lit_corpus()
    seed, data, mutations = fuzz.mutant(seed_number, "lit", index, corpus)
    path = tmp_path / f"mutant-{seed_number}-{index}.mlir"
    path.write_bytes(data)
    env = fuzz.opt_env(tmp_path)
    for pipeline, run in fuzz.check_mutant(path, seed, 60, env):
        assert run.kind not in fuzz.DEFECTS, (
            f"{run.kind}: {run.reason}\nreproduce: {fuzz.shell_command(path, pipeline)}\n"
            f"(mutant {index} of {seed.name} for scripts/fuzz_ir.py --seed {seed_number}: {mutations})\n"
            f"{run.stderr[-4000:]}")


@pytest.mark.parametrize("index", range(FUZZ_FIXED))
def test_a_mutant_of_the_lit_corpus_is_no_crash(index, tmp_path):
    _check_mutant(FUZZ_SEED, index, tmp_path)


@pytest.mark.parametrize("draw", range(FUZZ_DRAWN))
def test_a_mutant_from_a_drawn_seed_is_no_crash(draw, tmp_path):
    seed_number = random.SystemRandom().randrange(1, 2 ** 31)
    print(f"scripts/fuzz_ir.py --seed {seed_number}, mutant 0 of the lit corpus")
    _check_mutant(seed_number, 0, tmp_path)
