"""The CPU's kernels and their variants.

Each CPU kernel variant is declared here (the Doctor's registry: constraints, priority, default
schedule sized from the CPU's SIMD width, registers and caches). tracea-select-variant writes the
chosen one onto each op; tracea-cpu-conv and tracea-cpu-kernels then replace each op by its
variant's kernel, leaving the reference variant's ops for tracea-lower-to-linalg.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

import mlir.ir as ir

from ...dialects.ops import OP_DEFS, Conv2dDef, OpView, TensorSpec, describe, view
from ...dialects.schedule import LaneMap, Schedule
from ...dialects.verify import tracea_ops
from ...errors import OpError
from ...tuner.space import SearchSpace
from ...doctor.capabilities import CPU, Capabilities, host, host_cpu
from ...codegen.variants import (OPS, BackendIs, Problem, Rule, SimdWidthAtLeast, Variant, known, register_variant,
                               variant)
from .attention import attention_kernel_text, qk_tile, tile_registers
from .conv import (check_depthwise_nchw_schedule, check_direct_nchw_schedule, conv_depthwise_nchw_kernel_text,
                   conv_depthwise_nhwc_kernel_text, conv_nchw_kernel_text, depthwise_nchw_schedule,
                   direct_nchw_schedule, nchw_geometry)
from ...codegen.conv_gather import ColumnGather, conv_epilogue, implicit_gemm
from ...codegen.loop_text import busiest_thread
from .gemm import column_chunk, conv_k_block, gemm_dot_kernel_text, gemm_kernel_text, gemm_rows_kernel_text
from .softmax import softmax_kernel_text
from ...codegen.kernel_text import KernelWriter
from ...passes.lower_to_linalg import inline_kernel, windowed_input
from ...passes.registry import PassFailed, TraceaPass, option, register
from ...passes.plan import count, record_step
from ...passes.select_variant import select

GEMM_OPS = ("tracea.gemm", "tracea.fused_gemm")


def _round_down(x: int, multiple: int) -> int:
    return max(multiple, x // multiple * multiple)


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


# The register tile's height: on 32 registers (AVX-512, NEON) at most 8 rows, 16 accumulators.
# With 14 rows (28 accumulators + 2 B vectors + a broadcast: 31 of 32) the 4-step unrolled k loop
# spilled accumulators to the stack; measured on Zen 4 (AVX-512, interleaved with numpy), MR 8 vs
# 14: 1 thread +2-6 %, 2 threads 1024^3 2.2x and 2048^3 1.45x (the spills' reloads stalled there
# on GNU OpenMP's threads), no shape slower. 16 registers (AVX2) keep 6 rows.
MAX_MR = 8
# Rows of the register tile when the micro-kernel reads A from the image in place (a base pointer
# per row), on more than 16 vector registers: LLVM's schedule of that loop spills 6 or 8 rows (72-170
# vector stack moves on 1 thread). 3x3 C64 56x56 NHWC, 1 thread, against torch: Zen 4, 6-8 rows at
# half the speed of 4; Zen 5, 4 x 4 vectors 1.06x, 6 x 2 0.76x. On 16 registers (AVX2) the GEMM's
# 6 x 2 vectors stay: they no longer spill since the k loop lost its remainder (k_unroll), and on
# Zen 5 (AVX2 code) they run 1.12-1.18x faster than 4 x 2 (Zen 4 had 4 x 2 faster, at 64 spills).
# Reading a padded copy (pads_first), 6 x 4 vectors no longer spill but ran 0.90x of 4 x 4 on
# 3x3 C256 14x14, 8 images, 2 threads (8 x 2: 1.0x; both 1.0x on C64 56x56).
DIRECT_MAX_MR = 4
FEW_ROWS, FEW_ROWS_KC = 160, 1024  # GEMMs of at most this many rows: one M block, K up to this in one block


def default_gemm_schedule(m: int, n: int, k: int, host: CPU, threads: int, *, shaped_tile: bool = True) -> Schedule:
    """BLIS-style blocking: the B micro-panel (KC x NR) in about L1, the A block (MC x KC) in half of
    L2, the B panel (KC x NC) in a quarter of L3. Threads share the M blocks when there are
    enough (~4 each, in equal numbers); with fewer the kernel also splits the B panel among
    them (see GemmPlan.n_chunk), so M blocks stay as large as L2 allows. `shaped_tile`: the
    register tile fitted to the GEMM's shape (narrow_n_tile, least_padded_tile); the convs'
    blockings were measured with the plain tile."""
    lanes = host.f32_lanes
    nr = 2 * lanes
    mr = min(MAX_MR, (host.vector_registers - 3) // 2)  # accumulators + 2 B vectors + 1 broadcast
    kc = max(64, min(512, 2 * host.l1d_bytes // (nr * 4)))
    if shaped_tile and m >= NARROW_N_MIN_ROWS and (tile := narrow_n_tile(n, host)):
        mr, nr = tile  # K blocks as for two vectors: 6x64 with K = 512 in blocks of 256 lost 5-10 %
    elif shaped_tile:
        mr, nr = least_padded_tile(m, n, mr, nr, lanes)
    # K blocks of equal size, their number rounded to the nearest: K = 576 (a 3x3x64 conv) is one
    # block of 576, not 512 and a 64 whose partial sums cost a pass over C for little work. Exactly
    # K / blocks where that divides K: the kernel's K blocks are then of constant length, which
    # kept its micro-kernel from spilling (with several B panels of computed width, 2 threads:
    # 2048x5000x1000 in blocks of 504 ran 1.43x slower than in blocks of 500)
    k_blocks = max(1, round(k / kc))
    kc = k // k_blocks if k % k_blocks == 0 else _round_up(math.ceil(k / k_blocks), 8)
    mc = _round_down(host.l2_bytes // 2 // (kc * 4), mr)
    blocks = math.ceil(m / mc)
    if m <= FEW_ROWS:
        # Few rows: one M block, and a K up to 1024 in one K block when the A block still fits L2
        # (each K block costs the work items a pass over C and a fork / join). Measured here (Zen 3,
        # position-controlled in-process A/B interleaved with numpy): 128x3072x768 +15 % on 2
        # threads, +5 % on 1 (K = 768 had been two blocks of 384); longer K split into blocks of
        # 1024 instead of 512 lost 3-6 % on 64x512x2048, so longer K keeps the blocks above.
        blocks = 1
        if k <= min(FEW_ROWS_KC, host.l2_bytes // (4 * _round_up(m, mr))):
            kc = _round_up(k, 8)
    strips = math.ceil(n / nr)
    if threads > 1 and m > FEW_ROWS and blocks * strips < 4 * threads:
        # few column strips (a narrow N) leave the threads few work items: more M blocks. Zen 4, 2
        # threads, 16 x (256x64x256) against numpy: one block 132 GFLOP/s, blocks of 64 rows 165 (162)
        blocks = min(math.ceil(m / mr), math.ceil(4 * threads / strips))
    nc = _round_down(host.l3_bytes // 4 // (kc * 4), nr)
    nc = _round_up(math.ceil(n / math.ceil(n / nc)), nr)  # N blocks of equal size
    if blocks == 1:  # one block: the register tile's height divides M as evenly as it can
        mr = math.ceil(m / math.ceil(m / mr))
    elif threads > 1:
        blocks = balanced_m_blocks(m, n, (mr, nr), nc, blocks, threads)
    mc = _round_up(math.ceil(m / blocks), mr)
    return Schedule(tile=(mc, nc, kc), warp_tile=(mr, nr, 1), lane_map=LaneMap("simd", (lanes,)))


def balanced_m_blocks(m: int, n: int, tile: tuple[int, int], nc: int, blocks: int, threads: int) -> int:
    """The number of M blocks, from `blocks` (as large as L2 allows) to twice as many, that shares
    the work most evenly among the threads, the fewest blocks among the best. The work items are
    an NC panel's (M block, column chunk) pairs (gemm.column_chunk), in whole register tiles, the
    last block and chunk short; OpenMP's static schedule gives each thread an equal contiguous run
    of them, so a count the threads divide can still leave one thread more. In-process A/B on
    Zen 5, 2 threads: with AVX2 code, ResNet's 3x3 C256 conv on 14x14 x 8 images (262 strips of 6
    rows) in 16 blocks of 17 strips gave one thread 136 strips for the other's 126; in 22 blocks
    of 12 (132 and 130) it ran 1.03x faster, C128 28x28 1.03x, ResNet-50 (224x224, 8 images)
    1.05x; GEMMs of few blocks (balanced with their column chunks) 392x512x4608 1.03x, 512^3
    1.02x; with AVX-512 1000x3000x500 1.02x, 784x128x1152 1.03x, the rest 0.997-1.005x."""
    mr, nr = tile
    strips, panel = -(-m // mr), -(-min(nc, n) // nr)

    def busiest(count: int) -> int:
        per = -(-strips // count)
        rows = [per] * (-(-strips // per) - 1)
        rows.append(strips - per * len(rows))
        chunk = column_chunk(m, n, per * mr, nc, nr, threads) // nr
        columns = [min(chunk, panel - j) for j in range(0, panel, chunk)]
        return busiest_thread([r * c for r in rows for c in columns], threads)
    # up to twice as many blocks; with many, a thread's share is even to within a few blocks anyway
    return min(range(blocks, min(2 * blocks, blocks + 8 * threads) + 1), key=lambda b: (busiest(b), b))


# Rows from which a narrow N gets a register tile as wide as N: with fewer, one strip leaves the
# threads too few work items (2 threads: 128x64x1024 1.33x slower, 256x64x256 1.13x; 4096x64x64
# no different)
NARROW_N_MIN_ROWS = 1024


def narrow_n_tile(n: int, host: CPU) -> tuple[int, int] | None:
    """A register tile (MR, NR) as wide as a narrow N (3-4 vectors), where it still has rows
    enough (>= 6): every broadcast of A then feeds all of N, instead of two strips, the second
    partly masked. Zen 4 (AVX-512), in-process A/B against 8x32 on 1 and 2 threads: N = 48
    (8x48) 1.34-1.42x on 3136x48x192 and 25088x48x256; N = 64 (6x64) 1.07-1.13x on ResNet's 1x1
    convs to 64 channels (25088x64x256, 6272x64x512). On 16 registers (AVX2) such a tile has too
    few rows: None."""
    vectors = -(-n // host.f32_lanes)
    rows = min(MAX_MR, (host.vector_registers - 1) // vectors - 1)  # accumulators + B vectors + a broadcast
    return (rows, vectors * host.f32_lanes) if 3 <= vectors <= 4 and rows >= 6 else None


def least_padded_tile(m: int, n: int, mr: int, nr: int, lanes: int) -> tuple[int, int]:
    """On 16 registers, 4 rows x 3 vectors instead of 6 x 2 (as many accumulators) where 6 x 2
    pads the GEMM's M x N by over 1 % more: 128 rows are 22 strips of 6 (132 rows) but 32 of 4.
    The tuner's tables of the 128x1024x1024 GEMM had 4 x 24 best on Zen 3 (6 x 16 within 1 %)
    and on Zen 4 with the AVX2 plan (6 x 16 5 % off); paired in-process A/B on that host (61
    rounds, median ratios) on 128x1024x1024, 128x3072x768, 128x768x3072 and 64x768x768: 1 thread
    +5-7 %, 2 threads +2-7 %; K blocks of 512 instead of the whole K were no faster.
    Where 4 x 3 pads more, 6 x 2 stays: Zen 3's 512^3 table had 4 x 24 6.7 % slower."""
    if (mr, nr) != (6, 2 * lanes):
        return mr, nr
    def padded(rows: int, cols: int) -> int:
        return _round_up(m, rows) * _round_up(n, cols)
    return (4, 3 * lanes) if padded(4, 3 * lanes) < 0.99 * padded(mr, nr) else (mr, nr)


DOT_MAX_ROWS = 32


def use_dot_kernel(m: int, k: int, transpose_a: bool, transpose_b: bool) -> bool:
    """x @ W^T (W as nn.Linear stores it) with few rows and long rows runs on the inner-product
    kernel, which packs nothing. Measured here (Zen 3, 1 and 2 threads): up to 32 rows it is
    7-25 % faster than the packed kernel (16 and 32 x 2048 x 2048, 8 x 768 x 3072); from 48 rows
    on, the packed kernel (packing each strip of W just before it is used) is."""
    return transpose_b and not transpose_a and m <= DOT_MAX_ROWS and k >= 512


def dot_gemm_schedule(m: int, n: int, k: int, host: CPU, threads: int) -> Schedule:
    """The inner-product kernel's blocking: MR x NR accumulators (+ MR rows of A and one of B in
    registers); K blocks long enough to amortize reducing the accumulators; A blocks in half of L2.
    Where B can stay in L3 from one call to the next, its rows are asked for ahead (stages 2)."""
    lanes = host.f32_lanes
    # B's share of each thread within half of L3. In-process A/B on Zen 5, 1 row, against 8 rows
    # of B at a time without prefetches: 4 rows with them 1.07-1.23x faster from L3 (7 and 16 MB;
    # 25 MB on 2 threads), 0.87-0.97x from memory (25 MB on 1 thread, 64 MB), where 4 rows
    # without them is 0.85x with AVX2 code. Rows past 1 gain less (4 rows: 1.06-1.07x, AVX-512).
    from_l3 = n * k * 4 <= max(1, threads) * host.l3_bytes // 2
    # as many rows as there are (each row past them was computed and dropped), and one row's
    # accumulators run across more columns: against 4 x 4, in-process A/B, Zen 4, 1 thread:
    # 1 row 1.2-1.5x (torch's gemv: 0.67-0.98x -> 0.8-1.5x), 2 rows 1.05-1.27x, 3 rows 1.02-1.16x
    mr = min(4, m)
    nr = max(1, min(8 if mr == 1 and not from_l3 else 4, (host.vector_registers - mr - 1) // mr))
    kc = min(_round_up(k, lanes), 1024)
    if m <= mr:
        # One group of rows uses each element of B once: K blocks only cut B's rows into pieces
        # (and its pieces kept in L1 serve nothing). Whole rows (A's in half of L2), in-process
        # A/B on Zen 5, 1 and 4 rows x 4096 x 4096 (B from memory): 1.04-1.11x faster than 1024.
        # With more rows, a block of B is read again by each group of rows and must stay in L1:
        # 16 x 2048 x 2048 at 2048 ran 0.79-0.86x of 1024.
        kc = min(_round_up(k, lanes), max(kc, _round_down(host.l2_bytes // 2 // (4 * mr), lanes)))
    mc = _round_up(min(m, max(mr, _round_down(host.l2_bytes // 2 // (kc * 4), mr))), mr)
    return Schedule(tile=(mc, _round_up(n, nr), kc), warp_tile=(mr, nr, lanes), stages=2 if from_l3 else 1,
                    lane_map=LaneMap("simd", (lanes,)))


# x @ W (W as it lies, [K, N]) with at most this many rows streams W's rows (gemm_rows_kernel_text).
# Against the packed kernel, in-process A/B, Zen 4 (768x3072, 3072x768, 768x768): 1 row
# 2.1-2.9x (1 thread) / 1.6-2.4x (2), 4 rows 1.9-2.0x / 1.4-1.7x, 8 rows 1.06-1.6x / 1.08-1.44x,
# 12-16 rows 0.83-1.44x; held to AVX2, 8 rows 1.2-1.7x.
ROWS_MAX_ROWS = 8
ROWS_SUMS_BYTES = 16 << 10  # a column chunk's sums: half of a 32 KiB L1


def rows_gemm_schedule(m: int, n: int, k: int, host: CPU, threads: int) -> Schedule:
    """The streaming kernel's column chunk: its sums in ROWS_SUMS_BYTES, in a count of chunks
    the threads divide (K does not matter: W streams through). Chunks as wide as the sums allow
    gave 4 x 3072 x 768 three chunks of 1024 on 2 threads, one thread streaming twice the other's
    share; 4 chunks of 768 ran 1.19-1.21x faster, 4 x 2304 x 768 1.53-1.58x (Zen 5, AVX-512 and
    AVX2 code, in-process A/B)."""
    lanes = host.f32_lanes
    widest = max(lanes, _round_down(ROWS_SUMS_BYTES // (4 * max(m, 1)), lanes))
    threads = max(1, threads)
    chunks = _round_up(-(-n // widest), threads)
    return Schedule(tile=(max(lanes, _round_up(-(-n // chunks), lanes)),), lane_map=LaneMap("simd", (lanes,)))


def check_gemm_schedule(problem: Problem, caps: Capabilities, s: Schedule) -> None:
    if s.tile is None or s.warp_tile is None or len(s.tile) != 3:
        raise OpError("a CPU gemm schedule needs tile = [MC, NC, KC] and warp_tile = [MR, NR, 1] "
                      "(or [MR, NR, lanes] for the inner-product kernel)")
    mr, nr, kr = s.warp_tile
    lanes = s.lane_map.shape[-1]
    available = caps.cpu.vector_registers
    if kr == lanes:  # inner products along K
        if s.stages > 2:
            raise OpError(f"the inner-product kernel takes stages 1 or 2 (B's rows asked for ahead); got {s.stages}")
        if problem.transpose_a or not problem.transpose_b:
            raise OpError(f"CPU gemm warp_tile [MR, NR, {lanes}] (inner products along K) needs transpose_b "
                          "and not transpose_a; use [MR, NR, 1]")
        registers = mr * nr + mr + 1
        if lanes == caps.cpu.f32_lanes and registers > available:
            raise OpError(f"inner-product tile {mr}x{nr} needs {registers} vector registers; this CPU has "
                          f"{available} (reduce MR or NR)")
        return
    if kr != 1 or nr % lanes:
        raise OpError(f"CPU gemm warp_tile [MR, NR, 1] needs NR a multiple of the {lanes} SIMD lanes; "
                      f"got {list(s.warp_tile)}")
    registers = mr * nr // lanes + nr // lanes + 1
    if lanes == caps.cpu.f32_lanes and registers > available:
        raise OpError(f"register tile {mr}x{nr} needs {registers} vector registers; this CPU has {available} "
                      f"(reduce MR or NR)")


def pads_first(v: OpView) -> tuple[int, int, int, int] | None:
    """The padding the CPU implicit GEMM writes around the image before it starts, or None. In a
    zero-padded copy every strip of A is read in place; on the image as it is, a strip with a
    pixel at the border is packed. In-process A/B on Zen 5, 2 threads, 3x3 convs: 8 images,
    AVX-512, C64 56x56 1.10x, C128 28x28 1.13x, C256 14x14 1.04x, C512 7x7 0.99-1.0x; with AVX2
    code 1.0x, 1.04x, 1.05x, 0.98x; one image 14x14 1.10-1.12x; ResNet-50 (224x224, 8 images)
    1.024x. Strided convs read 4 pixels of the copy per output: their copies cost more than
    they saved (ResNet's 7x7/s2 stem 0.98x, 3x3/s2 C128 0.97-0.99x)."""
    pads = Conv2dDef.pads(v.attrs)
    if not any(pads) or v.operands["input"].dtype != "f32" or v.attrs["dilation"][1] != 1 \
            or tuple(v.attrs["stride"]) != (1, 1):
        return None
    return pads


def cpu_implicit_gemm(v: OpView) -> tuple[int, int, int, ConvGather]:
    """implicit_gemm, its gather reading the padded image where the kernel pads it first."""
    m, nf, k, gather = implicit_gemm(v)
    pads = pads_first(v)
    return m, nf, k, gather if pads is None else gather.padded(pads)


def conv_gemm_schedule(v: OpView, host: CPU, threads: int) -> Schedule:
    """The GEMM's blocking, with K blocks whose B micro-panel fits L1 where strips are packed
    (measured on the 3x3 C64 conv, blocks of 256-320 ran ~10 % faster than 512-576, the GEMM's,
    whose panels spill to L2), and of whole kernel rows where every strip is read in place
    (in_place_k_block)."""
    m, nf, k, gather = cpu_implicit_gemm(v)
    schedule = default_gemm_schedule(m, nf, k, host, threads, shaped_tile=False)
    mc, nc, _ = schedule.tile
    lanes = schedule.lane_map.shape[-1]
    budget = host.l1d_bytes // (schedule.warp_tile[1] * 4)
    kc = conv_k_block_of(gather, k, budget, lanes)
    mr, nr, _ = schedule.warp_tile
    if gather.direct_segment(kc, lanes) is not None and mr > DIRECT_MAX_MR and host.vector_registers > 16:
        mr = DIRECT_MAX_MR
        mc = min(_round_up(mc, mr), _round_up(m, mr))
        # Fewer rows, so as many columns as the registers then hold (mr x nv accumulators, nv
        # B vectors and a broadcast), in whole vectors of NC: 4 x 2 vectors, 8 accumulators, left
        # the FMAs' latency uncovered (3x3 C64 NHWC on Zen 5, AVX-512: 4 x 4 1.12x faster)
        vectors = nc // lanes
        nr = lanes * max([v for v in range(1, vectors + 1) if vectors % v == 0
                          and mr * v + v + 1 <= host.vector_registers] + [nr // lanes])
    if gather.interior_share() == 1 and gather.direct_segment(kc, lanes) is not None:  # every strip in place
        kc = in_place_k_block(gather, nr, host) or kc
    return replace(schedule, tile=(mc, nc, kc), warp_tile=(mr, nr, 1))


def in_place_k_block(gather: ConvGather, nr: int, host: CPU) -> int | None:
    """K blocks of whole kernel rows for a micro-kernel that reads A in place: as many rows as
    keep B's micro-panel (KC x NR) in L2, the same in each block; None where one row is more.
    Each K block costs a pass over C; from the padded image, with 8 images on 2 threads (Zen 5,
    AVX-512, 4 x 4 vectors, against torch), whole K instead of L1-sized blocks: 3x3 C64 56x56
    (576 for 384) 0.995x -> 1.013x, C128 28x28 (1152 for 384) 0.982x -> 0.997x, C256 14x14
    (2304 for 256) 0.953x -> 0.988x; C512 7x7 in rows of 1536 (for 256) 0.988x -> 1.039x,
    whose whole K (4608, B's panel 1.2 MB) ran 0.894x. 1x1 convs of ResNet's shapes with C >= 512
    (a row: the whole C), in-process A/B: 1.04-1.09x (8 images) and 1.05-1.09x (one image) on 2
    threads, 0.97-1.15x on 1; with AVX2 code 1.0-1.01x (one 14x14 image: 1.09x)."""
    row, rows = gather.kernel[1] * gather.image.shape[3], gather.kernel[0]
    fit = host.l2_bytes // (4 * nr) // row
    return max((d for d in range(1, rows + 1) if rows % d == 0 and d <= fit), default=0) * row or None


def conv_k_block_of(gather, k: int, kc: int, lanes: int) -> int:
    """The conv's K block near `kc`: whole runs of the gather (conv_k_block), or where the image can
    be read in place but those runs cannot, whole kernel rows (or a part of one in whole runs of
    channels), which the micro-kernel reads from the image itself where the pixels are inside it
    (no packing): 3x3 C128 at 384, not 640."""
    block = conv_k_block(gather.unit(lanes), k, kc)
    row, c = gather.kernel[1] * gather.image.shape[3], gather.image.shape[3]
    if gather.direct_segment(block, lanes) is None and gather.direct_segment(row, lanes) is not None:
        block = row * max(1, kc // row) if row <= kc else max([d for d in range(c, kc + 1, c) if row % d == 0] or [c])
    return min(block, k)


def conv_gemm_view(v: OpView, a: TensorSpec, b: TensorSpec, product: tuple[int, ...], schedule: Schedule,
                   transpose_b: bool = False, row_bias: bool = False) -> OpView:
    """The GEMM computing a conv, its epilogue the conv's bias and activation (row_bias: the
    filters are the GEMM's rows, as in NCHW, not its columns)."""
    operands = {"a": a, "b": b, **({"bias": v.operands["bias"]} if "bias" in v.operands else {})}
    return OpView(v.op, OP_DEFS["tracea.fused_gemm"], operands, TensorSpec(product, v.result.dtype),
                  {"transpose_a": False, "transpose_b": transpose_b, "schedule": schedule,
                   "epilogue": conv_epilogue(v), "row_bias": row_bias})


def call_conv_gemm(w: KernelWriter, name: str, gemm_view: OpView, a: str, b: str) -> str:
    """The call of a conv's GEMM kernel `name` on a and b (and the conv's bias)."""
    args = [a, b] + ([w.arg["bias"]] if "bias" in gemm_view.operands else [])
    return w.emit(gemm_view.result, f"func.call @{name}({', '.join(args)}) : "
                                    f"({', '.join(str(w.types[x]) for x in args)}) -> {gemm_view.result}")


def conv_as_gemm(w: KernelWriter, v: OpView, name: str, threads: int) -> tuple[str, str]:
    """conv2d = one GEMM over the im2col of the NHWC image, packed straight from the image
    (implicit GEMM), k ordered (kh, kw, c) so the HWCF filter is B as it lies; the bias is the
    GEMM's epilogue. An NCHW input (and FCHW filter) is transposed first, the result back.
    Returns the GEMM kernel's function text and the SSA name of the result."""
    x, f = v.operands["input"], v.operands["filter"]
    nchw = v.attrs["layout"] == "nchw"
    m, nf, k, gather = cpu_implicit_gemm(v)
    n, (oh, ow) = gather.image.shape[0], gather.out_hw
    if nchw:
        image = w.transpose(w.arg["input"], [0, 2, 3, 1])
        filt = w.transpose(w.arg["filter"], [2, 3, 1, 0])  # FCHW -> HWCF
    else:
        image, filt = w.arg["input"], w.arg["filter"]
    if pads := pads_first(v):
        top, bottom, left, right = pads
        image = w.pad(image, [0, top, left, 0], [0, bottom, right, 0])
    filt = w.reshape(filt, [[0, 1, 2], [3]], (k, nf))
    schedule = v.attrs.get("schedule") or conv_gemm_schedule(v, host_cpu(), threads)
    gemm_view = conv_gemm_view(v, TensorSpec((m, k), x.dtype), TensorSpec((k, nf), f.dtype), (m, nf), schedule)
    text = gemm_kernel_text(name, gemm_view, str(v.op.location), gather, threads)
    result = call_conv_gemm(w, name, gemm_view, image, filt)
    result = w.reshape(result, [[0, 1, 2], [3]], (n, oh, ow, nf))
    if nchw:
        result = w.transpose(result, [0, 3, 1, 2])
    return text, result


def pointwise_nchw(v: OpView) -> bool:
    """An NCHW conv whose im2col only rearranges pixels: a 1x1 filter, or patches (filter =
    stride: a ViT's patch embedding), without padding, f32, over enough pixels per image that
    packing the filter once per image costs little next to the GEMM (1 / (2 H W) of its work),
    or over images of one pixel (a squeeze-excitation block's layers: one GEMM for the batch)."""
    f = v.operands["filter"]
    pixels = v.result.shape[2] * v.result.shape[3]
    patches = tuple(f.shape[2:]) == tuple(v.attrs["stride"]) and tuple(v.attrs["dilation"]) == (1, 1)
    return (v.attrs["layout"] == "nchw" and v.attrs["groups"] == 1 and (f.shape[2:] == (1, 1) or patches)
            and Conv2dDef.pads(v.attrs) == (0, 0, 0, 0)
            and (pixels >= POINTWISE_MIN_PIXELS or pixels == 1)
            and all(s.dtype == "f32" for s in list(v.operands.values()) + [v.result]))


# 7x7 images (49 pixels; MobileNetV3's last layers): a GEMM per image ran 0.76-0.91x torch where
# the direct kernel (register tiles of 24 positions, a 49-pixel image padded to 72) ran 0.71x
# (im2col_nchw, one GEMM for the batch, takes images up to 64 pixels first; this is its fallback)
POINTWISE_MIN_PIXELS = 32


def conv_pointwise_nchw(w: KernelWriter, v: OpView, name: str, threads: int) -> tuple[str, str]:
    """A 1x1 (or patch) NCHW conv as one GEMM per image: out[n] (K x HW) = W (K x C) @ x[n]
    (C x HW), the filter shared by every image (packed per image), x as it lies; the pixels a
    stride skips are left out first, and patches laid out as C KH KW rows of HW columns (16 x 16
    patches: 0.76x torch on the direct kernel's 256 phase planes). Images of one pixel make one
    GEMM for the batch, out (N x K) = x (N x C) @ W^T (as nn.Linear). The bias and the
    activation are the GEMM's epilogue (a pass of their own over the result was a quarter of a
    16 -> 72 channel conv on 56x56 images)."""
    x, f, out = v.operands["input"], v.operands["filter"], v.result
    n, k, (kh, kw), (h, wd) = x.shape[0], f.shape[0], f.shape[2:], out.shape[2:]
    c = x.shape[1] * kh * kw  # the GEMM's K
    filt = w.reshape(w.arg["filter"], [[0], [1, 2, 3]], (k, c))
    pixels = w.arg["input"]
    if tuple(v.attrs["stride"]) != (1, 1):  # (image, channel, ky, kx, y, x) = x[image, channel, y sy + ky, x sx + kx]
        sy, sx = v.attrs["stride"]
        pixels = w.generic([(pixels, ["d0", "d1", f"d4 * {sy} + d2", f"d5 * {sx} + d3"])],
                           (w.empty((n, x.shape[1], kh, kw, h, wd), "f32"), [f"d{i}" for i in range(6)]), 6, (),
                           lambda b: b.args[0])
        pixels = w.reshape(pixels, [[0], [1, 2, 3], [4], [5]], (n, c, h, wd))
    if h * wd == 1:
        image = w.reshape(pixels, [[0], [1, 2, 3]], (n, c))
        dot = use_dot_kernel(n, c, False, True)
        kernel = gemm_dot_kernel_text if dot else gemm_kernel_text
        schedule = v.attrs.get("schedule") or (dot_gemm_schedule if dot else default_gemm_schedule)(
            n, k, c, host_cpu(), threads)
        operands, product, transpose_b = ((image, (n, c)), (filt, (k, c))), (n, k), True
    else:
        image = w.reshape(pixels, [[0], [1], [2, 3]], (n, c, h * wd))
        schedule = v.attrs.get("schedule") or default_gemm_schedule(k, h * wd, c, host_cpu(), threads)
        kernel = gemm_kernel_text
        operands, product, transpose_b = ((filt, (k, c)), (image, (n, c, h * wd))), (n, k, h * wd), False
    (a, a_shape), (b, b_shape) = operands
    # the filters are the GEMM's columns for 1-pixel images (x @ W^T), its rows otherwise
    gemm_view = conv_gemm_view(v, TensorSpec(a_shape, "f32"), TensorSpec(b_shape, "f32"), product, schedule,
                               transpose_b, row_bias=not transpose_b)
    text = kernel(name, gemm_view, str(v.op.location), threads=threads)
    result = call_conv_gemm(w, name, gemm_view, a, b)
    return text, w.reshape(result, [[0], [1, 2, 3]] if h * wd == 1 else [[0], [1], [2, 3]], out.shape)


# Output images of at most 64 pixels (ResNet's last stages at 128x128 and 224x224): against
# the direct kernel, Zen 4, 8 images, 1 / 2 threads, in-process A/B: 3x3 on 4x4 1.9x / 1.9x,
# 8x8 stride 2 to 4x4 1.9x, 7x7 1.16x / 1.14x, 8x8 1.02x / 0.8-1.04x (noisy), 16x16 stride 2
# to 8x8 1.1x; 1x1 stride 2 to 7x7 1.5x against pointwise_nchw; 16x16 outputs 0.85x.
IM2COL_MAX_PIXELS = 64
# the im2col (packed from the image, or written out where ColumnGather does not fit) a fraction
# of memory, about an L3's worth or two: past that (256 images of 7x7 C512) the direct kernel
IM2COL_MAX_BYTES = 64 << 20


def im2col_pays(v: OpView) -> bool:
    """Small output images, not 1x1 convs over 1-pixel images (pointwise_nchw makes those one
    GEMM for the batch already, reading them in place), an im2col copy not too large. 1x1 convs
    over small images too: their im2col is only the batch's transposition, and a GEMM per image
    of 49-64 columns wastes a quarter of its register tiles. Zen 4, 8 images, 1 / 2 threads,
    against pointwise_nchw: 512->2048 on 7x7 1.27x / 1.27x, 160->960 on 7x7 1.29x / 1.29x,
    1024->256 on 8x8 0.98x / 1.08x; on the direct kernel, 4x4 images ran 0.57x torch."""
    x, f, out = v.operands["input"], v.operands["filter"], v.result
    copy_bytes = 4 * x.shape[1] * f.shape[2] * f.shape[3] * x.shape[0] * out.shape[2] * out.shape[3]
    in_place = f.shape[2:] == (1, 1) and not any(Conv2dDef.pads(v.attrs)) and x.shape[2:] == (1, 1)
    return not in_place and out.shape[2] * out.shape[3] <= IM2COL_MAX_PIXELS and copy_bytes <= IM2COL_MAX_BYTES


def conv_im2col_nchw(w: KernelWriter, v: OpView, name: str, threads: int) -> tuple[str, str]:
    """An NCHW conv over small images as one GEMM for the whole batch: out (K x N OH OW) =
    W (K x C KH KW, the FCHW filter as it lies) @ cols (C KH KW x N OH OW), cols the im2col
    of the zero-padded batch, channel-major: packed by the GEMM straight from the image
    (ColumnGather), or, for strips of too many runs, written out (a copy of the image per tap). The
    direct kernel computes the padding columns of its phase planes and rounds each image's
    positions up to its register tile: on 4x4 images that is half its work wasted, on 8x8 a
    third; here the batch makes one long row of positions and the filter is read in place."""
    x, f, out = v.operands["input"], v.operands["filter"], v.result
    (n, c, _, _), (_, _, kh, kw), (oh, ow) = x.shape, f.shape, out.shape[2:]
    (sy, sx), (dy, dx), (top, bottom, left, right) = v.attrs["stride"], v.attrs["dilation"], Conv2dDef.pads(v.attrs)
    k, positions, taps = _im2col_gemm(v)
    hp, wp = (oh - 1) * sy + (kh - 1) * dy + 1, (ow - 1) * sx + (kw - 1) * dx + 1
    schedule = v.attrs.get("schedule") or im2col_schedule(v, host_cpu(), threads)
    wq = -(-wp // sx)  # columns of a phase plane
    gather = ColumnGather(TensorSpec((n, c, hp, sx * wq), "f32"), (kh, kw), (oh, ow), (sy, sx), (dy, dx))
    if not gather.fits(schedule.warp_tile[1]):
        gather = None
    padded = windowed_input(w, w.arg["input"], (2, 3), (top, bottom, left, right), (hp, sx * wq if gather else wp))
    if gather:  # the GEMM packs B's strips straight from the image
        cols = padded
        if sx > 1:  # planes[image, ch, y, phase, q] = padded[image, ch, y, q sx + phase]
            cols = w.generic([(padded, ["d0", "d1", "d2", f"d4 * {sx} + d3"])],
                             (w.empty((n, c, hp, sx, wq), "f32"), [f"d{i}" for i in range(5)]), 5, (),
                             lambda b: b.args[0])
            cols = w.reshape(cols, [[0], [1], [2], [3, 4]], gather.image.shape)
    else:
        # cols[ch, ky, kx, image, y, x] = padded[image, ch, y sy + ky dy, x sx + kx dx]
        cols = w.generic([(padded, ["d3", "d0", f"d4 * {sy} + d1 * {dy}", f"d5 * {sx} + d2 * {dx}"])],
                         (w.empty((c, kh, kw, n, oh, ow), "f32"), [f"d{i}" for i in range(6)]), 6, (),
                         lambda b: b.args[0])
        cols = w.reshape(cols, [[0, 1, 2], [3, 4, 5]], (taps, positions))
    filt = w.reshape(w.arg["filter"], [[0], [1, 2, 3]], (k, taps))
    gemm_view = conv_gemm_view(v, TensorSpec((k, taps), "f32"), TensorSpec((taps, positions), "f32"),
                               (k, positions), schedule, row_bias=True)
    text = gemm_kernel_text(name, gemm_view, str(v.op.location), threads=threads, b_gather=gather)
    product = w.reshape(call_conv_gemm(w, name, gemm_view, filt, cols), [[0], [1, 2, 3]], (k, n, oh, ow))
    return text, w.transpose(product, [1, 0, 2, 3])


# -- the CPU's kernel variants ---------------------------------------------------------------

def _simd_schedule(p: Problem) -> bool | None:
    """Whether the op's own schedule maps onto SIMD lanes (None: it has none)."""
    s = p.schedule
    return None if s is None else s.lane_map is not None and s.lane_map.kind == "simd"


def _wants_inner_products(p: Problem, caps: Capabilities) -> bool | None:
    if _simd_schedule(p) is not None:
        return _simd_schedule(p) and p.schedule.warp_tile is not None and p.schedule.warp_tile[-1] > 1
    if not known(p.m, p.k, p.transpose_a, p.transpose_b):
        return None
    return use_dot_kernel(p.m, p.k, p.transpose_a, p.transpose_b)


def _packed(p: Problem, caps: Capabilities) -> bool | None:
    simd = _simd_schedule(p)
    return simd is None or simd and (p.schedule.warp_tile is None or p.schedule.warp_tile[-1] == 1) \
        and not _rows_form(p.schedule)


def _rows_form(s: Schedule) -> bool:
    """The streaming kernel's schedule: tile [NB] alone."""
    return s.tile is not None and len(s.tile) == 1 and s.warp_tile is None


def _streams_rows(p: Problem, caps: Capabilities) -> bool | None:
    if _simd_schedule(p) is not None:
        return _simd_schedule(p) and _rows_form(p.schedule)
    if not known(p.m, p.transpose_a, p.transpose_b):
        return None
    return not p.transpose_a and not p.transpose_b and p.m <= ROWS_MAX_ROWS and \
        all(d in ("f32", "f16", "bf16") for d in (p.dtypes or (p.dtype,))[:2])


def _rows_space(p: Problem, caps: Capabilities) -> SearchSpace:
    """The streaming kernel's one knob: the column chunk (its sums' share of L1, the threads' work items)."""
    lanes = caps.cpu.f32_lanes
    widest = _round_up(p.n, lanes) if p.n else 8192
    chunks = sorted({min(c, widest) for c in (lanes * 8, 256, 512, 1024, 2048, 4096, 8192)})
    return SearchSpace().lanes(lanes).knob("tile", [(c,) for c in chunks])


def _rows_check(p: Problem, caps: Capabilities, s: Schedule) -> None:
    lanes = s.lane_map.shape[-1]
    if not _rows_form(s) or s.tile[0] % lanes:
        raise OpError(f"the streaming GEMM's schedule is tile = [NB], a column chunk that is a multiple of the "
                      f"{lanes} SIMD lanes, and no warp_tile; got tile {s.tile}, warp_tile {s.warp_tile}")
    if p.transpose_a or p.transpose_b:
        raise OpError("the streaming GEMM computes x @ W with neither operand transposed")
    if p.m is not None and p.m > 2 * ROWS_MAX_ROWS:  # each row is written out in the kernel's code
        raise OpError(f"the streaming GEMM takes at most {2 * ROWS_MAX_ROWS} rows (this one has {p.m}); "
                      "use the packed kernel's schedule (tile [MC, NC, KC], warp_tile [MR, NR, 1])")


def _gemm_default(schedule_fn):
    def default(p: Problem, caps: Capabilities, threads: int | None) -> Schedule | None:
        if p.schedule is not None or not known(p.m, p.n, p.k):
            return p.schedule
        return schedule_fn(p.m, p.n, p.k, caps.cpu, threads or caps.cpu.cores)
    return default


def _gemm_space(p: Problem, caps: Capabilities) -> SearchSpace:
    """The packed kernel's knobs: register tile MR x NR (as many accumulators as fit), cache blocks
    MC / NC / KC. Blocks are rounded to the register tile and cut to the problem, so sizes past
    the problem's collapse into one configuration."""
    lanes = caps.cpu.f32_lanes
    conv = p.op == "conv2d" and p.view is not None
    m, n, k, gather = cpu_implicit_gemm(p.view) if conv else (p.m, p.n, p.k, None)

    def fit(s: Schedule) -> Schedule:
        (mc, nc, kc), (mr, nr, _) = s.tile, s.warp_tile
        mc, nc = _round_up(mc, mr), _round_up(nc, nr)
        if known(m, n, k):
            mc, nc, kc = min(mc, _round_up(m, mr)), min(nc, _round_up(n, nr)), min(kc, _round_up(k, 8))
        if gather is not None:  # a conv's K blocks as its default's are made (see _conv_check)
            kc = conv_k_block_of(gather, k, kc, lanes)
        elif known(k) and k % (blocks := -(-k // kc)) == 0:
            kc = k // blocks  # as many K blocks, all of one length (default_gemm_schedule says why)
        return replace(s, tile=(mc, nc, kc))

    # a conv read in place also takes K blocks of several kernel rows (in_place_k_block)
    k_blocks = [64, 128, 256, 384, 512, 768, 1024] + ([1536, 2304, 3072, 4608] if conv else [])
    space = (SearchSpace(adjust=fit).lanes(lanes).warp_m([4, 6, 8, 12]).warp_n([lanes, 2 * lanes, 3 * lanes])
             .warp_k([1]).tile_m([24, 48, 96, 144, 192, 288]).tile_n([256, 1024, 4096]).tile_k(k_blocks))
    return space.constrain(f"the register tile fits {caps.cpu.vector_registers} vector registers",
                           lambda c, s: c["warp_m"] * c["warp_n"] // lanes + c["warp_n"] // lanes + 1
                           <= caps.cpu.vector_registers)


def _dot_space(p: Problem, caps: Capabilities) -> SearchSpace:
    """The inner-product kernel's knobs: MR rows x NR columns of accumulators, the K block,
    whether B's rows are asked for ahead (stages 2)."""
    lanes = caps.cpu.f32_lanes
    n = _round_up(p.n, 4) if p.n else 256

    def fit(s: Schedule) -> Schedule:
        (mc, _, kc), (mr, nr, _) = s.tile, s.warp_tile
        kc = min(_round_up(kc, lanes), _round_up(p.k, lanes)) if p.k else _round_up(kc, lanes)
        mc = min(_round_up(mc, mr), _round_up(p.m, mr)) if p.m else _round_up(mc, mr)
        return replace(s, tile=(mc, _round_up(n, nr), kc))

    space = (SearchSpace(adjust=fit).lanes(lanes).warp_m([1, 2, 4, 6]).warp_n([1, 2, 3, 4, 8]).warp_k([lanes])
             .tile_m([8, 16, 32]).tile_n([n]).tile_k([256, 512, 1024, 2048, 4096, 8192]).stages([1, 2]))
    return space.constrain(f"the accumulators fit {caps.cpu.vector_registers} vector registers",
                           lambda c, s: c["warp_m"] * c["warp_n"] + c["warp_m"] + 1 <= caps.cpu.vector_registers)


def _gemm_check(p: Problem, caps: Capabilities, s: Schedule) -> None:
    check_gemm_schedule(p, caps, s)


def _conv_check(p: Problem, caps: Capabilities, s: Schedule) -> None:
    """The implicit GEMM's schedule, and K blocks the gather can fill: the packing copies runs of
    C channels (or whole kernel rows), so a K block shorter than K holds whole runs or divides
    one (another K block read past the runs: wrong numbers)."""
    check_gemm_schedule(p, caps, s)
    if p.view is None:
        return
    _, _, k, gather = cpu_implicit_gemm(p.view)
    lanes, kc = s.lane_map.shape[-1], s.tile[2]
    unit = gather.unit(lanes)
    if kc < k and kc % unit and unit % kc:
        what = "a kernel row of channels" if gather.wide(lanes) else "the input's channels"
        raise OpError(f"conv2d as an implicit GEMM: the K block (tile[2] = {kc}) must be a multiple of {unit} "
                      f"({what}, which the packing copies as one run) or divide it; the nearest that fits is "
                      f"{conv_k_block(unit, k, kc)}")


def _conv_default(p: Problem, caps: Capabilities, threads: int | None) -> Schedule | None:
    if p.schedule is not None or p.view is None:
        return p.schedule
    return conv_gemm_schedule(p.view, caps.cpu, threads or caps.cpu.cores)


def _im2col_gemm(v: OpView) -> tuple[int, int, int]:
    """im2col_nchw's GEMM: (filters, positions of the batch, taps of the channels)."""
    (n, c, _, _), (k, _, kh, kw), (oh, ow) = v.operands["input"].shape, v.operands["filter"].shape, v.result.shape[2:]
    return k, n * oh * ow, c * kh * kw


def im2col_schedule(v: OpView, host: CPU, threads: int) -> Schedule:
    """The default GEMM blocking, but the filters (A, read in place) in one M block where each
    strip of B is worth it: each work item then packs the B strips it reads itself, from the
    image, instead of a packing pass before the items (a fork / join more per K block, strips
    packed by one core and read by another). That block is read again for every strip, so it
    takes few strips: 2-4 a thread, or up to 8 of an A block that stays in L2 (3/4 of it).
    Zen 4, 8 images, 2 threads, against blocks of 128-256 filters: ResNet-50's 3x3 convs on
    4x4-8x8 images and 1x1 convs to 256-2048 filters 4-8 % faster (1 thread 0-2 %); but 3x3
    convs C512 on 7x7 images (13 strips of a 1 MiB A block) 20 % slower, C256 on 14x14 (49
    strips of 0.6 MiB) 8 % slower."""
    m, n, k = _im2col_gemm(v)
    s = default_gemm_schedule(m, n, k, host, threads, shaped_tile=False)
    (_, nc, kc), (mr, nr, _) = s.tile, s.warp_tile
    strips = -(-n // nr)
    if 2 * threads <= strips and (strips <= 4 * threads
                                  or strips <= 8 * threads and 4 * m * kc <= host.l2_bytes * 3 // 4):
        s = replace(s, tile=(_round_up(m, mr), nc, kc))
    return s


def _im2col_default(p: Problem, caps: Capabilities, threads: int | None) -> Schedule | None:
    if p.schedule is not None or p.view is None:
        return p.schedule
    return im2col_schedule(p.view, caps.cpu, threads or caps.cpu.cores)


def _im2col_space(p: Problem, caps: Capabilities) -> SearchSpace:
    """The packed GEMM's knobs, on im2col_nchw's GEMM (filters x positions x taps)."""
    m, n, k = _im2col_gemm(p.view) if p.view is not None else (None, None, None)
    return _gemm_space(replace(p, op="gemm", view=None, m=m, n=n, k=k), caps)


def _direct_default(p: Problem, caps: Capabilities, threads: int | None) -> Schedule | None:
    if p.schedule is not None or p.view is None:
        return p.schedule
    cpu = caps.cpu
    return direct_nchw_schedule(p.view, cpu.f32_lanes, cpu.vector_registers * 3 // 4, threads or cpu.cores, cpu.l2_bytes)


def _direct_space(p: Problem, caps: Capabilities) -> SearchSpace:
    """The direct kernel's knobs: the register tile (MR filters x NV position vectors) and the
    positions of a work item (rounded to whole register tiles, cut to the image's)."""
    lanes, registers = caps.cpu.f32_lanes, caps.cpu.vector_registers
    _, _, (k, _, _), (oh, _), (_, sw), _, pads = nchw_geometry(p.view)
    positions = oh * -(-(p.view.operands["input"].shape[3] + pads[2] + pads[3]) // sw)

    def fit(s: Schedule) -> Schedule:
        mr, seg = s.warp_tile
        return replace(s, tile=(mr, min(_round_up(s.tile[1], seg), _round_up(positions, seg))))

    return (SearchSpace(base=Schedule(tile=(1, 1)), adjust=fit).lanes(lanes).warp_m([1, 2, 3, 4, 5, 6, 8, 12])
            .warp_n([lanes * v for v in (1, 2, 3, 4, 6)]).tile_n([64, 256, 1024, 4096, 16384])
            .constrain(f"the register tile fits {registers} vector registers",
                       lambda c, s: c["warp_m"] * c["warp_n"] // lanes + 2 <= registers)
            .constrain("no more filter rows than filters", lambda c, s: c["warp_m"] <= _round_up(k, 2)))


def _direct_check(p: Problem, caps: Capabilities, s: Schedule) -> None:
    check_direct_nchw_schedule(s, caps.cpu.vector_registers)


# The depthwise NCHW kernel's vectors: 8 lanes on AVX-512 too. Its loads start anywhere in a
# phase plane's rows, and 16-lane loads split cache lines twice as often; rows of 7 or 14
# columns waste less. Zen 4, 1 thread, 8 images, in-process A/B (best row tile each): 5x5 on
# 7x7 C576 500 -> 260 us, 3x3 stride 2 56x56 C72 643 -> 396, 3x3 28x28 C88 234 -> 223, 5x5
# stride 2 28x28 C96 398 -> 285; 4 lanes slower on each.
DEPTHWISE_MAX_LANES = 8


def _depthwise_lanes(caps: Capabilities) -> int:
    return min(caps.cpu.f32_lanes, DEPTHWISE_MAX_LANES)


def _depthwise_default(p: Problem, caps: Capabilities, threads: int | None) -> Schedule | None:
    if p.schedule is not None or p.view is None or p.layout != "nchw":
        return p.schedule
    return depthwise_nchw_schedule(p.view, _depthwise_lanes(caps), caps.cpu.vector_registers - 4)


def _depthwise_space(p: Problem, caps: Capabilities) -> SearchSpace:
    """The depthwise kernel's register tile: R output rows x NV vectors of columns."""
    lanes, registers = _depthwise_lanes(caps), caps.cpu.vector_registers
    _, _, _, (oh, ow), _, _, _ = nchw_geometry(p.view)
    vectors = -(-ow // lanes)
    return (SearchSpace().lanes(lanes).warp_m([r for r in (1, 2, 3, 4, 6, 7, 8, 12) if r <= oh])
            .warp_n([lanes * v for v in range(1, 13) if v <= vectors])
            .constrain(f"the register tile fits {registers} vector registers",
                       lambda c, s: c["warp_m"] * c["warp_n"] // lanes + 2 <= registers))


def _depthwise_check(p: Problem, caps: Capabilities, s: Schedule) -> None:
    if p.layout == "nchw":
        check_depthwise_nchw_schedule(s, caps.cpu.vector_registers)


def _attention_fits(p: Problem, caps: Capabilities) -> bool | None:
    if _simd_schedule(p) is not None:
        return _simd_schedule(p)  # a SIMD schedule asks for the kernel (its check names a bad head dim)
    if not known(p.head_dim, p.value_head_dim):
        return None
    return p.head_dim % caps.cpu.f32_lanes == 0 and p.value_head_dim % caps.cpu.f32_lanes == 0


# AVX-512 attention blocks: one register tile of 8 query rows against 256 keys (at most the keys
# there are). Zen 4, recorded space S512 D64 (bench/tuning_spaces): 16 x 64 was 1.10x the best,
# 8 x 256 1.02x; in-process A/B over the bench's shapes, 1 and 2 threads: S512 D64 / D128, causal
# or not, S2048 causal -4 to -7 % time, B8 H12 S128 (128 keys) -5 %. AVX2 keeps 2 tiles x 64 keys
# (Zen 3's recorded default is within 3 % of its best).
AVX512_KEY_BLOCK = 256
# On several threads an AVX-512 block takes two register tiles of query rows (16). In-process A/B
# on Zen 5 against 8 rows, 2 threads: 128 keys 1.02-1.04x (B8 H12, B1 H4, B8 H4 causal), 512-2048
# keys 1.00-1.01x (the tuner had found 32 rows 1.08x on B8 H12 S128); on one thread 16 rows ran
# 0.985-1.009x, so one thread keeps one tile.
AVX512_QUERY_TILES_THREADED = 2


def _attention_default(p: Problem, caps: Capabilities, threads: int | None) -> Schedule:
    """Blocks of queries x keys (AVX2: 2 QK^T register tiles x 64 keys; AVX-512: one x up to 256
    keys, two on several threads); the register tile is as many query rows x 2 key vectors as the
    vector registers hold (AVX2: 6 x 16 keys; AVX-512 8 x 32)."""
    lanes = caps.cpu.f32_lanes
    s = p.schedule
    if s is None:
        rows = min(8, (caps.cpu.vector_registers - 3) // 2)
        tile = (2 * rows, max(64, 4 * lanes))
        if lanes >= 16:
            keys = (p.view.operands["key"].shape[-2] if p.view is not None else None) or AVX512_KEY_BLOCK
            tiles = AVX512_QUERY_TILES_THREADED if (threads or caps.cpu.cores) > 1 else 1
            tile = (tiles * rows, min(AVX512_KEY_BLOCK, -(-keys // (2 * lanes)) * 2 * lanes))
        s = Schedule(tile=tile, lane_map=LaneMap("simd", (lanes,)))
    if s.warp_tile is None and s.tile is not None and len(s.tile) == 2 and s.tile[1] % lanes == 0:
        rows, vectors = qk_tile(s.tile[0], s.tile[1], lanes, caps.cpu.vector_registers)
        s = replace(s, warp_tile=(rows, vectors * lanes))
    return s


def _attention_space(p: Problem, caps: Capabilities) -> SearchSpace:
    """Blocks of query rows x keys, and the QK^T register tile inside them."""
    lanes = caps.cpu.f32_lanes
    return (SearchSpace().lanes(lanes).tile_m([4, 6, 8, 12, 16, 24, 32]).tile_n([32, 64, 128, 256])
            .warp_m([1, 2, 3, 4, 6, 8]).warp_n([lanes, 2 * lanes])
            .constrain("the register tile's keys divide the key block", lambda c, s: c["tile_n"] % c["warp_n"] == 0))


def _attention_check(p: Problem, caps: Capabilities, s: Schedule) -> None:
    lanes = s.lane_map.shape[-1]
    if s.tile is None or len(s.tile) != 2 or s.tile[1] % lanes:
        raise OpError(f"a CPU attention schedule needs tile = [query rows, keys] with keys a multiple of "
                      f"the {lanes} SIMD lanes; got {s.tile}")
    if s.warp_tile is None or s.warp_tile[1] % lanes:
        raise OpError(f"a CPU attention schedule needs warp_tile = [query rows, keys] (the QK^T register "
                      f"tile) with keys a multiple of the {lanes} SIMD lanes; got {s.warp_tile}")
    rows, keys = s.warp_tile
    registers = tile_registers(rows, keys // lanes)
    if lanes == caps.cpu.f32_lanes and registers > caps.cpu.vector_registers:
        raise OpError(f"attention register tile {rows}x{keys} needs {registers} vector registers; this CPU has "
                      f"{caps.cpu.vector_registers} (reduce its rows or keys)")
    if p.head_dim % lanes or p.value_head_dim % lanes:
        raise OpError(f"the CPU attention kernel needs head dims that are multiples of {lanes}; "
                      "drop the schedule to use the reference lowering")


def _softmax_fits(p: Problem, caps: Capabilities) -> bool | None:
    return _simd_schedule(p) is not False and p.last_axis


def _depthwise(layout: str) -> Rule:
    return Rule(f"{layout.upper()}, one filter per channel (groups = channels = filters), f32 throughout",
                lambda p, caps: False if p.dtype != "f32" else None if p.depthwise is None
                else p.layout == layout and p.depthwise and all(d == "f32" for d in (p.dtypes or (p.dtype,))))


ON_CPU, SIMD = BackendIs("cpu"), SimdWidthAtLeast(128)  # vectors of 4 f32 lanes at least (LLVM splits wider)
NCHW_F32 = Rule("NCHW, groups = 1, f32 throughout", lambda p, caps: False if p.dtype != "f32" else None
                if p.layout is None else p.layout == "nchw" and p.groups == 1
                and all(d == "f32" for d in (p.dtypes or (p.dtype,))))
GEMMS = ("gemm", "fused_gemm")
for _variant in (
    Variant("cpu.gemm.inner_product", "cpu", GEMMS, (ON_CPU, SIMD, Rule(
        f"x @ W^T with at most {DOT_MAX_ROWS} rows and K >= 512, or a schedule whose warp_tile is [MR, NR, lanes]",
        _wants_inner_products, preference=True)), 30,
        "inner products along K, nothing packed (nn.Linear with few rows)", frozenset({"simd"}),
        _gemm_default(dot_gemm_schedule), _dot_space, _gemm_check),
    Variant("cpu.gemm.rows", "cpu", GEMMS, (ON_CPU, SIMD, Rule(
        f"x @ W (W as it lies, [K, N]) with at most {ROWS_MAX_ROWS} rows, or a schedule of tile [NB] alone",
        _streams_rows, preference=True)), 35,
        "W's rows streamed once into an L1 buffer of sums per column chunk, nothing packed (decoding steps)",
        frozenset({"simd"}), _gemm_default(rows_gemm_schedule), _rows_space, _rows_check),
    Variant("cpu.gemm.packed", "cpu", GEMMS, (ON_CPU, SIMD, Rule("no schedule, or one on SIMD lanes with warp_tile "
                                                        "[MR, NR, 1]", _packed)), 20,
            "BLIS-style cache blocks, packed panels, an MR x NR register tile of FMAs", frozenset({"simd"}),
            _gemm_default(default_gemm_schedule), _gemm_space, _gemm_check),
    Variant("cpu.conv2d.pointwise_nchw", "cpu", ("conv2d",), (ON_CPU, SIMD, Rule(
        f"NCHW 1x1 or patches (filter = stride), no padding, groups = 1, f32, >= {POINTWISE_MIN_PIXELS} pixels "
        "or images of 1 pixel",
        # (decided on the op itself: planned without shapes, a conv is not assumed to be 1x1)
        lambda p, caps: p.view is not None and pointwise_nchw(p.view))), 40,
        "one GEMM per image on the packed kernel (filter x image as they lie); 1-pixel images: one for the batch",
        frozenset({"simd"})),
    Variant("cpu.conv2d.im2col_nchw", "cpu", ("conv2d",), (ON_CPU, SIMD, NCHW_F32, Rule(
        "no schedule, or the packed GEMM's (tile [MC, NC, KC])",
        lambda p, caps: _packed(p, caps) and (p.schedule is None or len(p.schedule.tile or ()) == 3)), Rule(
        f"output images of at most {IM2COL_MAX_PIXELS} pixels, not a 1x1 unpadded that reads them in place, "
        f"an im2col of at most {IM2COL_MAX_BYTES >> 20} MiB",
        lambda p, caps: p.view is not None and im2col_pays(p.view), preference=True)), 45,
        "one GEMM for the batch: the FCHW filter as it lies times the im2col of the images, channel-major",
        frozenset({"simd"}), _im2col_default, _im2col_space, _gemm_check),
    Variant("cpu.conv2d.direct_nchw", "cpu", ("conv2d",), (ON_CPU, SIMD, NCHW_F32), 30,
        "direct convolution over phase planes (no transposes, no im2col)", frozenset({"simd"}),
        _direct_default, _direct_space, _direct_check),
    Variant("cpu.conv2d.depthwise_nchw", "cpu", ("conv2d",), (ON_CPU, SIMD, _depthwise("nchw")), 30,
        "per channel: zero-padded phase planes, each output row in register tiles of column vectors",
        frozenset({"simd"}), _depthwise_default, _depthwise_space, _depthwise_check),
    Variant("cpu.conv2d.depthwise_nhwc", "cpu", ("conv2d",), (ON_CPU, SIMD, _depthwise("nhwc")), 30,
        "per output pixel, blocks of channel vectors over the taps inside the image", frozenset({"simd"})),
    Variant("cpu.conv2d.implicit_gemm", "cpu", ("conv2d",), (ON_CPU, SIMD, Rule(
        "groups = 1", lambda p, caps: None if p.groups is None else p.groups == 1)), 20,
        "the packed GEMM over im2col rows of the NHWC image: read in place where all their taps are inside it, "
        "packed elsewhere (stride 1 with padding: a zero-padded copy, read in place throughout)", frozenset({"simd"}),
        _conv_default, _gemm_space, _conv_check),
    Variant("cpu.attention.flash", "cpu", ("attention",), (ON_CPU, SIMD, Rule(
        "head dims multiples of the SIMD lanes", _attention_fits)), 20,
        "flash attention: blocks of queries against blocks of keys, online softmax, S never stored",
        frozenset({"simd"}), _attention_default, _attention_space, _attention_check, dynamic=True, masks=True),
    Variant("cpu.softmax.online", "cpu", ("softmax",), (ON_CPU, SIMD, Rule(
        "along the last axis", lambda p, caps: None if p.last_axis is None else _softmax_fits(p, caps))), 20,
        "rows in parallel: three passes (one exp per element) for rows in cache, else a running max and sum",
        frozenset({"simd"}),
        lambda p, caps, threads: p.schedule or Schedule(lane_map=LaneMap("simd", (caps.cpu.f32_lanes,)))),
    Variant("cpu.reference", "cpu", OPS, (ON_CPU,), 0,
            "linalg loops (tracea-lower-to-linalg), split among the threads and vectorized: any shape and dtype",
            dynamic=True, masks=True),
):
    register_variant(_variant)


CONV_LOWERINGS = {"cpu.conv2d.implicit_gemm": conv_as_gemm, "cpu.conv2d.pointwise_nchw": conv_pointwise_nchw,
                  "cpu.conv2d.im2col_nchw": conv_im2col_nchw}


def _emit(module: ir.Operation, op: ir.Operation, v: OpView, variant_id: str, index: int, threads: int) -> None:
    """Replace `op` by the kernel of `variant_id`, its schedule checked first."""
    schedule = v.attrs.get("schedule")
    chosen = variant(variant_id)
    if chosen.check_schedule is not None and schedule is not None:
        chosen.check_schedule(Problem.from_view(v), host(), schedule)
    if schedule is not None and schedule.threads:
        threads = min(threads, schedule.threads)
    if variant_id == "cpu.softmax.online":
        inline_kernel(op, softmax_kernel_text(f"__tracea_cpu_softmax_{index}", v, schedule.lane_map.shape[-1],
                                              str(op.location), threads))
    elif variant_id == "cpu.attention.flash":
        inline_kernel(op, attention_kernel_text(f"__tracea_cpu_attention_{index}", v, str(op.location), threads))
    elif variant_id == "cpu.gemm.rows":
        inline_kernel(op, gemm_rows_kernel_text(f"__tracea_cpu_gemm_{index}", v, str(op.location), threads=threads))
    elif variant_id in ("cpu.gemm.packed", "cpu.gemm.inner_product"):
        kernel = gemm_dot_kernel_text if variant_id == "cpu.gemm.inner_product" else gemm_kernel_text
        inline_kernel(op, kernel(f"__tracea_cpu_gemm_{index}", v, str(op.location), threads=threads))
    elif variant_id == "cpu.conv2d.direct_nchw":
        inline_kernel(op, conv_nchw_kernel_text(f"__tracea_conv_{index}", v, str(op.location), schedule, threads))
    elif variant_id == "cpu.conv2d.depthwise_nchw":
        inline_kernel(op, conv_depthwise_nchw_kernel_text(f"__tracea_conv_{index}", v, str(op.location), schedule,
                                                          threads))
    elif variant_id == "cpu.conv2d.depthwise_nhwc":
        cpu = host_cpu()
        inline_kernel(op, conv_depthwise_nhwc_kernel_text(f"__tracea_conv_{index}", v, str(op.location),
                                                          cpu.f32_lanes, cpu.vector_registers, threads))
    elif variant_id in CONV_LOWERINGS:
        writer = KernelWriter(f"__tracea_conv_{index}", v.operands, v.result)
        lower = CONV_LOWERINGS[variant_id]
        gemm, result = lower(writer, v, f"__tracea_conv_gemm_{index}", threads)
        # The GEMM kernel stays a function of the module; the inliner dissolves it later.
        kernel_module = ir.Module.parse(gemm, op.context)
        kernel_module.body.operations[0].operation.move_before(module.regions[0].blocks[0].operations[0])
        declaration = re.sub(r"%arg\d+: ", "", gemm[gemm.index("func.func private"):gemm.index(" {\n")])
        inline_kernel(op, writer.text(result, str(op.location)) + declaration + "\n")


def _emit_kernels(module: ir.Operation, kinds: tuple[str, ...], threads: int) -> None:
    """Each op of `kinds` replaced by its variant's kernel (the reference's are left for
    tracea-lower-to-linalg); a bad schedule is an error at its op."""
    failed = False
    for index, op in enumerate(tracea_ops(module)):
        if op.name not in kinds:
            continue
        try:
            variant_id, decoded = select(op, host(), threads), view(op)
            count(module, f"{op.name.removeprefix('tracea.')} on {variant_id}")
            record_step(module, op, f"{describe(decoded)} on {variant_id}")
            if variant_id != "cpu.reference":
                _emit(module, op, decoded, variant_id, index, threads)
        except OpError as e:
            op.location.emit_error(f"'{op.name}' op {e}")
            failed = True
    if failed:
        raise PassFailed()


@register
@dataclass(frozen=True)
class ConvKernelsPass(TraceaPass):
    NAME = "tracea-cpu-conv"
    SUMMARY = ("run conv2d (groups = 1) on CPU kernels: NCHW f32 directly (phase planes, no transposes), "
               "the others on the GEMM kernel, packing im2col rows straight from the image")
    threads: int = option(0, "threads the kernels will run on (0: the host's cores)")

    def run(self, module: ir.Operation) -> None:
        _emit_kernels(module, ("tracea.conv2d",), self.threads or host_cpu().cores)


@register
@dataclass(frozen=True)
class CpuKernelsPass(TraceaPass):
    NAME = "tracea-cpu-kernels"
    SUMMARY = ("replace gemm / fused_gemm / attention / softmax ops by the vectorized CPU kernel of their variant "
               "(tracea.variant, or the one tracea-select-variant would choose): packed cache-blocked or "
               "inner-product GEMM, flash-style attention, online softmax")
    threads: int = option(0, "threads the kernels will run on (0: the host's cores)")

    def run(self, module: ir.Operation) -> None:
        _emit_kernels(module, GEMM_OPS + ("tracea.attention", "tracea.softmax"), self.threads or host_cpu().cores)
