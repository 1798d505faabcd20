"""`tracea-cpu-tile-linalg`: the linalg ops no CPU kernel took (elementwise chains, layer-norm
reductions, pooling, transposes, masks), run on every thread and vectorized where their body is
plain arithmetic.

Each op (named ops generalized first) gets a plan from its loop ranges and indexing maps; the
plans become one transform-dialect script run by MLIR's transform interpreter:
- enough work: `tile_using_forall` splits its outermost parallel loop that has a range of at
  least the thread count among the threads (an scf.forall, an scf.parallel once bufferized);
- a body of arith/math ops whose innermost loop is contiguous in every operand that uses it:
  `tile_using_for` to one vector along that loop (1 elsewhere) and `vectorize`, the last, partial
  vector peeled off and masked (whole vectors unmasked). Other strided reads stay scalar loops
  (LLVM gathers would be no faster), except transposing copies, which become a kernel of
  register-transposed blocks (targets/cpu/transpose.py).
  Not vectorized either (only split): reductions whose innermost range needs a mask (no lowering
  for masked reductions here) and maps with constant results (keepdim reductions).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import mlir.ir as ir
from mlir.dialects import func, linalg  # loaded at import anyway (tracea.dialects.context)
from mlir.dialects.transform import interpreter

from ...doctor.capabilities import host_cpu
from .transpose import transpose_kernel_text, transposed_dims
from ...passes.int_division import INTEGER_DIVISIONS
from ...passes.lower_to_linalg import inline_kernel
from ...passes.plan import count, plan_of
from ...passes.registry import PassFailed, TraceaPass, option, register

TAG = "tracea.tile_linalg"
# a module attribute: some loop nest here is MLIR's generic lowering of a linalg op (not a Tracea
# kernel); the code generator then optimizes the whole module (targets/cpu/native.py)
GENERIC_LOOPS = "tracea.generic_loops"
# the plan's count of products no kernel took because a size is known at run time only (tracea's
# GEMM, conv and softmax kernels take static shapes): as generic loops they run 10-100x slower
# than the kernels (a 96x768x3072 linear 110 ms, torch 4.5), which frontend/dynamic.py avoids
RUN_TIME_PRODUCTS = "products of run-time size (generic loops, 10-100x slower than the kernels)"
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


REDUCTION_CHAINS = 4


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
            tiles = [f"%vec{index}"]
            if self.peeled:
                # the last, partial vector peeled off: the others are whole, their loads and
                # stores unmasked (every vector of a 197-wide row was masked; masked byte loads
                # become a branch per lane, masked stores are slow even on floats)
                lines.append(f"%inner{index} = transform.cast %loops{index}#{loops - 1} : !transform.any_op to "
                             "!transform.op<\"scf.for\">")
                lines.append(f"%whole{index}, %partial{index} = transform.loop.peel %inner{index} "
                             ": (!transform.op<\"scf.for\">) -> (!transform.any_op, !transform.any_op)")
                tiles = [f"%whole{index}_op", f"%partial{index}_op"]
                for tile in tiles:
                    lines.append(f"{tile} = transform.structured.match ops{{[\"linalg.generic\"]}} in "
                                 f"{tile.removesuffix('_op')} : (!transform.any_op) -> !transform.any_op")
            lines += [f"transform.structured.vectorize {tile} vector_sizes {vector_sizes} : !transform.any_op"
                      for tile in tiles]
        return "\n".join(lines)

    @property
    def peeled(self) -> bool:
        """Whether the innermost loop's last, partial vector is peeled off (script)."""
        return self.vector is not None and not self.partial_vector and self.ranges[-1] > self.vector \
            and self.ranges[-1] % self.vector != 0

    def hoisting(self, index: int) -> str:
        """Once the masks are folded: what the vectors along a row share (a layer norm's scale from
        the row's variance) is computed once per row, not per vector (tensors' reads are pure, so
        they hoist), and partial sums stay in registers across the loop (its tensor argument, read
        and written whole each step, becomes a vector argument)."""
        if self.vector is None:
            return ""
        if self.partial_vector:
            return (f"transform.loop.hoist_loop_invariant_subsets %red{index} : !transform.any_op\n"
                    f"transform.apply_licm to %red{index} : !transform.any_op")
        if self.peeled:
            return "\n".join(f"transform.apply_licm to {loop} : !transform.any_op"
                             for loop in (f"%whole{index}", f"%partial{index}"))
        loops = sum(1 for r in self.ranges[:-1] if r > 1) + 1
        return f"transform.apply_licm to %loops{index}#{loops - 1} : !transform.any_op"


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
    maps = _maps(op)
    iterators = _parallel_loops(op)
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
    if partial and ranges[-1] % (REDUCTION_CHAINS * vector) == 0 and ranges[-1] >= 2 * REDUCTION_CHAINS * vector:
        # several vectors of partial sums: independent add chains, so the loop runs at the adds'
        # throughput instead of their latency (a 768-long row sum: ~3 -> ~1 cycle a vector)
        vector *= REDUCTION_CHAINS
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


ROW_TAG = "tracea.row_group"
# A row's temporaries (a layer norm's row in f64, say) stay in L1 / L2 up to this many elements
MAX_FUSED_ROW = 16384


def _dims(amap: ir.AffineMap) -> list[int]:
    return [e.position if isinstance(e, ir.AffineDimExpr) else -1 for e in amap.results]


def _row_projection(amap: ir.AffineMap, rows: int) -> bool:
    """A map reading a row-local slice: its results are the row loops d0..d(rows-1) in order,
    then at most the column loop."""
    return _dims(amap) in (list(range(rows)), list(range(rows + 1)))


def _row_local(op: ir.Operation, rows: int) -> bool:
    """A generic computing each row from that row alone: its leading `rows` loops are parallel and
    its output keeps them in place (an elementwise op over rows, a row reduction, a fill); its
    other operands are row-local too or one value per column shared by every row (a layer norm's
    weight and bias)."""
    if op.name != "linalg.generic" or len(op.results) != 1:
        return False
    maps = _maps(op)
    iterators = _parallel_loops(op)
    if maps[0].n_dims not in (rows, rows + 1) or not all(iterators[:rows]):
        return False
    return _row_projection(maps[-1], rows) and all(_row_projection(m, rows) or _dims(m) == [rows]
                                                    for m in maps[:-1])


def _maps(op: ir.Operation) -> list[ir.AffineMap]:
    return [ir.AffineMapAttr(a).value for a in ir.ArrayAttr(op.attributes["indexing_maps"])]


def _parallel_loops(op: ir.Operation) -> list[bool]:
    """Per loop of a linalg op: whether it is parallel (else a reduction)."""
    return ["parallel" in str(a) for a in ir.ArrayAttr(op.attributes["iterator_types"])]


def row_group(consumer: ir.Operation) -> list[ir.Operation] | None:
    """The producers to compute row by row inside `consumer`'s loop over rows, when it reads a
    row reduction (layer norm, RMS norm, a softmax no kernel took): consumer and producers
    row-local, each producer used only inside the group. A reduction read once per row would
    otherwise run as its own loop over the whole tensor, its result and its inputs (a layer
    norm's row in f64) written to memory between the loops."""
    if consumer.name != "linalg.generic" or len(consumer.results) != 1:
        return None
    shape = ir.ShapedType(consumer.results[0].type)
    if not shape.has_static_shape or shape.rank < 2 or not (0 < shape.shape[-1] <= MAX_FUSED_ROW) \
            or 0 in shape.shape:
        return None
    rows = shape.rank - 1
    iterators = _parallel_loops(consumer)
    if len(iterators) != shape.rank or not all(iterators) or not _row_local(consumer, rows):
        return None
    group, frontier = [consumer], [consumer]
    while frontier:
        op = frontier.pop()
        for operand in op.operands:
            if not isinstance(operand, ir.OpResult):
                continue
            producer = operand.owner.operation
            if producer.name != "linalg.generic" or any(producer == g for g in group):
                continue
            if producer.parent != consumer.parent or not _row_local(producer, rows):
                continue
            if not all(any(use.owner == g for g in group + [op]) for use in producer.results[0].uses):
                continue
            group.append(producer)
            frontier.append(producer)
    reduces = any(not all(_parallel_loops(g)) for g in group)
    return group[1:] if reduces else None


def fuse_row_groups(module: ir.Operation, threads: int) -> None:
    """Each row group becomes one loop over rows split among the threads (scf.forall), each
    thread's rows one at a time (scf.for) with the group's producers fused in. Each group is fused
    in a function of its own, then put back (_outlined, _put_back): MLIR's fusion prints the ops
    it fuses into a diagnostic, whatever the outcome, and printing numbers every value of the
    function around them, so in one large function the groups cost its size each: MaxViT's 50
    groups took 59 s, most of its 105 s compile."""
    scripts, tags, outlined = [], 0, []
    fuse = ("transform.structured.fuse_into_containing_op {} into {} : (!transform.any_op, !transform.any_op) "
            "-> (!transform.any_op, !transform.any_op)")
    claimed: list[ir.Operation] = []
    # last first: a consumer that is itself a producer of a later group (a layer norm's x - mean)
    # belongs to that group
    for op in reversed(_function_body_ops(module)):
        producers = row_group(op) if not any(op == c for c in claimed) else None
        if producers is None or any(p == c for p in producers for c in claimed):
            continue
        claimed += [op] + producers
        for member in [op] + producers:
            _own_empty_init(member)
        ordered = sorted(producers, key=_position)  # (before the move: positions in the function)
        outlined.append(_outlined(module, op, ordered, len(outlined)))
        i = len(scripts)
        handles = []
        # program order, last first: each fused producer's own producers are then in the loop
        for producer in [op] + ordered[::-1]:
            producer.attributes[ROW_TAG] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), tags)
            handles.append(f"%g{tags}")
            scripts.append(f"%g{tags} = transform.structured.match attributes{{{ROW_TAG} = {tags} : i64}} in %root "
                           ": (!transform.any_op) -> !transform.any_op")
            tags += 1
        consumer, producers = handles[0], handles[1:]
        shape = ir.ShapedType(op.results[0].type).shape
        split = next((d for d, r in enumerate(shape[:-1]) if r >= threads), None) if threads > 1 else None
        lines = []
        if split is not None:
            counts = [threads if d == split else 0 for d in range(len(shape))]
            lines.append(f"%t{i}, %forall{i}_0 = transform.structured.tile_using_forall {consumer} num_threads "
                         f"{counts} : (!transform.any_op) -> (!transform.any_op, !transform.any_op)")
            consumer = f"%t{i}"
            for j, p in enumerate(producers):  # (fusing consumes the loop's handle, and returns it anew)
                lines.append(f"{p}f, %forall{i}_{j + 1} = " + fuse.format(p, f"%forall{i}_{j}"))
            producers = [f"{p}f" for p in producers]
        # then each row: the loop over them inside each thread's share
        ones = [1] * (len(shape) - 1) + [0]
        lines.append(f"%r{i}, %rows{i}_0:{len(shape) - 1} = transform.structured.tile_using_for {consumer} "
                     f"tile_sizes {ones} : (!transform.any_op) -> ({', '.join(['!transform.any_op'] * len(shape))})")
        row_loop = f"%rows{i}_0#{len(shape) - 2}"
        for j, p in enumerate(producers):
            lines.append(f"{p}r, %rows{i}_{j + 1} = " + fuse.format(p, row_loop))
            row_loop = f"%rows{i}_{j + 1}"
        scripts.append("\n".join(lines))
    if not scripts:
        return
    count(module, "row groups (a reduction and its row-local ops in one loop over rows)", len(scripts))
    try:
        _apply(module, "\n".join(scripts), "fusing row reductions into their consumers")
    finally:
        for call, callee in outlined:
            _put_back(call, callee)
    _apply(module, _CLEAN_UP, "cleaning up after the row groups")


_COPIED_INTO_GROUPS = ("arith.constant", "tensor.empty")  # defined again inside (CSE folds them after)


def _outlined(module: ir.Operation, consumer: ir.Operation, producers: list[ir.Operation], index: int):
    """Moves a row group (`producers` in program order, then `consumer`) into a private function of
    its own, called where the consumer was: the values it reads from around it become arguments
    (constants and empty tensors are defined again inside). -> (the call, the function)."""
    group = producers + [consumer]

    def outside(value) -> bool:  # defined around the group, not in its ops (or their regions)
        where = value.owner.operation if isinstance(value, ir.OpResult) else value.owner.owner
        return not any(_inside(where, op) for op in group)

    external = []  # values defined around the group and read in it (its ops' regions included)
    for op in group:
        for nested in _ops_where(op, lambda _: True):
            for value in nested.operands:
                if outside(value) and not any(value == seen for seen in external):
                    external.append(value)
    copied = [v for v in external if isinstance(v, ir.OpResult) and v.owner.operation.name in _COPIED_INTO_GROUPS
              and not len(v.owner.operation.operands)]  # (an empty tensor of run-time size reads its sizes)
    arguments = [v for v in external if not any(v == c for c in copied)]
    with ir.InsertionPoint(module.regions[0].blocks[0]), consumer.location:
        callee = func.FuncOp(f"__tracea_row_group_{index}", ([v.type for v in arguments], [consumer.results[0].type]))
        callee.attributes["sym_visibility"] = ir.StringAttr.get("private")
        block = callee.add_entry_block()
    with ir.InsertionPoint(consumer), consumer.location:
        call = func.CallOp([consumer.results[0].type], f"__tracea_row_group_{index}", arguments)
    consumer.results[0].replace_all_uses_with(call.results[0])
    with ir.InsertionPoint(block), consumer.location:
        replacements = [(v, block.arguments[i]) for i, v in enumerate(arguments)]
        replacements += [(v, v.owner.operation.clone().results[0]) for v in copied]
        for op in group:
            ir.InsertionPoint(block).insert(op.detach_from_parent())
        func.ReturnOp([consumer.results[0]])
    for old, new in replacements:
        for use in list(old.uses):
            owner = getattr(use.owner, "operation", use.owner)
            if _inside(owner, callee.operation):
                owner.operands[use.operand_number] = new
    return call, callee


def _inside(op: ir.Operation, ancestor: ir.Operation) -> bool:
    op = getattr(op, "operation", op)
    while op is not None:
        if op == ancestor:
            return True
        op = op.parent
    return False


def _put_back(call, callee) -> None:
    """Undoes _outlined: the function's ops where its call is, reading the call's operands."""
    block = callee.regions[0].blocks[0]
    ops = list(block.operations)
    for op in ops[:-1]:
        op.move_before(call)
    for argument, value in zip(block.arguments, call.operands):
        argument.replace_all_uses_with(value)
    call.results[0].replace_all_uses_with(ops[-1].operands[0])
    call.erase()
    callee.erase()


def _ops_where(module: ir.Operation, keep) -> list[ir.Operation]:
    found = []

    def visit(op):
        if keep(op):
            found.append(op)
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    return found


def _reductions(module: ir.Operation) -> list[ir.Operation]:
    return _ops_where(module, lambda op: op.name == "vector.reduction")


def _fused_ops(module: ir.Operation) -> list[ir.Operation]:
    """The row groups' ops, now inside their loops over rows (tagged still)."""
    return _ops_where(module, lambda op: ROW_TAG in op.attributes and op.parent.name != "func.func")


def _own_empty_init(op: ir.Operation) -> None:
    """A tensor.empty shared as the output of several ops (torch-mlir's x - mean and the layer
    norm after it) gets a copy per op: fused into one loop, bufferization would otherwise see
    them write one buffer and copy it whole for each thread and row."""
    init = op.operands[len(op.operands) - 1]
    if isinstance(init, ir.OpResult) and init.owner.name == "tensor.empty" and len(list(init.uses)) > 1:
        op.operands[len(op.operands) - 1] = init.owner.operation.clone(ir.InsertionPoint(op)).results[0]


def _position(op: ir.Operation) -> int:
    return next(i for i, o in enumerate(op.block.operations) if o == op)


_CLEAN_UP = """%funcs_c = transform.structured.match ops{["func.func"]} in %root : (!transform.any_op) -> !transform.any_op
transform.apply_patterns to %funcs_c {
  transform.apply_patterns.canonicalization
  transform.apply_patterns.tensor.fold_tensor_empty
} : !transform.any_op
transform.apply_cse to %funcs_c : !transform.any_op"""


def _apply(module: ir.Operation, body: str, what: str) -> None:
    text = ("module attributes {transform.with_named_sequence} {\n"
            "transform.named_sequence @__transform_main(%root: !transform.any_op {transform.readonly}) {\n"
            + body + "\ntransform.yield\n}\n}")
    script = ir.Module.parse(text, module.context)
    try:
        interpreter.apply_named_sequence(module, script.body.operations[0], script)
    except Exception as e:  # the interpreter reports through diagnostics and an exception
        raise PassFailed(f"{what} failed: {e}") from None


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
        fuse_row_groups(module, threads)
        scripts, hoisting, products = [], [], 0
        for op in _function_body_ops(module) + _fused_ops(module):
            if op.name != "linalg.generic":
                continue
            in_row_group = ROW_TAG in op.attributes  # then one row of the group, on its thread
            if in_row_group:
                del op.attributes[ROW_TAG]
            elif (dims := transposed_dims(op)) is not None:
                parallel = threads > 1 and math.prod(ir.ShapedType(op.results[0].type).shape) >= self.min_work
                inline_kernel(op, transpose_kernel_text(f"__tracea_transpose_{len(scripts)}", op, dims,
                                                        host.f32_lanes, parallel, str(op.location)))
                count(module, "transposes (register-block kernel)")
                continue
            module.attributes[GENERIC_LOOPS] = ir.UnitAttr.get()
            products += _run_time_product(op)
            op_threads = 1 if in_row_group else threads
            plan = plan_for(op, op_threads, host.f32_lanes, self.min_work)
            if plan is None:
                continue
            op.attributes[TAG] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), len(scripts))
            hoisting.append(plan.hoisting(len(scripts)))
            scripts.append(plan.script(len(scripts), op_threads))
        count(module, "generic loop nests (split among threads and/or vectorized)", len(scripts))
        # (the pass runs again after bufferization, on the same ops)
        count(module, RUN_TIME_PRODUCTS, products - plan_of(module).get(RUN_TIME_PRODUCTS, 0))
        if not scripts:
            return
        kernels_own = _reductions(module)
        _apply(module, "\n".join(scripts + [_FOLD_MASKS] + hoisting), "tiling the leftover linalg ops")
        # the partial sums' final reduction across lanes: the order of the sum is the vectorizer's
        # already, so it may be a tree (an ordered one is a chain of dependent adds, ~100 cycles
        # for 32 lanes)
        for op in _reductions(module):
            if op not in kernels_own and str(op.attributes["fastmath"]) == "#arith.fastmath<none>":
                op.attributes["fastmath"] = ir.Attribute.parse("#arith.fastmath<reassoc>")

        for op in _ops_where(module, lambda op: TAG in op.attributes):
            del op.attributes[TAG]


_CASTS = {f"arith.{name}" for name in ("extf", "truncf", "sitofp", "uitofp", "fptosi", "fptoui", "extsi", "extui",
                                         "trunci")}


@register
@dataclass(frozen=True)
class SplitCastsPass(TraceaPass):
    NAME = "tracea-split-casts"
    SUMMARY = ("give each linalg.generic reading an elementwise cast (torch's f32 -> f64 before a variance) a "
               "copy of its own, so that linalg-fuse-elementwise-ops fuses the cast into every reader instead "
               "of writing the converted tensor to memory")

    def run(self, module: ir.Operation) -> None:
        for op in _function_body_ops(module):
            if not _elementwise_cast(op):
                continue
            uses = list(op.results[0].uses)
            if len(uses) < 2 or not all(use.owner.name == "linalg.generic" for use in uses):
                continue
            for use in uses[1:]:
                copy = op.clone(ir.InsertionPoint(use.owner))
                use.owner.operands[use.operand_number] = copy.results[0]


def _elementwise_cast(op: ir.Operation) -> bool:
    if op.name != "linalg.generic" or len(op.results) != 1:
        return False
    if not all(_parallel_loops(op)):
        return False
    if not all(m.is_permutation for m in _maps(op)):
        return False
    body = [o.name for o in op.regions[0].blocks[0].operations]
    return len(body) == 2 and body[0] in _CASTS


@register
@dataclass(frozen=True)
class CopiesToLinalgPass(TraceaPass):
    NAME = "tracea-cpu-copies-to-linalg"
    SUMMARY = ("after bufferization: each memref.copy of a function's body as linalg.copy, which "
               "tracea-cpu-tile-linalg splits among the threads and vectorizes (the runtime's memrefCopy "
               "copies a strided memref element by element)")

    # Copies of symbolic sizes too: a decoding step's KV-cache concatenation, once Dynamo makes
    # the cache's length symbolic; GPT-2 (6 layers, d768) after 1,024 tokens, 2 threads: 41.1 ->
    # 22.2 ms a token.
    def run(self, module: ir.Operation) -> None:
        for op in _function_body_ops(module):
            if op.name == "memref.copy":
                with op.location, ir.InsertionPoint(op):
                    linalg.copy(op.operands[0], outs=[op.operands[1]])
                op.erase()


def _run_time_product(op: ir.Operation) -> bool:
    """A contraction (two inputs read along one reduction loop: a matmul, a conv) with a size
    known at run time only."""
    shaped = [v.type for v in list(op.operands) + list(op.results) if isinstance(v.type, ir.ShapedType)]
    if all(ir.ShapedType(t).has_static_shape for t in shaped):
        return False
    kinds = [str(k) for k in ir.ArrayAttr(op.attributes["iterator_types"])]
    reductions = {d for d, k in enumerate(kinds) if "reduction" in k}
    maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(op.attributes["indexing_maps"])]
    inputs = maps[:op.attributes["operandSegmentSizes"][0]]  # (on tensors and on buffers alike)
    return any(sum(any(isinstance(e, ir.AffineDimExpr) and e.position == d for e in m.results) for m in inputs) >= 2
               for d in reductions)


def _function_body_ops(module: ir.Operation) -> list[ir.Operation]:
    """The ops directly in the bodies of the module's functions (not those nested in loops, such
    as the kernels' own), listed up front so that callers may replace them."""
    ops = []
    for func_op in module.regions[0].blocks[0].operations:
        func_op = func_op.operation
        if func_op.name == "func.func" and func_op.regions[0].blocks:
            ops += [op.operation for op in func_op.regions[0].blocks[0].operations]
    return ops
