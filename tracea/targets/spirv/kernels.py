"""tracea-spirv-kernels: each function computing one gemm / fused_gemm / NHWC conv2d / attention /
softmax becomes a Vulkan compute kernel (a gpu.func that MLIR's SPIR-V conversion takes), chosen
by the Doctor from the device's properties.

f32 GEMMs run the SIMT kernel the NVIDIA target also has (targets/nvvm/simt.py: plain gpu
dialect, shared-memory tiles of A and B, a 4 x 4 register tile per invocation, the fused
epilogue), its shared tiles written as allocations in address space 3 (workgroup attributions
abort this MLIR's conversion) and its workgroup size as the entry point's.
"""
from __future__ import annotations

from dataclasses import dataclass

import mlir.ir as ir

from ...codegen.gpu_kernels import functions_to_kernels
from ...codegen.variants import BackendIs, DtypeIn, Rule, SharedMemoryAtLeast, Variant, register_variant
from ...doctor.capabilities import Capabilities, named
from ...passes.registry import PassFailed, TraceaPass, option, register
from ..nvvm.kernels import Launch, simt_conv, simt_gemm
from ..nvvm.simt import SimtTiles
from .attention import QUERIES, SHARED_BYTES, attention_module_text
from .cooperative import TILE, cooperative_gemm_module_text
from .softmax import MAX_WORKGROUP, softmax_module_text

KERNEL_OPS = ("tracea.gemm", "tracea.fused_gemm", "tracea.conv2d", "tracea.attention", "tracea.softmax")


def _launched(text: str, grid: tuple[int, int, int], workgroup: tuple[int, int, int]) -> tuple[str, Launch]:
    return text, Launch(grid, workgroup, 0)


_TILES = SimtTiles()
GEMM_SHARED_BYTES = 4 * _TILES.block_k * (_TILES.block_m + _TILES.block_n)
EMITTERS = {}


# f16 operands (read as f32, accumulated in f32) where the device has 16-bit storage buffers
F16_STORAGE = Rule("f32, or f16 on a device with 16-bit storage buffers and f16 arithmetic",
                   lambda p, caps: p.dtype == "f32" or p.dtype == "f16" and caps.gpu is not None
                   and caps.gpu.f16_storage and all(d in ("f16", "f32") for d in (p.dtypes or ())))


def register_simt_variants(backend: str, dtypes, spirv: bool) -> dict:
    """The SIMT kernels as `backend`'s variants (their inputs held to `dtypes`; `spirv`: written for
    MLIR's SPIR-V conversion, as Vulkan and Metal take them, else for ROCDL): {variant id: emitter}."""
    on = BackendIs(backend)
    emitters = {}
    for variant_, emitter in (
        (Variant(f"{backend}.gemm.simt", backend, ("gemm", "fused_gemm"), (
            on, dtypes, SharedMemoryAtLeast(GEMM_SHARED_BYTES)), 10,
            "SIMT: shared-memory tiles of A and B, a 4 x 4 register tile per invocation, fused epilogue (f32 "
            "accumulation)", frozenset({"simd"})), simt_gemm),
        (Variant(f"{backend}.conv2d.implicit_gemm", backend, ("conv2d",), (
            on, dtypes, SharedMemoryAtLeast(GEMM_SHARED_BYTES),
            Rule("layout='nhwc' (filter HWCF; transpose an NCHW input to NHWC first)",
                 lambda p, caps: None if p.layout is None else p.layout == "nhwc"),
            Rule("groups=1", lambda p, caps: None if p.groups is None else p.groups == 1)), 10,
            "the SIMT GEMM with its A tiles gathered from the NHWC image (implicit GEMM), bias in the epilogue",
            frozenset({"simd"})), simt_conv),
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


EMITTERS.update(register_simt_variants("vulkan", F16_STORAGE, spirv=True))
EMITTERS.update(register_simt_variants("metal", DtypeIn(("f32",)), spirv=True))
_COOPERATIVE = Variant("vulkan.gemm.cooperative_matrix", "vulkan", ("gemm",), (
    BackendIs("vulkan"), Rule("a device with VK_KHR_cooperative_matrix",
                              lambda p, caps: caps.gpu is not None and caps.gpu.matrix_units == "cooperative_matrix"),
    DtypeIn(("f16",)), Rule("an f32 result (out_dtype='f32')", lambda p, caps: p.out_dtype == "f32"),
    Rule(f"M, N and K multiples of {TILE}, A not transposed, one matrix each (no batch)",
         lambda p, caps: None if None in (p.m, p.n, p.k, p.transpose_a, p.batched_b) else (
             p.m % TILE == 0 and p.n % TILE == 0 and p.k % TILE == 0 and not p.transpose_a and not p.batched_b
             and p.batch in (None, 1)))), 20,
    f"cooperative matrices: a subgroup per {TILE} x {TILE} tile of C, f16 {TILE} x {TILE} x {TILE} products "
    "accumulated in f32", frozenset({"matrix_units"}))
register_variant(_COOPERATIVE)
EMITTERS[_COOPERATIVE.id] = lambda v, name, caps: _launched(*cooperative_gemm_module_text(v, name, caps.gpu.warp_size))


def device_capabilities(device: str) -> Capabilities:
    """A Vulkan device of this machine ("vulkan:N") or a named Vulkan or Metal profile
    ("vulkan-lavapipe", "metal-apple")."""
    if device.startswith("vulkan:"):
        from ...doctor.capabilities import probe_vulkan
        found = probe_vulkan()
        if isinstance(found, str):
            raise ValueError(f"no Vulkan device here: {found}")
        wanted = [c for c in found if c.name == device]
        if not wanted:
            raise ValueError(f"there is no {device}; this machine has {', '.join(c.name for c in found)}")
        return wanted[0]
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
