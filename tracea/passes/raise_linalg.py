"""`tracea-raise-linalg`: find tracea ops in linalg on tensors (what torch-mlir imports).

Patterns raised (anything else stays linalg and takes the generic lowering):
- `linalg.matmul` / `linalg.batch_matmul` into a zero fill -> `tracea.gemm`, absorbing a transpose
  of the last two dims of either operand and a broadcast of a 2-D right operand over the batch;
  then the chain of single-use elementwise `linalg.generic`s that follows it, as far as each one
  is an epilogue step (bias add, residual add, scale, relu, gelu, sigmoid, silu) -> `tracea.fused_gemm`.
- `linalg.conv_2d_nchw_fchw` / `conv_2d_nhwc_hwcf` (tracea-channels-last's) on a zero `tensor.pad`
  into a zero fill or a broadcast bias -> `tracea.conv2d`.
- max-subtract / exp / sum / divide along one axis -> `tracea.softmax`.
- then, on the raised ops: gemm(Q, K^T) -> softmax over the keys (torch's "safe" softmax too,
  which gives 0 for rows of -inf) -> gemm with V -> `tracea.attention`, taking a constant scale
  applied to Q or K^T along (torch-mlir splits SDPA's scale between them).

Elementwise bodies are recognized by what they compute, not by how they are spelled: the part of
the body that depends on one value only is evaluated on sample points and compared with each
known activation, so `max(x, 0)`, `select(x > 0, x, 0)` or an erf-based GELU written any way match.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import mlir.ir as ir
import numpy as np

from mlir.dialects import arith, linalg, tensor

from ..dialects import builder as td
from ..dialects.ops import Epilogue, view
from ..errors import OpError
from .registry import TraceaPass, register

_CMP = {1: np.equal, 2: np.greater, 3: np.greater_equal, 4: np.less, 5: np.less_equal, 6: np.not_equal,
        8: np.equal, 9: np.greater, 10: np.greater_equal, 11: np.less, 12: np.less_equal, 13: np.not_equal}
_BINARY = {"arith.addf": np.add, "arith.subf": np.subtract, "arith.mulf": np.multiply, "arith.divf": np.divide,
           "arith.maximumf": np.maximum, "arith.maxnumf": np.fmax, "arith.minimumf": np.minimum,
           "arith.minnumf": np.fmin, "math.powf": np.power, "math.fpowi": np.power}
_CMPI = {0: np.equal, 1: np.not_equal, 2: np.less, 3: np.less_equal, 4: np.greater, 5: np.greater_equal}
_INTEGER = {"arith.addi": np.add, "arith.subi": np.subtract, "arith.muli": np.multiply, "arith.andi": np.bitwise_and,
            "arith.ori": np.bitwise_or, "arith.xori": np.bitwise_xor, "arith.maxsi": np.maximum,
            "arith.minsi": np.minimum}
_CASTS = {"arith.index_cast": lambda x: x, "arith.extsi": lambda x: x, "arith.extui": lambda x: x,
          "arith.trunci": lambda x: x, "arith.sitofp": lambda x: np.asarray(x, np.float64)}
_UNARY = {"arith.negf": np.negative, "math.exp": np.exp, "math.tanh": np.tanh, "math.sqrt": np.sqrt,
          "math.rsqrt": lambda x: 1 / np.sqrt(x), "math.log": np.log, "math.log1p": np.log1p, "math.absf": np.abs,
          "math.erf": np.vectorize(math.erf), "arith.extf": lambda x: x, "arith.truncf": lambda x: x,
          "math.expm1": np.expm1}
_SAMPLES = np.linspace(-6.0, 6.0, 97)
_ADD_EXTRA = Epilogue("extra")  # marker in _epilogue_steps: the bias/residual operand is added here


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


_ACTIVATIONS = {
    Epilogue("relu"): lambda x: np.maximum(x, 0),
    Epilogue("gelu", approximate="erf"): lambda x: 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2))),
    Epilogue("gelu", approximate="tanh"): lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))),
    Epilogue("sigmoid"): _sigmoid,
    Epilogue("silu"): lambda x: x * _sigmoid(x),
    Epilogue("hardswish"): lambda x: x * np.clip(x + 3, 0, 6) / 6,
    Epilogue("hardsigmoid"): lambda x: np.clip(x + 3, 0, 6) / 6,
}


def _producer(value: ir.Value) -> ir.Operation | None:
    return value.owner.operation if isinstance(value, ir.OpResult) else None


def _float_constant(value: ir.Value) -> float | None:
    op = _producer(value)
    if op is None or op.name != "arith.constant" or not isinstance(op.attributes["value"], ir.FloatAttr):
        return None
    return op.attributes["value"].value


def _single_use(value: ir.Value) -> ir.Operation | None:
    uses = list(value.uses)
    return uses[0].owner.operation if len(uses) == 1 else None


def _maps(op: ir.Operation) -> list[ir.AffineMap]:
    return [ir.AffineMapAttr(a).value for a in op.attributes["indexing_maps"]]


def _all_parallel(op: ir.Operation) -> bool:
    return all("parallel" in str(a) for a in op.attributes["iterator_types"])


def _body(op: ir.Operation) -> ir.Block:
    return op.regions[0].blocks[0]


def _yielded(op: ir.Operation) -> list[ir.Value]:
    block = _body(op)
    return list(block.operations[len(block.operations) - 1].operands)


def _ins(op: ir.Operation) -> list[ir.Value]:
    count = op.attributes["operandSegmentSizes"][0] if "operandSegmentSizes" in op.attributes else len(op.operands) - 1
    return list(op.operands)[:count]


def _identity(rank: int) -> str:
    dims = ", ".join(f"d{i}" for i in range(rank))
    return f"({dims}) -> ({dims})"


def _zero_fill(value: ir.Value) -> bool:
    op = _producer(value)
    return op is not None and op.name == "linalg.fill" and _float_constant(op.operands[0]) == 0.0


# --- evaluating linalg bodies -------------------------------------------------------------------
class _NotScalar(Exception):
    pass


_INDICES = object()  # _evaluate's env key of the iteration indices, for linalg.index


def _evaluate(root: ir.Value, env: dict) -> np.ndarray:
    """Value of `root` given arrays for some values in `env`; constants are read from the IR."""
    if root in env:
        return env[root]
    constant = _float_constant(root)
    if constant is not None:
        return np.float64(constant)
    op = _producer(root)
    if op is not None and op.name == "arith.constant" and isinstance(op.attributes["value"], ir.BoolAttr):
        return np.bool_(op.attributes["value"].value)
    if op is not None and op.name == "arith.constant" and isinstance(op.attributes["value"], ir.IntegerAttr):
        return np.int64(op.attributes["value"].value)  # an exponent of math.fpowi (x^3 in GELU), an index
    if op is None:
        raise _NotScalar
    if op.name == "linalg.index" and _INDICES in env:  # (a tensor evaluated whole: _constant_tensor)
        return env[_INDICES][ir.IntegerAttr(op.attributes["dim"]).value]
    args = [_evaluate(v, env) for v in op.operands]
    predicate = ir.IntegerAttr(op.attributes["predicate"]).value if "predicate" in op.attributes else None
    if op.name in _BINARY:
        result = _BINARY[op.name](*args)
    elif op.name in _UNARY:
        result = _UNARY[op.name](args[0])
    elif op.name in _INTEGER:
        result = _INTEGER[op.name](*args)
    elif op.name in _CASTS:
        result = _CASTS[op.name](args[0])
    elif op.name == "arith.cmpf" and predicate in _CMP:
        result = _CMP[predicate](*args)
    elif op.name == "arith.cmpi" and predicate in _CMPI:
        result = _CMPI[predicate](*args)
    elif op.name == "arith.select":
        result = np.where(*args)
    else:
        raise _NotScalar
    env[root] = result
    return result


# Constant tensors are evaluated whole (torch-mlir's causal mask); bigger ones are left alone.
_CONSTANT_ELEMENTS = 1 << 22


def _gathered(array: np.ndarray, amap: ir.AffineMap, indices: np.ndarray) -> np.ndarray:
    """array[amap(i)] at every point i of `indices` (np.indices of the iteration space)."""
    at = []
    for expr in amap.results:
        if isinstance(expr, ir.AffineDimExpr):
            at.append(indices[expr.position])
        elif isinstance(expr, ir.AffineConstantExpr):
            at.append(expr.value)
        else:
            raise _NotScalar
    return array[tuple(at)] if at else np.broadcast_to(array, indices.shape[1:])


def _constant_tensor(value: ir.Value) -> np.ndarray | None:
    """The value of a static tensor computed from constants and indices alone, or None: splat
    constants, reshapes, fills and all-parallel linalg.generics (index arithmetic, compares,
    selects)."""
    shape = tuple(value.type.shape)
    op = _producer(value)
    if op is None or math.prod(shape) > _CONSTANT_ELEMENTS:
        return None
    if op.name == "arith.constant":
        attr = op.attributes["value"]
        if not (isinstance(attr, ir.DenseElementsAttr) and attr.is_splat):
            return None
        splat = attr.get_splat_value()
        scalar = ir.FloatAttr(splat).value if isinstance(splat, ir.FloatAttr) else ir.IntegerAttr(splat).value
        return np.full(shape, bool(scalar) if str(attr.type.element_type) == "i1" else scalar)
    if op.name == "tensor.empty":
        return np.zeros(shape)
    if op.name in ("tensor.expand_shape", "tensor.collapse_shape"):
        inner = _constant_tensor(op.operands[0])
        return None if inner is None else inner.reshape(shape)
    if op.name == "linalg.fill":
        try:
            return np.full(shape, _evaluate(op.operands[0], {}))
        except _NotScalar:
            return None
    if op.name != "linalg.generic" or not _all_parallel(op) or len(op.results) != 1:
        return None
    env: dict = {_INDICES: np.indices(shape)}
    for argument, operand, amap in zip(_body(op).arguments, op.operands, _maps(op)):
        if list(argument.uses):
            array = _constant_tensor(operand)
            if array is None:
                return None
            try:
                env[argument] = _gathered(array, amap, env[_INDICES])
            except _NotScalar:
                return None
    with np.errstate(all="ignore"):
        try:
            return np.broadcast_to(_evaluate(_yielded(op)[0], env), shape)
        except _NotScalar:
            return None


def _dependencies(root: ir.Value, leaves: set, cut: ir.Value | None = None) -> set:
    """Which of `leaves` (block arguments) `root` reaches without passing through `cut`."""
    found, stack, seen = set(), [root], set()
    while stack:
        v = stack.pop()
        if (cut is not None and v == cut) or v in seen:
            continue
        seen.add(v)
        if v in leaves:
            found.add(v)
        op = _producer(v)
        if op is not None:
            stack.extend(op.operands)
    return found


def _subexpressions(root: ir.Value) -> list[ir.Value]:
    """Operands of `root`'s expression, nearest first."""
    order, queue, seen = [], [root], {root}
    while queue:
        v = queue.pop(0)
        order.append(v)
        op = _producer(v)
        for w in (op.operands if op is not None else []):
            if w not in seen:
                seen.add(w)
                queue.append(w)
    return order[1:]


def _identify(root: ir.Value, variable: ir.Value) -> Epilogue | None:
    """Which single-input epilogue `root` computes from `variable`."""
    with np.errstate(all="ignore"):
        try:
            y = _evaluate(root, {variable: _SAMPLES})
        except _NotScalar:
            return None
    return _matching_epilogue(y)


def _matching_epilogue(y: np.ndarray) -> Epilogue | None:
    """The single-input epilogue whose values on _SAMPLES are `y`, if any."""
    with np.errstate(all="ignore"):
        y = np.broadcast_to(y, _SAMPLES.shape).astype(np.float64)
        for epilogue, reference in _ACTIVATIONS.items():
            if np.allclose(y, reference(_SAMPLES), rtol=1e-5, atol=1e-6):
                return epilogue
        c = float(y[-1] / _SAMPLES[-1])
        if math.isfinite(c) and np.allclose(y, c * _SAMPLES, rtol=1e-6, atol=1e-7):
            return None if c == 1.0 else Epilogue("scale", value=c)
    return None


def _epilogue_steps(root: ir.Value, main: ir.Value, extra: ir.Value | None, leaves: set) -> list[Epilogue] | None:
    """Decompose the body value `root` into epilogue steps applied to `main` (a block argument),
    the optional `extra` block argument being added once (bias or residual)."""
    if root == main:
        return []
    op = _producer(root)
    if op is not None and op.name == "arith.addf" and extra is not None and extra in list(op.operands):
        other = op.operands[1] if op.operands[0] == extra else op.operands[0]
        inner = _epilogue_steps(other, main, None, leaves)
        return None if inner is None else inner + [_ADD_EXTRA]
    # the nearest value every path to an argument passes through whose function is a step (one
    # body's sigmoid, 1 / (1 + exp(-x)), is no step of 1 + exp(-x) but one of x)
    for candidate in _subexpressions(root):
        if not _dependencies(root, leaves, cut=candidate) and _dependencies(candidate, leaves):
            step = _identify(root, candidate)
            inner = _epilogue_steps(candidate, main, extra, leaves) if step is not None else None
            if inner is not None:
                return inner + [step]
    return None


# --- patterns -----------------------------------------------------------------------------------
def _is_last_two_transpose(op: ir.Operation | None) -> bool:
    if op is None or op.name != "linalg.transpose":
        return False
    perm = list(op.attributes["permutation"])
    n = len(perm)
    return n >= 2 and perm == list(range(n - 2)) + [n - 1, n - 2]


def _broadcast_over_batch(op: ir.Operation | None) -> ir.Value | None:
    """The 2-D value a 3-D batch broadcast (linalg.generic copying [K, N] into [B, K, N]) copies."""
    if op is None or op.name != "linalg.generic" or len(_ins(op)) != 1 or not _all_parallel(op):
        return None
    maps = _maps(op)
    if str(maps[0]) != "(d0, d1, d2) -> (d1, d2)" or str(maps[1]) != _identity(3) \
            or _yielded(op) != [_body(op).arguments[0]]:
        return None
    return _ins(op)[0]


_DEFAULT_MAPS = {
    "linalg.matmul": ["(d0, d1, d2) -> (d0, d2)", "(d0, d1, d2) -> (d2, d1)", "(d0, d1, d2) -> (d0, d1)"],
    "linalg.batch_matmul": ["(d0, d1, d2, d3) -> (d0, d1, d3)", "(d0, d1, d2, d3) -> (d0, d3, d2)",
                            "(d0, d1, d2, d3) -> (d0, d1, d2)"],
}


@dataclass
class _Chain:
    steps: list  # td.EpilogueStep
    last: ir.Operation  # the op whose result the fused op replaces
    reshapes: list  # expand/collapse_shape ops the chain passed through, re-applied after the fused op


# the most elementwise generics one function of a GEMM's result may be written with (a GELU
# spelled out is 8)
_REGION_OPS = 16


def _elementwise_region(value: ir.Value) -> tuple[ir.Operation, Epilogue] | None:
    """(the last generic, the epilogue step) when the uses of `value` are elementwise generics
    that together compute one function of it and nothing else reads their results but the
    last one's users: a GELU written out with x used three times (GPT-2's), a hardswish (x times
    a clamp of x + 3), which no chain of single-use generics follows. The largest such region
    among the elementwise generics downstream of `value` (which may go on past the function:
    a hardswish's result multiplied by a squeeze-excitation gate)."""
    rank = len(value.type.shape)
    members: list[ir.Operation] = []
    queue = [value]
    while queue and len(members) < _REGION_OPS:
        for use in list(queue.pop(0).uses):
            op = use.owner.operation
            if op in members or op.name != "linalg.generic" or not _all_parallel(op) or len(op.results) != 1 \
                    or op.results[0].type != value.type or any(str(m) != _identity(rank) for m in _maps(op)):
                continue
            members.append(op)
            queue.append(op.results[0])
    members = sorted(members, key=lambda op: sum(1 for other in members if other.is_before_in_block(op)))
    # the regions are the prefixes of the members in program order, each evaluated once: a member
    # reading a value from outside (or not evaluable) ends every larger region too
    arrays, found = {value: _SAMPLES}, None
    with np.errstate(all="ignore"):
        for end, op in enumerate(members, 1):
            if any(v not in arrays for v in _ins(op)):
                break
            try:
                env = dict(zip(_body(op).arguments, [arrays[v] for v in _ins(op)]))
                arrays[op.results[0]] = _evaluate(_yielded(op)[0], env)
            except _NotScalar:
                break
            region = members[:end]
            leaving = [m for m in region if any(u.owner.operation not in region for u in m.results[0].uses)]
            if end < 2 or leaving != [op] or any(u.owner.operation not in region for u in value.uses):
                continue
            step = _matching_epilogue(arrays[op.results[0]])
            if step is not None:
                found = (op, step)
    return found


def _epilogue_chain(result: ir.Value) -> _Chain | None:
    """Elementwise generics after a GEMM (through reshapes that keep the last dim, which an
    elementwise epilogue commutes with), as far as each one is an epilogue step."""
    steps, last, value, kinds, reshapes, pending = [], None, result, set(), [], []
    while True:
        op = _single_use(value)
        region = _elementwise_region(value) if op is None else None
        if region is not None:
            sink, step = region
            steps.append(td.EpilogueStep(step))
            last, value = sink, sink.results[0]
            reshapes += pending
            pending = []
            continue
        if op is not None and op.name in ("tensor.expand_shape", "tensor.collapse_shape") \
                and op.results[0].type.shape[-1] == value.type.shape[-1]:
            pending.append(op)
            value = op.results[0]
            continue
        shape = value.type.shape
        if op is None or op.name != "linalg.generic" or not _all_parallel(op) or len(op.results) != 1 \
                or op.results[0].type != value.type:
            break
        ins, maps = _ins(op), _maps(op)
        if value not in ins or len(ins) > 2 or str(maps[ins.index(value)]) != _identity(len(shape)) \
                or str(maps[-1]) != _identity(len(shape)):
            break
        block = _body(op)
        main = block.arguments[ins.index(value)]
        extra_value = extra_arg = kind = None
        if len(ins) == 2:
            i = 1 - ins.index(value)
            extra_value, extra_arg = ins[i], block.arguments[i]
            last_dim = f"-> (d{len(shape) - 1})"
            if extra_value.type == value.type and str(maps[i]) == _identity(len(shape)):
                kind = "residual_add"
            elif len(extra_value.type.shape) == 1 and str(maps[i]).endswith(last_dim):
                kind = "bias_add"
            else:
                break
            if kind in kinds or (kind == "residual_add"
                                 and any(r.name != "tensor.expand_shape" for r in reshapes + pending)):
                break
        leaves = {main} | ({extra_arg} if extra_arg is not None else set())
        found = _epilogue_steps(_yielded(op)[0], main, extra_arg, leaves)
        if found is None or (kind is not None and _ADD_EXTRA not in found):
            break
        if kind == "residual_add":  # of the GEMM's shape: the expansions after it undone
            for expand in reversed(reshapes + pending):
                with expand.location, ir.InsertionPoint(op):
                    extra_value = tensor.collapse_shape(expand.operands[0].type, extra_value,
                                                        expand.attributes["reassociation"])
        for e in found:
            steps.append(td.EpilogueStep(Epilogue(kind), extra_value) if e == _ADD_EXTRA else td.EpilogueStep(e))
        if kind:
            kinds.add(kind)
        last, value = op, op.results[0]
        reshapes += pending
        pending = []
    return _Chain(steps, last, reshapes) if last is not None else None


def _raise_gemm(op: ir.Operation) -> bool:
    if _maps(op) and [str(m) for m in _maps(op)] != _DEFAULT_MAPS[op.name]:
        return False
    a, b, init = op.operands
    if not _zero_fill(init) or any(str(v.type.element_type) != "f32" for v in (a, b)):
        return False
    if 0 in ir.ShapedType(a.type).shape + ir.ShapedType(b.type).shape:
        return False  # an empty operand (K = 0: a zero result) is no GEMM kernel's job
    transpose_a = transpose_b = False
    if _is_last_two_transpose(_producer(a)):
        a, transpose_a = _producer(a).operands[0], True
    shared = _broadcast_over_batch(_producer(b))
    if shared is not None:
        b = shared
    if _is_last_two_transpose(_producer(b)):
        b, transpose_b = _producer(b).operands[0], True
    chain = _epilogue_chain(op.results[0])
    anchor = chain.last if chain else op
    with op.location, td.located(op.location), ir.InsertionPoint(anchor):
        if chain and chain.steps:
            new = td.fused_gemm(a, b, chain.steps, transpose_a=transpose_a, transpose_b=transpose_b)
        else:
            new = td.gemm(a, b, transpose_a=transpose_a, transpose_b=transpose_b)
        for reshape in chain.reshapes if chain else []:
            copy = reshape.clone()
            copy.operands[0] = new
            new = copy.results[0]
    anchor.results[0].replace_all_uses_with(new)
    return True


def _int_pair(attr) -> tuple[int, int] | None:
    if attr is None:
        return (1, 1)
    values = [int(v) for v in ir.DenseIntElementsAttr(attr)]
    return tuple(values) if len(values) == 2 else None


def _raise_conv(op: ir.Operation) -> bool:
    x, w, init = op.operands
    if any(str(v.type.element_type) != "f32" for v in (x, w)):
        return False
    layout = "nhwc" if op.name == "linalg.conv_2d_nhwc_hwcf" else "nchw"
    spatial, unpadded = ((1, 2), (0, 3)) if layout == "nhwc" else ((2, 3), (0, 1))
    padding = (0, 0, 0, 0)
    pad = _producer(x)
    if pad is not None and pad.name == "tensor.pad":
        low, high = list(pad.attributes["static_low"]), list(pad.attributes["static_high"])
        yielded = _yielded(pad)
        if len(pad.operands) == 1 and all(low[d] == high[d] == 0 for d in unpadded) and min(low + high) >= 0 \
                and len(yielded) == 1 and _float_constant(yielded[0]) == 0.0:
            x = pad.operands[0]
            padding = (low[spatial[0]], high[spatial[0]], low[spatial[1]], high[spatial[1]])
    bias = None
    if not _zero_fill(init):
        fill = _producer(init)
        batch_and_space = [0, *spatial]
        if fill is None or fill.name != "linalg.broadcast" \
                or list(fill.attributes["dimensions"]) != batch_and_space:
            return False
        bias = fill.operands[0]
    stride, dilation = (_int_pair(op.attributes[n] if n in op.attributes else None) for n in ("strides", "dilations"))
    if stride is None or dilation is None:
        return False
    groups = 1
    # the activation after the conv (a chain of steps without operands) is applied before its store
    chain = _epilogue_chain(op.results[0])
    if chain is None or chain.reshapes or any(s.epilogue.takes_operand for s in chain.steps):
        chain = None
    anchor = chain.last if chain else op
    with op.location, td.located(op.location), ir.InsertionPoint(anchor):
        if op.name == "linalg.depthwise_conv_2d_nchw_chw":  # filter [C, KH, KW]: one per channel
            groups, kh, kw = w.type.shape
            w = tensor.expand_shape(ir.RankedTensorType.get([groups, 1, kh, kw], w.type.element_type), w,
                                    [[0, 1], [2], [3]], [], [groups, 1, kh, kw])
        new = td.conv2d(x, w, bias, stride=stride, padding=padding, dilation=dilation, groups=groups,
                        layout=layout, epilogue=chain.steps if chain else ())
    anchor.results[0].replace_all_uses_with(new)
    return True


def _through_expand(value: ir.Value) -> ir.Value:
    op = _producer(value)
    return op.operands[0] if op is not None and op.name == "tensor.expand_shape" else value


def _reduction(value: ir.Value, combine: str) -> tuple[ir.Value, int] | None:
    """(input, axis) if `value` is result #0 of a one-axis reduction whose body combines with `combine`."""
    value = _through_expand(value)
    op = _producer(value)
    if op is None or op.name != "linalg.generic" or len(_ins(op)) != 1 or value != op.results[0]:
        return None
    iterators = [str(a) for a in op.attributes["iterator_types"]]
    reduced = [i for i, it in enumerate(iterators) if "reduction" in it]
    block = _body(op)
    first = _yielded(op)[0]
    combiner = _producer(first)
    if len(reduced) != 1 or combiner is None or combiner.name not in combine.split("|") \
            or set(combiner.operands) != {block.arguments[0], block.arguments[1]}:
        return None
    return _ins(op)[0], reduced[0]


def _elementwise(value: ir.Value, name: str) -> list[ir.Value] | None:
    """Inputs of the elementwise generic producing `value` if its body is the single op `name`
    applied to its block arguments in order."""
    op = _producer(value)
    if op is None or op.name != "linalg.generic" or not _all_parallel(op) or len(op.results) != 1:
        return None
    block = _body(op)
    inner = _producer(_yielded(op)[0])
    ins = _ins(op)
    if inner is None or inner.name != name or list(inner.operands) != list(block.arguments)[:len(ins)]:
        return None
    return ins


def _softmax_of(value: ir.Value) -> tuple[ir.Value, int] | None:
    """(x, axis) when `value` is max-subtract / exp / sum / divide of x along one axis (the max
    may carry an argmax beside it, as torch-mlir's lowering of SDPA writes it)."""
    ratio = _elementwise(value, "arith.divf")
    if ratio is None or len(ratio) != 2:
        return None
    e, total = ratio
    exp_in = _elementwise(e, "math.exp")
    summed = _reduction(total, "arith.addf")
    if exp_in is None or summed is None or summed[0] != e:
        return None
    diff = _elementwise(exp_in[0], "arith.subf")
    if diff is None or len(diff) != 2:
        return None
    x, peak = diff
    maxed = _reduction(peak, "arith.maximumf|arith.maxnumf")
    if maxed is None or maxed[0] != x or maxed[1] != summed[1] or e.type != x.type:
        return None
    if str(ir.ShapedType(x.type).element_type) not in ("f32", "f16", "bf16"):
        return None  # f64: the generic lowering keeps its precision
    return x, maxed[1]


def _raise_softmax(op: ir.Operation) -> bool:
    found = _softmax_of(op.results[0])
    if found is None:
        return False
    with op.location, td.located(op.location), ir.InsertionPoint(op):
        new = td.softmax(found[0], axis=found[1])
    op.results[0].replace_all_uses_with(new)
    return True


def _through_reshapes(value: ir.Value) -> ir.Value:
    op = _producer(value)
    while op is not None and op.name in ("tensor.expand_shape", "tensor.collapse_shape"):
        value = op.operands[0]
        op = _producer(value)
    return value


def _flag(op: ir.Operation, name: str) -> bool:
    return name in op.attributes and ir.BoolAttr(op.attributes[name]).value


def _plain_gemm(op: ir.Operation | None, transpose_b: bool) -> bool:
    return op is not None and op.name == "tracea.gemm" and not _flag(op, "transpose_a") \
        and _flag(op, "transpose_b") == transpose_b


def _scores_gemm(op: ir.Operation | None) -> bool:
    """Q K^T: a plain gemm, K^T given as a value or as the transposed operand."""
    return _plain_gemm(op, transpose_b=False) or _plain_gemm(op, transpose_b=True)


def _unscaled(value: ir.Value) -> tuple[ir.Value, float]:
    """(x, c) when `value` is an elementwise x * c (a constant c), else (value, 1)."""
    op = _producer(value)
    if op is not None and op.name == "linalg.generic" and len(_ins(op)) == 1 and _all_parallel(op) \
            and all(str(m) == _identity(len(value.type.shape)) for m in _maps(op)):
        step = _identify(_yielded(op)[0], _body(op).arguments[0])
        if step is not None and step.kind == "scale":
            return _ins(op)[0], step.value
    return value, 1.0


def _query_of_scores(a: ir.Value) -> tuple[ir.Value, float]:
    """For the left operand of Q K^T: (Q, the constant scale applied to it), through a collapse
    of its batch dims (torch-mlir scales Q and K^T by sqrt(scale) each)."""
    collapse = _producer(a)
    if collapse is None or collapse.name != "tensor.collapse_shape":
        return _unscaled(a)
    query, scale = _unscaled(collapse.operands[0])
    if scale == 1.0:
        return a, 1.0
    return tensor.collapse_shape(a.type, query, collapse.attributes["reassociation"]), scale


def _key_of_scores(b: ir.Value) -> tuple[ir.Value, float] | None:
    """For the right operand of Q K^T, [..., D, Skv]: (K as [..., Skv, D], the constant scale
    applied to it) when it is a last-two-dims transpose, maybe scaled, maybe with its batch dims
    collapsed."""
    collapse = _producer(b)
    if collapse is None or collapse.name != "tensor.collapse_shape":
        collapse = None
    value, scale = _unscaled(b if collapse is None else collapse.operands[0])
    transpose = _producer(value)
    if transpose is None or transpose.name != "linalg.transpose":
        return None
    key = transpose.operands[0]
    # K as [..., Skv, D] is the transpose's input permuted with the last two dims swapped back:
    # itself for a plain K^T, else a transpose of its own (a K read as [B, S, H, D] and permuted
    # in one step, as torch-mlir folds view + transpose + transpose)
    permutation = [int(i) for i in transpose.attributes["permutation"]]
    permutation[-2:] = permutation[:-3:-1]
    if permutation != sorted(permutation):
        shape = [key.type.shape[i] for i in permutation]
        empty = tensor.empty(shape, key.type.element_type)
        key = linalg.transpose(key, outs=[empty], permutation=permutation).results[0]
    if collapse is not None:
        groups = [[int(i) for i in g] for g in collapse.attributes["reassociation"]]
        if groups[-2:] != [[len(key.type.shape) - 2], [len(key.type.shape) - 1]]:
            return None  # the collapse merges a transposed dim
        shape = list(b.type.shape[:-2]) + [b.type.shape[-1], b.type.shape[-2]]
        key = tensor.collapse_shape(ir.RankedTensorType.get(shape, key.type.element_type), key,
                                    collapse.attributes["reassociation"])
    return key, scale


def _is_ninf(value: ir.Value) -> bool:
    """A -inf constant (maybe widened by arith.extf)."""
    op = _producer(value)
    if op is not None and op.name == "arith.extf":
        value = op.operands[0]
    return _float_constant(value) == float("-inf")


def _is_all_ninf_rows(flag: ir.Value, scores: ir.Value) -> bool:
    """Whether `flag` is torch's "row of `scores` is all -inf": an and-reduction over the last
    axis of (scores == -inf)."""
    reduce_op = _producer(flag)
    if reduce_op is None or reduce_op.name != "linalg.generic" or len(_ins(reduce_op)) != 1 \
            or "reduction" not in str(list(reduce_op.attributes["iterator_types"])[-1]):
        return False
    compare = _producer(_ins(reduce_op)[0])
    if compare is None or compare.name != "linalg.generic" or _ins(compare) != [scores]:
        return False
    compares_to_ninf = any(o.operation.name == "arith.cmpf" and any(_is_ninf(v) for v in o.operands)
                           for o in _body(compare).operations)
    ands = any(o.operation.name in ("arith.andi", "arith.minui", "arith.minsi") for o in _body(reduce_op).operations)
    return compares_to_ninf and ands


def _is_zeros(value: ir.Value) -> bool:
    op = _producer(value)
    if op is None or op.name != "arith.constant":
        return False
    attr = op.attributes["value"]
    return isinstance(attr, ir.DenseElementsAttr) and attr.is_splat and float(attr.get_splat_value().value) == 0.0


def _softmax_over_keys(p: ir.Value) -> ir.Operation | None:
    """The tracea.softmax over the last axis that P (the left operand of P V) is, through
    reshapes and torch's safe-softmax select (0 for rows of -inf scores)."""
    value = _through_reshapes(p)
    op = _producer(value)
    flag = None  # of the safe-softmax select, when there is one
    if op is not None and op.name == "linalg.generic" and len(_ins(op)) == 3 and _all_parallel(op):
        flag, zeros, value = _ins(op)
        select = _producer(_yielded(op)[0])
        if select is None or select.name != "arith.select" \
                or list(select.operands)[1:] != list(_body(op).arguments)[1:3] or not _is_zeros(zeros):
            return None
    softmax = _producer(value)
    if softmax is None or softmax.name != "tracea.softmax" \
            or (flag is not None and not _is_all_ninf_rows(flag, softmax.operands[0])):
        return None
    rank = len(value.type.shape)
    # a softmax written with Tracea's API leaves the default axis (-1) out of its attributes
    axis = ir.IntegerAttr(softmax.attributes["axis"]).value if "axis" in softmax.attributes else -1
    return softmax if axis % rank == rank - 1 else None


@dataclass
class _Bias:
    """A bias added to the scores (a padding mask, a static KV cache's unfilled positions, a
    sliding window): `value` read through `amap` over the scores' loops."""
    value: ir.Value
    amap: ir.AffineMap
    scores_shape: list[int]

    def mask(self) -> ir.Value:
        """It as tracea.attention's mask operand, [batch or 1, Sq or 1, Skv]: broadcast over the
        batch dims and the queries only where it varies along them, the batch dims flattened. A
        key length known at run time only is read from the bias."""
        rank = len(self.scores_shape)
        used = {e.position for e in self.amap.results if isinstance(e, ir.AffineDimExpr)}
        per_batch = any(d in used and self.scores_shape[d] > 1 for d in range(rank - 2))
        per_query = rank - 2 in used and self.scores_shape[rank - 2] > 1
        shape = [n if per_batch else 1 for n in self.scores_shape[:-2]] + \
            [self.scores_shape[-2] if per_query else 1, self.scores_shape[-1]]
        f32 = ir.F32Type.get()
        keys = shape[-1]
        if ir.ShapedType.is_dynamic_size(keys):
            position = next(i for i, e in enumerate(self.amap.results)
                            if isinstance(e, ir.AffineDimExpr) and e.position == rank - 1)
            keys = tensor.dim(self.value, arith.constant(ir.IndexType.get(), position))
        out = tensor.empty(shape[:-1] + [keys], f32)
        identity = ir.AffineMap.get_identity(rank)

        @linalg.generic([self.value], [out], [self.amap, identity], [linalg.IteratorType.parallel] * rank)
        def copied(x, _):
            return x

        flat = [math.prod(shape[:-2])] + shape[-2:]
        if rank == 3:
            return copied
        if rank == 2:  # no batch dims: one of size 1
            dynamic = [keys] if isinstance(keys, ir.Value) else []
            return tensor.expand_shape(ir.RankedTensorType.get(flat, f32), copied, [[0, 1], [2]], dynamic, flat)
        return tensor.collapse_shape(ir.RankedTensorType.get(flat, f32), copied,
                                     [list(range(rank - 2)), [rank - 2], [rank - 1]])


def _masked_scores(op: ir.Operation | None) -> tuple[ir.Operation, bool, _Bias | None] | None:
    """(the Q K^T gemm, causal, the mask operand's bias) when `op` adds a bias to its result: a
    constant that masks nothing (all 0) or is torch's causal mask (0 where key j <= query i, else
    -inf), else any f32 bias (the mask operand: a mask of the inputs, a sliding window): how
    torch-mlir lowers SDPA with is_causal, or with an additive or boolean mask."""
    rank = len(op.results[0].type.shape) if op is not None else 0
    for scores, value, bias_map in _bias_adds(op):
        gemm = _producer(_through_reshapes(scores))
        if not _scores_gemm(gemm):
            continue
        bias = _constant_tensor(value)
        if bias is not None and not any(isinstance(e, ir.AffineDimExpr) and e.position < rank - 2
                                        for e in bias_map.results):
            queries, keys = op.results[0].type.shape[-2:]
            # the bias depends on the last two dims only: read it on one (query, key) plane
            plane = _gathered(bias, bias_map, np.indices((1,) * (rank - 2) + (queries, keys))).reshape(queries, keys)
            if np.all(plane == 0):
                return gemm, False, None
            keep = np.tri(queries, keys, dtype=bool)
            if np.all(plane[keep] == 0) and np.all(plane[~keep] == -np.inf):
                return gemm, True, None
        # any other bias (of the inputs, or a constant window or per-head bias): the mask operand
        bias = _mask_bias(op, value, bias_map)
        return None if bias is None else (gemm, False, bias)
    return None


def _bias_adds(op: ir.Operation | None) -> list[tuple[ir.Value, ir.Value, ir.AffineMap]]:
    """(x, b, b's map) for each way `op` may be x + b elementwise with x read whole (its map the
    identity): the scores and a bias added to them."""
    if op is None or op.name != "linalg.generic" or len(_ins(op)) != 2 or not _all_parallel(op):
        return []
    add = _producer(_yielded(op)[0])
    if add is None or add.name != "arith.addf" or set(add.operands) != set(list(_body(op).arguments)[:2]):
        return []
    identity = _identity(len(op.results[0].type.shape))
    return [(_ins(op)[x], _ins(op)[b], _maps(op)[b]) for x, b in ((0, 1), (1, 0)) if str(_maps(op)[x]) == identity]


def _mask_bias(op: ir.Operation, value: ir.Value, bias_map: ir.AffineMap) -> _Bias | None:
    """`value`, added to op's scores through `bias_map`, as the attention's mask: an f32 tensor
    broadcast to them (not read through index arithmetic)."""
    if str(ir.ShapedType(value.type).element_type) != "f32" or not all(
            isinstance(e, (ir.AffineDimExpr, ir.AffineConstantExpr)) for e in bias_map.results):
        return None
    return _Bias(value, bias_map, list(op.results[0].type.shape))


def _residual_scores(op: ir.Operation | None) -> tuple[ir.Operation, bool, _Bias] | None:
    """(the Q K^T fused_gemm, not causal, its residual as the bias) when `op` is a gemm whose one
    epilogue step adds a residual: scores plus a mask of their whole shape (one per batch entry,
    head and query), which the gemm raise took for a residual add."""
    if op is None or op.name != "tracea.fused_gemm" or _flag(op, "transpose_a"):
        return None
    v = view(op)
    residual = list(op.operands)[-1]
    if [e.kind for e in v.attrs["epilogue"]] != ["residual_add"] or "bias" in v.operands \
            or str(ir.ShapedType(residual.type).element_type) != "f32":
        return None
    shape = list(op.results[0].type.shape)
    return op, False, _Bias(residual, ir.AffineMap.get_identity(len(shape)), shape)


def _raise_attention(op: ir.Operation) -> bool:
    """op: tracea.gemm(P, V) where P = softmax(Q K^T [* scale] [+ causal or zero mask])."""
    if not _plain_gemm(op, transpose_b=False):
        return False
    softmax = _softmax_over_keys(op.operands[0])
    if softmax is None:
        return False
    scores = _producer(_through_reshapes(softmax.operands[0]))
    causal, bias = False, None
    if not _scores_gemm(scores):
        masked = _masked_scores(scores) or _residual_scores(scores)
        if masked is None:
            return False
        scores, causal, bias = masked
    value = op.operands[1]
    with op.location, td.located(op.location), ir.InsertionPoint(op):
        # K^T absorbed into the gemm (an unscaled q @ k.transpose(-1, -2)), else K^T's producers
        found = (scores.operands[1], 1.0) if _flag(scores, "transpose_b") else _key_of_scores(scores.operands[1])
        if found is None:
            return False
        key, scale = found
        query, query_scale = _query_of_scores(scores.operands[0])
        scale *= query_scale
        if not (query.type.shape[:-2] == key.type.shape[:-2] == value.type.shape[:-2]):
            return False
        mask = bias.mask() if bias is not None else None
        if mask is not None and mask.type.shape[0] not in (1, math.prod(query.type.shape[:-2])):
            return False  # (the scores' batch dims are not the query's)
        new = td.attention(query, key, value, scale=scale, causal=causal, mask=mask)
    op.results[0].replace_all_uses_with(new)
    return True


def _plain_batch_matmul(op: ir.Operation | None) -> bool:
    """A linalg.batch_matmul with its default maps (no transposed operand) into a zero fill."""
    return op is not None and op.name == "linalg.batch_matmul" and _zero_fill(op.operands[2]) \
        and (not _maps(op) or [str(m) for m in _maps(op)] == _DEFAULT_MAPS["linalg.batch_matmul"])


def _raise_dynamic_attention(op: ir.Operation) -> bool:
    """op: linalg.batch_matmul(P, V) where P = softmax(Q K^T * scale [+ mask]) over a key length
    known at run time only: torch-mlir's lowering of SDPA without mask, dropout or causal (a
    decoding step over a KV cache that grows), or torch_import's decomposition of it with a mask
    (a padded batch's; see torch_import.decomposition_table). The linalg ops stay unraised there
    (tracea's gemm and softmax take static shapes), so this matches them directly."""
    if not _plain_batch_matmul(op):
        return False
    probabilities, value = op.operands[0], op.operands[1]
    found = _softmax_of(_through_reshapes(probabilities))
    if found is None or found[1] != len(found[0].type.shape) - 1:
        return False
    scores, bias, add = found[0], None, _producer(found[0])
    for x, added, bias_map in _bias_adds(add):  # a mask: torch_import's masked SDPA
        if _plain_batch_matmul(_producer(_through_reshapes(_unscaled(_through_reshapes(x))[0]))):
            bias = _mask_bias(add, added, bias_map)
            if bias is None:
                return False
            scores = x
            break
    scores, scale = _unscaled(_through_reshapes(scores))
    product = _producer(_through_reshapes(scores))
    if not _plain_batch_matmul(product):
        return False
    with op.location, td.located(op.location), ir.InsertionPoint(op):
        keyed = _key_of_scores(product.operands[1])
        if keyed is None:
            return False
        key, key_scale = keyed
        query, query_scale = _query_of_scores(product.operands[0])
        mask = bias.mask() if bias is not None else None
        try:  # (a query of dynamic length, say, is not tracea.attention's)
            new = td.attention(query, key, value, scale=scale * key_scale * query_scale, mask=mask)
        except OpError:
            return False
    op.results[0].replace_all_uses_with(new)
    return True


def _erase_dead_ops(block: ir.Block) -> None:
    """What a raise left unused, users before producers. Tracea ops declare no side effects to
    MLIR, so canonicalize would keep them (and the linalg ops feeding them)."""
    for op in reversed(list(block.operations)):
        op = op.operation
        if op.name.startswith(("tracea.", "linalg.", "tensor.", "arith.")) and len(op.results) \
                and all(not list(r.uses) for r in op.results):
            op.erase()


def _static(op: ir.Operation) -> bool:
    return all(ir.ShapedType(v.type).has_static_shape for v in list(op.operands) + list(op.results)
               if isinstance(v.type, ir.ShapedType))


@register
@dataclass(frozen=True)
class RaiseLinalgPass(TraceaPass):
    NAME = "tracea-raise-linalg"
    SUMMARY = ("raise linalg patterns (matmul + elementwise epilogue, padded conv + bias, depthwise conv, "
               "decomposed softmax) into tracea ops so they take the fast kernels")

    def run(self, module: ir.Operation) -> None:
        for func_op in module.regions[0].blocks[0].operations:
            if func_op.operation.name != "func.func" or not func_op.regions[0].blocks:
                continue
            block = func_op.regions[0].blocks[0]
            raised = False
            for op in list(block.operations):
                op = op.operation
                if not _static(op):
                    # tracea ops take static shapes, but attention a dynamic key length
                    raised |= op.name == "linalg.batch_matmul" and _raise_dynamic_attention(op)
                    continue  # the rest keeps the generic lowering
                if op.name in _DEFAULT_MAPS:
                    _raise_gemm(op)
                elif op.name in ("linalg.conv_2d_nchw_fchw", "linalg.conv_2d_nhwc_hwcf",
                                 "linalg.depthwise_conv_2d_nchw_chw"):
                    _raise_conv(op)
                elif op.name == "linalg.generic":
                    _raise_softmax(op)
            for op in list(block.operations):
                if op.operation.name == "tracea.gemm":
                    raised |= _raise_attention(op.operation)
            if raised:
                _erase_dead_ops(block)
