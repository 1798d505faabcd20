"""tracea-spirv-kernels: each function computing one gemm / fused_gemm / NHWC conv2d / attention /
softmax becomes a Vulkan compute kernel (a gpu.func that MLIR's SPIR-V conversion takes), chosen
by the Doctor from the device's properties.

f32 GEMMs run the SIMT kernel the NVIDIA target also has (targets/nvvm/simt.py: plain gpu
dialect, shared-memory tiles of A and B, a 4 x 4 register tile per invocation, the fused
epilogue), its shared tiles written as allocations in address space 3 (workgroup attributions
abort this MLIR's conversion) and its workgroup size as the entry point's.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import mlir.ir as ir

from ...codegen.gpu_kernels import functions_to_kernels
from ...codegen.variants import BackendIs, DtypeIn, Problem, Rule, SharedMemoryAtLeast, Variant, register_variant
from ...dialects.schedule import Schedule
from ...doctor.capabilities import Capabilities, named
from ...errors import OpError
from ...passes.registry import PassFailed, TraceaPass, option, register
from ..nvvm.kernels import Launch, simt_conv, simt_gemm
from ..nvvm.simt import SimtTiles
from .attention import QUERIES, SHARED_BYTES, attention_module_text
from .bf16 import bf16_as_i16
from .cooperative import cooperative_gemm_module_text
from .softmax import MAX_WORKGROUP, softmax_module_text
from ...tuner.space import SearchSpace

KERNEL_OPS = ("tracea.gemm", "tracea.fused_gemm", "tracea.conv2d", "tracea.attention", "tracea.softmax")


def _launched(text: str, grid: tuple[int, int, int], workgroup: tuple[int, int, int]) -> tuple[str, Launch]:
    return text, Launch(grid, workgroup, 0)


_TILES = SimtTiles()
GEMM_SHARED_BYTES = 4 * _TILES.block_k * (_TILES.block_m + _TILES.block_n)
EMITTERS = {}


# f16 and bf16 operands (read as f32, accumulated in f32) where the device has 16-bit storage
# buffers; bf16 ones stored as their bits (bf16.py), f16 ones as f16, not both in one kernel
F16_STORAGE = Rule("f32, or f16 or bf16 on a device with 16-bit storage buffers, f16 arithmetic and 16-bit integers",
                   lambda p, caps: p.dtype == "f32" or p.dtype in ("f16", "bf16") and caps.gpu is not None
                   and caps.gpu.f16_storage and all(d in (p.dtype, "f32") for d in (p.dtypes or ())))


# -- the SIMT kernels' schedule: tile = [BM, BN, BK] (a workgroup's tile of C and the K step
# of its shared tiles), warp_tile = [TM, TN, 1] (each invocation's register tile) ---------------

def simt_tiles(s: Schedule | None) -> SimtTiles:
    if s is None or s.tile is None:
        return _TILES
    if len(s.tile) != 3 or s.warp_tile is None or len(s.warp_tile) != 3 or s.warp_tile[2] != 1:
        raise OpError(f"a SIMT GEMM schedule is tile = [BM, BN, BK] and warp_tile = [TM, TN, 1] (each invocation's "
                      f"TM x TN results); got tile {list(s.tile)}, warp_tile {list(s.warp_tile or ())}")
    return SimtTiles(s.tile[0], s.tile[1], s.tile[2], s.warp_tile[0], s.warp_tile[1])


def _simt_default(p: Problem, caps: Capabilities, threads: int | None) -> Schedule:
    if p.schedule is not None and p.schedule.tile is not None:
        return p.schedule
    t = _TILES
    return replace(p.schedule or Schedule(), tile=(t.block_m, t.block_n, t.block_k),
                   warp_tile=(t.thread_m, t.thread_n, 1))


def _simt_space(p: Problem, caps: Capabilities) -> SearchSpace:
    """Workgroup tiles of 32 to 128 square-ish, K steps of 8 to 32, register tiles of 2 to 8 a
    side; what the device cannot hold is pruned by _check_simt."""
    return (SearchSpace().tile_m([32, 64, 128]).tile_n([32, 64, 128]).tile_k([8, 16, 32])
            .warp_m([2, 4, 8]).warp_n([2, 4, 8]).warp_k([1]))


MAX_RESULTS_PER_INVOCATION = 64  # TM x TN accumulators in registers (more spill on every GPU)


def _check_simt(p: Problem, caps: Capabilities, s: Schedule) -> None:
    t, gpu = simt_tiles(s), caps.gpu
    try:
        t.validate(gpu.threads_per_block if gpu is not None else 1024)
    except ValueError as e:
        raise OpError(f"{e}{f' on {gpu.name}' if gpu is not None else ''}") from None
    x, y = t.threads
    shared = 4 * t.block_k * (t.block_m + t.block_n)
    if gpu is not None and shared > gpu.shared_bytes_per_block:
        raise OpError(f"shared tiles of {shared} bytes (4 x BK x (BM + BN)); {gpu.name} has "
                      f"{gpu.shared_bytes_per_block}")
    if gpu is not None and x * y < gpu.warp_size:
        raise OpError(f"{x * y} invocations per workgroup, fewer than a subgroup ({gpu.warp_size})")
    if t.thread_m * t.thread_n > MAX_RESULTS_PER_INVOCATION:
        raise OpError(f"a {t.thread_m} x {t.thread_n} register tile per invocation; at most "
                      f"{MAX_RESULTS_PER_INVOCATION} results")


SIMT_SCHEDULE = dict(default_schedule=_simt_default, search_space=_simt_space, check_schedule=_check_simt)


def register_simt_variants(backend: str, dtypes, spirv: bool) -> dict:
    """The SIMT kernels as `backend`'s variants (their inputs held to `dtypes`; `spirv`: written for
    MLIR's SPIR-V conversion, as Vulkan and Metal take them, else for ROCDL): {variant id: emitter}."""
    on = BackendIs(backend)
    emitters = {}
    for variant_, emitter in (
        (Variant(f"{backend}.gemm.simt", backend, ("gemm", "fused_gemm"), (
            on, dtypes, SharedMemoryAtLeast(GEMM_SHARED_BYTES)), 10,
            "SIMT: shared-memory tiles of A and B, a register tile per invocation (default 4 x 4), fused epilogue "
            "(f32 accumulation)", frozenset({"simd"}), **SIMT_SCHEDULE),
         lambda v, name, spirv: simt_gemm(v, name, spirv, simt_tiles(v.attrs.get("schedule")))),
        (Variant(f"{backend}.conv2d.implicit_gemm", backend, ("conv2d",), (
            on, dtypes, SharedMemoryAtLeast(GEMM_SHARED_BYTES),
            Rule("layout='nhwc' (filter HWCF; transpose an NCHW input to NHWC first)",
                 lambda p, caps: None if p.layout is None else p.layout == "nhwc"),
            Rule("groups=1", lambda p, caps: None if p.groups is None else p.groups == 1)), 10,
            "the SIMT GEMM with its A tiles gathered from the NHWC image (implicit GEMM), bias and activation in the epilogue",
            frozenset({"simd"}), **SIMT_SCHEDULE),
         lambda v, name, spirv: simt_conv(v, name, spirv, simt_tiles(v.attrs.get("schedule")))),
        (Variant(f"{backend}.attention.flash_simt", backend, ("attention",), (
            on, dtypes, SharedMemoryAtLeast(SHARED_BYTES)), 10,
            f"flash attention: a workgroup per {QUERIES} queries, key and value blocks in shared memory, online "
            "softmax per invocation", frozenset({"simd"})),
         lambda v, name, spirv: _launched(*attention_module_text(v, name, spirv))),
        (Variant(f"{backend}.softmax.workgroup_row", backend, ("softmax",), (
            on, dtypes, SharedMemoryAtLeast(4 * MAX_WORKGROUP),
            Rule("along the last axis", lambda p, caps: p.last_axis)), 10,
            "a workgroup per row: max, then sum of exp, reduced in shared memory; one read of the row each",
            frozenset({"simd"})), lambda v, name, spirv: _launched(*softmax_module_text(v, name, spirv))),
    ):
        register_variant(variant_)
        emitters[variant_.id] = lambda v, name, caps=None, emit=emitter: emit(v, name, spirv)
    return emitters


def _bf16_buffers(emit):
    """The emitter, its kernel's bf16 buffers made i16 ones (bf16.py) when the op has any."""
    def emitter(v, name, caps=None):
        text, launch = emit(v, name, caps)
        specs = [*v.operands.values(), v.result]
        return (bf16_as_i16(text) if any(s.dtype == "bf16" for s in specs) else text), launch
    return emitter


EMITTERS.update({id_: _bf16_buffers(emit) for id_, emit in register_simt_variants("vulkan", F16_STORAGE,
                                                                                  spirv=True).items()})
EMITTERS.update(register_simt_variants("metal", DtypeIn(("f32",)), spirv=True))
def _whole_tiles(p, caps) -> bool | None:
    tile = caps.gpu.matrix_tile
    return None if None in (p.m, p.n, p.k, p.transpose_a, p.batched_b) else (
        p.m % tile == 0 and p.n % tile == 0 and p.k % tile == 0 and not p.transpose_a and not p.batched_b
        and p.batch in (None, 1))


def _register_matrix_gemm(backend: str, units: str, needs: str, description: str) -> None:
    """The f16 GEMM on a subgroup's matrix tiles (cooperative.py): Vulkan's cooperative matrices,
    and through SPIRV-Cross, Metal's simdgroup matrices (8 x 8)."""
    variant_ = Variant(f"{backend}.gemm.{units}", backend, ("gemm",), (
        BackendIs(backend), Rule(needs, lambda p, caps: caps.gpu is not None and caps.gpu.matrix_units == units
                                 and caps.gpu.matrix_tile > 0),
        DtypeIn(("f16",)), Rule("an f32 result (out_dtype='f32')", lambda p, caps: p.out_dtype == "f32"),
        Rule("M, N and K multiples of the device's matrix tile, A not transposed, one matrix each (no batch)",
             _whole_tiles)), 20, description, frozenset({"matrix_units"}))
    register_variant(variant_)
    EMITTERS[variant_.id] = lambda v, name, caps: _launched(
        *cooperative_gemm_module_text(v, name, caps.gpu.warp_size, caps.gpu.matrix_tile))


_register_matrix_gemm("vulkan", "cooperative_matrix", "a device with VK_KHR_cooperative_matrix (f16 x f16 -> f32 "
                      "square tiles)", "cooperative matrices: a subgroup per tile of C (the device's square f16 "
                      "tile, 16 x 16 on GPUs), products accumulated in f32")
_register_matrix_gemm("metal", "simdgroup_matrix", "simdgroup matrices and MSL 3.1 (the metal3-apple profile)",
                      "simdgroup matrices: a simdgroup per 8 x 8 tile of C (simdgroup_multiply_accumulate), f16 "
                      "products accumulated in f32")


def device_capabilities(device: str) -> Capabilities:
    """A Vulkan device of this machine ("vulkan:N") or a named Vulkan or Metal profile
    ("vulkan-lavapipe", "metal-apple")."""
    if device.startswith("vulkan:"):
        from ...doctor.engine import device_here
        return device_here(device)
    caps = named(device)
    if caps.backend not in ("vulkan", "metal"):
        raise ValueError(f"{device!r} is a {caps.backend} profile, not a Vulkan or Metal device")
    return caps


@register
@dataclass(frozen=True)
class SpirvKernelsPass(TraceaPass):
    NAME = "tracea-spirv-kernels"
    SUMMARY = ("make each function's gemm / fused_gemm / conv2d / attention / softmax a Vulkan or Metal compute "
               "kernel (a gpu.module kernel for MLIR's SPIR-V conversion) with its launch configuration")
    device: str = option("vulkan-lavapipe", "the device: vulkan:N (this machine's) or a Vulkan or Metal profile")

    def run(self, module: ir.Operation) -> None:
        try:
            caps = device_capabilities(self.device)
        except ValueError as e:
            raise PassFailed(str(e)) from None
        functions_to_kernels(module, caps, KERNEL_OPS, caps.backend.capitalize(), EMITTERS, self.NAME)
