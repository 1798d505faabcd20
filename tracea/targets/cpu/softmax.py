"""The CPU softmax kernel (along the last axis): rows in parallel. A row that stays in L2 takes
three passes, one exp per element: its max, then exp(x - max) written out and summed, then the
written row scaled by 1 / sum. A longer row takes two, reading the input twice instead of the
output: one keeps a lane-wise running max and rescaled sum of exponentials, the next writes
exp(x - max) / sum (three exps per element). The tail of a row goes through masked transfers
(padding -inf contributes exp = 0)."""
from __future__ import annotations

from ...dialects.ops import OpView
from ...codegen.loop_text import LoopText, memref_text
from ...codegen.kernel_text import vector_exp

# The running max starts at the most negative finite f32, not -inf: a lane that only ever sees
# padding then rescales by exp(0) instead of exp(-inf - -inf) = NaN.
LOWEST = "-3.40282347E+38"
# Rows up to this many elements are written out and read back from L2 (f32 output: rounding the
# exponentials to a 16-bit output before scaling them would round twice)
ROW_IN_CACHE = 32768


def softmax_kernel_text(name: str, v: OpView, lanes: int, location: str, threads: int = 1) -> str:
    x = v.operands["input"]
    out = v.result
    n = x.shape[-1]
    rows = 1
    for d in x.shape[:-1]:
        rows *= d
    L = lanes
    vt, it = f"vector<{L}xf32>", f"vector<{L}xi32>"
    xvt, ovt = f"vector<{L}x{x.dtype}>", f"vector<{L}x{out.dtype}>"
    t = LoopText(serial=threads == 1)

    def flat(arg, spec, alloc):
        mem_t = memref_text(spec.shape, spec.dtype)
        mem = (t.op(f"memref.alloc() {{alignment = 64 : i64}} : {mem_t}", "m") if alloc else
               t.op(f"bufferization.to_buffer {arg} read_only : {spec} to {mem_t}", "m"))
        flat_t = memref_text((rows, n), spec.dtype)
        if spec.rank == 2:
            return mem, mem, flat_t
        if spec.rank == 1:
            return mem, t.op(f"memref.expand_shape {mem} [[0, 1]] output_shape [1, {n}] : {mem_t} into {flat_t}", "m"), flat_t
        groups = "[" + ", ".join(str(i) for i in range(spec.rank - 1)) + f"], [{spec.rank - 1}]"
        return mem, t.op(f"memref.collapse_shape {mem} [{groups}] : {mem_t} into {flat_t}", "m"), flat_t

    _, X, X_t = flat("%arg0", x, False)
    O_full, O, O_t = flat(None, out, True)
    n_vec = n // L * L
    lowest = t.op(f"arith.constant dense<{LOWEST}> : {vt}", "k")
    zv = t.op(f"arith.constant dense<0.0> : {vt}", "k")
    pad = t.op(f"arith.constant 0xFF800000 : {x.dtype}" if x.dtype == "f32" else
               f"arith.constant {'0xFC00' if x.dtype == 'f16' else '0xFF80'} : {x.dtype}", "k")

    def load(col: str, masked: bool) -> str:
        if masked:
            value = t.op(f"vector.transfer_read {X}[%row, {col}], {pad} : {X_t}, {xvt}", "x")
        else:
            value = t.op(f"vector.load {X}[%row, {col}] : {X_t}, {xvt}", "x")
        return value if x.dtype == "f32" else t.op(f"arith.extf {value} : {xvt} to {vt}", "x")

    def step(m: str, s: str, value: str) -> tuple[str, str]:
        m_new = t.op(f"arith.maximumf {m}, {value} : {vt}", "m")
        rescale = vector_exp(t, t.op(f"arith.subf {m}, {m_new} : {vt}", "d"), vt, it)
        e = vector_exp(t, t.op(f"arith.subf {value}, {m_new} : {vt}", "d"), vt, it)
        return m_new, t.op(f"math.fma {s}, {rescale}, {e} : {vt}", "s")

    t.parallel("%row", t.c(0), t.c(rows), t.c(1))
    if out.dtype == "f32" and n <= ROW_IN_CACHE:
        _three_passes(t, n, n_vec, L, vt, it, load, lowest, zv, O, O_t)
        t.close_parallel()
        return t.function_text(name, f"%arg0: {x}", O_full, out, location)
    acc = t.fresh("acc")
    t.open(f"{acc}:2 = scf.for %j = {t.c(0)} to {t.c(n_vec)} step {t.c(L)} iter_args(%mv = {lowest}, %sv = {zv}) "
           f"-> ({vt}, {vt})")
    m_new, s_new = step("%mv", "%sv", load("%j", False))
    t.line(f"scf.yield {m_new}, {s_new} : {vt}, {vt}")
    t.close()
    m, s = f"{acc}#0", f"{acc}#1"
    if n_vec < n:
        m, s = step(m, s, load(t.c(n_vec), True))
    row_max = t.op(f"vector.reduction <maximumf>, {m} : {vt} into f32", "r")
    mb = t.op(f"vector.broadcast {row_max} : f32 to {vt}", "r")
    lane_scale = vector_exp(t, t.op(f"arith.subf {m}, {mb} : {vt}", "d"), vt, it)
    total = t.op(f"vector.reduction <add>, {t.op(f'arith.mulf {s}, {lane_scale} : {vt}', 's')} : {vt} into f32", "r")
    one = t.op("arith.constant 1.0 : f32", "k")
    inv = t.op(f"vector.broadcast {t.op(f'arith.divf {one}, {total} : f32', 'r')} : f32 to {vt}", "r")

    def normalized(col: str, masked: bool) -> str:
        y = t.op(f"arith.mulf {vector_exp(t, t.op(f'arith.subf {load(col, masked)}, {mb} : {vt}', 'd'), vt, it)}, "
                 f"{inv} : {vt}", "y")
        return y if out.dtype == "f32" else t.op(f"arith.truncf {y} : {vt} to {ovt}", "y")

    t.for_("%j", t.c(0), t.c(n_vec), t.c(L))
    t.line(f"vector.store {normalized('%j', False)}, {O}[%row, %j] : {O_t}, {ovt}")
    t.close()
    if n_vec < n:
        t.line(f"vector.transfer_write {normalized(t.c(n_vec), True)}, {O}[%row, {t.c(n_vec)}] : {ovt}, {O_t}")
    t.close_parallel()
    return t.function_text(name, f"%arg0: {x}", O_full, out, location)


def _three_passes(t: LoopText, n: int, n_vec: int, L: int, vt: str, it: str, load, lowest: str, zv: str,
                  O: str, O_t: str) -> None:
    """One row: its max, exp(x - max) stored and summed, the stored row times 1 / sum."""
    acc = t.fresh("max")
    t.open(f"{acc} = scf.for %j = {t.c(0)} to {t.c(n_vec)} step {t.c(L)} iter_args(%mv = {lowest}) -> ({vt})")
    value = load("%j", False)
    t.line(f"scf.yield {t.op(f'arith.maximumf %mv, {value} : {vt}', 'm')} : {vt}")
    t.close()
    m = acc
    if n_vec < n:
        m = t.op(f"arith.maximumf {m}, {load(t.c(n_vec), True)} : {vt}", "m")
    mb = t.op(f"vector.broadcast {t.op(f'vector.reduction <maximumf>, {m} : {vt} into f32', 'r')} : f32 to {vt}", "r")

    def exp_shifted(col: str, masked: bool) -> str:  # x - max <= 0: padding's -inf gives 0
        return vector_exp(t, t.op(f"arith.subf {load(col, masked)}, {mb} : {vt}", "d"), vt, it, at_most_zero=True)

    acc = t.fresh("sum")
    t.open(f"{acc} = scf.for %j = {t.c(0)} to {t.c(n_vec)} step {t.c(L)} iter_args(%sv = {zv}) -> ({vt})")
    e = exp_shifted("%j", False)
    t.line(f"vector.store {e}, {O}[%row, %j] : {O_t}, {vt}")
    t.line(f"scf.yield {t.op(f'arith.addf %sv, {e} : {vt}', 's')} : {vt}")
    t.close()
    s = acc
    if n_vec < n:
        e = exp_shifted(t.c(n_vec), True)
        t.line(f"vector.transfer_write {e}, {O}[%row, {t.c(n_vec)}] : {vt}, {O_t}")
        s = t.op(f"arith.addf {s}, {e} : {vt}", "s")
    total = t.op(f"vector.reduction <add>, {s} fastmath<reassoc> : {vt} into f32", "r")
    one = t.op("arith.constant 1.0 : f32", "k")
    inv = t.op(f"vector.broadcast {t.op(f'arith.divf {one}, {total} : f32', 'r')} : f32 to {vt}", "r")
    t.for_("%j", t.c(0), t.c(n_vec), t.c(L))
    y = t.op(f"vector.load {O}[%row, %j] : {O_t}, {vt}", "y")
    t.line(f"vector.store {t.op(f'arith.mulf {y}, {inv} : {vt}', 'y')}, {O}[%row, %j] : {O_t}, {vt}")
    t.close()
    if n_vec < n:
        pad = t.op("arith.constant 0.0 : f32", "k")
        tail = t.op(f"vector.transfer_read {O}[%row, {t.c(n_vec)}], {pad} : {O_t}, {vt}", "y")
        t.line(f"vector.transfer_write {t.op(f'arith.mulf {tail}, {inv} : {vt}', 'y')}, {O}[%row, {t.c(n_vec)}] "
               f": {vt}, {O_t}")
