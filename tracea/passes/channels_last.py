"""`tracea-channels-last`: a model's NCHW convolutions computed channels-last (NHWC), the way
inductor lays out a CNN (its layout optimization) and oneDNN prefers it.

PyTorch models arrive NCHW. Tracea's NHWC convolutions are faster on the CPU (ResNet-50's convs,
batch 8 at 224x224 on 2 threads: 342 ms NHWC against 370 ms NCHW, the 1x1 convs as plain GEMMs
over contiguous channels), but only if the activations stay NHWC between them. So:
1. every `linalg.conv_2d_nchw_fchw` becomes transpose -> `linalg.conv_2d_nhwc_hwcf` -> transpose
   back, its filter (an argument of the entry function that the caller lays out once, HWCF:
   `weights` names how many leading arguments are such weights) taken in the new layout;
2. each transpose back to NCHW is sunk through what follows it where the op does not care about
   the layout (elementwise generics such as ReLU and the residual add, zero/-inf padding, max and
   sum pooling), and a transpose meeting its inverse vanishes.
What is left: the input image's transpose and one before the first op that reads NCHW (ResNet's
global average pool's flatten), each the size of one activation.

All or nothing: a function with any other convolution (grouped, depthwise: their NCHW kernels
are tuned for it) or a filter that is not such a weight stays as it is. The module then carries
`tracea.weight_layouts`: {argument number: the permutation its array takes, as numpy's
`transpose` axes}, for the caller.
"""
from __future__ import annotations

from dataclasses import dataclass

import mlir.ir as ir
from mlir.dialects import arith, linalg, tensor

from .raise_linalg import _all_parallel, _body, _identity, _maps, _producer, _zero_fill
from .registry import TraceaPass, option, register

TO_NHWC = (0, 2, 3, 1)  # linalg.transpose permutations: result dim i is input dim perm[i]
TO_NCHW = (0, 3, 1, 2)
FCHW_TO_HWCF = (2, 3, 1, 0)
WEIGHT_LAYOUTS = "tracea.weight_layouts"
_CONVS = ("linalg.conv_2d_nchw_fchw", "linalg.conv_2d_nchw_fchw_q", "linalg.conv_2d_ngchw_fgchw",
          "linalg.conv_2d_ngchw_gfchw", "linalg.depthwise_conv_2d_nchw_chw", "linalg.conv_2d_nhwc_hwcf",
          "linalg.conv_2d_nhwc_fhwc", "linalg.depthwise_conv_2d_nhwc_hwc")
_POOLS = {"linalg.pooling_nchw_max": linalg.pooling_nhwc_max, "linalg.pooling_nchw_sum": linalg.pooling_nhwc_sum}


def _permutation(op: ir.Operation | None) -> tuple[int, ...] | None:
    if op is None or op.name != "linalg.transpose":
        return None
    return tuple(int(i) for i in op.attributes["permutation"])


def _permuted(shape, perm) -> list[int]:
    return [shape[i] for i in perm]


def _transpose(value: ir.Value, perm) -> ir.Value:
    empty = tensor.empty(_permuted(value.type.shape, perm), value.type.element_type)
    return linalg.transpose(value, outs=[empty], permutation=list(perm)).results[0]


def _ints(op: ir.Operation, name: str) -> list[int]:
    return [int(v) for v in ir.DenseIntElementsAttr(op.attributes[name])] if name in op.attributes else [1, 1]


def _entry_weight(value: ir.Value, block: ir.Block, weights: int) -> bool:
    return isinstance(value, ir.BlockArgument) and value.owner == block and value.arg_number < weights


@register
@dataclass(frozen=True)
class ChannelsLastPass(TraceaPass):
    NAME = "tracea-channels-last"
    SUMMARY = ("compute a model's NCHW convolutions in NHWC, the activations kept NHWC between them and "
               "the filters taken as HWCF weights (the module's tracea.weight_layouts tells the caller)")
    weights: int = option(0, "leading arguments of the entry function that are weights the caller lays "
                             "out as tracea.weight_layouts says (0: none, and the pass changes nothing)")
    entry: str = option("main", "the entry function")

    def run(self, module: ir.Operation) -> None:
        with ir.Location.unknown():  # for the types made here; ops take their convolution's
            self._run(module)

    def _run(self, module: ir.Operation) -> None:
        block = self._entry_block(module)
        if block is None or not self.weights:
            return
        convs = [op.operation for op in block.operations if op.operation.name == "linalg.conv_2d_nchw_fchw"]
        filters = {op.operands[1] for op in convs}
        if not convs or not self._all_convertible(module, convs, filters, block):
            return
        for w in filters:
            w.set_type(ir.RankedTensorType.get(_permuted(w.type.shape, FCHW_TO_HWCF), w.type.element_type))
        self._retype_entry(block)
        for op in convs:
            self._to_nhwc(op)
        while self._sink_transposes(block):
            pass
        for op in reversed(list(block.operations)):  # users before producers
            op = op.operation
            if op.name.startswith(("linalg.", "tensor.")) and len(op.results) \
                    and all(not list(r.uses) for r in op.results):
                op.erase()
        layouts = {str(w.arg_number): ir.DenseI64ArrayAttr.get(list(FCHW_TO_HWCF))
                   for w in sorted(filters, key=lambda w: w.arg_number)}
        module.attributes[WEIGHT_LAYOUTS] = ir.DictAttr.get(layouts)

    def _entry_block(self, module: ir.Operation) -> ir.Block | None:
        for op in module.regions[0].blocks[0].operations:
            op = op.operation
            if op.name == "func.func" and ir.StringAttr(op.attributes["sym_name"]).value == self.entry \
                    and op.regions[0].blocks:
                return op.regions[0].blocks[0]
        return None

    def _all_convertible(self, module: ir.Operation, convs, filters, block: ir.Block) -> bool:
        """Every convolution of the module is an f32 NCHW one with static shapes in the entry
        function, and every filter an entry weight read by such convolutions only."""
        found = []

        def visit(op):
            if op.operation.name in _CONVS:
                found.append(op.operation)
            return ir.WalkResult.ADVANCE

        module.walk(visit)
        if len(found) != len(convs):
            return False
        for op in convs:
            if any(not ir.ShapedType(v.type).has_static_shape or str(v.type.element_type) != "f32"
                   for v in list(op.operands) + list(op.results)):
                return False
        return all(_entry_weight(w, block, self.weights)
                   and all(u.owner.operation.name == "linalg.conv_2d_nchw_fchw" and u.operand_number == 1
                           for u in w.uses) for w in filters)

    def _retype_entry(self, block: ir.Block) -> None:
        func_op = block.owner.operation
        ftype = ir.FunctionType(ir.TypeAttr(func_op.attributes["function_type"]).value)
        inputs = [a.type for a in block.arguments]
        func_op.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(inputs, ftype.results))

    @staticmethod
    def _to_nhwc(op: ir.Operation) -> None:
        x, w, init = op.operands
        with ir.InsertionPoint(op), op.location:
            x, bias = _transpose(x, TO_NHWC), _bias(init)
            if tuple(w.type.shape[:2]) == (1, 1) and _ints(op, "strides") == [1, 1] and bias is not False:
                conv = _pointwise_as_matmul(x, w, bias)
            else:
                conv = linalg.conv_2d_nhwc_hwcf(x, w, outs=[_init_like(init, TO_NHWC)],
                                                strides=_ints(op, "strides"), dilations=_ints(op, "dilations"))
            op.results[0].replace_all_uses_with(_transpose(conv, TO_NCHW))

    @staticmethod
    def _sink_transposes(block: ir.Block) -> bool:
        changed = False
        for op in list(block.operations):
            op = op.operation
            if not any(list(r.uses) for r in op.results):
                continue  # dead (a rewritten op): erased at the end
            if op.name == "linalg.transpose":
                changed |= _cancel(op)
            elif op.name == "linalg.generic":
                changed |= _sink_through_elementwise(op)
            elif op.name == "tensor.pad":
                changed |= _sink_through_pad(op)
            elif op.name in _POOLS:
                changed |= _sink_through_pool(op)
        return changed


def _init_like(init: ir.Value, perm) -> ir.Value:
    """`init` (a fill or a broadcast of a per-channel vector into an empty tensor) made anew in
    the permuted layout; any other init transposed."""
    fill, bias = _producer(init), _bias(init)
    shape, element = _permuted(init.type.shape, perm), init.type.element_type
    if fill is not None and fill.name == "linalg.fill":
        return linalg.fill(fill.operands[0], outs=[tensor.empty(shape, element)])
    if isinstance(bias, ir.Value):
        channel = perm.index(1)  # where the channel dim went
        dims = [d for d in range(4) if d != channel]
        return linalg.broadcast(bias, outs=[tensor.empty(shape, element)], dimensions=dims)
    return _transpose(init, perm)


def _bias(init: ir.Value) -> ir.Value | None | bool:
    """A conv's per-channel bias when `init` broadcasts one, None for a zero fill, else False."""
    fill = _producer(init)
    if fill is not None and fill.name == "linalg.broadcast" and list(fill.attributes["dimensions"]) == [0, 2, 3]:
        return fill.operands[0]
    return None if _zero_fill(init) else False


def _pointwise_as_matmul(x: ir.Value, w: ir.Value, bias: ir.Value | None) -> ir.Value:
    """A 1x1 stride-1 NHWC conv as the GEMM it is, [N H W, C] x [C, F] (+ the bias as a generic
    over its rows), so that what follows it (a residual add and ReLU) becomes the GEMM's epilogue
    (tracea-raise-linalg), which a conv's epilogue cannot take."""
    (n, h, wd, c), f, element = x.type.shape, w.type.shape[3], x.type.element_type
    rows = ir.RankedTensorType.get([n * h * wd, c], element)
    a = tensor.collapse_shape(rows, x, [[0, 1, 2], [3]])
    b = tensor.collapse_shape(ir.RankedTensorType.get([c, f], element), w, [[0, 1, 2], [3]])
    product = ir.RankedTensorType.get([n * h * wd, f], element)
    zero = arith.constant(element, 0.0)
    acc = linalg.fill(zero, outs=[tensor.empty(product.shape, element)])
    result = linalg.matmul(a, b, outs=[acc])
    if bias is not None:
        per_column = ir.AffineMap.get(2, 0, [ir.AffineDimExpr.get(1)])
        result = _elementwise(lambda x, b: arith.addf(x, b), [result, bias], product, [None, per_column])
    return tensor.expand_shape(ir.RankedTensorType.get([n, h, wd, f], element), result, [[0, 1, 2], [3]], [],
                               [n, h, wd, f])


def _inverse(perm) -> tuple[int, ...]:
    return tuple(perm.index(i) for i in range(len(perm)))


def _cancel(op: ir.Operation) -> bool:
    """transpose(transpose(y, P), inverse of P) -> y."""
    inner = _producer(op.operands[0])
    perm = _permutation(inner)
    if perm is None or _inverse(perm) != _permutation(op):
        return False
    op.results[0].replace_all_uses_with(inner.operands[0])
    return True


def _sink_through_elementwise(op: ir.Operation) -> bool:
    """An elementwise generic of identity maps whose every input is transpose(y_i, P) computes
    transpose(generic(y_i), P): the generic runs on the y_i."""
    ins = list(op.operands)[:-1]
    if len(op.results) != 1 or not ins or len(_body(op).arguments) != len(ins) + 1:
        return False
    identity = _identity(len(op.results[0].type.shape))
    if any(str(m) != identity for m in _maps(op)) or not _all_parallel(op):
        return False
    perms = {_permutation(_producer(v)) for v in ins}
    if len(perms) != 1 or None in perms:
        return False
    perm = perms.pop()
    if list(_body(op).arguments[-1].uses):
        return False  # the body reads its init
    out_type = op.results[0].type
    source_shape = _permuted(out_type.shape, _inverse(perm))
    with ir.InsertionPoint(op), op.location:
        empty = tensor.empty(source_shape, out_type.element_type)
    for i, v in enumerate(ins):
        op.operands[i] = _producer(v).operands[0]
    op.operands[len(ins)] = empty
    _reroute(op, ir.RankedTensorType.get(source_shape, out_type.element_type), perm)
    return True


def _reroute(op: ir.Operation, source_type: ir.Type, perm) -> None:
    """`op` (its operands already replaced) now yields `source_type`; its users get its result
    transposed by `perm`, as they did before."""
    result = op.results[0]
    result.set_type(source_type)
    with ir.InsertionPoint.after(op), op.location:
        moved = _transpose(result, perm)
    result.replace_all_uses_except(moved, _producer(moved))


def _sink_through_pad(op: ir.Operation) -> bool:
    """pad(transpose(y, P)) -> transpose(pad'(y), P), pad' padding y's dims as pad did P's."""
    perm = _permutation(_producer(op.operands[0]))
    if perm is None or len(op.operands) != 1 or len(perm) != len(op.results[0].type.shape) \
            or any(list(a.uses) for a in _body(op).arguments):
        return False  # (a padding value that depends on the position would need its indices permuted)
    inverse = _inverse(perm)
    for name in ("static_low", "static_high"):
        amounts = list(ir.DenseI64ArrayAttr(op.attributes[name]))
        op.attributes[name] = ir.DenseI64ArrayAttr.get(_permuted(amounts, inverse))
    op.operands[0] = _producer(op.operands[0]).operands[0]
    out_type = op.results[0].type
    _reroute(op, ir.RankedTensorType.get(_permuted(out_type.shape, inverse), out_type.element_type), perm)
    return True


def _sink_through_pool(op: ir.Operation) -> bool:
    """pool_nchw(transpose(y, NHWC -> NCHW)) -> transpose(pool_nhwc(y), NHWC -> NCHW); a max pool
    as the elementwise max of its window's taps (strided slices of y), whose loops run along the
    contiguous channels, vectorized (the pooling op's innermost loop is the window's: scalar)."""
    x, window, init = op.operands
    if _permutation(_producer(x)) != TO_NCHW:
        return False
    y = _producer(x).operands[0]
    with ir.InsertionPoint(op), op.location:
        strides, dilations = _ints(op, "strides"), _ints(op, "dilations")
        if op.name == "linalg.pooling_nchw_max" and _combiner(op) == "arith.maximumf":
            pooled = _max_of_taps(y, window.type.shape, strides, dilations, _init_like(init, TO_NHWC))
        else:
            pooled = _POOLS[op.name](y, window, outs=[_init_like(init, TO_NHWC)], strides=strides, dilations=dilations)
        op.results[0].replace_all_uses_with(_transpose(pooled, TO_NCHW))
    return True


def _combiner(op: ir.Operation) -> str | None:
    """The op a pooling's body combines the window's values with."""
    body = list(_body(op).operations)
    return body[0].operation.name if len(body) == 2 else None


def _max_of_taps(y: ir.Value, window, strides, dilations, init: ir.Value) -> ir.Value:
    """max(init, y[:, dh kh :: sh, dw kw :: sw, :] for each tap (kh, kw)), each tap the output's
    shape."""
    shape, element = init.type.shape, init.type.element_type
    out_type = ir.RankedTensorType.get(shape, element)
    acc = init
    for kh in range(window[0]):
        for kw in range(window[1]):
            tap = tensor.extract_slice(out_type, y, [], [], [], [0, kh * dilations[0], kw * dilations[1], 0],
                                       list(shape), [1, strides[0], strides[1], 1])
            acc = _elementwise(lambda a, b: arith.maximumf(a, b), [acc, tap], out_type)
    return acc


def _elementwise(body, ins: list[ir.Value], out_type: ir.Type, maps: list | None = None) -> ir.Value:
    """A linalg.generic computing body(*elements) over `ins` into a new `out_type`, each input
    read through its map in `maps` (None, or no `maps`: the identity)."""
    rank, element = len(out_type.shape), out_type.element_type
    identity = ir.AffineMap.get_identity(rank)
    maps = [m or identity for m in (maps or [None] * len(ins))] + [identity]
    parallel = ir.Attribute.parse("#linalg.iterator_type<parallel>")
    op = linalg.GenericOp([out_type], ins, [tensor.empty(out_type.shape, element)],
                          ir.ArrayAttr.get([ir.AffineMapAttr.get(m) for m in maps]),
                          ir.ArrayAttr.get([parallel] * rank))
    block = op.regions[0].blocks.append(*[element] * (len(ins) + 1))
    with ir.InsertionPoint(block):
        linalg.YieldOp([body(*block.arguments[:len(ins)])])
    return op.results[0]
