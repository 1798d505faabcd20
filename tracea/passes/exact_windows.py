"""`tracea-exact-windows`: operands read through windows (`o * s + k * d`) cut to what the
windows reach.

A pooling or conv op whose stride steps over the end of its input (max_pool2d 3/2 on 4 x 4: the
windows read rows 0-2, row 3 never) is valid linalg: its input is larger than the windows reach.
When the output or window extent is 1, linalg-fold-unit-extent-dims then simplifies `o * 2 + k`
to `k`, and the op claims the input's 4 rows for a loop of 3: a verifier error, or, when the
stage's later passes tile the op before it is verified, a loop over all 4 rows (a max over the
whole 4 x 4 map: inception_v3 at 96 px came out 4 % off). Run on linalg.generic ops before that
fold, this cuts each such operand to the extent its windows reach (tracea.conv2d's own lowering
does the same for its input: lower_to_linalg.windowed_input). Only static shapes and windows of
the form sum(coefficient * loop) are cut; anything else is left as it is.
"""
from __future__ import annotations

from dataclasses import dataclass

import mlir.ir as ir
from mlir.dialects import tensor

from .registry import TraceaPass, ops_named, register


def _terms(expr) -> dict[int, int] | None:
    """{loop: coefficient} of a sum of loops times non-negative constants, else None."""
    if isinstance(expr, ir.AffineDimExpr):
        return {expr.position: 1}
    if isinstance(expr, ir.AffineMulExpr):
        dim, factor = (expr.lhs, expr.rhs) if isinstance(expr.rhs, ir.AffineConstantExpr) else (expr.rhs, expr.lhs)
        if isinstance(dim, ir.AffineDimExpr) and isinstance(factor, ir.AffineConstantExpr) and factor.value >= 0:
            return {dim.position: factor.value}
        return None
    if isinstance(expr, ir.AffineAddExpr):
        lhs, rhs = _terms(expr.lhs), _terms(expr.rhs)
        if lhs is None or rhs is None or set(lhs) & set(rhs):
            return None
        return {**lhs, **rhs}
    return None


def _cut(op: ir.Operation) -> None:
    maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(op.attributes["indexing_maps"])]
    operands = list(op.operands)
    shapes = [ir.RankedTensorType(v.type).shape if isinstance(v.type, ir.RankedTensorType) else None for v in operands]
    if any(s is None or any(ir.ShapedType.is_dynamic_size(d) for d in s) for s in shapes):
        return
    extents: dict[int, int] = {}  # loop -> extent, from operand dims indexed by the loop alone
    for amap, shape in zip(maps, shapes):
        for expr, size in zip(amap.results, shape):
            if isinstance(expr, ir.AffineDimExpr):
                extents.setdefault(expr.position, size)
    inputs = len(operands) - len(op.results)
    for i, (amap, shape) in enumerate(zip(maps[:inputs], shapes[:inputs])):
        reach = list(shape)
        for axis, expr in enumerate(amap.results):
            terms = _terms(expr)
            if terms is None or len(terms) < 2 or any(loop not in extents for loop in terms):
                continue
            reach[axis] = min(shape[axis], 1 + sum(c * (extents[loop] - 1) for loop, c in terms.items()))
        if reach != list(shape):
            with ir.InsertionPoint(op), op.location:
                source = operands[i]
                element = ir.RankedTensorType(source.type).element_type
                cut = tensor.ExtractSliceOp(ir.RankedTensorType.get(reach, element), source, [], [], [],
                                            [0] * len(reach), reach, [1] * len(reach)).result
            op.operands[i] = cut


@register
@dataclass(frozen=True)
class ExactWindowsPass(TraceaPass):
    NAME = "tracea-exact-windows"
    SUMMARY = ("linalg.generic operands read through windows (o * s + k * d) cut to the extent the windows "
               "reach, so that folding unit dims leaves a valid op (pooling 3/2 on 4 x 4)")

    def run(self, module: ir.Operation) -> None:
        for op in ops_named(module, "linalg.generic"):
            _cut(op)
