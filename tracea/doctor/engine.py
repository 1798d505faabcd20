"""The decision engine: which registered variant computes a problem on a device, with what
schedule, and why every other one was rejected; and `Context`, the seeds' entry point
(`tracea.Context().plan_kernel("flash_attention_2", precision="BF16")`)."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import TraceaError
from .capabilities import Capabilities, host, named, probe_nvidia, probe_vulkan
from ..codegen.variants import DTYPES, OPS, Problem, Variant, variants


class PlanError(TraceaError, ValueError):
    """No variant can compute the problem, or the request names no known kernel or precision."""


@dataclass(frozen=True)
class Decision:
    variant_id: str
    backend: str
    device: str  # the capabilities' name: "host", "sm_90a", "cuda:0"
    schedule: Any  # dialects.schedule.Schedule, or None: the op's own, or chosen from its shapes when compiling
    summary: str
    conditions: tuple[str, ...] = ()  # constraints the problem left undecided (shapes not given)
    rejected: tuple[tuple[str, str], ...] = ()  # (variant id, why), highest priority first
    ranking: tuple[str, ...] = field(default=())  # the variants that fit, best first

    def describe(self) -> str:
        lines = [f"{self.variant_id} on {self.backend} ({self.device}): {self.summary}"]
        if self.schedule is not None:
            lines.append(f"  schedule: {self.schedule.as_dict()}")
        lines += [f"  if {c}" for c in self.conditions]
        lines += [f"  not {v}: {why}" for v, why in self.rejected]
        return "\n".join(lines)


def plan(problem: Problem, caps: Capabilities, threads: int | None = None, tuned: bool = True) -> Decision:
    """The highest-priority variant whose constraints `problem` and `caps` meet, its schedule
    (the problem's own; else, when `tuned`, the tuning cache's for this op and device; else
    the variant's default), and every rejection with its reason. A schedule that gives only
    `threads` asks for the rest as if it had none."""
    own = problem.schedule
    if own is not None and own.threads and replace(own, threads=0) == type(own)():
        decision = plan(replace(problem, schedule=None), caps, threads, tuned)
        return replace(decision, schedule=replace(decision.schedule or own, threads=own.threads))
    rejected, fitting = [], []
    for v in variants(caps.backend):
        why = v.rejects(problem, caps)
        if why is None:
            fitting.append(v)
        elif problem.op in v.ops:
            rejected.append((v.id, why))
    if not fitting:
        reasons = "; ".join(f"{v}: {why}" for v, why in rejected) or f"no {caps.backend} variant implements it"
        raise PlanError(f"no kernel variant computes {problem.describe()} on {caps.name}: {reasons}")
    chosen: Variant = fitting[0]
    schedule = problem.schedule  # a variant's default_schedule completes it, or gives one
    if chosen.default_schedule is not None:
        schedule = chosen.default_schedule(problem, caps, threads)
        if tuned and problem.schedule is None and chosen.search_space is not None:
            from ..tuner.cache import tuned_schedule
            schedule = tuned_schedule(problem, chosen.id, caps, threads) or schedule
    return Decision(chosen.id, caps.backend, caps.name, schedule, chosen.summary,
                    tuple(chosen.conditions(problem, caps)), tuple(rejected), tuple(v.id for v in fitting))


# -- the seeds' API ------------------------------------------------------------------------

# kernel names plan_kernel takes (the seeds' and Tracea's op names) -> op
KERNELS = {"gemm": "gemm", "matmul": "gemm", "fused_gemm": "fused_gemm", "conv2d": "conv2d", "softmax": "softmax",
           "attention": "attention", "flash_attention": "attention", "flash_attention_2": "attention"}
PRECISIONS = {"f32": "f32", "fp32": "f32", "float32": "f32", "f16": "f16", "fp16": "f16", "half": "f16",
              "float16": "f16", "bf16": "bf16", "bfloat16": "bf16"}


def devices() -> list[Capabilities]:
    """What this machine offers, best first: its NVIDIA GPUs (when there are), then its CPU, then
    its Vulkan devices (which may be the CPU again: lavapipe)."""
    gpus, vulkan = probe_nvidia(), probe_vulkan()
    return (gpus if isinstance(gpus, list) else []) + [host()] + (vulkan if isinstance(vulkan, list) else [])


def device_here(device: str) -> Capabilities:
    """This machine's "cuda" / "vulkan" device 0, or the one named "cuda:N" / "vulkan:N"."""
    kind = device.split(":")[0]
    found, profile = (probe_nvidia(), "'sm_80' or 'sm_90a'") if kind == "cuda" else (probe_vulkan(), "'vulkan-lavapipe'")
    if isinstance(found, str):
        label = "NVIDIA" if kind == "cuda" else "Vulkan"
        raise PlanError(f"no {label} device here: {found}; name a device profile instead ({profile})")
    wanted = [c for c in found if device == kind or c.name == device]
    if not wanted:
        raise PlanError(f"there is no {device}; this machine has {', '.join(c.name for c in found)}")
    return wanted[0]


class Context:
    """Profiles the machine once (or takes a named profile: Context("sm_90a")) and plans kernels
    on its best device: `plan_kernel(kernel, precision, **shapes)`."""

    def __init__(self, device: str | Capabilities | None = None):
        if isinstance(device, Capabilities):
            self.capabilities = device
        elif device in (None, "auto"):
            self.capabilities = devices()[0]
        elif device in ("cpu", "host"):
            self.capabilities = host()
        elif device in ("cuda", "vulkan") or str(device).startswith(("cuda:", "vulkan:")):
            self.capabilities = device_here(str(device))
        else:
            try:
                self.capabilities = named(device)
            except ValueError as e:
                raise PlanError(f"{e}; or 'cpu', 'cuda', 'cuda:N', 'vulkan', 'vulkan:N'") from None

    @property
    def backend(self) -> str:
        return self.capabilities.backend

    def plan_kernel(self, kernel: str, precision: str = "F32", threads: int | None = None, **facts) -> Decision:
        """The variant chosen for `kernel` (gemm, fused_gemm, conv2d, softmax, attention; also
        matmul, flash_attention, flash_attention_2) at `precision` (F32, F16, BF16), with any facts
        known: m, n, k, transpose_a, transpose_b, batched_b (GEMMs), head_dim (attention), layout,
        groups (conv2d), last_axis (softmax), out_dtype."""
        op = KERNELS.get(kernel.lower())
        if op is None:
            raise PlanError(f"unknown kernel {kernel!r}; known: {', '.join(KERNELS)}")
        dtype = PRECISIONS.get(precision.lower())
        if dtype is None:
            raise PlanError(f"unknown precision {precision!r}; known: {', '.join(sorted({p.upper() for p in DTYPES}))} "
                            f"(or {', '.join(p for p in PRECISIONS if p not in DTYPES)})")
        allowed = set(Problem.__dataclass_fields__) - {"op", "dtype", "dtypes", "schedule", "view"}
        unknown = sorted(set(facts) - allowed)
        if unknown:
            raise PlanError(f"plan_kernel does not take {', '.join(unknown)}; it takes {', '.join(sorted(allowed))}")
        if op == "attention" and "head_dim" in facts:
            facts.setdefault("value_head_dim", facts["head_dim"])
        return plan(Problem(op, dtype, **facts), self.capabilities, threads)

    def __repr__(self) -> str:
        return f"Context({self.capabilities.describe()})"


assert set(KERNELS.values()) == set(OPS)
