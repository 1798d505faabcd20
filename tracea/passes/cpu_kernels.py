"""CPU schedules and kernels.

tracea-cpu-schedule gives each op that has a fast CPU kernel a schedule sized from the host
(cache blocks from the cache sizes, register tile and SIMD width from the vector registers),
unless the op already carries one. tracea-cpu-kernels then replaces each op whose schedule maps
onto SIMD lanes by its kernel; ops it does not handle are left for tracea-lower-to-linalg.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import mlir.ir as ir

from ..dialects.ops import OpView, view
from ..dialects.schedule import LaneMap, Schedule
from ..dialects.verify import tracea_ops
from ..errors import OpError
from ..targets.host import HostCPU, host_cpu
from .cpu_gemm import gemm_kernel_text
from .lower_to_linalg import inline_kernel
from .registry import PassFailed, TraceaPass, option, register

GEMM_OPS = ("tracea.gemm", "tracea.fused_gemm")


def _round_down(x: int, multiple: int) -> int:
    return max(multiple, x // multiple * multiple)


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def default_gemm_schedule(m: int, n: int, k: int, host: HostCPU, threads: int) -> Schedule:
    """BLIS-style blocking: the B micro-panel (KC x NR) in L1, the A block (MC x KC) in half of
    L2, the B panel (KC x NC) in a quarter of L3; enough M blocks to keep every thread busy."""
    lanes = host.f32_lanes
    nr = 2 * lanes
    mr = min(14, (host.vector_registers - 3) // 2)  # accumulators + 2 B vectors + 1 broadcast
    kc = max(64, min(512, host.l1d_bytes // (nr * 4)))
    kc = min(kc, _round_up(k, 8))
    mc = _round_down(host.l2_bytes // 2 // (kc * 4), mr)
    if threads > 1:  # the M blocks are shared among threads: make ~4 each, in equal numbers
        blocks = max(math.ceil(m / mc), 4 * threads)
        blocks = _round_up(blocks, threads)
        mc = max(mr, min(mc, _round_up(math.ceil(m / blocks), mr)))
    mc = min(mc, _round_up(m, mr))
    nc = min(_round_down(host.l3_bytes // 4 // (kc * 4), nr), _round_up(n, nr))
    return Schedule(tile=(mc, nc, kc), warp_tile=(mr, nr, 1), lane_map=LaneMap("simd", (lanes,)))


def check_gemm_schedule(v: OpView) -> None:
    s = v.attrs["schedule"]
    if s.tile is None or s.warp_tile is None or len(s.tile) != 3:
        raise OpError("a CPU gemm schedule needs tile = [MC, NC, KC] and warp_tile = [MR, NR, 1]")
    mr, nr, kr = s.warp_tile
    lanes = s.lane_map.shape[-1]
    if kr != 1 or nr % lanes:
        raise OpError(f"CPU gemm warp_tile [MR, NR, 1] needs NR a multiple of the {lanes} SIMD lanes; "
                      f"got {list(s.warp_tile)}")
    registers = mr * nr // lanes + nr // lanes + 1
    available = host_cpu().vector_registers
    if lanes == host_cpu().f32_lanes and registers > available:
        raise OpError(f"register tile {mr}x{nr} needs {registers} vector registers; this CPU has {available} "
                      f"(reduce MR or NR)")


@register
@dataclass(frozen=True)
class CpuSchedulePass(TraceaPass):
    NAME = "tracea-cpu-schedule"
    SUMMARY = "attach a host-sized CPU schedule to every gemm / fused_gemm that has none"
    threads: int = option(0, "threads the kernels will run on (0: the host's cores)")

    def run(self, module: ir.Operation) -> None:
        host = host_cpu()
        threads = self.threads or host.cores
        for op in tracea_ops(module):
            if op.name not in GEMM_OPS or "schedule" in op.attributes:
                continue
            v = view(op)
            m, n = v.result.shape[-2:]
            a = v.operands["a"]
            k = a.shape[-2] if v.attrs["transpose_a"] else a.shape[-1]
            with op.context:
                op.attributes["schedule"] = default_gemm_schedule(m, n, k, host, threads).to_attr()


@register
@dataclass(frozen=True)
class CpuKernelsPass(TraceaPass):
    NAME = "tracea-cpu-kernels"
    SUMMARY = ("replace gemm / fused_gemm ops whose schedule has a simd lane_map by packed, cache-blocked, "
               "vectorized CPU kernels (scf.parallel over blocks)")

    def run(self, module: ir.Operation) -> None:
        failed = False
        for index, op in enumerate(tracea_ops(module)):
            if op.name not in GEMM_OPS:
                continue
            v = view(op)
            schedule = v.attrs["schedule"]
            if schedule is None or schedule.lane_map is None or schedule.lane_map.kind != "simd":
                continue
            try:
                check_gemm_schedule(v)
            except OpError as e:
                op.location.emit_error(f"'{op.name}' op {e}")
                failed = True
                continue
            inline_kernel(op, gemm_kernel_text(f"__tracea_cpu_gemm_{index}", v, str(op.location)))
        if failed:
            raise PassFailed()
