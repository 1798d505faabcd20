"""`tracea-cpu-tile-linalg`: the linalg ops no CPU kernel took (elementwise chains, layer-norm
reductions, pooling, transposes, masks), run on every thread and vectorized where their body is
plain arithmetic.

Each op (named ops generalized first) gets a plan from its loop ranges and indexing maps; the
plans become one transform-dialect script run by MLIR's transform interpreter:
- enough work: `tile_using_forall` splits its outermost parallel loop that has a range of at
  least the thread count among the threads (an scf.forall, an scf.parallel once bufferized);
- a body of arith/math ops whose innermost loop is contiguous in every operand that uses it:
  `tile_using_for` to one vector along that loop (1 elsewhere) and `vectorize` with masks for the
  remainder. Other strided reads stay scalar loops (LLVM gathers would be no faster), except
  transposing copies, which become a kernel of register-transposed blocks (targets/cpu/transpose.py).
  Not vectorized either (only split): reductions whose innermost range needs a mask (no lowering
  for masked reductions here) and maps with constant results (keepdim reductions).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import mlir.ir as ir
from mlir.dialects import linalg  # loaded at import anyway (tracea.dialects.context)
from mlir.dialects.transform import interpreter

from ...doctor.capabilities import host_cpu
from .transpose import transpose_kernel_text, transposed_dims
from ...passes.int_division import INTEGER_DIVISIONS
from ...passes.lower_to_linalg import inline_kernel
from ...passes.registry import PassFailed, TraceaPass, option, register

TAG = "tracea.tile_linalg"
# a module attribute: some loop nest here is MLIR's generic lowering of a linalg op (not a Tracea
# kernel); the code generator then optimizes the whole module (targets/cpu/native.py)
GENERIC_LOOPS = "tracea.generic_loops"
_VECTOR_BODY_DIALECTS = ("arith.", "math.")
# Not vectorized: the CPU has no vector integer division (LLVM divides lane by lane anyway), and
# the masked-off lanes of a remainder vector would divide by their padding, 0, which the guard of
# int_division.py would count as a division by zero.
_SCALAR_BODY_OPS = INTEGER_DIVISIONS


# After vectorizing: 1-D transfers with masks as operands and 1-D reductions, which the LLVM
# lowering takes as they are.
_FOLD_MASKS = """%funcs = transform.structured.match ops{["func.func"]} in %root : (!transform.any_op) -> !transform.any_op
transform.apply_patterns to %funcs {
  transform.apply_patterns.vector.lower_masked_transfers
  transform.apply_patterns.vector.cast_away_vector_leading_one_dim
  transform.apply_patterns.vector.lower_multi_reduction lowering_strategy = "innerreduction"
  transform.apply_patterns.vector.lower_masks
} : !transform.any_op"""


@dataclass(frozen=True)
class LinalgPlan:
    ranges: tuple[int, ...]
    split_dim: int | None  # loop split among threads
    vector: int | None  # vector length along the innermost loop
    # the innermost loop is the only reduction: it accumulates into a vector of partial results
    # (reduced across its lanes once, at the end), not into a scalar through a chain of ordered
    # adds per vector (a layer norm's row sums ran at a few cycles per element)
    partial_vector: bool = False

    def script(self, index: int, threads: int) -> str:
        op = f"%op{index}"
        lines = [f"{op} = transform.structured.match attributes{{{TAG} = {index} : i64}} in %root "
                 ": (!transform.any_op) -> !transform.any_op"]
        if self.split_dim is not None:
            counts = [threads if d == self.split_dim else 0 for d in range(len(self.ranges))]
            lines.append(f"%par{index}, %forall{index} = transform.structured.tile_using_forall {op} "
                         f"num_threads {counts} : (!transform.any_op) -> (!transform.any_op, !transform.any_op)")
            op = f"%par{index}"
        if self.vector is not None and self.partial_vector:
            outer = [1 if r > 1 else 0 for r in self.ranges[:-1]]
            if any(outer):
                loops = sum(outer)
                lines.append(f"%rows{index}, %rowloops{index}:{loops} = transform.structured.tile_using_for {op} "
                             f"tile_sizes {outer + [0]} : (!transform.any_op) -> "
                             f"({', '.join(['!transform.any_op'] * (loops + 1))})")
                op = f"%rows{index}"
            lines.append(f"%fill{index}, %part{index}, %merge{index}, %red{index} = "
                         f"transform.structured.tile_reduction_using_for {op} by tile_sizes = "
                         f"{[0] * len(outer) + [self.vector]} : (!transform.any_op) -> (!transform.any_op, "
                         "!transform.any_op, !transform.any_op, !transform.any_op)")
            vector_sizes = [1] * len(outer) + [self.vector]
            for handle in (f"%part{index}", f"%merge{index}"):
                lines.append(f"transform.structured.vectorize {handle} vector_sizes {vector_sizes} : !transform.any_op")
        elif self.vector is not None:
            sizes = [1 if r > 1 else 0 for r in self.ranges[:-1]] + [self.vector]
            loops = sum(1 for s in sizes if s)
            lines.append(f"%vec{index}, %loops{index}:{loops} = transform.structured.tile_using_for {op} "
                         f"tile_sizes {sizes} : (!transform.any_op) -> ({', '.join(['!transform.any_op'] * (loops + 1))})")
            vector_sizes = [s or r for s, r in zip(sizes, self.ranges)]
            lines.append(f"transform.structured.vectorize %vec{index} vector_sizes {vector_sizes} : !transform.any_op")
        return "\n".join(lines)


def _loop_ranges(op: ir.Operation, maps: list[ir.AffineMap]) -> tuple[int, ...] | None:
    """Static loop ranges from the operands' shapes (None when a shape is dynamic or a loop is
    only reached through a compound index expression)."""
    ranges: dict[int, int] = {}
    for operand, amap in zip(op.operands, maps):
        if not isinstance(operand.type, ir.ShapedType):
            continue
        for expr, size in zip(amap.results, operand.type.shape):
            if isinstance(expr, ir.AffineDimExpr):
                position = expr.position
                if size < 0:
                    return None
                ranges.setdefault(position, size)
    n_loops = maps[0].n_dims
    if len(ranges) != n_loops:
        return None
    return tuple(ranges[d] for d in range(n_loops))


def plan_for(op: ir.Operation, threads: int, lanes: int, min_work: int) -> LinalgPlan | None:
    maps = [ir.AffineMapAttr(a).value for a in ir.ArrayAttr(op.attributes["indexing_maps"])]
    iterators = ["parallel" in str(a) for a in ir.ArrayAttr(op.attributes["iterator_types"])]
    ranges = _loop_ranges(op, maps)
    if ranges is None or 0 in ranges:  # no work (tiling an empty range trips an MLIR assertion)
        return None
    split_dim = None
    if threads > 1 and math.prod(ranges) >= min_work:
        split_dim = next((d for d, (r, par) in enumerate(zip(ranges, iterators)) if par and r >= threads), None)
    vector = None
    last = len(ranges) - 1
    body = op.regions[0].blocks[0]
    if ranges and ranges[-1] > 1 and all(m.is_projected_permutation for m in maps) \
            and all((o.name.startswith(_VECTOR_BODY_DIALECTS) and o.name not in _SCALAR_BODY_OPS)
                    or o.name == "linalg.yield" for o in body.operations) \
            and all(_innermost_or_unused(m, last) for m in maps) \
            and all(_unit_innermost_stride(o, m, last) for o, m in zip(op.operands, maps)):
        vector = min(lanes, 1 << (ranges[-1] - 1).bit_length())
        if not all(iterators) and (ranges[-1] % vector or not _combines_directly(body)):
            vector = None  # a masked reduction has no lowering here; masks stay on reads and writes
    if split_dim is None and vector is None:
        return None
    partial = (vector is not None and not iterators[-1] and all(iterators[:-1]) and len(op.results) == 1
               and ranges[-1] >= 4 * vector)
    return LinalgPlan(ranges, split_dim, vector, partial)


_COMBINERS = {f"arith.{name}" for name in ("addf", "addi", "mulf", "muli", "andi", "ori", "xori", "maximumf",
                                            "minimumf", "maxnumf", "minnumf", "maxsi", "minsi", "maxui", "minui")}


def _combines_directly(body: ir.Block) -> bool:
    """Whether each accumulator (output block argument) is used by one combining op whose result
    is yielded: the only reductions MLIR's vectorizer recognizes (an accumulator behind a cast,
    as in a widened boolean `all`, makes it fail)."""
    yielded = list(body.operations)[-1].operands
    n_outputs = len(yielded)
    for arg, result in zip(list(body.arguments)[-n_outputs:], yielded):
        users = [use.owner for use in arg.uses]
        if len(users) != 1 or users[0].name not in _COMBINERS or users[0].results[0] != result:
            return False
    return True


def _unit_innermost_stride(operand: ir.Value, amap: ir.AffineMap, dim: int) -> bool:
    """After bufferization (the copies): a memref the innermost loop walks with a stride other
    than 1 (a strided subview, e.g. a transposed convolution's input scattered into every other
    element) is not vectorized; its transfers could not become vector loads and stores."""
    if not isinstance(operand.type, ir.MemRefType) or dim not in [e.position for e in amap.results]:
        return True
    strides, _ = ir.MemRefType(operand.type).get_strides_and_offset()
    return not strides or strides[-1] == 1


def _innermost_or_unused(amap: ir.AffineMap, dim: int) -> bool:
    positions = [e.position for e in amap.results]  # a projected permutation: dims only
    return dim not in positions or positions[-1] == dim


@register
@dataclass(frozen=True)
class CpuTileLinalgPass(TraceaPass):
    NAME = "tracea-cpu-tile-linalg"
    SUMMARY = ("split each linalg.generic no kernel took among the threads (scf.forall over its outermost "
               "parallel loop) and vectorize its innermost loop when the body is plain arithmetic "
               "(run linalg-generalize-named-ops first)")
    threads: int = option(0, "threads the code will run on (0: the host's cores)")
    min_work: int = option(16384, "loop iterations below which an op stays on one thread")

    def run(self, module: ir.Operation) -> None:
        host = host_cpu()
        threads = self.threads or host.cores
        scripts = []
        for op in _function_body_ops(module):
            if op.name != "linalg.generic":
                continue
            dims = transposed_dims(op)
            if dims is not None:
                parallel = threads > 1 and math.prod(ir.ShapedType(op.results[0].type).shape) >= self.min_work
                inline_kernel(op, transpose_kernel_text(f"__tracea_transpose_{len(scripts)}", op, dims,
                                                        host.f32_lanes, parallel, str(op.location)))
                continue
            module.attributes[GENERIC_LOOPS] = ir.UnitAttr.get()
            plan = plan_for(op, threads, host.f32_lanes, self.min_work)
            if plan is None:
                continue
            op.attributes[TAG] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), len(scripts))
            scripts.append(plan.script(len(scripts), threads))
        if not scripts:
            return
        text = ("module attributes {transform.with_named_sequence} {\n"
                "transform.named_sequence @__transform_main(%root: !transform.any_op {transform.readonly}) {\n"
                + "\n".join(scripts) + "\n" + _FOLD_MASKS + "\ntransform.yield\n}\n}")
        script = ir.Module.parse(text, module.context)
        try:
            interpreter.apply_named_sequence(module, script.body.operations[0], script)
        except Exception as e:  # the interpreter reports through diagnostics and an exception
            raise PassFailed(f"tiling the leftover linalg ops failed: {e}") from None

        def untag(op):
            if TAG in op.attributes:
                del op.attributes[TAG]
            return ir.WalkResult.ADVANCE

        module.walk(untag)


@register
@dataclass(frozen=True)
class CopiesToLinalgPass(TraceaPass):
    NAME = "tracea-cpu-copies-to-linalg"
    SUMMARY = ("after bufferization: each memref.copy of a function's body as linalg.copy, which "
               "tracea-cpu-tile-linalg splits among the threads and vectorizes (the runtime's memrefCopy "
               "copies a strided memref element by element)")

    def run(self, module: ir.Operation) -> None:
        for op in _function_body_ops(module):
            if op.name == "memref.copy" and all(ir.ShapedType(v.type).has_static_shape for v in op.operands):
                with op.location, ir.InsertionPoint(op):
                    linalg.copy(op.operands[0], outs=[op.operands[1]])
                op.erase()


def _function_body_ops(module: ir.Operation) -> list[ir.Operation]:
    """The ops directly in the bodies of the module's functions (not those nested in loops, such
    as the kernels' own), listed up front so that callers may replace them."""
    ops = []
    for func_op in module.regions[0].blocks[0].operations:
        func_op = func_op.operation
        if func_op.name == "func.func" and func_op.regions[0].blocks:
            ops += [op.operation for op in func_op.regions[0].blocks[0].operations]
    return ops
