"""The tracea dialect's ops (L2): what each op means and when it is valid.

Each op is described once, by an `OpDef`: its operands, its attributes (with their decoders and
defaults) and `infer`, which checks operand shapes/dtypes and computes the result. The same
`infer` serves the Python builders (raising `OpError` before any IR exists) and the verifier
pass (reporting at the op's location), and the IRDL definition is generated from the operands.
"""
from __future__ import annotations

import math
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable

import mlir.ir as ir

from ..errors import OpError
from .schedule import Schedule, decode_bool, decode_float, decode_ints, decode_int, decode_str

FLOAT_DTYPES = ("f32", "f16", "bf16")
_SIGNED_ARRAY = re.compile(r"array<[su]i\d+")
SEGMENTS = "operandSegmentSizes"
ACCUMULATOR_DTYPE = "f32"


@dataclass(frozen=True)
class TensorSpec:
    """A tensor type: its shape (None for a size known at run time only) and element type name (f32, f16, ...)."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def rank(self) -> int:
        return len(self.shape)

    def __str__(self) -> str:
        return "tensor<" + "".join(f"{'?' if d is None else d}x" for d in self.shape) + self.dtype + ">"

    @property
    def dims(self) -> str:
        """"2x3x?x64": the sizes, `?` for a dynamic one."""
        return "x".join("?" if d is None else str(d) for d in self.shape)

    def to_type(self) -> ir.Type:
        return ir.Type.parse(str(self))

    def check_size(self, what: str) -> "TensorSpec":
        """self, or an OpError when its byte size does not fit a 64-bit size (the compiler's
        index arithmetic would overflow: an input error, not an internal one)."""
        elements = 1
        for d in self.shape:
            elements *= d or 1
        if elements * 8 >= 2 ** 63:
            raise OpError(f"{what} {self} has {elements:.3g} elements: too large for 64-bit sizes")
        return self

    @staticmethod
    def from_type(t: ir.Type, what: str, dynamic: bool = False) -> "TensorSpec":
        if not isinstance(t, ir.RankedTensorType):
            raise OpError(f"{what} must be a ranked tensor, got {t}")
        if not t.has_static_shape and not dynamic:
            raise OpError(f"{what} has a dynamic shape ({t}); tracea ops need static shapes")
        return TensorSpec(tuple(None if t.is_dynamic_dim(i) else d for i, d in enumerate(t.shape)),
                          str(t.element_type)).check_size(what)


# --- epilogues -----------------------------------------------------------------------
@dataclass(frozen=True)
class Epilogue:
    """One step of a fused_gemm epilogue, applied to the f32 accumulator in order.

    `bias_add` (operand of shape [N]) and `residual_add` (operand of the result's shape) each
    consume the next extra operand of the op; `scale` multiplies by `value`; `gelu` takes
    `approximate` = "erf" (exact) or "tanh".
    """

    kind: str
    value: float | None = None
    approximate: str | None = None

    KINDS = ("bias_add", "scale", "relu", "gelu", "sigmoid", "silu", "hardswish", "hardsigmoid", "residual_add")
    OPERAND_KINDS = ("bias_add", "residual_add")

    @property
    def takes_operand(self) -> bool:
        return self.kind in self.OPERAND_KINDS

    def validate(self) -> None:
        if self.kind not in self.KINDS:
            raise OpError(f"unknown epilogue '{self.kind}'; known: {', '.join(self.KINDS)}")
        if self.kind == "scale":
            if self.value is None or not math.isfinite(self.value):
                raise OpError("epilogue 'scale' needs a finite 'value'")
        elif self.value is not None:
            raise OpError(f"epilogue '{self.kind}' takes no 'value'")
        if self.kind == "gelu":
            if self.approximate not in ("erf", "tanh"):
                raise OpError(f"epilogue 'gelu' approximate must be 'erf' or 'tanh', got '{self.approximate}'")
        elif self.approximate is not None:
            raise OpError(f"epilogue '{self.kind}' takes no 'approximate'")

    def to_attr(self) -> ir.Attribute:
        entries = {"kind": ir.StringAttr.get(self.kind)}
        if self.value is not None:
            entries["value"] = ir.FloatAttr.get_f64(float(self.value))
        if self.approximate is not None:
            entries["approximate"] = ir.StringAttr.get(self.approximate)
        return ir.DictAttr.get(entries)

    @staticmethod
    def from_attr(attr: ir.Attribute, index: int) -> "Epilogue":
        where = f"epilogue #{index}"
        if not isinstance(attr, ir.DictAttr):
            raise OpError(f"{where} must be a dictionary like {{kind = \"relu\"}}, got {attr}")
        d = {attr[i].name: attr[i].attr for i in range(len(attr))}
        unknown = set(d) - {"kind", "value", "approximate"}
        if unknown:
            raise OpError(f"{where} has unknown key(s) {', '.join(sorted(unknown))}")
        if "kind" not in d:
            raise OpError(f"{where} needs a 'kind'")
        ep = Epilogue(decode_str(d["kind"], f"{where} kind"),
                      decode_float(d["value"], f"{where} value") if "value" in d else None,
                      decode_str(d["approximate"], f"{where} approximate") if "approximate" in d else None)
        if ep.kind == "gelu" and ep.approximate is None:
            ep = Epilogue("gelu", None, "erf")
        try:
            ep.validate()
        except OpError as e:
            raise OpError(f"{where}: {e}") from None
        return ep


def _decode_epilogue(attr: ir.Attribute, where: str) -> tuple[Epilogue, ...]:
    if not isinstance(attr, ir.ArrayAttr):
        raise OpError(f"{where} must be an array of epilogue dictionaries, got {attr}")
    return tuple(Epilogue.from_attr(a, i) for i, a in enumerate(attr))


def _encode_epilogue(value: tuple[Epilogue, ...]) -> ir.Attribute:
    for ep in value:
        ep.validate()
    return ir.ArrayAttr.get([ep.to_attr() for ep in value])


# --- attribute kinds -------------------------------------------------------------------
@dataclass(frozen=True)
class AttrDef:
    """An op attribute: how to decode it from IR, encode it from Python, and its default."""

    decode: Callable[[ir.Attribute, str], Any]
    encode: Callable[[Any], ir.Attribute]
    default: Any = None
    required: bool = False


def _i64_array(v) -> ir.Attribute:
    return ir.DenseI64ArrayAttr.get([int(x) for x in v])


BOOL = lambda default=False: AttrDef(decode_bool, lambda v: ir.BoolAttr.get(bool(v)), default)  # noqa: E731
INT = lambda default: AttrDef(decode_int, lambda v: ir.IntegerAttr.get(ir.IntegerType.get_signless(64), int(v)), default)  # noqa: E731
INTS = lambda default: AttrDef(lambda a, w: tuple(decode_ints(a, w)), _i64_array, default)  # noqa: E731
FLOAT = lambda default=None: AttrDef(decode_float, lambda v: ir.FloatAttr.get_f64(float(v)), default)  # noqa: E731
STR = lambda default: AttrDef(decode_str, ir.StringAttr.get, default)  # noqa: E731
SCHEDULE = AttrDef(lambda a, w: Schedule.from_attr(a), lambda s: s.to_attr(), None)
EPILOGUE = AttrDef(_decode_epilogue, _encode_epilogue, (), required=True)
ACTIVATION = AttrDef(_decode_epilogue, _encode_epilogue, ())  # epilogue steps without operands


# --- op definitions ----------------------------------------------------------------------
class OpDef(ABC):
    """Base of the op definitions. Subclasses set `name`, `operands`, `attrs`, `infer`."""

    name: str = ""
    # (operand name, "single" | "optional"); with several optionals the op carries IRDL's
    # operandSegmentSizes attribute to say which are present.
    operands: tuple[tuple[str, str], ...] = ()
    attrs: dict[str, AttrDef] = {}
    summary: str = ""
    # operand name -> the dims (negative: from the end) whose size may be known at run time only
    # (`?`); every other dim of every operand and the result is static
    dynamic_dims: dict[str, tuple[int, ...]] = {}

    # -- decoding
    def decode_attrs(self, attributes) -> dict[str, Any]:
        """Decode an op's attributes into Python values, defaults filled in."""
        present = {attributes[i].name: attributes[i].attr for i in range(len(attributes))}
        values: dict[str, Any] = {}
        for key, attr in present.items():
            if key in self.attrs:
                values[key] = self.attrs[key].decode(attr, f"attribute '{key}'")
            elif key != SEGMENTS and "." not in key:  # dialect-prefixed attributes are allowed
                raise OpError(f"unknown attribute '{key}'; {self.name} takes "
                              f"{', '.join(sorted(self.attrs)) or 'none'}")
        for key, spec in self.attrs.items():
            if key not in values:
                if spec.required:
                    raise OpError(f"missing required attribute '{key}'")
                values[key] = spec.default
        return values

    def encode_attrs(self, values: dict[str, Any]) -> dict[str, ir.Attribute]:
        """Encode the non-default attribute values for op creation."""
        out = {}
        for key, value in values.items():
            spec = self.attrs[key]
            if value is None or (not spec.required and value == spec.default):
                continue
            out[key] = spec.encode(value)
        return out

    @property
    def needs_segments(self) -> bool:
        return sum(kind == "optional" for _, kind in self.operands) > 1

    def operand_names(self, count: int, segments: list[int] | None = None) -> list[str]:
        """Names of an op's `count` operands (`segments`: its operandSegmentSizes, if any)."""
        if segments is not None:
            if len(segments) != len(self.operands) or any(s not in (0, 1) for s in segments):
                raise OpError(f"operandSegmentSizes {segments} does not fit operands "
                              f"({', '.join(n for n, _ in self.operands)})")
            names = [name for (name, _), present in zip(self.operands, segments) if present]
        else:
            singles = [n for n, kind in self.operands if kind == "single"]
            names = [n for n, kind in self.operands if kind == "single" or len(singles) < count]
        if len(names) != count:
            raise OpError(f"expected {len(names)} operands ({', '.join(names)}), got {count}")
        return names

    def segment_sizes(self, present: list[str]) -> list[int]:
        return [int(name in present) for name, _ in self.operands]

    @abstractmethod
    def infer(self, operands: dict[str, TensorSpec], attrs: dict[str, Any], result_dtype: str | None) -> TensorSpec:
        """Check the operands and attributes; return the result type (OpError if invalid)."""

    # -- shared checks
    @staticmethod
    def float_operand(spec: TensorSpec, what: str) -> None:
        if spec.dtype not in FLOAT_DTYPES:
            raise OpError(f"{what} has element type {spec.dtype}; expected one of {', '.join(FLOAT_DTYPES)}")
        if 0 in spec.shape:
            raise OpError(f"{what} ({spec}) has a dimension of size 0")

    @staticmethod
    def result_dtype(requested: str | None, input_dtype: str, allowed: tuple[str, ...]) -> str:
        if requested is None:
            return input_dtype
        if requested not in allowed:
            allowed = tuple(dict.fromkeys(allowed))
            raise OpError(f"result element type {requested} is not allowed here; expected "
                          + (f"one of {', '.join(allowed)}" if len(allowed) > 1 else allowed[0]))
        return requested


def _same_dtype(specs: list[TensorSpec], names: list[str]) -> str:
    first = specs[0].dtype
    for spec, name in zip(specs[1:], names[1:]):
        if spec.dtype != first:
            raise OpError(f"operand '{name}' has element type {spec.dtype} but '{names[0]}' has {first}; "
                          "they must match")
    return first


class GemmDef(OpDef):
    name = "tracea.gemm"
    summary = "C = op(A) x op(B): f32/f16/bf16 inputs, f32 accumulation, optional leading batch dims"
    operands = (("a", "single"), ("b", "single"))
    attrs = {"transpose_a": BOOL(), "transpose_b": BOOL(), "schedule": SCHEDULE}

    def infer(self, operands, attrs, result_dtype):
        a, b = operands["a"], operands["b"]
        self.float_operand(a, "operand 'a'")
        self.float_operand(b, "operand 'b'")
        dtype = _same_dtype([a, b], ["a", "b"])
        if a.rank < 2:
            raise OpError(f"operand 'a' must have rank >= 2 ([..., M, K]), got {a}")
        if b.rank not in (2, a.rank):
            raise OpError(f"operand 'b' must have rank 2 (shared across the batch) or the rank of 'a' "
                          f"({a.rank}), got {b}")
        batch = a.shape[:-2]
        if b.rank == a.rank and b.shape[:-2] != batch:
            raise OpError(f"batch dims of 'b' {list(b.shape[:-2])} differ from those of 'a' {list(batch)}")
        m, ka = a.shape[-1:-3:-1] if attrs["transpose_a"] else a.shape[-2:]
        kb, n = b.shape[-1:-3:-1] if attrs["transpose_b"] else b.shape[-2:]
        if ka != kb:
            raise OpError(f"contraction sizes differ: 'a' {a} has K={ka} but 'b' {b} has K={kb}"
                          f" (transpose_a={str(attrs['transpose_a']).lower()}, "
                          f"transpose_b={str(attrs['transpose_b']).lower()})")
        out = self.result_dtype(result_dtype, dtype, (dtype, ACCUMULATOR_DTYPE))
        return TensorSpec(batch + (m, n), out)


class FusedGemmDef(GemmDef):
    name = "tracea.fused_gemm"
    summary = ("gemm followed by an ordered epilogue (bias_add, scale, relu, gelu, sigmoid, silu, hardswish, "
               "hardsigmoid, residual_add)")
    operands = (("a", "single"), ("b", "single"), ("bias", "optional"), ("residual", "optional"))
    attrs = {**GemmDef.attrs, "epilogue": EPILOGUE}

    def infer(self, operands, attrs, result_dtype):
        result = super().infer(operands, attrs, result_dtype)
        for kind, operand, shape in (("bias_add", "bias", result.shape[-1:]), ("residual_add", "residual", result.shape)):
            uses = [i for i, ep in enumerate(attrs["epilogue"]) if ep.kind == kind]
            if len(uses) > 1:
                raise OpError(f"epilogue has {kind} {len(uses)} times (#{', #'.join(map(str, uses))}); "
                              f"it may appear once, adding the '{operand}' operand")
            if uses and operand not in operands:
                raise OpError(f"epilogue #{uses[0]} is {kind} but the op has no '{operand}' operand")
            if operand in operands and not uses:
                raise OpError(f"operand '{operand}' is given but the epilogue has no {kind}")
            if operand in operands:
                self.float_operand(operands[operand], f"operand '{operand}'")
                if operands[operand].shape != shape:
                    raise OpError(f"operand '{operand}' has shape {list(operands[operand].shape)}; "
                                  f"expected {list(shape)}")
        return result


class SoftmaxDef(OpDef):
    name = "tracea.softmax"
    summary = "softmax along one axis, max-subtracted for stability"
    operands = (("input", "single"),)
    attrs = {"axis": INT(-1), "schedule": SCHEDULE}

    def infer(self, operands, attrs, result_dtype):
        x = operands["input"]
        self.float_operand(x, "operand 'input'")
        if x.rank < 1:
            raise OpError("operand 'input' must have rank >= 1")
        axis = attrs["axis"]
        if not -x.rank <= axis < x.rank:
            raise OpError(f"axis {axis} is out of range for rank {x.rank} (expected {-x.rank}..{x.rank - 1})")
        return TensorSpec(x.shape, self.result_dtype(result_dtype, x.dtype, (x.dtype,)))


class Conv2dDef(OpDef):
    name = "tracea.conv2d"
    summary = ("2-D convolution: layout nchw (filter FCHW) or nhwc (filter HWCF); stride, padding "
               "([h, w] or [top, bottom, left, right]), dilation, groups, optional bias [F], then an "
               "optional epilogue of steps without operands (scale, relu, gelu, sigmoid, silu, hardswish, "
               "hardsigmoid) applied before the result is stored")
    operands = (("input", "single"), ("filter", "single"), ("bias", "optional"))
    attrs = {"layout": STR("nchw"), "stride": INTS((1, 1)), "padding": INTS((0, 0)),
             "dilation": INTS((1, 1)), "groups": INT(1), "epilogue": ACTIVATION, "schedule": SCHEDULE}

    @staticmethod
    def pads(attrs) -> tuple[int, int, int, int]:
        """(top, bottom, left, right)."""
        p = attrs["padding"]
        return (p[0], p[0], p[1], p[1]) if len(p) == 2 else tuple(p)

    def infer(self, operands, attrs, result_dtype):
        x, w = operands["input"], operands["filter"]
        self.float_operand(x, "operand 'input'")
        self.float_operand(w, "operand 'filter'")
        dtype = _same_dtype([x, w], ["input", "filter"])
        layout = attrs["layout"]
        if layout not in ("nchw", "nhwc"):
            raise OpError(f"attribute 'layout' must be 'nchw' or 'nhwc', got '{layout}'")
        if x.rank != 4 or w.rank != 4:
            bad, spec = ("input", x) if x.rank != 4 else ("filter", w)
            raise OpError(f"operand '{bad}' must have rank 4, got {spec}")
        for key, n in (("stride", 2), ("dilation", 2)):
            v = attrs[key]
            if len(v) != n or any(s < 1 for s in v):
                raise OpError(f"attribute '{key}' must be 2 positive integers, got {list(v)}")
        if len(attrs["padding"]) not in (2, 4) or any(p < 0 for p in attrs["padding"]):
            raise OpError(f"attribute 'padding' must be [h, w] or [top, bottom, left, right], "
                          f"non-negative; got {list(attrs['padding'])}")
        groups = attrs["groups"]
        if layout == "nchw":
            n, c, h, wd = x.shape
            f, cg, kh, kw = w.shape
        else:
            n, h, wd, c = x.shape
            kh, kw, cg, f = w.shape
        if groups < 1 or c % groups or f % groups:
            raise OpError(f"groups={groups} must be >= 1 and divide both the input channels ({c}) "
                          f"and the filter count ({f})")
        if cg * groups != c:
            raise OpError(f"operand 'filter' {w} has {cg} input channels per group; the input has "
                          f"{c} channels in {groups} group(s), so expected {c // groups} ({layout} "
                          f"uses filter layout {'FCHW' if layout == 'nchw' else 'HWCF'})")
        top, bottom, left, right = self.pads(attrs)
        (sh, sw), (dh, dw) = attrs["stride"], attrs["dilation"]
        oh = (h + top + bottom - dh * (kh - 1) - 1) // sh + 1
        ow = (wd + left + right - dw * (kw - 1) - 1) // sw + 1
        if oh < 1 or ow < 1:
            raise OpError(f"the {kh}x{kw} filter (dilation {dh}x{dw}) does not fit the padded "
                          f"{h + top + bottom}x{wd + left + right} input")
        for i, step in enumerate(attrs["epilogue"]):
            if step.takes_operand:
                raise OpError(f"epilogue #{i} is {step.kind}: a conv2d's epilogue steps take no operands "
                              "(its bias is the 'bias' operand, added first; add a residual after the conv)")
        if "bias" in operands:
            self.float_operand(operands["bias"], "operand 'bias'")
            if operands["bias"].shape != (f,):
                raise OpError(f"operand 'bias' has shape {list(operands['bias'].shape)}; expected [{f}]")
        out = self.result_dtype(result_dtype, dtype, (dtype, ACCUMULATOR_DTYPE))
        shape = (n, f, oh, ow) if layout == "nchw" else (n, oh, ow, f)
        return TensorSpec(shape, out)


class AttentionDef(OpDef):
    name = "tracea.attention"
    summary = ("softmax(scale * Q K^T [+ mask] [causal mask]) V over [..., S, D] operands; scale "
               "defaults to 1/sqrt(D); mask, f32 [B or 1, Sq or 1, Skv], is added to the scores "
               "(-inf masks; a padding mask, a static KV cache's unfilled positions); causal masks key "
               "j > query i (top-left aligned, as torch SDPA); a query whose scores are all -inf gets 0 "
               "(torch's safe softmax)")
    operands = (("query", "single"), ("key", "single"), ("value", "single"), ("mask", "optional"))
    attrs = {"scale": FLOAT(None), "causal": BOOL(), "schedule": SCHEDULE}
    # the key length of a decoding step over a KV cache that grows call by call
    dynamic_dims = {"key": (-2,), "value": (-2,), "mask": (-1,)}

    def infer(self, operands, attrs, result_dtype):
        names = ["query", "key", "value"]
        q, k, v = (operands[n] for n in names)
        for spec, name in zip((q, k, v), names):
            self.float_operand(spec, f"operand '{name}'")
            if spec.rank < 2:
                raise OpError(f"operand '{name}' must have rank >= 2 ([..., S, D]), got {spec}")
        dtype = _same_dtype([q, k, v], names)
        if not (q.rank == k.rank == v.rank):
            raise OpError(f"query, key and value must have the same rank; got {q}, {k}, {v}")
        if k.shape[:-2] != q.shape[:-2] or v.shape[:-2] != q.shape[:-2]:
            raise OpError(f"batch dims differ: query {list(q.shape[:-2])}, key {list(k.shape[:-2])}, "
                          f"value {list(v.shape[:-2])}")
        if k.shape[-1] != q.shape[-1]:
            raise OpError(f"operand 'key' head dim {k.shape[-1]} differs from query's {q.shape[-1]}")
        if v.shape[-2] != k.shape[-2]:
            raise OpError(f"operand 'value' has {v.shape[-2] or '?'} positions but key has {k.shape[-2] or '?'} "
                          "(a length known at run time only must be so in both)")
        mask = operands.get("mask")
        if mask is not None:
            batch = math.prod(q.shape[:-2])
            if mask.dtype != "f32" or mask.rank != 3 or mask.shape[0] not in (1, batch) \
                    or mask.shape[1] not in (1, q.shape[-2]) or mask.shape[2] != k.shape[-2]:
                raise OpError(f"operand 'mask' must be f32 [{batch} or 1, {q.shape[-2]} or 1, "
                              f"{k.shape[-2] or '?'}] (the batch dims flattened), got {mask}")
        scale = attrs["scale"]
        if scale is not None and not math.isfinite(scale):
            raise OpError(f"attribute 'scale' must be finite, got {scale}")
        out = self.result_dtype(result_dtype, dtype, (dtype, ACCUMULATOR_DTYPE))
        return TensorSpec(q.shape[:-1] + (v.shape[-1],), out)

    @staticmethod
    def scale(attrs, head_dim: int) -> float:
        return attrs["scale"] if attrs["scale"] is not None else 1.0 / math.sqrt(head_dim)


OP_DEFS: dict[str, OpDef] = {d.name: d for d in (GemmDef(), FusedGemmDef(), SoftmaxDef(), Conv2dDef(), AttentionDef())}


# --- reading an op in the IR ----------------------------------------------------------------
@dataclass(frozen=True)
class OpView:
    """A verified tracea op, decoded: its definition, operand/result specs and attributes."""

    op: ir.Operation
    opdef: OpDef
    operands: dict[str, TensorSpec]  # by operand name, in operand order; absent optionals left out
    result: TensorSpec
    attrs: dict[str, Any]


def describe(v: OpView) -> str:
    """One line for a plan: the op, its operand and result shapes, its attributes that differ
    from their defaults (the schedule left out)."""
    shape = lambda spec: spec.dims or "scalar"  # noqa: E731
    notes = []
    for key, value in v.attrs.items():
        spec = v.opdef.attrs.get(key)
        if key == "schedule" or value is None or (spec is not None and value == spec.default):
            continue
        if key == "epilogue":  # (with the non-default parameters of a step: a tanh GELU, a scale's value)
            notes.append(" + ".join(step.kind + (f" {step.value:g}" if step.value is not None else "")
                                    + (" tanh" if step.approximate == "tanh" else "") for step in value))
        else:
            notes.append(key if value is True else f"{key} {list(value) if isinstance(value, tuple) else value}")
    text = f"{v.op.name.removeprefix('tracea.')} {', '.join(map(shape, v.operands.values()))} -> {shape(v.result)}"
    return text + (f" ({'; '.join(notes)})" if notes else "")


def view(op: ir.Operation) -> OpView:
    """Decode and verify a tracea op; raises OpError naming the operand or attribute at fault."""
    opdef = OP_DEFS.get(op.name)
    if opdef is None:
        raise OpError(f"'{op.name}' is not an op of the tracea dialect; known: {', '.join(OP_DEFS)}")
    # MLIR's Python bindings abort the process on reading an array of signed or unsigned ints
    # (array<ui8: ...>): refuse them from the op's text before any attribute is read
    odd = _SIGNED_ARRAY.search(op.get_asm(print_generic_op_form=True))
    if odd:
        raise OpError(f"attribute arrays must be of signless integers (array<i64: ...>), got {odd.group(0)}")
    segments = list(ir.DenseI32ArrayAttr(op.attributes[SEGMENTS])) if SEGMENTS in op.attributes else None
    names = opdef.operand_names(len(op.operands), segments)
    specs = {name: operand_spec(opdef, name, v.type) for v, name in zip(op.operands, names)}
    if len(op.results) != 1:
        raise OpError(f"{op.name} has exactly one result, got {len(op.results)}")
    declared = TensorSpec.from_type(op.results[0].type, "the result")
    attrs = opdef.decode_attrs(op.attributes)
    inferred = opdef.infer(specs, attrs, declared.dtype)
    if inferred != declared:
        raise OpError(f"result type {declared} does not match the inferred type {inferred}")
    return OpView(op, opdef, specs, declared, attrs)


def operand_spec(opdef: OpDef, name: str, t: ir.Type) -> TensorSpec:
    """An operand's spec, `?` allowed only in the dims its op declares dynamic."""
    spec = TensorSpec.from_type(t, f"operand '{name}'", dynamic=True)
    allowed = {d % spec.rank for d in opdef.dynamic_dims.get(name, ())}
    if any(size is None and d not in allowed for d, size in enumerate(spec.shape)):
        where = (f"only dims {sorted(d - spec.rank for d in allowed)} of '{name}' may be dynamic" if allowed
                 else "tracea ops need static shapes")
        raise OpError(f"operand '{name}' has a dynamic shape ({t}); {where}")
    return spec


def irdl_source() -> str:
    """The IRDL definition of the dialect, generated from the op definitions."""
    lines = ["irdl.dialect @tracea {"]
    for opdef in OP_DEFS.values():
        lines.append(f"  irdl.operation @{opdef.name.split('.', 1)[1]} {{")
        # One constraint value per operand: a shared value would force equal types.
        names = [n for n, _ in opdef.operands] + ["result"]
        for n in names:
            lines.append(f'    %{n} = irdl.base "!builtin.tensor"')
        ops = ", ".join(f"{n}: {'' if k == 'single' else k + ' '}%{n}" for n, k in opdef.operands)
        lines.append(f"    irdl.operands({ops})")
        lines.append("    irdl.results(result: %result)")
        lines.append("  }")
    lines.append("}")
    return "\n".join(lines)
