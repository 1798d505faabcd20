"""The CPU's direct NCHW convolution: no im2col, no transposes.

Each input channel is copied once, zero-padded, into `stride_h x stride_w` phase planes (plane
(ph, pw) holds the padded pixels whose row is ph and column pw modulo the stride), each plane
laid out with a row pitch of Ws = ceil(padded width / stride_w). Output pixel (oh, ow) becomes
the flat position q = oh * Ws + ow, and its tap (kh, kw) reads plane ((dh kh) % sh, (dw kw) % sw)
at q + ((dh kh) // sh) * Ws + (dw kw) // sw: for every stride and dilation, consecutive output
positions read consecutive plane elements. The kernel is then a GEMM-like register tile:

    for each (image, block of MR filters, run of position segments), in parallel:
        for each segment of NV vectors of positions:
            acc[MR][NV] = 0
            for c, kh:  for kw (unrolled):  x[v] = plane[q0 + offset + v L]  (NV vector loads)
                                             acc[r][v] += w[r, c, kh, kw] * x[v]  (broadcast)
            (+ bias) -> a position-major scratch output
    copy the valid positions (ow < OW of each row) to the NCHW output

The Ws - OW positions per row that wrap into the next row are computed and dropped (for a 3x3
conv on 56 x 56: 2 of 58). The filter is packed per call as [K / MR][C][KH][KW][MR], zero rows
past K.
"""
from __future__ import annotations

from ...dialects.ops import Conv2dDef, OpView
from ...dialects.schedule import LaneMap, Schedule
from ...errors import OpError
from ...codegen.kernel_text import fused_epilogue
from ...codegen.loop_text import LoopText, busiest_thread, memref_text


# Filter columns written out in the kernel; wider filters loop over them. Looping over the 7
# columns of the 7x7 stem (address arithmetic and a short trip count per filter row) ran it at
# 0.72x torch on AVX2, written out at 0.96x.
UNROLLED_TAPS = 7


def register_tile(filters: int, accumulators: int, positions: int = 0, lanes: int = 1) -> tuple[int, int]:
    """(MR filters, NV position vectors) for at most `accumulators` accumulator registers (the
    caller leaves a quarter of the vector registers for the loads and the broadcast): few
    padded filter rows, and few loads per FMA: NV / (MR NV) vector loads, unaligned (often split
    across two cache lines, so counted twice), and MR / (MR NV) broadcasts. On the 3x3 C64 conv
    8 x 3 ran 175 GFLOP/s on 2 threads, 6 x 4 the same, 4 x 6 131, 12 x 2 139, 3 x 8 108 (AVX-512);
    with AVX2's 16 registers, 12 accumulators (4 x 3) ran it at 0.98x torch, 8 (4 x 2) at 0.85x."""
    tiles = [(mr, nv) for mr in range(1, 13) for nv in range(1, 9)
             if accumulators * 2 // 3 <= mr * nv <= accumulators]
    # the positions of an image, padded to whole segments of NV vectors, count too: on 8x8
    # images (80 positions with the row wrap) 4 x 3 computes 96 of them, 6 x 2 80
    def cost(t):
        segment = t[1] * lanes
        return -(-filters // t[0]) * t[0] * -(-max(positions, 1) // segment) * segment * (1 + 2 / t[0] + 1 / t[1])
    return min(tiles, key=lambda t: (cost(t), -t[1]))


def copy_run(t: LoopText, n: int, L: int, iv: str, source, dest) -> None:
    """Copy `n` contiguous f32 elements a vector at a time, only the last, partial vector masked
    (masked moves are slow: a loop of them was 28 % of the 7x7 stem). source(col) and dest(col)
    give the memref access (text, memref type) at element `col` of the run."""
    vt, mt = f"vector<{L}xf32>", f"vector<{L}xi1>"
    full = n // L * L
    if full:
        t.for_(iv, t.c(0), t.c(full), t.c(L))
        (src, src_t), (dst, dst_t) = source(iv), dest(iv)
        t.line(f"vector.store {t.op(f'vector.load {src} : {src_t}, {vt}', 'x')}, {dst} : {dst_t}, {vt}")
        t.close()
    if full < n:
        mask = t.op(f"vector.constant_mask [{n - full}] : {mt}", "k")
        zv = t.op(f"arith.constant dense<0.0> : {vt}", "z")
        (src, src_t), (dst, dst_t) = source(t.c(full)), dest(t.c(full))
        x = t.op(f"vector.maskedload {src}, {mask}, {zv} : {src_t}, {mt}, {vt} into {vt}", "x")
        t.line(f"vector.maskedstore {dst}, {mask}, {x} : {dst_t}, {mt}, {vt}")


def activate(t: LoopText, v: OpView, value: str, lanes: int) -> str:
    """The conv's epilogue steps (none take operands) on an f32 vector before its store."""
    steps = v.attrs["epilogue"]
    if not steps:
        return value
    lines, value = fused_epilogue(value, steps, {}, "f32", lanes, t.fresh("ep") + "_")
    for line in lines:
        t.line(line)
    return value


# Elements of an image channel's phase planes below which they are zeroed whole rather than
# around the pixels (the 14x14 planes of a 5x5 stride-2 conv: a few vector stores)
SMALL_PLANES = 1024

# Narrowest vectors a stride-2 copy splits into its two column planes (a 14-pixel row: two pairs of 4)
MIN_SPLIT_LANES = 4


def copy_to_phase_planes(t: LoopText, X: str, X_t: str, XS: str, XS_t: str, hw: tuple[int, int],
                         top_left: tuple[int, int], stride: tuple[int, int], ws: int, plane: int, L: int) -> None:
    """Image %n's channel %ch zero-padded into its phase planes XS[%nc] (pitch ws, `plane`
    elements each)."""
    (h, w), (top, left), (sh, sw) = hw, top_left, stride
    vt = f"vector<{L}xf32>"
    zv = t.op(f"arith.constant dense<0.0> : {vt}", "z")
    gap_vectors = -(-(ws - w) // L)  # a row's right padding and the next one's left, in vectors
    if (sh, sw) == (1, 1) and (top + h - 2) * ws + left + w + gap_vectors * L <= plane:
        # only the padding is zeroed (a whole 112 x 112 plane took 5 % of MobileNetV3's time in
        # memset); these stores may spill into pixels, which the copies below then write
        def zeros(lo: int, hi: int) -> None:
            t.for_("%i", t.c(lo), t.c(hi), t.c(L))
            t.line(f"vector.store {zv}, {XS}[%nc, {t.c(0)}, %i] : {XS_t}, {vt}")
            t.close()

        zeros(0, -(-(top * ws + left) // L) * L)
        if gap_vectors and h > 1:
            t.for_("%r", t.c(0), t.c(h - 1), t.c(1))
            start = t.add(t.mul(t.add("%r", t.c(top)), t.c(ws)), t.c(left + w))
            for j in range(gap_vectors):
                t.line(f"vector.store {zv}, {XS}[%nc, {t.c(0)}, {t.add(start, t.c(j * L))}] : {XS_t}, {vt}")
            t.close()
        zeros(((top + h - 1) * ws + left + w) // L * L, plane)
    elif sh * sw * plane <= SMALL_PLANES:  # whole vectors: fewer and shorter loops
        t.for_("%p", t.c(0), t.c(sh * sw), t.c(1))
        t.for_("%i", t.c(0), t.c(plane), t.c(L))
        t.line(f"vector.store {zv}, {XS}[%nc, %p, %i] : {XS_t}, {vt}")
        t.close()
        t.close()
    else:
        _zero_plane_padding(t, XS, XS_t, (h, w), (top, left), (sh, sw), ws, plane, L)
    t.for_("%ih", t.c(0), t.c(h), t.c(1))
    hp = t.add("%ih", t.c(top))
    ph = t.op(f"arith.remui {hp}, {t.c(sh)} : index", "i")
    row = t.mul(t.op(f"arith.divui {hp}, {t.c(sh)} : index", "i"), t.c(ws))
    if sw == 1:  # rows stay contiguous
        copy_run(t, w, L, "%iw", lambda col: (f"{X}[%n, %ch, %ih, {col}]", X_t),
                 lambda col: (f"{XS}[%nc, {ph}, {t.add(row, t.add(col, t.c(left)))}]", XS_t))
    else:  # columns go to sw planes in turn
        start = 0
        V = L  # lanes of the split: the widest vector whose pair fits in a row
        while V > MIN_SPLIT_LANES and w < 2 * V:
            V //= 2
        if sw == 2 and w >= 2 * V:
            # 2V columns at a time: the even ones to one plane, the odd ones to the other, as
            # whole vectors (the element-wise copy was 70 % of a stride-2 depthwise conv); the
            # row's last 2V columns once more, overlapping, instead of one by one
            def split(iw: str, odd: int) -> None:  # columns iw .. iw + 2V - 1; iw's parity is `odd`
                wt = f"vector<{V}xf32>"
                pair = [t.op(f"vector.load {X}[%n, %ch, %ih, {t.add(iw, t.c(j * V))}] : {X_t}, {wt}", "x")
                        for j in range(2)]
                half = t.add(row, t.op(f"arith.divui {iw}, {t.c(2)} : index", "i"))  # (iw - odd) / 2
                for parity in range(2):
                    picked = ", ".join(str(2 * i + parity) for i in range(V))
                    xv = t.op(f"vector.shuffle {pair[0]}, {pair[1]} [{picked}] : {wt}, {wt}", "x")
                    q = left + odd + parity
                    p = t.add(t.mul(ph, t.c(2)), t.c(q % 2))
                    t.line(f"vector.store {xv}, {XS}[%nc, {p}, {t.add(half, t.c(q // 2))}] : {XS_t}, {wt}")

            whole = w // (2 * V) * 2 * V
            t.for_("%iw", t.c(0), t.c(whole), t.c(2 * V))
            split("%iw", 0)
            t.close()
            if whole < w:
                split(t.c(w - 2 * V), (w - 2 * V) % 2)
            start = w
        for phase in range(sw):  # the other columns one by one, a loop per plane (no divisions)
            first = start + (phase - left - start) % sw
            if first >= w:
                continue
            t.for_("%j", t.c(0), t.c(-(-(w - first) // sw)), t.c(1))
            iw = t.add(t.mul("%j", t.c(sw)), t.c(first))
            at = t.add(t.add(row, "%j"), t.c((first + left) // sw))
            x = t.op(f"memref.load {X}[%n, %ch, %ih, {iw}] : {X_t}", "x")
            t.line(f"memref.store {x}, {XS}[%nc, {t.add(t.mul(ph, t.c(sw)), t.c(phase))}, {at}] : {XS_t}")
            t.close()
    t.close()


def _zero_plane_padding(t: LoopText, XS: str, XS_t: str, hw: tuple[int, int], top_left: tuple[int, int],
                        stride: tuple[int, int], ws: int, plane: int, L: int) -> None:
    """Zero what the copies of a strided conv's phase planes XS[%nc] leave: in each plane, the
    rows above and below the image and, in the rows between, the columns left and right of it
    (a whole plane zeroed took 5 % of MobileNetV3's time in memset)."""
    (h, w), (top, left), (sh, sw) = hw, top_left, stride
    zero = t.op("arith.constant 0.0 : f32", "z")

    def first(bound: int, phase: str, step: int) -> str:
        """The first plane row (column) whose padded coordinate phase + step * i is >= bound."""
        i = t.op(f"arith.ceildivsi {t.op(f'arith.subi {t.c(bound)}, {phase} : index', 'i')}, {t.c(step)} : index", "i")
        return t.op(f"arith.maxsi {i}, {t.c(0)} : index", "i")

    def zeros(lo: str, hi: str) -> None:
        t.for_("%i", lo, hi, t.c(1))
        t.line(f"memref.store {zero}, {XS}[%nc, %p, %i] : {XS_t}")
        t.close()

    t.for_("%p", t.c(0), t.c(sh * sw), t.c(1))
    ph = t.op(f"arith.divui %p, {t.c(sw)} : index", "i")
    pw = t.op(f"arith.remui %p, {t.c(sw)} : index", "i")
    r0, r1 = first(top, ph, sh), first(top + h, ph, sh)  # the image's rows in this plane: [r0, r1)
    c0, c1 = first(left, pw, sw), first(left + w, pw, sw)
    inside = t.op(f"arith.andi {t.cmp('slt', r0, r1)}, {t.cmp('slt', c0, c1)} : i1", "i")
    last_row = t.op(f"arith.subi {r1}, {t.c(1)} : index", "i")

    def where(value: str, otherwise: str) -> str:  # a plane without pixels is zeroed whole
        return t.op(f"arith.select {inside}, {value}, {otherwise} : index", "i")
    zeros(t.c(0), where(t.add(t.mul(r0, t.c(ws)), c0), t.c(plane)))
    t.for_("%r", r0, where(last_row, r0), t.c(1))
    gap_start, gap_end = t.add(t.mul("%r", t.c(ws)), c1), t.add(t.mul(t.add("%r", t.c(1)), t.c(ws)), c0)
    stores = -(-(ws - w // sw) // L)  # vectors that cover the widest gap between two rows' pixels
    if stores * L <= ws:  # whole vectors, which may spill into the next row's pixels (copied after)
        zv = t.op(f"arith.constant dense<0.0> : vector<{L}xf32>", "z")
        for j in range(stores):
            t.line(f"vector.store {zv}, {XS}[%nc, %p, {t.add(gap_start, t.c(j * L))}] : {XS_t}, vector<{L}xf32>")
    else:
        zeros(gap_start, gap_end)
    t.close()
    zeros(where(t.add(t.mul(last_row, t.c(ws)), c1), t.c(plane)), t.c(plane))
    t.close()


def nchw_geometry(v: OpView):
    """(input, filter, bias or None, output), the input's (N, C, H, W), the filter's (K, KH, KW),
    the output's (OH, OW), stride, dilation, pads (top, bottom, left, right) of an NCHW conv."""
    x, f, out = v.operands["input"], v.operands["filter"], v.result
    return ((x, f, v.operands.get("bias"), out), x.shape, (f.shape[0],) + f.shape[2:], out.shape[2:],
            tuple(v.attrs["stride"]), tuple(v.attrs["dilation"]), Conv2dDef.pads(v.attrs))


def _conv_params(x, f, bias) -> str:
    """A conv kernel's parameters: input, filter and the bias when there is one."""
    return ", ".join(f"%arg{i}: {spec}" for i, spec in enumerate([x, f] + ([bias] if bias is not None else [])))


def direct_nchw_schedule(v: OpView, lanes: int, accumulators: int, threads: int,
                         l2_bytes: int = 512 * 1024) -> Schedule:
    """The direct kernel's default: warp_tile = [MR filters, NV vectors of positions] (the
    register tile), tile = [MR, positions per work item] (a run of whole segments of NV vectors)."""
    (_, _, _, _), (n, c, h, w), (k, kh_n, _), (oh_n, _), (sh, sw), (dh, _), pads = nchw_geometry(v)
    ws = -(-(w + pads[2] + pads[3]) // sw)
    MR, NV = register_tile(k, accumulators, oh_n * ws, lanes)
    seg = NV * lanes
    q_segs = -(-oh_n * ws // seg)
    # about 8 tasks per thread (for balance), each a run of segments for one filter block
    q_tasks = min(q_segs, -(-threads * 8 // (n * -(-k // MR))))
    per_task = -(-q_segs // q_tasks)
    # A run's input rows (all channels and phases) stay in half of L2 while every filter block
    # reads them in turn (tasks ordered filter block fastest): a 3x3 stride-2 conv's 128
    # channels of 32x32 pixels are 640 KB of planes, streamed from L3 once per filter block
    rows = max(1, l2_bytes // 2 // (c * sh * sw * ws * 4) - (kh_n - 1) * dh // sh - 1)
    per_task = max(1, min(per_task, rows * ws // seg))
    # Up to twice as many runs, for the split whose busiest thread runs the fewest segments (tasks
    # are numbered filter block fastest, each thread gets an equal run of them): runs of 33
    # segments and a last of 4 had left one of 2 threads 1,320 segments and the other 856 (3x3
    # C64 56x56 on AVX2: 0.84x torch on 2 threads)
    fewest, blocks = -(-q_segs // per_task), -(-k // MR)

    def busiest(runs: int) -> int:
        per = -(-q_segs // runs)
        return busiest_thread([min(per, q_segs - s) for _ in range(n) for s in range(0, q_segs, per)
                               for _ in range(blocks)], threads)
    per_task = -(-q_segs // min(range(fewest, min(q_segs, 2 * fewest) + 1), key=busiest))
    return Schedule(tile=(MR, per_task * seg), warp_tile=(MR, seg), lane_map=LaneMap("simd", (lanes,)))


def check_direct_nchw_schedule(s: Schedule, registers: int) -> None:
    """Raises OpError naming what the direct kernel cannot run of `s`."""
    lanes = s.lane_map.shape[-1] if s.lane_map is not None else 0
    if (s.warp_tile is None or s.tile is None or len(s.warp_tile) != 2 or len(s.tile) != 2 or not lanes
            or s.warp_tile[1] % lanes or s.tile[0] != s.warp_tile[0] or s.tile[1] % s.warp_tile[1]):
        raise OpError("the direct NCHW conv kernel's schedule is warp_tile = [MR filters, NV * lanes positions] "
                      "(the register tile), tile = [MR, a multiple of the register tile's positions] (a work "
                      f"item's run), lane_map simd; got tile {s.tile}, warp_tile {s.warp_tile}, lanes {lanes or None}")
    mr, nv = s.warp_tile[0], s.warp_tile[1] // lanes
    if mr * nv + 2 > registers:
        raise OpError(f"direct conv register tile {mr} filters x {nv} vectors needs {mr * nv + 2} vector "
                      f"registers (accumulators, a load, a broadcast); this CPU has {registers}")


def conv_nchw_kernel_text(name: str, v: OpView, location: str, schedule: Schedule, threads: int = 1) -> str:
    (x, f, bias, out), (n, c, h, w), (k, kh_n, kw_n), (oh_n, ow_n), (sh, sw), (dh, dw), pads = nchw_geometry(v)
    top, bottom, left, right = pads
    L = schedule.lane_map.shape[-1]
    hs, ws = -(-(h + top + bottom) // sh), -(-(w + left + right) // sw)  # a phase plane's rows, pitch
    q_n = oh_n * ws
    MR, NV = schedule.warp_tile[0], schedule.warp_tile[1] // L
    seg = NV * L
    kb_n = -(-k // MR)
    qpad = -(-q_n // seg) * seg
    last_read = qpad - 1 + ((kh_n - 1) * dh // sh) * ws + (kw_n - 1) * dw // sw
    plane = -(-max(last_read + 1, hs * ws) // L) * L
    phases = sh * sw
    vt = f"vector<{L}xf32>"
    t = LoopText(serial=threads == 1)

    def alloc(shape):
        return t.op(f"memref.alloc() {{alignment = 64 : i64}} : {memref_text(shape, 'f32')}", "m"), memref_text(shape, "f32")

    X, X_t = t.to_buffer("%arg0", x), memref_text(x.shape, "f32")
    W, W_t = t.to_buffer("%arg1", f), memref_text(f.shape, "f32")
    if bias is not None:
        B, B_t = t.to_buffer("%arg2", bias), memref_text(bias.shape, "f32")
    O, O_t = alloc(out.shape)
    zero = t.op("arith.constant 0.0 : f32", "z")
    zv = t.op(f"arith.constant dense<0.0> : {vt}", "z")

    # --- zero-padded phase planes, one (image, channel) per task ----------------------------------
    XS, XS_t = alloc((n * c, phases, plane))
    t.parallel("%nc", t.c(0), t.c(n * c), t.c(1))
    t.line(f"%n = arith.divui %nc, {t.c(c)} : index")
    t.line(f"%ch = arith.remui %nc, {t.c(c)} : index")
    copy_to_phase_planes(t, X, X_t, XS, XS_t, (h, w), (top, left), (sh, sw), ws, plane, L)
    t.close_parallel()

    # --- the filter in blocks of MR, zero past K ------------------------------------------------
    WP, WP_t = alloc((kb_n, c, kh_n, kw_n, MR))
    t.parallel("%kb", t.c(0), t.c(kb_n), t.c(1))
    t.for_("%ch", t.c(0), t.c(c), t.c(1))
    t.for_("%kh", t.c(0), t.c(kh_n), t.c(1))
    t.for_("%kw", t.c(0), t.c(kw_n), t.c(1))
    for r in range(MR):
        kk = t.add(t.mul("%kb", t.c(MR)), t.c(r))
        value = t.op(f"memref.load {W}[{t.min_(kk, t.c(k - 1))}, %ch, %kh, %kw] : {W_t}", "w")
        if k % MR:
            value = t.op(f"arith.select {t.cmp('ult', kk, t.c(k))}, {value}, {zero} : f32", "w")
        t.line(f"memref.store {value}, {WP}[%kb, %ch, %kh, %kw, {t.c(r)}] : {WP_t}")
    t.close()
    t.close()
    t.close()
    t.close_parallel()

    # --- MR filters x NV vectors of positions per register tile ---------------------------------
    OP, OP_t = alloc((n, kb_n * MR, qpad))
    q_segs = qpad // seg
    per_task = min(schedule.tile[1] // seg, q_segs)
    q_tasks = -(-q_segs // per_task)
    t.parallel("%task", t.c(0), t.c(n * kb_n * q_tasks), t.c(1))
    t.line(f"%n = arith.divui %task, {t.c(kb_n * q_tasks)} : index")
    t.line(f"%kq = arith.remui %task, {t.c(kb_n * q_tasks)} : index")
    t.line(f"%kb = arith.remui %kq, {t.c(kb_n)} : index")
    s_lo = t.mul(t.op(f"arith.divui %kq, {t.c(kb_n)} : index", "i"), t.c(per_task))
    t.for_("%s", s_lo, t.min_(t.add(s_lo, t.c(per_task)), t.c(q_segs)), t.c(1))
    q0 = t.mul("%s", t.c(seg))
    nc0 = t.mul("%n", t.c(c))
    accs_t = ", ".join([vt] * (MR * NV))
    t.open(f"%acc:{MR * NV} = scf.for %ch = {t.c(0)} to {t.c(c)} step {t.c(1)} iter_args("
           + ", ".join(f"%a{i} = {zv}" for i in range(MR * NV)) + f") -> ({accs_t})")
    t.open(f"%acck:{MR * NV} = scf.for %kh = {t.c(0)} to {t.c(kh_n)} step {t.c(1)} iter_args("
           + ", ".join(f"%b{i} = %a{i}" for i in range(MR * NV)) + f") -> ({accs_t})")
    hoff = t.mul("%kh", t.c(dh))
    ph = t.op(f"arith.remui {hoff}, {t.c(sh)} : index", "i")
    base = t.add(q0, t.mul(t.op(f"arith.divui {hoff}, {t.c(sh)} : index", "i"), t.c(ws)))
    xrow = t.add(nc0, "%ch")
    accs = [f"%b{i}" for i in range(MR * NV)]

    def tap(kw: str, accs: list[str]) -> list[str]:
        """One filter column: NV vector loads, MR broadcasts, MR x NV FMAs."""
        woff = t.mul(kw, t.c(dw))
        pl = t.add(t.mul(ph, t.c(sw)), t.op(f"arith.remui {woff}, {t.c(sw)} : index", "i"))
        at = t.add(base, t.op(f"arith.divui {woff}, {t.c(sw)} : index", "i"))
        xv = [t.op(f"vector.load {XS}[{xrow}, {pl}, {t.add(at, t.c(j * L))}] : {XS_t}, {vt}", "x")
              for j in range(NV)]
        accs = list(accs)
        for r in range(MR):
            wv = t.op(f"memref.load {WP}[%kb, %ch, %kh, {kw}, {t.c(r)}] : {WP_t}", "w")
            wb = t.op(f"vector.broadcast {wv} : f32 to {vt}", "w")
            for j in range(NV):
                accs[r * NV + j] = t.op(f"vector.fma {wb}, {xv[j]}, {accs[r * NV + j]} : {vt}", "f")
        return accs

    if kw_n <= UNROLLED_TAPS:
        for kw in range(kw_n):
            accs = tap(t.c(kw), accs)
    else:  # wide filters: a loop, so the code (and its compile time) does not grow with KW
        t.open(f"%accw:{MR * NV} = scf.for %kw = {t.c(0)} to {t.c(kw_n)} step {t.c(1)} iter_args("
               + ", ".join(f"%kwacc{i} = {a}" for i, a in enumerate(accs)) + f") -> ({accs_t})")
        looped = tap("%kw", [f"%kwacc{i}" for i in range(MR * NV)])
        t.line(f"scf.yield {', '.join(looped)} : {accs_t}")
        t.close()
        accs = [f"%accw#{i}" for i in range(MR * NV)]
    t.line(f"scf.yield {', '.join(accs)} : {accs_t}")
    t.close()
    t.line(f"scf.yield {', '.join(f'%acck#{i}' for i in range(MR * NV))} : {accs_t}")
    t.close()
    for r in range(MR):
        row = t.add(t.mul("%kb", t.c(MR)), t.c(r))
        add = ""
        if bias is not None:
            value = t.op(f"memref.load {B}[{t.min_(row, t.c(k - 1))}] : {B_t}", "b")
            add = t.op(f"vector.broadcast {value} : f32 to {vt}", "b")
        for j in range(NV):
            acc = f"%acc#{r * NV + j}"
            if add:
                acc = t.op(f"arith.addf {acc}, {add} : {vt}", "o")
            acc = activate(t, v, acc, L)
            t.line(f"vector.store {acc}, {OP}[%n, {row}, {t.add(q0, t.c(j * L))}] : {OP_t}, {vt}")
    t.close()
    t.close_parallel()

    # --- the valid positions of each output row -------------------------------------------------
    t.parallel("%row", t.c(0), t.c(n * k * oh_n), t.c(1))
    t.line(f"%n = arith.divui %row, {t.c(k * oh_n)} : index")
    t.line(f"%ko = arith.remui %row, {t.c(k * oh_n)} : index")
    t.line(f"%k = arith.divui %ko, {t.c(oh_n)} : index")
    t.line(f"%oh = arith.remui %ko, {t.c(oh_n)} : index")
    start = t.mul("%oh", t.c(ws))
    copy_run(t, ow_n, L, "%ow", lambda col: (f"{OP}[%n, %k, {t.add(start, col)}]", OP_t),
             lambda col: (f"{O}[%n, %k, %oh, {col}]", O_t))
    t.close_parallel()
    return t.function_text(name, _conv_params(x, f, bias), O, out, location)


def _operand_buffers(t: LoopText, x, f, bias, out) -> list[tuple[str | None, str | None]]:
    """(memref, its type) of the input, the filter, the bias (None, None without one) and a new
    output buffer."""
    found = [(t.to_buffer(f"%arg{i}", spec), memref_text(spec.shape, "f32")) for i, spec in enumerate((x, f))]
    found.append((t.to_buffer("%arg2", bias), memref_text(bias.shape, "f32")) if bias is not None else (None, None))
    out_t = memref_text(out.shape, "f32")
    return found + [(t.op(f"memref.alloc() {{alignment = 64 : i64}} : {out_t}", "m"), out_t)]


def depthwise_tile(ow: int, lanes: int, accumulators: int) -> tuple[int, int]:
    """(NV vectors of output columns per register tile, tiles per output row): a row's vectors in
    as few tiles as the accumulators allow, split evenly (56 columns: one tile of 7 vectors)."""
    vectors = -(-ow // lanes)
    tiles = -(-vectors // accumulators)
    return -(-vectors // tiles), tiles


def depthwise_rows(oh: int, vectors: int, accumulators: int) -> int:
    """Output rows per register tile: as many as the accumulators allow, balanced over the image.
    A row of one or two vectors alone is one or two chains of dependent FMAs (MobileNetV3's 5x5
    convs on 7x7 images: 25 taps of 4-cycle latency in a row, 0.62x torch; 0.87x with 7 rows a
    tile), and longer rows gain too, each input row's loads feeding several output rows:
    in-process A/B on Zen 5 against one row, AVX-512 (8 lanes), 1 and 2 threads: 3x3 C128 56x56
    (4 rows) 1.06-1.07x, C256 28x28 (7) 1.09-1.11x, 5x5 C96 28x28 (7) 1.13-1.15x, 3x3/s2 C144
    from 56x56 (7) 1.04-1.05x, C64 112x112 (2) 1.01x; AVX2 code, 2 threads, C256 28x28 (3) 1.06x,
    5x5 C96 28x28 (3) 1.09x."""
    most = max(1, min(oh, accumulators // vectors))
    return -(-oh // -(-oh // most))


# Work items per thread of the depthwise kernel, each a run of (image, channel) pairs sharing one
# scratch slot for their phase planes.
DEPTHWISE_ITEMS_PER_THREAD = 8


def depthwise_nchw_schedule(v: OpView, lanes: int, accumulators: int) -> Schedule:
    """The depthwise kernel's default: warp_tile = [R output rows, NV * lanes columns]."""
    (_, _, _, _), _, _, (oh_n, ow_n), _, _, _ = nchw_geometry(v)
    NV, _ = depthwise_tile(ow_n, lanes, accumulators)
    return Schedule(warp_tile=(depthwise_rows(oh_n, NV, accumulators), NV * lanes), lane_map=LaneMap("simd", (lanes,)))


def check_depthwise_nchw_schedule(s: Schedule, registers: int) -> None:
    """Raises OpError naming what the depthwise kernel cannot run of `s`."""
    lanes = s.lane_map.shape[-1] if s.lane_map is not None else 0
    if s.warp_tile is None or len(s.warp_tile) != 2 or not lanes or s.warp_tile[1] % lanes:
        raise OpError("the depthwise NCHW conv kernel's schedule is warp_tile = [R output rows, NV * lanes "
                      f"columns] (the register tile), lane_map simd; got warp_tile {s.warp_tile}, lanes {lanes or None}")
    rows, nv = s.warp_tile[0], s.warp_tile[1] // lanes
    if rows * nv + 2 > registers:
        raise OpError(f"depthwise conv register tile {rows} rows x {nv} vectors needs {rows * nv + 2} vector "
                      f"registers (accumulators, a load, a broadcast); this CPU has {registers}")


def conv_depthwise_nchw_kernel_text(name: str, v: OpView, location: str, schedule: Schedule,
                                    threads: int = 1) -> str:
    """A depthwise NCHW f32 conv (groups = channels = filters): runs of (image, channel) pairs in
    parallel; per pair, the channel's zero-padded phase planes (as the direct kernel's), then
    register tiles of R output rows x NV vectors of columns, each tap a broadcast filter value
    times R x NV loads."""
    (x, f, bias, out), (n, c, h, w), (_, kh_n, kw_n), (oh_n, ow_n), (sh, sw), (dh, dw), pads = nchw_geometry(v)
    top, bottom, left, right = pads
    L = schedule.lane_map.shape[-1]
    NV = schedule.warp_tile[1] // L
    tiles, R = -(-ow_n // (NV * L)), min(schedule.warp_tile[0], oh_n)
    hs, ws = -(-(h + top + bottom) // sh), -(-(w + left + right) // sw)
    last_read = (oh_n - 1) * ws + tiles * NV * L - 1 + ((kh_n - 1) * dh // sh) * ws + (kw_n - 1) * dw // sw
    plane = -(-max(last_read + 1, hs * ws) // L) * L
    vt = f"vector<{L}xf32>"
    t = LoopText(serial=threads == 1)
    (X, X_t), (W, W_t), (B, B_t), (O, O_t) = _operand_buffers(t, x, f, bias, out)
    per_item = -(-n * c // min(n * c, DEPTHWISE_ITEMS_PER_THREAD * max(1, threads)))
    items = -(-n * c // per_item)
    XS_t = memref_text((items, sh * sw, plane), "f32")  # %nc: a work item's slot
    XS = t.op(f"memref.alloc() {{alignment = 64 : i64}} : {XS_t}", "m")
    zv = t.op(f"arith.constant dense<0.0> : {vt}", "z")

    t.parallel("%nc", t.c(0), t.c(items), t.c(1))
    first = t.mul("%nc", t.c(per_item))
    t.for_("%pair", first, t.min_(t.add(first, t.c(per_item)), t.c(n * c)), t.c(1))
    t.line(f"%n = arith.divui %pair, {t.c(c)} : index")
    t.line(f"%ch = arith.remui %pair, {t.c(c)} : index")
    copy_to_phase_planes(t, X, X_t, XS, XS_t, (h, w), (top, left), (sh, sw), ws, plane, L)
    start = zv
    if bias is not None:
        start = t.op(f"vector.broadcast {t.op(f'memref.load {B}[%ch] : {B_t}', 'b')} : f32 to {vt}", "b")
    geometry = (NV, L, kh_n, kw_n, (sh, sw), (dh, dw), ws, ow_n, start, W, W_t, XS, XS_t, O, O_t, v)
    whole = oh_n // R * R
    t.for_("%oh", t.c(0), t.c(whole), t.c(R))
    for tile in range(tiles):  # written out: each column's store known whole, partial or past the row
        _depthwise_tile(t, "%oh", R, tile, *geometry)
    t.close()
    for tile in range(tiles if whole < oh_n else 0):  # the last rows, fewer than R
        _depthwise_tile(t, t.c(whole), oh_n - whole, tile, *geometry)
    t.close()
    t.close_parallel()
    return t.function_text(name, _conv_params(x, f, bias), O, out, location)


def _depthwise_tile(t: LoopText, row0: str, R: int, tile: int, NV: int, L: int, kh_n: int, kw_n: int, stride,
                    dilation, ws: int, ow_n: int, start: str, W: str, W_t: str, XS: str, XS_t: str, O: str,
                    O_t: str, v: OpView) -> None:
    """Output rows row0 .. row0 + R - 1, columns tile * NV * L onwards: R x NV accumulators over
    every tap, each filter value broadcast once for all of them."""
    (sh, sw), (dh, dw) = stride, dilation
    vt, mt = f"vector<{L}xf32>", f"vector<{L}xi1>"
    accs_t = ", ".join([vt] * (R * NV))
    rows = [t.add(row0, t.c(r)) if r else row0 for r in range(R)]
    q0 = [t.add(t.mul(row, t.c(ws)), t.c(tile * NV * L)) for row in rows]
    acc = t.fresh("acc")
    t.open(f"{acc}:{R * NV} = scf.for %kh = {t.c(0)} to {t.c(kh_n)} step {t.c(1)} iter_args("
           + ", ".join(f"%a{j} = {start}" for j in range(R * NV)) + f") -> ({accs_t})")
    hoff = t.mul("%kh", t.c(dh))
    ph = t.op(f"arith.remui {hoff}, {t.c(sh)} : index", "i")
    down = t.mul(t.op(f"arith.divui {hoff}, {t.c(sh)} : index", "i"), t.c(ws))
    bases = [t.add(q, down) for q in q0]
    accs = [f"%a{j}" for j in range(R * NV)]
    for kw in range(kw_n):  # unrolled: a filter row is at most a few taps
        woff = kw * dw
        pl = t.add(t.mul(ph, t.c(sw)), t.c(woff % sw))
        wb = t.op(f"vector.broadcast {t.op(f'memref.load {W}[%ch, {t.c(0)}, %kh, {t.c(kw)}] : {W_t}', 'w')} "
                  f": f32 to {vt}", "w")
        for r, base in enumerate(bases):
            at = t.add(base, t.c(woff // sw))
            for j in range(NV):
                xv = t.op(f"vector.load {XS}[%nc, {pl}, {t.add(at, t.c(j * L))}] : {XS_t}, {vt}", "x")
                accs[r * NV + j] = t.op(f"vector.fma {wb}, {xv}, {accs[r * NV + j]} : {vt}", "f")
    t.line(f"scf.yield {', '.join(accs)} : {accs_t}")
    t.close()
    for r, row in enumerate(rows):
        for j in range(NV):  # columns past the row (computed from the next row's pixels) are dropped
            col = (tile * NV + j) * L
            # with the whole row in one tile, a row's last vector may spill into the next row's
            # first columns (no further), which its own stores rewrite just after (a masked
            # store is slow: 12 % of a 5x5 conv on 7x7 images)
            spills = ow_n <= NV * L <= 2 * ow_n and r < R - 1
            if col >= ow_n:
                continue
            value = activate(t, v, f"{acc}#{r * NV + j}", L)
            if col + L <= ow_n or spills:
                t.line(f"vector.store {value}, {O}[%n, %ch, {row}, {t.c(col)}] : {O_t}, {vt}")
            else:
                mask = t.op(f"vector.constant_mask [{ow_n - col}] : {mt}", "k")
                t.line(f"vector.maskedstore {O}[%n, %ch, {row}, {t.c(col)}], {mask}, {value} : {O_t}, {mt}, {vt}")


DEPTHWISE_PIXELS = 4  # pixels of a run in the NHWC depthwise kernel (they share the filter row's vectors)


def conv_depthwise_nhwc_kernel_text(name: str, v: OpView, location: str, lanes: int, registers: int,
                                    threads: int = 1) -> str:
    """A depthwise NHWC f32 conv (filter [KH, KW, 1, C]): rows of output pixels in parallel.
    Channels are contiguous in the input, the filter and the output: every load is a vector of
    channels. In each row, runs of DEPTHWISE_PIXELS pixels whose every column tap lies inside the
    image keep the filter row's vectors in registers and load each input column once for all
    the pixels that read it (3x3, stride 1: 6 input and 3 filter vectors for 12 FMAs, where a
    pixel at a time loads 2 per FMA: 0.75x torch on AVX-512); the row's edge pixels go one at a
    time over the taps inside the image."""
    x, f, out = v.operands["input"], v.operands["filter"], v.result
    bias = v.operands.get("bias")
    n, h, w, c = x.shape
    kh_n, kw_n = f.shape[:2]
    _, oh_n, ow_n, _ = out.shape
    sh, sw = v.attrs["stride"]
    dh, dw = v.attrs["dilation"]
    top, _, left, _ = Conv2dDef.pads(v.attrs)
    L, P = lanes, DEPTHWISE_PIXELS
    vt, mt = f"vector<{L}xf32>", f"vector<{L}xi1>"
    t = LoopText(serial=threads == 1)
    (X, X_t), (W, W_t), (B, B_t), (O, O_t) = _operand_buffers(t, x, f, bias, out)
    zv = t.op(f"arith.constant dense<0.0> : {vt}", "z")

    def valid(origin: str, dilation: int, end: int, taps_n: int) -> tuple[str, str]:
        """The taps [lo, hi) whose pixel origin + tap * dilation lies inside [0, end)."""
        before = t.op(f"arith.maxsi {t.op(f'arith.subi {t.c(0)}, {origin} : index', 'i')}, {t.c(0)} : index", "i")
        lo = t.op(f"arith.ceildivsi {before}, {t.c(dilation)} : index", "i")
        room = t.op(f"arith.subi {t.c(end)}, {origin} : index", "i")
        hi = t.op(f"arith.ceildivsi {room}, {t.c(dilation)} : index", "i")
        return lo, t.op(f"arith.maxsi {t.min_(hi, t.c(taps_n))}, {lo} : index", "i")

    def load(mem, mem_t, idx, mask):
        if mask is None:
            return t.op(f"vector.load {mem}[{idx}] : {mem_t}, {vt}", "x")
        return t.op(f"vector.maskedload {mem}[{idx}], {mask}, {zv} : {mem_t}, {mt}, {vt} into {vt}", "x")

    def block(c0: str, vecs: list[tuple[int, int | None]], ow: str, pixels: int) -> None:
        """Channels c0 + each vector's offset (its lane count when partial) of `pixels` pixels
        from (%oh, ow): one pixel over its column taps inside the image, or a run whose every
        column tap is inside, each input column loaded once for the run."""
        cols = [t.add(c0, t.c(off)) for off, _ in vecs]
        masks = [None if m is None else t.op(f"vector.constant_mask [{m}] : {mt}", "k") for _, m in vecs]
        k = len(vecs)
        starts = [load(B, B_t, col, m) if bias is not None else zv for col, m in zip(cols, masks)] * pixels
        accs_t = ", ".join([vt] * (k * pixels))
        iw0 = t.op(f"arith.subi {t.mul(ow, t.c(sw))}, {t.c(left)} : index", "i")
        kw_lo, kw_hi = valid(iw0, dw, w, kw_n) if pixels == 1 else (None, None)
        acc = t.fresh("acc")
        t.open(f"{acc}:{k * pixels} = scf.for %kh = {kh_lo} to {kh_hi} step {t.c(1)} iter_args("
               + ", ".join(f"%h{j} = {s_}" for j, s_ in enumerate(starts)) + f") -> ({accs_t})")
        ih = t.add(ih0, t.mul("%kh", t.c(dh)))
        if pixels == 1:
            inner = t.fresh("accw")
            t.open(f"{inner}:{k} = scf.for %kw = {kw_lo} to {kw_hi} step {t.c(1)} iter_args("
                   + ", ".join(f"%w{j} = %h{j}" for j in range(k)) + f") -> ({accs_t})")
            iw = t.add(iw0, t.mul("%kw", t.c(dw)))
            new = [t.op(f"vector.fma {load(W, W_t, f'%kh, %kw, {t.c(0)}, {col}', m)}, "
                        f"{load(X, X_t, f'%n, {ih}, {iw}, {col}', m)}, %w{j} : {vt}", "f")
                   for j, (col, m) in enumerate(zip(cols, masks))]
            t.line(f"scf.yield {', '.join(new)} : {accs_t}")
            t.close()
            t.line(f"scf.yield {', '.join(f'{inner}#{j}' for j in range(k))} : {accs_t}")
        else:
            wv = [[load(W, W_t, f"%kh, {t.c(kw)}, {t.c(0)}, {col}", m) for col, m in zip(cols, masks)]
                  for kw in range(kw_n)]
            accs = [f"%h{j}" for j in range(k * pixels)]
            for d in sorted({q * sw + kw * dw for q in range(pixels) for kw in range(kw_n)}):
                readers = [(q, kw) for q in range(pixels) for kw in range(kw_n) if q * sw + kw * dw == d]
                for j, (col, m) in enumerate(zip(cols, masks)):
                    xv = load(X, X_t, f"%n, {ih}, {t.add(iw0, t.c(d))}, {col}", m)
                    for q, kw in readers:
                        accs[q * k + j] = t.op(f"vector.fma {wv[kw][j]}, {xv}, {accs[q * k + j]} : {vt}", "f")
            t.line(f"scf.yield {', '.join(accs)} : {accs_t}")
        t.close()
        for q in range(pixels):
            at = t.add(ow, t.c(q))
            for j, (col, m) in enumerate(zip(cols, masks)):
                value = activate(t, v, f"{acc}#{q * k + j}", L)
                if m is None:
                    t.line(f"vector.store {value}, {O}[%n, %oh, {at}, {col}] : {O_t}, {vt}")
                else:
                    t.line(f"vector.maskedstore {O}[%n, %oh, {at}, {col}], {m}, {value} : {O_t}, {mt}, {vt}")

    vectors = [(j * L, None if (j + 1) * L <= c else c - j * L) for j in range(-(-c // L))]

    def pixels_from(ow: str, pixels: int) -> None:
        """Every channel of `pixels` pixels from (%oh, ow), in blocks of channel vectors that
        fit the registers (a run's: its accumulators, the filter row and an input vector each)."""
        per_vector = pixels + (kw_n + 1 if pixels > 1 else 0)
        cv = max(1, min(len(vectors), (registers // 2 if pixels == 1 else registers - 2) // per_vector))
        full_blocks = sum(1 for _, m in vectors if m is None) // cv
        if full_blocks:
            t.for_("%cb", t.c(0), t.c(full_blocks * cv * L), t.c(cv * L))
            block("%cb", vectors[:cv], ow, pixels)
            t.close()
        rest = vectors[full_blocks * cv:]
        for i in range(0, len(rest), cv):
            block(t.c(0), rest[i:i + cv], ow, pixels)

    # the pixels [ow_in, ow_out) of a row have every column tap inside the image
    ow_in = min(ow_n, -(-left // sw))
    ow_out = max(ow_in, min(ow_n, (w - 1 - (kw_n - 1) * dw + left) // sw + 1))
    runs_end = ow_in + (ow_out - ow_in) // P * P
    t.parallel("%row", t.c(0), t.c(n * oh_n), t.c(1))
    t.line(f"%n = arith.divui %row, {t.c(oh_n)} : index")
    t.line(f"%oh = arith.remui %row, {t.c(oh_n)} : index")
    ih0 = t.op(f"arith.subi {t.mul('%oh', t.c(sh))}, {t.c(top)} : index", "i")
    kh_lo, kh_hi = valid(ih0, dh, h, kh_n)
    for lo, hi, step in ((0, ow_in, 1), (ow_in, runs_end, P), (runs_end, ow_n, 1)):
        if lo < hi:
            t.for_("%ow", t.c(lo), t.c(hi), t.c(step))
            pixels_from("%ow", step)
            t.close()
    t.close_parallel()
    return t.function_text(name, _conv_params(x, f, bias), O, out, location)
