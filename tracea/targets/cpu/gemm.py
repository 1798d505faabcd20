"""The CPU GEMM kernel: cache-blocked, packed, register-blocked, vectorized, threaded.

The loop structure is the classic one of BLIS/GotoBLAS, written as MLIR text from the op's
schedule (tile = [MC, NC, KC] cache blocks, warp_tile = [MR, NR] register tile, lane_map simd
width):

    for each batch, for jc in N step NC, for pc in K step KC:
        pack B[pc:pc+KC, jc:jc+NC] into NR-wide strips (f32, zero-padded)    -- scf.parallel
        for ic in M step MC:                                                  -- scf.parallel
            pack A[ic:ic+MC, pc:pc+KC] into MR-tall strips (f32, zero-padded),
                unless A is f32 and row-major: then its rows are read in place
            for each NR x MR tile: MR*NR/lanes vector accumulators, one vector.fma per
                (row, vector) per k; on the last K block the epilogue runs on the registers
                before the store. Tiles at the M/N edges go through a small buffer.

Packing converts f16/bf16 inputs to f32 and absorbs transposes, so the micro-kernel is one. The
packing reads a conv's im2col without writing it out: A from an NHWC image (ConvGather), B from an
NCHW one (ColumnGather).
The buffers are freed by the bufferization's deallocation pipeline, which places the frees.
"""
from __future__ import annotations

import math

from dataclasses import dataclass

from ...codegen.conv_gather import ColumnGather, ConvGather
from ...codegen.kernel_text import fused_epilogue
from ...codegen.loop_text import LoopText, busiest_thread, memref_text
from ...dialects.ops import ACCUMULATOR_DTYPE, Epilogue, OpView
from ...runtime.dtypes import to_numpy


def conv_k_block(c: int, k: int, kc: int) -> int:
    """A K block size near `kc` that holds whole runs of `c` (or divides one); the runs are
    shared out evenly among the blocks (K a multiple of `c` here)."""
    if k <= kc:
        return k
    if c <= kc:
        runs, blocks = k // c, max(1, round(k / kc))
        return math.ceil(runs / blocks) * c
    divisors = [d for d in range(kc // 2, kc + 1) if c % d == 0]
    return max(divisors) if divisors else c


def column_chunk(m: int, n: int, mc: int, nc: int, nr: int, threads: int) -> int:
    """Columns of an NC panel in one parallel work item (a multiple of NR). Few M blocks (few
    rows) cannot keep the threads busy, so the panel is split too: about 4 items per thread in
    all, sized so that the busiest thread runs as few strips as the panel allows. OpenMP's static
    schedule gives each thread a contiguous run of the items (M block by M block), so a last
    short chunk unbalances them: 25 strips in chunks of 4 gave one thread 16, the other 9."""
    strips = -(-min(nc, n) // nr)
    m_blocks = -(-m // mc)
    if threads <= 1 or m_blocks >= 4 * threads:
        return strips * nr

    def busiest(chunk: int) -> int:
        return busiest_thread([min(chunk, strips - j) for j in range(0, strips, chunk)] * m_blocks, threads)

    wanted = -(-4 * threads // m_blocks)  # chunks per M block
    return nr * min(range(1, strips + 1), key=lambda c: (busiest(c), abs(-(-strips // c) - wanted)))


@dataclass(frozen=True)
class GemmPlan:
    batch: int  # flattened batch count
    m: int
    n: int
    k: int
    transpose_a: bool
    transpose_b: bool
    b_batched: bool
    a_dtype: str
    b_dtype: str
    out_dtype: str
    epilogue: tuple[Epilogue, ...]
    bias_dtype: str | None
    residual_dtype: str | None
    mr: int
    nr: int
    mc: int
    nc: int
    kc: int
    lanes: int
    threads: int
    a_batched: bool = True  # else one A for every batch (a 1x1 NCHW conv's filter, kernels.py)
    row_bias: bool = False  # the bias is per row of C (an NCHW conv's filters, kernels.py), not per column

    @staticmethod
    def from_view(v: OpView, threads: int = 1) -> "GemmPlan":
        a, b = v.operands["a"], v.operands["b"]
        s = v.attrs["schedule"]
        m, n = v.result.shape[-2:]
        k = a.shape[-2] if v.attrs["transpose_a"] else a.shape[-1]
        batch = 1
        for d in v.result.shape[:-2]:
            batch *= d
        mc, nc, kc = s.tile
        mr, nr = s.warp_tile[:2]
        return GemmPlan(batch, m, n, k, v.attrs["transpose_a"], v.attrs["transpose_b"], b.rank == v.result.rank,
                        a.dtype, b.dtype, v.result.dtype, tuple(v.attrs.get("epilogue", ())),
                        v.operands["bias"].dtype if "bias" in v.operands else None,
                        v.operands["residual"].dtype if "residual" in v.operands else None,
                        mr, nr, mc, nc, kc, s.lane_map.shape[-1], threads, a.rank == v.result.rank,
                        v.attrs.get("row_bias", False))

    @property
    def n_chunk(self) -> int:
        return column_chunk(self.m, self.n, self.mc, self.nc, self.nr, self.threads)

    @property
    def needs_accumulator(self) -> bool:
        """Partial sums cross K blocks through memory; a non-f32 result cannot hold them."""
        return self.out_dtype != ACCUMULATOR_DTYPE and self.k > self.kc


# Micro-kernels (this GEMM's, attention's Q K^T and P V) run K_UNROLL steps of their reduction an
# iteration (LoopText.reduction). Measured here (Zen 3, AVX2, in-process A/B beside numpy, torch):
# GEMM 256^3 +10 % on 1 thread, +25-35 % on 2; 2048^3 +4 % / +10 %; attention S512 D64 +4 % / +5 %,
# B8 H12 S128 causal +2-5 % / +6-9 %; 8 steps were no faster than 4.
K_UNROLL = 4


def k_unroll(k: int, kc: int) -> int:
    """Steps per iteration of the GEMM micro-kernel's k loop: K_UNROLL, or where that leaves a
    remainder, another count that divides every K block (kc and the last, k % kc), so the loop
    has none. The code of a remainder loop, run or not, made LLVM's scheduler spill the register
    tile on 2 threads (K = 1002 in blocks of 501: 22 vector spills, 0.70x numpy; 3 steps: none,
    0.96x). A prime K > kc gets 1 step (K = 1009, 2 threads: 0.70x -> 0.99x numpy on AVX-512,
    0.42x -> 0.76x on AVX2)."""
    lengths = math.gcd(min(kc, k), k % kc if k > kc else 0)
    return next((u for u in (K_UNROLL, 8, 6, 5, 7, 3, 2) if lengths % u == 0), 1)

# Packed A rows are kc + A_PAD floats apart: at exactly kc (a power of two) the MR rows the
# micro-kernel reads together would fall into a few L1 sets and evict each other.
A_PAD = 16


def _open_image_row(t: LoopText, g: ConvGather, p: GemmPlan, row0: str, kc: str) -> tuple[str, str, str, str]:
    """Open the loop over the strip's MR rows and, for a row inside the matrix, its pixel:
    returns (image, output y, output x, offset of the row in the strip)."""
    oh, ow = g.out_hw
    t.for_("%r", t.c(0), t.c(p.mr), t.c(1))
    row = t.add(row0, "%r")
    base = t.mul(t.add("%ir", "%r"), t.add(kc, t.c(A_PAD)))
    t.open(f"scf.if {t.cmp('ult', row, t.c(p.m))}")
    img = t.op(f"arith.divui {row}, {t.c(oh * ow)} : index", "i")
    pix = t.op(f"arith.remui {row}, {t.c(oh * ow)} : index", "i")
    return img, t.op(f"arith.divui {pix}, {t.c(ow)} : index", "i"), t.op(f"arith.remui {pix}, {t.c(ow)} : index", "i"), base


def _close_image_row(t: LoopText, Ap: str, Ap_t: str, base: str, kc: str, zero: str) -> None:
    """Rows past the matrix are zeros; close the row loop."""
    t.else_()
    t.for_("%k", t.c(0), kc, t.c(1))
    t.line(f"memref.store {zero}, {Ap}[{t.add(base, '%k')}] : {Ap_t}")
    t.close()
    t.close()
    t.close()  # rows


def pack_a_from_image(t: LoopText, g: ConvGather, p: GemmPlan, image: str, image_t: str, Ap: str, Ap_t: str,
                      row0: str, kc: str, zero: str) -> None:
    """Rows row0 .. row0 + MR of the (virtual) im2col matrix into the A strip, run by run."""
    L = p.lanes
    _, h, w, c = g.image.shape
    (_, kx_n), (sy, sx), (dy, dx), (top, left) = g.kernel, g.stride, g.dilation, g.top_left
    run = g.run(p.kc if p.k > p.kc else p.k, L)
    if g.wide(L) and run == g.unit(L):
        return _pack_a_kernel_rows(t, g, p, image, image_t, Ap, Ap_t, row0, kc, zero)
    run_vec = run // L * L
    vf32, vt_in = f"vector<{L}xf32>", f"vector<{L}x{g.image.dtype}>"
    img, oy, ox, base = _open_image_row(t, g, p, row0, kc)
    t.for_("%s", t.c(0), kc, t.c(run))
    kg = t.add("%pc", "%s")
    kyx = t.op(f"arith.divui {kg}, {t.c(c)} : index", "i")
    c0 = t.op(f"arith.remui {kg}, {t.c(c)} : index", "i")
    ky = t.op(f"arith.divui {kyx}, {t.c(kx_n)} : index", "i")
    kx = t.op(f"arith.remui {kyx}, {t.c(kx_n)} : index", "i")
    iy = t.op(f"arith.subi {t.add(t.mul(oy, t.c(sy)), t.mul(ky, t.c(dy)))}, {t.c(top)} : index", "i")
    ix = t.op(f"arith.subi {t.add(t.mul(ox, t.c(sx)), t.mul(kx, t.c(dx)))}, {t.c(left)} : index", "i")
    # unsigned compares also reject the negative rows/columns of the padding
    inside = t.op(f"arith.andi {t.cmp('ult', iy, t.c(h))}, {t.cmp('ult', ix, t.c(w))} : i1", "p")
    dst = t.add(base, "%s")
    t.open(f"scf.if {inside}")
    t.for_("%cc", t.c(0), t.c(run_vec), t.c(L))
    x = t.op(f"vector.load {image}[{img}, {iy}, {ix}, {t.add(c0, '%cc')}] : {image_t}, {vt_in}", "v")
    if g.image.dtype != "f32":
        x = t.op(f"arith.extf {x} : {vt_in} to {vf32}", "v")
    t.line(f"vector.store {x}, {Ap}[{t.add(dst, '%cc')}] : {Ap_t}, {vf32}")
    t.close()
    t.for_("%cc", t.c(run_vec), t.c(run), t.c(1))
    x = t.op(f"memref.load {image}[{img}, {iy}, {ix}, {t.add(c0, '%cc')}] : {image_t}", "x")
    if g.image.dtype != "f32":
        x = t.op(f"arith.extf {x} : {g.image.dtype} to f32", "x")
    t.line(f"memref.store {x}, {Ap}[{t.add(dst, '%cc')}] : {Ap_t}")
    t.close()
    t.else_()  # a run in the padding: zeros, a vector at a time (scalar stores were 1 % of a 14x14 conv)
    if run_vec:
        zeros = t.op(f"arith.constant dense<0.0> : {vf32}", "z")
        t.for_("%cc", t.c(0), t.c(run_vec), t.c(L))
        t.line(f"vector.store {zeros}, {Ap}[{t.add(dst, '%cc')}] : {Ap_t}, {vf32}")
        t.close()
    t.for_("%cc", t.c(run_vec), t.c(run), t.c(1))
    t.line(f"memref.store {zero}, {Ap}[{t.add(dst, '%cc')}] : {Ap_t}")
    t.close()
    t.close()
    t.close()  # runs
    _close_image_row(t, Ap, Ap_t, base, kc, zero)


def _pack_a_kernel_rows(t: LoopText, g: ConvGather, p: GemmPlan, image: str, image_t: str, Ap: str, Ap_t: str,
                        row0: str, kc: str, zero: str) -> None:
    """pack_a_from_image for small C: one run = one kernel row (KW pixels x C channels), copied
    whole when inside the image, pixel by pixel at its borders."""
    L = p.lanes
    n_img, h, w, c = g.image.shape
    (_, kx_n), (sy, sx), (dy, _), (top, left) = g.kernel, g.stride, g.dilation, g.top_left
    run = kx_n * c
    run_vec = run // L * L
    vf32, vt_in = f"vector<{L}xf32>", f"vector<{L}x{g.image.dtype}>"
    rows_t = memref_text((n_img, h, w * c), g.image.dtype)
    rows = t.op(f"memref.collapse_shape {image} [[0], [1], [2, 3]] : {image_t} into {rows_t}", "m")

    def load(index: list[str], vector: bool) -> str:
        if vector:
            x = t.op(f"vector.load {rows}[{', '.join(index)}] : {rows_t}, {vt_in}", "v")
            return x if g.image.dtype == "f32" else t.op(f"arith.extf {x} : {vt_in} to {vf32}", "v")
        x = t.op(f"memref.load {rows}[{', '.join(index)}] : {rows_t}", "x")
        return x if g.image.dtype == "f32" else t.op(f"arith.extf {x} : {g.image.dtype} to f32", "x")

    img, oy, ox, base = _open_image_row(t, g, p, row0, kc)
    ix0 = t.op(f"arith.subi {t.mul(ox, t.c(sx))}, {t.c(left)} : index", "i")
    # the row's pixels ix0 .. ix0 + KW - 1 all inside (unsigned: ix0 >= 0 too)
    x_inside = t.cmp("ult", t.add(ix0, t.c(kx_n - 1)), t.c(w))
    x_inside = t.op(f"arith.andi {x_inside}, {t.cmp('sge', ix0, t.c(0))} : i1", "p")
    col0 = t.mul(ix0, t.c(c))
    t.for_("%s", t.c(0), kc, t.c(run))
    ky = t.op(f"arith.divui {t.add('%pc', '%s')}, {t.c(run)} : index", "i")
    iy = t.op(f"arith.subi {t.add(t.mul(oy, t.c(sy)), t.mul(ky, t.c(dy)))}, {t.c(top)} : index", "i")
    dst = t.add(base, "%s")
    y_inside = t.cmp("ult", iy, t.c(h))
    t.open(f"scf.if {t.op(f'arith.andi {y_inside}, {x_inside} : i1', 'p')}")
    for j in range(0, run_vec, L):  # whole row: a few vectors and a scalar tail
        t.line(f"vector.store {load([img, iy, t.add(col0, t.c(j))], True)}, {Ap}[{t.add(dst, t.c(j))}] : {Ap_t}, {vf32}")
    for j in range(run_vec, run):
        t.line(f"memref.store {load([img, iy, t.add(col0, t.c(j))], False)}, {Ap}[{t.add(dst, t.c(j))}] : {Ap_t}")
    t.else_()
    t.for_("%kx", t.c(0), t.c(kx_n), t.c(1))  # border: pixel by pixel, zeros outside
    ix = t.add(ix0, "%kx")
    inside = t.op(f"arith.andi {y_inside}, {t.cmp('ult', ix, t.c(w))} : i1", "p")
    t.for_("%cc", t.c(0), t.c(c), t.c(1))
    at = t.add(t.add(dst, t.mul("%kx", t.c(c))), "%cc")
    x = t.fresh("x")
    t.open(f"{x} = scf.if {inside} -> (f32)")
    t.line(f"scf.yield {load([img, iy, t.add(t.mul(ix, t.c(c)), '%cc')], False)} : f32")
    t.else_()
    t.line(f"scf.yield {zero} : f32")
    t.close()
    t.line(f"memref.store {x}, {Ap}[{at}] : {Ap_t}")
    t.close()
    t.close()
    t.close()
    t.close()  # runs
    _close_image_row(t, Ap, Ap_t, base, kc, zero)


def image_row_bases(t: LoopText, g: ConvGather, p: GemmPlan, row0: str, table: str, table_t: str,
                    slot: str) -> str:
    """For the strip of MR rows at row0: whether every row's pixel has all its taps inside the
    image (no padding read), stored with each row's offset into the flattened image (its first
    tap) at table[slot .. slot + MR]; returns that flag (i1). Such a strip is read straight from
    the image by the micro-kernel (ConvGather.direct_segment), not packed."""
    (kh_n, kw_n), (sy, sx), (dy, _), (top, left) = g.kernel, g.stride, g.dilation, g.top_left
    _, h, w, c = g.image.shape
    oh, ow = g.out_hw
    every = None
    for r in range(p.mr):
        row = t.add(row0, t.c(r))
        img = t.op(f"arith.divui {row}, {t.c(oh * ow)} : index", "i")
        pix = t.op(f"arith.remui {row}, {t.c(oh * ow)} : index", "i")
        iy0 = t.op(f"arith.subi {t.mul(t.op(f'arith.divui {pix}, {t.c(ow)} : index', 'i'), t.c(sy))}, {t.c(top)} : index", "i")
        ix0 = t.op(f"arith.subi {t.mul(t.op(f'arith.remui {pix}, {t.c(ow)} : index', 'i'), t.c(sx))}, {t.c(left)} : index", "i")
        checks = [t.cmp("ult", row, t.c(p.m)), t.cmp("sge", iy0, t.c(0)), t.cmp("slt", t.add(iy0, t.c((kh_n - 1) * dy)), t.c(h)),
                  t.cmp("sge", ix0, t.c(0)), t.cmp("slt", t.add(ix0, t.c(kw_n - 1)), t.c(w))]
        for check in checks:
            every = check if every is None else t.op(f"arith.andi {every}, {check} : i1", "p")
        base = t.mul(t.add(t.mul(t.add(t.mul(img, t.c(h)), iy0), t.c(w)), ix0), t.c(c))
        t.line(f"memref.store {base}, {table}[{t.add(slot, t.c(r))}] : {table_t}")
    flag = t.op(f"arith.select {every}, {t.c(1)}, {t.c(0)} : index", "i")
    t.line(f"memref.store {flag}, {table}[{t.add(slot, t.c(p.mr))}] : {table_t}")
    return every


def pack_b_from_image(t: LoopText, g: ColumnGather, p: GemmPlan, flat: str, flat_t: str, Bp: str, Bp_t: str,
                      col0: str, boff: str, kc: str) -> None:
    """The strip of NR columns at col0 of the (virtual) im2col matrix into Bp, rows %pc ..
    %pc + kc: per row (c, ky, kx), one copy per run. Where strips start at output rows (or
    inside one) the runs lie still and are whole vectors; otherwise each strip's runs are found
    from its first pixel and copied under masks. Runs past the matrix's last column read the
    image's start instead: finite values in columns the store leaves out."""
    L, NR = p.lanes, p.nr
    (oh, ow), (_, c, hp, wp), (kh, kw), (sy, sx), (dy, dx) = g.out_hw, g.image.shape, g.kernel, g.stride, g.dilation
    width = min(ow, NR)  # the longest run
    pieces = [(o, min(L, width - o)) for o in range(0, width, L)]

    def sub(x: str, y: str) -> str:
        return t.op(f"arith.subi {x}, {y} : index", "i")

    def at_least_0(x: str) -> str:
        return t.op(f"arith.maxsi {x}, {t.c(0)} : index", "i")

    if g.aligned(NR):
        runs = [(t.c(r * width), None) for r in range(NR // width)]  # (first column in the strip, length)
    else:
        first = t.min_(sub(t.c(ow), t.op(f"arith.remui {col0}, {t.c(ow)} : index", "i")), t.c(NR))
        runs = [(t.c(0), first)] + [(t.add(first, t.c((r - 1) * ow)), None) for r in range(1, g.runs(NR))]
        runs = [(at, length or at_least_0(t.min_(sub(t.c(NR), at), t.c(ow)))) for at, length in runs]
    bases, masks = [], []
    for at, length in runs:
        pos = t.add(col0, at)
        pos = t.op(f"arith.select {t.cmp('ult', pos, t.c(p.n))}, {pos}, {t.c(0)} : index", "i")
        img = t.op(f"arith.divui {pos}, {t.c(oh * ow)} : index", "i")
        pix = t.op(f"arith.remui {pos}, {t.c(oh * ow)} : index", "i")
        y = t.op(f"arith.divui {pix}, {t.c(ow)} : index", "i")
        x = t.op(f"arith.remui {pix}, {t.c(ow)} : index", "i")
        bases.append(t.add(t.add(t.mul(img, t.c(c * hp * wp)), t.mul(y, t.c(sy * wp))), x))
        masks.append(None if length is None else [
            t.op(f"vector.create_mask {at_least_0(sub(length, t.c(o)))} : vector<{n}xi1>", "k") for o, n in pieces])
    t.for_("%k", t.c(0), kc, t.c(1))
    kg = t.add("%pc", "%k")
    ch = t.op(f"arith.divui {kg}, {t.c(kh * kw)} : index", "i")
    tap = t.op(f"arith.remui {kg}, {t.c(kh * kw)} : index", "i")
    ky = t.op(f"arith.divui {tap}, {t.c(kw)} : index", "i")
    kx = t.op(f"arith.remui {tap}, {t.c(kw)} : index", "i")
    kx_shift = t.mul(kx, t.c(dx))  # in phase plane kx_shift % sx, at column kx_shift // sx
    plane = t.add(t.mul(t.op(f"arith.remui {kx_shift}, {t.c(sx)} : index", "i"), t.c(wp // sx)),
                  t.op(f"arith.divui {kx_shift}, {t.c(sx)} : index", "i"))
    tap_off = t.add(t.add(t.mul(ch, t.c(hp * wp)), t.mul(ky, t.c(dy * wp))), plane)
    zeros = {n: t.op(f"arith.constant dense<0.0> : vector<{n}xf32>", "z") for _, n in pieces} if any(masks) else {}
    dst = t.add(boff, t.mul("%k", t.c(NR)))
    for (at, _), base, mask in zip(runs, bases, masks):
        src = t.add(base, tap_off)
        for i, (offset, n) in enumerate(pieces):
            vt = f"vector<{n}xf32>"
            at_src, at_dst = t.add(src, t.c(offset)), t.add(t.add(dst, at), t.c(offset))
            if mask is None:
                x = t.op(f"vector.load {flat}[{at_src}] : {flat_t}, {vt}", "v")
                t.line(f"vector.store {x}, {Bp}[{at_dst}] : {Bp_t}, {vt}")
            else:
                x = t.op(f"vector.maskedload {flat}[{at_src}], {mask[i]}, {zeros[n]} : {flat_t}, vector<{n}xi1>, {vt} "
                         f"into {vt}", "v")
                t.line(f"vector.maskedstore {Bp}[{at_dst}], {mask[i]}, {x} : {Bp_t}, vector<{n}xi1>, {vt}")
    t.close()


def transpose_in_registers(t: LoopText, rows: list[str], dtype: str = "f32") -> list[str]:
    """The transpose of an L x L block held as L row vectors (L a power of two): log2(L)
    rounds of 2-input shuffles, each swapping the off-diagonal s x s blocks of every 2s x 2s
    block (s = L/2 .. 1) -- L * log2(L) shuffles that x86 does in one instruction each (LLVM's
    own lowering of vector.transpose goes element by element and compiles slowly)."""
    n = len(rows)
    vtype = f"vector<{n}x{dtype}>"
    rows = list(rows)
    s = n // 2
    while s:
        for i in range(n):
            if i & s:
                continue
            j = i + s
            top = [n + c - s if c & s else c for c in range(n)]  # row i keeps A, takes C from row j
            bottom = [n + c if c & s else c + s for c in range(n)]  # row j takes B from row i, keeps D
            rows[i], rows[j] = (t.op(f"vector.shuffle {rows[i]}, {rows[j]} {top} : {vtype}, {vtype}", "v"),
                                t.op(f"vector.shuffle {rows[i]}, {rows[j]} {bottom} : {vtype}, {vtype}", "v"))
        s //= 2
    return rows


class _Output:
    """The result C of a GEMM kernel: the f32 partial sums kept between K blocks (in C, or in a
    separate buffer when C is not f32), and the fused epilogue applied on the last K block before
    the store. Tiles arrive in a small [MR, NR] buffer T."""

    def __init__(self, t: LoopText, p: GemmPlan, v: OpView, arg: dict[str, str]):
        self.t, self.p = t, p
        out = v.result
        self.full = t.op(f"memref.alloc() {{alignment = 64 : i64}} : {memref_text(out.shape, out.dtype)}", "m")
        self.C, self.C_t = t.batched_view(self.full, out, p.batch)
        if p.needs_accumulator:
            self.Cacc_t = memref_text((p.batch, p.m, p.n), "f32")
            self.Cacc = t.op(f"memref.alloc() {{alignment = 64 : i64}} : {self.Cacc_t}", "m")
        else:
            self.Cacc, self.Cacc_t = self.C, self.C_t
        self.bias = self.residual = None
        if "bias" in v.operands:
            spec = v.operands["bias"]
            self.bias, self.bias_t = t.to_buffer(arg["bias"], spec), memref_text(spec.shape, spec.dtype)
        if "residual" in v.operands:
            spec = v.operands["residual"]
            self.residual, self.residual_t = t.batched_view(t.to_buffer(arg["residual"], spec), spec, p.batch)
        self.single = p.k <= p.kc  # one K block: no partial sums in memory, no first/last tests

    def k_block(self) -> None:
        """Inside the loop over K blocks (%pc): the first/last-block tests of the stores."""
        t, p = self.t, self.p
        self.first = t.cmp("eq", "%pc", t.c(0))
        self.last = t.cmp("sge", t.add("%pc", t.c(p.kc)), t.c(p.k))

    def epilogue(self, value: str, lanes: int | None, row: str, col: str, tag: str) -> str:
        """The fused epilogue on an f32 scalar or vector; loads its operands at (row, col)."""
        t, p = self.t, self.p
        vec = lambda dt: f"vector<{lanes}x{dt}>" if lanes else dt  # noqa: E731
        load = "vector.load" if lanes else "memref.load"
        operands = {}
        if self.bias is not None and p.row_bias:  # one value for the row, broadcast along it
            bias = t.op(f"memref.load {self.bias}[{row}] : {self.bias_t}", "e")
            if lanes:
                bias = t.op(f"vector.broadcast {bias} : {p.bias_dtype} to {vec(p.bias_dtype)}", "e")
            operands["bias_add"] = (bias, p.bias_dtype)
        elif self.bias is not None:
            operands["bias_add"] = (t.op(f"{load} {self.bias}[{col}] : {self.bias_t}"
                                         + (f", {vec(p.bias_dtype)}" if lanes else ""), "e"), p.bias_dtype)
        if self.residual is not None:
            operands["residual_add"] = (t.op(f"{load} {self.residual}[%bb, {row}, {col}] : {self.residual_t}"
                                             + (f", {vec(p.residual_dtype)}" if lanes else ""), "e"), p.residual_dtype)
        lines, x = fused_epilogue(value, p.epilogue, operands, p.out_dtype, lanes, f"%ep{tag}_")
        for line in lines:
            t.line(line)
        return x

    def _accumulate(self, value: str, vtype: str, load: str) -> str:
        """value + the partial sum stored by earlier K blocks (none on the first)."""
        t = self.t
        summed = t.fresh("s")
        t.open(f"{summed} = scf.if {self.first} -> ({vtype})")
        t.line(f"scf.yield {value} : {vtype}")
        t.else_()
        old = t.op(load, "o")
        t.line(f"scf.yield {t.op(f'arith.addf {old}, {value} : {vtype}', 's')} : {vtype}")
        t.close()
        return summed

    def _store(self, value: str, lanes: int | None, row: str, col: str, tag: str) -> None:
        """Last K block: epilogue, cast, store to C; earlier blocks: store the f32 partial sum."""
        t, p = self.t, self.p
        dialect = "vector" if lanes else "memref"

        def access(verb: str, mem: str, mem_t: str, dtype: str) -> str:
            return (f"{dialect}.{verb} {mem}[%bb, {row}, {col}] : {mem_t}"
                    + (f", vector<{lanes}x{dtype}>" if lanes else ""))
        if not self.single:
            value = self._accumulate(value, f"vector<{lanes}xf32>" if lanes else "f32",
                                     access("load", self.Cacc, self.Cacc_t, "f32"))
            t.open(f"scf.if {self.last}")
        y = self.epilogue(value, lanes, row, col, tag)
        t.line(access("store", f"{y}, {self.C}", self.C_t, p.out_dtype))
        if not self.single:
            t.else_()
            t.line(access("store", f"{value}, {self.Cacc}", self.Cacc_t, "f32"))
            t.close()

    def prefetch(self, row0: str, col0: str, rows: int, cols: int) -> None:
        """Ask for the tile's lines of C (the partial sums) before the micro-kernel runs: its
        rows are a row of C apart, each a miss to L3 or memory that would stall the stores after
        it (9 % of a 1024^3 GEMM). Indices clamped inside C, the lines at both ends of each row."""
        t, p = self.t, self.p
        last_col = t.min_(t.add(col0, t.c(cols - 1)), t.c(p.n - 1))
        for r in range(rows):
            row = t.min_(t.add(row0, t.c(r)), t.c(p.m - 1))
            for col in (col0, last_col):
                t.line(f"memref.prefetch {self.Cacc}[%bb, {row}, {col}], write, locality<3>, data : {self.Cacc_t}")

    def store_vector(self, value: str, row: str, col: str, tag: str) -> None:
        """One SIMD-wide vector of the tile at (row, col), inside C (`tag` names its values)."""
        self._store(value, self.p.lanes, row, col, tag)

    def store_rows(self, T: str, T_t: str, row0: str, col0: str, rows: str, vectors: int,
                   width: int | None = None) -> None:
        """The tile's first `rows` rows, all NR columns inside C: a vector (of `width` lanes, the
        SIMD width by default) at a time."""
        t, L = self.t, width or self.p.lanes
        t.for_("%tr", t.c(0), rows, t.c(1))
        row = t.add(row0, "%tr")
        for j in range(vectors):
            value = t.op(f"vector.load {T}[%tr, {t.c(j * L)}] : {T_t}, vector<{L}xf32>", "x")
            self._store(value, L, row, t.add(col0, t.c(j * L)), f"v{j}")
        t.close()

    def store_elements(self, T: str, T_t: str, row0: str, col0: str, rows: str, cols: str) -> None:
        """The tile's first `rows` x `cols` elements, one at a time."""
        t = self.t
        t.for_("%er", t.c(0), rows, t.c(1))
        t.for_("%ec", t.c(0), cols, t.c(1))
        x = t.op(f"memref.load {T}[%er, %ec] : {T_t}", "x")
        self._store(x, None, t.add(row0, "%er"), t.add(col0, "%ec"), "edge")
        t.close()
        t.close()


def _direct_or_packed(t: LoopText, g: ConvGather, p: GemmPlan, segment: int, slot: str, table: str, table_t: str,
                      image: str, packed: str, mem_t: str, a_src: dict, kc: str,
                      inits: list[str], vtype: str, fma_step) -> list[str]:
    """The micro-kernel's reduction over a K block of a conv, in segments of `segment` columns:
    from the image when the strip's flag says so (each row at its pixel's offset, plus the
    segment's tap row ky and first column), else from the packed strip (a_src's rows on entry);
    points a_src, which fma_step reads, at the chosen rows."""
    packed_rows = a_src["rows"]
    _, _, w, c = g.image.shape
    row = g.kernel[1] * c  # a kernel row's columns: contiguous in the image
    direct = t.cmp("ne", t.op(f"memref.load {table}[{t.add(slot, t.c(p.mr))}] : {table_t}", "i"), t.c(0))
    src = t.fresh("m")
    t.open(f"{src} = scf.if {direct} -> ({mem_t})")
    t.line(f"scf.yield {image} : {mem_t}")
    t.else_()
    t.line(f"scf.yield {packed} : {mem_t}")
    t.close()
    bases = [t.op(f"arith.select {direct}, {t.op(f'memref.load {table}[{t.add(slot, t.c(r))}] : {table_t}', 'i')}, "
                  f"{packed_rows[r]} : index", "i") for r in range(p.mr)]

    def one_segment(k: str, accs: list[str]) -> list[str]:  # k: the segment's first column in the block
        k0 = t.add("%pc", k)
        ky = t.op(f"arith.divui {k0}, {t.c(row)} : index", "i")
        in_image = t.add(t.mul(ky, t.c(g.dilation[0] * w * c)), t.op(f"arith.remui {k0}, {t.c(row)} : index", "i"))
        # fma_step reads A at row + k (k counting from the block's start, as B's packed panel does)
        offset = t.op(f"arith.select {direct}, {t.op(f'arith.subi {in_image}, {k} : index', 'i')}, {t.c(0)} : index", "i")
        a_src.update(mem=src, type=mem_t, rows=[t.add(base, offset) for base in bases])
        return t.reduction(k, t.add(k, t.c(segment)), accs, vtype, fma_step, unroll=K_UNROLL)

    return t.carried_for(t.c(0), kc, t.c(segment), inits, vtype, one_segment)


def gemm_kernel_text(name: str, v: OpView, location: str, gather: ConvGather | None = None,
                     threads: int = 1, b_gather: ColumnGather | None = None) -> str:
    """A private function on tensors (the op's operands in order) computing the op, its work
    shared among `threads`; with `gather`, its first argument is the image whose im2col is A,
    with `b_gather`, its second is the image whose im2col is B."""
    p = GemmPlan.from_view(v, threads)
    t = LoopText(serial=threads == 1)
    L, MR, NR = p.lanes, p.mr, p.nr
    nv = NR // L
    vf32 = f"vector<{L}xf32>"
    a, b = v.operands["a"], v.operands["b"]
    args = list(v.operands.items())
    if gather is not None:
        args[0] = ("a", gather.image)
    if b_gather is not None:
        args[1] = ("b", b_gather.image)
    params = ", ".join(f"%arg{i}: {spec}" for i, (_, spec) in enumerate(args))
    arg = {n: f"%arg{i}" for i, (n, _) in enumerate(args)}

    # --- memref views: every operand as [batch, rows, cols] (bias as [N]) -------------------
    if gather is None:
        A, A_t = t.batched_view(t.to_buffer(arg["a"], a), a, p.batch)
    else:
        A_t = memref_text(gather.image.shape, gather.image.dtype)
        A = t.op(f"bufferization.to_buffer {arg['a']} read_only : {gather.image} to {A_t}", "m")
    if b_gather is None:
        B, B_t = t.batched_view(t.to_buffer(arg["b"], b), b, p.batch)
    else:
        assert b_gather.fits(NR) and p.batch == 1 and not p.transpose_b and p.b_dtype == "f32", "see ColumnGather"
        B_t = memref_text((math.prod(b_gather.image.shape),), b_gather.image.dtype)
        B = t.op(f"memref.collapse_shape {t.to_buffer(arg['b'], b_gather.image)} [[0, 1, 2, 3]] : "
                 f"{memref_text(b_gather.image.shape, b_gather.image.dtype)} into {B_t}", "m")
    out = _Output(t, p, v, arg)
    kc_max, nc_max = min(p.kc, p.k), min(p.nc, p.n)
    mc_max = min(p.mc, p.m)
    ncp = -(-nc_max // NR) * NR
    mcp = -(-mc_max // MR) * MR
    a_block = mcp * (kc_max + A_PAD)
    n_mblocks = -(-p.m // p.mc)
    Bp_t, Ap_all_t = memref_text((kc_max * ncp,), "f32"), memref_text((n_mblocks * a_block,), "f32")
    Ap_t = f"memref<{a_block}xf32, strided<[1], offset: ?>>"
    zero = t.op("arith.constant 0.0 : f32", "z")
    zv = t.op(f"arith.constant dense<0.0> : {vf32}", "z")
    # All packing space is allocated once per call: a fresh malloc per block would be a fresh
    # mmap (these are large), page-faulted anew by every block under the kernel's memory lock.
    Bp = t.op(f"memref.alloc() {{alignment = 64 : i64}} : {Bp_t}", "m")
    # A f32 and row-major is read where it lies, its rows K apart: packing it was a pass of its
    # own (3 % of a 3x3 C256 conv's GEMM, 256x512x2304); reading it in place measured 1-7 % faster
    # on GEMMs of 256-4096 rows, K 500-8192 (K = 4096 too: rows whose L1 sets coincide), Zen 4.
    a_in_place = gather is None and not p.transpose_a and p.a_dtype == "f32"
    Ap_all = None if a_in_place else t.op(f"memref.alloc() {{alignment = 64 : i64}} : {Ap_all_t}", "m")
    # Strips of a conv whose pixels are inside the image are read from it directly (no copy):
    # per strip, MR row offsets into the flattened image and a flag (image_row_bases).
    segment = gather.direct_segment(kc_max, L) if gather is not None else None
    dyn_t = "memref<?xf32, strided<[1], offset: ?>>"
    if segment:
        strips = mcp // MR
        D_t = memref_text((n_mblocks * strips * (MR + 1),), "index")
        D = t.op(f"memref.alloc() {{alignment = 64 : i64}} : {D_t}", "m")
        flat_t = memref_text((math.prod(gather.image.shape),), "f32")
        flat = t.op(f"memref.collapse_shape {A} [[0, 1, 2, 3]] : {A_t} into {flat_t}", "m")
        image_dyn = t.op(f"memref.cast {flat} : {flat_t} to {dyn_t}", "m")

        def strip_slot() -> str:  # the table entry of the strip at (%ic, %ir)
            block = t.op(f"arith.divui %ic, {t.c(p.mc)} : index", "i")
            strip = t.add(t.mul(block, t.c(strips)), t.op(f"arith.divui %ir, {t.c(MR)} : index", "i"))
            return t.mul(strip, t.c(MR + 1))
    chunks = -(-ncp // p.n_chunk)
    T_all_t = memref_text((n_mblocks * chunks, MR, NR), "f32")  # edge tiles, one buffer per work item
    T_all = t.op(f"memref.alloc() {{alignment = 64 : i64}} : {T_all_t}", "m")

    def guarded_load(cond: str, mem: str, mem_t: str, idx: list[str], dtype: str) -> str:
        return t.load_f32_if(cond, mem, mem_t, idx, dtype, zero)

    t.for_("%bb", t.c(0), t.c(p.batch), t.c(1))
    b_batch = "%bb" if p.b_batched else t.c(0)
    a_batch = "%bb" if p.a_batched else t.c(0)
    t.for_("%jc", t.c(0), t.c(p.n), t.c(p.nc))
    # panels and K blocks of one size where they divide N and K: constants free registers
    nc = t.c(p.nc) if p.n % p.nc == 0 else t.min_(t.op(f"arith.subi {t.c(p.n)}, %jc : index", "i"), t.c(p.nc))
    t.for_("%pc", t.c(0), t.c(p.k), t.c(p.kc))
    kc = t.c(kc_max) if p.k % kc_max == 0 else t.min_(t.op(f"arith.subi {t.c(p.k)}, %pc : index", "i"), t.c(p.kc))
    out.k_block()

    # --- pack B: Bp[jr * kc + k * NR + c] = B[pc + k, jc + jr + c] ------------------------------
    def pack_b() -> None:
        """Pack the strip of NR columns at %jr."""
        boff = t.mul("%jr", kc)
        col0 = t.add("%jc", "%jr")
        if b_gather is not None:
            pack_b_from_image(t, b_gather, p, B, B_t, Bp, Bp_t, col0, boff, kc)
        elif p.transpose_b:  # B is [N, K]
            # Whole strips: L x L blocks (L columns' runs of L k's) loaded as vectors and transposed
            # in registers; the k remainder, and strips at the edge, element by element.
            full = t.cmp("sle", t.add(col0, t.c(NR)), t.c(p.n))
            t.open(f"scf.if {full}")
            kc_vec = t.mul(t.op(f"arith.divui {kc}, {t.c(L)} : index", "i"), t.c(L))
            vt_in = f"vector<{L}x{p.b_dtype}>"
            # L columns at a time down the whole K block: their L rows of B stream along k (all L
            # columns of a strip at once would be 2L streams a row of B apart, evicting each other)
            t.for_("%j", t.c(0), t.c(NR), t.c(L))  # a loop, not unrolled: one block's shuffles to compile
            t.for_("%k", t.c(0), kc_vec, t.c(L))
            rows = []
            for i in range(L):
                x = t.op(f"vector.load {B}[{b_batch}, {t.add(col0, t.add('%j', t.c(i)))}, {t.add('%pc', '%k')}] "
                         f": {B_t}, {vt_in}", "v")
                if p.b_dtype != "f32":
                    x = t.op(f"arith.extf {x} : {vt_in} to {vf32}", "v")
                rows.append(x)
            for i, row in enumerate(transpose_in_registers(t, rows)):
                dst = t.add(t.add(boff, t.mul(t.add("%k", t.c(i)), t.c(NR))), "%j")
                t.line(f"vector.store {row}, {Bp}[{dst}] : {Bp_t}, {vf32}")
            t.close()
            t.close()
            t.for_("%k", kc_vec, kc, t.c(1))
            t.for_("%cc", t.c(0), t.c(NR), t.c(1))
            x = t.load_f32(B, B_t, [b_batch, t.add(col0, "%cc"), t.add("%pc", "%k")], p.b_dtype)
            t.line(f"memref.store {x}, {Bp}[{t.add(t.add(boff, t.mul('%k', t.c(NR))), '%cc')}] : {Bp_t}")
            t.close()
            t.close()
            t.else_()
            t.for_("%cc", t.c(0), t.c(NR), t.c(1))
            col = t.add(col0, "%cc")
            inb = t.cmp("ult", col, t.c(p.n))
            t.for_("%k", t.c(0), kc, t.c(1))
            x = guarded_load(inb, B, B_t, [b_batch, col, t.add("%pc", "%k")], p.b_dtype)
            t.line(f"memref.store {x}, {Bp}[{t.add(t.add(boff, t.mul('%k', t.c(NR))), '%cc')}] : {Bp_t}")
            t.close()
            t.close()
            t.close()
        else:
            full = t.cmp("sle", t.add(col0, t.c(NR)), t.c(p.n))
            t.open(f"scf.if {full}")
            t.for_("%k", t.c(0), kc, t.c(1))
            row = t.add("%pc", "%k")
            dst = t.add(boff, t.mul("%k", t.c(NR)))
            vt_in = f"vector<{L}x{p.b_dtype}>"
            for j in range(nv):
                x = t.op(f"vector.load {B}[{b_batch}, {row}, {t.add(col0, t.c(j * L))}] : {B_t}, {vt_in}", "v")
                if p.b_dtype != "f32":
                    x = t.op(f"arith.extf {x} : {vt_in} to {vf32}", "v")
                t.line(f"vector.store {x}, {Bp}[{t.add(dst, t.c(j * L))}] : {Bp_t}, {vf32}")
            t.close()
            t.else_()
            t.for_("%k", t.c(0), kc, t.c(1))
            row = t.add("%pc", "%k")
            t.for_("%cc", t.c(0), t.c(NR), t.c(1))
            col = t.add(col0, "%cc")
            x = guarded_load(t.cmp("ult", col, t.c(p.n)), B, B_t, [b_batch, row, col], p.b_dtype)
            t.line(f"memref.store {x}, {Bp}[{t.add(t.add(t.mul('%k', t.c(NR)), boff), '%cc')}] : {Bp_t}")
            t.close()
            t.close()
            t.close()

    # With one M block each strip of B is read by one work item only: it packs the strip just
    # before its register tiles read it, from L1 (a separate pass would write the whole panel
    # out to L3 and read it back: a fifth of a 64x2048x2048 linear).
    pack_b_in_items = -(-p.m // p.mc) == 1
    if not pack_b_in_items:
        t.parallel("%jr", t.c(0), nc, t.c(NR))
        pack_b()
        t.close_parallel()

    # --- work items: (M block, column chunk) pairs in parallel ----------------------------------
    NB = p.n_chunk
    split = NB < ncp and not a_in_place  # several items share an M block: its A strips are packed beforehand

    def pack_a(mc: str, Ap: str, one_strip: bool = False) -> None:
        """Pack the `mc` rows of A at %ic into MR-tall strips at Ap (one_strip: only the strip at
        %ir). Non-transposed: each row's k-run is contiguous in A and stays so in the strip,
        Ap[(ir + r) * kc + k], copied a vector at a time. Transposed (A is [K, M]): the MR rows of
        a k are contiguous, Ap[ir * kc + k * MR + r]."""
        if not one_strip:
            t.for_("%ir", t.c(0), mc, t.c(MR))
        row0 = t.add("%ic", "%ir")
        if segment:
            t.open(f"scf.if {image_row_bases(t, gather, p, row0, D, D_t, strip_slot())}")
            t.else_()  # a strip that touches the padding: packed
            pack_a_from_image(t, gather, p, A, A_t, Ap, Ap_t, row0, kc, zero)
            t.close()
        elif gather is not None:
            pack_a_from_image(t, gather, p, A, A_t, Ap, Ap_t, row0, kc, zero)
        elif p.transpose_a:
            aoff = t.mul("%ir", kc)
            t.for_("%k", t.c(0), kc, t.c(1))
            t.for_("%r", t.c(0), t.c(MR), t.c(1))
            row = t.add(row0, "%r")
            x = guarded_load(t.cmp("ult", row, t.c(p.m)), A, A_t, [a_batch, t.add("%pc", "%k"), row], p.a_dtype)
            t.line(f"memref.store {x}, {Ap}[{t.add(t.add(aoff, t.mul('%k', t.c(MR))), '%r')}] : {Ap_t}")
            t.close()
            t.close()
        else:
            kc_vec = t.mul(t.op(f"arith.divui {kc}, {t.c(L)} : index", "i"), t.c(L))
            a_stride = t.add(kc, t.c(A_PAD))
            t.for_("%r", t.c(0), t.c(MR), t.c(1))
            row = t.add(row0, "%r")
            base = t.mul(t.add("%ir", "%r"), a_stride)
            t.open(f"scf.if {t.cmp('ult', row, t.c(p.m))}")
            t.for_("%k", t.c(0), kc_vec, t.c(L))
            vt_in = f"vector<{L}x{p.a_dtype}>"
            x = t.op(f"vector.load {A}[{a_batch}, {row}, {t.add('%pc', '%k')}] : {A_t}, {vt_in}", "v")
            if p.a_dtype != "f32":
                x = t.op(f"arith.extf {x} : {vt_in} to {vf32}", "v")
            t.line(f"vector.store {x}, {Ap}[{t.add(base, '%k')}] : {Ap_t}, {vf32}")
            t.close()
            t.for_("%k", kc_vec, kc, t.c(1))
            x = t.load_f32(A, A_t, [a_batch, row, t.add("%pc", "%k")], p.a_dtype)
            t.line(f"memref.store {x}, {Ap}[{t.add(base, '%k')}] : {Ap_t}")
            t.close()
            t.else_()
            t.for_("%k", t.c(0), kc, t.c(1))
            t.line(f"memref.store {zero}, {Ap}[{t.add(base, '%k')}] : {Ap_t}")
            t.close()
            t.close()
            t.close()
        if not one_strip:
            t.close()

    def a_block_view() -> tuple[str, str | None]:
        """The index of the M block at %ic and its packed strips (None: A is read in place)."""
        block = t.op(f"arith.divui %ic, {t.c(p.mc)} : index", "i")
        if a_in_place:
            return block, None
        return block, t.op(f"memref.subview {Ap_all}[{t.mul(block, t.c(a_block))}] [{a_block}] [1] : "
                           f"{Ap_all_t} to {Ap_t}", "m")

    if a_in_place:
        a_flat_t = memref_text((math.prod(a.shape),), "f32")
        a_flat = t.op(f"memref.collapse_shape {A} [[0, 1, 2]] : {A_t} into {a_flat_t}", "m")
    if split:  # one strip per work item: a single M block (few rows) is packed by all threads
        strips = mcp // MR
        t.parallel("%strip", t.c(0), t.c(n_mblocks * strips), t.c(1))
        t.line(f"%ic = arith.muli {t.op(f'arith.divui %strip, {t.c(strips)} : index', 'i')}, {t.c(p.mc)} : index")
        t.line(f"%ir = arith.muli {t.op(f'arith.remui %strip, {t.c(strips)} : index', 'i')}, {t.c(MR)} : index")
        mc = t.min_(t.op(f"arith.subi {t.c(p.m)}, %ic : index", "i"), t.c(p.mc))
        t.open(f"scf.if {t.cmp('ult', '%ir', mc)}")
        pack_a(mc, a_block_view()[1], one_strip=True)
        t.close()
        t.close_parallel()
    t.parallel_nd(["%ic", "%jb"], [t.c(0), t.c(0)], [t.c(p.m), nc], [t.c(p.mc), t.c(NB)])
    mc = t.min_(t.op(f"arith.subi {t.c(p.m)}, %ic : index", "i"), t.c(p.mc))
    block, Ap = a_block_view()
    if segment:
        Ap_dyn = t.op(f"memref.cast {Ap} : {Ap_t} to {dyn_t}", "m")
    item = t.add(t.mul(block, t.c(chunks)), t.op(f"arith.divui %jb, {t.c(NB)} : index", "i"))
    T_t = f"memref<{MR}x{NR}xf32, strided<[{NR}, 1], offset: ?>>"
    T = t.op(f"memref.subview {T_all}[{item}, 0, 0] [1, {MR}, {NR}] [1, 1, 1] : {T_all_t} to {T_t}", "m")
    if not split and not a_in_place:
        pack_a(mc, Ap)

    # --- register tiles -------------------------------------------------------------------------
    t.for_("%jr", "%jb", t.min_(t.add("%jb", t.c(NB)), nc), t.c(NR))
    if pack_b_in_items:
        pack_b()
    boff = t.mul("%jr", kc)
    t.for_("%ir", t.c(0), mc, t.c(MR))
    aoff = t.mul("%ir", kc)
    out.prefetch(t.add("%ic", "%ir"), t.add("%jc", "%jr"), MR, NR)
    # where the strip's rows are read (fma_step): A itself, the packed strip, or the image
    if a_in_place:  # rows past M read the last one: their results are not stored
        first = t.mul(a_batch, t.c(p.m))
        a_src = {"mem": a_flat, "type": a_flat_t, "rows": [
            t.add(t.mul(t.add(first, t.min_(t.add(t.add("%ic", "%ir"), t.c(r)), t.c(p.m - 1))), t.c(p.k)), "%pc")
            for r in range(MR)]}
    else:
        a_src = {"mem": Ap, "type": Ap_t, "rows": [] if p.transpose_a else
                 [t.mul(t.add("%ir", t.c(r)), t.add(kc, t.c(A_PAD))) for r in range(MR)]}

    def fma_step(k: str, accs: list[str]) -> list[str]:
        """One k of the register tile: NR/L vectors of B, MR broadcasts of A, MR*NR/L FMAs."""
        kb = t.add(boff, t.mul(k, t.c(NR)))
        bvec = [t.op(f"vector.load {Bp}[{t.add(kb, t.c(j * L))}] : {Bp_t}, {vf32}", "b") for j in range(nv)]
        if p.transpose_a:
            ka = t.add(aoff, t.mul(k, t.c(MR)))
            a_index = [t.add(ka, t.c(r)) for r in range(MR)]
        else:
            a_index = [t.add(row_base, k) for row_base in a_src["rows"]]
        new = []
        for r in range(MR):
            s = t.op(f"memref.load {a_src['mem']}[{a_index[r]}] : {a_src['type']}", "a")
            av = t.op(f"vector.broadcast {s} : f32 to {vf32}", "a")
            for j in range(nv):
                new.append(t.op(f"vector.fma {av}, {bvec[j]}, {accs[r * nv + j]} : {vf32}", "f"))
        return new

    if segment:
        acc = _direct_or_packed(t, gather, p, segment, strip_slot(), D, D_t, image_dyn, Ap_dyn, dyn_t, a_src, kc, [zv] * (MR * nv), vf32, fma_step)
    else:
        acc = t.reduction(t.c(0), kc, [zv] * (MR * nv), vf32, fma_step, unroll=k_unroll(p.k, p.kc), exact=True)

    row0 = t.add("%ic", "%ir")
    col0 = t.add("%jc", "%jr")
    full = t.cmp('sle', t.add(col0, t.c(NR)), t.c(p.n))  # all NR columns inside the result
    rows = t.c(MR) if p.m % MR == 0 else t.min_(t.op(f"arith.subi {t.c(p.m)}, {row0} : index", "i"), t.c(MR))

    # Without an epilogue, whole tiles go from the registers to C (with K = 16, a 1x1 conv of
    # 16 channels, the detour through T was a third of the work). Other tiles go to a small
    # L1-resident buffer, so the epilogue is written once per vector column inside a loop over
    # rows, not once per register (MR x fewer ops to compile).
    direct = not p.epilogue
    if direct:
        whole = full if p.m % MR == 0 else t.op(f"arith.andi {full}, {t.cmp('eq', rows, t.c(MR))} : i1", "i")
        t.open(f"scf.if {whole}")
        for r in range(MR):
            for j in range(nv):
                out.store_vector(acc[r * nv + j], t.add(row0, t.c(r)), t.add(col0, t.c(j * L)), f"d{r}_{j}")
        t.else_()
    for r in range(MR):
        for j in range(nv):
            t.line(f"vector.store {acc[r * nv + j]}, {T}[{t.c(r)}, {t.c(j * L)}] : {T_t}, {vf32}")
    t.open(f"scf.if {full}")
    out.store_rows(T, T_t, row0, col0, rows, nv)
    t.else_()  # tiles at the right edge
    out.store_elements(T, T_t, row0, col0, rows, t.min_(t.op(f"arith.subi {t.c(p.n)}, {col0} : index", "i"), t.c(NR)))
    t.close()
    if direct:
        t.close()
    t.close()  # ir
    t.close()  # jr
    t.close_parallel()  # ic, jb
    t.close()  # pc
    t.close()  # jc
    t.close()  # bb
    return t.function_text(name, params, out.full, v.result, location)


# How far ahead the inner-product kernel asks for B's rows with stages = 2 (6 lines: OpenBLAS's
# Haswell sgemv_t figure). In-process A/B on Zen 5, 1x2304x768 (B from L3), 4 rows of B at a
# time, 1 and 2 threads: 384 bytes 1.20-1.22x faster than no prefetch with AVX2 code and
# 1.06-1.07x with AVX-512; 768 bytes 1.17-1.19x with AVX2 code.
DOT_PREFETCH_BYTES = 384


def gemm_dot_kernel_text(name: str, v: OpView, location: str, threads: int = 1) -> str:
    """C = A B^T (B as nn.Linear stores weights, [N, K]) by inner products along K, for few rows:
    nothing is packed. Packing B costs a write and a read of all of B, which only pays when many
    row strips reuse it; with few rows the weights' one read from memory is the cost to beat.

        for each batch; work items (M block, column chunk) in parallel:
            for pc in K step KC:
                for each NR columns, for each MR rows: MR x NR vector accumulators, one vector.fma
                    per (row, column) per L k's (A rows and B rows both contiguous in k; the K
                    remainder is one masked step); each reduced to a scalar, the sums stored
                    with the epilogue on the last K block.

    Rows and columns past the edges load the last row / column instead (their sums are dropped),
    so edge tiles need no separate path. schedule: tile [MC, NC, KC], warp_tile [MR, NR, lanes];
    stages 2 asks for each row of B DOT_PREFETCH_BYTES ahead of its use (1: the hardware
    prefetchers alone, which keep up where B streams from memory)."""
    p = GemmPlan.from_view(v, threads)
    ahead_of_use = v.attrs["schedule"].stages >= 2
    t = LoopText(serial=threads == 1)
    L, MR, NR = p.lanes, p.mr, p.nr
    vf32 = f"vector<{L}xf32>"
    a, b = v.operands["a"], v.operands["b"]
    params = ", ".join(f"%arg{i}: {spec}" for i, spec in enumerate(v.operands.values()))
    arg = {n: f"%arg{i}" for i, n in enumerate(v.operands)}
    A, A_t = t.batched_view(t.to_buffer(arg["a"], a), a, p.batch)
    B, B_t = t.batched_view(t.to_buffer(arg["b"], b), b, p.batch)
    out = _Output(t, p, v, arg)
    NB = p.n_chunk
    chunks = -(-p.n // NB)
    T_all_t = memref_text((-(-p.m // p.mc) * chunks, MR, NR), "f32")  # the sums of a tile, one buffer per work item
    T_all = t.op(f"memref.alloc() {{alignment = 64 : i64}} : {T_all_t}", "m")
    T_t = f"memref<{MR}x{NR}xf32, strided<[{NR}, 1], offset: ?>>"
    zv = t.op(f"arith.constant dense<0.0> : {vf32}", "z")

    def load(mem: str, mem_t: str, batch: str, row: str, k: str, dtype: str, mask: str | None) -> str:
        vt = f"vector<{L}x{dtype}>"
        if mask is None:
            x = t.op(f"vector.load {mem}[{batch}, {row}, {k}] : {mem_t}, {vt}", "v")
        else:
            zero_in = zv if dtype == "f32" else t.op(f"arith.constant dense<0.0> : {vt}", "z")
            x = t.op(f"vector.maskedload {mem}[{batch}, {row}, {k}], {mask}, {zero_in} : {mem_t}, "
                     f"vector<{L}xi1>, {vt} into {vt}", "v")
        return x if dtype == "f32" else t.op(f"arith.extf {x} : {vt} to {vf32}", "v")

    def products(accs: list[str], k: str, mask: str | None, prefetch: bool = False) -> list[str]:
        """accs + the products of the L k's at pc + k (masked: only the first `mask` of them);
        with `prefetch`, B's rows DOT_PREFETCH_BYTES ahead are asked for."""
        kk = t.add("%pc", k)
        av = [load(Ap, Ap_t, t.c(0), arow, kk, "f32", mask) for arow in a_rows]
        new = list(accs)
        for c in range(NR):
            if prefetch:  # past a row's end it is the next row's start (or past B: a hint, no fault)
                ahead = t.add(kk, t.c(DOT_PREFETCH_BYTES // b_bytes))
                t.line(f"memref.prefetch {B}[{b_batch}, {b_cols[c]}, {ahead}], read, locality<3>, data : {B_t}")
            bv = load(B, B_t, b_batch, b_cols[c], kk, p.b_dtype, mask)
            for r in range(MR):
                new[r * NR + c] = t.op(f"vector.fma {av[r]}, {bv}, {new[r * NR + c]} : {vf32}", "f")
        return new

    # A's rows are copied A_PAD floats apart: rows a power of two apart would share L1 sets
    # with each other and with B's rows, more of them than the cache has ways.
    a_stride = -(-p.k // L) * L + A_PAD
    b_bytes = to_numpy(p.b_dtype).itemsize
    Ap_t = memref_text((1, p.m, a_stride), "f32")
    Ap = t.op(f"memref.alloc() {{alignment = 64 : i64}} : {Ap_t}", "m")
    k_vec = p.k // L * L

    t.for_("%bb", t.c(0), t.c(p.batch), t.c(1))
    b_batch = "%bb" if p.b_batched else t.c(0)
    a_batch = "%bb" if p.a_batched else t.c(0)
    t.parallel("%ar", t.c(0), t.c(p.m), t.c(1))
    t.for_("%k", t.c(0), t.c(k_vec), t.c(L))
    t.line(f"vector.store {load(A, A_t, a_batch, '%ar', '%k', p.a_dtype, None)}, {Ap}[{t.c(0)}, %ar, %k] "
           f": {Ap_t}, {vf32}")
    t.close()
    t.for_("%k", t.c(k_vec), t.c(p.k), t.c(1))
    t.line(f"memref.store {t.load_f32(A, A_t, [a_batch, '%ar', '%k'], p.a_dtype)}, {Ap}[{t.c(0)}, %ar, %k] : {Ap_t}")
    t.close()
    t.close_parallel()
    t.parallel_nd(["%ic", "%jb"], [t.c(0), t.c(0)], [t.c(p.m), t.c(p.n)], [t.c(p.mc), t.c(NB)])
    item = t.add(t.mul(t.op(f"arith.divui %ic, {t.c(p.mc)} : index", "i"), t.c(chunks)),
                 t.op(f"arith.divui %jb, {t.c(NB)} : index", "i"))
    T = t.op(f"memref.subview {T_all}[{item}, 0, 0] [1, {MR}, {NR}] [1, 1, 1] : {T_all_t} to {T_t}", "m")
    t.for_("%pc", t.c(0), t.c(p.k), t.c(p.kc))
    out.k_block()
    kc = t.min_(t.op(f"arith.subi {t.c(p.k)}, %pc : index", "i"), t.c(p.kc))
    kc_vec = t.mul(t.op(f"arith.divui {kc}, {t.c(L)} : index", "i"), t.c(L))
    t.for_("%jr", "%jb", t.min_(t.add("%jb", t.c(NB)), t.c(p.n)), t.c(NR))
    b_cols = [t.min_(t.add("%jr", t.c(c)), t.c(p.n - 1)) for c in range(NR)]
    t.for_("%ir", "%ic", t.min_(t.add("%ic", t.c(p.mc)), t.c(p.m)), t.c(MR))
    a_rows = [t.min_(t.add("%ir", t.c(r)), t.c(p.m - 1)) for r in range(MR)]
    # B streams from memory: a cache line of each of its NR rows an iteration, the first step
    # asking for the line DOT_PREFETCH_BYTES ahead (1 or 2 steps; 4 measured no faster)
    line = max(1, 64 // (L * b_bytes))
    whole = t.mul(t.op(f"arith.divui {kc_vec}, {t.c(line * L)} : index", "i"), t.c(line * L))

    def line_of_steps(k: str, accs: list[str]) -> list[str]:
        for u in range(line):
            accs = products(accs, t.add(k, t.c(u * L)) if u else k, None, prefetch=u == 0 and ahead_of_use)
        return accs
    acc = t.carried_for(t.c(0), whole, t.c(line * L), [zv] * (MR * NR), vf32, line_of_steps)
    if line > 1:
        acc = t.carried_for(whole, kc_vec, t.c(L), acc, vf32, lambda k, accs: products(accs, k, None))
    if p.k % L or p.kc % L:  # a K block can end in a partial vector of k's
        mask = t.op(f"vector.create_mask {t.op(f'arith.subi {kc}, {kc_vec} : index', 'i')} : vector<{L}xi1>", "p")
        acc = products(acc, kc_vec, mask)
    for i, x in enumerate(acc):
        total = t.op(f"vector.reduction <add>, {x} fastmath<reassoc> : {vf32} into f32", "s")
        t.line(f"memref.store {total}, {T}[{t.c(i // NR)}, {t.c(i % NR)}] : {T_t}")
    rows = t.min_(t.op(f"arith.subi {t.c(p.m)}, %ir : index", "i"), t.c(MR))
    if p.n % NR == 0:  # whole rows of NR columns: the epilogue on vectors
        out.store_rows(T, T_t, "%ir", "%jr", rows, 1, width=NR)
    else:
        cols = t.min_(t.op(f"arith.subi {t.c(p.n)}, %jr : index", "i"), t.c(NR))
        out.store_elements(T, T_t, "%ir", "%jr", rows, cols)
    t.close()  # ir
    t.close()  # jr
    t.close()  # pc
    t.close_parallel()  # ic, jb
    t.close()  # bb
    return t.function_text(name, params, out.full, v.result, location)


# B rows streamed per pass of gemm_rows_kernel_text: each element of its sums buffer is loaded and
# stored once per ROWS_K_STEPS rows of B. In-process A/B, Zen 4, 1 thread, 8 against 4: 1 row
# 1.01-1.15x (1x50257x768 from memory: 8.06 -> 6.98 ms, numpy 7.47), 4-8 rows 1.07-1.30x; 16
# slower (0.5-0.9x); held to AVX2, 0.96-1.09x.
ROWS_K_STEPS = 8


def gemm_rows_kernel_text(name: str, v: OpView, location: str, threads: int = 1) -> str:
    """C = A B with B as it lies ([K, N], x @ W: GPT-2's Conv1D, a decoding step's projections)
    for a few rows of A: nothing is packed, and B is read once, row after row. With one row the
    packed kernel packed all of B to use each strip once (M = 1, 768 x 3072: 0.23x torch).

        for each batch; column chunks of NB in parallel:
            sums[M, NB] = 0 (an L1-sized buffer)
            for k in K step ROWS_K_STEPS: for each vector of the chunk's columns:
                sums[r] += A[r, k + u] * B[k + u, cols] for the rows r and the steps u
            the epilogue on sums, stored to C

    B's rows are read in order, a chunk's width at a time, so the hardware prefetchers stream
    them; the sums stay in L1. schedule: tile [NB] (a multiple of the SIMD lanes)."""
    a, b = v.operands["a"], v.operands["b"]
    s = v.attrs["schedule"]
    L, NB = s.lane_map.shape[-1], s.tile[0]
    m, n = v.result.shape[-2:]
    k = a.shape[-1]
    batch = math.prod(v.result.shape[:-2])
    p = GemmPlan(batch, m, n, k, False, False, b.rank == v.result.rank, a.dtype, b.dtype, v.result.dtype,
                 tuple(v.attrs.get("epilogue", ())), v.operands["bias"].dtype if "bias" in v.operands else None,
                 v.operands["residual"].dtype if "residual" in v.operands else None,
                 m, NB, m, NB, k, L, threads, a.rank == v.result.rank, v.attrs.get("row_bias", False))
    t = LoopText(serial=threads == 1)
    vf32 = f"vector<{L}xf32>"
    params = ", ".join(f"%arg{i}: {spec}" for i, spec in enumerate(v.operands.values()))
    arg = {name_: f"%arg{i}" for i, name_ in enumerate(v.operands)}
    A, A_t = t.batched_view(t.to_buffer(arg["a"], a), a, batch)
    B, B_t = t.batched_view(t.to_buffer(arg["b"], b), b, batch)
    out = _Output(t, p, v, arg)  # one K block (kc = K): the epilogue on the only one
    chunks = -(-n // NB)
    S_all_t = memref_text((chunks, m, NB), "f32")  # each chunk's sums
    S_all = t.op(f"memref.alloc() {{alignment = 64 : i64}} : {S_all_t}", "m")
    S_t = f"memref<{m}x{NB}xf32, strided<[{NB}, 1], offset: ?>>"
    zv = t.op(f"arith.constant dense<0.0> : {vf32}", "z")

    def b_vector(row: str, col: str, mask: str | None) -> str:
        vt = f"vector<{L}x{p.b_dtype}>"
        if mask is None:
            x = t.op(f"vector.load {B}[{b_batch}, {row}, {col}] : {B_t}, {vt}", "b")
        else:
            zero = zv if p.b_dtype == "f32" else t.op(f"arith.constant dense<0.0> : {vt}", "z")
            x = t.op(f"vector.maskedload {B}[{b_batch}, {row}, {col}], {mask}, {zero} : {B_t}, "
                     f"vector<{L}xi1>, {vt} into {vt}", "b")
        return x if p.b_dtype == "f32" else t.op(f"arith.extf {x} : {vt} to {vf32}", "b")

    def accumulate(k0: str, steps: int, col: str, mask: str | None, a_row: list[list[str]]) -> None:
        """sums[:, col] += the products of `steps` rows of B from k0 (one vector of columns)."""
        bv = [b_vector(t.add(k0, t.c(u)), t.add("%jb", col), mask) for u in range(steps)]
        for r in range(m):
            acc = t.op(f"vector.load {S}[{t.c(r)}, {col}] : {S_t}, {vf32}", "s")
            for u in range(steps):
                acc = t.op(f"vector.fma {a_row[r][u]}, {bv[u]}, {acc} : {vf32}", "s")
            t.line(f"vector.store {acc}, {S}[{t.c(r)}, {col}] : {S_t}, {vf32}")

    def rows_of_b(k0: str, steps: int) -> None:
        """`steps` rows of B from k0 into the chunk's sums."""
        a_row = [[t.op(f"vector.broadcast {t.load_f32(A, A_t, [a_batch, t.c(r), t.add(k0, t.c(u))], p.a_dtype)} "
                       f": f32 to {vf32}", "a") for u in range(steps)] for r in range(m)]
        t.for_("%j", t.c(0), whole, t.c(L))
        accumulate(k0, steps, "%j", None, a_row)
        t.close()
        if n % L:  # the last chunk ends in a partial vector
            t.open(f"scf.if {t.cmp('slt', whole, width)}")
            accumulate(k0, steps, whole, tail_mask, a_row)
            t.close()

    t.for_("%bb", t.c(0), t.c(batch), t.c(1))
    b_batch = "%bb" if p.b_batched else t.c(0)
    a_batch = "%bb" if p.a_batched else t.c(0)
    t.parallel("%jb", t.c(0), t.c(n), t.c(NB))
    S = t.op(f"memref.subview {S_all}[{t.op(f'arith.divui %jb, {t.c(NB)} : index', 'i')}, 0, 0] [1, {m}, {NB}] "
             f"[1, 1, 1] : {S_all_t} to {S_t}", "m")
    width = t.min_(t.op(f"arith.subi {t.c(n)}, %jb : index", "i"), t.c(NB))
    whole = t.mul(t.op(f"arith.divui {width}, {t.c(L)} : index", "i"), t.c(L))
    tail_mask = t.op(f"vector.create_mask {t.op(f'arith.subi {width}, {whole} : index', 'i')} : vector<{L}xi1>",
                     "p") if n % L else None
    t.for_("%z", t.c(0), t.c(NB), t.c(L))
    for r in range(m):
        t.line(f"vector.store {zv}, {S}[{t.c(r)}, %z] : {S_t}, {vf32}")
    t.close()
    steps_end = k // ROWS_K_STEPS * ROWS_K_STEPS
    if steps_end:
        t.for_("%k", t.c(0), t.c(steps_end), t.c(ROWS_K_STEPS))
        rows_of_b("%k", ROWS_K_STEPS)
        t.close()
    if k % ROWS_K_STEPS:
        t.for_("%kt", t.c(steps_end), t.c(k), t.c(1))
        rows_of_b("%kt", 1)
        t.close()
    # the epilogue, a vector at a time, then the partial vector's columns one by one
    t.for_("%er", t.c(0), t.c(m), t.c(1))
    t.for_("%ej", t.c(0), whole, t.c(L))
    value = t.op(f"vector.load {S}[%er, %ej] : {S_t}, {vf32}", "x")
    out.store_vector(value, "%er", t.add("%jb", "%ej"), "v")
    t.close()
    t.close()  # er
    if n % L:
        tail_t = f"memref<{m}x{L}xf32, strided<[{NB}, 1], offset: ?>>"
        tail = t.op(f"memref.subview {S}[0, {whole}] [{m}, {L}] [1, 1] : {S_t} to {tail_t}", "m")
        out.store_elements(tail, tail_t, t.c(0), t.add("%jb", whole), t.c(m),
                           t.op(f"arith.subi {width}, {whole} : index", "i"))
    t.close_parallel()  # jb
    t.close()  # bb
    return t.function_text(name, params, out.full, v.result, location)
