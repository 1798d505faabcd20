"""Flash attention on AMD matrix cores: f16 / bf16 Q, K, V, S = Q K^T and O += P V on MFMA
32x32x8 (CDNA, wave64) or WMMA 16x16x16 (RDNA3, wave32), f32 accumulation and softmax.

    workgroup (bx, by): batch x head `by`, 4 waves of IM queries each (IM: the instruction's rows)
    a wave's Q fragments are read once from global memory into registers (A operands, k = d)
    per block of IN keys (all the workgroup's waves in step; causal: up to its last query):
        S = Q K^T           the K fragments (B operands: K is [keys, d], d contiguous) from global
        S *= scale; keys past the sequence (causal: past the query) -> -inf
        row max across the lanes holding a row (xor shuffles within the IN lanes of a row), new
        running max m; P = exp(S - m); each lane's share of the row sum l, and O, rescaled
        P -> f16 into the wave's LDS tile, read back as A fragments (rows = queries, k = keys):
        the accumulator layout is not the operand layout
        O += P V            V's fragments (B operands, k = keys) element by element from global
    l summed across the row's lanes; O / l (0 where l = 0: torch's safe softmax) stored

The accumulators' layout (matrix.MatrixInstruction.result_position) puts row r of a tile in the
same lane group for S and for O, so m, l and the rescaling live beside the accumulators.
"""
from __future__ import annotations

from ...codegen.kernel_text import vector_exp
from ...codegen.loop_text import LoopText, memref_text
from ...dialects.ops import AttentionDef, OpView
from ...errors import OpError
from ..nvvm.mma import gpu_module_text
from ..spirv.attention import stacked
from .matrix import MATRIX_DTYPES, WORKGROUP, MatrixInstruction

WAVES = 4
NEG_INF = "0xFF800000"


def check_matrix_attention(v: OpView, ins: MatrixInstruction) -> None:
    q, val = v.operands["query"], v.operands["value"]
    d, dv = q.shape[-1], val.shape[-1]
    if q.dtype not in MATRIX_DTYPES or len({v.operands[n].dtype for n in ("query", "key", "value")}) > 1:
        raise OpError(f"the AMD matrix-core attention takes f16 or bf16 Q, K and V of one type, got {q.dtype}")
    if not head_dims_fit(d, dv, ins):
        raise OpError(f"the AMD matrix-core attention needs a head dim that is a multiple of {ins.ik} and a value head "
                      f"dim that is a multiple of {ins.in_}; got {d} and {dv}")


def head_dims_fit(d: int, dv: int, ins: MatrixInstruction) -> bool:
    """Q K^T runs whole instructions along d (ins.ik each), P V whole tiles along dv (ins.in_)."""
    return d % ins.ik == 0 and dv % ins.in_ == 0


def matrix_attention_module_text(v: OpView, ins: MatrixInstruction, name: str) -> tuple[str, tuple, tuple]:
    """(gpu.module text, grid, workgroup) of `v`'s attention on `ins`."""
    check_matrix_attention(v, ins)
    q, k, val, out = v.operands["query"], v.operands["key"], v.operands["value"], v.result
    sq, d = q.shape[-2:]
    sk, dv = val.shape[-2:]
    bh = 1
    for x in q.shape[:-2]:
        bh *= x
    causal, scale = v.attrs["causal"], AttentionDef.scale(v.attrs, d)
    dt, W, IM, IN = q.dtype, ins.wave, ins.im, ins.in_
    ACC = ins.accumulators
    acc_t, frag_t = f"vector<{ACC}xf32>", f"vector<{ins.operand_elements}x{dt}>"
    E = ins.operand_elements  # operand elements per lane
    BQ = WAVES * IM
    Ps_t = f"memref<{WAVES}x{IM}x{IN}x{dt}, {WORKGROUP}>"
    t = LoopText()
    t.depth = 3
    Q, Q_t = stacked(t, "%Q", q, bh, sq, d)
    K, K_t = stacked(t, "%K", k, bh, sk, d)
    V, V_t = stacked(t, "%V", val, bh, sk, dv)
    O, O_t = stacked(t, "%O", out, bh, sq, dv)
    t.line("%tid = gpu.thread_id x")
    t.line("%qb = gpu.block_id x")
    t.line("%bh = gpu.block_id y")
    wave = t.op(f"arith.divui %tid, {t.c(W)} : index", "i")
    lane = t.op(f"arith.remui %tid, {t.c(W)} : index", "i")
    q0 = t.add(t.mul("%qb", t.c(BQ)), t.mul(wave, t.c(IM)))
    zero, one = t.op("arith.constant 0.0 : f32", "k"), t.op("arith.constant 1.0 : f32", "k")
    ninf = t.op(f"arith.constant {NEG_INF} : f32", "k")
    zero_frag = t.op(f"arith.constant dense<0.0> : {frag_t}", "z")
    zero_elem = t.op(f"arith.constant 0.0 : {dt}", "z")
    zero_acc = t.op(f"arith.constant dense<0.0> : {acc_t}", "z")
    ninf_acc = t.op(f"arith.constant dense<{NEG_INF}> : {acc_t}", "z")
    scale_c = t.op(f"arith.constant {float(scale)!r} : f32", "k")
    width = t.op(f"arith.constant {W} : i32", "k")  # gpu.shuffle's: the whole wave
    row_lane = t.op(f"arith.remui {lane}, {t.c(IM)} : index", "i")  # the operand row (query or key) of this lane
    # this lane's first k within an instruction's: MFMA lane group l / IM takes E of each ik, WMMA lanes all
    lane_k = t.mul(t.op(f"arith.divui {lane}, {t.c(IM)} : index", "i"), t.c(E)) if ins.units == "mfma" else t.c(0)

    def operand(mem: str, mem_t: str, row: str, rows: int, k0: int) -> str:
        """An A / B operand whose k runs along a row of `mem` ([bh, rows, k]): E elements of row
        `row` from k0 (+ E x the lane group on MFMA); zeros past the rows."""
        col = t.add(t.c(k0), lane_k)
        return t.guarded(t.cmp("ult", row, t.c(rows)), frag_t,
                         lambda: t.op(f"vector.load {mem}[%bh, {row}, {col}] : {mem_t}, {frag_t}", "v"), zero_frag)

    q_frags = [operand(Q, Q_t, t.add(q0, row_lane), sq, s * ins.ik) for s in range(d // ins.ik)]
    Ps = "%Ps"
    o_tiles = dv // IN
    keys = t.c(sk)
    if causal:  # no key past the workgroup's last query
        keys = t.op(f"arith.minui {t.add(t.mul('%qb', t.c(BQ)), t.c(BQ))}, {t.c(sk)} : index", "i")
    carried = [f"%o{j}" for j in range(o_tiles)] + ["%m", "%l"]
    inits = [zero_acc] * o_tiles + [ninf_acc, zero_acc]
    t.open(f"%res:{len(carried)} = scf.for %kb = {t.c(0)} to {keys} step {t.c(IN)} iter_args("
           + ", ".join(f"{c} = {i}" for c, i in zip(carried, inits)) + f") -> ({', '.join([acc_t] * len(carried))})")
    # S = Q K^T
    s_acc = zero_acc
    for s in range(d // ins.ik):
        kf = operand(K, K_t, t.add("%kb", row_lane), sk, s * ins.ik)
        s_acc = t.op(ins.text(q_frags[s], kf, s_acc, dt), "s")
    col = t.add("%kb", t.op(f"arith.remui {lane}, {t.c(IN)} : index", "i"))  # this lane's key
    key_ok = t.cmp("ult", col, t.c(sk))
    m_old, l_old = "%m", "%l"
    m_new, alpha, p_vals, l_new = [], [], [], []
    for item in range(ACC):
        r_in, _ = ins.result_position(t.c(item), lane, t)
        query = t.add(q0, r_in)
        x = t.op(f"arith.mulf {t.op(f'vector.extract {s_acc}[{item}] : f32 from {acc_t}', 's')}, {scale_c} : f32", "s")
        ok = key_ok if not causal else t.op(f"arith.andi {key_ok}, {t.cmp('ule', col, query)} : i1", "p")
        x = t.op(f"arith.select {ok}, {x}, {ninf} : f32", "s")
        mx = x
        offset = IN // 2
        while offset:  # the row's max over the IN lanes that hold it
            partner = t.fresh("sh")
            t.line(f"{partner}, {t.fresh('ok')} = gpu.shuffle xor {mx}, {t.op(f'arith.constant {offset} : i32', 'k')}, "
                   f"{width} : f32")
            mx = t.op(f"arith.maximumf {mx}, {partner} : f32", "m")
            offset //= 2
        old = t.op(f"vector.extract {m_old}[{item}] : f32 from {acc_t}", "m")
        new = t.op(f"arith.maximumf {old}, {mx} : f32", "m")
        # a row with every key masked so far subtracts 0, not -inf (whose difference is NaN)
        use = t.op(f"arith.select {t.op(f'arith.cmpf oeq, {new}, {ninf} : f32', 'p')}, {zero}, {new} : f32", "m")
        a = vector_exp(t, t.op(f"arith.subf {old}, {use} : f32", "e"), "f32", "i32", at_most_zero=True)
        p = vector_exp(t, t.op(f"arith.subf {x}, {use} : f32", "e"), "f32", "i32", at_most_zero=True)
        l_part = t.op(f"math.fma {t.op(f'vector.extract {l_old}[{item}] : f32 from {acc_t}', 'l')}, {a}, {p} : f32", "l")
        m_new.append(new), alpha.append(a), p_vals.append(p), l_new.append(l_part)
        # P into the wave's LDS tile, at (query row, key column) of the instruction tile
        r_tile, c_tile = ins.result_position(t.c(item), lane, t)
        t.line(f"memref.store {t.op(f'arith.truncf {p} : f32 to {dt}', 'p')}, {Ps}[{wave}, {r_tile}, {c_tile}] : {Ps_t}")

    def pack(values: list[str]) -> str:
        vec = zero_acc
        for item, x in enumerate(values):
            vec = t.op(f"vector.insert {x}, {vec} [{item}] : f32 into {acc_t}", "v")
        return vec
    alpha_v = pack(alpha)
    t.line("gpu.barrier")
    # P as A operands: rows = queries, k = keys of this block
    p_frags = []
    for s in range(IN // ins.ik):
        c0 = t.add(t.c(s * ins.ik), lane_k)
        p_frags.append(t.op(f"vector.load {Ps}[{wave}, {row_lane}, {c0}] : {Ps_t}, {frag_t}", "p"))
    new_o = []
    for j in range(o_tiles):
        acc = t.op(f"arith.mulf %o{j}, {alpha_v} : {acc_t}", "o")
        for s in range(IN // ins.ik):
            # V's operand: k = keys (E of them from this lane's first), n = the lane's value column
            first = t.add(t.add("%kb", t.c(s * ins.ik)), lane_k)
            vcol = t.add(t.c(j * IN), t.op(f"arith.remui {lane}, {t.c(IN)} : index", "i"))
            vf = zero_frag
            for e in range(E):
                key = t.add(first, t.c(e))
                x = t.guarded(t.cmp("ult", key, t.c(sk)), dt, lambda: t.op(f"memref.load {V}[%bh, {key}, {vcol}] : {V_t}", "v"),
                              zero_elem)
                vf = t.op(f"vector.insert {x}, {vf} [{e}] : {dt} into {frag_t}", "v")
            acc = t.op(ins.text(p_frags[s], vf, acc, dt), "o")
        new_o.append(acc)
    t.line("gpu.barrier")  # the P tiles are rewritten next
    t.line(f"scf.yield {', '.join(new_o + [pack(m_new), pack(l_new)])} : {', '.join([acc_t] * len(carried))}")
    t.close()

    # l: each lane held its keys' share of the row's sum
    for item in range(ACC):
        total = t.op(f"vector.extract %res#{o_tiles + 1}[{item}] : f32 from {acc_t}", "l")
        offset = IN // 2
        while offset:
            partner = t.fresh("sh")
            t.line(f"{partner}, {t.fresh('ok')} = gpu.shuffle xor {total}, {t.op(f'arith.constant {offset} : i32', 'k')}, "
                   f"{width} : f32")
            total = t.op(f"arith.addf {total}, {partner} : f32", "l")
            offset //= 2
        inverse = t.op(f"arith.select {t.op(f'arith.cmpf ogt, {total}, {zero} : f32', 'p')}, "
                       f"{t.op(f'arith.divf {one}, {total} : f32', 'r')}, {zero} : f32", "r")
        r_in, c_in = ins.result_position(t.c(item), lane, t)
        query = t.add(q0, r_in)
        t.open(f"scf.if {t.cmp('ult', query, t.c(sq))}")
        for j in range(o_tiles):
            y = t.op(f"arith.mulf {t.op(f'vector.extract %res#{j}[{item}] : f32 from {acc_t}', 'y')}, {inverse} : f32", "y")
            if out.dtype != "f32":
                y = t.op(f"arith.truncf {y} : f32 to {out.dtype}", "y")
            t.line(f"memref.store {y}, {O}[%bh, {query}, {t.add(t.c(j * IN), c_in)}] : {O_t}")
        t.close()
    params = [f"%Q: {memref_text(q.shape, q.dtype)}", f"%K: {memref_text(k.shape, k.dtype)}",
              f"%V: {memref_text(val.shape, val.dtype)}", f"%O: {memref_text(out.shape, out.dtype)}"]
    threads = WAVES * W
    return (gpu_module_text(t, name, params, (threads, 1), f"%Ps: {Ps_t}"), (-(-sq // BQ), bh, 1), (threads, 1, 1))
