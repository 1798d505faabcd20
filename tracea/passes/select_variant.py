"""tracea-select-variant: the Doctor's choice, written into the IR. Each kernel op (gemm,
fused_gemm, conv2d, attention, softmax) gets the variant the decision engine picks for the
target device as `tracea.variant`, and, unless it has one, that variant's default schedule. The
kernel passes after it only emit what the attributes say."""
from __future__ import annotations

from dataclasses import dataclass

import mlir.ir as ir

from ..doctor.capabilities import Capabilities
from ..doctor.engine import Context, PlanError, plan
from ..codegen.variants import Problem, variant
from ..dialects.ops import view
from ..dialects.verify import tracea_ops
from .registry import PassFailed, TraceaPass, option, register

KERNEL_OPS = ("tracea.gemm", "tracea.fused_gemm", "tracea.conv2d", "tracea.attention", "tracea.softmax")


def select(op: ir.Operation, caps: Capabilities, threads: int | None = None) -> str:
    """The op's variant: the one written on it (checked to compute it, its heuristics
    overridden, given its default schedule when the op has none), else the decision engine's,
    written now with its schedule (the default, or the op's own with what it leaves out filled
    in). Raises PlanError if none fits."""
    problem = Problem.from_view(view(op))
    if "tracea.variant" in op.attributes:
        chosen_id = ir.StringAttr(op.attributes["tracea.variant"]).value
        try:
            chosen = variant(chosen_id)
        except ValueError as e:
            raise PlanError(str(e)) from None
        why = chosen.rejects(problem, caps, preferences=False)
        if why:
            raise PlanError(f"the variant written on the op, {chosen_id}, cannot compute {problem.describe()} on "
                            f"{caps.name}: {why}; remove tracea.variant to let the Doctor choose")
        schedule = None
        if problem.schedule is None and chosen.default_schedule is not None:
            schedule = chosen.default_schedule(problem, caps, threads)
    else:
        decision = plan(problem, caps, threads)
        chosen_id, schedule = decision.variant_id, decision.schedule
    with op.context:
        op.attributes["tracea.variant"] = ir.StringAttr.get(chosen_id)
        if schedule is not None and schedule != problem.schedule:  # a default, or completed
            op.attributes["schedule"] = schedule.to_attr()
    return chosen_id


@register
@dataclass(frozen=True)
class SelectVariantPass(TraceaPass):
    NAME = "tracea-select-variant"
    SUMMARY = ("choose each gemm / fused_gemm / conv2d / attention / softmax op's kernel variant for a device "
               "(tracea.variant) and give it that variant's default schedule unless it has one")
    arch: str = option("host", "the device: host (this CPU), a CPU profile (skylake-avx512, ...), sm_80 or sm_90a")
    threads: int = option(0, "threads CPU kernels will run on (0: the device's cores)")

    def run(self, module: ir.Operation) -> None:
        try:
            caps = Context(self.arch).capabilities
        except ValueError as e:
            raise PassFailed(str(e)) from None
        failed = False
        for op in tracea_ops(module):
            if op.name not in KERNEL_OPS:
                continue
            try:
                select(op, caps, self.threads or None)
            except PlanError as e:
                op.location.emit_error(f"'{op.name}' op {e}")
                failed = True
        if failed:
            raise PassFailed()
