"""A module's public functions and their tensor signatures: what a compile's entry point is and
what it takes and returns, for every backend."""
from __future__ import annotations

import mlir.ir as ir

from .ops import TensorSpec


def function_signature(func_op) -> tuple[list[TensorSpec], list[TensorSpec]]:
    ftype = ir.FunctionType(ir.TypeAttr(func_op.attributes["function_type"]).value)
    name = ir.StringAttr(func_op.attributes["sym_name"]).value
    inputs = [TensorSpec.from_type(t, f"argument #{i} of @{name}", dynamic=True) for i, t in enumerate(ftype.inputs)]
    outputs = [TensorSpec.from_type(t, f"result #{i} of @{name}", dynamic=True) for i, t in enumerate(ftype.results)]
    return inputs, outputs


def public_functions(module: ir.Operation) -> list[ir.Operation]:
    funcs = []
    for op in module.regions[0].blocks[0].operations:
        op = op.operation
        if op.name != "func.func" or len(op.regions[0].blocks) == 0:
            continue
        vis = op.attributes["sym_visibility"] if "sym_visibility" in op.attributes else None
        if vis is None or ir.StringAttr(vis).value == "public":
            funcs.append(op)
    return funcs
