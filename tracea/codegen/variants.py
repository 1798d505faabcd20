"""The kernel variant registry: every kernel Tracea can emit, declared once beside its code, with
the ops it implements, the constraints a problem and a device must meet, and a priority.

A `Problem` is what the constraints read: the op, its dtypes and whatever else is known (shapes,
attributes; None where not known, as when planning without shapes: a constraint on an unknown
fact passes, and the decision lists it as a condition). A `Constraint` answers why it rejects,
or None. The decision engine (tracea/doctor/engine.py) keeps the variants whose constraints all pass and takes
the highest priority.
"""
from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from ..doctor.capabilities import Capabilities

OPS = ("gemm", "fused_gemm", "conv2d", "attention", "softmax")
DTYPES = ("f32", "f16", "bf16")


@dataclass(frozen=True)
class Problem:
    op: str  # one of OPS
    dtype: str  # the inputs'
    out_dtype: str | None = None
    dtypes: tuple[str, ...] | None = None  # every operand's and the result's
    # gemm / fused_gemm: m x n results of a k-long product, `batch` of them (batched_b: B has
    # batch dims too, else one B for all)
    m: int | None = None
    n: int | None = None
    k: int | None = None
    transpose_a: bool | None = None
    transpose_b: bool | None = None
    batched_b: bool | None = None
    batch: int | None = None
    # attention
    head_dim: int | None = None
    value_head_dim: int | None = None
    # conv2d
    layout: str | None = None
    groups: int | None = None
    depthwise: bool | None = None  # one filter per input channel (groups = channels = filters)
    # softmax: along the last (contiguous) axis
    last_axis: bool | None = None
    dynamic: bool | None = None  # some operand size is known at run time only (attention's key length)
    masked: bool | None = None  # attention with a mask operand
    schedule: Any = None  # the op's own schedule (dialects.schedule.Schedule), if it has one
    view: Any = field(default=None, compare=False)  # the op (dialects.ops.OpView), when planned from IR

    def describe(self) -> str:
        """"attention (f16, head_dim 40, value_head_dim 40)": the op and what is known of it."""
        facts = [f"{name} {value}" for name, value in self.__dict__.items()
                 if value is not None and name not in ("op", "dtype", "dtypes", "schedule", "view")
                 and not (name == "out_dtype" and value == self.dtype)]
        return f"{self.op} ({', '.join([self.dtype] + facts)})"

    @staticmethod
    def from_view(v) -> "Problem":
        """The problem a tracea op (dialects.ops.OpView) poses."""
        kind = v.op.name.removeprefix("tracea.")
        first = next(iter(v.operands.values()))
        base = dict(op=kind, dtype=first.dtype, out_dtype=v.result.dtype, schedule=v.attrs.get("schedule"), view=v,
                    dynamic=any(None in x.shape for x in v.operands.values() if x is not None) or None,
                    dtypes=tuple(x.dtype for x in v.operands.values() if x is not None) + (v.result.dtype,))
        if kind in ("gemm", "fused_gemm"):
            a, b = v.operands["a"], v.operands["b"]
            ta, tb = v.attrs["transpose_a"], v.attrs["transpose_b"]
            m, n = v.result.shape[-2:]
            return Problem(**base, m=m, n=n, k=a.shape[-2] if ta else a.shape[-1], transpose_a=ta, transpose_b=tb,
                           batched_b=b.rank > 2, batch=math.prod(v.result.shape[:-2]))
        if kind == "attention":
            return Problem(**base, head_dim=v.operands["query"].shape[-1], value_head_dim=v.operands["value"].shape[-1],
                           masked="mask" in v.operands or None)
        if kind == "conv2d":
            axis = 1 if v.attrs["layout"] == "nchw" else 3  # of the channels
            channels, filters = v.operands["input"].shape[axis], v.result.shape[axis]
            return Problem(**base, layout=v.attrs["layout"], groups=v.attrs["groups"],
                           depthwise=v.attrs["groups"] == channels == filters)
        if kind == "softmax":
            return Problem(**base, last_axis=v.attrs["axis"] % v.result.rank == v.result.rank - 1)
        raise ValueError(f"no kernel variants for {v.op.name}")


# -- constraints ---------------------------------------------------------------------------

class Constraint:
    """check(problem, caps): None if met (or not decidable from what is known), else why not."""

    def check(self, problem: Problem, caps: Capabilities) -> str | None:
        raise NotImplementedError

    def unknown(self, problem: Problem, caps: Capabilities) -> bool:
        """Whether the problem leaves this constraint undecided (planning without shapes)."""
        return False


@dataclass(frozen=True)
class BackendIs(Constraint):
    backend: str

    def check(self, problem, caps):
        return None if caps.backend == self.backend else f"backend is {caps.backend}, not {self.backend}"

    def __str__(self):
        return f"backend is {self.backend}"


@dataclass(frozen=True)
class ArchIs(Constraint):
    """An architecture-specific feature set (sm_90a: wgmma, TMA): that exact GPU."""
    arch: str

    def check(self, problem, caps):
        arch = caps.gpu.arch if caps.gpu else caps.backend
        return None if arch == self.arch else f"architecture is {arch}, not {self.arch}"

    def __str__(self):
        return f"architecture is {self.arch}"


@dataclass(frozen=True)
class SmAtLeast(Constraint):
    compute_capability: int

    def check(self, problem, caps):
        cc = caps.gpu.compute_capability if caps.gpu else 0
        return None if cc >= self.compute_capability else f"compute capability {cc} < {self.compute_capability}"

    def __str__(self):
        return f"SM at least {self.compute_capability}"


@dataclass(frozen=True)
class WarpSizeIs(Constraint):
    size: int

    def check(self, problem, caps):
        size = caps.gpu.warp_size if caps.gpu else 1
        return None if size == self.size else f"warp / wavefront size is {size}, not {self.size}"

    def __str__(self):
        return f"warp size {self.size}"


@dataclass(frozen=True)
class SimdWidthAtLeast(Constraint):
    bits: int

    def check(self, problem, caps):
        bits = caps.cpu.simd_bits if caps.cpu else 0
        return None if bits >= self.bits else f"SIMD width {bits} bits < {self.bits}"

    def __str__(self):
        return f"SIMD width at least {self.bits} bits"


@dataclass(frozen=True)
class SharedMemoryAtLeast(Constraint):
    bytes: int

    def check(self, problem, caps):
        have = caps.gpu.shared_bytes_per_block if caps.gpu else 0
        return None if have >= self.bytes else f"{have // 1024} KiB shared memory per block < {self.bytes // 1024} KiB"

    def __str__(self):
        return f"shared memory per block at least {self.bytes // 1024} KiB"


@dataclass(frozen=True)
class DtypeIn(Constraint):
    dtypes: tuple[str, ...]

    def check(self, problem, caps):
        return None if problem.dtype in self.dtypes else f"inputs are {problem.dtype}, not {' / '.join(self.dtypes)}"

    def __str__(self):
        return f"inputs {' / '.join(self.dtypes)}"


@dataclass(frozen=True)
class Rule(Constraint):
    """A rule on the problem's shapes or attributes: `holds(problem, caps)` is True, False, or
    None when the facts it reads are unknown."""
    text: str  # as the rejection and the docs say it: "k % 8 == 0"
    holds: Callable[[Problem, Capabilities], bool | None] = field(compare=False)
    # a requirement passes while undecided (listed as a condition); a preference (a heuristic
    # such as "few rows") does not, and a variant written on the op by hand overrides it
    preference: bool = False

    def check(self, problem, caps):
        holds = self.holds(problem, caps)
        return None if holds or (holds is None and not self.preference) else f"needs {self.text}"

    def unknown(self, problem, caps):
        return self.holds(problem, caps) is None and not self.preference

    def __str__(self):
        return self.text


def known(*values) -> bool:
    return all(v is not None for v in values)


# -- variants ------------------------------------------------------------------------------

# what the backend support matrix lists (docs/BACKENDS.md)
FEATURES = {"matrix_units": "Tensor/Matrix Cores", "async_copy": "Async Copy", "pipelined": "Pipelined GEMM",
            "simd": "SIMD Optimization", "autotune": "Auto-Tuning"}


@dataclass(frozen=True)
class Variant:
    id: str  # backend.op.kind: "cuda.gemm.wgmma"
    backend: str
    ops: tuple[str, ...]
    constraints: tuple[Constraint, ...]
    priority: int  # the highest-priority variant that fits is chosen
    summary: str
    features: frozenset[str] = frozenset()  # keys of FEATURES
    # hooks (None where a variant has none): default_schedule(problem, caps, threads) -> the
    # schedule it will run: its default, or the problem's own with what that leaves out filled
    # in (None: it follows shapes the problem does not give); search_space(problem, caps) ->
    # a tuner.SearchSpace of the schedules to try; check_schedule(problem, caps, schedule) raises OpError
    # naming what is wrong
    default_schedule: Callable | None = field(default=None, compare=False)
    search_space: Callable | None = field(default=None, compare=False)
    check_schedule: Callable | None = field(default=None, compare=False)
    dynamic: bool = False  # computes problems whose sizes are known at run time only
    masks: bool = False  # takes attention's mask operand

    def rejects(self, problem: Problem, caps: Capabilities, preferences: bool = True) -> str | None:
        """Why this variant cannot compute `problem` on `caps` (or, with `preferences`, should
        not be chosen for it), or None."""
        if problem.op not in self.ops:
            return f"implements {', '.join(self.ops)}, not {problem.op}"
        if problem.dynamic and not self.dynamic:
            return "needs static shapes (a size here is known at run time only)"
        if problem.masked and not self.masks:
            return "takes no attention mask"
        for constraint in self.constraints:
            if not preferences and getattr(constraint, "preference", False):
                continue
            why = constraint.check(problem, caps)
            if why:
                return why
        return None

    def conditions(self, problem: Problem, caps: Capabilities) -> list[str]:
        """Constraints the problem leaves undecided (the shapes they read are not given)."""
        return [str(c) for c in self.constraints if c.unknown(problem, caps)]


_REGISTRY: dict[str, Variant] = {}


def register_variant(variant: Variant) -> Variant:
    if variant.id in _REGISTRY and _REGISTRY[variant.id] != variant:
        raise ValueError(f"kernel variant {variant.id} is declared twice")
    _REGISTRY[variant.id] = variant
    return variant


def variants(backend: str | None = None) -> list[Variant]:
    """Every registered variant (of one backend), highest priority first."""
    importlib.import_module("tracea.targets")  # each backend registers its variants when imported
    found = [v for v in _REGISTRY.values() if backend is None or v.backend == backend]
    return sorted(found, key=lambda v: -v.priority)


def variant(variant_id: str) -> Variant:
    variants()
    if variant_id not in _REGISTRY:
        raise ValueError(f"unknown kernel variant {variant_id!r}; known: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[variant_id]
