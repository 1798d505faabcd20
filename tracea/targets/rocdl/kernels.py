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
from ...codegen.variants import DtypeIn
from ...doctor.capabilities import ROCM_PROFILES, named
from ...passes.registry import TraceaPass, option, register
from ..spirv.kernels import register_simt_variants

KERNEL_OPS = ("tracea.gemm", "tracea.fused_gemm", "tracea.conv2d", "tracea.attention", "tracea.softmax")
CHIPS = tuple(ROCM_PROFILES)
EMITTERS = register_simt_variants("rocm", DtypeIn(("f32", "f16")), spirv=False)


@register
@dataclass(frozen=True)
class RocdlKernelsPass(TraceaPass):
    NAME = "tracea-rocdl-kernels"
    SUMMARY = ("make each function's gemm / fused_gemm / NHWC conv2d / attention / softmax an AMD GPU kernel with its "
               "launch configuration")
    chip: str = option("gfx942", "the AMD processor the kernels are for", CHIPS)

    def run(self, module: ir.Operation) -> None:
        functions_to_kernels(module, named(self.chip), KERNEL_OPS, "ROCm", EMITTERS, self.NAME)
