"""`tracea-vector-exp`: `math.exp` on f32 vectors as a polynomial in arith ops.

MLIR lowers a vector `math.exp` to LLVM's exp intrinsic, which the x86 code generator scalarizes
into one libm call per lane: once tracea-cpu-tile-linalg vectorized the elementwise loop nests a
model leaves outside the kernels, a sigmoid over 1024x1024 took 3.1 ms where eager torch takes
1.0 ms. Here each becomes `vector_exp` (codegen/kernel_text.py, Cephes expf, ~1 ulp), with
IEEE's edges kept: +inf above 88.72 (the polynomial clamps), NaN in, NaN out. Below -87.3 the
result is 0 where libm gives a subnormal. (tanh and erf keep libm: the polynomials the GEMM
epilogues use lose relative precision near 0, fine inside GELU, not for the functions alone.)
"""
from __future__ import annotations

from dataclasses import dataclass

import mlir.ir as ir

from ...codegen.kernel_text import vector_exp
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


def exp_function(lanes: int) -> str:
    vt, it, bt = f"vector<{lanes}xf32>", f"vector<{lanes}xi32>", f"vector<{lanes}xi1>"
    t = _Text()
    y = vector_exp(t, "%x", vt, it)
    big = t.op(f"arith.cmpf ogt, %x, {t.op(f'arith.constant dense<{OVERFLOW!r}> : {vt}', 'k')} : {vt}", "p")
    y = t.op(f"arith.select {big}, {t.op(f'arith.constant dense<0x7F800000> : {vt}', 'k')}, {y} : {bt}, {vt}", "s")
    nan = t.op(f"arith.cmpf uno, %x, %x : {vt}", "p")
    y = t.op(f"arith.select {nan}, %x, {y} : {bt}, {vt}", "s")
    body = "\n  ".join(t.lines)
    return f"func.func private @exp(%x: {vt}) -> {vt} {{\n  {body}\n  return {y} : {vt}\n}}"


@register
@dataclass(frozen=True)
class VectorExpPass(TraceaPass):
    NAME = "tracea-vector-exp"
    SUMMARY = "math.exp on 1-D f32 vectors as a polynomial in arith ops (LLVM would call libm once per lane)"

    def run(self, module: ir.Operation) -> None:
        found = []

        def collect(op):
            if op.name == "math.exp" and isinstance(op.results[0].type, ir.VectorType):
                vt = ir.VectorType(op.results[0].type)
                if vt.rank == 1 and str(vt.element_type) == "f32":
                    found.append((op, vt.shape[0]))
            return ir.WalkResult.ADVANCE

        module.walk(collect)
        for op, lanes in found:
            inline_kernel(op, exp_function(lanes))
