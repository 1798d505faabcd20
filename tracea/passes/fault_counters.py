"""The MLIR side of runtime/faults.py: a kernel module's fault counter, and the code that counts
one fault (run where the fault is rare: one atomic add on that path only)."""
from __future__ import annotations

import mlir.ir as ir
from mlir.dialects import arith, memref, scf


def declare_counter(module: ir.Operation, name: str) -> None:
    """The module global `name` (an i32 starting at 0), unless it exists."""
    body = module.regions[0].blocks[0]
    for op in body.operations:
        if op.operation.name == "memref.global" and ir.StringAttr(op.operation.attributes["sym_name"]).value == name:
            return
    with ir.Location.unknown(), ir.InsertionPoint.at_block_begin(body):
        i32 = ir.IntegerType.get_signless(32)
        memref.global_(name, ir.TypeAttr.get(ir.MemRefType.get([], i32)), sym_visibility="private",
                       initial_value=ir.DenseElementsAttr.get_splat(ir.RankedTensorType.get([], i32),
                                                                    ir.IntegerAttr.get(i32, 0)))


def count_fault(happened: ir.Value, name: str) -> None:
    """scf.if happened { atomic add 1 to the counter `name` } at the insertion point."""
    i32 = ir.IntegerType.get_signless(32)
    branch = scf.IfOp(happened)
    with ir.InsertionPoint(branch.then_block):
        counter = memref.get_global(ir.MemRefType.get([], i32), name)
        memref.atomic_rmw(arith.AtomicRMWKind.addi, arith.constant(i32, 1), counter, [])
        scf.YieldOp([])
