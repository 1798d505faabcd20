"""The Hopper (sm_90a) Tensor Core GEMM: TMA copies into 128-byte-swizzled shared memory, paced
by mbarriers, and `wgmma.mma_async` reading both operands from shared memory through matrix
descriptors. A gpu.module text, lowered by targets/nvvm/target.py. Two forms:

- one warpgroup (128 threads; phase_cycle.tma_wgmma_plan): thread 0 issues, per K tile, the TMA
  copies of A (BM x 64) and B (BN x 64 for nn.Linear's B^T; 64 x 64 boxes of a row-major B) and
  arms the buffer's mbarrier with their bytes; the warpgroup waits on that barrier with the
  parity of the buffer's use, issues the tile's wgmma group, and refills the buffer its previous
  group read once `wgmma.wait_group 1` has retired that group;
- warp-specialized (`specialized`, the default; phase_cycle.specialized_plan): 1 to 4 MMA
  warpgroups, each on BM / warpgroups rows, and a producer warp after them whose first thread
  loops over the K tiles issuing the copies. Besides its "full" mbarrier each buffer has an
  "empty" one that every MMA warp arrives on once wait_group 1 retired its MMAs on the buffer;
  the producer waits on it before refilling the buffer, so copies run ahead of the MMAs by up
  to `stages` tiles without the MMA warps ever issuing one.

    block (bx, by) computes output tile launch_order_tile(by * blocks x + bx) (gpu_mma), C[row BM :
    +BM, col BN : +BN]; warpgroup w its rows w BM / W onwards, as
    BM / W / 64 accumulators of m64 x BN (BN / 2 f32 registers per thread each)
    the schedule is proved for the kernel's K by phase_cycle's checker before emission
    cluster 2 (specialized): blocks 2c and 2c + 1 (a cluster) take tile rows m, m + 1 of one
    column, so they read the same B tile: each copies half of it into both (TMA multicast;
    each block's full barrier expects the whole tile), and each MMA warp releases a buffer on
    the empty barriers of both blocks (mapa + a shared::cluster arrive), since either block's
    producer refills it in both. Cluster barriers after the mbarriers' initialization and
    before exiting; tile rows are rounded up to whole clusters (the extra one reads TMA's zeros)
    epilogue: the fused_gemm steps on accumulator pairs in registers, cast, stored (the m64nNk16
    accumulator layout: warp w of a warpgroup holds rows 16 w + lane / 4 (+ 8), columns
    8 j + 2 (lane % 4) + {0, 1}); `tma_store`: instead of each thread storing its pairs to C,
    the warpgroup writes one 64-row x 128-byte box at a time into a swizzled staging buffer
    (two per warpgroup, alternating) and its first thread copies the box to C with a TMA store,
    which clips what falls outside C

TMA zero-fills whatever part of a box falls outside the matrix, so M, N and K need not be
multiples of the tile; K (and N for a row-major B) must be multiples of 8: TMA needs 16-byte
row strides. The kernel takes one extra `!llvm.ptr` parameter per operand (A, then B): the
address of its CUtensorMap in device memory, which the launcher encodes (Launch.tensor_maps
says for which operand and box).

Descriptors (PTX ISA, "matrix descriptor"): start address >> 4 in bits 0-13, leading byte
offset >> 4 in 16-29, stride byte offset >> 4 in 32-45, swizzle mode in 62-63 (1: 128 bytes).
A K-major tile with 128-byte rows (64 two-byte elements) is 8-row atoms of 1024 bytes: stride
offset 1024, and a k16 step is +32 bytes. A row-major B is N-major: 64-column boxes of 8192
bytes (leading offset) made of 8-row atoms (stride offset 1024), a k16 step +2048 bytes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ...errors import OpError
from ...runtime.dtypes import to_numpy
from ...codegen.loop_text import LoopText
from .mma import (GROUP_M, WORKGROUP, IndexArith, MmaGemm, collapse_views, epilogue_pair, gpu_module_text,
                      kernel_params, launch_order_tile, store_pair)
from .phase_cycle import (AgentPlan, Barrier, Compute, Load, LoopPlan, Release, WaitEmpty, WaitFull, WaitMma,
                          specialized_plan, tma_wgmma_plan)

ELEM_BYTES = 2
SWIZZLE_BYTES = 128
BOX_K = SWIZZLE_BYTES // ELEM_BYTES  # 64 elements: one swizzled row
WARPGROUP = 128
WARP = 32
REGISTERS = 65536  # per SM, and so per block
_ALIGN = 1024  # a 128-byte-swizzle atom: TMA's and the descriptors' swizzle start there
STAGING_BYTES = 64 * SWIZZLE_BYTES  # one box of C on its way out (tma_store): 64 rows of 128 bytes
_SWIZZLE_128B = 1 << 62
_ATOM_STRIDE = (8 * SWIZZLE_BYTES >> 4) << 32
_K_MAJOR = _SWIZZLE_128B | _ATOM_STRIDE | (1 << 16)  # leading offset unused for swizzled K-major


def n_major_bits(chunk_bytes: int) -> int:
    """The descriptor bits of an N-major operand whose 64-column chunks are `chunk_bytes` apart."""
    return _SWIZZLE_128B | _ATOM_STRIDE | ((chunk_bytes >> 4) << 16)


_N_MAJOR = n_major_bits(BOX_K * SWIZZLE_BYTES)  # B tiles of BK = 64 rows


@dataclass(frozen=True)
class WgmmaTiles:
    block_m: int = 128
    block_n: int = 128
    stages: int = 4
    block_k: int = BOX_K
    warpgroups: int = 1  # warpgroups computing, each on block_m / warpgroups rows
    specialized: bool = False  # a producer warp issues the copies (needed for warpgroups > 1)
    persistent: int = 0  # if > 0, this many blocks loop over the output tiles (specialized only)
    group_m: int = GROUP_M  # launch order: output tiles in groups of this many tile rows (launch_order_tile)
    cluster: int = 1  # 2: blocks in pairs on tile rows m, m + 1 of a column, each multicasting half the B tile
    tma_store: bool = False  # the epilogue goes out through swizzled shared memory and TMA stores

    @property
    def threads(self) -> int:
        return WARPGROUP * self.warpgroups + (WARP if self.specialized else 0)

    @property
    def rows_per_warpgroup(self) -> int:
        return self.block_m // self.warpgroups

    def a_bytes(self) -> int:
        return self.block_m * self.block_k * ELEM_BYTES

    def b_bytes(self) -> int:
        return self.block_n * self.block_k * ELEM_BYTES

    def staging_bytes(self) -> int:
        """tma_store: two staging boxes per MMA warpgroup, after the pipeline's buffers."""
        return 2 * self.warpgroups * STAGING_BYTES if self.tma_store else 0

    def shared_bytes(self) -> int:
        """The buffers, plus room to align them to a swizzle atom (the dynamic shared memory's
        own alignment is only 16 bytes)."""
        return self.stages * (self.a_bytes() + self.b_bytes()) + self.staging_bytes() + _ALIGN

    def validate(self, transpose_b: bool) -> None:
        problems = []
        if self.block_k != BOX_K:
            problems.append(f"block_k must be {BOX_K} (one 128-byte swizzled row of 2-byte elements), "
                            f"got {self.block_k}")
        if self.block_m % 64 or not 64 <= self.block_m <= 256:
            problems.append(f"block_m {self.block_m} must be 64, 128, 192 or 256 (m64 wgmma blocks, one TMA box)")
        if self.warpgroups not in (1, 2, 3, 4) or self.block_m % (64 * self.warpgroups):
            problems.append(f"{self.warpgroups} warpgroups cannot share {self.block_m} rows in m64 blocks")
        if self.persistent and not self.specialized:
            problems.append("a persistent kernel needs the producer warp (specialized): it loads the next tile's "
                            "K slices while the MMA warpgroups store the last one")
        if self.warpgroups > 1 and not self.specialized:
            problems.append("several warpgroups need the producer warp (specialized): a thread of one warpgroup "
                            "cannot know when the others finished reading a buffer")
        step = 8 if transpose_b else BOX_K  # a row-major B arrives in 64-column boxes
        if self.block_n % step or not step <= self.block_n <= 256:
            problems.append(f"block_n {self.block_n} must be a multiple of {step} up to 256")
        accumulators = self.rows_per_warpgroup * self.block_n // WARPGROUP
        if accumulators > 192:
            problems.append(f"a {self.rows_per_warpgroup}x{self.block_n} tile per warpgroup needs {accumulators} "
                            "accumulator registers per thread; keep it at most 192")
        elif accumulators + 32 > min(255, REGISTERS // self.threads):  # 32: addresses, indices, the epilogue
            problems.append(f"{self.threads} threads get at most {REGISTERS // self.threads} registers each, too few "
                            f"for {accumulators} accumulators: use fewer warpgroups or a narrower tile")
        if self.stages < 1:
            problems.append(f"stages must be >= 1, got {self.stages}")
        if self.group_m < 1:
            problems.append(f"group_m must be >= 1, got {self.group_m}")
        if self.cluster not in (1, 2):
            problems.append(f"cluster must be 1 or 2 blocks, got {self.cluster}")
        elif self.cluster > 1:
            if not self.specialized:
                problems.append("a cluster needs the producer warp (specialized): a block refills its half of B in "
                                "both blocks only once the MMA warps of both have released the buffer")
            if self.group_m % self.cluster:
                problems.append(f"group_m {self.group_m} must be a multiple of the cluster ({self.cluster}): the "
                                "blocks of a cluster take tile rows of one column")
            half_step = 16 if transpose_b else 2 * BOX_K  # half a B tile: whole 8-row atoms, or 64-column boxes
            if self.block_n % half_step:
                problems.append(f"block_n {self.block_n} must be a multiple of {half_step} in a cluster of 2: each "
                                "block copies half of the B tile")
        if problems:
            raise OpError("wgmma tiles: " + "; ".join(problems))


@dataclass(frozen=True)
class TensorMap:
    """The TMA descriptor a kernel parameter points to: of kernel operand `operand` (an index
    into its tensor parameters), `box` elements per copy (innermost first), 128-byte swizzle;
    rank 2 sees the operand as one matrix of its last dim's columns, rank 3 as a stack of its
    [rows, cols] matrices (a copy's third coordinate picks the matrix)."""
    operand: int
    box: tuple[int, int]
    swizzle_bytes: int = SWIZZLE_BYTES
    rank: int = 2


def box_columns(dtype: str) -> int:
    """Elements in one 128-byte swizzled row."""
    return SWIZZLE_BYTES // to_numpy(dtype).itemsize


def tensor_maps(g: MmaGemm, tiles: WgmmaTiles) -> tuple[TensorMap, ...]:
    """A's and B's, and with tma_store C's (C is the last tensor parameter: kernel_params)."""
    b_box = (BOX_K, tiles.block_n // tiles.cluster) if g.transpose_b else (BOX_K, BOX_K)  # a block's share
    maps = (TensorMap(0, (BOX_K, tiles.block_m)), TensorMap(1, b_box))
    if tiles.tma_store:
        maps += (TensorMap(len(kernel_params(g)) - 1, (box_columns(g.out_dtype), 64)),)
    return maps


SMS = 132  # streaming multiprocessors of an H100 SXM or H200 (the H100 PCIe has 114)

# Default tiles, largest first: a 128 x 256 tile over two MMA warpgroups (64 x 256 each, 128
# accumulator registers a thread) reads the fewest operand bytes per MMA; smaller ones give
# small problems enough blocks to occupy the SMs. All take their copies from a producer warp.
DEFAULT_TILES = (WgmmaTiles(128, 256, 4, warpgroups=2, specialized=True),
                 WgmmaTiles(128, 128, 4, specialized=True),
                 WgmmaTiles(64, 128, 4, specialized=True))


def default_tiles(g: MmaGemm) -> WgmmaTiles:
    """The largest default tile that still gives about a block per SM (a full wave), else the
    one giving the most blocks."""
    def blocks(tiles):
        return math.prod(grid(g, tiles))
    full_wave = [t for t in DEFAULT_TILES if blocks(t) >= 0.9 * SMS]
    return full_wave[0] if full_wave else max(reversed(DEFAULT_TILES), key=blocks)


def trips(g: MmaGemm, tiles: WgmmaTiles) -> int:
    return -(-g.k // tiles.block_k)


def output_tiles(g: MmaGemm, tiles: WgmmaTiles) -> tuple[int, int]:
    """Along N, along M: the tile rows rounded up to whole clusters (a cluster's extra row reads
    zeros, TMA's fill past the matrix, and stores nothing)."""
    m_tiles = -(-g.m // tiles.block_m)
    return -(-g.n // tiles.block_n), -(-m_tiles // tiles.cluster) * tiles.cluster


def grid(g: MmaGemm, tiles: WgmmaTiles) -> tuple[int, int, int]:
    """Persistent: that many blocks (whole clusters); with clusters one block per tile along x
    (a cluster's blocks have consecutive x, so consecutive tile numbers); else (N, M) tiles."""
    n_tiles, m_tiles = output_tiles(g, tiles)
    if tiles.persistent:
        return (max(min(n_tiles * m_tiles, tiles.persistent) // tiles.cluster, 1) * tiles.cluster, 1, 1)
    return (n_tiles * m_tiles, 1, 1) if tiles.cluster > 1 else (n_tiles, m_tiles, 1)


def wgmma_gemm_module_text(g: MmaGemm, tiles: WgmmaTiles = WgmmaTiles(), name: str = "gemm") -> str:
    """A gpu.module with kernel @name(A, B[, bias][, residual], C, A's tensor map, B's tensor
    map), 128 threads, tiles.shared_bytes() of dynamic shared memory."""
    g.validate()
    if g.conv is not None or g.batched_b or g.transpose_a:
        raise OpError("the wgmma kernel reads plain matrices through TMA; convs, batched B and a transposed A run "
                      "the mma.sync kernel")
    tiles.validate(g.transpose_b)
    if tiles.tma_store and tiles.block_n % box_columns(g.out_dtype):  # (N % 8 == 0: C's rows are 16-byte strides)
        raise OpError(f"store 'tma' writes C in boxes of 128-byte rows ({box_columns(g.out_dtype)} {g.out_dtype}): "
                      f"block_n ({tiles.block_n}) must be a multiple of {box_columns(g.out_dtype)}, or store from "
                      "registers")
    # the specialized kernel's consumers are its MMA warps: each releases the buffers it read (in a
    # cluster, on every block's empty barrier: the plan's consumer stands for them all, and a
    # cluster's blocks loop over the same number of tiles, consecutive tile numbers)
    if tiles.specialized:
        plan = specialized_plan(tiles.stages, 4 * tiles.warpgroups)
        n_tiles, m_tiles = output_tiles(g, tiles)
        blocks = grid(g, tiles)[0] if tiles.persistent else n_tiles * m_tiles
        for per_block in {-(-n_tiles * m_tiles // blocks), n_tiles * m_tiles // blocks} - {0}:  # ceil and floor
            plan.verify(per_block * trips(g, tiles), trips(g, tiles), agents=1)  # one consumer stands for all
    else:
        plan = tma_wgmma_plan(tiles.stages)
        plan.verify(trips(g, tiles))
    return _Writer(g, tiles, plan).module_text(name)


def _predicated(predicate: str | None) -> str:
    # NVVM prints a constant-true predicate as "@-1", which ptxas rejects: none is left out
    return f", predicate = {predicate}" if predicate else ""


def box_type(dtype: str, tmap: TensorMap) -> str:
    """The shared-memory memref one copy of `tmap` fills."""
    shape = ((1,) if tmap.rank == 3 else ()) + (tmap.box[1], tmap.box[0])
    return f"memref<{'x'.join(map(str, shape))}x{dtype}, {WORKGROUP}>"


def tensormap_type(dtype: str, tmap: TensorMap) -> str:
    return (f"!nvgpu.tensormap.descriptor<tensor = {box_type(dtype, tmap).replace(WORKGROUP, '3')}, "
            "swizzle = swizzle_128b, l2promo = none, oob = zero, interleave = none>")


class _Writer:
    def __init__(self, g: MmaGemm, tiles: WgmmaTiles, plan: LoopPlan | AgentPlan):
        self.g, self.tiles, self.plan = g, tiles, plan
        self.cluster = tiles.cluster
        self.t = LoopText()
        self.t.depth = 3
        self.maps = tensor_maps(g, tiles)
        self.map_names = ("%tmaA", "%tmaB", "%tmaC")[:len(self.maps)]
        self.mbar_t = f"!nvgpu.mbarrier.group<memorySpace = {WORKGROUP}, num_barriers = {tiles.stages}>"
        self.acc_t = "!llvm.struct<(" + ", ".join(["f32"] * (tiles.block_n // 2)) + ")>"
        self.m_blocks = tiles.rows_per_warpgroup // 64  # per warpgroup

    def map_dtype(self, desc: str) -> str:
        return self.g.out_dtype if desc == "%tmaC" else self.g.dtype

    def box_view(self, offset: str, tmap: TensorMap, dtype: str | None = None) -> str:
        """The shared memory at byte `offset` (from %smem) as one box of `tmap`."""
        return self.t.op(f"memref.view %smem[{offset}][] : memref<?xi8, {WORKGROUP}> to "
                         f"{box_type(dtype or self.g.dtype, tmap)}", "v")

    def buffer_of(self, tile: str) -> str:
        """The buffer (and mbarrier) index pipeline count `tile` uses."""
        return self.t.op(f"arith.remui {tile}, {self.t.c(self.tiles.stages)} : index", "i")

    def buffer_offsets(self, buffer: str) -> tuple[str, str]:
        """Byte offsets (from the aligned base) of the A and B tiles of `buffer`."""
        t, T = self.t, self.tiles
        a = t.add("%pad", t.mul(buffer, t.c(T.a_bytes())))
        b = t.add(t.add("%pad", t.c(T.stages * T.a_bytes())), t.mul(buffer, t.c(T.b_bytes())))
        return a, b

    # -- events --------------------------------------------------------------------------
    def load(self, tile: str, predicate: str | None, k_slice: str | None = None) -> None:
        """The threads where `predicate` holds (thread 0, or the producer thread: None) arm the
        buffer's barrier with the bytes of K tile `k_slice` (default: `tile`, the pipeline's
        count) and issue its copies."""
        t, g, T = self.t, self.g, self.tiles
        buffer = self.buffer_of(tile)
        a_off, b_off = self.buffer_offsets(buffer)
        k0 = t.mul(k_slice or tile, t.c(T.block_k))
        t.line(f"nvgpu.mbarrier.arrive.expect_tx %mbar[{buffer}], {t.c(T.a_bytes() + T.b_bytes())}"
               f"{_predicated(predicate)} : {self.mbar_t}")
        a_map, b_map = self.maps[:2]
        self.tma(self.box_view(a_off, a_map), "%tmaA", a_map, [k0, "%row0"], buffer, predicate)
        cluster = self.cluster > 1  # this block's share of B, multicast to the same place in every block
        if g.transpose_b:
            share, col = T.block_n // self.cluster, "%col0"
            if cluster:
                b_off = t.add(b_off, t.mul("%rank", t.c(share * SWIZZLE_BYTES)))
                col = t.add(col, t.mul("%rank", t.c(share)))
            self.tma(self.box_view(b_off, b_map), "%tmaB", b_map, [k0, col], buffer, predicate, cluster)
        else:
            share = T.block_n // BOX_K // self.cluster  # 64-column boxes, one after the other
            for j in range(share):
                if cluster:
                    box = t.add(t.mul("%rank", t.c(share)), t.c(j))
                    offset, col = t.mul(box, t.c(BOX_K * T.block_k * ELEM_BYTES)), t.mul(box, t.c(BOX_K))
                else:
                    offset, col = t.c(j * BOX_K * T.block_k * ELEM_BYTES), t.c(j * BOX_K)
                view = self.box_view(t.add(b_off, offset), b_map)
                self.tma(view, "%tmaB", b_map, [t.add("%col0", col), k0], buffer, predicate, cluster)

    def tma(self, dst: str, desc: str, tmap: TensorMap, coords: list[str], buffer: str, predicate: str | None,
            multicast: bool = False) -> None:
        self.t.line(f"nvgpu.tma.async.load {desc}[{', '.join(coords)}], %mbar[{buffer}] to {dst}"
                    f"{' multicast_mask = %everyone' if multicast else ''}"
                    f"{_predicated(predicate)} : {tensormap_type(self.g.dtype, tmap)}, {self.mbar_t} -> "
                    f"{box_type(self.g.dtype, tmap)}")

    def wait_full(self, tile: str) -> None:
        """Wait for the tile's copies: phase `use` of its buffer's full barrier."""
        t, T = self.t, self.tiles
        self.wait("%mbar", tile, t.op(f"arith.divui {tile}, {t.c(T.stages)} : index", "i"))

    def wait_empty(self, tile: str) -> None:
        """Before loading a tile into a used buffer: wait for the consumers' release of the tile
        `stages` earlier, phase use - 1 of the buffer's empty barrier."""
        t, T = self.t, self.tiles
        t.open(f"scf.if {t.cmp('uge', tile, t.c(T.stages))}")
        self.wait("%empty", tile, t.op(f"arith.subi {t.op(f'arith.divui {tile}, {t.c(T.stages)} : index', 'i')}, "
                                        f"{t.c(1)} : index", "i"))
        t.close()

    def wait(self, barriers: str, tile: str, phase: str) -> None:
        t = self.t
        buffer = self.buffer_of(tile)
        parity = t.op(f"arith.index_cast {t.op(f'arith.remui {phase}, {t.c(2)} : index', 'i')} : index to i1", "p")
        t.line(f"nvgpu.mbarrier.try_wait.parity {barriers}[{buffer}], {parity}, %ticks : {self.mbar_t}")

    def release(self, k: str, back: int) -> None:
        """Lane 0 of each MMA warp arrives on the empty barrier of tile k - back, whose MMAs it
        has retired (from k >= back on)."""
        t = self.t
        first = t.op(f"arith.andi {t.cmp('uge', k, t.c(back))}, {t.cmp('eq', '%lane', t.c(0))} : i1", "p")
        t.open(f"scf.if {first}")
        tile = t.op(f"arith.subi {k}, {t.c(back)} : index", "i") if back else k
        if self.cluster > 1:  # on the barrier of every block of the cluster: each refills part of this one
            address = t.op(f"nvgpu.mbarrier.get %empty[{self.buffer_of(tile)}] : {self.mbar_t} -> i32", "a")
            for rank in range(self.cluster):
                t.line('llvm.inline_asm has_side_effects "{ .reg .b32 remote; mapa.shared::cluster.u32 remote, $0, '
                       '$1; mbarrier.arrive.shared::cluster.b64 _, [remote]; }", "r,r" '
                       f"{address}, {t.op(f'arith.constant {rank} : i32', 'r')} : (i32, i32) -> ()")
        else:
            t.op(f"nvgpu.mbarrier.arrive %empty[{self.buffer_of(tile)}] : {self.mbar_t} -> !nvgpu.mbarrier.token",
                 "tok")
        t.close()

    def descriptor(self, address: str, bits: int) -> str:
        t = self.t
        addr = t.op(f"arith.index_cast {address} : index to i64", "d")
        start = t.op(f"arith.andi {t.op(f'arith.shrui {addr}, %i64_4 : i64', 'd')}, %i64_start_mask : i64", "d")
        return t.op(f"arith.ori {start}, {t.op(f'arith.constant {bits} : i64', 'd')} : i64", "d")

    def compute(self, tile: str, accs: list[str]) -> list[str]:
        """The tile's wgmma group: BK / 16 steps of BM / 64 m64 x BN x k16 MMAs, committed as one."""
        t, g, T = self.t, self.g, self.tiles
        a_off, b_off = self.buffer_offsets(self.buffer_of(tile))
        a_base, b_base = t.add("%base", t.add(a_off, "%wg_a")), t.add("%base", b_off)
        t.line("nvvm.wgmma.fence.aligned")
        b_layout = "col" if g.transpose_b else "row"  # NVVM: B "col" is K-major, "row" N-major
        new = list(accs)
        for kk in range(T.block_k // 16):
            b_step = kk * 16 * ELEM_BYTES if g.transpose_b else kk * 16 * SWIZZLE_BYTES
            db = self.descriptor(t.add(b_base, t.c(b_step)), _K_MAJOR if g.transpose_b else _N_MAJOR)
            for i in range(self.m_blocks):
                da = self.descriptor(t.add(a_base, t.c(i * 64 * SWIZZLE_BYTES + kk * 16 * ELEM_BYTES)), _K_MAJOR)
                new[i] = t.op(f"nvvm.wgmma.mma_async {da}, {db}, {new[i]}, <m = 64, n = {T.block_n}, k = 16>, "
                              f"D[<f32>, <one>, <wrapped>], A[<{g.dtype}>, <one>, <row>], "
                              f"B[<{g.dtype}>, <one>, <{b_layout}>] : {self.acc_t} -> {self.acc_t}", "acc")
        t.line("nvvm.wgmma.commit.group.sync.aligned")
        return new

    def trip_count(self) -> int:
        return trips(self.g, self.tiles)

    def emit(self, events, k: str | None, accs: list[str], k_slice: str | None = None) -> list[str]:
        """Plan events; in the loop body tiles are relative to `k` (LoopPlan's convention).
        `k_slice`: the K tile a persistent kernel's count `k` is at (loads happen at offset 0)."""
        t = self.t
        for e in events:
            if isinstance(e, WaitMma):
                t.line(f"nvvm.wgmma.wait.group.sync.aligned {e.pending}")
                continue
            if isinstance(e, Release):
                self.release(k, -e.buffer)
                continue
            if isinstance(e, Barrier):  # the block is the one warpgroup
                t.line("gpu.barrier")
                continue
            offset = e.buffer if isinstance(e, (WaitFull, WaitEmpty)) else e.tile
            if k is None:
                if offset >= self.trip_count():
                    continue
                tile = t.c(offset)
            else:
                tile = t.add(k, t.c(offset)) if offset else k
            if isinstance(e, Load):
                predicate = None if self.tiles.specialized else "%is0"  # in the producer thread, or thread 0
                if k is not None and offset:  # a tile past the last is not loaded
                    inside = t.cmp("ult", tile, t.c(self.trip_count()))
                    predicate = t.op(f"arith.andi {predicate}, {inside} : i1", "p") if predicate else inside
                self.load(tile, predicate, k_slice)
            elif isinstance(e, WaitFull):
                self.wait_full(tile)
            elif isinstance(e, WaitEmpty):
                self.wait_empty(tile)
            elif isinstance(e, Compute):
                accs = self.compute(tile, accs)
            else:
                raise OpError(f"the wgmma kernel cannot emit {e}")
        return accs

    # -- epilogue ------------------------------------------------------------------------
    def pair(self, accs: list[str], i: int, j: int, half: int) -> str:
        """This thread's accumulators of m64 block i at columns 8 j + %lane_pair + {0, 1}, row
        8 half + %lane_group of its warp's 16, as a vector<2xf32>."""
        values = [self.t.op(f"llvm.extractvalue {accs[i]}[{4 * j + 2 * half + e}] : {self.acc_t}", "x")
                  for e in range(2)]
        return self.t.op(f"vector.from_elements {values[0]}, {values[1]} : vector<2xf32>", "v")

    def store(self, accs: list[str]) -> None:
        t, g, T = self.t, self.g, self.tiles
        if T.tma_store:
            return self.store_boxes(accs)
        for i in range(self.m_blocks):
            for half in range(2):
                grow = t.add("%wg_row0", t.add(t.add("%wrow", t.c(64 * i + 8 * half)), "%lane_group"))
                t.open(f"scf.if {t.cmp('ult', grow, t.c(g.m))}")
                for j in range(T.block_n // 8):
                    gcol = t.add("%col0", t.add("%lane_pair", t.c(8 * j)))
                    store_pair(t, g, self.pair(accs, i, j, half), grow, gcol, f"%ep{i}_{half}_{j}_")
                t.close()

    def store_boxes(self, accs: list[str]) -> None:
        """tma_store: for each 64-row x 128-byte box of this warpgroup's rows in turn, the threads
        write their pairs (epilogue applied) into staging buffer n % 2, swizzled as TMA's 128-byte
        mode reads it (16-byte chunk c of row r at chunk c ^ r % 8: a warp's 8 rows of 16 bytes
        reach all 32 banks; f32's 8-byte pairs conflict 2-way, see bank_conflicts), fence the
        writes for the async proxy and meet at the warpgroup's named barrier; then its first
        thread issues the box's TMA store. Before a buffer is written again that thread waits
        until the store two boxes back has read it (at a tile's first box: every earlier store,
        so buffer 1 is free at the second)."""
        t, g, T = self.t, self.g, self.tiles
        cols = box_columns(g.out_dtype)
        item = SWIZZLE_BYTES // cols
        box_t = box_type(g.out_dtype, self.maps[2])
        word = f"i{16 * item}"  # a pair as one integer (vector stores into workgroup memory do not lower here)
        flat_t = f"memref<{STAGING_BYTES // (2 * item)}x{word}, {WORKGROUP}>"
        clamped = g.bias_dtype or g.residual_dtype  # their pairs are read inside C, also for pairs TMA clips
        for n, (i, c) in enumerate((i, c) for i in range(self.m_blocks) for c in range(T.block_n // cols)):
            offset = t.add("%staging", t.c(STAGING_BYTES)) if n % 2 else "%staging"
            if n != 1:
                t.open("scf.if %wg_leader")
                t.line(f"nvvm.cp.async.bulk.wait_group {min(n, 1)} {{read}}")
                t.close()
                self.warpgroup_barrier()
            flat = t.op(f"memref.view %smem[{offset}][] : memref<?xi8, {WORKGROUP}> to {flat_t}", "v")
            for half in range(2):
                row = t.add(t.add("%wrow", t.c(8 * half)), "%lane_group")  # in the box
                row_byte = t.mul(row, t.c(SWIZZLE_BYTES))
                grow = gcol = None
                if clamped:
                    grow = t.op(f"arith.minui {t.add('%wg_row0', t.add(row, t.c(64 * i)))}, {t.c(g.m - 1)} : index", "i")
                for jj in range(cols // 8):
                    j = c * cols // 8 + jj
                    if clamped:
                        gcol = t.add("%col0", t.add("%lane_pair", t.c(8 * j)))
                        gcol = t.op(f"arith.minui {gcol}, {t.c(g.n - 2)} : index", "i")
                    x = epilogue_pair(t, g, self.pair(accs, i, j, half), grow, gcol, f"%ep{n}_{half}_{jj}_")
                    byte = t.mul(t.add("%lane_pair", t.c(8 * jj)), t.c(item))
                    byte = t.add(row_byte, t.op(f"arith.xori {byte}, %swizzle_xor : index", "i"))
                    elem = t.op(f"arith.divui {byte}, {t.c(2 * item)} : index", "i")
                    bits = t.op(f"llvm.bitcast {x} : vector<2x{g.out_dtype}> to {word}", "b")
                    t.line(f"memref.store {bits}, {flat}[{elem}] : {flat_t}")
            t.line("nvvm.fence.proxy {kind = #nvvm.proxy_kind<async.shared>, space = #nvvm.shared_space<cta>}")
            self.warpgroup_barrier()
            t.open("scf.if %wg_leader")
            box = self.box_view(offset, self.maps[2], g.out_dtype)
            col, row = t.add("%col0", t.c(c * cols)), t.add("%wg_row0", t.c(64 * i))
            t.line(f"nvgpu.tma.async.store {box} to %tmaC[{col}, {row}] : {box_t} -> "
                   f"{tensormap_type(g.out_dtype, self.maps[2])}")
            t.line("nvvm.cp.async.bulk.commit.group")
            t.close()

    def warpgroup_barrier(self) -> None:
        """The warpgroup's 128 threads meet (named barrier 1 + warpgroup: the producer warp and the
        other warpgroups go on)."""
        self.t.line("nvvm.barrier id = %wg_barrier number_of_threads = %wg_threads")

    def staging(self, group: str) -> None:
        """tma_store: this warpgroup's staging buffers, the swizzle of its threads' rows, its first
        thread and named barrier."""
        t, T = self.t, self.tiles
        t.line(f"%staging = arith.addi %pad, {t.add(t.c(T.stages * (T.a_bytes() + T.b_bytes())), t.mul(group, t.c(2 * STAGING_BYTES)))} : index")
        t.line(f"%swizzle_xor = arith.muli %lane_group, {t.c(16)} : index")
        t.line(f"%wg_leader = arith.cmpi eq, {t.op(f'arith.remui %tid, {t.c(WARPGROUP)} : index', 'i')}, {t.c(0)} : index")
        t.line(f"%wg_barrier = arith.index_cast {t.add(group, t.c(1))} : index to i32")
        t.line(f"%wg_threads = arith.constant {WARPGROUP} : i32")

    def drain_stores(self) -> None:
        """tma_store: before exiting, the TMA stores have read their shared memory."""
        if self.tiles.tma_store:
            self.t.open("scf.if %wg_leader")
            self.t.line("nvvm.cp.async.bulk.wait_group 0 {read}")
            self.t.close()

    def tile_origin(self, tile: str) -> None:
        """Output tile number `tile`'s (launch_order_tile) first row and column, and this
        warpgroup's first row."""
        t, T = self.t, self.tiles
        tile_m, tile_n = launch_order_tile(tile, *output_tiles(self.g, T), T.group_m, IndexArith(t))
        t.line(f"%row0 = arith.muli {tile_m}, {t.c(T.block_m)} : index")
        t.line(f"%col0 = arith.muli {tile_n}, {t.c(T.block_n)} : index")
        t.line("%wg_row0 = arith.addi %row0, %wg_rows : index")

    def open_output_tiles(self) -> str | None:
        """Persistent: open the loop over this block's output tiles (numbers block x, then every
        grid width on, in launch order) and return the pipeline count its first K tile is at; the K loops
        inside go on counting where the previous tile's stopped, so buffers and phases do too."""
        t, g, T = self.t, self.g, self.tiles
        if not T.persistent:
            return None
        n_tiles, m_tiles = output_tiles(g, T)
        blocks = grid(g, T)[0]
        tile = t.fresh("tile")
        t.open(f"scf.for {tile} = %bx to {t.c(n_tiles * m_tiles)} step {t.c(blocks)}")
        self.tile_origin(tile)
        done = t.op(f"arith.divui {t.op(f'arith.subi {tile}, %bx : index', 'i')}, {t.c(blocks)} : index", "i")
        return t.mul(done, t.c(trips(g, T)))

    def close_output_tiles(self) -> None:
        if self.tiles.persistent:
            self.t.close()

    # -- the kernel's start ----------------------------------------------------------------
    def preamble(self) -> str:
        """The tensor maps from their pointer parameters, constants, thread and lane indices (the
        accumulator layout's %wrow, %lane_group, %lane_pair); returns the warpgroup index."""
        t = self.t
        for desc, tmap in zip(self.map_names, self.maps):
            t.line(f"{desc} = builtin.unrealized_conversion_cast {desc}_ptr : !llvm.ptr to "
                   f"{tensormap_type(self.map_dtype(desc), tmap)}")
        t.line("%i64_4 = arith.constant 4 : i64")
        t.line("%i64_start_mask = arith.constant 16383 : i64")
        t.line("%ticks = arith.constant 10000000 : index")
        t.line("%tid = gpu.thread_id x")
        t.line("%bx = gpu.block_id x")
        t.line("%by = gpu.block_id y")
        if self.cluster > 1:
            rank = t.op("nvvm.read.ptx.sreg.cluster.ctarank : i32", "r")
            t.line(f"%rank = arith.index_cast {rank} : i32 to index")
            t.line(f"%everyone = arith.constant {(1 << self.cluster) - 1} : i16")
        t.line(f"%lane = arith.remui %tid, {t.c(WARP)} : index")
        warp_in_group = t.op(f"arith.remui {t.op(f'arith.divui %tid, {t.c(WARP)} : index', 'i')}, {t.c(4)} : index", "i")
        t.line(f"%wrow = arith.muli {warp_in_group}, {t.c(16)} : index")
        t.line(f"%lane_group = arith.divui %lane, {t.c(4)} : index")
        t.line(f"%lane_pair = arith.muli {t.op(f'arith.remui %lane, {t.c(4)} : index', 'i')}, {t.c(2)} : index")
        return t.op(f"arith.divui %tid, {t.c(WARPGROUP)} : index", "i")

    def barriers(self, extra: tuple[tuple[str, str, int], ...] = ()) -> None:
        """Create the stages' full (and, specialized, empty) mbarriers and `extra` ones (name,
        group type, arrivals), thread 0 initializing them and prefetching the tensor maps; then
        %smem, %base and %pad (the bytes up to the first 1024-byte aligned address)."""
        t, T = self.t, self.tiles
        t.line(f"%is0 = arith.cmpi eq, %tid, {t.c(0)} : index")
        t.line(f"%mbar = nvgpu.mbarrier.create -> {self.mbar_t}")
        if T.specialized:
            t.line(f"%empty = nvgpu.mbarrier.create -> {self.mbar_t}")
        for bar, type_, _ in extra:
            t.line(f"{bar} = nvgpu.mbarrier.create -> {type_}")
        t.open("scf.if %is0")
        for s in range(T.stages):
            t.line(f"nvgpu.mbarrier.init %mbar[{t.c(s)}], {t.c(1)} : {self.mbar_t}")
            if T.specialized:  # every MMA warp (of every block in the cluster) releases
                t.line(f"nvgpu.mbarrier.init %empty[{t.c(s)}], {t.c(4 * T.warpgroups * self.cluster)} : {self.mbar_t}")
        for bar, type_, count in extra:
            t.line(f"nvgpu.mbarrier.init {bar}[{t.c(0)}], {t.c(count)} : {type_}")
        for desc, tmap in zip(self.map_names, self.maps):
            t.line(f"nvgpu.tma.prefetch.descriptor {desc} : {tensormap_type(self.map_dtype(desc), tmap)}")
        if self.cluster > 1:
            t.line("nvvm.fence.mbarrier.init")  # the other blocks see them initialized after the cluster barrier
        t.close()
        t.line("gpu.barrier")  # the barriers are initialized before anyone arrives or waits
        self.cluster_barrier()
        t.line(f"%smem = gpu.dynamic_shared_memory : memref<?xi8, {WORKGROUP}>")
        t.line(f"%base = memref.extract_aligned_pointer_as_index %smem : memref<?xi8, {WORKGROUP}> -> index")
        misalign = t.op(f"arith.remui %base, {t.c(_ALIGN)} : index", "i")
        t.line(f"%pad = arith.remui {t.op(f'arith.subi {t.c(_ALIGN)}, {misalign} : index', 'i')}, {t.c(_ALIGN)} : index")

    def cluster_barrier(self) -> None:
        """Every thread of the cluster's blocks meets: after the mbarriers' initialization (the
        others arrive on them and copy into this block), and before exiting (until then the others
        may still arrive on this block's empty barriers)."""
        if self.cluster > 1:
            self.t.line("nvvm.cluster.arrive")
            self.t.line("nvvm.cluster.wait")

    def module_text(self, name: str) -> str:
        t, g, T = self.t, self.g, self.tiles
        for line in collapse_views(g):
            t.line(line)
        group = self.preamble()
        # warpgroup w computes rows w RW .. (w + 1) RW of the block: its part of A starts RW rows in
        t.line(f"%wg_rows = arith.muli {group}, {t.c(T.rows_per_warpgroup)} : index")
        t.line(f"%wg_a = arith.muli {group}, {t.c(T.rows_per_warpgroup * SWIZZLE_BYTES)} : index")
        if not T.persistent:
            self.tile_origin("%bx" if self.cluster > 1 else t.add(t.mul("%by", t.c(output_tiles(g, T)[0])), "%bx"))
        self.barriers()
        if T.tma_store:
            self.staging(group)
        n_trips = t.c(trips(g, T))
        if T.specialized:
            # the producer: one thread of the warp after the MMA warpgroups, looping ahead
            t.open(f"scf.if {t.cmp('eq', '%tid', t.c(WARPGROUP * T.warpgroups))}")
            first = self.open_output_tiles()
            t.open(f"scf.for %kp = {t.c(0)} to {n_trips} step {t.c(1)}")
            self.emit(self.plan.producer, t.add(first, "%kp") if first else "%kp", [], "%kp" if first else None)
            t.close()
            self.close_output_tiles()
            t.close()
            t.open(f"scf.if {t.cmp('ult', '%tid', t.c(WARPGROUP * T.warpgroups))}")
            body, epilogue = self.plan.consumer, self.plan.consumer_epilogue
        else:
            self.emit(self.plan.prologue, None, [])
            body, epilogue = self.plan.body, self.plan.epilogue
        first = self.open_output_tiles()
        accs = [f"%acc{i}" for i in range(self.m_blocks)]
        zero = t.op(f"llvm.mlir.zero : {self.acc_t}", "z")
        types = ", ".join([self.acc_t] * self.m_blocks)
        results = t.fresh("res")
        t.open(f"{results}:{self.m_blocks} = scf.for %k = {t.c(0)} to {n_trips} step {t.c(1)} iter_args("
               + ", ".join(f"{a} = {zero}" for a in accs) + f") -> ({types})")
        new = self.emit(body, t.add(first, "%k") if first else "%k", accs, "%k" if first else None)
        t.line(f"scf.yield {', '.join(new)} : {types}")
        t.close()
        self.emit(epilogue, None, [])
        self.store([f"{results}#{i}" for i in range(self.m_blocks)])
        self.close_output_tiles()
        self.drain_stores()
        if T.specialized:
            t.close()
        self.cluster_barrier()

        params = kernel_params(g) + [f"{desc}_ptr: !llvm.ptr" for desc in self.map_names]
        cluster = f", nvvm.cluster_dim = array<i32: {self.cluster}, 1, 1>" if self.cluster > 1 else ""
        return gpu_module_text(t, name, params, (T.threads, 1), attributes=cluster)
