"""Flash attention as a SIMT gpu-dialect kernel for the Vulkan, Metal and ROCm targets (f32): a workgroup per
(batch x head, block of BQ queries), an invocation per query. Blocks of BKV keys and their values
are copied by the whole workgroup into shared memory; each invocation runs the online softmax
over them (running max m, sum l, output row o in private memory, rescaled as m grows), its query
scaled once. Causal (top-left aligned, as torch SDPA) skips the key blocks past the block's last
query and masks key j > query i; a query with no key left gets 0 (torch's safe softmax).
"""
from __future__ import annotations

from ...codegen.kernel_text import vector_exp
from ...codegen.loop_text import LoopText, memref_text
from ...dialects.ops import AttentionDef, OpView
from ..nvvm.mma import gpu_module_text
from ..nvvm.simt import shared_buffer, spirv_entry_point, workgroup_space

QUERIES = 64  # a workgroup's queries (and invocations)
SHARED_BYTES = 16 * 1024  # the key and value blocks' shared memory


def key_block(head_dim: int, value_head_dim: int) -> int:
    """Keys per block: a power of two (at most 32) whose keys and values fit SHARED_BYTES."""
    keys = 32
    while keys > 1 and keys * (head_dim + value_head_dim) * 4 > SHARED_BYTES:
        keys //= 2
    return keys


def stacked(t: LoopText, mem: str, spec, bh: int, rows: int, cols: int) -> tuple[str, str]:
    """The [..., rows, cols] parameter `mem` as [bh, rows, cols], and that type."""
    mem_t, stack_t = memref_text(spec.shape, spec.dtype), memref_text((bh, rows, cols), spec.dtype)
    if spec.rank == 2:
        return t.op(f"memref.expand_shape {mem} [[0, 1], [2]] output_shape [1, {rows}, {cols}] : {mem_t} "
                    f"into {stack_t}", "m"), stack_t
    if spec.rank == 3:
        return mem, stack_t
    groups = "[" + ", ".join(map(str, range(spec.rank - 2))) + f"], [{spec.rank - 2}], [{spec.rank - 1}]"
    return t.op(f"memref.collapse_shape {mem} [{groups}] : {mem_t} into {stack_t}", "m"), stack_t


def attention_module_text(v: OpView, name: str, spirv: bool = True) -> tuple[str, tuple[int, int, int],
                                                                             tuple[int, int, int]]:
    """(gpu.module text, grid, workgroup) of `v`'s attention (`spirv`: for MLIR's SPIR-V
    conversion, else for the ROCDL / NVVM ones)."""
    q, k, val = v.operands["query"], v.operands["key"], v.operands["value"]
    sq, d = q.shape[-2:]
    sk, dv = val.shape[-2:]
    lead = q.shape[:-2]
    bh = 1
    for x in lead:
        bh *= x
    causal, scale = v.attrs["causal"], AttentionDef.scale(v.attrs, d)
    BKV = key_block(d, dv)
    t = LoopText()
    t.depth = 3

    def as_stack(mem: str, spec, rows: int, cols: int) -> tuple[str, str]:
        return stacked(t, mem, spec, bh, rows, cols)

    ws = workgroup_space(spirv)
    Ks_t, Vs_t = f"memref<{BKV}x{d}xf32, {ws}>", f"memref<{BKV}x{dv}xf32, {ws}>"
    Ks, Vs = shared_buffer(t, spirv, "%Ks", Ks_t), shared_buffer(t, spirv, "%Vs", Vs_t)
    # an invocation's own arrays: SPIR-V's Function storage (6), the GPU's private memory
    private = "6" if spirv else "#gpu.address_space<private>"
    qv_t, ov_t = f"memref<{d}xf32, {private}>", f"memref<{dv}xf32, {private}>"
    qv, ov = t.op(f"memref.alloca() : {qv_t}", "p"), t.op(f"memref.alloca() : {ov_t}", "p")
    Q, Q_t = as_stack("%Q", q, sq, d)
    K, K_t = as_stack("%K", k, sk, d)
    V, V_t = as_stack("%V", val, sk, dv)
    O, O_t = as_stack("%O", v.result, sq, dv)
    t.line("%qb = gpu.block_id x")
    t.line("%bh = gpu.block_id y")
    t.line("%tid = gpu.thread_id x")
    zero = t.op("arith.constant 0.0 : f32", "k")
    first = t.mul("%qb", t.c(QUERIES))
    qi = t.add(first, "%tid")
    valid = t.cmp("ult", qi, t.c(sq))
    row = t.op(f"arith.minui {qi}, {t.c(sq - 1)} : index", "i")  # loads of an idle invocation stay inside
    scale_c = t.op(f"arith.constant {float(scale)!r} : f32", "k")

    t.for_("%d", t.c(0), t.c(d), t.c(1))
    scaled = t.op(f"arith.mulf {t.load_f32(Q, Q_t, ['%bh', row, '%d'], q.dtype)}, {scale_c} : f32", "q")
    t.line(f"memref.store {scaled}, {qv}[%d] : {qv_t}")
    t.close()
    t.for_("%d", t.c(0), t.c(dv), t.c(1))
    t.line(f"memref.store {zero}, {ov}[%d] : {ov_t}")
    t.close()

    keys = t.c(sk)
    if causal:  # no key past the block's last query
        keys = t.op(f"arith.minui {t.add(first, t.c(QUERIES))}, {t.c(sk)} : index", "i")
    lowest = t.op("arith.constant 0xFF800000 : f32", "k")
    t.open(f"%ml:2 = scf.for %kb = {t.c(0)} to {keys} step {t.c(BKV)} iter_args(%m = {lowest}, %l = {zero}) "
           "-> (f32, f32)")

    def copy(dst: str, dst_t: str, src: str, src_t: str, width: int, dtype: str) -> None:
        t.for_("%e", "%tid", t.c(BKV * width), t.c(QUERIES))
        j = t.op(f"arith.divui %e, {t.c(width)} : index", "i")
        col = t.op(f"arith.remui %e, {t.c(width)} : index", "i")
        key = t.add("%kb", j)
        value = t.load_f32_if(t.cmp("ult", key, t.c(sk)), src, src_t, ["%bh", key, col], dtype, zero)
        t.line(f"memref.store {value}, {dst}[{j}, {col}] : {dst_t}")
        t.close()

    copy(Ks, Ks_t, K, K_t, d, k.dtype)
    copy(Vs, Vs_t, V, V_t, dv, val.dtype)
    t.line("gpu.barrier")
    t.open(f"%ml2:2 = scf.for %j = {t.c(0)} to {t.c(BKV)} step {t.c(1)} iter_args(%m1 = %m, %l1 = %l) -> (f32, f32)")
    key = t.add("%kb", "%j")
    ok = t.op(f"arith.andi {valid}, {t.cmp('ult', key, t.c(sk))} : i1", "p")
    if causal:
        ok = t.op(f"arith.andi {ok}, {t.cmp('ule', key, qi)} : i1", "p")
    t.open(f"%upd:2 = scf.if {ok} -> (f32, f32)")
    t.open(f"%s = scf.for %d = {t.c(0)} to {t.c(d)} step {t.c(1)} iter_args(%acc = {zero}) -> (f32)")
    qd = t.op(f"memref.load {qv}[%d] : {qv_t}", "q")
    kd = t.op(f"memref.load {Ks}[%j, %d] : {Ks_t}", "k")
    t.line(f"scf.yield {t.op(f'math.fma {qd}, {kd}, %acc : f32', 'f')} : f32")
    t.close()
    high = t.op("arith.maximumf %m1, %s : f32", "m")
    corr = vector_exp(t, t.op(f"arith.subf %m1, {high} : f32", "e"), "f32", "i32", at_most_zero=True)
    p = vector_exp(t, t.op(f"arith.subf %s, {high} : f32", "e"), "f32", "i32", at_most_zero=True)
    t.for_("%d", t.c(0), t.c(dv), t.c(1))
    o = t.op(f"arith.mulf {t.op(f'memref.load {ov}[%d] : {ov_t}', 'o')}, {corr} : f32", "o")
    o = t.op(f"math.fma {p}, {t.op(f'memref.load {Vs}[%j, %d] : {Vs_t}', 'v')}, {o} : f32", "o")
    t.line(f"memref.store {o}, {ov}[%d] : {ov_t}")
    t.close()
    t.line(f"scf.yield {high}, {t.op(f'math.fma %l1, {corr}, {p} : f32', 'l')} : f32, f32")
    t.else_()
    t.line("scf.yield %m1, %l1 : f32, f32")
    t.close()
    t.line("scf.yield %upd#0, %upd#1 : f32, f32")
    t.close()
    t.line("gpu.barrier")  # the blocks are rewritten next
    t.line("scf.yield %ml2#0, %ml2#1 : f32, f32")
    t.close()

    t.open(f"scf.if {valid}")
    some = t.op(f"arith.cmpf ogt, %ml#1, {zero} : f32", "p")
    one = t.op("arith.constant 1.0 : f32", "k")
    inverse = t.op(f"arith.select {some}, {t.op(f'arith.divf {one}, %ml#1 : f32', 'r')}, {zero} : f32", "r")
    t.for_("%d", t.c(0), t.c(dv), t.c(1))
    y = t.op(f"arith.mulf {t.op(f'memref.load {ov}[%d] : {ov_t}', 'o')}, {inverse} : f32", "y")
    if v.result.dtype != "f32":
        y = t.op(f"arith.truncf {y} : f32 to {v.result.dtype}", "y")
    t.line(f"memref.store {y}, {O}[%bh, {qi}, %d] : {O_t}")
    t.close()
    t.close()
    params = [f"%Q: {memref_text(q.shape, q.dtype)}", f"%K: {memref_text(k.shape, k.dtype)}",
              f"%V: {memref_text(val.shape, val.dtype)}", f"%O: {memref_text(v.result.shape, v.result.dtype)}"]
    text = gpu_module_text(t, name, params, (QUERIES, 1), "" if spirv else f"%Ks: {Ks_t}, %Vs: {Vs_t}",
                           spirv_entry_point((QUERIES, 1, 1)) if spirv else "")
    return text, (-(-sq // QUERIES), bh, 1), (QUERIES, 1, 1)
