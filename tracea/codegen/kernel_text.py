"""A small writer of MLIR text for kernel functions on tensors (linalg, tensor, arith, math).

Lowerings describe an op as a private function written with this writer; the lowering pass
parses it, calls it in place of the op and lets the inliner dissolve it. Text keeps each
lowering readable as the IR it produces.
"""
from __future__ import annotations

from typing import Callable, Sequence

from ..dialects.ops import ACCUMULATOR_DTYPE, Epilogue, TensorSpec
from ..errors import OpError

FASTMATH = "fastmath<contract>"  # lets LLVM fuse multiply-add into FMA


def affine_map(n_dims: int, results: Sequence[str]) -> str:
    dims = ", ".join(f"d{i}" for i in range(n_dims))
    return f"affine_map<({dims}) -> ({', '.join(results)})>"


def float_literal(value: float) -> str:
    if value == float("-inf"):
        return "0xFF800000"  # f32 -inf bit pattern
    return repr(float(value))


class Body:
    """Scalar (or, with `lanes`, vector<lanes x ...>) arithmetic on named SSA values; methods
    append ops and return the new value's name. The same code writes a linalg.generic body and
    a register-level epilogue, so every strategy computes an op the same way."""

    def __init__(self, args: list[str], arg_dtypes: list[str], lanes: int | None = None, prefix: str = "%v",
                 location: str = " loc(#src)"):
        self.args = args
        self.dtypes = dict(zip(args, arg_dtypes))
        self.lanes = lanes
        self.lines: list[str] = []
        self._prefix = prefix
        self._location = location
        self._n = 0

    def type(self, dtype: str) -> str:
        return f"vector<{self.lanes}x{dtype}>" if self.lanes and dtype not in ("index", "i1") else dtype

    def _new(self, dtype: str, text: str) -> str:
        name = f"{self._prefix}{self._n}"
        self._n += 1
        self.lines.append(f"{name} = {text}{self._location}")
        self.dtypes[name] = dtype
        return name

    def to_f32(self, x: str) -> str:
        dtype = self.dtypes[x]
        if dtype == ACCUMULATOR_DTYPE:
            return x
        return self._new(ACCUMULATOR_DTYPE, f"arith.extf {x} : {self.type(dtype)} to {self.type('f32')}")

    def cast(self, x: str, dtype: str) -> str:
        if self.dtypes[x] == dtype:
            return x
        if dtype == ACCUMULATOR_DTYPE:
            return self.to_f32(x)
        return self._new(dtype, f"arith.truncf {x} : {self.type(self.dtypes[x])} to {self.type(dtype)}")

    def const(self, value: float) -> str:
        if self.lanes:
            return self._new("f32", f"arith.constant dense<{float_literal(value)}> : {self.type('f32')}")
        return self._new("f32", f"arith.constant {float_literal(value)} : f32")

    def binary(self, op: str, x: str, y: str) -> str:
        fm = f" {FASTMATH}" if op in ("mulf", "addf", "subf") else ""
        return self._new("f32", f"arith.{op} {x}, {y}{fm} : {self.type('f32')}")

    def mul(self, x, y):
        return self.binary("mulf", x, y)

    def add(self, x, y):
        return self.binary("addf", x, y)

    def sub(self, x, y):
        return self.binary("subf", x, y)

    def div(self, x, y):
        return self.binary("divf", x, y)

    def max(self, x, y):
        return self.binary("maximumf", x, y)

    def op(self, text: str, hint: str = "") -> str:
        """Any op, written in full (its result is treated as f32 by later steps)."""
        return self._new("f32", text)

    def unary(self, fn: str, x: str) -> str:
        if self.lanes and fn in ("exp", "tanh", "erf"):  # LLVM would call libm once per lane
            return getattr(self, f"_vector_{fn}")(x)
        return self._new("f32", f"math.{fn} {x} : {self.type('f32')}")

    def _vector_exp(self, x: str) -> str:
        return vector_exp(self, x, self.type("f32"), f"vector<{self.lanes}xi32>")

    def _vector_tanh(self, x: str) -> str:
        # tanh x = (e - 1) / (e + 1), e = exp(2x); |x| <= 9 keeps e finite and tanh(9) = 1 in f32
        x = self.binary("minimumf", self.binary("maximumf", x, self.const(-9.0)), self.const(9.0))
        e = self._vector_exp(self.add(x, x))
        return self.div(self.sub(e, self.const(1.0)), self.add(e, self.const(1.0)))

    def _vector_erf(self, x: str) -> str:
        # Abramowitz & Stegun 7.1.26: erf |x| = 1 - poly(t) exp(-x^2), t = 1 / (1 + p |x|)
        ax = self.unary("absf", x)
        t = self.div(self.const(1.0), self.add(self.const(1.0), self.mul(self.const(0.3275911), ax)))
        poly = self.const(1.061405429)
        for c in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
            poly = self.add(self.mul(poly, t), self.const(c))
        poly = self.mul(poly, t)
        magnitude = self.sub(self.const(1.0), self.mul(poly, self._vector_exp(self.neg(self.mul(ax, ax)))))
        return self._new("f32", f"math.copysign {magnitude}, {x} : {self.type('f32')}")

    def neg(self, x: str) -> str:
        return self._new("f32", f"arith.negf {x} : {self.type('f32')}")

    def index(self, dim: int) -> str:
        return self._new("index", f"linalg.index {dim} : index")

    def cmp_index(self, pred: str, x: str, y: str) -> str:
        return self._new("i1", f"arith.cmpi {pred}, {x}, {y} : index")

    def select(self, cond: str, x: str, y: str) -> str:
        return self._new("f32", f"arith.select {cond}, {x}, {y} : f32")


def constant_text(value, type_: str) -> str:
    """An arith.constant of `value` as `type_`: every lane of a vector type, or a scalar."""
    return f"arith.constant {'dense<' + repr(value) + '>' if type_.startswith('vector') else repr(value)} : {type_}"


def vector_exp(t, x: str, vt: str, it: str, at_most_zero: bool = False) -> str:
    """exp(x) on an f32 vector or scalar (Cephes expf: x = n ln2 + r, exp(r) by a degree-6 polynomial,
    2^n from exponent bits, in two factors so that results near f32's largest and subnormal ones
    come out right); above 88.72 the largest finite exp, below -104 (exp(-inf) too) 0. `t` is any writer
    with op(text, hint) -> SSA name. at_most_zero: the caller knows x <= 0 (a softmax's x - max),
    which saves the clamp at the top of the range."""
    def const(value: float) -> str:
        return t.op(constant_text(value, vt), "k")

    if not at_most_zero:  # the whole range: 2^n in two factors, so n may reach 128 (and -150)
        x = t.op(f"arith.minimumf {x}, {const(88.72283935546875)} : {vt}", "e")
        x = t.op(f"arith.maximumf {x}, {const(-104.0)} : {vt}", "e")
    else:
        x = t.op(f"arith.maximumf {x}, {const(-88.0)} : {vt}", "e")
    y = t.op(f"math.fma {x}, {const(1.4426950408889634)}, {const(0.5)} : {vt}", "e")
    if vt.startswith("vector"):
        n = t.op(f"math.floor {y} : {vt}", "e")
    else:  # GPU kernels: floor without a device-library call (ROCm's would be __ocml_floor_f32)
        truncated = t.op(f"arith.sitofp {t.op(f'arith.fptosi {y} : {vt} to {it}', 'e')} : {it} to {vt}", "e")
        below = t.op(f"arith.cmpf olt, {y}, {truncated} : {vt}", "e")
        n = t.op(f"arith.subf {truncated}, {t.op(f'arith.select {below}, {const(1.0)}, {const(0.0)} : {vt}', 'e')} "
                 f": {vt}", "e")
    r = t.op(f"math.fma {n}, {const(-0.693359375)}, {x} : {vt}", "e")
    r = t.op(f"math.fma {n}, {const(2.12194440e-4)}, {r} : {vt}", "e")
    y = const(1.9875691500e-4)
    for c in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
        y = t.op(f"math.fma {y}, {r}, {const(c)} : {vt}", "e")
    r2 = t.op(f"arith.mulf {r}, {r} : {vt}", "e")
    y = t.op(f"math.fma {y}, {r2}, {r} : {vt}", "e")
    y = t.op(f"arith.addf {y}, {const(1.0)} : {vt}", "e")
    ni = t.op(f"arith.fptosi {n} : {vt} to {it}", "e")

    def power_of_two(k: str) -> str:
        bits = t.op(f"arith.addi {k}, {t.op(constant_text(127, it), 'k')} : {it}", "e")
        bits = t.op(f"arith.shli {bits}, {t.op(constant_text(23, it), 'k')} : {it}", "e")
        return t.op(f"arith.bitcast {bits} : {it} to {vt}", "e")

    if at_most_zero:  # n in [-127, 0]: 2^-127 is 0 as bits, and so is the result
        return t.op(f"arith.mulf {y}, {power_of_two(ni)} : {vt}", "e")
    half = t.op(f"arith.shrsi {ni}, {t.op(constant_text(1, it), 'k')} : {it}", "e")
    rest = t.op(f"arith.subi {ni}, {half} : {it}", "e")
    y = t.op(f"arith.mulf {y}, {power_of_two(half)} : {vt}", "e")
    return t.op(f"arith.mulf {y}, {power_of_two(rest)} : {vt}", "e")


class KernelWriter:
    """Writes one `func.func private` on tensors; methods append ops and return SSA names."""

    def __init__(self, name: str, args: dict[str, TensorSpec], result: TensorSpec):
        self.name = name
        self.args = [f"%arg{i}" for i in range(len(args))]
        self.arg = dict(zip(args, self.args))  # operand name -> SSA name
        self.arg_specs = list(args.values())
        self.result = result
        self.types: dict[str, TensorSpec] = dict(zip(self.args, self.arg_specs))
        self.lines: list[str] = []
        self._n = 0

    def _new(self, spec: TensorSpec | None, text: str) -> str:
        name = f"%t{self._n}"
        self._n += 1
        self.lines.append(f"{name} = {text} loc(#src)")
        if spec is not None:
            self.types[name] = spec
        return name

    def ty(self, value: str) -> str:
        return str(self.types[value])

    def emit(self, result: TensorSpec, text: str) -> str:
        """Any op producing one tensor, written in full (e.g. a tracea op for a later pass)."""
        return self._new(result, text)

    def transpose(self, value: str, permutation: Sequence[int]) -> str:
        src = self.types[value]
        out = self.empty([src.shape[p] for p in permutation], src.dtype)
        return self._new(self.types[out], f"linalg.transpose ins({value} : {src}) outs({out} : {self.ty(out)}) "
                                          f"permutation = [{', '.join(map(str, permutation))}]")

    def filled(self, shape: Sequence[int | None], value: float, dtype: str = ACCUMULATOR_DTYPE,
               sizes: Sequence[str] = ()) -> str:
        """A new tensor filled with `value` (the init of a reduction); `sizes` as `empty`'s."""
        empty = self.empty(shape, dtype, sizes)
        spec = self.types[empty]
        cst = self._new(None, f"arith.constant {float_literal(value)} : {dtype}")
        return self._new(spec, f"linalg.fill ins({cst} : {dtype}) outs({empty} : {spec}) -> {spec}")

    def empty(self, shape: Sequence[int | None], dtype: str, sizes: Sequence[str] = ()) -> str:
        """A new tensor; `sizes`: the index values of its None (dynamic) dims, in order."""
        spec = TensorSpec(tuple(shape), dtype)
        return self._new(spec, f"tensor.empty({', '.join(sizes)}) : {spec}")

    def dim(self, value: str, axis: int) -> str:
        """The size of `value`'s dim `axis` at run time (an index)."""
        index = self._new(None, f"arith.constant {axis} : index")
        return self._new(None, f"tensor.dim {value}, {index} : {self.ty(value)}")

    def dynamic_sizes(self, like: str) -> list[str]:
        """The run-time sizes of `like`'s dynamic dims: `sizes` for a tensor of its shape."""
        return [self.dim(like, i) for i, d in enumerate(self.types[like].shape) if d is None]

    def generic(self, ins: list[tuple[str, list[str]]], out: tuple[str, list[str]], n_dims: int,
                reductions: Sequence[int], body: Callable[[Body], str]) -> str:
        """linalg.generic over `n_dims` loops; each operand comes with its index expressions
        in terms of d0..d{n-1}; `body` receives the block arguments and returns the yield."""
        maps = [affine_map(n_dims, idx) for _, idx in ins] + [affine_map(n_dims, out[1])]
        iters = ", ".join('"reduction"' if d in reductions else '"parallel"' for d in range(n_dims))
        in_names = [v for v, _ in ins]
        out_name = out[0]
        block_args = [f"%in{i}" for i in range(len(ins))] + ["%out"]
        dtypes = [self.types[v].dtype for v in in_names] + [self.types[out_name].dtype]
        b = Body(block_args, dtypes)
        result = b.cast(body(b), self.types[out_name].dtype)
        sig = ", ".join(f"{a}: {t}" for a, t in zip(block_args, dtypes))
        ins_text = ""
        if in_names:
            ins_text = f"ins({', '.join(in_names)} : {', '.join(self.ty(v) for v in in_names)}) "
        spec = self.types[out_name]
        text = (f"linalg.generic {{indexing_maps = [{', '.join(maps)}], iterator_types = [{iters}]}} "
                f"{ins_text}outs({out_name} : {spec}) {{\n"
                f"    ^bb0({sig}):\n"
                + "".join(f"      {line}\n" for line in b.lines)
                + f"      linalg.yield {result} : {spec.dtype}\n"
                f"    }} -> {spec}")
        return self._new(spec, text)

    def pad(self, value: str, low: Sequence[int], high: Sequence[int]) -> str:
        """Zero-pad a tensor (no-op when all pads are 0)."""
        if not any(low) and not any(high):
            return value
        src = self.types[value]
        shape = tuple(s + lo + hi for s, lo, hi in zip(src.shape, low, high))
        spec = TensorSpec(shape, src.dtype)
        zero = self._new(None, f"arith.constant 0.0 : {src.dtype}")
        idx = ", ".join("%i" + str(i) + ": index" for i in range(src.rank))
        lows = ", ".join(str(x) for x in low)
        highs = ", ".join(str(x) for x in high)
        return self._new(spec, f"tensor.pad {value} low[{lows}] high[{highs}] {{\n"
                               f"    ^bb0({idx}):\n      tensor.yield {zero} : {src.dtype}\n"
                               f"    }} : {src} to {spec}")

    def reshape(self, value: str, groups: list[list[int]], shape: Sequence[int]) -> str:
        """tensor.expand_shape or collapse_shape (whichever direction `shape` goes)."""
        src = self.types[value]
        spec = TensorSpec(tuple(shape), src.dtype)
        if spec.shape == src.shape:
            return value
        assoc = "[" + ", ".join("[" + ", ".join(map(str, g)) + "]" for g in groups) + "]"
        if len(shape) > src.rank:
            out_shape = ", ".join(map(str, shape))
            return self._new(spec, f"tensor.expand_shape {value} {assoc} output_shape [{out_shape}] "
                                   f": {src} into {spec}")
        return self._new(spec, f"tensor.collapse_shape {value} {assoc} : {src} into {spec}")

    def text(self, result: str, location: str = "loc(unknown)") -> str:
        """The function; every op it creates carries `location` (the op it implements)."""
        params = ", ".join(f"{a}: {s}" for a, s in zip(self.args, self.arg_specs))
        body = "".join(f"  {line}\n" for line in self.lines)
        return (f"#src = {location}\n"
                f"func.func private @{self.name}({params}) -> {self.result} {{\n{body}"
                f"  return {result} : {self.result}\n}}\n")


def apply_epilogue(b: Body, x: str, ep: Epilogue, operand: str | None) -> str:
    """One epilogue step on an f32 value (shared by every strategy that fuses epilogues)."""
    if ep.kind in ("bias_add", "residual_add"):
        return b.add(x, b.to_f32(operand))
    if ep.kind == "scale":
        return b.mul(x, b.const(ep.value))
    if ep.kind == "relu":
        return b.max(x, b.const(0.0))
    if ep.kind == "sigmoid":
        return _sigmoid(b, x)
    if ep.kind == "silu":
        return b.mul(x, _sigmoid(b, x))
    if ep.kind in ("hardswish", "hardsigmoid"):  # torch's: relu6(x + 3) / 6, times x for hardswish
        gate = b.mul(b.binary("minimumf", b.max(b.add(x, b.const(3.0)), b.const(0.0)), b.const(6.0)),
                     b.const(1 / 6))
        return b.mul(x, gate) if ep.kind == "hardswish" else gate
    if ep.kind == "gelu" and ep.approximate == "tanh":
        # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        inner = b.mul(b.const(0.7978845608028654), b.add(x, b.mul(b.const(0.044715), b.mul(x, b.mul(x, x)))))
        return b.mul(b.mul(b.const(0.5), x), b.add(b.const(1.0), b.unary("tanh", inner)))
    if ep.kind == "gelu":
        # 0.5 x (1 + erf(x / sqrt(2)))
        erf = b.unary("erf", b.mul(x, b.const(0.7071067811865476)))
        return b.mul(b.mul(b.const(0.5), x), b.add(b.const(1.0), erf))
    raise OpError(f"no lowering for epilogue '{ep.kind}'")


def fused_epilogue(value: str, steps, operands: dict[str, tuple[str, str]], out_dtype: str,
                   lanes: int | None, prefix: str) -> tuple[list[str], str]:
    """A fused_gemm epilogue on an f32 accumulator (scalar, or `lanes`-vector), then the cast to
    `out_dtype`. `operands` maps "bias_add" / "residual_add" to the (value, dtype) already loaded
    for this position. Returns the lines to emit and the result."""
    body = Body([value] + [name for name, _ in operands.values()],
                ["f32"] + [dtype for _, dtype in operands.values()], lanes, prefix=prefix, location="")
    x = value
    for ep in steps:
        x = apply_epilogue(body, x, ep, operands[ep.kind][0] if ep.takes_operand else None)
    return body.lines, body.cast(x, out_dtype)


def _sigmoid(b: Body, x: str) -> str:
    return b.div(b.const(1.0), b.add(b.const(1.0), b.unary("exp", b.neg(x))))
