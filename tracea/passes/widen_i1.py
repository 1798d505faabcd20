"""`tracea-widen-i1`: boolean tensors stored as bytes.

Imported PyTorch graphs carry i1 tensors (attention masks, `isinf` rows of a safe softmax). Once
bufferized they become i1 memrefs, and storing to one hits an assertion in this LLVM build's
memref lowering (element width < 8). Widening every i1 tensor to i8 keeps the computation the
same: values cross tensor boundaries as 0/1 bytes and are truncated back to i1 inside each
linalg body, where the arithmetic on them happens. Function arguments and results of i1 tensors
become i8 tensors too: a numpy or torch bool array is exactly such bytes, so callers pass them as
they are.
"""
from __future__ import annotations

from dataclasses import dataclass

import mlir.ir as ir

from .registry import PassFailed, TraceaPass, register


def _is_bool_tensor(t: ir.Type) -> bool:
    return isinstance(t, ir.RankedTensorType) and t.element_type == ir.IntegerType.get_signless(1)


def _byte_tensor(t: ir.Type) -> ir.Type:
    return ir.RankedTensorType.get(t.shape, ir.IntegerType.get_signless(8), t.encoding, loc=ir.Location.unknown())


@register
@dataclass(frozen=True)
class WidenBoolTensorsPass(TraceaPass):
    NAME = "tracea-widen-i1"
    SUMMARY = "store i1 tensors as i8 (0/1), truncating to i1 inside linalg bodies (no i1 memrefs reach LLVM)"

    def run(self, module: ir.Operation) -> None:
        ops: list[ir.Operation] = []

        def collect(op):
            ops.append(op.operation)
            return ir.WalkResult.ADVANCE

        module.walk(collect)
        i8, i1 = ir.IntegerType.get_signless(8), ir.IntegerType.get_signless(1)
        for op in ops:  # signatures first: their arguments' users are rewritten below
            if op.name == "func.func":
                ftype = ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value)
                def widened(types):
                    return [_byte_tensor(t) if _is_bool_tensor(t) else t for t in types]
                widen = widened(ftype.inputs)
                op.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(widen, widened(ftype.results)))
                if op.regions[0].blocks:
                    for arg, t in zip(op.regions[0].blocks[0].arguments, widen):
                        arg.set_type(t)
        for op in ops:
            if op.name == "func.func":
                continue
            if op.name == "arith.constant" and _is_bool_tensor(op.result.type):
                dense = op.attributes["value"]
                if not dense.is_splat:
                    raise PassFailed("non-splat boolean tensor constants are not supported")
                value = 1 if ir.IntegerAttr(dense.get_splat_value()).value else 0
                with op.location, ir.InsertionPoint(op):
                    new = ir.Operation.create("arith.constant", results=[_byte_tensor(op.result.type)], attributes={
                        "value": ir.DenseElementsAttr.get_splat(_byte_tensor(op.result.type),
                                                                ir.IntegerAttr.get(i8, value))})
                op.result.replace_all_uses_with(new.result)
                op.erase()
                continue
            if op.name == "tensor.extract" and op.result.type == i1:  # an element of a widened tensor
                op.result.set_type(i8)
                with op.location, ir.InsertionPoint.after(op):
                    narrow = ir.Operation.create("arith.trunci", results=[i1], operands=[op.result])
                op.result.replace_all_uses_except(narrow.result, narrow)
                continue
            if op.name in ("tensor.insert", "tensor.from_elements", "tensor.splat"):
                for i, operand in enumerate(list(op.operands)):
                    if operand.type == i1:  # a scalar stored into a widened tensor
                        with op.location, ir.InsertionPoint(op):
                            wide = ir.Operation.create("arith.extui", results=[i8], operands=[operand])
                        op.operands[i] = wide.result
            for result in op.results:
                if _is_bool_tensor(result.type):
                    result.set_type(_byte_tensor(result.type))
            if op.name == "linalg.fill" and op.operands[0].type == i1:
                with op.location, ir.InsertionPoint(op):
                    widened = ir.Operation.create("arith.extui", results=[i8], operands=[op.operands[0]])
                op.operands[0] = widened.result
            if not op.name.startswith("linalg.") or not op.regions or not op.regions[0].blocks:
                continue
            block = op.regions[0].blocks[0]
            tensors = list(op.operands)
            for arg, operand in zip(block.arguments, tensors):
                element = operand.type.element_type if isinstance(operand.type, ir.ShapedType) else operand.type
                if arg.type == i1 and element == i8:
                    arg.set_type(i8)
                    with op.location, ir.InsertionPoint.at_block_begin(block):
                        narrow = ir.Operation.create("arith.trunci", results=[i1], operands=[arg])
                    arg.replace_all_uses_except(narrow.result, narrow)
            terminator = block.operations[len(block.operations) - 1]
            if terminator.name == "linalg.yield":
                for i, (value, result) in enumerate(zip(list(terminator.operands), op.results)):
                    if value.type == i1 and result.type.element_type == i8:
                        with op.location, ir.InsertionPoint(terminator):
                            wide = ir.Operation.create("arith.extui", results=[i8], operands=[value])
                        terminator.operands[i] = wide.result
