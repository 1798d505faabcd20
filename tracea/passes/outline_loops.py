"""`tracea-outline-loops`: each loop nest of a bufferized function body in a function of its own,
one function for all the nests that are the same.

A model's entry function holds every kernel of every layer inline: ViT-base's was 35,000 lines
of loop nests, 12 copies of each layer's ~45. LLVM's code generation of that one function took
28 s of a 40 s compile (the OpenMP translation outlines each parallel region from the whole
function, then LLVM optimizes and emits all 12 copies). Outlined and merged, each distinct
nest is lowered, translated and emitted once, and called once per layer: the call passes the
buffers the nest reads and writes (after bufferization nothing flows out of a loop but through
memory), so it costs a few loads of descriptor fields per kernel call.

Constants (arith.constant, ub.poison) used by a nest are copied into its function rather than
passed, so nests differing only in where their constants were defined still merge. Two nests
merge when their functions print the same (the printed form has no locations and numbers its
values per function), which includes the types of what they are passed: two layers whose
buffers have the same shapes share code, two of different shapes do not.
"""
from __future__ import annotations

from dataclasses import dataclass

import mlir.ir as ir
from mlir.dialects import func

from .registry import TraceaPass, register

LOOPS = ("scf.for", "scf.forall", "scf.parallel")
COPIED = ("arith.constant", "ub.poison")  # rematerialized in each function instead of passed
PREFIX = "_tracea_loop_"


def _free_operands(nest: ir.Operation):
    """The values `nest` uses that are defined outside it, in order of first use, and every
    (op, operand index) that uses one."""
    inside, free, uses = set(), {}, []

    def visit(op):
        op = op.operation
        inside.add(op)
        for i, value in enumerate(op.operands):
            owner = value.owner
            defined_in = owner.owner if isinstance(owner, ir.Block) else owner  # a block argument's op
            if defined_in.operation not in inside:
                free.setdefault(value, len(free))
                uses.append((op, i, value))
        return ir.WalkResult.ADVANCE

    nest.walk(visit, ir.WalkOrder.PRE_ORDER)
    return list(free), uses


def _outline(nest: ir.Operation, name: str, module_body: ir.Block):
    """Move `nest` into a new private function `name`, called in its place -> (function, call)."""
    free, uses = _free_operands(nest)
    copied = [v for v in free if isinstance(v, ir.OpResult) and v.owner.name in COPIED]
    passed = [v for v in free if v not in copied]
    with nest.location, ir.InsertionPoint(nest):
        call = func.CallOp([], ir.FlatSymbolRefAttr.get(name), passed)
    with nest.context, ir.Location.unknown():
        function = func.FuncOp(name, ir.FunctionType.get([v.type for v in passed], []), visibility="private",
                               ip=ir.InsertionPoint(module_body))
        function.attributes["llvm.linkage"] = ir.Attribute.parse("#llvm.linkage<internal>")  # not exported
        body = function.add_entry_block()
        replacement = dict(zip(passed, body.arguments))
        with ir.InsertionPoint(body):
            for value in copied:
                replacement[value] = value.owner.clone().results[0]
            returned = func.ReturnOp([])
    nest.move_before(returned)
    for op, i, value in uses:
        op.operands[i] = replacement[value]
    return function.operation, call.operation


@register
@dataclass(frozen=True)
class OutlineLoopsPass(TraceaPass):
    NAME = "tracea-outline-loops"
    SUMMARY = ("after bufferization: each loop nest of a function body moved into a private function "
               "called in its place, identical nests sharing one (a model's repeated layers are "
               "compiled once)")

    def run(self, module: ir.Operation) -> None:
        module_body = module.regions[0].blocks[0]
        functions = [op.operation for op in module_body.operations if op.operation.name == "func.func"]
        merged: dict[str, str] = {}  # printed body -> the function's name
        for function in functions:
            if not function.regions[0].blocks:
                continue
            nests = [op.operation for op in function.regions[0].blocks[0].operations
                     if op.operation.name in LOOPS and not op.operation.results]
            for nest in nests:
                name = f"{PREFIX}{len(merged)}"
                outlined, call = _outline(nest, name, module_body)
                key = outlined.get_asm(use_local_scope=True).replace(f"@{name}(", "@(", 1)
                existing = merged.setdefault(key, name)
                if existing != name:
                    call.attributes["callee"] = ir.FlatSymbolRefAttr.get(existing)
                    outlined.erase()
            if not any(op.operation.regions for op in function.regions[0].blocks[0].operations):
                # Only glue is left (allocations, views, calls): LLVM's instruction selection
                # and scheduling took 2 of ViT-base's 3 s of code generation on it at -O2, for
                # one basic block of calls passing ~100 descriptor fields each; unoptimized, 0.1 s
                function.attributes["passthrough"] = ir.ArrayAttr.get(
                    [ir.StringAttr.get("noinline"), ir.StringAttr.get("optnone")])
