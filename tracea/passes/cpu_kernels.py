"""CPU schedules and kernels.

tracea-cpu-schedule gives each op that has a fast CPU kernel a schedule sized from the host
(cache blocks from the cache sizes, register tile and SIMD width from the vector registers),
unless the op already carries one. tracea-cpu-kernels then replaces each op whose schedule maps
onto SIMD lanes by its kernel; ops it does not handle are left for tracea-lower-to-linalg.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

import mlir.ir as ir

from ..dialects.ops import OP_DEFS, Conv2dDef, Epilogue, OpView, TensorSpec, view
from ..dialects.schedule import LaneMap, Schedule
from ..dialects.verify import tracea_ops
from ..errors import OpError
from ..targets.host import HostCPU, host_cpu
from .cpu_attention import attention_kernel_text
from .cpu_attention import supports as supports_attention
from .cpu_conv import conv_nchw_kernel_text
from .cpu_conv import supports as supports_direct_conv
from .cpu_gemm import ConvGather, conv_k_block, gemm_dot_kernel_text, gemm_kernel_text
from .cpu_softmax import softmax_kernel_text
from .kernel_text import KernelWriter
from .lower_to_linalg import inline_kernel
from .registry import PassFailed, TraceaPass, option, register

GEMM_OPS = ("tracea.gemm", "tracea.fused_gemm")


def _round_down(x: int, multiple: int) -> int:
    return max(multiple, x // multiple * multiple)


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def default_gemm_schedule(m: int, n: int, k: int, host: HostCPU, threads: int) -> Schedule:
    """BLIS-style blocking: the B micro-panel (KC x NR) in about L1, the A block (MC x KC) in half of
    L2, the B panel (KC x NC) in a quarter of L3. Threads share the M blocks when there are
    enough (~4 each, in equal numbers); with fewer the kernel also splits the B panel among
    them (see GemmPlan.n_chunk), so M blocks stay as large as L2 allows."""
    lanes = host.f32_lanes
    nr = 2 * lanes
    mr = min(14, (host.vector_registers - 3) // 2)  # accumulators + 2 B vectors + 1 broadcast
    kc = max(64, min(512, 2 * host.l1d_bytes // (nr * 4)))
    # K blocks of equal size, their number rounded to the nearest: K = 576 (a 3x3x64 conv) is one
    # block of 576, not 512 and a 64 whose partial sums cost a pass over C for little work
    kc = _round_up(math.ceil(k / max(1, round(k / kc))), 8)
    mc = _round_down(host.l2_bytes // 2 // (kc * 4), mr)
    blocks = math.ceil(m / mc)
    if blocks == 1:  # one block: the register tile's height divides M as evenly as it can
        mr = math.ceil(m / math.ceil(m / mr))
    elif threads > 1 and blocks >= 4 * threads:
        blocks = _round_up(blocks, threads)
    mc = _round_up(math.ceil(m / blocks), mr)
    nc = min(_round_down(host.l3_bytes // 4 // (kc * 4), nr), _round_up(n, nr))
    return Schedule(tile=(mc, nc, kc), warp_tile=(mr, nr, 1), lane_map=LaneMap("simd", (lanes,)))


def use_dot_kernel(m: int, k: int, transpose_a: bool, transpose_b: bool) -> bool:
    """x @ W^T (W as nn.Linear stores it) with few rows and long rows runs on the inner-product
    kernel, which packs nothing: measured here, 64x2048x2048 took 4.2 ms against 5.1 ms packed
    (2 threads); with 128 rows, or K = 256, the packed kernel was faster."""
    return transpose_b and not transpose_a and m <= 64 and k >= 512


def dot_gemm_schedule(m: int, n: int, k: int, host: HostCPU, threads: int) -> Schedule:
    """The inner-product kernel's blocking: MR x NR accumulators (+ MR rows of A and one of B in
    registers); K blocks long enough to amortize reducing the accumulators; A blocks in half of L2."""
    lanes = host.f32_lanes
    mr = 4
    nr = max(1, min(4, (host.vector_registers - mr - 1) // mr))
    kc = min(_round_up(k, lanes), 1024)
    mc = _round_up(min(m, max(mr, _round_down(host.l2_bytes // 2 // (kc * 4), mr))), mr)
    return Schedule(tile=(mc, _round_up(n, nr), kc), warp_tile=(mr, nr, lanes), lane_map=LaneMap("simd", (lanes,)))


def check_gemm_schedule(v: OpView) -> None:
    s = v.attrs["schedule"]
    if s.tile is None or s.warp_tile is None or len(s.tile) != 3:
        raise OpError("a CPU gemm schedule needs tile = [MC, NC, KC] and warp_tile = [MR, NR, 1] "
                      "(or [MR, NR, lanes] for the inner-product kernel)")
    mr, nr, kr = s.warp_tile
    lanes = s.lane_map.shape[-1]
    available = host_cpu().vector_registers
    if kr == lanes:  # inner products along K
        if v.attrs["transpose_a"] or not v.attrs["transpose_b"]:
            raise OpError(f"CPU gemm warp_tile [MR, NR, {lanes}] (inner products along K) needs transpose_b "
                          "and not transpose_a; use [MR, NR, 1]")
        registers = mr * nr + mr + 1
        if lanes == host_cpu().f32_lanes and registers > available:
            raise OpError(f"inner-product tile {mr}x{nr} needs {registers} vector registers; this CPU has "
                          f"{available} (reduce MR or NR)")
        return
    if kr != 1 or nr % lanes:
        raise OpError(f"CPU gemm warp_tile [MR, NR, 1] needs NR a multiple of the {lanes} SIMD lanes; "
                      f"got {list(s.warp_tile)}")
    registers = mr * nr // lanes + nr // lanes + 1
    if lanes == host_cpu().f32_lanes and registers > available:
        raise OpError(f"register tile {mr}x{nr} needs {registers} vector registers; this CPU has {available} "
                      f"(reduce MR or NR)")


def conv_as_gemm(w: KernelWriter, v: OpView, name: str, threads: int) -> tuple[str, str]:
    """conv2d = one GEMM over the im2col of the NHWC image, packed straight from the image
    (implicit GEMM), k ordered (kh, kw, c) so the HWCF filter is B as it lies; the bias is the
    GEMM's epilogue. An NCHW input (and FCHW filter) is transposed first, the result back.
    Returns the GEMM kernel's function text and the SSA name of the result."""
    x, f = v.operands["input"], v.operands["filter"]
    nchw = v.attrs["layout"] == "nchw"
    top, _, left, _ = Conv2dDef.pads(v.attrs)
    if nchw:
        n, c, h, wd = x.shape
        nf, _, kh, kw = f.shape
        _, _, oh, ow = v.result.shape
        image = w.transpose(w.arg["input"], [0, 2, 3, 1])
        filt = w.transpose(w.arg["filter"], [2, 3, 1, 0])  # FCHW -> HWCF
    else:
        n, h, wd, c = x.shape
        kh, kw, _, nf = f.shape
        _, oh, ow, _ = v.result.shape
        image, filt = w.arg["input"], w.arg["filter"]
    m, k = n * oh * ow, kh * kw * c
    filt = w.reshape(filt, [[0, 1, 2], [3]], (k, nf))
    gather = ConvGather(TensorSpec((n, h, wd, c), x.dtype), (kh, kw), (oh, ow), tuple(v.attrs["stride"]),
                        tuple(v.attrs["dilation"]), (top, left))
    host = host_cpu()
    schedule = default_gemm_schedule(m, nf, k, host, threads)
    mc, nc, _ = schedule.tile
    # K blocks whose B micro-panel fits L1: measured on the 3x3 C64 conv, blocks of 256-320 ran
    # ~10 % faster than 512-576 (the GEMM's), whose panels spill to L2
    kc = host.l1d_bytes // (schedule.warp_tile[1] * 4)
    schedule = replace(schedule, tile=(mc, nc, conv_k_block(gather.unit(schedule.lane_map.shape[-1]), k, kc)))
    operands = {"a": TensorSpec((m, k), x.dtype), "b": TensorSpec((k, nf), f.dtype)}
    if "bias" in w.arg:
        operands["bias"] = v.operands["bias"]
    gemm_view = OpView(v.op, OP_DEFS["tracea.fused_gemm"], operands, TensorSpec((m, nf), v.result.dtype),
                       {"transpose_a": False, "transpose_b": False, "schedule": schedule,
                        "epilogue": (Epilogue("bias_add"),) if "bias" in w.arg else ()})
    text = gemm_kernel_text(name, gemm_view, str(v.op.location), gather, threads)
    call_args = [image, filt] + ([w.arg["bias"]] if "bias" in w.arg else [])
    out = gemm_view.result
    result = w.emit(out, f"func.call @{name}({', '.join(call_args)}) : "
                         f"({', '.join(str(w.types[a]) for a in call_args)}) -> {out}")
    result = w.reshape(result, [[0, 1, 2], [3]], (n, oh, ow, nf))
    if nchw:
        result = w.transpose(result, [0, 3, 1, 2])
    return text, result


@register
@dataclass(frozen=True)
class ConvKernelsPass(TraceaPass):
    NAME = "tracea-cpu-conv"
    SUMMARY = ("run conv2d (groups = 1) on CPU kernels: NCHW f32 directly (phase planes, no transposes), "
               "the others on the GEMM kernel, packing im2col rows straight from the image")
    threads: int = option(0, "threads the kernels will run on (0: the host's cores)")

    def run(self, module: ir.Operation) -> None:
        threads = self.threads or host_cpu().cores
        for index, op in enumerate(tracea_ops(module)):
            if op.name != "tracea.conv2d":
                continue
            v = view(op)
            if v.attrs["groups"] != 1:
                continue  # grouped and depthwise convolutions stay on the reference lowering
            if supports_direct_conv(v):
                host = host_cpu()
                inline_kernel(op, conv_nchw_kernel_text(f"__tracea_conv_{index}", v, str(op.location),
                                                        host.f32_lanes, host.vector_registers - 8, threads))
                continue
            writer = KernelWriter(f"__tracea_conv_{index}", v.operands, v.result)
            gemm, result = conv_as_gemm(writer, v, f"__tracea_conv_gemm_{index}", threads)
            # The GEMM kernel stays a function of the module; the inliner dissolves it later.
            kernel_module = ir.Module.parse(gemm, module.context)
            kernel_module.body.operations[0].operation.move_before(module.regions[0].blocks[0].operations[0])
            declaration = gemm[gemm.index("func.func private"):gemm.index(" {\n")]
            declaration = re.sub(r"%arg\d+: ", "", declaration)
            inline_kernel(op, writer.text(result, str(op.location)) + declaration + "\n")


def check_attention_schedule(v: OpView) -> None:
    s = v.attrs["schedule"]
    lanes = s.lane_map.shape[-1]
    if s.tile is None or len(s.tile) != 2 or s.tile[1] % lanes:
        raise OpError(f"a CPU attention schedule needs tile = [query rows, keys] with keys a multiple of "
                      f"the {lanes} SIMD lanes; got {s.tile}")
    if not supports_attention(v, lanes):
        raise OpError(f"the CPU attention kernel needs head dims that are multiples of {lanes}; "
                      "drop the schedule to use the reference lowering")


@register
@dataclass(frozen=True)
class CpuSchedulePass(TraceaPass):
    NAME = "tracea-cpu-schedule"
    SUMMARY = "attach a host-sized CPU schedule to every gemm / fused_gemm / attention / softmax that has none"
    threads: int = option(0, "threads the kernels will run on (0: the host's cores)")

    def run(self, module: ir.Operation) -> None:
        host = host_cpu()
        threads = self.threads or host.cores
        for op in tracea_ops(module):
            if op.name not in GEMM_OPS + ("tracea.attention", "tracea.softmax") or "schedule" in op.attributes:
                continue
            v = view(op)
            if op.name == "tracea.softmax":
                if v.attrs["axis"] % v.result.rank == v.result.rank - 1:  # rows are contiguous
                    with op.context:
                        op.attributes["schedule"] = Schedule(lane_map=LaneMap("simd", (host.f32_lanes,))).to_attr()
                continue
            if op.name == "tracea.attention":
                if supports_attention(v, host.f32_lanes):
                    with op.context:  # blocks of 16 queries x 4 vectors of keys (AVX-512: 64 keys)
                        op.attributes["schedule"] = Schedule(tile=(16, 4 * host.f32_lanes),
                                                             lane_map=LaneMap("simd", (host.f32_lanes,))).to_attr()
                continue
            m, n = v.result.shape[-2:]
            a = v.operands["a"]
            k = a.shape[-2] if v.attrs["transpose_a"] else a.shape[-1]
            dot = use_dot_kernel(m, k, v.attrs["transpose_a"], v.attrs["transpose_b"])
            with op.context:
                op.attributes["schedule"] = (dot_gemm_schedule if dot else default_gemm_schedule)(
                    m, n, k, host, threads).to_attr()


@register
@dataclass(frozen=True)
class CpuKernelsPass(TraceaPass):
    NAME = "tracea-cpu-kernels"
    SUMMARY = ("replace gemm / fused_gemm / attention / softmax ops whose schedule has a simd lane_map by "
               "vectorized CPU kernels (scf.parallel over blocks): packed cache-blocked GEMM, flash-style "
               "attention, online softmax")
    threads: int = option(0, "threads the kernels will run on (0: the host's cores)")

    def run(self, module: ir.Operation) -> None:
        threads = self.threads or host_cpu().cores
        failed = False
        for index, op in enumerate(tracea_ops(module)):
            if op.name not in GEMM_OPS + ("tracea.attention", "tracea.softmax"):
                continue
            v = view(op)
            schedule = v.attrs["schedule"]
            if schedule is None or schedule.lane_map is None or schedule.lane_map.kind != "simd":
                continue
            if op.name == "tracea.softmax":
                if v.attrs["axis"] % v.result.rank == v.result.rank - 1:  # other axes: the reference
                    inline_kernel(op, softmax_kernel_text(f"__tracea_cpu_softmax_{index}", v,
                                                          schedule.lane_map.shape[-1], str(op.location)))
                continue
            if op.name == "tracea.attention":
                try:
                    check_attention_schedule(v)
                except OpError as e:
                    op.location.emit_error(f"'{op.name}' op {e}")
                    failed = True
                    continue
                inline_kernel(op, attention_kernel_text(f"__tracea_cpu_attention_{index}", v, str(op.location)))
                continue
            try:
                check_gemm_schedule(v)
            except OpError as e:
                op.location.emit_error(f"'{op.name}' op {e}")
                failed = True
                continue
            kernel = gemm_dot_kernel_text if schedule.warp_tile[2] > 1 else gemm_kernel_text
            inline_kernel(op, kernel(f"__tracea_cpu_gemm_{index}", v, str(op.location), threads=threads))
        if failed:
            raise PassFailed()
