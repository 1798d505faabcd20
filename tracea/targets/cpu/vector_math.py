"""`tracea-vector-exp`: `math.exp`, `math.tanh` and `math.erf` on f32 vectors as polynomials in arith ops.

MLIR lowers a vector `math.exp` to LLVM's exp intrinsic, which the x86 code generator scalarizes
into one libm call per lane: once tracea-cpu-tile-linalg vectorized the elementwise loop nests a
model leaves outside the kernels, a sigmoid over 1024x1024 took 3.1 ms where eager torch takes
1.0 ms. Here each becomes `vector_exp` (codegen/kernel_text.py, Cephes expf, ~1 ulp), with
IEEE's edges kept: +inf above 88.72 (the polynomial clamps), NaN in, NaN out. Below -87.3 the
result is 0 where libm gives a subnormal. tanh (a GELU written out, as Hugging Face's GPT-2 does:
a fifth of its time went to libm's tanhf) is Cephes tanhf: an odd polynomial below |x| = 0.625,
1 - 2 / (exp(2|x|) + 1) with x's sign above (~2 ulp; the GEMM epilogues' (e - 1) / (e + 1) loses
relative precision near 0). erf (the exact GELU of ViT and BERT: a GEMM epilogue calling libm's
erff once per element was a fifth of a ViT's time) is a polynomial below 1 and 1 - exp(-x^2) times
a polynomial in 1 / x up to 4, fitted here.
"""
from __future__ import annotations

from dataclasses import dataclass

import mlir.ir as ir

from ...codegen.kernel_text import constant_text, vector_exp
from ...passes.lower_to_linalg import inline_kernel
from ...passes.registry import TraceaPass, register

OVERFLOW = 88.72283935546875  # the largest f32 x with a finite exp(x)


class _Text:
    """The op(text, hint) writer vector_exp takes."""

    def __init__(self):
        self.lines: list[str] = []

    def op(self, text: str, hint: str = "v") -> str:
        name = f"%{hint}{len(self.lines)}"
        self.lines.append(f"{name} = {text}")
        return name


def _vector_function(name: str, lanes: int, compute) -> str:
    """func @name(%x) on f32 vectors (lanes 0: on an f32 scalar): compute(t, vt, it, bt) -> its
    value, NaN passed through."""
    vt, it, bt = (f"vector<{lanes}xf32>", f"vector<{lanes}xi32>", f"vector<{lanes}xi1>") if lanes else ("f32", "i32", "i1")
    t = _Text()
    y = compute(t, vt, it, bt)
    nan = t.op(f"arith.cmpf uno, %x, %x : {vt}", "p")
    y = t.op(f"arith.select {nan}, %x, {y} : {bt}, {vt}", "s")
    body = "\n  ".join(t.lines)
    return f"func.func private @{name}(%x: {vt}) -> {vt} {{\n  {body}\n  return {y} : {vt}\n}}"


def _splat(t, vt: str, value: float) -> str:
    """A constant vector of `value`."""
    return t.op(constant_text(value, vt), "k")


def _signed_as_x(t, vt: str, bt: str, v: str) -> str:
    """v >= 0 with the sign of %x (nonzero where this is used). A select, not math.copysign's
    bit operations: Mesa 26's lavapipe computed tanh's copysign wrong (0 or |tanh| > 1), and
    SPIR-V keeps the signs exact either way."""
    negative = t.op(f"arith.cmpf olt, %x, {_splat(t, vt, 0.0)} : {vt}", "c")
    return t.op(f"arith.select {negative}, {t.op(f'arith.negf {v} : {vt}', 'y')}, {v} : {bt}, {vt}", "y")


def _horner(t, vt: str, coefficients, v: str) -> str:
    """The polynomial with these coefficients (highest degree first, as Cephes lists them) at v."""
    p = _splat(t, vt, coefficients[0])
    for c in coefficients[1:]:
        p = t.op(f"math.fma {p}, {v}, {_splat(t, vt, c)} : {vt}", "p")
    return p


def exp_function(lanes: int) -> str:
    def compute(t, vt, it, bt):
        y = vector_exp(t, "%x", vt, it)
        big = t.op(f"arith.cmpf ogt, %x, {_splat(t, vt, OVERFLOW)} : {vt}", "p")
        inf = "dense<0x7F800000>" if vt.startswith("vector") else "0x7F800000"
        return t.op(f"arith.select {big}, {t.op(f'arith.constant {inf} : {vt}', 'k')}, {y} : {bt}, {vt}", "s")

    return _vector_function("exp", lanes, compute)


# Cephes tanhf: tanh x = x + x^3 P(x^2) for |x| < 0.625
TANH_SMALL = 0.625
TANH_POLYNOMIAL = (-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1, -3.33332819422e-1)


def tanh_function(lanes: int) -> str:
    def compute(t, vt, it, bt):
        ax = t.op(f"math.absf %x : {vt}", "a")
        z = t.op(f"arith.mulf %x, %x : {vt}", "z")
        p = _horner(t, vt, TANH_POLYNOMIAL, z)
        small = t.op(f"math.fma {t.op(f'arith.mulf {p}, {z} : {vt}', 'p')}, %x, %x : {vt}", "y")
        zero = t.op(f"arith.cmpf oeq, %x, {_splat(t, vt, 0.0)} : {vt}", "c")
        small = t.op(f"arith.select {zero}, %x, {small} : {bt}, {vt}", "y")  # tanh(-0) = -0
        # exp(2|x|) saturates (to the largest finite f32) past |x| = 44: 2 / (e + 1) is then 0
        e = vector_exp(t, t.op(f"arith.addf {ax}, {ax} : {vt}", "e"), vt, it)
        one = _splat(t, vt, 1.0)
        e_plus_one = t.op(f"arith.addf {e}, {one} : {vt}", "e")
        two_over = t.op(f"arith.divf {_splat(t, vt, 2.0)}, {e_plus_one} : {vt}", "e")
        large = _signed_as_x(t, vt, bt, t.op(f"arith.subf {one}, {two_over} : {vt}", "y"))
        return t.op(f"arith.select {t.op(f'arith.cmpf olt, {ax}, {_splat(t, vt, TANH_SMALL)} : {vt}', 'c')}, {small}, "
                    f"{large} : {bt}, {vt}", "y")

    return _vector_function("tanh", lanes, compute)


# erf, fitted here (Chebyshev least squares in float64, against scipy's erf and erfc; highest
# degree first):
# |x| < 1: erf x = x P(x^2), within 2.6 ulps in f32; 1 <= |x| < 4: erf x = 1 - exp(-x^2) Q(1 / x),
# within 1.4 ulps; beyond, +-1 (erf 4 = 1 - 1.5e-8 rounds to 1)
ERF_SWITCH, ERF_ONE = 1.0, 4.0
ERF_SMALL = (8.00685811555013e-05, -0.0008053746423684061, 0.005192957352846861, -0.026856068521738052,
             0.11283634603023529, -0.3761262893676758, 1.128379225730896)
ERF_LARGE = (-0.0180293507874012, 0.12172320485115051, -0.35653072595596313, 0.5783967971801758,
             -0.5075471997261047, 0.05157828703522682, 0.5576348900794983, 0.00035778144956566393)


def erf_function(lanes: int) -> str:
    def compute(t, vt, it, bt):
        ax = t.op(f"math.absf %x : {vt}", "a")
        z = t.op(f"arith.mulf %x, %x : {vt}", "z")
        small = t.op(f"arith.mulf %x, {_horner(t, vt, ERF_SMALL, z)} : {vt}", "y")  # keeps -0
        clamped = t.op(f"arith.minimumf {ax}, {_splat(t, vt, ERF_ONE)} : {vt}", "a")  # inf: no inf * 0 below
        e = vector_exp(t, t.op(f"arith.negf {t.op(f'arith.mulf {clamped}, {clamped} : {vt}', 'z')} : {vt}", "e"),
                       vt, it, at_most_zero=True)
        q = _horner(t, vt, ERF_LARGE, t.op(f"arith.divf {_splat(t, vt, 1.0)}, {clamped} : {vt}", "r"))
        large = t.op(f"arith.subf {_splat(t, vt, 1.0)}, {t.op(f'arith.mulf {e}, {q} : {vt}', 'e')} : {vt}", "y")
        one = t.op(f"arith.cmpf oge, {ax}, {_splat(t, vt, ERF_ONE)} : {vt}", "c")
        large = _signed_as_x(t, vt, bt, t.op(f"arith.select {one}, {_splat(t, vt, 1.0)}, {large} : {bt}, {vt}", "y"))
        return t.op(f"arith.select {t.op(f'arith.cmpf olt, {ax}, {_splat(t, vt, ERF_SWITCH)} : {vt}', 'c')}, {small}, "
                    f"{large} : {bt}, {vt}", "y")

    return _vector_function("erf", lanes, compute)


_FUNCTIONS = {"math.exp": exp_function, "math.tanh": tanh_function, "math.erf": erf_function}


@register
@dataclass(frozen=True)
class VectorExpPass(TraceaPass):
    NAME = "tracea-vector-exp"
    SUMMARY = ("math.exp, math.tanh and math.erf on 1-D f32 vectors as polynomials in arith ops (LLVM would "
               "call libm once per lane)")

    def run(self, module: ir.Operation) -> None:
        found = []

        def collect(op):
            if op.name in _FUNCTIONS and isinstance(op.results[0].type, ir.VectorType):
                vt = ir.VectorType(op.results[0].type)
                if vt.rank == 1 and str(vt.element_type) == "f32":
                    found.append((op, vt.shape[0]))
            return ir.WalkResult.ADVANCE

        module.walk(collect)
        for op, lanes in found:
            inline_kernel(op, _FUNCTIONS[op.name](lanes))


@register
@dataclass(frozen=True)
class ScalarMathPass(TraceaPass):
    NAME = "tracea-scalar-math"
    SUMMARY = ("math.exp, math.tanh and math.erf on f32 scalars as the polynomials of tracea-vector-exp (GPU "
               "kernels: SPIR-V has no erf and Vulkan's exp may be off by 3 + 2|x| ulps; AMD's would be calls "
               "into ROCm's device library)")

    def run(self, module: ir.Operation) -> None:
        found = []

        def collect(op):
            if op.name in _FUNCTIONS and str(op.results[0].type) == "f32":
                found.append(op)
            return ir.WalkResult.ADVANCE

        module.walk(collect)
        for op in found:
            inline_kernel(op, _FUNCTIONS[op.name](0))
