"""Verification of tracea ops beyond what IRDL checks (shapes, dtypes, attributes)."""
from __future__ import annotations

import mlir.ir as ir

from ..errors import OpError
from .ops import OP_DEFS, view


def tracea_ops(root: ir.Operation) -> list[ir.Operation]:
    """Every tracea op nested under `root`, in program order."""
    found: list[ir.Operation] = []

    def visit(op):
        if op.operation.name in OP_DEFS:
            found.append(op.operation)
        return ir.WalkResult.ADVANCE

    root.walk(visit)
    return found


def verify_tracea_ops(root: ir.Operation) -> int:
    """Emit an error at the location of each invalid tracea op; return how many failed."""
    failures = 0
    for op in tracea_ops(root):
        try:
            view(op)
        except OpError as e:
            op.location.emit_error(f"'{op.name}' op {e}")
            failures += 1
    return failures
