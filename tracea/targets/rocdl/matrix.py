"""The AMD matrix-core GEMM (and NHWC conv2d as an implicit GEMM, its A chunks gathered from the
image): f16 / bf16 inputs, f32 accumulation on CDNA's MFMA (gfx90a,
gfx942: v_mfma_f32_32x32x8 on wave64) or RDNA3's WMMA (gfx1100: v_wmma_f32_16x16x16 on
wave32). A gpu.module text (amdgpu dialect), lowered by targets/rocdl/target.py.

    workgroup (bx, by) computes C[by BM : +BM, bx BN : +BN]; wave (wm, wn) its WM x WN part as
    (WM / IM) x (WN / IN) instruction tiles (IM x IN: 32 x 32 MFMA, 16 x 16 WMMA)
    LDS: two buffers of A [BM, BK] and B^T [BN, BK] (BK = 32 f16, k contiguous), so the lanes'
    fragments are 16-byte reads; a B given as [K, N] (an A as [K, M]) is transposed while stored;
    with a batched B (or a batched A^T) workgroup z computes matrix z
    prologue: tile 0 copied global -> LDS buffer 0 in 16-byte chunks (zero outside the matrices)
    per K tile: the next tile's chunks loaded into registers first (their latency hidden behind
    this tile's matrix instructions), this tile's fragments read from LDS, the products issued,
    the registers stored into the other buffer; one barrier
    epilogue: the fused_gemm steps on each accumulator in registers, cast, stored inside C

A sum over k does not care which lane holds which k, as long as A and B agree: an MFMA lane
group g (lanes 32 g .. 32 g + 31) takes k = 8 g .. 8 g + 7 of each 16 (two instructions), so a
lane reads its 8 k of a row in one 16-byte access (WMMA lanes read all 16).

LDS rows are 64 bytes: four 16-byte units, unit u of row r stored at u ^ ((r >> 1) & 3)
(LDS_SWIZZLE). AMD's LDS serves 128 bytes a cycle from 32 banks of 4 bytes, a 16-byte access in
phases of 8 lanes; the 8 rows a phase reads land in 8 distinct units, and so do the 8 chunks a
phase stores (bank_conflicts.report_lds proves it for the layouts used; the emulator measures it
on the machine code's own addresses).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ...codegen.bank_conflicts import TileLayout, conflicts
from ...codegen.kernel_text import fused_epilogue
from ...codegen.loop_text import LoopText, memref_text
from ...dialects.schedule import Swizzle
from ...errors import OpError
from ..nvvm.mma import MmaGemm, collapse_views, gpu_module_text, kernel_params

WORKGROUP = "#gpu.address_space<workgroup>"
BK = 32  # k per LDS tile row: 64 bytes of f16
CHUNK = 8  # elements per 16-byte copy and fragment read
LDS_SWIZZLE = Swizzle.xor(2, 3, 3)  # element offset r * 32 + k: unit (bits 3-4) ^= (r >> 1) & 3 (bits 6-7)
MATRIX_DTYPES = ("f16", "bf16")


@dataclass(frozen=True)
class MatrixInstruction:
    """One matrix-core instruction as the kernel uses it: C[IM, IN] += A[IM, IK] B[IK, IN]."""
    units: str  # "mfma", "wmma"
    im: int
    in_: int
    ik: int
    wave: int  # lanes

    @property
    def operand_elements(self) -> int:
        return self.im * self.ik // self.wave if self.units == "mfma" else self.ik

    @property
    def accumulators(self) -> int:
        return self.im * self.in_ // self.wave

    def text(self, a: str, b: str, c: str, dtype: str) -> str:
        vec = f"vector<{self.operand_elements}x{dtype}>"
        acc = f"vector<{self.accumulators}xf32>"
        if self.units == "mfma":
            return f"amdgpu.mfma {self.im}x{self.in_}x{self.ik} {a} * {b} + {c} blgp = none : {vec}, {vec}, {acc}"
        return f"amdgpu.wmma {self.im}x{self.in_}x{self.ik} {a} * {b} + {c} : {vec}, {vec}, {acc}"

    def result_position(self, item: str, lane: str, t: LoopText) -> tuple[str, str]:
        """(row, column) within the instruction tile of accumulator `item` (an index value) of lane
        `lane`: MFMA 32x32: row 8 (item / 4) + 4 (lane / 32) + item % 4, column lane % 32; WMMA
        16x16: row 2 item + lane / 16, column lane % 16."""
        col = t.op(f"arith.remui {lane}, {t.c(self.in_)} : index", "i")
        group = t.op(f"arith.divui {lane}, {t.c(self.in_)} : index", "i")
        if self.units == "mfma":
            quad = t.mul(t.op(f"arith.divui {item}, {t.c(4)} : index", "i"), t.c(8))
            return t.add(t.add(quad, t.op(f"arith.remui {item}, {t.c(4)} : index", "i")), t.mul(group, t.c(4))), col
        return t.add(t.mul(item, t.c(2)), group), col


MFMA_32X32X8 = MatrixInstruction("mfma", 32, 32, 8, 64)
WMMA_16X16X16 = MatrixInstruction("wmma", 16, 16, 16, 32)


def instruction_for(units: str) -> MatrixInstruction:
    return {"mfma": MFMA_32X32X8, "wmma": WMMA_16X16X16}[units]


@dataclass(frozen=True)
class MatrixTiles:
    block_m: int
    block_n: int
    wave_m: int
    wave_n: int

    @staticmethod
    def default(ins: MatrixInstruction) -> "MatrixTiles":
        # four waves, each 2 x 2 instruction tiles: 128 x 128 with MFMA 32x32, 64 x 64 with WMMA 16x16
        return MatrixTiles(4 * ins.im, 4 * ins.in_, 2 * ins.im, 2 * ins.in_)

    def waves(self) -> tuple[int, int]:
        return self.block_m // self.wave_m, self.block_n // self.wave_n

    def lds_bytes(self) -> int:
        return 2 * (self.block_m + self.block_n) * BK * 2


def check_matrix_gemm(g: MmaGemm) -> None:
    if g.dtype not in MATRIX_DTYPES:
        raise OpError(f"the AMD matrix-core GEMM takes f16 or bf16 inputs, got {g.dtype}; f32 runs the SIMT GEMM")
    if g.k % CHUNK or g.n % CHUNK:
        raise OpError(f"the AMD matrix-core GEMM copies 16-byte chunks of rows: K ({g.k}) and N ({g.n}) must be "
                      f"multiples of {CHUNK}; pad them")
    if g.conv is not None and g.conv.image.shape[3] % CHUNK:
        raise OpError(f"the AMD matrix-core conv2d gathers 16-byte runs of channels: C ({g.conv.image.shape[3]}) must "
                      f"be a multiple of {CHUNK}; pad the channels")
    if g.transpose_a and g.m % CHUNK:
        raise OpError(f"the AMD matrix-core GEMM copies 16-byte chunks of rows of a transposed A: M ({g.m}) must be "
                      f"a multiple of {CHUNK}; pad it")


def lds_layout(rows: int) -> TileLayout:
    return TileLayout(rows, BK, 2, LDS_SWIZZLE)


def report_lds(tiles: MatrixTiles, ins: MatrixInstruction) -> dict[str, int]:
    """Extra LDS cycles (bank conflicts, the model of bank_conflicts) of the kernel's 16-byte
    accesses, worst over the tile: chunk stores (lane t stores chunk t of the tile, row-major),
    fragment reads (lane l reads row l % IM at unit 2 q + l / IM for MFMA, units 2 q and 2 q + 1
    for WMMA)."""
    worst = {"store": 0, "read": 0}
    for rows in (tiles.block_m, tiles.block_n):
        layout = lds_layout(rows)
        per_row = BK // CHUNK
        for first in range(0, rows * per_row, ins.wave):
            addresses = [layout.address(c // per_row, c % per_row * CHUNK) for c in range(first, first + ins.wave)]
            worst["store"] = max(worst["store"], conflicts(addresses, 16))
        for row0 in range(0, rows, ins.im):
            for q in range(BK // 16):
                if ins.units == "mfma":
                    units = [[2 * q + lane // ins.im for lane in range(ins.wave)]]
                else:
                    units = [[2 * q] * ins.wave, [2 * q + 1] * ins.wave]
                for unit in units:
                    addresses = [layout.address(row0 + lane % ins.im, unit[lane] * CHUNK) for lane in range(ins.wave)]
                    worst["read"] = max(worst["read"], conflicts(addresses, 16))
    return worst


def matrix_gemm_module_text(g: MmaGemm, ins: MatrixInstruction, tiles: MatrixTiles, name: str = "gemm") -> str:
    """A gpu.module with kernel @name(A, B[, bias][, residual], C) (mma.kernel_params)."""
    check_matrix_gemm(g)
    m, n, k = g.m, g.n, g.k
    BM, BN = tiles.block_m, tiles.block_n
    waves_m, waves_n = tiles.waves()
    threads = waves_m * waves_n * ins.wave
    dt = g.dtype
    As_t, Bs_t = memref_text((2, BM, BK), dt)[:-1] + f", {WORKGROUP}>", memref_text((2, BN, BK), dt)[:-1] + f", {WORKGROUP}>"
    A_t, B_t, C_t = g.matrix_type("A", dt), g.matrix_type("B", dt), g.matrix_type("C", g.out_dtype)
    if g.conv is not None:
        A_t = memref_text(g.conv.image.shape, dt)
    chunk_t = f"vector<{CHUNK}x{dt}>"
    acc_t = f"vector<{ins.accumulators}xf32>"
    t = LoopText()
    t.depth = 3
    for line in collapse_views(g):
        t.line(line)
    t.line("%tid = gpu.thread_id x")
    t.line("%bx = gpu.block_id x")
    t.line("%by = gpu.block_id y")
    row0, col0 = t.mul("%by", t.c(BM)), t.mul("%bx", t.c(BN))
    wave = t.op(f"arith.divui %tid, {t.c(ins.wave)} : index", "i")
    lane = t.op(f"arith.remui %tid, {t.c(ins.wave)} : index", "i")
    wave_row = t.mul(t.op(f"arith.divui {wave}, {t.c(waves_n)} : index", "i"), t.c(tiles.wave_m))
    wave_col = t.mul(t.op(f"arith.remui {wave}, {t.c(waves_n)} : index", "i"), t.c(tiles.wave_n))
    zero_chunk = t.op(f"arith.constant dense<0.0> : {chunk_t}", "z")
    zero_acc = t.op(f"arith.constant dense<0.0> : {acc_t}", "z")

    def swizzled(row: str, unit: str) -> str:
        """The LDS column of 16-byte unit `unit` of tile row `row`: LDS_SWIZZLE (Swizzle.apply) on
        the element offset row * BK + column, whose XOR source bits lie in the row's part."""
        sw = LDS_SWIZZLE
        mask = ((1 << sw.bits) - 1) << (sw.base + sw.shift)
        source = t.op(f"arith.andi {t.mul(row, t.c(BK))}, {t.c(mask)} : index", "i")
        flip = t.op(f"arith.shrui {source}, {t.c(sw.shift)} : index", "i")
        return t.op(f"arith.xori {t.mul(unit, t.c(CHUNK))}, {flip} : index", "i")

    def guarded_chunk(mem: str, mem_t: str, r: str, c: str, rows: int, cols: int) -> str:
        inside = t.op(f"arith.andi {t.cmp('ult', r, t.c(rows))}, {t.cmp('ult', c, t.c(cols))} : i1", "p")
        return t.guarded(inside, chunk_t, lambda: t.op(f"vector.load {mem}[{r}, {c}] : {mem_t}, {chunk_t}", "v"),
                         zero_chunk)

    def gathered_chunk(m_: str, k_: str) -> str:
        """Chunk (m, k) of a conv's im2col: channels c .. c + 7 of image pixel (n, oy sy + ky dy -
        top, ox sx + kx dx - left) for m = (n, oy, ox), k = (ky, kx, c); zero in the padding. A
        coordinate before the image is a huge unsigned one: one unsigned compare per axis."""
        cv = g.conv
        (_, h, w, ch), (_, kw), (oh, ow) = cv.image.shape, cv.kernel, cv.out_hw

        def split(x: str, d: int) -> tuple[str, str]:
            return t.op(f"arith.divui {x}, {t.c(d)} : index", "i"), t.op(f"arith.remui {x}, {t.c(d)} : index", "i")
        image, pixel = split(m_, oh * ow)
        oy, ox = split(pixel, ow)
        tap, c0 = split(k_, ch)
        ky, kx = split(tap, kw)
        y = t.op(f"arith.subi {t.add(t.mul(oy, t.c(cv.stride[0])), t.mul(ky, t.c(cv.dilation[0])))}, "
                 f"{t.c(cv.top_left[0])} : index", "i")
        x = t.op(f"arith.subi {t.add(t.mul(ox, t.c(cv.stride[1])), t.mul(kx, t.c(cv.dilation[1])))}, "
                 f"{t.c(cv.top_left[1])} : index", "i")
        inside = t.cmp("ult", m_, t.c(m))
        for value, bound in ((k_, k), (y, h), (x, w)):
            inside = t.op(f"arith.andi {inside}, {t.cmp('ult', value, t.c(bound))} : i1", "p")
        return t.guarded(inside, chunk_t, lambda: t.op(f"vector.load %A[{image}, {y}, {x}, {c0}] : {A_t}, {chunk_t}", "v"),
                         zero_chunk)

    # An operand tile is [rows, BK] in LDS (k contiguous). Stored k-contiguous in memory (A [M, K],
    # B^T [N, K]), chunk c of it is row c / 4, unit c % 4, stored as it came; stored k-major (B
    # [K, N], A^T [K, M]), chunk c is 8 rows of k row c % BK, scattered into 8 LDS rows. Lanes
    # take consecutive k there, so the 2-byte stores of an instruction fill one LDS row.
    def copies(rows: int) -> list[str]:
        """This lane's chunks of a [rows, BK] tile: c = tid, tid + threads, ..."""
        return [t.add("%tid", t.c(i * threads)) for i in range(-(-rows * BK // CHUNK // threads))]

    operands = [("%A", A_t, "%As", As_t, BM, row0, m, g.transpose_a), ("%B", B_t, "%Bs", Bs_t, BN, col0, n, not g.transpose_b)]

    def split(c: str, k_major: bool) -> tuple[str, str]:
        """(row or k, unit) of chunk c."""
        if k_major:
            return t.op(f"arith.remui {c}, {t.c(BK)} : index", "i"), t.op(f"arith.divui {c}, {t.c(BK)} : index", "i")
        return t.op(f"arith.divui {c}, {t.c(BK // CHUNK)} : index", "i"), t.op(f"arith.remui {c}, {t.c(BK // CHUNK)} : index", "i")

    def load_tile(k0: str) -> list[list[str]]:
        chunks = []
        for mem, mem_t, _, _, rows, base, total, k_major in operands:
            mine = []
            for c in copies(rows):
                r, u = split(c, k_major)
                if mem == "%A" and g.conv is not None:
                    mine.append(gathered_chunk(t.add(base, r), t.add(k0, t.mul(u, t.c(CHUNK)))))
                elif k_major:
                    mine.append(guarded_chunk(mem, mem_t, t.add(k0, r), t.add(base, t.mul(u, t.c(CHUNK))), k, total))
                else:
                    mine.append(guarded_chunk(mem, mem_t, t.add(base, r), t.add(k0, t.mul(u, t.c(CHUNK))), total, k))
            chunks.append(mine)
        return chunks

    def store_tile(buf: str, chunks: list[list[str]]) -> None:
        for (_, _, tile, tile_t, rows, _, _, k_major), mine in zip(operands, chunks):
            for c, x in zip(copies(rows), mine):
                t.open(f"scf.if {t.cmp('ult', c, t.c(rows * BK // CHUNK))}")
                r, u = split(c, k_major)
                if not k_major:
                    t.line(f"vector.store {x}, {tile}[{buf}, {r}, {swizzled(r, u)}] : {tile_t}, {chunk_t}")
                else:
                    unit = t.op(f"arith.divui {r}, {t.c(CHUNK)} : index", "i")
                    within = t.op(f"arith.remui {r}, {t.c(CHUNK)} : index", "i")
                    for j in range(CHUNK):
                        row = t.add(t.mul(u, t.c(CHUNK)), t.c(j))
                        x_j = t.op(f"vector.extract {x}[{j}] : {dt} from {chunk_t}", "e")
                        t.line(f"memref.store {x_j}, {tile}[{buf}, {row}, {t.add(swizzled(row, unit), within)}] : {tile_t}")
                t.close()

    t.line("// prologue: K tile 0 into LDS buffer 0")
    store_tile(t.c(0), load_tile(t.c(0)))
    t.line("gpu.barrier")
    tiles_m, tiles_n = tiles.wave_m // ins.im, tiles.wave_n // ins.in_
    accs = [f"%acc{i}_{j}" for i in range(tiles_m) for j in range(tiles_n)]
    types = ", ".join([acc_t] * len(accs))
    n_k = -(-k // BK)
    t.open(f"%res:{len(accs)} = scf.for %kt = {t.c(0)} to {t.c(n_k)} step {t.c(1)} iter_args("
           + ", ".join(f"{a} = {zero_acc}" for a in accs) + f") -> ({types})")
    buf = t.op(f"arith.remui %kt, {t.c(2)} : index", "i")
    nxt = t.op(f"arith.subi {t.c(1)}, {buf} : index", "i")
    following = load_tile(t.mul(t.add("%kt", t.c(1)), t.c(BK)))  # past K: zeros, stored and never read

    def fragments(tile: str, tile_t: str, row: str, q: int) -> list[str]:
        """This lane's operand(s) for the instructions of k group q (16 k) of LDS row `row`."""
        if ins.units == "mfma":  # lane group l / IM takes 8 k: two instructions' 4
            unit = t.add(t.c(2 * q), t.op(f"arith.divui {lane}, {t.c(ins.im)} : index", "i"))
            x = t.op(f"vector.load {tile}[{buf}, {row}, {swizzled(row, unit)}] : {tile_t}, {chunk_t}", "f")
            return [t.op(f"vector.shuffle {x}, {x} [{', '.join(str(4 * s + e) for e in range(4))}] : {chunk_t}, {chunk_t}",
                         "f") for s in range(2)]
        lo, hi = (t.op(f"vector.load {tile}[{buf}, {row}, {swizzled(row, t.c(2 * q + h))}] : {tile_t}, {chunk_t}", "f")
                  for h in range(2))
        return [t.op(f"vector.shuffle {lo}, {hi} [{', '.join(map(str, range(16)))}] : {chunk_t}, {chunk_t}", "f")]

    current = list(accs)
    for q in range(BK // 16):
        a_frags = [fragments("%As", As_t, t.add(t.add(wave_row, t.c(i * ins.im)), t.op(f"arith.remui {lane}, {t.c(ins.im)} : index", "i")), q)
                   for i in range(tiles_m)]
        b_frags = [fragments("%Bs", Bs_t, t.add(t.add(wave_col, t.c(j * ins.in_)), t.op(f"arith.remui {lane}, {t.c(ins.in_)} : index", "i")), q)
                   for j in range(tiles_n)]
        for s in range(len(a_frags[0])):
            current = [t.op(ins.text(a_frags[i][s], b_frags[j][s], current[i * tiles_n + j], dt), "d")
                       for i in range(tiles_m) for j in range(tiles_n)]
    store_tile(nxt, following)
    t.line("gpu.barrier")
    t.line(f"scf.yield {', '.join(current)} : {types}")
    t.close()

    # epilogue: each accumulator where the instruction's layout puts it, in a loop over a tile's
    # accumulators (one copy of the fused steps, not 16). On gfx1100 an erf GELU still spills 48
    # bytes: the main loop already holds ~220 of the 256 VGPRs there.
    for i in range(tiles_m):
        for j in range(tiles_n):
            t.for_("%item", t.c(0), t.c(ins.accumulators), t.c(1))
            r_in, c_in = ins.result_position("%item", lane, t)
            r = t.add(t.add(row0, t.add(wave_row, t.c(i * ins.im))), r_in)
            c = t.add(t.add(col0, t.add(wave_col, t.c(j * ins.in_))), c_in)
            inside = t.op(f"arith.andi {t.cmp('ult', r, t.c(m))}, {t.cmp('ult', c, t.c(n))} : i1", "p")
            t.open(f"scf.if {inside}")
            value = t.op(f"vector.extract %res#{i * tiles_n + j}[%item] : f32 from {acc_t}", "x")
            operands = {}
            if g.bias_dtype:
                operands["bias_add"] = (t.op(f"memref.load %bias[{c}] : {memref_text((n,), g.bias_dtype)}", "e"),
                                        g.bias_dtype)
            if g.residual_dtype:
                operands["residual_add"] = (t.op(f"memref.load %residual[{r}, {c}] : "
                                                 f"{g.matrix_type('residual', g.residual_dtype)}", "e"), g.residual_dtype)
            lines, x = fused_epilogue(value, g.epilogue, operands, g.out_dtype, None, f"%ep{i}_{j}_")
            for line in lines:
                t.line(line)
            t.line(f"memref.store {x}, %C[{r}, {c}] : {C_t}")
            t.close()
            t.close()
    return gpu_module_text(t, name, kernel_params(g), (threads, 1), f"%As: {As_t}, %Bs: {Bs_t}")


def grid(g: MmaGemm, tiles: MatrixTiles) -> tuple[int, int, int]:
    """Output tiles; with a batch grid, block z computes matrix z (mma.collapse_views)."""
    return -(-g.n // tiles.block_n), -(-g.m // tiles.block_m), math.prod(g.lead) if g.batch_grid else 1
