"""`tracea-guard-int-division`: integer division and remainder that cannot trap.

LLVM's `sdiv`/`udiv`/`srem`/`urem` are undefined for a zero divisor and for signed INT_MIN / -1,
and on x86 both raise SIGFPE, which killed the process that called a compiled kernel (torch's
integer `fmod`, `remainder`, `div(rounding_mode="trunc")`: of a zero, and, once vectorized, of the
masked-off lanes of a remainder vector, which hold 0). Eager PyTorch on the CPU raises
ZeroDivisionError for every integer division or remainder by zero; INT_MIN // -1 gives INT_MIN
(floor division, and int8 / int16 truncating division; int32 / int64 truncating division traps in
eager torch itself) and the remainders 0. This pass, run on the bufferized IR before the LLVM
lowering, makes each `arith.divsi/divui/remsi/remui/floordivsi/ceildivsi/ceildivui` (scalar or
vector, in any loop) follow that:

- the divisor is replaced by 1 where it is 0 or (signed) where the pair is INT_MIN / -1, so the
  hardware division never traps: INT_MIN / 1 = INT_MIN and INT_MIN % 1 = 0 are torch's results;
- where a divisor is 0, the kernel counts a fault in a module global (`FAULT_COUNTER`: one atomic
  add per division by zero, on that rare path; a vector counts once for all its lanes). The
  packed entry point (targets/cpu/native.py) returns whether the count moved during the call, and the
  runtime raises ZeroDivisionError, as torch does. The counter belongs to the kernel, not to the
  call: while two threads run the same kernel, one's division by zero may raise in both.

Divisions by a constant that can be neither 0 nor (signed) -1 are left as they are: Tracea's
kernels' index arithmetic costs nothing more.

Vector divisions are guarded the same way (every lane counts), but tracea-cpu-tile-linalg does
not vectorize bodies that divide integers: the masked-off lanes of a remainder vector hold the
padding, 0, and would count as divisions by zero.

`tracea-int-floor-division`: torch-mlir lowers integer floor division (`floor_divide`,
`div(rounding_mode="floor")`) through f64: `fptosi(floor(sitofp(a) / sitofp(b)))`, which is
inexact for int64 beyond 2^53 and turns a zero divisor into an out-of-range conversion (poison)
instead of an error. Run on linalg on tensors (before vectorizing), it rewrites that chain, on
integer operands of the result's type, to `arith.floordivsi(a, b)`, which the guard then covers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import mlir.ir as ir
from mlir.dialects import arith, vector

from ..runtime.faults import FAULTS
from .fault_counters import count_fault, declare_counter
from .registry import TraceaPass, register

FAULT_COUNTER = FAULTS[0][0]  # ZeroDivisionError

_SIGNED = ("arith.divsi", "arith.remsi", "arith.floordivsi", "arith.ceildivsi")
_UNSIGNED = ("arith.divui", "arith.remui", "arith.ceildivui")
INTEGER_DIVISIONS = _SIGNED + _UNSIGNED


def _element_type(t: ir.Type) -> ir.Type:
    return ir.VectorType(t).element_type if isinstance(t, ir.VectorType) else t


def _width(t: ir.Type) -> int | None:
    """Bits of an integer (or vector of integer) type; None for index."""
    element = _element_type(t)
    return ir.IntegerType(element).width if isinstance(element, ir.IntegerType) else None


def _constant_values(value: ir.Value) -> list[int] | None:
    """The integer values of a constant divisor (all lanes of a vector), None if not constant."""
    if not isinstance(value, ir.OpResult) or value.owner.name != "arith.constant":
        return None
    attr = value.owner.attributes["value"]
    if isinstance(attr, ir.IntegerAttr):
        return [attr.value]
    if isinstance(attr, ir.DenseIntElementsAttr):
        if attr.is_splat:
            return [ir.IntegerAttr(attr.get_splat_value()).value]
        return [int(v) for v in attr]
    return None


def _splat(t: ir.Type, v: int) -> ir.Value:
    element = _element_type(t)
    if isinstance(t, ir.VectorType):
        return arith.constant(t, ir.DenseElementsAttr.get_splat(t, ir.IntegerAttr.get(element, v)))
    return arith.constant(t, ir.IntegerAttr.get(element, v))


def _needs_guard(op: ir.Operation) -> bool:
    values = _constant_values(op.operands[1])
    if values is None:
        return True
    if op.name in _UNSIGNED:
        return any(v == 0 for v in values)
    width = _width(op.operands[1].type)
    minus_one = -1 if width is None else (1 << width) - 1  # an unsigned reading of -1 too
    return any(v in (0, -1, minus_one) for v in values)


def _guard(op: ir.Operation) -> None:
    dividend, divisor = op.operands[0], op.operands[1]
    t = divisor.type
    with op.location, ir.InsertionPoint(op):
        is_zero = arith.cmpi(arith.CmpIPredicate.eq, divisor, _splat(t, 0))
        bad = is_zero
        width = _width(t)
        if op.name in _SIGNED and width is not None:
            minimum = _splat(t, -(1 << (width - 1)))
            overflow = arith.andi(arith.cmpi(arith.CmpIPredicate.eq, dividend, minimum),
                                  arith.cmpi(arith.CmpIPredicate.eq, divisor, _splat(t, -1)))
            bad = arith.ori(is_zero, overflow)
        op.operands[1] = arith.select(bad, _splat(t, 1), divisor)
        any_zero = is_zero
        if isinstance(t, ir.VectorType):
            i1 = ir.IntegerType.get_signless(1)
            shape = ir.VectorType(t).shape
            if len(shape) != 1:
                any_zero = vector.shape_cast(ir.VectorType.get([math.prod(shape)], i1), any_zero)
            any_zero = vector.reduction(i1, vector.CombiningKind.OR, any_zero)
        count_fault(any_zero, FAULT_COUNTER)


def _producer(value: ir.Value, name: str) -> ir.Operation | None:
    if isinstance(value, ir.OpResult) and value.owner.name == name:
        return value.owner.operation
    return None


def _integer_floor_division(fptosi: ir.Operation) -> tuple[ir.Value, ir.Value, list[ir.Operation]] | None:
    """(a, b, the float ops) when fptosi computes fptosi(floor(sitofp(a) / sitofp(b))) with a and
    b of the result's integer type; None otherwise."""
    floor = _producer(fptosi.operands[0], "math.floor")
    divf = floor and _producer(floor.operands[0], "arith.divf")
    if divf is None:
        return None
    converted = [_producer(v, "arith.sitofp") for v in divf.operands]
    if any(c is None for c in converted):
        return None
    a, b = (c.operands[0] for c in converted)
    if a.type != fptosi.results[0].type or b.type != a.type:
        return None
    if converted[0] == converted[1]:  # x // x: one sitofp
        converted.pop()
    return a, b, [floor, divf] + converted


def _erase_if_unused(ops: list[ir.Operation]) -> None:
    for op in ops:
        if all(not list(r.uses) for r in op.results):
            op.erase()


@register
@dataclass(frozen=True)
class ExactIntFloorDivisionPass(TraceaPass):
    NAME = "tracea-int-floor-division"
    SUMMARY = ("integer floor division computed through f64 (torch-mlir's fptosi(floor(sitofp a / sitofp b))) "
               "as arith.floordivsi: exact for int64, and a zero divisor raises like torch (run before "
               "vectorizing)")

    def run(self, module: ir.Operation) -> None:
        conversions: list[ir.Operation] = []

        def collect(op):
            if op.operation.name == "arith.fptosi":
                conversions.append(op.operation)
            return ir.WalkResult.ADVANCE

        module.walk(collect)
        for op in conversions:
            chain = _integer_floor_division(op)
            if chain is None:
                continue
            a, b, float_ops = chain
            with op.location, ir.InsertionPoint(op):
                division = arith.floordivsi(a, b)
            op.results[0].replace_all_uses_with(division)
            op.erase()
            _erase_if_unused(float_ops)


@register
@dataclass(frozen=True)
class GuardIntDivisionPass(TraceaPass):
    NAME = "tracea-guard-int-division"
    SUMMARY = ("integer division / remainder that never traps: a divisor of 0 (or INT_MIN / -1) replaced by 1, "
               "a zero divisor counted for the runtime to raise ZeroDivisionError (as torch does)")

    def run(self, module: ir.Operation) -> None:
        ops: list[ir.Operation] = []

        def collect(op):
            if op.operation.name in INTEGER_DIVISIONS:
                ops.append(op.operation)
            return ir.WalkResult.ADVANCE

        module.walk(collect)
        guarded = [op for op in ops if _needs_guard(op)]
        for op in guarded:
            _guard(op)
        if guarded:
            declare_counter(module, FAULT_COUNTER)
