"""The Tensor Core GEMM for NVIDIA sm_80 and later: f16 / bf16 inputs, f32 accumulation on
`mma.sync.m16n8k16`, fed from shared memory by `ldmatrix`, which asynchronous copies (cp.async)
fill through a multi-stage pipeline. A gpu.module text, lowered by targets/nvvm/target.py.

    block (bx, by) computes output tile launch_order_tile(by * blocks x + bx) (grouped for L2
    reuse), C[row BM : +BM, col BN : +BN]; warp (wm, wn) its WM x WN part, as
    (WM / 16) x (WN / 8) m16n8 accumulator tiles (vector<2x2xf32> per thread)
    pipeline (phase_cycle.cp_async_plan, proved safe by its checker for this K before emission):
        tiles of A (BM x BK) and B (BK x BN, or BN x BK for B^T) stream into `stages` buffers
        by 16-byte cp.async copies, zero-filled outside the matrices
    per K tile, per k16 step: ldmatrix.x4 fragments of A (16 x 16) and B (16 x 16, two n8
    tiles; .trans for a row-major B), then the warp's mma.sync grid
    epilogue: the fused_gemm steps on each accumulator pair in registers, cast, stored

Shared memory is XOR-swizzled in 16-byte chunks (bank_conflicts.conflict_free_swizzle): the
copies' stores and the ldmatrix reads are both conflict-free (bank_conflicts.report is zero for
the layouts used; tests check it). Requirements: K and N multiples of 8 (16-byte chunks of
rows), rank-2 operands; M, N and K need not be multiples of the tile.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass

from ...dialects.ops import Epilogue
from ...errors import OpError
from ...codegen.bank_conflicts import CHUNK_BYTES, TileLayout, conflict_free_swizzle, report
from ...codegen.conv_gather import ConvGather
from ...codegen.loop_text import LoopText, memref_text
from ...codegen.kernel_text import fused_epilogue
from .phase_cycle import Barrier, Commit, Compute, Load, LoopPlan, WaitGroups, cp_async_plan

MMA_DTYPES = ("f16", "bf16")
ELEM_BYTES = 2
PER_CHUNK = CHUNK_BYTES // ELEM_BYTES  # elements per 16-byte copy / ldmatrix row
WORKGROUP = "#gpu.address_space<workgroup>"
GROUP_M = 8  # output-tile rows per launch-order group (Triton's GROUP_SIZE_M)


@dataclass(frozen=True)
class MmaTiles:
    block_m: int = 128
    block_n: int = 128
    block_k: int = 32
    warp_m: int = 64
    warp_n: int = 64
    stages: int = 3
    group_m: int = GROUP_M  # launch order: output tiles in groups of this many tile rows (launch_order_tile)

    @property
    def warps(self) -> tuple[int, int]:
        """(along M, along N)."""
        return self.block_m // self.warp_m, self.block_n // self.warp_n

    @property
    def threads(self) -> int:
        wm, wn = self.warps
        return 32 * wm * wn

    def shared_bytes(self) -> int:
        return self.stages * (self.block_m + self.block_n) * self.block_k * ELEM_BYTES

    def validate(self) -> None:
        problems = []
        if self.block_m % self.warp_m or self.block_n % self.warp_n:
            problems.append(f"the warp tile {self.warp_m}x{self.warp_n} must divide the block tile "
                            f"{self.block_m}x{self.block_n}")
        if self.warp_m % 16 or self.warp_n % 16:
            problems.append(f"the warp tile {self.warp_m}x{self.warp_n} must be made of 16x16 "
                            "(two m16n8k16) tiles")
        if self.block_k % 16:
            problems.append(f"block_k {self.block_k} must be a multiple of 16 (the mma's K)")
        if self.stages < 1:
            problems.append(f"stages must be >= 1, got {self.stages}")
        if self.group_m < 1:
            problems.append(f"group_m must be >= 1, got {self.group_m}")
        if not problems:
            for rows, cols in ((self.block_m, self.block_k), (self.block_k, self.block_n)):
                if rows * cols // PER_CHUNK % self.threads:
                    problems.append(f"a {rows}x{cols} tile is {rows * cols // PER_CHUNK} 16-byte copies, "
                                    f"not a multiple of the block's {self.threads} threads")
        if problems:
            raise OpError("mma tiles: " + "; ".join(problems))


@dataclass(frozen=True)
class MmaGemm:
    """What the kernel computes: C[M, N] = A[M, K] B (B is [K, N], or [N, K] with transpose_b),
    then `epilogue` (bias [N], residual [M, N] operands in that order, when used). With `conv`,
    an NHWC conv2d as an implicit GEMM: A is the im2col of the image [N, H, W, C] (gathered while
    copying, never stored), B the HWCF filter as [K, F], C the output [N, OH, OW, F]. With `lead`
    (a batched A times a shared B), A, C and the residual are [*lead, rows, .] seen as one matrix
    of m = prod(lead) x rows rows. With `lead` and `batched_b`, every operand but the bias has
    the leading dims, m is the rows of one matrix, and block z computes matrix z; so with `lead`
    and `transpose_a` (A [*lead, K, M]), whose B may be batched or shared."""
    m: int
    n: int
    k: int
    dtype: str
    out_dtype: str
    transpose_b: bool = False
    epilogue: tuple[Epilogue, ...] = ()
    bias_dtype: str | None = None
    residual_dtype: str | None = None
    conv: ConvGather | None = None
    lead: tuple[int, ...] = ()
    batched_b: bool = False
    transpose_a: bool = False  # A stored as [K, M]: its tiles are loaded as they lie, transposed by ldmatrix

    @property
    def batch_grid(self) -> bool:
        """Block z computes matrix z of the batch: with a batched B, and with a batched A^T, whose
        [K, M] matrices cannot be stacked into one of prod(lead) x M rows."""
        return self.batched_b or bool(self.transpose_a and self.lead)

    def validate(self) -> None:
        if self.dtype not in MMA_DTYPES:
            raise OpError(f"the mma.sync GEMM takes f16 or bf16 inputs, got {self.dtype}; f32 runs the SIMT GEMM")
        if self.conv is not None and self.conv.image.shape[3] % PER_CHUNK:
            raise OpError(f"the NVIDIA conv2d gathers 16-byte runs of channels: C ({self.conv.image.shape[3]}) must "
                          f"be a multiple of {PER_CHUNK}; pad the channels")
        if self.transpose_a and self.m % PER_CHUNK:
            raise OpError(f"the mma.sync GEMM copies 16-byte chunks of rows of a transposed A: M ({self.m}) must be "
                          f"a multiple of {PER_CHUNK}; pad it")
        if self.k % PER_CHUNK or self.n % PER_CHUNK:
            raise OpError(f"the mma.sync GEMM copies 16-byte chunks of rows: K ({self.k}) and N ({self.n}) "
                          f"must be multiples of {PER_CHUNK}; pad them")

    def operand_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """The A, B and C parameters' shapes."""
        if self.conv is not None:
            (n, h, w, c), (kh, kw), (oh, ow) = self.conv.image.shape, self.conv.kernel, self.conv.out_hw
            return (n, h, w, c), (kh, kw, c, self.n), (n, oh, ow, self.n)
        rows = self.m if self.batch_grid else self.m // math.prod(self.lead)
        a = (self.k, rows) if self.transpose_a else (rows, self.k)
        b = (self.n, self.k) if self.transpose_b else (self.k, self.n)
        return (*self.lead, *a), (*self.lead, *b) if self.batched_b else b, (*self.lead, rows, self.n)

    def matrix_type(self, name: str, dtype: str) -> str:
        """The type of matrix %A / %B / %C / %residual as the kernel indexes it: one matrix of a
        batch is a strided view at a dynamic offset."""
        shape = {"A": (self.k, self.m) if self.transpose_a else (self.m, self.k),
                 "B": (self.n, self.k) if self.transpose_b else (self.k, self.n),
                 "C": (self.m, self.n), "residual": (self.m, self.n)}[name]
        if not self.batch_grid or (name == "B" and not self.batched_b):  # a shared B is one matrix
            return memref_text(shape, dtype)
        return f"memref<{shape[0]}x{shape[1]}x{dtype}, strided<[{shape[1]}, 1], offset: ?>>"


def tile_layouts(tiles: MmaTiles, transpose_b: bool, transpose_a: bool = False) -> tuple[TileLayout, TileLayout]:
    """The A and B tiles as they lie in shared memory ([BM, BK] or, transposed, [BK, BM]; [BK, BN]
    or [BN, BK]), each with the swizzle that makes it conflict-free."""
    a_shape = (tiles.block_k, tiles.block_m) if transpose_a else (tiles.block_m, tiles.block_k)
    b_shape = (tiles.block_n, tiles.block_k) if transpose_b else (tiles.block_k, tiles.block_n)
    return tuple(TileLayout(*shape, ELEM_BYTES, conflict_free_swizzle(shape[1], ELEM_BYTES))
                 for shape in (a_shape, b_shape))


def trips(g: MmaGemm, tiles: MmaTiles) -> int:
    return -(-g.k // tiles.block_k)


def launch_order_tile(block, n_tiles: int, m_tiles: int, group: int, arith):
    """(tile row, tile column) of output tile number `block` in launch order: the tiles go in
    groups of `group` tile rows, column by column down each group, so the blocks running at once
    share a few A row panels and B column panels in L2 instead of sweeping all of B once per row
    of tiles (group 1: row by row). `arith(op, x, y)` does the arith dialect's index op `op`:
    as emitted ops in the kernels (IndexArith), on Python ints in tests (int_arith)."""
    per_group = group * n_tiles
    first_row = arith("muli", arith("divui", block, per_group), group)
    rows = arith("minui", arith("subi", m_tiles, first_row), group)  # the last group may be short
    within = arith("remui", block, per_group)
    return arith("addi", first_row, arith("remui", within, rows)), arith("divui", within, rows)


_INT_OPS = {"muli": operator.mul, "divui": operator.floordiv, "remui": operator.mod, "minui": min,
            "subi": operator.sub, "addi": operator.add}


def int_arith(op: str, x: int, y: int) -> int:
    return _INT_OPS[op](x, y)


class IndexArith:
    """`arith` for launch_order_tile that emits index ops into `t` (ints become constants)."""

    def __init__(self, t: LoopText):
        self.t = t

    def __call__(self, op: str, x, y) -> str:
        x, y = (self.t.c(v) if isinstance(v, int) else v for v in (x, y))
        return self.t.op(f"arith.{op} {x}, {y} : index", "i")


def grid(g: MmaGemm, tiles: MmaTiles) -> tuple[int, int, int]:
    return -(-g.n // tiles.block_n), -(-g.m // tiles.block_m), math.prod(g.lead) if g.batch_grid else 1


def mma_gemm_module_text(g: MmaGemm, tiles: MmaTiles = MmaTiles(), name: str = "gemm") -> str:
    """A gpu.module with kernel @name(A, B[, bias][, residual], C) and dynamic shared memory of
    tiles.shared_bytes() (the launch must pass it)."""
    g.validate()
    tiles.validate()
    plan = cp_async_plan(tiles.stages)
    plan.verify(trips(g, tiles))
    layouts = tile_layouts(tiles, g.transpose_b, g.transpose_a)
    for layout in layouts:
        found = report(layout)
        if any(found.values()):  # the swizzle's contract; a failure is a bug in conflict_free_swizzle
            raise OpError(f"shared-memory layout {layout} has bank conflicts {found}")
    return _Writer(g, tiles, plan, layouts).module_text(name)


def epilogue_pair(t: LoopText, g: MmaGemm, pair: str, grow: str, gcol: str, tag: str) -> str:
    """epilogue(pair) (a vector<2xf32> of accumulators) for C[grow, gcol : gcol + 2], cast to C's
    type; bias / residual read there as aligned pairs."""
    operands = {}
    if g.bias_dtype:
        operands["bias_add"] = (t.op(f"vector.load %bias[{gcol}] {_aligned_pair(g.bias_dtype)} : "
                                     f"{memref_text((g.n,), g.bias_dtype)}, vector<2x{g.bias_dtype}>", "e"), g.bias_dtype)
    if g.residual_dtype:
        operands["residual_add"] = (t.op(f"vector.load %residual[{grow}, {gcol}] {_aligned_pair(g.residual_dtype)} : "
                                         f"{g.matrix_type('residual', g.residual_dtype)}, vector<2x{g.residual_dtype}>",
                                         "e"), g.residual_dtype)
    lines, x = fused_epilogue(pair, g.epilogue, operands, g.out_dtype, 2, tag)
    for line in lines:
        t.line(line)
    return x


def store_pair(t: LoopText, g: MmaGemm, pair: str, grow: str, gcol: str, tag: str) -> None:
    """C[grow, gcol : gcol + 2] = epilogue(pair), for a row already known inside C: skipped past
    its last column, one aligned 2-element store."""
    t.open(f"scf.if {t.cmp('ult', gcol, t.c(g.n))}")
    x = epilogue_pair(t, g, pair, grow, gcol, tag)
    t.line(f"vector.store {x}, %C[{grow}, {gcol}] {_aligned_pair(g.out_dtype)} : {g.matrix_type('C', g.out_dtype)}, "
           f"vector<2x{g.out_dtype}>")
    t.close()


def _operands(g: MmaGemm) -> list[tuple[str, tuple[int, ...], str, bool]]:
    """(name, parameter shape, dtype, seen as a matrix through collapse_shape) of the kernel's
    tensor parameters, in the order tracea-gpu-kernels promises: A, B, the epilogue's bias and
    residual when used, C. A conv's image stays 4-D (its tiles are gathers)."""
    a, b, c = g.operand_shapes()
    out = [("A", a, g.dtype, g.conv is None and len(a) > 2), ("B", b, g.dtype, len(b) > 2 or g.batched_b)]
    if g.bias_dtype:
        out.append(("bias", (g.n,), g.bias_dtype, False))
    if g.residual_dtype:
        out.append(("residual", c, g.residual_dtype, len(c) > 2))
    return out + [("C", c, g.out_dtype, len(c) > 2)]


def kernel_params(g: MmaGemm) -> list[str]:
    """The kernel's tensor parameters; one seen as a matrix is named %<name>_nd (collapse_views)."""
    return [f"%{name}{'_nd' if nd else ''}: {memref_text(shape, dtype)}" for name, shape, dtype, nd in _operands(g)]


def collapse_views(g: MmaGemm) -> list[str]:
    """The N-d parameters as the matrices the kernel indexes (all contiguous): %A [M, K], %B [K, N],
    %C and %residual [M, N]; with a batch grid, this block's matrix of each (block z)."""
    lines = []
    if g.batch_grid:
        lines.append("%batch = gpu.block_id z")
        rest = "%batch"
        for i in reversed(range(len(g.lead))):
            lines += [f"%lead_size{i} = arith.constant {g.lead[i]} : index",
                      f"%lead{i} = arith.remui {rest}, %lead_size{i} : index",
                      f"%lead_rest{i} = arith.divui {rest}, %lead_size{i} : index"]
            rest = f"%lead_rest{i}"
    for name, shape, dtype, nd in _operands(g):
        if nd and g.batch_grid:
            lead = len(g.lead)
            offsets = ", ".join([f"%lead{i}" for i in range(lead)] + ["0", "0"])
            sizes = ", ".join(["1"] * lead + [str(d) for d in shape[-2:]])
            lines.append(f"%{name} = memref.subview %{name}_nd[{offsets}] [{sizes}] [{', '.join(['1'] * (lead + 2))}] "
                         f": {memref_text(shape, dtype)} to {g.matrix_type(name, dtype)}")
        elif nd:
            rows = math.prod(shape[:-1])
            groups = f"[[{', '.join(map(str, range(len(shape) - 1)))}], [{len(shape) - 1}]]"
            lines.append(f"%{name} = memref.collapse_shape %{name}_nd {groups} : {memref_text(shape, dtype)} into "
                         f"{memref_text((rows, shape[-1]), dtype)}")
    return lines


def gpu_module_text(t: LoopText, name: str, params: list[str], block: tuple[int, int], workgroup: str = "",
                    attributes: str = "") -> str:
    """A gpu.module @kernels holding kernel @name(params) of `block` threads, whose body is `t`
    (its index constants first); `workgroup`: its workgroup attributions, if any; `attributes`:
    more of the function's (", name = value")."""
    consts = [f"      {n} = arith.constant {value} : index" for value, n in sorted(t.consts.items())]
    return ("module attributes {gpu.container_module} {\n  gpu.module @kernels {\n"
            f"    gpu.func @{name}({', '.join(params)}){f' workgroup({workgroup})' if workgroup else ''} kernel\n"
            f"        attributes {{known_block_size = array<i32: {block[0]}, {block[1]}, 1>{attributes}}} {{\n"
            + "\n".join(consts + t.lines) + "\n      gpu.return\n    }\n  }\n}\n")


def _aligned_pair(dtype: str) -> str:
    """Two consecutive elements at an even column of a row of even length: aligned to their
    size, which lets them move as one 64-bit (f32) or 32-bit access."""
    return f"{{alignment = {2 * (4 if dtype == 'f32' else 2)}}}"


class _Writer:
    def __init__(self, g: MmaGemm, tiles: MmaTiles, plan: LoopPlan, layouts: tuple[TileLayout, TileLayout]):
        self.g, self.tiles, self.plan = g, tiles, plan
        self.a_layout, self.b_layout = layouts
        self.t = LoopText()
        self.t.depth = 3
        T = g.dtype
        S, BM, BN, BK = tiles.stages, tiles.block_m, tiles.block_n, tiles.block_k
        self.A_t = memref_text(g.operand_shapes()[0], T) if g.conv is not None else g.matrix_type("A", T)
        self.B_t = g.matrix_type("B", T)
        a_rows, a_cols = (BK, BM) if g.transpose_a else (BM, BK)
        self.As_t = f"memref<{S}x{a_rows}x{a_cols}x{T}, {WORKGROUP}>"
        b_rows, b_cols = (BN, BK) if g.transpose_b else (BK, BN)
        self.Bs_t = f"memref<{S}x{b_rows}x{b_cols}x{T}, {WORKGROUP}>"
        self.frag_m, self.frag_n = tiles.warp_m // 16, tiles.warp_n // 8  # m16n8 tiles per warp

    # -- index helpers -------------------------------------------------------------------
    def lane_indices(self) -> None:
        """%lane's parts of the ldmatrix addresses (x4: rows l % 16 and chunk l / 16, or rows
        l % 8 + 8 (l / 16) and chunk (l / 8) % 2) and of the m16n8 accumulator layout (row group
        l / 4, column pair 2 (l % 4))."""
        t = self.t
        t.line(f"%lane_row16 = arith.remui %lane, {t.c(16)} : index")
        t.line(f"%lane_chunk16 = arith.muli {t.op(f'arith.divui %lane, {t.c(16)} : index', 'i')}, {t.c(8)} : index")
        t.line(f"%lane_row8x = arith.addi {t.op(f'arith.remui %lane, {t.c(8)} : index', 'i')}, "
               f"{t.mul(t.op(f'arith.divui %lane, {t.c(16)} : index', 'i'), t.c(8))} : index")
        eighth = t.op(f"arith.divui %lane, {t.c(8)} : index", "i")
        t.line(f"%lane_chunk8 = arith.muli {t.op(f'arith.remui {eighth}, {t.c(2)} : index', 'i')}, {t.c(8)} : index")
        t.line(f"%lane_group = arith.divui %lane, {t.c(4)} : index")
        t.line(f"%lane_pair = arith.muli {t.op(f'arith.remui %lane, {t.c(4)} : index', 'i')}, {t.c(2)} : index")

    def swizzled(self, layout: TileLayout, row: str, col: str) -> tuple[str, str]:
        """(row, col) of element (row, col) of the tile in the swizzled layout: the same
        function bank_conflicts.TileLayout.address applies, on the element offset."""
        t, s = self.t, layout.swizzle
        if s.kind == "none":
            return row, col
        offset = t.add(t.mul(row, t.c(layout.cols)), col)
        mask = ((1 << s.bits) - 1) << (s.base + s.shift)
        bits = t.op(f"arith.andi {offset}, {t.c(mask)} : index", "i")
        moved = t.op(f"arith.shrui {bits}, {t.c(s.shift)} : index", "i")
        physical = t.op(f"arith.xori {offset}, {moved} : index", "i")
        return (t.op(f"arith.divui {physical}, {t.c(layout.cols)} : index", "i"),
                t.op(f"arith.remui {physical}, {t.c(layout.cols)} : index", "i"))

    def select(self, cond: str, x: str, y: str) -> str:
        return self.t.op(f"arith.select {cond}, {x}, {y} : index", "i")

    # -- copies ------------------------------------------------------------------------
    def copy_tile(self, src: str, src_t: str, dst: str, dst_t: str, layout: TileLayout, buffer: str,
                  row0: str, col0: str, rows: int, cols: int) -> None:
        """cp.async of a layout.rows x layout.cols tile whose (0, 0) is (row0, col0) of a
        rows x cols matrix; chunks outside the matrix are zero-filled (the source address is
        clamped inside, nothing is read from it)."""
        t = self.t
        chunks_per_row = layout.cols // PER_CHUNK
        total = layout.rows * chunks_per_row
        for i in range(total // self.tiles.threads):
            c = t.add("%tid", t.c(i * self.tiles.threads))
            r = t.op(f"arith.divui {c}, {t.c(chunks_per_row)} : index", "i")
            col = t.mul(t.op(f"arith.remui {c}, {t.c(chunks_per_row)} : index", "i"), t.c(PER_CHUNK))
            grow, gcol = t.add(row0, r), t.add(col0, col)
            inside = t.op(f"arith.andi {t.cmp('ult', grow, t.c(rows))}, {t.cmp('ult', gcol, t.c(cols))} : i1", "p")
            count = self.select(inside, t.c(PER_CHUNK), t.c(0))
            srow, scol = self.select(inside, grow, t.c(0)), self.select(inside, gcol, t.c(0))
            drow, dcol = self.swizzled(layout, r, col)
            t.op(f"nvgpu.device_async_copy {src}[{srow}, {scol}], {dst}[{buffer}, {drow}, {dcol}], "
                 f"{PER_CHUNK}, {count} {{bypassL1}} : {src_t} to {dst_t}", "cp")

    def gather_tile(self, buffer: str, k0: str) -> None:
        """cp.async of the A tile of an implicit-GEMM conv: chunk (row m, column k) of the im2col
        is channels c..c+7 of image pixel (n, oy*sy + ky*dy - top, ox*sx + kx*dx - left), for
        m = (n, oy, ox) and k = (ky, kx, c); zero-filled outside the image (the padding)."""
        t, g, T, cv = self.t, self.g, self.tiles, self.g.conv
        (_, h, w, c), (_, kw), (oh, ow) = cv.image.shape, cv.kernel, cv.out_hw
        chunks_per_row = T.block_k // PER_CHUNK
        for i in range(T.block_m * chunks_per_row // T.threads):
            idx = t.add("%tid", t.c(i * T.threads))
            r = t.op(f"arith.divui {idx}, {t.c(chunks_per_row)} : index", "i")
            col = t.mul(t.op(f"arith.remui {idx}, {t.c(chunks_per_row)} : index", "i"), t.c(PER_CHUNK))
            m, k = t.add("%row0", r), t.add(k0, col)
            image, pixel = t.op(f"arith.divui {m}, {t.c(oh * ow)} : index", "i"), t.op(f"arith.remui {m}, {t.c(oh * ow)} : index", "i")
            oy, ox = t.op(f"arith.divui {pixel}, {t.c(ow)} : index", "i"), t.op(f"arith.remui {pixel}, {t.c(ow)} : index", "i")
            tap, ch = t.op(f"arith.divui {k}, {t.c(c)} : index", "i"), t.op(f"arith.remui {k}, {t.c(c)} : index", "i")
            ky, kx = t.op(f"arith.divui {tap}, {t.c(kw)} : index", "i"), t.op(f"arith.remui {tap}, {t.c(kw)} : index", "i")
            y = t.op(f"arith.subi {t.add(t.mul(oy, t.c(cv.stride[0])), t.mul(ky, t.c(cv.dilation[0])))}, "
                     f"{t.c(cv.top_left[0])} : index", "i")
            x = t.op(f"arith.subi {t.add(t.mul(ox, t.c(cv.stride[1])), t.mul(kx, t.c(cv.dilation[1])))}, "
                     f"{t.c(cv.top_left[1])} : index", "i")
            checks = [t.cmp("ult", m, t.c(g.m)), t.cmp("ult", k, t.c(g.k)), t.cmp("sge", y, t.c(0)),
                      t.cmp("slt", y, t.c(h)), t.cmp("sge", x, t.c(0)), t.cmp("slt", x, t.c(w))]
            inside = checks[0]
            for check in checks[1:]:
                inside = t.op(f"arith.andi {inside}, {check} : i1", "p")
            count = self.select(inside, t.c(PER_CHUNK), t.c(0))
            src = [self.select(inside, v, t.c(0)) for v in (image, y, x, ch)]
            drow, dcol = self.swizzled(self.a_layout, r, col)
            t.op(f"nvgpu.device_async_copy %A[{', '.join(src)}], %As[{buffer}, {drow}, {dcol}], {PER_CHUNK}, {count} "
                 f"{{bypassL1}} : {self.A_t} to {self.As_t}", "cp")

    def load_tile(self, tile: str) -> None:
        """The copies of K tile `tile` (an index value) into buffer tile % stages."""
        t, g, T = self.t, self.g, self.tiles
        buffer = t.op(f"arith.remui {tile}, {t.c(T.stages)} : index", "i")
        k0 = t.mul(tile, t.c(T.block_k))
        if g.conv is not None:
            self.gather_tile(buffer, k0)
        else:
            if g.transpose_a:
                self.copy_tile("%A", self.A_t, "%As", self.As_t, self.a_layout, buffer, k0, "%row0", g.k, g.m)
            else:
                self.copy_tile("%A", self.A_t, "%As", self.As_t, self.a_layout, buffer, "%row0", k0, g.m, g.k)
        if g.transpose_b:
            self.copy_tile("%B", self.B_t, "%Bs", self.Bs_t, self.b_layout, buffer, "%col0", k0, g.n, g.k)
        else:
            self.copy_tile("%B", self.B_t, "%Bs", self.Bs_t, self.b_layout, buffer, k0, "%col0", g.k, g.n)

    # -- compute -------------------------------------------------------------------------
    def ldmatrix(self, mem: str, mem_t: str, layout: TileLayout, buffer: str, row: str, col: str,
                 transpose: bool) -> str:
        r, c = self.swizzled(layout, row, col)
        return self.t.op(f"nvgpu.ldmatrix {mem}[{buffer}, {r}, {c}] {{numTiles = 4 : i32, transpose = "
                         f"{'true' if transpose else 'false'}}} : {mem_t} -> vector<4x2x{self.g.dtype}>", "f")

    def compute(self, tile: str, accs: list[str]) -> list[str]:
        """The warp's mma.sync grid over K tile `tile`; returns the new accumulators."""
        t, g, T = self.t, self.g, self.tiles
        dt = g.dtype
        buffer = t.op(f"arith.remui {tile}, {t.c(T.stages)} : index", "i")
        new = list(accs)
        for kk in range(0, T.block_k, 16):
            # A: matrices (rows 0-7 | 8-15) x (k 0-7 | 8-15), lane l giving row l % 16 of chunk l / 16
            a_frags = []
            for i in range(self.frag_m):
                if g.transpose_a:
                    # A^T tile [k][m], transposed on load: lane l gives row k = l % 8 + 8 (l / 16) of
                    # the matrix at m offset 8 ((l / 8) % 2), the order of the A fragment's registers
                    a_frags.append(self.ldmatrix("%As", self.As_t, self.a_layout, buffer,
                                                 t.add(t.c(kk), "%lane_row8x"),
                                                 t.add(t.add("%wrow", t.c(i * 16)), "%lane_chunk8"), True))
                    continue
                row = t.add("%wrow", t.c(i * 16))
                row = t.add(row, "%lane_row16")
                a_frags.append(self.ldmatrix("%As", self.As_t, self.a_layout, buffer, row,
                                             t.add("%lane_chunk16", t.c(kk)), False))
            b_frags = []  # per n8 tile: vector<2x2>
            for j in range(0, self.frag_n, 2):
                n = t.add("%wcol", t.c(j * 8))
                if g.transpose_b:
                    # B^T tile [n][k]: matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7),
                    # (n 8-15, k 8-15): lane l gives row n = l % 8 + 8 (l / 16), chunk (l / 8) % 2
                    quad = self.ldmatrix("%Bs", self.Bs_t, self.b_layout, buffer, t.add(n, "%lane_row8x"),
                                         t.add("%lane_chunk8", t.c(kk)), False)
                else:
                    # B tile [k][n], transposed on load: matrices (k 0-7 | 8-15) x (n 0-7 | 8-15)
                    quad = self.ldmatrix("%Bs", self.Bs_t, self.b_layout, buffer, t.add("%lane_row16", t.c(kk)),
                                         t.add(n, "%lane_chunk16"), True)
                for half in (0, 2):
                    b_frags.append(t.op(f"vector.extract_strided_slice {quad} {{offsets = [{half}, 0], "
                                        f"sizes = [2, 2], strides = [1, 1]}} : vector<4x2x{dt}> to "
                                        f"vector<2x2x{dt}>", "b"))
            if dt == "bf16":
                a_frags = [self.registers(f, 4) for f in a_frags]
                b_frags = [self.registers(f, 2) for f in b_frags]
            for i in range(self.frag_m):
                for j in range(self.frag_n):
                    idx = i * self.frag_n + j
                    new[idx] = self.mma(a_frags[i], b_frags[j], new[idx])
        return new

    def registers(self, fragment: str, rows: int) -> list[str]:
        """A vector<rows x 2 x bf16> fragment as the 32-bit registers mma.sync takes."""
        t = self.t
        packed = t.op(f"vector.bitcast {fragment} : vector<{rows}x2xbf16> to vector<{rows}x1xi32>", "r")
        return [t.op(f"vector.extract {packed}[{r}, 0] : i32 from vector<{rows}x1xi32>", "r") for r in range(rows)]

    def mma(self, a, b, acc: str) -> str:
        """acc += a b on one m16n8k16 tile. nvgpu's mma.sync lowers f16 only; bf16 goes to the NVVM op
        on 32-bit registers."""
        t = self.t
        if self.g.dtype == "f16":
            return t.op(f"nvgpu.mma.sync({a}, {b}, {acc}) {{mmaShape = [16, 8, 16]}} : (vector<4x2xf16>, "
                        "vector<2x2xf16>, vector<2x2xf32>) -> vector<2x2xf32>", "d")
        c = [t.op(f"vector.extract {acc}[{r}, {e}] : f32 from vector<2x2xf32>", "a") for r in range(2) for e in range(2)]
        struct = "!llvm.struct<(f32, f32, f32, f32)>"
        d = t.op(f"nvvm.mma.sync A[{', '.join(a)}] B[{', '.join(b)}] C[{', '.join(c)}] {{layoutA = "
                 "#nvvm.mma_layout<row>, layoutB = #nvvm.mma_layout<col>, multiplicandAPtxType = #nvvm.mma_type<bf16>, "
                 "multiplicandBPtxType = #nvvm.mma_type<bf16>, shape = #nvvm.shape<m = 16, n = 8, k = 16>} : "
                 f"(i32, i32, f32) -> {struct}", "d")
        parts = [t.op(f"llvm.extractvalue {d}[{i}] : {struct}", "d") for i in range(4)]
        return t.op(f"vector.from_elements {', '.join(parts)} : vector<2x2xf32>", "d")

    # -- pipeline ----------------------------------------------------------------------
    def trip_limit(self) -> tuple[int, str]:
        """(the most K tiles, the SSA value of this block's count): the same for a GEMM."""
        n = trips(self.g, self.tiles)
        return n, self.t.c(n)

    def emit_events(self, events, k: str | None, accs: list[str]) -> list[str]:
        """Emit plan events; in the loop body tiles are relative to `k` (LoopPlan's convention).
        A Load of a tile past the last is not issued (its group is committed empty)."""
        t = self.t
        most, count = self.trip_limit()
        for e in events:
            if isinstance(e, Load):
                if k is None and e.tile >= most:
                    continue
                tile = t.c(e.tile) if k is None else (t.add(k, t.c(e.tile)) if e.tile else k)
                guarded = e.tile and (k is not None or count != t.c(most))
                if guarded:
                    t.open(f"scf.if {t.cmp('ult', tile, count)}")
                self.load_tile(tile)
                if guarded:
                    t.close()
            elif isinstance(e, Commit):
                t.line("nvvm.cp.async.commit.group")
            elif isinstance(e, WaitGroups):
                t.line(f"nvvm.cp.async.wait.group {e.pending}")
            elif isinstance(e, Barrier):
                t.line("gpu.barrier")
            elif isinstance(e, Compute):
                accs = self.compute(k if not e.tile else t.add(k, t.c(e.tile)), accs)
            else:
                raise OpError(f"the cp.async kernel cannot emit {e}")
        return accs

    # -- epilogue ------------------------------------------------------------------------
    def store(self, accs: list[str]) -> None:
        """Accumulator tile (i, j) holds, per thread, rows g and g + 8 (g = lane / 4) and columns
        2 (lane % 4) + {0, 1} of its m16n8 tile: two pairs, each stored as a vector of 2."""
        t, g = self.t, self.g
        for i in range(self.frag_m):
            for half in range(2):
                row = t.add(t.add("%wrow", t.c(i * 16 + half * 8)), "%lane_group")
                grow = t.add("%row0", row)
                t.open(f"scf.if {t.cmp('ult', grow, t.c(g.m))}")
                for j in range(self.frag_n):
                    gcol = t.add(t.add("%col0", t.add("%wcol", t.c(j * 8))), "%lane_pair")
                    pair = t.op(f"vector.extract {accs[i * self.frag_n + j]}[{half}] : vector<2xf32> "
                                "from vector<2x2xf32>", "v")
                    store_pair(t, g, pair, grow, gcol, f"%ep{i}_{half}_{j}_")
                t.close()

    def module_text(self, name: str) -> str:
        t, g, T = self.t, self.g, self.tiles
        for line in collapse_views(g):
            t.line(line)
        zero = t.op("arith.constant dense<0.0> : vector<2x2xf32>", "z")
        t.line("%tid = gpu.thread_id x")
        t.line("%bx = gpu.block_id x")
        t.line("%by = gpu.block_id y")
        t.line(f"%lane = arith.remui %tid, {t.c(32)} : index")
        t.line(f"%warp = arith.divui %tid, {t.c(32)} : index")
        warps_n = T.warps[1]
        t.line(f"%wrow = arith.muli {t.op(f'arith.divui %warp, {t.c(warps_n)} : index', 'i')}, {t.c(T.warp_m)} : index")
        t.line(f"%wcol = arith.muli {t.op(f'arith.remui %warp, {t.c(warps_n)} : index', 'i')}, {t.c(T.warp_n)} : index")
        n_tiles, m_tiles, _ = grid(g, T)
        row, col = launch_order_tile(t.add(t.mul("%by", t.c(n_tiles)), "%bx"), n_tiles, m_tiles, T.group_m,
                                     IndexArith(t))
        t.line(f"%row0 = arith.muli {row}, {t.c(T.block_m)} : index")
        t.line(f"%col0 = arith.muli {col}, {t.c(T.block_n)} : index")
        self.lane_indices()
        t.line(f"%smem = gpu.dynamic_shared_memory : memref<?xi8, {WORKGROUP}>")
        b_offset = T.stages * T.block_m * T.block_k * ELEM_BYTES
        t.line(f"%As = memref.view %smem[{t.c(0)}][] : memref<?xi8, {WORKGROUP}> to {self.As_t}")
        t.line(f"%Bs = memref.view %smem[{t.c(b_offset)}][] : memref<?xi8, {WORKGROUP}> to {self.Bs_t}")

        self.emit_events(self.plan.prologue, None, [])
        n_acc = self.frag_m * self.frag_n
        acc_t = ", ".join(["vector<2x2xf32>"] * n_acc)
        accs = [f"%acc{i}" for i in range(n_acc)]
        t.open(f"%res:{n_acc} = scf.for %k = {t.c(0)} to {t.c(trips(g, T))} step {t.c(1)} iter_args("
               + ", ".join(f"{a} = {zero}" for a in accs) + f") -> ({acc_t})")
        new = self.emit_events(self.plan.body, "%k", accs)
        t.line(f"scf.yield {', '.join(new)} : {acc_t}")
        t.close()
        self.store([f"%res#{i}" for i in range(n_acc)])

        params = kernel_params(g)
        return gpu_module_text(t, name, params, (T.threads, 1))
