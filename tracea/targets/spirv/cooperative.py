"""A GEMM on Vulkan cooperative matrices (VK_KHR_cooperative_matrix: f16 T x T x T tiles
accumulated in f32, T the square size the device lists for that: 16 on GPUs, 8 on lavapipe), as
gpu.subgroup_mma ops that MLIR's SPIR-V conversion makes OpCooperativeMatrix*KHR: a workgroup is
one subgroup and computes one T x T tile of C, loading its A and B tiles straight from the
storage buffers. Chosen by the Doctor only on devices that report the extension and the tile
(Debian 12's lavapipe has no extension: it would accept such a shader and return garbage)."""
from __future__ import annotations

from ...codegen.loop_text import LoopText, memref_text
from ...dialects.ops import OpView
from ..nvvm.mma import gpu_module_text
from ..nvvm.simt import spirv_entry_point

def cooperative_gemm_module_text(v: OpView, name: str, subgroup: int, tile: int) -> tuple[str, tuple[int, int, int],
                                                                                           tuple[int, int, int]]:
    """(gpu.module text, grid, workgroup) of C[M, N] (f32) = A[M, K] B (f16; B [K, N] or, with
    transpose_b, [N, K]) in `tile`-square tiles, every dim a multiple of it."""
    a, b = v.operands["a"], v.operands["b"]
    (m, k), transpose_b = a.shape, v.attrs["transpose_b"]
    n = b.shape[0] if transpose_b else b.shape[1]
    A_t, B_t, C_t = memref_text(a.shape, a.dtype), memref_text(b.shape, b.dtype), memref_text((m, n), "f32")
    a_m, b_m, c_m = (f'!gpu.mma_matrix<{tile}x{tile}x{a.dtype}, "AOp">', f'!gpu.mma_matrix<{tile}x{tile}x{b.dtype}, "BOp">',
                     f'!gpu.mma_matrix<{tile}x{tile}xf32, "COp">')
    t = LoopText()
    t.depth = 3
    row = t.mul(t.op("gpu.block_id y", "b"), t.c(tile))
    col = t.mul(t.op("gpu.block_id x", "b"), t.c(tile))
    # The zero accumulator is loaded from a zeroed workgroup tile, not made by
    # subgroup_mma_constant_matrix: SPIRV-Cross writes Metal's simdgroup matrices only for
    # cooperative-matrix loads, stores and multiply-adds (its OpCompositeConstruct throws)
    Z_t = f"memref<{tile}x{tile}xf32, 3>"
    zeros = t.op(f"memref.alloc() : {Z_t}", "z")
    lane = t.op("gpu.thread_id x", "l")
    zero = t.op("arith.constant 0.0 : f32", "k")
    t.for_("%e", lane, t.c(tile * tile), t.c(subgroup))
    t.line(f"memref.store {zero}, {zeros}[{t.op(f'arith.divui %e, {t.c(tile)} : index', 'i')}, "
           f"{t.op(f'arith.remui %e, {t.c(tile)} : index', 'i')}] : {Z_t}")
    t.close()
    t.line("gpu.barrier")
    start = t.op(f"gpu.subgroup_mma_load_matrix {zeros}[{t.c(0)}, {t.c(0)}] {{leadDimension = {tile} : index}} "
                 f": {Z_t} -> {c_m}", "c")
    t.open(f"%acc = scf.for %k0 = {t.c(0)} to {t.c(k)} step {t.c(tile)} iter_args(%c = {start}) -> ({c_m})")
    at = t.op(f"gpu.subgroup_mma_load_matrix %A[{row}, %k0] {{leadDimension = {k} : index}} : {A_t} -> {a_m}", "a")
    if transpose_b:  # B [N, K] read column-major as the [K, N] operand
        bt = t.op(f"gpu.subgroup_mma_load_matrix %B[{col}, %k0] {{leadDimension = {k} : index, transpose}} "
                  f": {B_t} -> {b_m}", "b")
    else:
        bt = t.op(f"gpu.subgroup_mma_load_matrix %B[%k0, {col}] {{leadDimension = {n} : index}} : {B_t} -> {b_m}", "b")
    t.line(f"scf.yield {t.op(f'gpu.subgroup_mma_compute {at}, {bt}, %c : {a_m}, {b_m} -> {c_m}', 'd')} : {c_m}")
    t.close()
    t.line(f"gpu.subgroup_mma_store_matrix %acc, %C[{row}, {col}] {{leadDimension = {n} : index}} : {c_m}, {C_t}")
    text = gpu_module_text(t, name, [f"%A: {A_t}", f"%B: {B_t}", f"%C: {C_t}"], (subgroup, 1),
                           attributes=spirv_entry_point((subgroup, 1, 1)))
    return text, (n // tile, m // tile, 1), (subgroup, 1, 1)
