"""Constructs from torch-mlir's e2e suite that crashed the compiler or the caller, one test per
root cause, each compared with eager PyTorch at the output dtype's precision.

- untranslatable LLVM-dialect modules: the translation's null module was printed (SIGSEGV in the
  compiler process); now a CompileError naming the ops left over;
- vector transfers convert-vector-to-llvm cannot lower (a broadcast from a 0-d tensor, a strided
  innermost dimension: `a + b` with `b` 0-d, `x[:, ::2]`, transposed convolutions, bucketize);
- integer division: masked-off vector lanes divided by 0 (SIGFPE in the caller for any integer
  fmod of a length that is no multiple of the vector), and real divisions by zero / INT_MIN / -1;
  torch's integer floor division through f64 (inexact for int64);
- math.fpowi on vectors (llvm.intr.powi with a vector<..xi64> exponent);
- torch-mlir's own crash importing an int8 matmul (in the caller's process before the import ran
  in a forked child).

Whatever can kill the process runs in a subprocess, so a regression fails its test instead of
taking pytest down.
"""
import json
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tracea  # before torch_mlir (see tracea/__init__.py)

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'tracea[torch]')")
pytest.importorskip("torch_mlir.fx", reason="torch-mlir is not installed (pip install 'tracea[torch]')")

# Imports a torch function as linalg on tensors with torch-mlir itself (not Tracea's front end,
# which would fall back to PyTorch for what fails to compile and hide a regression here).
PRELUDE = '''
import json, sys
import numpy as np
import tracea
import torch
from torch_mlir import fx


class Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def linalg(fn, *args):
    program = torch.export.export(Fn(fn), args)
    module = fx.export_and_import(program, output_type="linalg-on-tensors", func_name="main")
    return module.operation.get_asm(print_generic_op_form=True, large_elements_limit=None)


def compiled(fn, *args, **options):
    return tracea.compile(linalg(fn, *args), **options)


def run(kernel, *args):
    return torch.from_numpy(np.asarray(kernel(*[a.numpy() for a in args])))
'''
exec(PRELUDE)  # the same helpers in this process  # noqa: S102


def run_isolated(body: str, timeout: float = 300) -> dict:
    """Run PRELUDE + body in a fresh Python; it prints one JSON object last. A crash (a signal)
    fails the test, naming the signal."""
    code = PRELUDE + textwrap.dedent(body)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    if done.returncode < 0:
        pytest.fail(f"the process was killed by {signal.Signals(-done.returncode).name}:\n{done.stderr[-4000:]}")
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def assert_matches(got, expected):
    assert got.dtype == expected.dtype and got.shape == expected.shape
    if expected.dtype.is_floating_point:
        eps = torch.finfo(expected.dtype).eps
        torch.testing.assert_close(got, expected, rtol=16 * eps, atol=16 * eps, equal_nan=True)
    else:
        assert torch.equal(got, expected)


# --- the LLVM translation -------------------------------------------------------------------------
def test_untranslatable_module_is_a_compile_error_not_a_crash():
    """The Python binding printed the null module a failed translation returns: SIGSEGV."""
    result = run_isolated('''
        import mlir.ir as ir
        from tracea.dialects.context import shared_context
        from tracea.errors import CompileError
        from tracea.targets.cpu import native

        messages = []
        with shared_context("pipeline") as context:
            module = ir.Module.parse("func.func @f(%x: i32) -> i32 { return %x : i32 }", context)
            try:
                native.object_code(module, [])
            except CompileError as e:
                messages.append(str(e))
            native._untranslatable_ops = lambda op: []  # past the check: MLIR's translation fails
            try:
                native.object_code(module, [])
            except CompileError as e:
                messages.append(str(e))
        print(json.dumps(messages))
    ''')
    assert len(result) == 2
    assert "left ops no conversion took" in result[0] and "func.func" in result[0] and "func.return" in result[0]
    assert "translating the LLVM dialect to LLVM IR failed" in result[1]


# --- vector transfers the LLVM conversion cannot take ----------------------------------------------
@pytest.mark.parametrize("case", ["rank0", "unit_dims", "step_slice", "bucketize"])
def test_vector_transfers_that_llvm_cannot_lower(case):
    """Broadcasts from a 0-d or 1x1 tensor (torch-mlir's `() -> ()` / `(d0, d1) -> (0, 0)` maps)
    and reads of a strided slice became vector.transfer_read ops convert-vector-to-llvm left
    behind; they now become loads + broadcasts or scalar loops."""
    g = torch.Generator().manual_seed(0)
    fn, args = {
        "rank0": (lambda a, b: a + b, (torch.rand(37, generator=g), torch.rand((), generator=g))),
        "unit_dims": (lambda a, b: torch.pow(a, b), (torch.rand(3, 20, generator=g), torch.rand(1, 1, generator=g))),
        "step_slice": (lambda x, y: x[:, 1::3] * 2.0 + y, (torch.randn(4, 30, generator=g), torch.randn(4, 10, generator=g))),
        "bucketize": (lambda x, b: torch.bucketize(x, b), (torch.randint(0, 10, (3, 4), generator=g), torch.tensor([1, 5, 9]))),
    }[case]
    assert_matches(run(compiled(fn, *args), *args), fn(*args))


def test_transposed_convolution_strided_copy_is_not_vectorized():
    """A transposed convolution scatters its input into every other element (a memref.copy into a
    subview of stride 2 once bufferized): the copy is split among threads but not vectorized."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(2, 3, 9, generator=g), torch.randn(3, 4, 3, generator=g)
    fn = lambda x, w: torch.nn.functional.conv_transpose1d(x, w, stride=2, padding=1)  # noqa: E731
    kernel = compiled(fn, x, w, keep_stages=True)
    assert_matches(run(kernel, x, w), fn(x, w))
    bufferized = kernel.stages["bufferized"]
    assert "strided<[" in bufferized and ", 2]" in bufferized  # the scattering copy is there
    for line in bufferized.splitlines():
        if "vector.transfer_" in line:
            assert not any(f", {s}]" in line.split("memref<")[-1] for s in range(2, 10)), line


@pytest.mark.parametrize("stride", [2, (2, 3)])
def test_transposed_convolution_2d(stride):
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(1, 4, 7, 6, generator=g), torch.randn(4, 5, 3, 3, generator=g)
    fn = lambda x, w: torch.nn.functional.conv_transpose2d(x, w, stride=stride, output_padding=1)  # noqa: E731
    assert_matches(run(compiled(fn, x, w), x, w), fn(x, w))


# --- integer division ------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_integer_division_never_traps(dtype):
    """Each op on 37 elements (a vector remainder: the masked lanes once divided by 0, SIGFPE even
    with no zero divisor), INT_MIN / -1 (torch: INT_MIN, remainders 0) and a zero divisor (torch
    raises ZeroDivisionError; so does the kernel)."""
    result = run_isolated(f'''
        dtype = torch.{dtype}
        info = torch.iinfo(dtype)
        ops = {{"fmod": torch.fmod, "remainder": torch.remainder, "floor_divide": torch.floor_divide,
               "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
               "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor")}}
        g = torch.Generator().manual_seed(0)
        a = torch.randint(info.min, info.max, (37,), dtype=dtype, generator=g)
        b = torch.randint(-1000, 1000, (37,), dtype=dtype, generator=g)
        b[b == 0] = 7
        a[0], b[0] = info.min, -1
        b[1:5] = torch.tensor([1, -1, 2, -2])
        zero = b.clone()
        zero[11] = 0
        out = {{}}
        for name, op in ops.items():
            kernel = compiled(op, a, b)
            got = run(kernel, a, b)
            # eager torch itself traps on INT_MIN / -1 in trunc division of int32 / int64: its
            # int8 / int16 and floor division give INT_MIN (two's complement wrap), as here
            expected = torch.cat([torch.tensor([info.min], dtype=dtype) if name == "div_trunc"
                                  else op(a[:1], b[:1]), op(a[1:], b[1:])])
            try:
                run(kernel, a, zero)
                raised = False
            except ZeroDivisionError:
                raised = True
            try:
                op(a[1:], zero[1:])  # not INT_MIN / -1, which eager torch computes (and traps on) first
                torch_raised = False
            except RuntimeError as e:
                torch_raised = "ZeroDivisionError" in str(e)
            out[name] = [got.dtype == expected.dtype and torch.equal(got, expected), raised, torch_raised,
                         run(kernel, a, b).tolist() == got.tolist()]  # no fault left over from the raise
        print(json.dumps(out))
    ''')
    for name, (equal, raised, torch_raised, again) in result.items():
        assert equal, f"{name}: differs from eager torch"
        assert raised and torch_raised, f"{name}: a zero divisor raised ZeroDivisionError: {raised} (torch: {torch_raised})"
        assert again, name


DIVISIONS_IR = """
#map = affine_map<(d0) -> (d0)>
func.func @divisions(%a: tensor<37xi32>, %b: tensor<37xi32>, %c: tensor<37xi8>, %d: tensor<37xi8>)
    -> (tensor<37xi32>, tensor<37xi32>, tensor<37xi32>, tensor<37xi32>, tensor<37xi32>, tensor<37xi8>) {
  %e0 = tensor.empty() : tensor<37xi32>
  %e1 = tensor.empty() : tensor<37xi32>
  %e2 = tensor.empty() : tensor<37xi32>
  %e3 = tensor.empty() : tensor<37xi32>
  %e4 = tensor.empty() : tensor<37xi32>
  %e5 = tensor.empty() : tensor<37xi8>
  %r:6 = linalg.generic {indexing_maps = [#map, #map, #map, #map, #map, #map, #map, #map, #map, #map],
                         iterator_types = ["parallel"]}
      ins(%a, %b, %c, %d : tensor<37xi32>, tensor<37xi32>, tensor<37xi8>, tensor<37xi8>)
      outs(%e0, %e1, %e2, %e3, %e4, %e5 : tensor<37xi32>, tensor<37xi32>, tensor<37xi32>, tensor<37xi32>, tensor<37xi32>, tensor<37xi8>) {
  ^bb0(%x: i32, %y: i32, %x8: i8, %y8: i8, %o0: i32, %o1: i32, %o2: i32, %o3: i32, %o4: i32, %o5: i8):
    %0 = arith.divui %x, %y : i32
    %1 = arith.remui %x, %y : i32
    %2 = arith.ceildivui %x, %y : i32
    %3 = arith.ceildivsi %x, %y : i32
    %4 = arith.floordivsi %x, %y : i32
    %5 = arith.remsi %x8, %y8 : i8
    linalg.yield %0, %1, %2, %3, %4, %5 : i32, i32, i32, i32, i32, i8
  } -> (tensor<37xi32>, tensor<37xi32>, tensor<37xi32>, tensor<37xi32>, tensor<37xi32>, tensor<37xi8>)
  return %r#0, %r#1, %r#2, %r#3, %r#4, %r#5 : tensor<37xi32>, tensor<37xi32>, tensor<37xi32>, tensor<37xi32>, tensor<37xi32>, tensor<37xi8>
}
"""


@pytest.mark.parametrize("strategy,threads", [("tiled", 2), ("reference", 1)])
def test_every_integer_division_op_is_guarded(strategy, threads):
    """arith's unsigned, ceil and floor divisions and an i8 remainder at INT_MIN / -1, written
    directly: the guard covers each op whatever produced it, in both strategies."""
    result = run_isolated(f'''
        ir_text = {DIVISIONS_IR!r}
        kernel = tracea.compile(ir_text, strategy={strategy!r}, threads={threads})
        rng = np.random.default_rng(0)
        a = rng.integers(-2**31, 2**31, 37).astype(np.int32)
        b = rng.integers(-50, 50, 37).astype(np.int32)
        b[b == 0] = 3
        c = rng.integers(-128, 128, 37).astype(np.int8)
        d = rng.integers(-5, 5, 37).astype(np.int8)
        d[d == 0] = 2
        c[0], d[0] = -128, -1
        got = kernel(a, b, c, d)
        ua, ub = a.view(np.uint32).astype(np.int64), b.view(np.uint32).astype(np.int64)
        sa, sb = a.astype(np.int64), b.astype(np.int64)
        expected = [(ua // ub).astype(np.uint32).view(np.int32), (ua % ub).astype(np.uint32).view(np.int32),
                    (-(-ua // ub)).astype(np.uint32).view(np.int32), (-(-sa // sb)).astype(np.int32),
                    (sa // sb).astype(np.int32), np.fmod(c.astype(np.int64), d).astype(np.int8)]
        equal = [bool(np.array_equal(g, e)) for g, e in zip(got, expected)]
        raised = []
        for which in range(2):
            zb, zd = b.copy(), d.copy()
            (zb if which == 0 else zd)[9] = 0
            try:
                kernel(a, zb, c, zd)
                raised.append(False)
            except ZeroDivisionError:
                raised.append(True)
        print(json.dumps({{"equal": equal, "raised": raised}}))
    ''')
    assert result["equal"] == [True] * 6
    assert result["raised"] == [True, True]


def test_int64_floor_division_is_exact():
    """torch-mlir divides int64 through f64 (fptosi(floor(sitofp a / sitofp b))): wrong past 2^53."""
    a = torch.tensor([9223372036854775806, -9223372036854775807, 1073741824, -3, 2**53 + 1, -(2**60) - 7])
    fn = lambda a: torch.div(a, 1073741824, rounding_mode="floor")  # noqa: E731
    assert_matches(run(compiled(fn, a), a), fn(a))
    b = torch.tensor([3, -7, 5, 2, -3, 11])
    assert_matches(run(compiled(torch.floor_divide, a, b), a, b), torch.floor_divide(a, b))


# --- math.fpowi -------------------------------------------------------------------------------------
@pytest.mark.parametrize("exponent", [2.0, 3, -1, -2, 0, 1, 4, -3])
def test_pow_with_integral_exponent(exponent):
    """torch.pow(x, n) is math.fpowi with an i64 exponent; vectorized, it became llvm.intr.powi
    with a vector<..xi64> exponent that the LLVM dialect rejects."""
    x = torch.randn(5, 37, generator=torch.Generator().manual_seed(0))
    fn = lambda x: torch.pow(x, exponent)  # noqa: E731
    assert_matches(run(compiled(fn, x), x), fn(x))


# --- torch-mlir's import -----------------------------------------------------------------------------
def test_int8_matmul_does_not_kill_the_caller():
    """torch-mlir's aten.mm lowering for int8 builds a linalg.yield of a null value ("for conversion
    to byte or char type dstOriginalDtype has to be passed") and segfaults: in the caller's process
    when the import ran there. Now the caller gets a result (the mm in PyTorch, or compiled)."""
    result = run_isolated('''
        a = torch.randint(-100, 100, (16, 4), generator=torch.Generator().manual_seed(0)).to(torch.int8)
        b = torch.randint(-100, 100, (4, 16), generator=torch.Generator().manual_seed(1)).to(torch.int8)
        model = Fn(lambda a, b: torch.ops.aten.mm(a, b))
        try:
            out = tracea.compile(model, (a, b))(a, b)
            print(json.dumps({"equal": bool(torch.equal(out, model(a, b)))}))
        except tracea.CompileError as e:
            print(json.dumps({"error": str(e)}))
    ''')
    assert result.get("equal", True), result
