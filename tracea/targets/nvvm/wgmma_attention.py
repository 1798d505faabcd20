"""Flash attention for Hopper (sm_90a): TMA copies paced by mbarriers, a producer warpgroup, and
`wgmma` for both products, in the way of FlashAttention-3. A gpu.module text, lowered by
targets/nvvm/target.py.

    block (bx, by): queries bx BM .. + BM of batch-head `by`; MMA warpgroup w owns 64 of them
    the producer (the first thread of the warpgroup after the MMA warpgroups, which hands its
    registers to them with setmaxnreg: ptxas budgets registers per 4 warps) copies the Q tile once,
    then per key block j the K and V tiles into buffer j % stages (phase_cycle.specialized_plan:
    it waits for the buffer's release by every MMA warp before refilling it); proved for every
    block's count of key blocks (causal blocks visit only the blocks up to their last query)
    each MMA warpgroup, per key block j (the plan's consumer body, _Writer.step):
        S = Q K^T: wgmma m64 x BN x k16 over the head dim, both operands from shared memory
        (K read as the K-major B of a GEMM); the turn passes on; wait_group 0 retires S and the
        last block's P V, and the warp releases the last block's buffer
        online softmax per row (gpu_attention.online_softmax: the m64 accumulator layout is the
        m16n8 one per warp): scale, mask, new max, P = exp(S - max), running sum, O *= alpha
        (at its next turn) O += P V: wgmma with A from registers (P's accumulator pairs, cast,
        are the A fragments, as in the mma.sync kernel) and V an N-major B from shared memory,
        left in flight
    O / sum, cast, stored
    turns (FlashAttention-3's ping-pong; two or more MMA warpgroups and buffers, the default):
    a warpgroup issues its P V and the next Q K^T only in its turn, so its softmax runs while
    the other warpgroups' MMAs keep the Tensor Cores busy; named barriers, proved with the
    K / V pipeline by phase_cycle.check_agents (a turn must not wait for a release only a later
    turn makes: one buffer has no turns)

The tiles are 128-byte swizzled (TMA writes them so, the descriptors read them so) in 64-column
boxes. Operands go through 3-D tensor maps (head dim, sequence, batch-heads): a box past a
sequence's end is zero-filled, never the next head's rows. Requirements: f16 / bf16, head dim
64, 128, 192 or 256; any sequence lengths. NVVM's wgmma op takes A from shared memory only:
the P V product is inline PTX.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...errors import OpError
from ...codegen.loop_text import LoopText, memref_text
from .attention import (_MASKED, MmaAttention, f32_const, head_view, key_block_bound, key_blocks,
                            lead_indices, online_softmax, shuffle_constants, store_normalized)
from .mma import WORKGROUP, gpu_module_text
from .wgmma import (_ALIGN, _K_MAJOR, BOX_K, ELEM_BYTES, REGISTERS, SWIZZLE_BYTES, WARPGROUP, TensorMap,
                        box_type, n_major_bits, tensormap_type)
from .wgmma import _Writer as _GemmWriter
from .phase_cycle import (AgentPlan, AwaitTurn, Compute, PassTurn, Release, WaitFull, WaitMma,
                          specialized_plan)


PRODUCER_REGISTERS = 24  # the producer warpgroup's: one thread issuing copies needs few


@dataclass(frozen=True)
class WgmmaAttentionTiles:
    block_m: int = 128  # queries per block: 64 per MMA warpgroup
    block_n: int = 128  # keys per step
    stages: int = 2  # K and V buffers
    pingpong: bool = True  # several MMA warpgroups take turns at the Tensor Cores (with stages >= 2)
    specialized = True  # a producer warp issues the copies (the GEMM writer's plan events ask)

    @property
    def warpgroups(self) -> int:
        return self.block_m // 64

    @property
    def threads(self) -> int:
        return WARPGROUP * (self.warpgroups + 1)  # and the producer warpgroup

    @property
    def mma_registers(self) -> int:
        """What each MMA thread gets once the producer warpgroup gave its registers up (setmaxnreg
        works on whole warpgroups, in steps of 8, 24 to 256)."""
        return min(240, (REGISTERS // WARPGROUP - PRODUCER_REGISTERS) // self.warpgroups // 8 * 8)

    def q_bytes(self, head_dim: int) -> int:
        return self.block_m * head_dim * ELEM_BYTES

    def kv_bytes(self, head_dim: int) -> int:
        """One key block's K (or V) tile."""
        return self.block_n * head_dim * ELEM_BYTES

    def shared_bytes(self, head_dim: int) -> int:
        """Q, the K and V buffers, and room to align them to a swizzle atom."""
        return self.q_bytes(head_dim) + 2 * self.stages * self.kv_bytes(head_dim) + _ALIGN

    def validate(self, head_dim: int) -> None:
        problems = []
        if self.block_m not in (64, 128, 192, 256):
            problems.append(f"block_m {self.block_m} must be 64, 128, 192 or 256 (64 queries per MMA warpgroup)")
        if self.block_n % 16 or not 16 <= self.block_n <= 256:
            problems.append(f"block_n {self.block_n} must be a multiple of 16 up to 256 (k16 steps of P V)")
        if self.stages < 1:
            problems.append(f"stages must be >= 1, got {self.stages}")
        # S and O accumulators, P's fragments, and addresses and softmax state
        registers = self.block_n // 2 + head_dim // 2 + self.block_n // 4 + 40
        if registers > self.mma_registers:
            problems.append(f"{self.block_n} keys per step and head dim {head_dim} need about {registers} registers a "
                            f"thread, {self.warpgroups} MMA warpgroups get {self.mma_registers} each: use fewer keys "
                            "per step or fewer warpgroups")
        if problems:
            raise OpError("wgmma attention tiles: " + "; ".join(problems))


def default_tiles(a: MmaAttention) -> WgmmaAttentionTiles:
    """128 queries over two warpgroups; 128 keys per step up to head dim 128, 64 beyond (the O
    accumulators grow with the head dim)."""
    return WgmmaAttentionTiles(128, 128 if a.head_dim <= 128 else 64, 2)


def supports(a: MmaAttention) -> bool:
    """Whether the wgmma kernel takes `a` (else the mma.sync kernel runs it, on sm_90a too)."""
    return a.dtype in ("f16", "bf16") and a.head_dim % BOX_K == 0 and a.head_dim <= 256


def tensor_maps(a: MmaAttention, tiles: WgmmaAttentionTiles) -> tuple[TensorMap, ...]:
    """Q, K, V in 64-column boxes of BM (Q) or BN rows, one batch-head deep."""
    return (TensorMap(0, (BOX_K, tiles.block_m), rank=3), TensorMap(1, (BOX_K, tiles.block_n), rank=3),
            TensorMap(2, (BOX_K, tiles.block_n), rank=3))


def wgmma_attention_module_text(a: MmaAttention, tiles: WgmmaAttentionTiles | None = None,
                                name: str = "attention") -> str:
    """A gpu.module with kernel @name(Q, K, V, O, Q's, K's and V's tensor maps), tiles.threads
    threads, tiles.shared_bytes(D) of dynamic shared memory."""
    a.validate()
    if not supports(a):
        raise OpError(f"the wgmma attention kernel needs a head dim of 64, 128, 192 or 256, got {a.head_dim}")
    tiles = tiles or default_tiles(a)
    tiles.validate(a.head_dim)
    turns = tiles.warpgroups if tiles.pingpong and tiles.warpgroups > 1 and tiles.stages > 1 else 0
    plan = specialized_plan(tiles.stages, 4 * tiles.warpgroups, turns)
    blocks = key_blocks(a, tiles)
    for count in (range(1, blocks + 1) if a.causal else (blocks,)):  # causal: each block's own count
        plan.verify(count, count, agents=1)  # one MMA warp stands for its peers (taking turns: per warpgroup)
    return _Writer(a, tiles, plan).module_text(name)


class _Writer(_GemmWriter):
    """Reuses the GEMM writer's barriers, waits, releases, descriptors and plan events (self.g is
    the attention: dtype, self.tiles: stages); one block per cluster."""
    cluster = 1

    def __init__(self, a: MmaAttention, tiles: WgmmaAttentionTiles, plan: AgentPlan):
        self.g = self.a = a
        self.tiles, self.plan = tiles, plan
        self.t = LoopText()
        self.t.depth = 3
        self.maps = tensor_maps(a, tiles)
        self.map_names = ("%tmaQ", "%tmaK", "%tmaV")
        self.mbar_t = f"!nvgpu.mbarrier.group<memorySpace = {WORKGROUP}, num_barriers = {tiles.stages}>"
        self.q_bar_t = f"!nvgpu.mbarrier.group<memorySpace = {WORKGROUP}, num_barriers = 1>"
        self.s_t = "!llvm.struct<(" + ", ".join(["f32"] * (tiles.block_n // 2)) + ")>"
        self.o_t = "!llvm.struct<(" + ", ".join(["f32"] * (a.head_dim // 2)) + ")>"
        self.chunks = a.head_dim // BOX_K  # 64-column boxes per tile

    def trip_count(self) -> int:
        return key_blocks(self.a, self.tiles)

    # -- shared memory: Q [chunk][BM][64], then K and V [stage][chunk][BN][64], each 64-column
    #    chunk a run of 8-row swizzle atoms
    def kv_offset(self, which: int, buffer: str) -> str:
        """Byte offset (from the aligned base) of buffer `buffer`'s K (which 0) or V (1) tile."""
        t, T, d = self.t, self.tiles, self.a.head_dim
        first = T.q_bytes(d) + which * T.stages * T.kv_bytes(d)
        return t.add("%pad", t.add(t.c(first), t.mul(buffer, t.c(T.kv_bytes(d)))))

    def load_tiles(self, desc: str, tmap: TensorMap, offset: str, row: str, buffer: str) -> None:
        t = self.t
        rows = tmap.box[1]
        for c in range(self.chunks):
            view = self.box_view(t.add(offset, t.c(c * rows * SWIZZLE_BYTES)), tmap)
            self.tma(view, desc, tmap, [t.c(c * BOX_K), row, "%by"], buffer, None)

    def load(self, tile: str, predicate: str | None, k_slice: str | None = None) -> None:
        """(In the producer thread.) Arm the buffer's barrier with the K and V tiles' bytes of key
        block `tile` and issue their copies."""
        t, T = self.t, self.tiles
        buffer = self.buffer_of(tile)
        t.line(f"nvgpu.mbarrier.arrive.expect_tx %mbar[{buffer}], {t.c(2 * T.kv_bytes(self.a.head_dim))} : "
               f"{self.mbar_t}")
        k0 = t.mul(tile, t.c(T.block_n))
        for which, desc in enumerate(("%tmaK", "%tmaV")):
            self.load_tiles(desc, self.maps[1 + which], self.kv_offset(which, buffer), k0, buffer)

    # -- the MMA warpgroups' step ------------------------------------------------------------
    def scores(self, buffer: str) -> str:
        """S = Q K^T for the warpgroup's 64 queries and the key block in `buffer`, issued as one
        wgmma group."""
        t, T = self.t, self.tiles
        zero = t.op(f"llvm.mlir.zero : {self.s_t}", "z")
        q_base = t.add("%base", t.add("%pad", "%wg_q"))
        k_base = t.add("%base", self.kv_offset(0, buffer))
        t.line("nvvm.wgmma.fence.aligned")
        s = zero
        for kk in range(self.a.head_dim // 16):
            chunk, step = divmod(kk, BOX_K // 16)
            da = self.descriptor(t.add(q_base, t.c(chunk * T.block_m * SWIZZLE_BYTES + step * 32)), _K_MAJOR)
            db = self.descriptor(t.add(k_base, t.c(chunk * T.block_n * SWIZZLE_BYTES + step * 32)), _K_MAJOR)
            s = t.op(f"nvvm.wgmma.mma_async {da}, {db}, {s}, <m = 64, n = {T.block_n}, k = 16>, "
                     f"D[<f32>, <one>, <wrapped>], A[<{self.a.dtype}>, <one>, <row>], "
                     f"B[<{self.a.dtype}>, <one>, <col>] : {self.s_t} -> {self.s_t}", "s")
        t.line("nvvm.wgmma.commit.group.sync.aligned")
        return s

    # -- turns (FlashAttention-3's ping-pong): with several MMA warpgroups, warpgroup w issues
    #    its MMAs (the last block's P V, then this block's Q K^T) only after w - 1 issued its own,
    #    so one warpgroup's softmax runs while the others' MMAs keep the Tensor Cores busy. Named
    #    barrier 1 + w: w waits there (128 threads), w - 1 arrives (128 more) when its turn is
    #    issued. Turns go 0, 1, .., W - 1, 0, ..: the last warpgroup opens the first round by an
    #    arrival, and every warpgroup but the last closes its final turn by one, so every
    #    barrier sees as many arrivals as waits.
    def takes_turns(self) -> bool:
        return self.plan.turns > 0

    def await_turn(self) -> None:
        if self.takes_turns():
            self.t.line("nvvm.barrier id = %turn number_of_threads = %turn_threads")

    def pass_turn(self) -> None:
        if self.takes_turns():
            self.t.line("nvvm.barrier.arrive id = %next_turn number_of_threads = %turn_threads")

    def open_turns(self, group: str) -> None:
        t, W = self.t, self.tiles.warpgroups
        if not self.takes_turns():
            return
        warpgroups = t.op(f"arith.constant {W} : i32", "w")
        t.line(f"%turn = arith.addi {t.op(f'arith.index_cast {group} : index to i32', 'w')}, %i32_1 : i32")
        t.line(f"%next_turn = arith.addi {t.op(f'arith.remui %turn, {warpgroups} : i32', 'w')}, %i32_1 : i32")
        t.line(f"%turn_threads = arith.constant {2 * WARPGROUP} : i32")
        t.open(f"scf.if {t.cmp('eq', group, t.c(W - 1))}")
        self.pass_turn()
        t.close()
        self.await_turn()

    def close_turns(self, group: str) -> None:
        if self.takes_turns():
            self.t.open(f"scf.if {self.t.cmp('ne', group, self.t.c(self.tiles.warpgroups - 1))}")
            self.pass_turn()
            self.t.close()

    def fenced(self, values: list[str], type_: str) -> list[str]:
        """The values passed through an empty side-effecting asm: LLVM may not move their
        definitions past, nor their uses before, the wgmma fences and waits around it (ptxas
        serializes every wgmma of a kernel that writes a wgmma's registers after its fence)."""
        c = "f" if type_ == "f32" else "r"
        return [self.t.op(f'llvm.inline_asm has_side_effects "", "={c},0" {v} : ({type_}) -> {type_}', "x")
                for v in values]

    def elements(self, struct: str, type_: str, count: int) -> list[str]:
        return [self.t.op(f"llvm.extractvalue {struct}[{i}] : {type_}", "x") for i in range(count)]

    def pv_wgmma(self, a_regs: list[str], v_desc: str, accs: list[str]) -> list[str]:
        """accs += P V for one k16 step: wgmma m64 x D x k16 with A (P) in 4 b32 registers, B (V)
        N-major in shared memory. Inline PTX: NVVM's op reads A from shared memory only."""
        t, d = self.t, self.a.head_dim
        n = d // 2  # accumulator registers
        outs = ",".join(f"${i}" for i in range(n))
        ptx = (f"{{\\0A.reg .pred p;\\0Asetp.ne.b32 p, ${n + 5}, 0;\\0A"
               f"wgmma.mma_async.sync.aligned.m64n{d}k16.f32.{self.a.dtype}.{self.a.dtype} {{{outs}}}, "
               f"{{${n},${n + 1},${n + 2},${n + 3}}}, ${n + 4}, p, 1, 1, 1;\\0A}}")
        constraints = ",".join(["=f"] * n + ["r"] * 4 + ["l", "n"] + [str(i) for i in range(n)])
        operands = ", ".join(a_regs + [v_desc, "%i32_1"] + accs)
        types = ", ".join(["i32"] * 4 + ["i64", "i32"] + ["f32"] * n)
        o = t.op(f'llvm.inline_asm has_side_effects asm_dialect = att "{ptx}", "{constraints}" {operands} : '
                 f"({types}) -> {self.o_t}", "o")
        return self.elements(o, self.o_t, n)

    def step(self, tile: str, accs: list[str]) -> list[str]:
        """Key block `tile`'s step, the plan's consumer body (refused unless it is one of the two
        this writer implements): accs = [max of row g, of row g + 8, their running sums (this
        thread's part), O]; returns the new ones with this block's P V in flight (one buffer: retired)."""
        t = self.t
        turn = self.takes_turns()
        released_early = (WaitFull(0, 0), Compute(0, 0), *(PassTurn(),) * turn, WaitMma(1), Release(-1),
                          *(AwaitTurn(),) * turn)
        one_buffer = (WaitFull(0, 0), Compute(0, 0), WaitMma(0), Release(0))
        if self.plan.consumer not in (released_early, one_buffer):
            raise OpError(f"the wgmma attention kernel emits the consumer steps {released_early} or {one_buffer}, "
                          f"not {self.plan.consumer}")
        self.wait_full(tile)
        s = self.scores(self.buffer_of(tile))
        self.pass_turn()  # this turn's MMAs are issued: the next warpgroup may issue its own
        # the plan's wait_group 1, made 0: the softmax reads the scores (the last P V retires too)
        t.line("nvvm.wgmma.wait.group.sync.aligned 0")
        if self.plan.consumer == one_buffer:
            accs = self.softmax_and_pv(tile, s, accs)
            t.line("nvvm.wgmma.wait.group.sync.aligned 0")
            self.release(tile, 0)
            return accs
        self.release(tile, 1)  # the last key block's buffer: its P V retired
        return self.softmax_and_pv(tile, s, accs)

    def softmax_and_pv(self, tile: str, s: str, accs: list[str]) -> list[str]:
        """The online softmax of the retired scores `s`, then (at the warpgroup's next turn) this
        block's P V, issued."""
        t, a, T = self.t, self.a, self.tiles
        m, l, o = accs[0:2], accs[2:4], accs[4]
        buffer = self.buffer_of(tile)
        values = self.fenced(self.elements(s, self.s_t, T.block_n // 2), "f32")
        outs = self.fenced(self.elements(o, self.o_t, a.head_dim // 2), "f32")
        scores = [[[values[4 * n + 2 * h + e] for e in (0, 1)] for h in (0, 1)] for n in range(T.block_n // 8)]
        new_max, sums, alpha, probs = online_softmax(t, a, scores, m, l, t.mul(tile, t.c(T.block_n)), self.queries)
        # O *= alpha: element i is row g + 8 ((i / 2) % 2)
        outs = [t.op(f"arith.mulf {x}, {alpha[(i // 2) % 2]} : f32", "x") for i, x in enumerate(outs)]
        # A fragments of keys 16c ..: rows g / g + 8, keys 2 (l % 4) + {0, 1} of n8 tiles 2c, 2c + 1
        regs = [self.pack(probs[2 * c + half][h]) for c in range(T.block_n // 16) for half in (0, 1) for h in (0, 1)]
        regs, outs = self.fenced(regs, "i32"), self.fenced(outs, "f32")
        v_base = t.add("%base", self.kv_offset(1, buffer))
        v_bits = n_major_bits(T.block_n * SWIZZLE_BYTES)  # V's 64-column chunks are BN rows apart
        self.await_turn()  # this P V and the next block's Q K^T are the warpgroup's next turn
        t.line("nvvm.wgmma.fence.aligned")  # O and P were written by ordinary instructions
        for c in range(T.block_n // 16):
            v_desc = self.descriptor(t.add(v_base, t.c(c * 16 * SWIZZLE_BYTES)), v_bits)
            outs = self.pv_wgmma(regs[4 * c:4 * c + 4], v_desc, outs)
        t.line("nvvm.wgmma.commit.group.sync.aligned")
        o = t.op(f"llvm.mlir.undef : {self.o_t}", "o")
        for i, x in enumerate(outs):
            o = t.op(f"llvm.insertvalue {x}, {o}[{i}] : {self.o_t}", "o")
        return new_max + sums + [o]

    def pack(self, pair: list[str]) -> str:
        t, dt = self.t, self.a.dtype
        vec = t.op(f"vector.from_elements {pair[0]}, {pair[1]} : vector<2x{dt}>", "pa")
        return t.op(f"llvm.bitcast {vec} : vector<2x{dt}> to i32", "pa")

    def module_text(self, name: str) -> str:
        t, a, T = self.t, self.a, self.tiles
        d, dt = a.head_dim, a.dtype
        group = self.preamble()
        shuffle_constants(t)
        t.line(f"%wg_q = arith.muli {group}, {t.c(64 * SWIZZLE_BYTES)} : index")  # its 64 rows in each Q chunk
        t.line(f"%q0 = arith.muli %bx, {t.c(T.block_m)} : index")
        lead_indices(t, a, "%by")
        self.barriers((("%qbar", self.q_bar_t, 1),))
        key_block_bound(t, a, T)

        # the producer warpgroup gives its registers to the MMA ones; its first thread copies Q
        # once, then K and V ahead of the MMA warpgroups
        t.open(f"scf.if {t.cmp('uge', '%tid', t.c(WARPGROUP * T.warpgroups))}")
        t.line(f"nvvm.setmaxregister decrease {PRODUCER_REGISTERS}")
        t.open(f"scf.if {t.cmp('eq', '%tid', t.c(WARPGROUP * T.warpgroups))}")
        t.line(f"nvgpu.mbarrier.arrive.expect_tx %qbar[{t.c(0)}], {t.c(T.q_bytes(d))} : {self.q_bar_t}")
        q_map = self.maps[0]
        for c in range(self.chunks):
            view = self.box_view(t.add("%pad", t.c(c * T.block_m * SWIZZLE_BYTES)), q_map)
            t.line(f"nvgpu.tma.async.load %tmaQ[{t.c(c * BOX_K)}, %q0, %by], %qbar[{t.c(0)}] to {view} : "
                   f"{tensormap_type(dt, q_map)}, {self.q_bar_t} -> {box_type(dt, q_map)}")
        t.open(f"scf.for %kp = {t.c(0)} to %bound step {t.c(1)}")
        self.emit(self.plan.producer, "%kp", [])
        t.close()
        t.close()
        t.close()

        # the MMA warpgroups
        t.open(f"scf.if {t.cmp('ult', '%tid', t.c(WARPGROUP * T.warpgroups))}")
        t.line(f"nvvm.setmaxregister increase {T.mma_registers}")
        rows = t.add("%q0", t.add(t.mul(group, t.c(64)), t.add("%wrow", "%lane_group")))
        self.queries = [rows, t.add(rows, t.c(8))]
        t.line(f"nvgpu.mbarrier.try_wait.parity %qbar[{t.c(0)}], {t.op('arith.constant false', 'p')}, %ticks : "
               f"{self.q_bar_t}")
        self.open_turns(group)
        neg, zero = f32_const(t, _MASKED), f32_const(t, 0.0)
        o_zero = t.op(f"llvm.mlir.zero : {self.o_t}", "z")
        types = ["f32"] * 4 + [self.o_t]
        t.open(f"%res:5 = scf.for %j = {t.c(0)} to %bound step {t.c(1)} iter_args(%m0 = {neg}, %m1 = {neg}, "
               f"%l0 = {zero}, %l1 = {zero}, %o = {o_zero}) -> ({', '.join(types)})")
        new = self.step("%j", ["%m0", "%m1", "%l0", "%l1", "%o"])
        t.line(f"scf.yield {', '.join(new)} : {', '.join(types)}")
        t.close()
        self.close_turns(group)
        self.emit(self.plan.consumer_epilogue, None, [])
        out, out_t = head_view(t, a, "%O", a.seq_q, a.out_dtype)
        o = self.fenced(self.elements("%res#4", self.o_t, d // 2), "f32")  # read after the wait
        pairs = [[t.op(f"vector.from_elements {o[4 * i + 2 * h]}, {o[4 * i + 2 * h + 1]} : vector<2xf32>", "v")
                  for i in range(d // 8)] for h in (0, 1)]
        store_normalized(t, a, out, out_t, ["%res#2", "%res#3"], self.queries, pairs)
        t.close()

        shape_q, shape_k = (*a.lead, a.seq_q, d), (*a.lead, a.seq_k, d)
        params = [f"%Q: {memref_text(shape_q, dt)}", f"%K: {memref_text(shape_k, dt)}", f"%V: {memref_text(shape_k, dt)}",
                  f"%O: {memref_text(shape_q, a.out_dtype)}"] + [f"{desc}_ptr: !llvm.ptr" for desc in self.map_names]
        return gpu_module_text(t, name, params, (T.threads, 1))
