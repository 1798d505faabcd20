"""The CPU attention kernel: flash-style, the S x S score matrix never exists.

    K^T and V are first copied per head in f32, in the order the register tiles read them: K^T
    (L x L blocks transposed in registers, zero-padded to whole key blocks) in strips of a QK
    tile's keys, KT[strip, d, keys]; V in strips of a P V tile's columns, VP[strip, key, columns].
    Read in place, a tile's rows were a row of K^T or V apart: with S or D a power of two they fell
    into a few L1 sets and evicted each other (head dim 128: 0.79x -> 0.92x SDPA on 1 thread).
    for each (batch-head, block of BR queries), in parallel (causal blocks in the order 0, n-1, 1,
    n-2, ... where the threads do not divide the heads, so each thread's run costs the same):
        Qs = scale * Q[block] in f32;  m = -inf, l = 0, O = 0          (per query row)
        for each block of up to BC keys (causal: only keys up to the block's last query):
            S = Qs K^T               register tiles of QR rows x QV vectors of keys
            per row: S masked to -inf outside the sequence (and above the diagonal);
                     m' = max(m, rowmax S);  P = exp(S - m');  l = l exp(m - m') + rowsum P
            O = O exp(m - m') + P V  register tiles of PR rows x up to 8 vectors of O
        out = O / l                                     (0 where l = 0: scores all -inf)

With at most IN_PLACE_ROWS queries (a decoding step over a KV cache) each (batch, head) is one block
of every query row, and K and V are read where they lie, each row once: copying them cost more
than the few rows that read them (one query over 1-2K keys: 0.34-0.52x SDPA). S then comes from
dot products of the query rows with a few keys at a time, each key's lanes summed at the end.

A block's width is rounded up to whole QK tiles, not to BC: the causal diagonal and a short
last block compute only the keys they need. Exponentials use `vector_exp` (codegen/kernel_text.py), a
polynomial in arith ops, so they stay vectors; row maxima and sums reduce across lanes once per
row and block.
"""
from __future__ import annotations

from ...dialects.ops import AttentionDef, OpView
from ...codegen.loop_text import LoopText, memref_text
from .gemm import K_UNROLL, transpose_in_registers
from ...codegen.kernel_text import vector_exp

NNAN = "fastmath<nnan>"  # max without NaN handling: a single vmaxps
IN_PLACE_ROWS = 8  # queries up to which K and V are read in place (a decoding step)


def tile_registers(rows: int, vectors: int) -> int:
    """Vector registers a register tile of `rows` x `vectors` needs: its accumulators, the vectors it
    loads per step and one broadcast."""
    return rows * vectors + vectors + 1


def qk_tile(rows: int, keys: int, lanes: int, registers: int) -> tuple[int, int]:
    """(query rows, key vectors) of the QK^T register tile for a block of `rows` x `keys` on a host
    with `registers` vector registers: accumulators + the key vectors + one broadcast must fit,
    else LLVM spills accumulators to the stack in the innermost loop."""
    vectors = 2 if keys % (2 * lanes) == 0 and registers >= 8 else 1
    tile_rows = max(r for r in range(1, rows + 1) if rows % r == 0 and tile_registers(r, vectors) <= registers)
    return tile_rows, vectors


def pv_tile(rows: int, head_vectors: int, registers: int) -> tuple[int, int]:
    """(P rows, O vectors) of the P V register tile: the most accumulators that fit beside the V
    vectors and a broadcast, then the fewest loads per FMA (rows + vectors)."""
    fits = [(r, g) for r in range(1, rows + 1) if rows % r == 0 for g in range(1, head_vectors + 1)
            if head_vectors % g == 0 and tile_registers(r, g) <= registers]
    return max(fits, key=lambda rg: (rg[0] * rg[1], -(rg[0] + rg[1])))


def _for_iter(t: LoopText, iv: str, lo: str, hi: str, step: str, inits: list[str], vt: str) -> tuple[str, list[str]]:
    """Open an scf.for carrying `inits`; returns (result name, the carried values' names)."""
    res = t.fresh("a")
    names = [t.fresh("acc") for _ in inits]
    t.open(f"{res}:{len(inits)} = scf.for {iv} = {lo} to {hi} step {step} "
           f"iter_args({', '.join(f'{n} = {i}' for n, i in zip(names, inits))}) -> ({', '.join([vt] * len(inits))})")
    return res, names


def _yield(t: LoopText, values: list[str], vt: str) -> None:
    t.line(f"scf.yield {', '.join(values)} : {', '.join([vt] * len(values))}")
    t.close()


def attention_kernel_text(name: str, v: OpView, location: str, threads: int = 1) -> str:
    q, k, val = (v.operands[n] for n in ("query", "key", "value"))
    out = v.result
    s = v.attrs["schedule"]
    L = s.lane_map.shape[-1]
    BR, BC = s.tile[:2]  # queries per block, keys per block
    QR, sub = s.warp_tile  # the QK^T register tile: query rows x keys
    QV = sub // L
    batch = 1
    for dim in q.shape[:-2]:
        batch *= dim
    sq, d = q.shape[-2:]
    skv, dv = val.shape[-2:]  # skv None: the key length is read from K at run time
    scale = AttentionDef.scale(v.attrs, d)
    causal = v.attrs["causal"]
    in_place = sq <= IN_PLACE_ROWS
    if in_place:
        BR = sq  # one block of every query row: rows past the end would be computed for nothing
    vt, it = f"vector<{L}xf32>", f"vector<{L}xi32>"
    t = LoopText(serial=threads == 1)

    def alloc(shape, dtype="f32", sizes=()):
        """A buffer of `shape`; `sizes` gives its None dims' sizes, in order."""
        return (t.op(f"memref.alloc({', '.join(sizes)}) {{alignment = 64 : i64}} : {memref_text(shape, dtype)}", "m"),
                memref_text(shape, dtype))

    def const(text: str, hint: str = "k") -> str:
        return t.op(f"arith.constant {text}", hint)

    Q, Q_t = t.batched_view(t.to_buffer("%arg0", q), q, batch)
    K, K_t = t.batched_view(t.to_buffer("%arg1", k), k, batch)
    V, V_t = t.batched_view(t.to_buffer("%arg2", val), val, batch)
    keys_n = t.c(skv) if skv is not None else t.op(f"memref.dim {K}, {t.c(1)} : {K_t}", "n")
    mask = v.operands.get("mask")  # added to the scores: [batch or 1, sq or 1, skv]
    if mask is not None:
        M, M_t = t.to_buffer("%arg3", mask), memref_text(mask.shape, mask.dtype)
    O_full, _ = alloc(out.shape, out.dtype)
    O, O_t = t.batched_view(O_full, out, batch)
    zero = const("0.0 : f32", "z")
    zv = const(f"dense<0.0> : {vt}", "z")
    ninf_v = const(f"dense<0xFF800000> : {vt}")

    # the P V tile (and a decoding step's scores) get the registers the schedule's QK tile uses
    registers = tile_registers(QR, QV)
    PR, gs = pv_tile(BR, dv // L, registers)
    GW = gs * L
    if not in_place:
        # --- K^T in f32, zero-padded to whole key blocks: L x L blocks transposed in registers --
        if skv is None:  # K^T's strips and the groups of L keys, counted at run time
            keys_pad = t.mul(t.op(f"arith.ceildivui {keys_n}, {t.c(BC)} : index", "i"), t.c(BC))
            strips = t.op(f"arith.divui {keys_pad}, {t.c(sub)} : index", "i")
            n_groups = t.op(f"arith.divui {keys_pad}, {t.c(L)} : index", "i")
            KT, KT_t = alloc((batch, None, d, sub), sizes=[strips])
            VP, VP_t = alloc((batch, dv // GW, None, GW), sizes=[keys_n])
            items = t.mul(t.c(batch), n_groups)
        else:
            skv_pad = -(-skv // BC) * BC
            KT, KT_t = alloc((batch, skv_pad // sub, d, sub))
            VP, VP_t = alloc((batch, dv // GW, skv, GW))
            n_groups, items = t.c(skv_pad // L), t.c(batch * skv_pad // L)
        t.parallel("%bg", t.c(0), items, t.c(1))
        t.line(f"%b = arith.divui %bg, {n_groups} : index")
        j = t.mul(t.op(f"arith.remui %bg, {n_groups} : index", "i"), t.c(L))
        t.open(f"scf.if {t.cmp('sle', t.add(j, t.c(L)), keys_n)}")
        t.for_("%dd", t.c(0), t.c(d), t.c(L))
        rows = [_load_vector(t, K, K_t, ["%b", t.add(j, t.c(i)), "%dd"], k.dtype, L) for i in range(L)]
        strip = t.op(f"arith.divui {j}, {t.c(sub)} : index", "i")
        in_strip = t.op(f"arith.remui {j}, {t.c(sub)} : index", "i")
        for i, row in enumerate(transpose_in_registers(t, rows)):
            t.line(f"vector.store {row}, {KT}[%b, {strip}, {t.add('%dd', t.c(i))}, {in_strip}] : {KT_t}, {vt}")
        t.close()
        t.else_()  # the last keys, and the padding
        t.for_("%jj", j, t.add(j, t.c(L)), t.c(1))
        inside = t.cmp("ult", "%jj", keys_n)
        t.for_("%dd", t.c(0), t.c(d), t.c(1))
        t.open(f"%x = scf.if {inside} -> (f32)")
        t.line(f"scf.yield {t.load_f32(K, K_t, ['%b', '%jj', '%dd'], k.dtype)} : f32")
        t.else_()
        t.line(f"scf.yield {zero} : f32")
        t.close()
        t.line(f"memref.store %x, {KT}[%b, {t.op(f'arith.divui %jj, {t.c(sub)} : index', 'i')}, %dd, "
               f"{t.op(f'arith.remui %jj, {t.c(sub)} : index', 'i')}] : {KT_t}")
        t.close()
        t.close()
        t.close()
        # V in strips of the P V tile's columns
        t.for_("%jv", j, t.min_(t.add(j, t.c(L)), keys_n), t.c(1))
        for g in range(dv // GW):
            for jj in range(gs):
                x = _load_vector(t, V, V_t, ["%b", "%jv", t.c(g * GW + jj * L)], val.dtype, L)
                t.line(f"vector.store {x}, {VP}[%b, {t.c(g)}, %jv, {t.c(jj * L)}] : {VP_t}, {vt}")
        t.close()
        t.close_parallel()

    # --- query blocks in parallel ---------------------------------------------------------------
    n_qblocks = -(-sq // BR)
    # one flat parallel dimension: async-parallel-for specializes code per extra dimension
    t.parallel("%bq", t.c(0), t.c(batch * n_qblocks), t.c(1))
    t.line(f"%b = arith.divui %bq, {t.c(n_qblocks)} : index")
    # A causal block's work grows with its index, and OpenMP's static schedule gives each thread a
    # contiguous run of items: where the threads do not divide the heads, a run splitting a head
    # got its cheap or its costly end. In the order 0, n-1, 1, n-2, ... every pair costs the same.
    # In-process A/B on 2 threads, S 2048 (1024) D64: 1 head 1.44x, 3 heads 1.13x.
    paired = causal and n_qblocks > 1 and batch % max(1, threads)
    t.line(f"{'%qp' if paired else '%qb'} = arith.remui %bq, {t.c(n_qblocks)} : index")
    if paired:
        half = t.op(f"arith.divui %qp, {t.c(2)} : index", "i")
        odd = t.cmp("ne", t.op(f"arith.remui %qp, {t.c(2)} : index", "i"), t.c(0))
        t.line(f"%qb = arith.select {odd}, {t.op(f'arith.subi {t.c(n_qblocks - 1)}, {half} : index', 'i')}, "
               f"{half} : index")
    i0 = t.mul("%qb", t.c(BR))
    (Qs, Qs_t), (P, P_t), (Oacc, Oacc_t), (ML, ML_t) = alloc((BR, d)), alloc((BR, BC)), alloc((BR, dv)), alloc((3, BR))
    scale_v = const(f"dense<{scale!r}> : {vt}")
    # Qs = scale * Q (rows past the end repeat the last row and are not stored); O = 0, m = -inf, l = 0
    t.for_("%r", t.c(0), t.c(BR), t.c(1))
    row = t.min_(t.add(i0, "%r"), t.c(sq - 1))
    t.for_("%dd", t.c(0), t.c(d), t.c(L))
    qv = _load_vector(t, Q, Q_t, ["%b", row, "%dd"], q.dtype, L)
    t.line(f"vector.store {t.op(f'arith.mulf {qv}, {scale_v} : {vt}', 'q')}, {Qs}[%r, %dd] : {Qs_t}, {vt}")
    t.close()
    t.for_("%dd", t.c(0), t.c(dv), t.c(L))
    t.line(f"vector.store {zv}, {Oacc}[%r, %dd] : {Oacc_t}, {vt}")
    t.close()
    t.line(f"memref.store {const('0xFF800000 : f32', 'z')}, {ML}[{t.c(0)}, %r] : {ML_t}")
    t.line(f"memref.store {zero}, {ML}[{t.c(1)}, %r] : {ML_t}")
    t.close()
    kv_end = t.min_(t.add(i0, t.c(BR)), keys_n) if causal else keys_n
    t.for_("%j0", t.c(0), kv_end, t.c(BC))
    # this block's width: the keys left, rounded up to whole QK tiles, at most BC
    left = t.op(f"arith.subi {kv_end}, %j0 : index", "i")
    width = t.min_(t.mul(t.op(f"arith.ceildivui {left}, {t.c(sub)} : index", "i"), t.c(sub)), t.c(BC))

    # S = Qs K^T into the scratch P
    if in_place:  # U keys at a time, read where they lie; keys past the end repeat the last (masked below)
        U = max((u for u in (2, 4, 8) if sub % u == 0 and tile_registers(BR, u) <= registers), default=1)
        t.for_("%c", t.c(0), width, t.c(U))
        last_key = t.op(f"arith.subi {keys_n}, {t.c(1)} : index", "i")
        keys = [t.min_(t.add("%j0", t.add("%c", t.c(u))), last_key) for u in range(U)]
        accs = [[zv] * U for _ in range(BR)]
        for dd in range(0, d, L):
            kvec = [_load_vector(t, K, K_t, ["%b", keys[u], t.c(dd)], k.dtype, L) for u in range(U)]
            for r in range(BR):
                qv = t.op(f"vector.load {Qs}[{t.c(r)}, {t.c(dd)}] : {Qs_t}, {vt}", "q")
                accs[r] = [t.op(f"vector.fma {qv}, {kvec[u]}, {accs[r][u]} : {vt}", "f") for u in range(U)]
        for r in range(BR):
            for u in range(U):
                score = t.op(f"vector.reduction <add>, {accs[r][u]} fastmath<reassoc> : {vt} into f32", "s")
                t.line(f"memref.store {score}, {P}[{t.c(r)}, {t.add('%c', t.c(u))}] : {P_t}")
        t.close()
    else:  # register tiles of QR rows x QV vectors of keys
        t.for_("%r0", t.c(0), t.c(BR), t.c(QR))
        t.for_("%c", t.c(0), width, t.c(sub))
        strip = t.op(f"arith.divui {t.add('%j0', '%c')}, {t.c(sub)} : index", "i")

        def qk_step(dd: str, accs: list[str]) -> list[str]:
            kvec = [t.op(f"vector.load {KT}[%b, {strip}, {dd}, {t.c(j * L)}] : {KT_t}, {vt}", "k") for j in range(QV)]
            new = []
            for r in range(QR):
                qs = t.op(f"memref.load {Qs}[{t.add('%r0', t.c(r))}, {dd}] : {Qs_t}", "q")
                qb = t.op(f"vector.broadcast {qs} : f32 to {vt}", "q")
                new += [t.op(f"vector.fma {qb}, {kvec[j]}, {accs[r * QV + j]} : {vt}", "f") for j in range(QV)]
            return new

        scores = t.reduction(t.c(0), t.c(d), [zv] * (QR * QV), vt, qk_step, unroll=K_UNROLL)
        for r in range(QR):
            for j in range(QV):
                t.line(f"vector.store {scores[r * QV + j]}, {P}[{t.add('%r0', t.c(r))}, {t.add('%c', t.c(j * L))}] "
                       f": {P_t}, {vt}")
        t.close()
        t.close()

    # the online softmax, row by row
    iota = const(f"dense<[{', '.join(str(i) for i in range(L))}]> : {it}")
    # only blocks that reach past the sequence's end (or, causal, past a query row) need the mask
    first_limit = t.min_(t.add(i0, t.c(1)), keys_n) if causal else keys_n
    needs_mask = t.cmp("sgt", t.add("%j0", width), first_limit)
    t.for_("%r", t.c(0), t.c(BR), t.c(1))
    # the mask's row for this query (rows past the end repeat the last, as Qs does)
    mask_row = t.min_(t.add(i0, "%r"), t.c(sq - 1)) if mask is not None and mask.shape[1] > 1 else None

    def max_of_row(masked: bool) -> None:
        """Yield the lane-wise max of the row's scores, the mask operand added to them in P;
        `masked`: keys at or past the limit (the sequence's end, and for causal the keys after
        the query) become -inf in P first."""
        if masked:
            limit = t.min_(t.add(t.add(i0, "%r"), t.c(1)), keys_n) if causal else keys_n
            limit = t.op(f"arith.index_cast {t.op(f'arith.subi {limit}, %j0 : index', 'i')} : index to i32", "i")
            limit_v = t.op(f"vector.broadcast {limit} : i32 to {it}", "i")
        res, (vmax,) = _for_iter(t, "%c", t.c(0), width, t.c(L), [ninf_v], vt)
        sv = t.op(f"vector.load {P}[%r, %c] : {P_t}, {vt}", "s")
        if masked:
            c32 = t.op("arith.index_cast %c : index to i32", "i")
            cols = t.op(f"arith.addi {t.op(f'vector.broadcast {c32} : i32 to {it}', 'i')}, {iota} : {it}", "i")
            keep = t.op(f"arith.cmpi slt, {cols}, {limit_v} : {it}", "p")
        if mask is not None:  # (past the limit its row may end: those lanes are not read)
            at = [t.c(0) if mask.shape[0] == 1 else "%b", t.c(0) if mask.shape[1] == 1 else mask_row, t.add("%j0", "%c")]
            addend = t.op(f"vector.maskedload {M}[{', '.join(at)}], {keep}, {zv} : {M_t}, vector<{L}xi1>, {vt} into {vt}"
                          if masked else f"vector.load {M}[{', '.join(at)}] : {M_t}, {vt}", "s")
            sv = t.op(f"arith.addf {sv}, {addend} : {vt}", "s")
        if masked:
            sv = t.op(f"arith.select {keep}, {sv}, {ninf_v} : vector<{L}xi1>, {vt}", "s")
        if masked or mask is not None:
            t.line(f"vector.store {sv}, {P}[%r, %c] : {P_t}, {vt}")
        _yield(t, [t.op(f"arith.maxnumf {vmax}, {sv} {NNAN} : {vt}", "s")], vt)
        t.line(f"scf.yield {res}#0 : {vt}")

    t.open(f"%vmax = scf.if {needs_mask} -> ({vt})")
    max_of_row(masked=True)
    t.else_()
    max_of_row(masked=False)
    t.close()
    row_max = t.op(f"vector.reduction <maxnumf>, %vmax {NNAN} : {vt} into f32", "r")
    m_old = t.op(f"memref.load {ML}[{t.c(0)}, %r] : {ML_t}", "r")
    m_new = t.op(f"arith.maxnumf {m_old}, {row_max} {NNAN} : f32", "r")
    # a row with every key masked so far subtracts 0 instead of -inf (whose difference is NaN)
    is_ninf = t.op(f"arith.cmpf oeq, {m_new}, {const('0xFF800000 : f32', 'z')} : f32", "p")
    m_use = t.op(f"arith.select {is_ninf}, {zero}, {m_new} : f32", "r")
    diff = t.op(f"vector.broadcast {t.op(f'arith.subf {m_old}, {m_use} : f32', 'r')} : f32 to {vt}", "r")
    alpha = t.op(f"vector.extract {vector_exp(t, diff, vt, it)}[0] : f32 from {vt}", "r")
    mb = t.op(f"vector.broadcast {m_use} : f32 to {vt}", "r")
    res, (vsum,) = _for_iter(t, "%c", t.c(0), width, t.c(L), [zv], vt)
    e = vector_exp(t, t.op(f"arith.subf {t.op(f'vector.load {P}[%r, %c] : {P_t}, {vt}', 's')}, {mb} : {vt}", "s"),
                   vt, it, at_most_zero=True)
    t.line(f"vector.store {e}, {P}[%r, %c] : {P_t}, {vt}")
    _yield(t, [t.op(f"arith.addf {vsum}, {e} : {vt}", "s")], vt)
    total = t.op(f"vector.reduction <add>, {res}#0 fastmath<reassoc> : {vt} into f32", "r")
    l_old = t.op(f"memref.load {ML}[{t.c(1)}, %r] : {ML_t}", "r")
    t.line(f"memref.store {t.op(f'math.fma {l_old}, {alpha}, {total} : f32', 'r')}, {ML}[{t.c(1)}, %r] : {ML_t}")
    t.line(f"memref.store {m_new}, {ML}[{t.c(0)}, %r] : {ML_t}")
    t.line(f"memref.store {alpha}, {ML}[{t.c(2)}, %r] : {ML_t}")
    t.close()

    # O = O * alpha + P V, tiles of PR rows x a group of O's vectors; P is 0 past the keys that exist
    keys_here = t.min_(left, width)
    for g0 in range(0, dv // L, gs):
        t.for_("%r0", t.c(0), t.c(BR), t.c(PR))
        rows = [t.add("%r0", t.c(r)) for r in range(PR)]
        inits = []
        for r in range(PR):
            ab = t.op(f"vector.broadcast {t.op(f'memref.load {ML}[{t.c(2)}, {rows[r]}] : {ML_t}', 'o')} "
                      f": f32 to {vt}", "o")
            inits += [t.op(f"arith.mulf {t.op(f'vector.load {Oacc}[{rows[r]}, {t.c((g0 + j) * L)}] : {Oacc_t}, {vt}', 'o')}"
                           f", {ab} : {vt}", "o") for j in range(gs)]

        def pv_step(jj: str, accs: list[str]) -> list[str]:
            key = t.add("%j0", jj)
            vrow = [_load_vector(t, V, V_t, ["%b", key, t.c((g0 + j) * L)], val.dtype, L) if in_place else
                    t.op(f"vector.load {VP}[%b, {t.c(g0 // gs)}, {key}, {t.c(j * L)}] : {VP_t}, {vt}", "v")
                    for j in range(gs)]
            new = []
            for r in range(PR):
                pb = t.op(f"vector.broadcast {t.op(f'memref.load {P}[{rows[r]}, {jj}] : {P_t}', 'p')} : f32 to {vt}", "p")
                new += [t.op(f"vector.fma {pb}, {vrow[j]}, {accs[r * gs + j]} : {vt}", "o") for j in range(gs)]
            return new

        outs = t.reduction(t.c(0), keys_here, inits, vt, pv_step, unroll=K_UNROLL)
        for r in range(PR):
            for j in range(gs):
                t.line(f"vector.store {outs[r * gs + j]}, {Oacc}[{rows[r]}, {t.c((g0 + j) * L)}] : {Oacc_t}, {vt}")
        t.close()
    t.close()  # key blocks

    # out = O / l, rows inside the sequence only
    ovt = f"vector<{L}x{out.dtype}>"
    rows_here = t.min_(t.op(f"arith.subi {t.c(sq)}, {i0} : index", "i"), t.c(BR))
    t.for_("%r", t.c(0), rows_here, t.c(1))
    l_final = t.op(f"memref.load {ML}[{t.c(1)}, %r] : {ML_t}", "r")
    one = const("1.0 : f32", "z")
    # l = 0: every score of the row was -inf; its output is 0 (torch's safe softmax), not 0/0
    inv = t.op(f"arith.select {t.op(f'arith.cmpf ogt, {l_final}, {zero} : f32', 'p')}, "
               f"{t.op(f'arith.divf {one}, {l_final} : f32', 'r')}, {zero} : f32", "r")
    inv = t.op(f"vector.broadcast {inv} : f32 to {vt}", "r")
    t.for_("%dd", t.c(0), t.c(dv), t.c(L))
    o = t.op(f"arith.mulf {t.op(f'vector.load {Oacc}[%r, %dd] : {Oacc_t}, {vt}', 'o')}, {inv} : {vt}", "o")
    if out.dtype != "f32":
        o = t.op(f"arith.truncf {o} : {vt} to {ovt}", "o")
    t.line(f"vector.store {o}, {O}[%b, {t.add(i0, '%r')}, %dd] : {O_t}, {ovt}")
    t.close()
    t.close()
    t.close_parallel()
    params = ", ".join(f"%arg{i}: {spec}" for i, spec in enumerate((q, k, val, mask) if mask else (q, k, val)))
    return t.function_text(name, params, O_full, out, location)


def _load_vector(t: LoopText, mem: str, mem_t: str, idx: list[str], dtype: str, lanes: int) -> str:
    x = t.op(f"vector.load {mem}[{', '.join(idx)}] : {mem_t}, vector<{lanes}x{dtype}>", "x")
    return x if dtype == "f32" else t.op(f"arith.extf {x} : vector<{lanes}x{dtype}> to vector<{lanes}xf32>", "x")
