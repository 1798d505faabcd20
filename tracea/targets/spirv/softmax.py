"""Softmax along the last axis as a gpu-dialect kernel for the Vulkan, Metal and ROCm targets: one
workgroup per row. Its invocations stride over the row for the maximum, reduce it in shared memory (a tree of
halvings), then the same for the sum of exp(x - max), then write exp(x - max) / sum; exp is
Cephes' polynomial (codegen/kernel_text.py, ~1 ulp: Vulkan's own exp may be off by 3 + 2|x| ulps).
A row of -inf only is NaN, as in torch."""
from __future__ import annotations

import math

from ...codegen.kernel_text import vector_exp
from ...codegen.loop_text import LoopText, memref_text
from ...dialects.ops import OpView
from ..nvvm.mma import gpu_module_text
from ..nvvm.simt import shared_buffer, spirv_entry_point, workgroup_space

MAX_WORKGROUP = 256


def workgroup_size(columns: int) -> int:
    """A power of two (the reduction halves it), no larger than the row needs, 32 at least."""
    return min(MAX_WORKGROUP, max(32, 1 << math.ceil(math.log2(max(columns, 1)))))


def softmax_module_text(v: OpView, name: str, spirv: bool = True) -> tuple[str, tuple[int, int, int],
                                                                           tuple[int, int, int]]:
    """(gpu.module text, grid, workgroup) of the softmax along the last axis of `v`'s input
    (`spirv`: for MLIR's SPIR-V conversion, else for the ROCDL / NVVM ones)."""
    x = v.operands["input"]
    columns = x.shape[-1]
    rows = math.prod(x.shape[:-1])
    size = workgroup_size(columns)
    X_t, Y_t = memref_text(x.shape, x.dtype), memref_text(v.result.shape, v.result.dtype)
    M_t, My_t = memref_text((rows, columns), x.dtype), memref_text((rows, columns), v.result.dtype)
    R_t = f"memref<{size}xf32, {workgroup_space(spirv)}>"
    t = LoopText()
    t.depth = 3

    def as_matrix(mem: str, mem_t: str, rank: int, matrix_t: str) -> str:
        if rank == 1:
            return t.op(f"memref.expand_shape {mem} [[0, 1]] output_shape [1, {columns}] : {mem_t} into {matrix_t}", "m")
        if rank == 2:
            return mem
        groups = "[" + ", ".join(map(str, range(rank - 1))) + f"], [{rank - 1}]"
        return t.op(f"memref.collapse_shape {mem} [{groups}] : {mem_t} into {matrix_t}", "m")

    red = shared_buffer(t, spirv, "%red", R_t)
    X = as_matrix("%X", X_t, x.rank, M_t)
    Y = as_matrix("%Y", Y_t, x.rank, My_t)
    t.line("%row = gpu.block_id x")
    t.line("%tid = gpu.thread_id x")

    def load(col: str) -> str:
        value = t.op(f"memref.load {X}[%row, {col}] : {M_t}", "x")
        return value if x.dtype == "f32" else t.op(f"arith.extf {value} : {x.dtype} to f32", "x")

    def over_row(start: str, combine) -> str:
        """combine(acc, column) over this invocation's columns, from `start`."""
        acc = t.fresh("acc")
        t.open(f"{acc} = scf.for %c = %tid to {t.c(columns)} step {t.c(size)} iter_args(%a = {start}) -> (f32)")
        t.line(f"scf.yield {combine('%a', '%c')} : f32")
        t.close()
        return acc

    def reduce(value: str, op: str) -> str:
        """The workgroup's `op` of every invocation's value (all of them read it)."""
        t.line(f"memref.store {value}, {red}[%tid] : {R_t}")
        t.line("gpu.barrier")
        half = size // 2
        while half:
            t.open(f"scf.if {t.cmp('ult', '%tid', t.c(half))}")
            other = t.op(f"memref.load {red}[{t.add('%tid', t.c(half))}] : {R_t}", "o")
            mine = t.op(f"memref.load {red}[%tid] : {R_t}", "o")
            t.line(f"memref.store {t.op(f'{op} {mine}, {other} : f32', 'o')}, {red}[%tid] : {R_t}")
            t.close()
            t.line("gpu.barrier")
            half //= 2
        total = t.op(f"memref.load {red}[{t.c(0)}] : {R_t}", "t")
        t.line("gpu.barrier")  # the buffer is reused by the next reduction
        return total

    def shifted_exp(col: str, high: str) -> str:
        return vector_exp(t, t.op(f"arith.subf {load(col)}, {high} : f32", "d"), "f32", "i32", at_most_zero=True)

    lowest = t.op("arith.constant 0xFF800000 : f32", "k")
    high = reduce(over_row(lowest, lambda a, c: t.op(f"arith.maximumf {a}, {load(c)} : f32", "m")), "arith.maximumf")
    zero = t.op("arith.constant 0.0 : f32", "k")
    total = reduce(over_row(zero, lambda a, c: t.op(f"arith.addf {a}, {shifted_exp(c, high)} : f32", "s")),
                   "arith.addf")
    t.for_("%c", "%tid", t.c(columns), t.c(size))
    y = t.op(f"arith.divf {shifted_exp('%c', high)}, {total} : f32", "y")
    if v.result.dtype != "f32":
        y = t.op(f"arith.truncf {y} : f32 to {v.result.dtype}", "y")
    t.line(f"memref.store {y}, {Y}[%row, %c] : {My_t}")
    t.close()
    text = gpu_module_text(t, name, [f"%X: {X_t}", f"%Y: {Y_t}"], (size, 1), "" if spirv else f"{red}: {R_t}",
                           spirv_entry_point((size, 1, 1)) if spirv else "")
    return text, (rows, 1, 1), (size, 1, 1)
