"""Flash attention for NVIDIA sm_80 and later (f16 / bf16 in, f32 softmax and accumulation):
softmax(scale Q K^T) V without the S x S matrix, on mma.sync m16n8k16. A gpu.module text,
lowered by targets/nvvm/target.py.

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
Requirements: head dim 16, 32, 64, 128 or 256; any sequence lengths.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ...errors import OpError
from ...codegen.bank_conflicts import TileLayout, conflict_free_swizzle, report
from ...codegen.loop_text import LoopText, memref_text
from .mma import ELEM_BYTES, MMA_DTYPES, PER_CHUNK, WORKGROUP, _Writer, gpu_module_text
from .phase_cycle import LoopPlan, cp_async_plan

HEAD_DIMS = (16, 32, 64, 128, 256)
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


def grid(a: MmaAttention, tiles) -> tuple[int, int, int]:
    """Query blocks along x, batch-heads along y (both kernels; `tiles`: their block_m)."""
    return -(-a.seq_q // tiles.block_m), math.prod(a.lead), 1


def attention_module_text(a: MmaAttention, tiles: AttentionTiles = AttentionTiles(), name: str = "attention") -> str:
    """A gpu.module with kernel @name(Q, K, V, O), tiles.threads threads, tiles.shared_bytes()
    of dynamic shared memory."""
    a.validate()
    if a.head_dim not in HEAD_DIMS:
        raise OpError(f"the mma.sync attention kernel needs a head dim of {', '.join(map(str, HEAD_DIMS))} (rows of a "
                      f"power-of-two number of 16-byte chunks, for the XOR swizzle), got {a.head_dim}: pad Q, K and "
                      "V's last dim with zeros to the next one (on sm_90a the wgmma kernel also takes 192)")
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


def key_blocks(a: MmaAttention, tiles) -> int:
    return -(-a.seq_k // tiles.block_n)


def key_block_bound(t: LoopText, a: MmaAttention, tiles) -> None:
    """%bound: the key blocks block %q0's queries visit (causal: none past its last query, all
    masked)."""
    blocks = key_blocks(a, tiles)
    if a.causal:
        last = t.op(f"arith.divui {t.add('%q0', t.c(tiles.block_m + tiles.block_n - 1))}, {t.c(tiles.block_n)} : index",
                    "i")
        t.line(f"%bound = arith.minui {last}, {t.c(blocks)} : index")
    else:
        t.line(f"%bound = arith.constant {blocks} : index")


def head_view(t: LoopText, a: MmaAttention, mem: str, seq: int, dtype: str) -> tuple[str, str]:
    """The [seq, D] matrix of the block's batch-head (%lead0, ...) in a [..., seq, D] parameter,
    and its type."""
    lead = len(a.lead)
    if not lead:
        return mem, memref_text((seq, a.head_dim), dtype)
    strided = f"memref<{seq}x{a.head_dim}x{dtype}, strided<[{a.head_dim}, 1], offset: ?>>"
    offsets = ", ".join([f"%lead{i}" for i in range(lead)] + ["0", "0"])
    sizes = ", ".join(["1"] * lead + [str(seq), str(a.head_dim)])
    view = t.op(f"memref.subview {mem}[{offsets}] [{sizes}] [{', '.join(['1'] * (lead + 2))}] : "
                f"{memref_text((*a.lead, seq, a.head_dim), dtype)} to {strided}", "m")
    return view, strided


def lead_indices(t: LoopText, a: MmaAttention, flat: str) -> None:
    """%lead0, ...: the leading (batch, head) indices of batch-head `flat`, last dim fastest."""
    rest = flat
    for i in reversed(range(len(a.lead))):
        t.line(f"%lead{i} = arith.remui {rest}, {t.c(a.lead[i])} : index")
        rest = t.op(f"arith.divui {rest}, {t.c(a.lead[i])} : index", "i")


def f32_const(t: LoopText, value: float) -> str:
    return t.op(f"arith.constant {value:.9e} : f32", "f")


def shuffle_constants(t: LoopText) -> None:
    """%i32_1, %i32_2, %i32_32: quad_reduce's shuffle offsets and width."""
    for value in (1, 2, 32):
        t.line(f"%i32_{value} = arith.constant {value} : i32")


def quad_reduce(t: LoopText, x: str, op: str) -> str:
    """`op` (arith.maximumf / arith.addf) over the 4 lanes holding one row's columns (needs
    shuffle_constants)."""
    for offset in ("%i32_1", "%i32_2"):
        other = t.fresh("s")
        t.line(f"{other}, {other}_valid = gpu.shuffle xor {x}, {offset}, %i32_32 : f32")
        x = t.op(f"{op} {x}, {other} : f32", "r")
    return x


def exp2(t: LoopText, x: str) -> str:
    """2^x as one ex2.approx (relative error ~2^-22; 0 for the masked scores' -1e30)."""
    return t.op(f"math.exp2 {x} fastmath<afn> : f32", "x")


def online_softmax(t: LoopText, a: MmaAttention, scores, m: list[str], l: list[str], k0: str, queries: list[str]):
    """One key block's step of the online softmax over scores[n][h][e]: the f32 score of query
    row queries[h] and key k0 + %lane_pair + 8 n + e (the m16n8 accumulator layout, which
    wgmma's m64 one repeats per warp). Scales and masks (keys past the sequence; after the query
    when causal), takes the new row maxima across the row's 4 lanes, and returns (new maxima,
    running sums (this thread's part) rescaled and increased, the factors alpha = exp(old max -
    new max) the O rows scale by, the probabilities exp(score - max) cast to the inputs' dtype
    as probs[n][h][e]). Maxima are of scale x score x log2 e: exponentials are base 2."""
    # scores in base 2 (scale log2 e folded in): one ex2.approx per probability, where math.exp
    # costs libdevice's ten instructions; maxima and alpha are base-2 too
    neg, scale = f32_const(t, _MASKED), f32_const(t, a.scale * math.log2(math.e))
    # keys k0 + %lane_pair + j are valid for j < limit[h]: before the sequence's end (and, when
    # causal, up to the query): one compare with a constant per score
    first = t.add(k0, "%lane_pair")
    limit = []
    for h in (0, 1):
        end = t.c(a.seq_k)
        if a.causal:
            end = t.op(f"arith.minsi {end}, {t.add(queries[h], t.c(1))} : index", "i")
        limit.append(t.op(f"arith.subi {end}, {first} : index", "i"))
    values = [[[None, None] for _ in range(2)] for _ in scores]
    row_max = list(m)
    for n, tile in enumerate(scores):
        for h in (0, 1):
            for e in (0, 1):
                x = t.op(f"arith.mulf {tile[h][e]}, {scale} : f32", "x")
                valid = t.cmp("slt", t.c(8 * n + e), limit[h])
                x = t.op(f"arith.select {valid}, {x}, {neg} : f32", "x")
                values[n][h][e] = x
                row_max[h] = t.op(f"arith.maximumf {row_max[h]}, {x} : f32", "r")
    new_max = [quad_reduce(t, row_max[h], "arith.maximumf") for h in (0, 1)]
    alpha = [exp2(t, t.op(f"arith.subf {m[h]}, {new_max[h]} : f32", "x")) for h in (0, 1)]
    sums = [t.op(f"arith.mulf {l[h]}, {alpha[h]} : f32", "x") for h in (0, 1)]
    probs = [[[None, None] for _ in range(2)] for _ in scores]
    for n in range(len(scores)):
        for h in (0, 1):
            for e in (0, 1):
                p = exp2(t, t.op(f"arith.subf {values[n][h][e]}, {new_max[h]} : f32", "x"))
                sums[h] = t.op(f"arith.addf {sums[h]}, {p} : f32", "x")
                probs[n][h][e] = t.op(f"arith.truncf {p} : f32 to {a.dtype}", "x")
    return new_max, sums, alpha, probs


def store_normalized(t: LoopText, a: MmaAttention, o: str, o_t: str, sums: list[str], queries: list[str],
                     pairs: list[list[str]]) -> None:
    """O[queries[h], %lane_pair + 8 i : +2] = pairs[h][i] (vector<2xf32>) / the row's sum (summed
    across its 4 lanes), cast; rows past the sequence are not stored."""
    one = f32_const(t, 1.0)
    inverse = [t.op(f"arith.divf {one}, {quad_reduce(t, sums[h], 'arith.addf')} : f32", "x") for h in (0, 1)]
    for h in (0, 1):
        t.open(f"scf.if {t.cmp('ult', queries[h], t.c(a.seq_q))}")
        factor = t.op(f"vector.broadcast {inverse[h]} : f32 to vector<2xf32>", "x")
        for i, pair in enumerate(pairs[h]):
            pair = t.op(f"arith.mulf {pair}, {factor} : vector<2xf32>", "v")
            if a.out_dtype != "f32":
                pair = t.op(f"arith.truncf {pair} : vector<2xf32> to vector<2x{a.out_dtype}>", "v")
            t.line(f"vector.store {pair}, {o}[{queries[h]}, {t.add('%lane_pair', t.c(8 * i))}] : {o_t}, "
                   f"vector<2x{a.out_dtype}>")
        t.close()


class _AttentionWriter(_Writer):
    """Reuses the GEMM writer's copies, swizzle, ldmatrix and mma (self.g.dtype, self.tiles.threads)."""

    def __init__(self, a: MmaAttention, tiles: AttentionTiles, plan: LoopPlan):
        self.g, self.tiles, self.a, self.plan = a, tiles, a, plan
        self.t = LoopText()
        self.t.depth = 3
        swizzle = conflict_free_swizzle(a.head_dim, ELEM_BYTES)
        self.q_layout = TileLayout(tiles.block_m, a.head_dim, ELEM_BYTES, swizzle)
        self.kv_layout = TileLayout(tiles.block_n, a.head_dim, ELEM_BYTES, swizzle)
        d, T = a.head_dim, a.dtype
        self.Qs_t = f"memref<1x{tiles.block_m}x{d}x{T}, {WORKGROUP}>"
        self.KVs_t = f"memref<{tiles.stages}x{tiles.block_n}x{d}x{T}, {WORKGROUP}>"

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
        s = self.scores(self.q_frags, buffer)
        queries = [t.add(t.add("%q0", "%wrow"), t.add("%lane_group", t.c(8 * h))) for h in (0, 1)]
        scores = [[[t.op(f"vector.extract {acc}[{h}, {e}] : f32 from vector<2x2xf32>", "x") for e in (0, 1)]
                   for h in (0, 1)] for acc in s]
        new_max, sums, alpha, probs = online_softmax(t, a, scores, m, l, k0, queries)
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
        shuffle_constants(t)
        t.line("%tid = gpu.thread_id x")
        t.line("%bx = gpu.block_id x")
        t.line("%by = gpu.block_id y")
        t.line(f"%lane = arith.remui %tid, {t.c(32)} : index")
        t.line(f"%wrow = arith.muli {t.op(f'arith.divui %tid, {t.c(32)} : index', 'i')}, {t.c(16)} : index")
        self.lane_indices()
        t.line(f"%q0 = arith.muli %bx, {t.c(T.block_m)} : index")
        lead_indices(t, a, "%by")
        q, q_t = head_view(t, a, "%Q", a.seq_q, dt)
        k_view, self.kv_t = head_view(t, a, "%K", a.seq_k, dt)
        self.kv_views = (k_view, head_view(t, a, "%V", a.seq_k, dt)[0])
        o, o_t = head_view(t, a, "%O", a.seq_q, a.out_dtype)
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

        key_block_bound(t, a, T)
        neg, zero = f32_const(t, _MASKED), f32_const(t, 0.0)
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

        queries = [t.add(t.add("%q0", "%wrow"), t.add("%lane_group", t.c(8 * h))) for h in (0, 1)]
        pairs = [[t.op(f"vector.extract %res#{4 + i}[{h}] : vector<2xf32> from vector<2x2xf32>", "v")
                  for i in range(n_o)] for h in (0, 1)]
        store_normalized(t, a, o, o_t, ["%res#2", "%res#3"], queries, pairs)

        shape_q = (*a.lead, a.seq_q, d)
        shape_k = (*a.lead, a.seq_k, d)
        params = [f"%Q: {memref_text(shape_q, dt)}", f"%K: {memref_text(shape_k, dt)}", f"%V: {memref_text(shape_k, dt)}",
                  f"%O: {memref_text(shape_q, a.out_dtype)}"]
        return gpu_module_text(t, name, params, (T.threads, 1))
