"""The CPU attention kernel: flash-style, the S x S score matrix never exists.

    K^T (and V, in f32) are first copied per head, padded with zeros to whole key blocks.
    for each (batch-head, block of BR queries), in parallel:
        m = -inf, l = 0, O = 0                        (per query row)
        for each block of BC keys (causal: only blocks at or before the diagonal):
            S = scale * Q K^T  on BR x BC/lanes vector registers, masked to -inf outside
            m' = max(m, rowmax S);  P = exp(S - m');  l = l * exp(m - m') + rowsum P
            O = O * exp(m - m') + P V
        out = O / l

Exponentials use `vector_exp` (kernel_text.py), a polynomial in arith ops, so they stay vectors.
"""
from __future__ import annotations

from ..dialects.ops import AttentionDef, OpView
from .cpu_gemm import _memref, _Text
from .kernel_text import vector_exp

def supports(v: OpView, lanes: int) -> bool:
    q, val = v.operands["query"], v.operands["value"]
    return q.shape[-1] % lanes == 0 and val.shape[-1] % lanes == 0


def attention_kernel_text(name: str, v: OpView, location: str) -> str:
    q, k, val = (v.operands[n] for n in ("query", "key", "value"))
    out = v.result
    s = v.attrs["schedule"]
    L = s.lane_map.shape[-1]
    BR, BC = s.tile[:2]  # queries per block, keys per block
    nv_s = BC // L
    batch = 1
    for d in q.shape[:-2]:
        batch *= d
    sq, d = q.shape[-2:]
    skv, dv = val.shape[-2:]
    skv_pad = -(-skv // BC) * BC
    nv_o = dv // L
    scale = AttentionDef.scale(v.attrs, d)
    causal = v.attrs["causal"]
    vt, it = f"vector<{L}xf32>", f"vector<{L}xi32>"
    t = _Text()

    Q, Q_t = t.batched_view(t.to_buffer("%arg0", q), q, batch)
    K, K_t = t.batched_view(t.to_buffer("%arg1", k), k, batch)
    V, V_t = t.batched_view(t.to_buffer("%arg2", val), val, batch)
    O_full_t = _memref(out.shape, out.dtype)
    O_full = t.op(f"memref.alloc() {{alignment = 64 : i64}} : {O_full_t}", "m")
    O, O_t = t.batched_view(O_full, out, batch)

    # --- K^T and V in f32, zero-padded to whole key blocks ----------------------------------
    KT_t, Vf_t = _memref((batch, d, skv_pad), "f32"), _memref((batch, skv_pad, dv), "f32")
    KT = t.op(f"memref.alloc() {{alignment = 64 : i64}} : {KT_t}", "m")
    Vf = t.op(f"memref.alloc() {{alignment = 64 : i64}} : {Vf_t}", "m")
    zero = t.op("arith.constant 0.0 : f32", "z")
    t.parallel("%b", t.c(0), t.c(batch), t.c(1))
    t.for_("%j", t.c(0), t.c(skv_pad), t.c(1))
    inside = t.cmp("ult", "%j", t.c(skv))
    t.open(f"scf.if {inside}")
    t.for_("%dd", t.c(0), t.c(d), t.c(1))
    t.line(f"memref.store {t.load_f32(K, K_t, ['%b', '%j', '%dd'], k.dtype)}, {KT}[%b, %dd, %j] : {KT_t}")
    t.close()
    t.for_("%dd", t.c(0), t.c(dv), t.c(1))
    t.line(f"memref.store {t.load_f32(V, V_t, ['%b', '%j', '%dd'], val.dtype)}, {Vf}[%b, %j, %dd] : {Vf_t}")
    t.close()
    t.else_()
    t.for_("%dd", t.c(0), t.c(d), t.c(1))
    t.line(f"memref.store {zero}, {KT}[%b, %dd, %j] : {KT_t}")
    t.close()
    t.for_("%dd", t.c(0), t.c(dv), t.c(1))
    t.line(f"memref.store {zero}, {Vf}[%b, %j, %dd] : {Vf_t}")
    t.close()
    t.close()
    t.close()
    t.close_parallel()

    # --- query blocks in parallel ---------------------------------------------------------------
    n_qblocks = -(-sq // BR)
    # one flat parallel dimension: async-parallel-for specializes code per extra dimension
    t.parallel("%bq", t.c(0), t.c(batch * n_qblocks), t.c(1))
    t.line(f"%b = arith.divui %bq, {t.c(n_qblocks)} : index")
    t.line(f"%qb = arith.remui %bq, {t.c(n_qblocks)} : index")
    i0 = t.mul("%qb", t.c(BR))
    P_t, Oacc_t = _memref((BR, BC), "f32"), _memref((BR, dv), "f32")
    P = t.op(f"memref.alloc() {{alignment = 64 : i64}} : {P_t}", "m")
    Oacc = t.op(f"memref.alloc() {{alignment = 64 : i64}} : {Oacc_t}", "m")
    zv = t.op(f"arith.constant dense<0.0> : {vt}", "z")
    for r in range(BR):
        for j in range(nv_o):
            t.line(f"vector.store {zv}, {Oacc}[{t.c(r)}, {t.c(j * L)}] : {Oacc_t}, {vt}")
    # query rows past the end compute on the last row and are not stored
    rows = [t.min_(t.add(i0, t.c(r)), t.c(sq - 1)) for r in range(BR)]
    if causal:  # keys up to the block's last query
        kv_end = t.min_(t.add(i0, t.c(BR)), t.c(skv))
    else:
        kv_end = t.c(skv)
    neg_inf = t.op("arith.constant 0xFF800000 : f32", "z")
    one = t.op("arith.constant 1.0 : f32", "z")
    # running max and sum per query row, in a small buffer so the softmax can loop over rows
    ML_t = _memref((2, BR), "f32")
    ML = t.op(f"memref.alloc() {{alignment = 64 : i64}} : {ML_t}", "m")
    for r in range(BR):
        t.line(f"memref.store {neg_inf}, {ML}[{t.c(0)}, {t.c(r)}] : {ML_t}")
        t.line(f"memref.store {zero}, {ML}[{t.c(1)}, {t.c(r)}] : {ML_t}")
    t.for_("%j0", t.c(0), kv_end, t.c(BC))
    # S = Q K^T
    accs = [f"%s{r}_{j}" for r in range(BR) for j in range(nv_s)]
    res = t.fresh("S")
    t.open(f"{res}:{len(accs)} = scf.for %dd = {t.c(0)} to {t.c(d)} step {t.c(1)} "
           f"iter_args({', '.join(f'{x} = {zv}' for x in accs)}) -> ({', '.join([vt] * len(accs))})")
    kvec = [t.op(f"vector.load {KT}[%b, %dd, {t.add('%j0', t.c(j * L))}] : {KT_t}, {vt}", "k") for j in range(nv_s)]
    new = []
    for r in range(BR):
        qs = t.op(f"vector.broadcast {t.load_f32(Q, Q_t, ['%b', rows[r], '%dd'], q.dtype)} : f32 to {vt}", "q")
        for j in range(nv_s):
            new.append(t.op(f"vector.fma {qs}, {kvec[j]}, {accs[r * nv_s + j]} : {vt}", "f"))
    t.line(f"scf.yield {', '.join(new)} : {', '.join([vt] * len(new))}")
    t.close()
    # the score tile to the scratch, then the online softmax row by row (one copy of its code)
    for r in range(BR):
        for j in range(nv_s):
            t.line(f"vector.store {res}#{r * nv_s + j}, {P}[{t.c(r)}, {t.c(j * L)}] : {P_t}, {vt}")
    iota = t.op(f"arith.constant dense<[{', '.join(str(i) for i in range(L))}]> : {it}", "k")
    scale_v = t.op(f"arith.constant dense<{scale!r}> : {vt}", "k")
    ninf_v = t.op(f"arith.constant dense<0xFF800000> : {vt}", "k")
    j0_i32 = t.op("arith.index_cast %j0 : index to i32", "i")
    limit_kv = t.op(f"vector.broadcast {t.op(f'arith.constant {skv} : i32', 'i')} : i32 to {it}", "k")
    t.for_("%r", t.c(0), t.c(BR), t.c(1))
    row_i32 = t.op(f"arith.index_cast {t.add(i0, '%r')} : index to i32", "i")
    ps = []
    for j in range(nv_s):
        sc = t.op(f"arith.mulf {t.op(f'vector.load {P}[%r, {t.c(j * L)}] : {P_t}, {vt}', 's')}, {scale_v} : {vt}", "s")
        base = t.op(f"arith.addi {j0_i32}, {t.op(f'arith.constant {j * L} : i32', 'i')} : i32", "i")
        cols = t.op(f"arith.addi {t.op(f'vector.broadcast {base} : i32 to {it}', 'i')}, {iota} : {it}", "i")
        masked = t.op(f"arith.cmpi sge, {cols}, {limit_kv} : {it}", "p")
        if causal:  # key j is visible to query i when j <= i
            later = t.op(f"arith.cmpi sgt, {cols}, {t.op(f'vector.broadcast {row_i32} : i32 to {it}', 'i')} : {it}", "p")
            masked = t.op(f"arith.ori {masked}, {later} : vector<{L}xi1>", "p")
        ps.append(t.op(f"arith.select {masked}, {ninf_v}, {sc} : vector<{L}xi1>, {vt}", "s"))
    row_max = t.op(f"vector.reduction <maximumf>, {ps[0]} : {vt} into f32", "r")
    for p_ in ps[1:]:
        row_max = t.op(f"arith.maximumf {row_max}, {t.op(f'vector.reduction <maximumf>, {p_} : {vt} into f32', 'r')} : f32", "r")
    m_old = t.op(f"memref.load {ML}[{t.c(0)}, %r] : {ML_t}", "r")
    m_new = t.op(f"arith.maximumf {m_old}, {row_max} : f32", "r")
    # alpha = exp(m_old - m_new); m_old = -inf on the first block gives 0
    diff = t.op(f"vector.broadcast {t.op(f'arith.subf {m_old}, {m_new} : f32', 'r')} : f32 to {vt}", "r")
    alpha = t.op(f"vector.extract {vector_exp(t, diff, vt, it)}[0] : f32 from {vt}", "r")
    mb = t.op(f"vector.broadcast {m_new} : f32 to {vt}", "r")
    total = zero
    for j, p_ in enumerate(ps):
        e = vector_exp(t, t.op(f"arith.subf {p_}, {mb} : {vt}", "s"), vt, it)
        t.line(f"vector.store {e}, {P}[%r, {t.c(j * L)}] : {P_t}, {vt}")
        total = t.op(f"arith.addf {total}, {t.op(f'vector.reduction <add>, {e} : {vt} into f32', 'r')} : f32", "r")
    l_old = t.op(f"memref.load {ML}[{t.c(1)}, %r] : {ML_t}", "r")
    t.line(f"memref.store {t.op(f'math.fma {l_old}, {alpha}, {total} : f32', 'r')}, {ML}[{t.c(1)}, %r] : {ML_t}")
    t.line(f"memref.store {m_new}, {ML}[{t.c(0)}, %r] : {ML_t}")
    # O[r] = O[r] * alpha + P[r] V
    ab = t.op(f"vector.broadcast {alpha} : f32 to {vt}", "r")
    o_init = [t.op(f"arith.mulf {t.op(f'vector.load {Oacc}[%r, {t.c(j * L)}] : {Oacc_t}, {vt}', 'o')}, {ab} : {vt}", "o")
              for j in range(nv_o)]
    o_names = [f"%o{j}" for j in range(nv_o)]
    o_res = t.fresh("O")
    t.open(f"{o_res}:{nv_o} = scf.for %jj = {t.c(0)} to {t.c(BC)} step {t.c(1)} "
           f"iter_args({', '.join(f'{n} = {i}' for n, i in zip(o_names, o_init))}) -> ({', '.join([vt] * nv_o)})")
    pb = t.op(f"vector.broadcast {t.op(f'memref.load {P}[%r, %jj] : {P_t}', 'p')} : f32 to {vt}", "p")
    vrow = t.add("%j0", "%jj")
    upd = [t.op(f"vector.fma {pb}, {t.op(f'vector.load {Vf}[%b, {vrow}, {t.c(j * L)}] : {Vf_t}, {vt}', 'v')}, "
                f"{o_names[j]} : {vt}", "o") for j in range(nv_o)]
    t.line(f"scf.yield {', '.join(upd)} : {', '.join([vt] * nv_o)}")
    t.close()
    for j in range(nv_o):
        t.line(f"vector.store {o_res}#{j}, {Oacc}[%r, {t.c(j * L)}] : {Oacc_t}, {vt}")
    t.close()  # rows
    t.close()  # key blocks
    # out = O / l, rows inside the sequence only
    ovt = f"vector<{L}x{out.dtype}>"
    rows_here = t.min_(t.op(f"arith.subi {t.c(sq)}, {i0} : index", "i"), t.c(BR))
    t.for_("%r", t.c(0), rows_here, t.c(1))
    l_final = t.op(f"memref.load {ML}[{t.c(1)}, %r] : {ML_t}", "r")
    inv = t.op(f"vector.broadcast {t.op(f'arith.divf {one}, {l_final} : f32', 'r')} : f32 to {vt}", "r")
    for j in range(nv_o):
        o = t.op(f"arith.mulf {t.op(f'vector.load {Oacc}[%r, {t.c(j * L)}] : {Oacc_t}, {vt}', 'o')}, {inv} : {vt}", "o")
        if out.dtype != "f32":
            o = t.op(f"arith.truncf {o} : {vt} to {ovt}", "o")
        t.line(f"vector.store {o}, {O}[%b, {t.add(i0, '%r')}, {t.c(j * L)}] : {O_t}, {ovt}")
    t.close()
    t.close_parallel()
    params = ", ".join(f"%arg{i}: {spec}" for i, spec in enumerate((q, k, val)))
    return t.function_text(name, params, O_full, out, location)
