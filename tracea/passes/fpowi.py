"""`tracea-expand-fpowi`: `math.fpowi` (a float to an integer power) as multiplications or powf.

torch-mlir writes `torch.pow(x, 2.0)` and other integral scalar exponents as `math.fpowi(x, n)`
with an i64 exponent. MLIR lowers that to `llvm.intr.powi`, which takes a scalar exponent only:
once tracea-cpu-tile-linalg vectorized the body, the LLVM lowering left a `vector<..xi64>`
exponent that the op's verifier rejects, and LLVM's x86 code generator cannot call its powi
routine (`__powisf2(float, int)`) with an i64 exponent either.

Rewritten on linalg on tensors (before vectorizing) the way eager PyTorch computes pow with a
scalar exponent on the CPU: 2 as x * x, 3 as x * x * x, -1 as 1 / x, -2 as 1 / (x * x), 0 as 1,
1 as x, any other exponent as `math.powf(x, n)` (std::pow); a non-constant exponent as
`math.powf(x, sitofp(n))` (torch promotes an integer exponent tensor to the float dtype).
"""
from __future__ import annotations

from dataclasses import dataclass

import mlir.ir as ir
from mlir.dialects import arith, math

from .registry import TraceaPass, register


def _constant_exponent(value: ir.Value) -> int | None:
    if not isinstance(value, ir.OpResult) or value.owner.name != "arith.constant":
        return None
    attr = value.owner.attributes["value"]
    if isinstance(attr, ir.IntegerAttr):
        return attr.value
    if isinstance(attr, ir.DenseIntElementsAttr) and attr.is_splat:
        return ir.IntegerAttr(attr.get_splat_value()).value
    return None


def _float_constant(t: ir.Type, v: float) -> ir.Value:
    if isinstance(t, ir.VectorType):
        element = ir.VectorType(t).element_type
        return arith.constant(t, ir.DenseElementsAttr.get_splat(t, ir.FloatAttr.get(element, v)))
    return arith.constant(t, ir.FloatAttr.get(t, v))


def _expand(op: ir.Operation) -> ir.Value:
    x, n = op.operands
    t = x.type
    exponent = _constant_exponent(n)
    if exponent == 0:
        return _float_constant(t, 1.0)
    if exponent == 1:
        return x
    if exponent in (2, 3, -1, -2):
        square = arith.mulf(x, x) if abs(exponent) >= 2 else x
        power = arith.mulf(square, x) if exponent == 3 else square
        return arith.divf(_float_constant(t, 1.0), power) if exponent < 0 else power
    if exponent is not None:
        return math.powf(x, _float_constant(t, float(exponent)))
    return math.powf(x, arith.sitofp(t, n))


@register
@dataclass(frozen=True)
class ExpandFPowIPass(TraceaPass):
    NAME = "tracea-expand-fpowi"
    SUMMARY = ("math.fpowi as torch computes pow with an integral exponent: multiplications for 2, 3, -1, -2, "
               "math.powf otherwise (no llvm.intr.powi, which takes no vector or i64 exponent here)")

    def run(self, module: ir.Operation) -> None:
        ops: list[ir.Operation] = []

        def collect(op):
            if op.operation.name == "math.fpowi":
                ops.append(op.operation)
            return ir.WalkResult.ADVANCE

        module.walk(collect)
        for op in ops:
            with op.location, ir.InsertionPoint(op):
                value = _expand(op)
            op.results[0].replace_all_uses_with(value)
            op.erase()
