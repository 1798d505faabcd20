"""tracea-rocdl-kernels: each function computing one gemm / fused_gemm / NHWC conv2d / attention /
softmax becomes an AMD GPU kernel: the SIMT GEMM (targets/nvvm/simt.py, plain gpu dialect: LDS
tiles of A and B, a 4 x 4 register tile per lane, the fused epilogue; a conv's A tiles gathered
from the image), the Vulkan target's flash attention and softmax (targets/spirv), for wave64
(CDNA) and wave32 (RDNA3) alike; their machine code is checked against numpy on the AMD ISA
emulator (runtime/amd_emulator.py)."""
from __future__ import annotations

from dataclasses import dataclass

import mlir.ir as ir

from ...codegen.gpu_kernels import functions_to_kernels
from ...codegen.variants import BackendIs, DtypeIn, Rule, Variant, register_variant
from ...doctor.capabilities import ROCM_PROFILES, Capabilities, named
from ...passes.registry import TraceaPass, option, register
from ..nvvm.kernels import Launch, conv_gemm, mma_gemm
from ..nvvm.mma import MmaGemm
from ..spirv.kernels import register_simt_variants
from .matrix import CHUNK, MatrixTiles, instruction_for, matrix_gemm_module_text, grid
from .matrix_attention import head_dims_fit, matrix_attention_module_text

KERNEL_OPS = ("tracea.gemm", "tracea.fused_gemm", "tracea.conv2d", "tracea.attention", "tracea.softmax")
CHIPS = tuple(ROCM_PROFILES)
EMITTERS = register_simt_variants("rocm", DtypeIn(("f32", "f16")), spirv=False)


def emit_matrix_gemm(v, name: str, caps: Capabilities) -> tuple[str, Launch]:
    return _matrix_launch(mma_gemm(v), name, caps)


def emit_matrix_conv(v, name: str, caps: Capabilities) -> tuple[str, Launch]:
    return _matrix_launch(conv_gemm(v), name, caps)


def emit_matrix_attention(v, name: str, caps: Capabilities) -> tuple[str, Launch]:
    text, grid_, block = matrix_attention_module_text(v, instruction_for(caps.gpu.matrix_units), name)
    return text, Launch(grid_, block, 0)


def _matrix_launch(g: MmaGemm, name: str, caps: Capabilities) -> tuple[str, Launch]:
    ins = instruction_for(caps.gpu.matrix_units)
    tiles = MatrixTiles.default(ins)
    waves_m, waves_n = tiles.waves()
    return matrix_gemm_module_text(g, ins, tiles, name), Launch(grid(g, tiles), (waves_m * waves_n * ins.wave, 1, 1), 0)


def _has_matrix_cores(caps: Capabilities) -> bool:
    return caps.gpu is not None and caps.gpu.matrix_units in ("mfma", "wmma")


_MATRIX_CORES = Rule("a chip with matrix cores (MFMA or WMMA)", lambda p, caps: _has_matrix_cores(caps))
_MATRIX = Variant("rocm.gemm.matrix_cores", "rocm", ("gemm", "fused_gemm"), (
    BackendIs("rocm"), _MATRIX_CORES, DtypeIn(("f16", "bf16")),
    Rule(f"K and N multiples of {CHUNK} (and M, for a transposed A)",
         lambda p, caps: None if None in (p.m, p.n, p.k, p.transpose_a) else (
             p.k % CHUNK == 0 and p.n % CHUNK == 0 and (not p.transpose_a or p.m % CHUNK == 0)))), 20,
    "matrix cores: MFMA 32x32x8 (CDNA, wave64) or WMMA 16x16x16 (RDNA3, wave32), f32 accumulation, "
    "double-buffered swizzled LDS tiles, fused epilogue", frozenset({"matrix_units"}))
_MATRIX_CONV = Variant("rocm.conv2d.matrix_cores", "rocm", ("conv2d",), (
    BackendIs("rocm"), _MATRIX_CORES, DtypeIn(("f16", "bf16")),
    Rule("layout='nhwc', groups=1", lambda p, caps: None if None in (p.layout, p.groups) else
         p.layout == "nhwc" and p.groups == 1),
    Rule(f"channels in and out multiples of {CHUNK}", lambda p, caps: None if p.view is None or p.layout != "nhwc"
         else p.view.operands["input"].shape[-1] % CHUNK == 0 and p.view.result.shape[-1] % CHUNK == 0)), 20,
    "the matrix-core GEMM with its A chunks gathered from the NHWC image (16-byte runs of channels), bias and "
    "activation in the epilogue", frozenset({"matrix_units"}))
_MATRIX_ATTENTION = Variant("rocm.attention.matrix_cores", "rocm", ("attention",), (
    BackendIs("rocm"), _MATRIX_CORES, DtypeIn(("f16", "bf16")),
    Rule("head dim a multiple of 8 (MFMA) or 16 (WMMA), value head dim a multiple of 32 (MFMA) or 16 (WMMA)",
         lambda p, caps: None if None in (p.head_dim, p.value_head_dim) or not _has_matrix_cores(caps) else
         head_dims_fit(p.head_dim, p.value_head_dim, instruction_for(caps.gpu.matrix_units)))), 20,
    "flash attention: Q K^T and P V on MFMA / WMMA, the online softmax on the accumulators (row max by lane "
    "shuffles), P through LDS into operand layout", frozenset({"matrix_units"}))
for variant_, emitter in ((_MATRIX, emit_matrix_gemm), (_MATRIX_CONV, emit_matrix_conv),
                          (_MATRIX_ATTENTION, emit_matrix_attention)):
    register_variant(variant_)
    EMITTERS[variant_.id] = emitter


@register
@dataclass(frozen=True)
class RocdlKernelsPass(TraceaPass):
    NAME = "tracea-rocdl-kernels"
    SUMMARY = ("make each function's gemm / fused_gemm / NHWC conv2d / attention / softmax an AMD GPU kernel with its "
               "launch configuration")
    chip: str = option("gfx942", "the AMD processor the kernels are for", CHIPS)

    def run(self, module: ir.Operation) -> None:
        functions_to_kernels(module, named(self.chip), KERNEL_OPS, "ROCm", EMITTERS, self.NAME)
