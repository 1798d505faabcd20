"""Building programs of tracea ops from Python, without writing IR text.

    from tracea import dialects as td

    @td.function(td.tensor((128, 256)), td.tensor((256, 512)), td.tensor((512,)))
    def mlp(x, w, b):
        return td.fused_gemm(x, w, [td.bias_add(b), td.gelu()])

    print(mlp)                  # the MLIR module
    kernel = tracea.compile(mlp)  # then kernel(x, w, b) on numpy arrays

Every builder checks its operands with the op's own rules and raises OpError at the call, naming
the operand at fault; the op records the Python call site as its location.
"""
from __future__ import annotations

import contextlib
import inspect
import numbers
import os
import re
import threading
from dataclasses import dataclass
from typing import Callable, Sequence

import mlir.ir as ir
from mlir.dialects import func

from ..errors import OpError
from ..runtime.dtypes import ELEMENT_TYPES
from .context import make_context
from .ops import OP_DEFS, SEGMENTS, Epilogue, TensorSpec, operand_spec
from .schedule import Schedule


def tensor(shape: Sequence[int] | int, dtype: str = "f32") -> TensorSpec:
    """A tensor type for function inputs: `tensor((M, K))`, `tensor((M, K), "bf16")`; None for a size
    known at run time only (`tensor((B, H, None, D))`: a KV cache of any length), where the ops
    reading it allow one."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if not all(s is None or isinstance(s, numbers.Integral) and not isinstance(s, bool) for s in shape):
        raise OpError(f"tensor shape {list(shape)}: sizes must be whole numbers of elements (None: dynamic)")
    shape = tuple(None if s is None else int(s) for s in shape)
    if any(s is not None and s < 1 for s in shape):
        raise OpError(f"tensor shape {list(shape)} must have positive sizes")
    if dtype not in ELEMENT_TYPES:
        raise OpError(f"tensor element type {dtype!r} is not one Tracea compiles; use one of {', '.join(ELEMENT_TYPES)}")
    return TensorSpec(shape, dtype).check_size("tensor")


# --- epilogue steps ---------------------------------------------------------------------------
@dataclass(frozen=True)
class EpilogueStep:
    epilogue: Epilogue
    operand: ir.Value | None = None


def bias_add(bias: ir.Value) -> EpilogueStep:
    """Add a bias of shape [N] to every row."""
    return EpilogueStep(Epilogue("bias_add"), bias)


def residual_add(residual: ir.Value) -> EpilogueStep:
    """Add a tensor of the result's shape."""
    return EpilogueStep(Epilogue("residual_add"), residual)


def scale(value: float) -> EpilogueStep:
    return EpilogueStep(Epilogue("scale", float(value)))


def relu() -> EpilogueStep:
    return EpilogueStep(Epilogue("relu"))


def gelu(approximate: str = "erf") -> EpilogueStep:
    """GELU, exact ("erf") or the tanh approximation ("tanh")."""
    return EpilogueStep(Epilogue("gelu", approximate=approximate))


def sigmoid() -> EpilogueStep:
    return EpilogueStep(Epilogue("sigmoid"))


def silu() -> EpilogueStep:
    return EpilogueStep(Epilogue("silu"))


def hardswish() -> EpilogueStep:
    """x * relu6(x + 3) / 6 (MobileNetV3's activation)."""
    return EpilogueStep(Epilogue("hardswish"))


def hardsigmoid() -> EpilogueStep:
    """relu6(x + 3) / 6."""
    return EpilogueStep(Epilogue("hardsigmoid"))


# --- op builders ---------------------------------------------------------------------------------
_LIBRARY_DIRS = (os.path.dirname(os.path.dirname(__file__)), os.path.dirname(ir.__file__))


_located = threading.local()


@contextlib.contextmanager
def located(loc: ir.Location):
    """Ops built inside take `loc` (a pass raising existing IR keeps the source's locations)."""
    previous = getattr(_located, "loc", None)
    _located.loc = loc
    try:
        yield
    finally:
        _located.loc = previous


def _call_site() -> ir.Location:
    """The location of the user's call (the first frame outside Tracea and the MLIR bindings)."""
    if getattr(_located, "loc", None) is not None:
        return _located.loc
    frame = inspect.currentframe()
    while frame is not None and frame.f_code.co_filename.startswith(_LIBRARY_DIRS):
        frame = frame.f_back
    if frame is None:
        return ir.Location.unknown()
    return ir.Location.file(frame.f_code.co_filename, frame.f_lineno, 1)


def _create(name: str, operands: dict[str, ir.Value | None], attrs: dict, out_dtype: str | None) -> ir.Value:
    opdef = OP_DEFS[name]
    operands = {k: v for k, v in operands.items() if v is not None}
    for operand_name, value in operands.items():
        if not isinstance(value, ir.Value):
            raise OpError(f"{name}: operand '{operand_name}' must be a value built in a tracea function "
                          f"(an argument or an op result), got {type(value).__name__}")
    try:
        specs = {n: operand_spec(opdef, n, v.type) for n, v in operands.items()}
        values = {**{k: d.default for k, d in opdef.attrs.items()}, **attrs}
        result = opdef.infer(specs, values, out_dtype)
        encoded = opdef.encode_attrs(attrs)
    except OpError as e:
        raise OpError(f"{name}: {e}") from None
    if opdef.needs_segments:
        encoded[SEGMENTS] = ir.DenseI32ArrayAttr.get(opdef.segment_sizes(list(operands)))
    op = ir.Operation.create(name, results=[result.to_type()], operands=list(operands.values()),
                             attributes=encoded, loc=_call_site())
    return op.result


def _schedule(schedule: Schedule | None) -> dict:
    if schedule is None:
        return {}
    schedule.validate()
    return {"schedule": schedule}


def gemm(a: ir.Value, b: ir.Value, *, transpose_a: bool = False, transpose_b: bool = False,
         out_dtype: str | None = None, schedule: Schedule | None = None) -> ir.Value:
    """C = op(A) x op(B) with f32 accumulation; `out_dtype` f32 or the inputs' type (default)."""
    return _create("tracea.gemm", {"a": a, "b": b}, {"transpose_a": transpose_a, "transpose_b": transpose_b,
                                           **_schedule(schedule)}, out_dtype)


def fused_gemm(a: ir.Value, b: ir.Value, epilogue: Sequence[EpilogueStep], *, transpose_a: bool = False,
               transpose_b: bool = False, out_dtype: str | None = None,
               schedule: Schedule | None = None) -> ir.Value:
    """gemm followed by `epilogue` steps, in order, on the f32 accumulator."""
    steps = list(epilogue)
    for i, step in enumerate(steps):
        if not isinstance(step, EpilogueStep):
            raise OpError(f"tracea.fused_gemm: epilogue #{i} must be built with bias_add(), relu(), gelu(), ...; "
                          f"got {step!r}")
        try:
            step.epilogue.validate()
        except OpError as e:
            raise OpError(f"tracea.fused_gemm: epilogue #{i}: {e}") from None
    operands = {"a": a, "b": b}
    for s in steps:
        if s.epilogue.takes_operand:
            key = "bias" if s.epilogue.kind == "bias_add" else "residual"
            if key in operands:
                raise OpError(f"tracea.fused_gemm: the epilogue may have one {s.epilogue.kind}")
            operands[key] = s.operand
    attrs = {"transpose_a": transpose_a, "transpose_b": transpose_b,
             "epilogue": tuple(s.epilogue for s in steps), **_schedule(schedule)}
    return _create("tracea.fused_gemm", operands, attrs, out_dtype)


def softmax(x: ir.Value, axis: int = -1, *, schedule: Schedule | None = None) -> ir.Value:
    return _create("tracea.softmax", {"input": x}, {"axis": axis, **_schedule(schedule)}, None)


def _pair(value, name: str) -> tuple[int, ...]:
    if isinstance(value, int):
        return (value, value)
    value = tuple(int(v) for v in value)
    if len(value) not in (2, 4) or (len(value) == 4 and name != "padding"):
        raise OpError(f"tracea.conv2d: {name} must be an int or a pair"
                      + (" (or top, bottom, left, right)" if name == "padding" else "") + f", got {value}")
    return value


def conv2d(x: ir.Value, w: ir.Value, bias: ir.Value | None = None, *, stride=1, padding=0, dilation=1,
           groups: int = 1, layout: str = "nchw", epilogue: Sequence[EpilogueStep] = (),
           out_dtype: str | None = None, schedule: Schedule | None = None) -> ir.Value:
    """2-D convolution; `layout` "nchw" (filter FCHW) or "nhwc" (filter HWCF); `epilogue`: steps
    without operands (relu(), hardswish(), ...) applied after the bias, before the store."""
    steps = list(epilogue)
    if not all(isinstance(s, EpilogueStep) for s in steps):
        raise OpError(f"tracea.conv2d: epilogue steps are built with relu(), hardswish(), ...; got {steps!r}")
    attrs = {"layout": layout, "stride": _pair(stride, "stride"), "padding": _pair(padding, "padding"),
             "dilation": _pair(dilation, "dilation"), "groups": groups,
             "epilogue": tuple(s.epilogue for s in steps), **_schedule(schedule)}
    return _create("tracea.conv2d", {"input": x, "filter": w, "bias": bias}, attrs, out_dtype)


def attention(q: ir.Value, k: ir.Value, v: ir.Value, *, scale: float | None = None, causal: bool = False,
              mask: ir.Value | None = None, out_dtype: str | None = None, schedule: Schedule | None = None) -> ir.Value:
    """softmax(scale * Q K^T [+ mask]) V over [..., S, D]; scale defaults to 1/sqrt(D); `mask`, f32
    [B or 1, Sq or 1, Skv] with B the batch dims' product, is added to the scores (-inf masks)."""
    attrs = {"scale": None if scale is None else float(scale), "causal": causal, **_schedule(schedule)}
    return _create("tracea.attention", {"query": q, "key": k, "value": v, "mask": mask}, attrs, out_dtype)


# --- functions -----------------------------------------------------------------------------------
def _argument_names(body: Callable, count: int) -> list[str]:
    """One name per input: the body's parameter names, `rest0, rest1...` for a `*rest`, `argN`
    for inputs a **kwargs body leaves unnamed."""
    names: list[str] = []
    for p in inspect.signature(body).parameters.values():
        if p.kind == p.VAR_POSITIONAL:
            names += [f"{p.name}{i}" for i in range(count - len(names))]
        elif p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
    return (names + [f"arg{i}" for i in range(len(names), count)])[:count]


class Function:
    """A module holding one public function of tracea ops, built by calling `body`."""

    def __init__(self, name: str, inputs: Sequence[TensorSpec], body: Callable):
        self.name = _symbol_name(name)
        self.inputs = list(inputs)
        self.arg_names = _argument_names(body, len(self.inputs))
        self.context = make_context()
        with self.context, _call_site_or_unknown(body):
            self.module = ir.Module.create()
            with ir.InsertionPoint(self.module.body):
                types = [s.to_type() for s in self.inputs]
                results = self._build(types, body)
            self.outputs = [TensorSpec.from_type(r.type, "result") for r in results]

    def _build(self, types, body):
        holder = []

        @func.func(*types, name=self.name)
        def _fn(*args):
            out = body(*args)
            out = list(out) if isinstance(out, (tuple, list)) else [out]
            for i, value in enumerate(out):
                if not isinstance(value, ir.Value):
                    raise OpError(f"@{self.name}: result #{i} must be a value built in the function, "
                                  f"got {type(value).__name__}")
            holder.extend(out)
            return out

        return holder

    def __str__(self) -> str:
        return str(self.module)

    def text(self) -> str:
        """The module as text with locations, the form compile() and tracea-opt consume."""
        return self.module.operation.get_asm(enable_debug_info=True)


def _symbol_name(name: str) -> str:
    """A valid MLIR symbol from a Python name ("<lambda>" -> "lambda")."""
    cleaned = re.sub(r"[^A-Za-z0-9_]", "", name) or "kernel"
    return cleaned if not cleaned[0].isdigit() else "_" + cleaned


def _call_site_or_unknown(body: Callable) -> ir.Location:
    code = getattr(body, "__code__", None)
    if code is None:
        return ir.Location.unknown()
    return ir.Location.file(code.co_filename, code.co_firstlineno, 1)


def function(*inputs: TensorSpec, name: str | None = None) -> Callable[[Callable], Function]:
    """Decorator: build a Function whose arguments have the given tensor types."""
    for i, spec in enumerate(inputs):
        if not isinstance(spec, TensorSpec):
            raise OpError(f"input #{i} of @function must be tracea.dialects.tensor(shape, dtype), got {spec!r}")

    def build(body: Callable) -> Function:
        return Function(name or body.__name__, inputs, body)

    return build
