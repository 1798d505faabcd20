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

from ..dialects.ops import Conv2dDef, OpView, TensorSpec, view
from ..dialects.schedule import LaneMap, Schedule
from ..dialects.verify import tracea_ops
from ..errors import OpError
from ..targets.host import HostCPU, host_cpu
from .cpu_attention import attention_kernel_text
from .cpu_attention import supports as supports_attention
from .cpu_gemm import gemm_kernel_text
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


def im2col_text(name: str, image: TensorSpec, kernel: tuple[int, int], out_hw: tuple[int, int], stride, dilation,
                pads, lanes: int, location: str) -> str:
    """col[n, oh * OW + ow, (kh * KW + kw) * C + c] = image[n, oh*s + kh*d - top, ow*s + kw*d - left, c]
    (NHWC image; zero outside it): each (kh, kw) run of C channels is one vector copy."""
    n, h, w, c = image.shape
    (kh, kw), (oh, ow), (sh, sw), (dh, dw) = kernel, out_hw, stride, dilation
    top, left = pads
    k = kh * kw * c
    col = TensorSpec((n, oh * ow, k), image.dtype)
    vt = f"vector<{lanes}x{image.dtype}>"
    c_vec = c // lanes * lanes
    mem_in, mem_out = f"memref<{n}x{h}x{w}x{c}x{image.dtype}>", f"memref<{n}x{oh * ow}x{k}x{image.dtype}>"
    return f"""#src = {location}
func.func private @{name}(%x: {image}) -> {col} {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c_ow = arith.constant {ow} : index
  %c_kh = arith.constant {kh} : index
  %c_kw = arith.constant {kw} : index
  %c_h = arith.constant {h} : index
  %c_w = arith.constant {w} : index
  %c_c = arith.constant {c} : index
  %c_cvec = arith.constant {c_vec} : index
  %c_lanes = arith.constant {lanes} : index
  %zero = arith.constant 0.0 : {image.dtype}
  %in = bufferization.to_buffer %x read_only : {image} to {mem_in}
  %out = memref.alloc() {{alignment = 64 : i64}} : {mem_out}
  %n = arith.constant {n} : index
  %oh = arith.constant {oh} : index
  scf.parallel (%b, %y) = (%c0, %c0) to (%n, %oh) step (%c1, %c1) {{
    scf.for %x0 = %c0 to %c_ow step %c1 {{
      %p0 = arith.muli %y, %c_ow : index
      %p = arith.addi %p0, %x0 : index
      scf.for %i = %c0 to %c_kh step %c1 {{
        %ih0 = affine.apply affine_map<(y, i) -> (y * {sh} + i * {dh} - {top})>(%y, %i)
        %inh = arith.cmpi ult, %ih0, %c_h : index
        scf.for %j = %c0 to %c_kw step %c1 {{
          %iw0 = affine.apply affine_map<(x, j) -> (x * {sw} + j * {dw} - {left})>(%x0, %j)
          %inw = arith.cmpi ult, %iw0, %c_w : index
          %inside = arith.andi %inh, %inw : i1
          %k0 = affine.apply affine_map<(i, j) -> ((i * {kw} + j) * {c})>(%i, %j)
          scf.if %inside {{
            scf.for %ch = %c0 to %c_cvec step %c_lanes {{
              %v = vector.load %in[%b, %ih0, %iw0, %ch] : {mem_in}, {vt}
              %kk = arith.addi %k0, %ch : index
              vector.store %v, %out[%b, %p, %kk] : {mem_out}, {vt}
            }}
            scf.for %ch = %c_cvec to %c_c step %c1 {{
              %v = memref.load %in[%b, %ih0, %iw0, %ch] : {mem_in}
              %kk = arith.addi %k0, %ch : index
              memref.store %v, %out[%b, %p, %kk] : {mem_out}
            }}
          }} else {{
            scf.for %ch = %c0 to %c_c step %c1 {{
              %kk = arith.addi %k0, %ch : index
              memref.store %zero, %out[%b, %p, %kk] : {mem_out}
            }}
          }}
        }}
      }}
    }}
    scf.reduce
  }}
  %r = bufferization.to_tensor %out restrict writable : {mem_out} to {col}
  return %r : {col}
}}
"""


def conv_as_gemm(w: KernelWriter, v: OpView, index: int) -> tuple[str, str]:
    """conv2d = im2col (NHWC, k ordered (kh, kw, c)) + one batched GEMM whose epilogue adds the
    bias; an NCHW input is transposed to NHWC first and the result back. Returns the function
    text of the im2col kernel and the SSA name of the result."""
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
    k = kh * kw * c
    im2col_name = f"__tracea_im2col_{index}"
    col_type = TensorSpec((n, oh * ow, k), x.dtype)
    col = w.emit(col_type, f"func.call @{im2col_name}({image}) : ({w.types[image]}) -> {col_type}")
    filt = w.reshape(filt, [[0, 1, 2], [3]], (k, nf))
    b_type = TensorSpec((k, nf), f.dtype)
    out = TensorSpec((n, oh * ow, nf), v.result.dtype)
    if "bias" in w.arg:
        gemm = w.emit(out, f'"tracea.fused_gemm"({col}, {filt}, {w.arg["bias"]}) {{epilogue = [{{kind = "bias_add"}}], '
                           f'operandSegmentSizes = array<i32: 1, 1, 1, 0>}} '
                           f': ({col_type}, {b_type}, {v.operands["bias"]}) -> {out}')
    else:
        gemm = w.emit(out, f'"tracea.gemm"({col}, {filt}) : ({col_type}, {b_type}) -> {out}')
    if nchw:
        gemm = w.transpose(w.reshape(gemm, [[0], [1, 2], [3]], (n, oh, ow, nf)), [0, 3, 1, 2])
        result = gemm
    else:
        result = w.reshape(gemm, [[0], [1, 2], [3]], (n, oh, ow, nf))
    text = im2col_text(im2col_name, TensorSpec((n, h, wd, c), x.dtype), (kh, kw), (oh, ow), v.attrs["stride"],
                       v.attrs["dilation"], (top, left), host_cpu().f32_lanes, str(v.op.location))
    return text, result


@register
@dataclass(frozen=True)
class ConvToGemmPass(TraceaPass):
    NAME = "tracea-cpu-conv-to-gemm"
    SUMMARY = "rewrite conv2d (groups = 1) as im2col + a gemm, so it runs on the CPU GEMM kernel"

    def run(self, module: ir.Operation) -> None:
        for index, op in enumerate(tracea_ops(module)):
            if op.name != "tracea.conv2d":
                continue
            v = view(op)
            if v.attrs["groups"] != 1:
                continue  # grouped and depthwise convolutions stay on the reference lowering
            writer = KernelWriter(f"__tracea_conv_{index}", v.operands, v.result)
            im2col, result = conv_as_gemm(writer, v, index)
            # The im2col kernel stays a function of the module; the inliner dissolves it later.
            kernel_module = ir.Module.parse(im2col, module.context)
            kernel_module.body.operations[0].operation.move_before(module.regions[0].blocks[0].operations[0])
            declaration = im2col[im2col.index("func.func private"):im2col.index("{\n")].replace("%x: ", "")
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
                    with op.context:  # 8 query rows x 2 vectors of keys: 16 score registers
                        op.attributes["schedule"] = Schedule(tile=(8, 2 * host.f32_lanes),
                                                             lane_map=LaneMap("simd", (host.f32_lanes,))).to_attr()
                continue
            m, n = v.result.shape[-2:]
            a = v.operands["a"]
            k = a.shape[-2] if v.attrs["transpose_a"] else a.shape[-1]
            with op.context:
                op.attributes["schedule"] = default_gemm_schedule(m, n, k, host, threads).to_attr()


@register
@dataclass(frozen=True)
class CpuKernelsPass(TraceaPass):
    NAME = "tracea-cpu-kernels"
    SUMMARY = ("replace gemm / fused_gemm / attention / softmax ops whose schedule has a simd lane_map by "
               "vectorized CPU kernels (scf.parallel over blocks): packed cache-blocked GEMM, flash-style "
               "attention, online softmax")

    def run(self, module: ir.Operation) -> None:
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
            inline_kernel(op, gemm_kernel_text(f"__tracea_cpu_gemm_{index}", v, str(op.location)))
        if failed:
            raise PassFailed()
