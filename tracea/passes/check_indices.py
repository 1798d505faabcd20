"""`tracea-check-indices`: indexing with an index out of range raises IndexError, as in PyTorch,
instead of reading out of bounds or aborting the process.

torch-mlir lowers gathers (embedding, index_select, `x[idx]`, gather...) to linalg.generic ops
whose bodies `tensor.extract` at indices read from a tensor. Some come with `cf.assert`s (which
LLVM lowers to abort(): an out-of-range embedding id killed the process), some with no check
(`x[10]` on a dim of 10 read whatever lay past the end). Here, on linalg on tensors before
anything vectorizes:

- every index of a `tensor.extract` inside a linalg body that is not a loop index or an in-range
  constant is checked against its dim and replaced by 0 when out of range, so the kernel never
  reads outside the tensor (a compare and a select, which vectorize);
- whether any index of a linalg op was out of range is computed by a reduction beside it (the
  same loops, the index arithmetic cloned, OR-ed into one byte), and one branch after it counts a
  fault in the kernel's index counter (runtime/faults.py): the call then raises IndexError;
- the `cf.assert`s torch-mlir put in those bodies join that reduction (those whose message does
  not mention an index count as failed run-time checks, RuntimeError); asserts outside linalg
  bodies become the same branch, and none is left to abort.
"""
from __future__ import annotations

from dataclasses import dataclass

import mlir.ir as ir
from mlir.dialects import arith, linalg, tensor

from ..runtime.faults import FAULTS
from .fault_counters import count_fault, declare_counter
from .registry import TraceaPass, ops_named, register

INDEX_COUNTER, CHECK_COUNTER = FAULTS[1][0], FAULTS[2][0]


def is_index_check(message: str) -> bool:
    """Whether a torch-mlir cf.assert checks an index (IndexError) rather than another condition."""
    return "index" in message.lower()


def _counter_for(message: str) -> str:
    return INDEX_COUNTER if is_index_check(message) else CHECK_COUNTER


def _in_range_constant(value: ir.Value, size: int) -> bool:
    if not isinstance(value, ir.OpResult) or value.owner.name != "arith.constant":
        return False
    attr = value.owner.attributes["value"]
    return isinstance(attr, ir.IntegerAttr) and 0 <= attr.value < size


def _safe(value: ir.Value, size: int) -> bool:
    """An index that cannot be out of range: a loop index of the linalg op, or a constant in range."""
    if isinstance(value, ir.OpResult) and value.owner.name == "linalg.index":
        return True
    return size != ir.ShapedType.get_dynamic_size() and _in_range_constant(value, size)


def _defined_outside(value: ir.Value, root: ir.Operation) -> bool:
    op = value.owner.operation if isinstance(value, ir.OpResult) else value.owner.owner
    while op is not None:
        if op == root:
            return False
        op = op.parent
    return True


def _guard_extracts(generic: ir.Operation) -> list[ir.Value]:
    """Clamp each unsafe index of the extracts in `generic`'s body (of tensors from outside it);
    the i1 'in range' values."""
    in_range = []
    for extract in ops_named(generic, "tensor.extract"):
        if not _defined_outside(extract.operands[0], generic):
            continue
        source = extract.operands[0]
        shape = ir.RankedTensorType(source.type).shape
        for k, index in enumerate(list(extract.operands)[1:]):
            if _safe(index, shape[k]):
                continue
            with extract.location:
                if shape[k] == ir.ShapedType.get_dynamic_size():
                    with ir.InsertionPoint(generic):
                        size = tensor.dim(source, arith.constant(ir.IndexType.get(), k))
                else:
                    with ir.InsertionPoint(extract):
                        size = arith.constant(ir.IndexType.get(), shape[k])
                with ir.InsertionPoint(extract):
                    ok = arith.cmpi(arith.CmpIPredicate.ult, index, size)  # negative: a huge unsigned
                    extract.operands[1 + k] = arith.select(ok, index, arith.constant(ir.IndexType.get(), 0))
            in_range.append(ok)
    return in_range


def _slice(values: list[ir.Value], body: ir.Block) -> list[ir.Operation] | None:
    """The ops of `body` that `values` are computed from, in body order (None: one has regions)."""
    needed, work = set(), list(values)
    while work:
        value = work.pop()
        if not isinstance(value, ir.OpResult) or value.owner.operation.block != body:
            continue
        op = value.owner.operation
        if op in needed:
            continue
        if op.regions:
            return None
        needed.add(op)
        work.extend(op.operands)
    return [op.operation for op in body.operations if op.operation in needed]


def _loops_needed(maps: list, chosen: list[int], ops: list[ir.Operation], loops: int) -> list[int] | None:
    """The loops the checks depend on, when the operands `chosen` give all their sizes (each of
    their indexing maps a plain list of loops); else None."""
    from_operands = set()
    for i in chosen:
        if not all(isinstance(e, ir.AffineDimExpr) for e in maps[i].results):
            return None
        from_operands |= {ir.AffineDimExpr(e).position for e in maps[i].results}
    from_indices = {ir.IntegerAttr(op.attributes["dim"]).value for op in ops if op.name == "linalg.index"}
    needed = from_operands | from_indices
    return sorted(needed) if needed <= from_operands else None


def _any_failed(generic: ir.Operation, conditions: list[ir.Value]) -> ir.Value | None:
    """Before `generic`: a reduction of 'some condition was false' to an i1 scalar, over the
    loops the conditions depend on (an embedding's ids, not each element of its rows)."""
    body = generic.regions[0].blocks[0]
    ops = _slice(conditions, body)
    if ops is None:
        return None
    i8, i1 = ir.IntegerType.get_signless(8), ir.IntegerType.get_signless(1)
    all_maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(generic.attributes["indexing_maps"])]
    used = {operand for op in ops for operand in op.operands} | set(conditions)
    chosen = [i for i, arg in enumerate(body.arguments) if arg in used]
    kept = _loops_needed(all_maps, chosen, ops, all_maps[0].n_dims)
    if kept is None:  # every loop, with every operand (together they give the loops' sizes)
        chosen = list(range(len(body.arguments)))
        kept = list(range(all_maps[0].n_dims))
        maps = [ir.AffineMapAttr.get(m) for m in all_maps]
    else:
        maps = [ir.AffineMapAttr.get(ir.AffineMap.get(len(kept), 0, [
            ir.AffineDimExpr.get(kept.index(ir.AffineDimExpr(e).position)) for e in all_maps[i].results]))
            for i in chosen]
    renumber = {old: new for new, old in enumerate(kept)}
    with generic.location, ir.InsertionPoint(generic):
        zero = arith.constant(i8, 0)
        flag = linalg.fill(zero, outs=[tensor.empty([], i8)])
        maps.append(ir.AffineMapAttr.get(ir.AffineMap.get(len(kept), 0, [])))
        check = linalg.GenericOp([flag.type], [generic.operands[i] for i in chosen], [flag], ir.ArrayAttr.get(maps),
                                 ir.ArrayAttr.get([ir.Attribute.parse("#linalg.iterator_type<reduction>")] * len(kept)))
        block = check.regions[0].blocks.append(*[body.arguments[i].type for i in chosen], i8)
        mapping = {body.arguments[i]: block.arguments[k] for k, i in enumerate(chosen)}
        with ir.InsertionPoint(block):
            for op in ops:
                if op.name == "linalg.index":
                    clone = linalg.IndexOp(renumber[ir.IntegerAttr(op.attributes["dim"]).value]).operation
                else:
                    clone = op.clone()
                    for i, operand in enumerate(clone.operands):
                        if operand in mapping:
                            clone.operands[i] = mapping[operand]
                mapping.update(zip(op.results, clone.results))
            failed = arith.constant(i1, 0)
            true = arith.constant(i1, 1)
            for condition in conditions:
                failed = arith.ori(failed, arith.xori(mapping.get(condition, condition), true))
            linalg.YieldOp([arith.ori(block.arguments[-1], arith.extui(i8, failed))])
        byte = tensor.extract(check.result, [])
        return arith.cmpi(arith.CmpIPredicate.ne, byte, zero)


@register
@dataclass(frozen=True)
class CheckIndicesPass(TraceaPass):
    NAME = "tracea-check-indices"
    SUMMARY = ("indices read from tensors checked against their dims: out of range raises IndexError at the "
               "call (clamped meanwhile, never read out of bounds); torch-mlir's cf.asserts no longer abort")

    def run(self, module: ir.Operation) -> None:
        generics, asserts = [], []

        def visit(op):
            op = op.operation
            if op.name == "linalg.generic":
                generics.append(op)
                return ir.WalkResult.SKIP
            if op.name == "cf.assert":
                asserts.append(op)
            return ir.WalkResult.ADVANCE

        module.walk(visit, ir.WalkOrder.PRE_ORDER)
        used = set()
        for generic in generics:
            in_range = _guard_extracts(generic)
            body_asserts = ops_named(generic, "cf.assert")
            groups = {INDEX_COUNTER: list(in_range), CHECK_COUNTER: []}
            for check in body_asserts:
                groups[_counter_for(ir.StringAttr(check.attributes["msg"]).value)].append(check.operands[0])
            for counter, conditions in groups.items():
                if not conditions:
                    continue
                failed = _any_failed(generic, conditions)
                if failed is None:
                    continue  # (a condition computed inside nested regions: its assert stays)
                with generic.location, ir.InsertionPoint(generic):
                    count_fault(failed, counter)
                used.add(counter)
                for check in body_asserts:
                    if check.operands[0] in conditions:
                        check.erase()
        for check in asserts:  # outside linalg bodies
            counter = _counter_for(ir.StringAttr(check.attributes["msg"]).value)
            with check.location, ir.InsertionPoint(check):
                count_fault(arith.xori(check.operands[0], arith.constant(ir.IntegerType.get_signless(1), 1)),
                            counter)
            check.erase()
            used.add(counter)
        for counter in used:
            declare_counter(module, counter)
