"""Flash attention for NVIDIA sm_80 and later (f16 / bf16 in, f32 softmax and accumulation):
softmax(scale Q K^T) V without the S x S matrix, on mma.sync m16n8k16. A gpu.module text,
lowered by targets/nvvm.py.

    block (bx, by): query rows bx BM .. + BM of batch-head `by`; warp w owns 16 of them
    Q tile -> shared memory (cp.async) -> A fragments kept in registers (ldmatrix)
    per key block j (BN keys; causal: only blocks with a key <= the block's last query):
        K and V tiles -> `stages` shared buffers by cp.async (zero-filled past the sequence), as
        phase_cycle.cp_async_plan emits them, proved for every block's count of key blocks:
        block j + stages - 1's copies are in flight while block j is computed
        S = Q K^T on mma.sync (K read as the B^T of a GEMM), scaled, masked (keys past the
        sequence, and keys after the query when causal)
        online softmax per row: new max (quad shuffles), P = exp(S - max), the running sum and
        O rescaled by exp(old max - new max)
        O += P V: P's accumulator pairs are, cast, the A fragments of the next mma.sync (the
        m16n8 accumulator layout of two adjacent n8 tiles is the m16k16 A layout); V is read
        as a row-major B (ldmatrix.trans)
    O / sum, cast, stored

Shared tiles are XOR-swizzled (bank_conflicts.conflict_free_swizzle) like the GEMM's.
Requirements: head dim a multiple of 16 up to 256; any sequence lengths.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import OpError
from .bank_conflicts import TileLayout, conflict_free_swizzle, report
from .cpu_gemm import _memref, _Text
from .gpu_mma import ELEM_BYTES, MMA_DTYPES, PER_CHUNK, WORKGROUP, _Writer, gpu_module_text
from .phase_cycle import LoopPlan, cp_async_plan

_MASKED = -1.0e30  # finite: a fully masked row never makes exp(-inf - -inf)


@dataclass(frozen=True)
class MmaAttention:
    """O[..., Sq, D] = softmax(scale Q K^T) V for Q [..., Sq, D], K and V [..., Sk, D]."""
    lead: tuple[int, ...]  # the leading (batch, head) dims
    seq_q: int
    seq_k: int
    head_dim: int
    dtype: str
    out_dtype: str
    scale: float
    causal: bool = False

    def validate(self) -> None:
        if self.dtype not in MMA_DTYPES:
            raise OpError(f"the NVIDIA attention kernel takes f16 or bf16 Q, K, V, got {self.dtype}")
        if self.head_dim % 16 or not 16 <= self.head_dim <= 256:
            raise OpError(f"the NVIDIA attention kernel needs a head dim that is a multiple of 16 up to 256, "
                          f"got {self.head_dim}")


@dataclass(frozen=True)
class AttentionTiles:
    block_m: int = 64  # queries per block: 16 per warp
    block_n: int = 64  # keys per step
    stages: int = 2  # K and V buffers: the next block's copies overlap this block's math

    @property
    def threads(self) -> int:
        return 32 * self.block_m // 16

    def shared_bytes(self, head_dim: int) -> int:
        return (self.block_m + 2 * self.stages * self.block_n) * head_dim * ELEM_BYTES

    def validate(self, head_dim: int) -> None:
        if self.block_m % 16 or self.block_n % 16:
            raise OpError(f"attention tiles {self.block_m}x{self.block_n} must be multiples of 16")
        for rows in (self.block_m, self.block_n):
            if rows * head_dim // PER_CHUNK % self.threads:
                raise OpError(f"a {rows}x{head_dim} tile is not a whole number of 16-byte copies per thread "
                              f"of the block's {self.threads}")


def grid(a: MmaAttention, tiles: AttentionTiles) -> tuple[int, int, int]:
    blocks = 1
    for d in a.lead:
        blocks *= d
    return -(-a.seq_q // tiles.block_m), blocks, 1


def attention_module_text(a: MmaAttention, tiles: AttentionTiles = AttentionTiles(), name: str = "attention") -> str:
    """A gpu.module with kernel @name(Q, K, V, O), tiles.threads threads, tiles.shared_bytes()
    of dynamic shared memory."""
    a.validate()
    tiles.validate(a.head_dim)
    layout = TileLayout(tiles.block_m, a.head_dim, ELEM_BYTES, conflict_free_swizzle(a.head_dim, ELEM_BYTES))
    found = report(layout)
    if any(found.values()):
        raise OpError(f"shared-memory layout {layout} has bank conflicts {found}")
    plan = cp_async_plan(tiles.stages)
    blocks = key_blocks(a, tiles)
    for count in (range(1, blocks + 1) if a.causal else (blocks,)):  # causal: each block's own count
        plan.verify(count)
    return _AttentionWriter(a, tiles, plan).module_text(name)


def key_blocks(a: MmaAttention, tiles: AttentionTiles) -> int:
    return -(-a.seq_k // tiles.block_n)


class _AttentionWriter(_Writer):
    """Reuses the GEMM writer's copies, swizzle, ldmatrix and mma (self.g.dtype, self.tiles.threads)."""

    def __init__(self, a: MmaAttention, tiles: AttentionTiles, plan: LoopPlan):
        self.g, self.tiles, self.a, self.plan = a, tiles, a, plan
        self.t = _Text()
        self.t.depth = 3
        swizzle = conflict_free_swizzle(a.head_dim, ELEM_BYTES)
        self.q_layout = TileLayout(tiles.block_m, a.head_dim, ELEM_BYTES, swizzle)
        self.kv_layout = TileLayout(tiles.block_n, a.head_dim, ELEM_BYTES, swizzle)
        d, T = a.head_dim, a.dtype
        self.Qs_t = f"memref<1x{tiles.block_m}x{d}x{T}, {WORKGROUP}>"
        self.KVs_t = f"memref<{tiles.stages}x{tiles.block_n}x{d}x{T}, {WORKGROUP}>"

    def row_view(self, mem: str, seq: int, dtype: str) -> tuple[str, str]:
        """The [seq, D] matrix of this block's batch-head in a [..., seq, D] parameter."""
        t, a = self.t, self.a
        lead = len(a.lead)
        if not lead:
            return mem, _memref((seq, a.head_dim), dtype)
        strided = f"memref<{seq}x{a.head_dim}x{dtype}, strided<[{a.head_dim}, 1], offset: ?>>"
        offsets = ", ".join([f"%lead{i}" for i in range(lead)] + ["0", "0"])
        sizes = ", ".join(["1"] * lead + [str(seq), str(a.head_dim)])
        view = t.op(f"memref.subview {mem}[{offsets}] [{sizes}] [{', '.join(['1'] * (lead + 2))}] : "
                    f"{_memref((*a.lead, seq, a.head_dim), dtype)} to {strided}", "m")
        return view, strided

    def f32(self, value: float) -> str:
        return self.t.op(f"arith.constant {value:.9e} : f32", "f")

    def quad_reduce(self, x: str, op: str) -> str:
        """`op` (arith.maximumf / arith.addf) over the 4 lanes holding one row's columns."""
        t = self.t
        for offset in ("%i32_1", "%i32_2"):
            other = t.fresh("s")
            t.line(f"{other}, {other}_valid = gpu.shuffle xor {x}, {offset}, %i32_32 : f32")
            x = t.op(f"{op} {x}, {other} : f32", "r")
        return x

    def trip_limit(self) -> tuple[int, str]:
        return key_blocks(self.a, self.tiles), "%bound"

    def load_tile(self, tile: str) -> None:
        """The copies of key block `tile`'s K and V rows into buffer tile % stages."""
        t, a, T = self.t, self.a, self.tiles
        buffer = t.op(f"arith.remui {tile}, {t.c(T.stages)} : index", "i")
        k0 = t.mul(tile, t.c(T.block_n))
        for src, dst in zip(self.kv_views, ("%Ks", "%Vs")):
            self.copy_tile(src, self.kv_t, dst, self.KVs_t, self.kv_layout, buffer, k0, t.c(0), a.seq_k, a.head_dim)

    def scores(self, q_frags: list, buffer: str) -> list[str]:
        """S = Q K^T for the warp's 16 rows and the block's keys: vector<2x2xf32> per n8 tile."""
        t, a, T = self.t, self.a, self.tiles
        zero = t.op("arith.constant dense<0.0> : vector<2x2xf32>", "z")
        s = [zero] * (T.block_n // 8)
        for kk in range(a.head_dim // 16):
            for n in range(T.block_n // 16):
                quad = self.ldmatrix("%Ks", self.KVs_t, self.kv_layout, buffer, t.add(t.c(n * 16), "%lane_row8x"),
                                     t.add("%lane_chunk8", t.c(kk * 16)), False)
                for h in (0, 1):
                    b = t.op(f"vector.extract_strided_slice {quad} {{offsets = [{2 * h}, 0], sizes = [2, 2], "
                             f"strides = [1, 1]}} : vector<4x2x{a.dtype}> to vector<2x2x{a.dtype}>", "b")
                    if a.dtype == "bf16":
                        b = self.registers(b, 2)
                    s[2 * n + h] = self.mma(q_frags[kk], b, s[2 * n + h])
        return s

    def compute(self, tile: str, accs: list[str]) -> list[str]:
        """One key block's step of the online softmax: accs = [max of row g, of row g + 8, their
        running sums (this thread's part), the O accumulators]; returns the new ones."""
        t, a, T = self.t, self.a, self.tiles
        dt, d = a.dtype, a.head_dim
        m, l, o = accs[0:2], accs[2:4], accs[4:]
        buffer = t.op(f"arith.remui {tile}, {t.c(T.stages)} : index", "i")
        k0 = t.mul(tile, t.c(T.block_n))
        neg = self.f32(_MASKED)
        s = self.scores(self.q_frags, buffer)

        # scale and mask; p[tile][half] are the two scores of row `half` (g, g + 8) in n8 tile `tile`
        scale = self.f32(a.scale)
        values = [[[None, None] for _ in range(2)] for _ in s]
        row_max = [m[0], m[1]]
        for n, score in enumerate(s):
            for h in (0, 1):
                query = t.add(t.add("%q0", "%wrow"), t.add("%lane_group", t.c(8 * h)))
                for e in (0, 1):
                    x = t.op(f"arith.mulf {t.op(f'vector.extract {score}[{h}, {e}] : f32 from vector<2x2xf32>', 'x')}, "
                             f"{scale} : f32", "x")
                    key = t.add(k0, t.add("%lane_pair", t.c(8 * n + e)))
                    valid = t.cmp("ult", key, t.c(a.seq_k))
                    if a.causal:
                        valid = t.op(f"arith.andi {valid}, {t.cmp('ule', key, query)} : i1", "p")
                    x = t.op(f"arith.select {valid}, {x}, {neg} : f32", "x")
                    values[n][h][e] = x
                    row_max[h] = t.op(f"arith.maximumf {row_max[h]}, {x} : f32", "r")
        new_max = [self.quad_reduce(row_max[h], "arith.maximumf") for h in (0, 1)]
        alpha = [t.op(f"math.exp {t.op(f'arith.subf {m[h]}, {new_max[h]} : f32', 'x')} : f32", "x") for h in (0, 1)]
        sums = [t.op(f"arith.mulf {l[h]}, {alpha[h]} : f32", "x") for h in (0, 1)]
        probs = [[[None, None] for _ in range(2)] for _ in s]
        for n in range(len(s)):
            for h in (0, 1):
                for e in (0, 1):
                    p = t.op(f"math.exp {t.op(f'arith.subf {values[n][h][e]}, {new_max[h]} : f32', 'x')} : f32", "x")
                    sums[h] = t.op(f"arith.addf {sums[h]}, {p} : f32", "x")
                    probs[n][h][e] = t.op(f"arith.truncf {p} : f32 to {dt}", "x")
        # O *= alpha (row 0 of each accumulator tile is row g, row 1 is g + 8)
        scaling = t.op(f"vector.from_elements {alpha[0]}, {alpha[0]}, {alpha[1]}, {alpha[1]} : vector<2x2xf32>", "x")
        outs = [t.op(f"arith.mulf {o_acc}, {scaling} : vector<2x2xf32>", "o") for o_acc in o]
        for c in range(len(s) // 2):  # k16 steps over the block's keys
            lo, hi = probs[2 * c], probs[2 * c + 1]
            frag = t.op(f"vector.from_elements {lo[0][0]}, {lo[0][1]}, {lo[1][0]}, {lo[1][1]}, {hi[0][0]}, {hi[0][1]}, "
                        f"{hi[1][0]}, {hi[1][1]} : vector<4x2x{dt}>", "pa")
            if dt == "bf16":
                frag = self.registers(frag, 4)
            for n16 in range(d // 16):
                quad = self.ldmatrix("%Vs", self.KVs_t, self.kv_layout, buffer, t.add(t.c(c * 16), "%lane_row16"),
                                     t.add(t.c(n16 * 16), "%lane_chunk16"), True)
                for h in (0, 1):
                    b = t.op(f"vector.extract_strided_slice {quad} {{offsets = [{2 * h}, 0], sizes = [2, 2], "
                             f"strides = [1, 1]}} : vector<4x2x{dt}> to vector<2x2x{dt}>", "b")
                    if dt == "bf16":
                        b = self.registers(b, 2)
                    outs[2 * n16 + h] = self.mma(frag, b, outs[2 * n16 + h])
        return new_max + sums + outs

    def module_text(self, name: str) -> str:
        t, a, T = self.t, self.a, self.tiles
        d, dt = a.head_dim, a.dtype
        t.line("%i32_1 = arith.constant 1 : i32")
        t.line("%i32_2 = arith.constant 2 : i32")
        t.line("%i32_32 = arith.constant 32 : i32")
        t.line("%tid = gpu.thread_id x")
        t.line("%bx = gpu.block_id x")
        t.line("%by = gpu.block_id y")
        t.line(f"%lane = arith.remui %tid, {t.c(32)} : index")
        t.line(f"%wrow = arith.muli {t.op(f'arith.divui %tid, {t.c(32)} : index', 'i')}, {t.c(16)} : index")
        self.lane_indices()
        t.line(f"%q0 = arith.muli %bx, {t.c(T.block_m)} : index")
        rest = "%by"  # the batch-head index -> its leading indices, last dim fastest
        for i in reversed(range(len(a.lead))):
            t.line(f"%lead{i} = arith.remui {rest}, {t.c(a.lead[i])} : index")
            rest = t.op(f"arith.divui {rest}, {t.c(a.lead[i])} : index", "i")
        q, q_t = self.row_view("%Q", a.seq_q, dt)
        k_view, self.kv_t = self.row_view("%K", a.seq_k, dt)
        self.kv_views = (k_view, self.row_view("%V", a.seq_k, dt)[0])
        o, o_t = self.row_view("%O", a.seq_q, a.out_dtype)
        t.line(f"%smem = gpu.dynamic_shared_memory : memref<?xi8, {WORKGROUP}>")
        q_bytes, kv_bytes = T.block_m * d * ELEM_BYTES, T.stages * T.block_n * d * ELEM_BYTES
        t.line(f"%Qs = memref.view %smem[{t.c(0)}][] : memref<?xi8, {WORKGROUP}> to {self.Qs_t}")
        t.line(f"%Ks = memref.view %smem[{t.c(q_bytes)}][] : memref<?xi8, {WORKGROUP}> to {self.KVs_t}")
        t.line(f"%Vs = memref.view %smem[{t.c(q_bytes + kv_bytes)}][] : memref<?xi8, {WORKGROUP}> to {self.KVs_t}")

        self.copy_tile(q, q_t, "%Qs", self.Qs_t, self.q_layout, t.c(0), "%q0", t.c(0), a.seq_q, d)
        t.line("nvvm.cp.async.commit.group")
        t.line("nvvm.cp.async.wait.group 0")
        t.line("gpu.barrier")
        self.q_frags = []
        for kk in range(d // 16):
            frag = self.ldmatrix("%Qs", self.Qs_t, self.q_layout, t.c(0), t.add("%wrow", "%lane_row16"),
                                 t.add("%lane_chunk16", t.c(kk * 16)), False)
            self.q_frags.append(self.registers(frag, 4) if dt == "bf16" else frag)

        blocks = key_blocks(a, T)
        if a.causal:  # key blocks past the block's last query are all masked: not visited
            last = t.op(f"arith.divui {t.add('%q0', t.c(T.block_m + T.block_n - 1))}, {t.c(T.block_n)} : index", "i")
            t.line(f"%bound = arith.minui {last}, {t.c(blocks)} : index")
        else:
            t.line(f"%bound = arith.addi {t.c(blocks)}, {t.c(0)} : index")
        neg, zero = self.f32(_MASKED), self.f32(0.0)
        o_zero = t.op("arith.constant dense<0.0> : vector<2x2xf32>", "z")
        n_o = d // 8
        carried = ["%m0", "%m1", "%l0", "%l1"] + [f"%o{i}" for i in range(n_o)]
        inits = [neg, neg, zero, zero] + [o_zero] * n_o
        types = ["f32"] * 4 + ["vector<2x2xf32>"] * n_o
        # the K / V pipeline: phase_cycle's cp.async plan, proved for every block's count of key blocks
        self.emit_events(self.plan.prologue, None, [])
        t.open(f"%res:{len(carried)} = scf.for %j = {t.c(0)} to %bound step {t.c(1)} iter_args("
               + ", ".join(f"{c} = {i}" for c, i in zip(carried, inits)) + f") -> ({', '.join(types)})")
        new = self.emit_events(self.plan.body, "%j", carried)
        t.line(f"scf.yield {', '.join(new)} : {', '.join(types)}")
        t.close()
        t.line("nvvm.cp.async.wait.group 0")  # the empty groups of loads past the last block

        one = self.f32(1.0)
        inverse = [t.op(f"arith.divf {one}, {self.quad_reduce(f'%res#{2 + h}', 'arith.addf')} : f32", "x")
                   for h in (0, 1)]
        for h in (0, 1):
            row = t.add(t.add("%q0", "%wrow"), t.add("%lane_group", t.c(8 * h)))
            t.open(f"scf.if {t.cmp('ult', row, t.c(a.seq_q))}")
            factor = t.op(f"vector.broadcast {inverse[h]} : f32 to vector<2xf32>", "x")
            for i in range(n_o):
                pair = t.op(f"vector.extract %res#{4 + i}[{h}] : vector<2xf32> from vector<2x2xf32>", "v")
                pair = t.op(f"arith.mulf {pair}, {factor} : vector<2xf32>", "v")
                if a.out_dtype != "f32":
                    pair = t.op(f"arith.truncf {pair} : vector<2xf32> to vector<2x{a.out_dtype}>", "v")
                t.line(f"vector.store {pair}, {o}[{row}, {t.add('%lane_pair', t.c(8 * i))}] : {o_t}, "
                       f"vector<2x{a.out_dtype}>")
            t.close()

        shape_q = (*a.lead, a.seq_q, d)
        shape_k = (*a.lead, a.seq_k, d)
        params = [f"%Q: {_memref(shape_q, dt)}", f"%K: {_memref(shape_k, dt)}", f"%V: {_memref(shape_k, dt)}",
                  f"%O: {_memref(shape_q, a.out_dtype)}"]
        return gpu_module_text(t, name, params, (T.threads, 1))
