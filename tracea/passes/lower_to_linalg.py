"""tracea-lower-to-linalg: every tracea op becomes linalg/tensor/arith/math on tensors.

`reference` is the straightforward linalg.generic form of each op: what every target can run as
loops, and the ground truth the tests compare fast kernels with. Target kernels come from their
own passes run before this one (tracea-cpu-kernels on the CPU); ops they leave are lowered here.
Another linalg form of an op would register in `STRATEGIES` under its own name.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import mlir.ir as ir

from ..dialects.ops import ACCUMULATOR_DTYPE, AttentionDef, Conv2dDef, Epilogue, OpView, TensorSpec, view
from ..dialects.verify import tracea_ops
from ..errors import OpError, TraceaError
from ..codegen.conv_gather import conv_epilogue
from ..codegen.kernel_text import Body, KernelWriter, apply_epilogue
from .registry import PassFailed, TraceaPass, option, register

Lowering = Callable[[KernelWriter, OpView], str]
STRATEGIES: dict[str, dict[str, Lowering]] = {"reference": {}}


def lowering(op_name: str, strategy: str = "reference"):
    def add(fn: Lowering) -> Lowering:
        STRATEGIES.setdefault(strategy, {})[op_name] = fn
        return fn
    return add


def multiply_accumulate(b: Body) -> str:
    """acc + x * y in f32: the body of every contraction."""
    return b.add(b.args[2], b.mul(b.to_f32(b.args[0]), b.to_f32(b.args[1])))


def _dims(n: int, start: int = 0) -> list[str]:
    return [f"d{i}" for i in range(start, start + n)]


# --- epilogue: f32 accumulator -> (epilogue ops) -> result dtype -------------------------
def finish(w: KernelWriter, acc: str, result: TensorSpec, epilogue: tuple[Epilogue, ...] = (),
           operands: dict[str, tuple[str, list[str]]] | None = None) -> str:
    """Apply `epilogue` to an f32 accumulator and cast to the result type; `operands` maps
    bias_add / residual_add to (tensor, its index expressions over the result dims)."""
    operands = operands or {}
    if not epilogue and result.dtype == ACCUMULATOR_DTYPE:
        return acc
    dims = _dims(result.rank)
    out = w.empty(result.shape, result.dtype)

    kinds = list(operands)

    def body(b: Body) -> str:
        x = b.args[0]
        for ep in epilogue:
            x = apply_epilogue(b, x, ep, b.args[1 + kinds.index(ep.kind)] if ep.takes_operand else None)
        return x

    return w.generic([(acc, dims)] + list(operands.values()), (out, dims), result.rank, (), body)


# --- gemm / fused_gemm ----------------------------------------------------------------------------
@lowering("tracea.gemm")
@lowering("tracea.fused_gemm")
def gemm_reference(w: KernelWriter, v: OpView) -> str:
    a, b = v.operands["a"], v.operands["b"]
    nb = a.rank - 2
    batch = _dims(nb)
    m, n, k = f"d{nb}", f"d{nb + 1}", f"d{nb + 2}"
    a_idx = batch + ([k, m] if v.attrs["transpose_a"] else [m, k])
    b_idx = (batch if b.rank == a.rank else []) + ([n, k] if v.attrs["transpose_b"] else [k, n])
    acc = w.filled(v.result.shape, 0.0)
    acc = w.generic([(w.arg["a"], a_idx), (w.arg["b"], b_idx)], (acc, batch + [m, n]), nb + 3, (nb + 2,),
                    multiply_accumulate)
    epilogue = v.attrs.get("epilogue", ())
    result_dims = _dims(v.result.rank)
    operands = {}
    if "bias" in w.arg:
        operands["bias_add"] = (w.arg["bias"], result_dims[-1:])
    if "residual" in w.arg:
        operands["residual_add"] = (w.arg["residual"], result_dims)
    return finish(w, acc, v.result, epilogue, operands)


# --- softmax ---------------------------------------------------------------------------------------
def softmax(w: KernelWriter, x: str, axis: int, dtype: str, safe: bool = False) -> str:
    """Numerically stable softmax of tensor `x` along `axis` (three passes: max, sum, normalize).
    safe: a row of -inf gives 0, not NaN (attention's rows with every key masked, as torch)."""
    spec = w.types[x]
    dims = _dims(spec.rank)
    reduced = [d for i, d in enumerate(dims) if i != axis]
    reduced_shape = [s for i, s in enumerate(spec.shape) if i != axis]
    mx = w.filled(reduced_shape, float("-inf"))
    mx = w.generic([(x, dims)], (mx, reduced), spec.rank, (axis,),
                   lambda b: b.max(b.to_f32(b.args[0]), b.args[1]))
    total = w.filled(reduced_shape, 0.0)
    total = w.generic([(x, dims), (mx, reduced)], (total, reduced), spec.rank, (axis,),
                      lambda b: b.add(b.args[2], b.unary("exp", b.sub(b.to_f32(b.args[0]), b.args[1]))))
    out = w.empty(spec.shape, dtype, w.dynamic_sizes(x))

    def normalize(b: Body) -> str:
        p = b.div(b.unary("exp", b.sub(b.to_f32(b.args[0]), b.args[1])), b.args[2])
        if safe:  # the sum of a row of -inf is NaN (exp(-inf - -inf)), of anything else >= 1
            p = b.select(b.op(f"arith.cmpf ogt, {b.args[2]}, {b.const(0.0)} : f32"), p, b.const(0.0))
        return p

    return w.generic([(x, dims), (mx, reduced), (total, reduced)], (out, dims), spec.rank, (), normalize)


@lowering("tracea.softmax")
def softmax_reference(w: KernelWriter, v: OpView) -> str:
    x = v.operands["input"]
    return softmax(w, w.arg["input"], v.attrs["axis"] % x.rank, v.result.dtype)


# --- attention ---------------------------------------------------------------------------------------
@lowering("tracea.attention")
def attention_reference(w: KernelWriter, v: OpView) -> str:
    q, k = v.operands["query"], v.operands["key"]
    nb = q.rank - 2
    batch = _dims(nb)
    i, j, d = f"d{nb}", f"d{nb + 1}", f"d{nb + 2}"
    sq, skv = q.shape[-2], k.shape[-2]
    sizes = w.dynamic_sizes(w.arg["key"])  # the key length, when known at run time only
    scores = w.filled(q.shape[:-2] + (sq, skv), 0.0, sizes=sizes)
    scores = w.generic([(w.arg["query"], batch + [i, d]), (w.arg["key"], batch + [j, d])], (scores, batch + [i, j]),
                       nb + 3, (nb + 2,),
                       multiply_accumulate)
    scale = AttentionDef.scale(v.attrs, q.shape[-1])
    causal = v.attrs["causal"]

    def scale_and_mask(b: Body) -> str:
        s = b.mul(b.args[0], b.const(scale))
        if "mask" in v.operands:
            s = b.add(s, b.args[1])
        if causal:  # key j is visible to query i when j <= i (torch's is_causal=True)
            masked = b.cmp_index("ugt", b.index(nb + 1), b.index(nb))
            s = b.select(masked, b.const(float("-inf")), s)
        return s

    logits = w.generic([(scores, batch + [i, j]), *_mask_operand(w, v)],
                       (w.empty(q.shape[:-2] + (sq, skv), ACCUMULATOR_DTYPE, sizes),
                                                     batch + [i, j]), nb + 2, (), scale_and_mask)
    probs = softmax(w, logits, nb + 1, ACCUMULATOR_DTYPE, safe=True)
    e = f"d{nb + 1}"
    jj = f"d{nb + 2}"
    out = w.filled(v.result.shape, 0.0)
    out = w.generic([(probs, batch + [i, jj]), (w.arg["value"], batch + [jj, e])], (out, batch + [i, e]),
                    nb + 3, (nb + 2,),
                    multiply_accumulate)
    return finish(w, out, v.result)


def _mask_operand(w: KernelWriter, v: OpView) -> list[tuple[str, list[str]]]:
    """Attention's mask [B or 1, Sq or 1, Skv] as an input of the score loops (the batch dims,
    then query i, key j): none without one; a per-batch mask unflattened to the batch dims."""
    mask = v.operands.get("mask")
    if mask is None:
        return []
    q = v.operands["query"]
    nb = q.rank - 2
    value, (per_batch, per_query, _) = w.arg["mask"], mask.shape
    batch = ["0"] if per_batch == 1 else _dims(nb)
    if per_batch > 1 and nb != 1:  # [B*H, ...] -> [B, H, ...] (rank 2: no batch dims, per_batch is 1)
        spec = TensorSpec(q.shape[:-2] + mask.shape[1:], mask.dtype)
        sizes = w.dynamic_sizes(value)
        groups = f"[{', '.join(map(str, range(nb)))}], [{nb}], [{nb + 1}]"
        shape = ", ".join(str(d) for d in spec.shape[:-1]) + f", {sizes[0] if sizes else spec.shape[-1]}"
        value = w.emit(spec, f"tensor.expand_shape {value} [{groups}] output_shape [{shape}] : {mask} into {spec}")
    return [(value, batch + [f"d{nb}" if per_query > 1 else "0", f"d{nb + 1}"])]


# --- conv2d -----------------------------------------------------------------------------------------
def _window(out_dim: str, k_dim: str, stride: int, dilation: int) -> str:
    return f"{out_dim}{f' * {stride}' if stride != 1 else ''} + {k_dim}{f' * {dilation}' if dilation != 1 else ''}"


def windowed_input(w: KernelWriter, x: str, spatial: tuple[int, int], pads: tuple[int, int, int, int],
                    needed: tuple[int, int]) -> str:
    """The input zero-padded (or cut) to exactly `needed` rows and columns, what the windows read.

    The padding asked for can leave rows and columns no window reaches (a stride that steps
    over the end, more padding than the filter needs). Read through `o * s + k * d`, such an
    operand is valid linalg, but when the output or filter extent is 1, linalg-fold-unit-extent-dims
    simplifies that expression to a plain loop index and the op becomes invalid (the operand's
    extent no longer equals the loop's): a verifier error, or, when later passes of the stage
    tile it before the stage is verified, loops over the padded extent that read past the
    filter (wrong results). So the windows cover the operand exactly."""
    src = w.types[x]
    low, high, used = [0] * src.rank, [0] * src.rank, list(src.shape)
    for axis, before, extent in zip(spatial, pads[0::2], needed):
        low[axis] = min(before, extent)
        used[axis] = min(src.shape[axis], extent - low[axis])
        high[axis] = extent - low[axis] - used[axis]
    if 0 in used:  # every window lies in the padding
        return w.filled([lo + u + hi for lo, u, hi in zip(low, used, high)], 0.0, src.dtype)
    if tuple(used) != src.shape:
        spec = TensorSpec(tuple(used), src.dtype)
        ones = ", ".join(["1"] * src.rank)
        x = w.emit(spec, f"tensor.extract_slice {x}[{', '.join(['0'] * src.rank)}] [{', '.join(map(str, used))}] "
                         f"[{ones}] : {src} to {spec}")
    return w.pad(x, low, high)


@lowering("tracea.conv2d")
def conv2d_reference(w: KernelWriter, v: OpView) -> str:
    x, f = v.operands["input"], v.operands["filter"]
    groups = v.attrs["groups"]
    (sh, sw), (dh, dw) = v.attrs["stride"], v.attrs["dilation"]
    pads = Conv2dDef.pads(v.attrs)
    nchw = v.attrs["layout"] == "nchw"
    oh, ow = v.result.shape[2:] if nchw else v.result.shape[1:3]
    kh, kw = f.shape[2:] if nchw else f.shape[:2]
    needed = ((oh - 1) * sh + (kh - 1) * dh + 1, (ow - 1) * sw + (kw - 1) * dw + 1)
    padded = windowed_input(w, w.arg["input"], (2, 3) if nchw else (1, 2), pads, needed)
    hp, wp = needed
    if nchw:
        n, c, _, _ = x.shape
        nf, cg = f.shape[:2]
        xin = w.reshape(padded, [[0], [1, 2], [3], [4]], (n, groups, cg, hp, wp))
        flt = w.reshape(w.arg["filter"], [[0, 1], [2], [3], [4]], (groups, nf // groups, cg, kh, kw))
        # loops: d0 n, d1 g, d2 f, d3 oh, d4 ow | d5 c, d6 kh, d7 kw
        acc = w.filled((n, groups, nf // groups, oh, ow), 0.0)
        x_idx = ["d0", "d1", "d5", _window("d3", "d6", sh, dh), _window("d4", "d7", sw, dw)]
        acc = w.generic([(xin, x_idx), (flt, ["d1", "d2", "d5", "d6", "d7"])], (acc, _dims(5)), 8, (5, 6, 7),
                        multiply_accumulate)
        acc = w.reshape(acc, [[0], [1, 2], [3], [4]], (n, nf, oh, ow))
        channel = "d1"
    else:
        n, _, _, c = x.shape
        cg, nf = f.shape[2:]
        xin = w.reshape(padded, [[0], [1], [2], [3, 4]], (n, hp, wp, groups, cg))
        flt = w.reshape(w.arg["filter"], [[0], [1], [2], [3, 4]], (kh, kw, cg, groups, nf // groups))
        # loops: d0 n, d1 oh, d2 ow, d3 g, d4 f | d5 kh, d6 kw, d7 c
        acc = w.filled((n, oh, ow, groups, nf // groups), 0.0)
        x_idx = ["d0", _window("d1", "d5", sh, dh), _window("d2", "d6", sw, dw), "d3", "d7"]
        acc = w.generic([(xin, x_idx), (flt, ["d5", "d6", "d7", "d3", "d4"])], (acc, _dims(5)), 8, (5, 6, 7),
                        multiply_accumulate)
        acc = w.reshape(acc, [[0], [1], [2], [3, 4]], (n, oh, ow, nf))
        channel = "d3"
    operands = {"bias_add": (w.arg["bias"], [channel])} if "bias" in w.arg else {}
    return finish(w, acc, v.result, conv_epilogue(v), operands)


# --- the passes -----------------------------------------------------------------------------------
@register
@dataclass(frozen=True)
class VerifyPass(TraceaPass):
    NAME = "tracea-verify"
    SUMMARY = "check every tracea op's operand shapes/dtypes, attributes and schedule"

    def run(self, module: ir.Operation) -> None:
        from ..dialects.verify import verify_tracea_ops
        if verify_tracea_ops(module):
            raise PassFailed()


@register
@dataclass(frozen=True)
class LowerToLinalgPass(TraceaPass):
    NAME = "tracea-lower-to-linalg"
    SUMMARY = "replace tracea ops by linalg/tensor/arith/math ops on tensors"
    strategy: str = option("reference", "how each op is written in linalg",
                           choices=tuple(STRATEGIES))

    def run(self, module: ir.Operation) -> None:
        failed = False
        lowerings = {**STRATEGIES["reference"], **STRATEGIES.get(self.strategy, {})}
        for index, op in enumerate(tracea_ops(module)):
            try:
                v = view(op)
            except OpError as e:
                op.location.emit_error(f"'{op.name}' op {e}")
                failed = True
                continue
            name = f"__tracea_{op.name.split('.')[1]}_{index}"
            writer = KernelWriter(name, v.operands, v.result)
            text = writer.text(lowerings[op.name](writer, v), str(op.location))
            inline_kernel(op, text)
        if failed:
            raise PassFailed()


def inline_kernel(op: ir.Operation, kernel_text: str) -> None:
    """Replace `op` by the body of the single function in `kernel_text` (parsed in op's context)."""
    try:
        kernel_module = ir.Module.parse(kernel_text, op.context)
    except ir.MLIRError as e:
        raise TraceaError(f"internal error: the lowering of {op.name} produced invalid IR: {e}\n"
                          f"{kernel_text}") from None
    func_op = kernel_module.body.operations[0]
    block = func_op.regions[0].blocks[0]
    for arg, operand in zip(block.arguments, op.operands):
        arg.replace_all_uses_with(operand)
    ops = list(block.operations)
    # A kernel reads its tensor inputs through memrefs from bufferization.to_buffer; bufferization
    # takes the tensor as read there, not where the memref is read. CSE would merge two kernels'
    # to_buffer of one tensor into the first, and a later op could then overwrite that tensor's
    # buffer in place before the second kernel read it (ResNet-50's bottleneck: two 1x1 convs of
    # one input, a ReLU between them written into the input's buffer: 6 % off at batch 8). Naming
    # the reader keeps each to_buffer where its kernel is.
    reader = ir.StringAttr.get(ir.StringAttr(func_op.attributes["sym_name"]).value, op.context)
    for inner in ops:
        if inner.operation.name == "bufferization.to_buffer":
            inner.operation.attributes["tracea.reader"] = reader
    terminator = ops[-1]
    with op.location:
        for inner in ops[:-1]:
            inner.move_before(op)
    op.results[0].replace_all_uses_with(terminator.operands[0])
    op.erase()
