"""tracea-rocdl-kernels: each function computing one gemm / fused_gemm / NHWC conv2d / attention /
softmax becomes an AMD GPU kernel: the SIMT GEMM (targets/nvvm/simt.py, plain gpu dialect: LDS
tiles of A and B, a 4 x 4 register tile per lane, the fused epilogue; a conv's A tiles gathered
from the image), the Vulkan target's flash attention and softmax (targets/spirv), for wave64
(CDNA) and wave32 (RDNA3) alike. The MFMA / WMMA kernels are not here yet: without an AMD
device or an ISA emulator this project could not check their numbers."""
from __future__ import annotations

from dataclasses import dataclass

import mlir.ir as ir

from ...codegen.gpu_kernels import functions_to_kernels
from ...codegen.variants import BackendIs, DtypeIn, Rule, SharedMemoryAtLeast, Variant, register_variant
from ...doctor.capabilities import ROCM_PROFILES, named
from ...passes.registry import TraceaPass, option, register
from ..nvvm.kernels import Launch
from ..spirv.attention import QUERIES, SHARED_BYTES, attention_module_text
from ..spirv.kernels import GEMM_SHARED_BYTES, simt_conv, simt_gemm
from ..spirv.softmax import MAX_WORKGROUP, softmax_module_text

KERNEL_OPS = ("tracea.gemm", "tracea.fused_gemm", "tracea.conv2d", "tracea.attention", "tracea.softmax")
CHIPS = tuple(ROCM_PROFILES)
ON_ROCM = BackendIs("rocm")
EMITTERS = {}


def _launch(text: str, grid: tuple[int, int, int], workgroup: tuple[int, int, int]) -> tuple[str, Launch]:
    return text, Launch(grid, workgroup, 0)


for _variant, _emitter in (
    (Variant("rocm.gemm.simt", "rocm", ("gemm", "fused_gemm"), (ON_ROCM, DtypeIn(("f32", "f16")),
                                                                SharedMemoryAtLeast(GEMM_SHARED_BYTES)), 10,
             "SIMT: LDS tiles of A and B, a 4 x 4 register tile per lane, fused epilogue", frozenset({"simd"})),
     lambda v, name, caps=None: simt_gemm(v, name, spirv=False)),
    (Variant("rocm.conv2d.implicit_gemm", "rocm", ("conv2d",), (
        ON_ROCM, DtypeIn(("f32", "f16")), SharedMemoryAtLeast(GEMM_SHARED_BYTES),
        Rule("layout='nhwc' (filter HWCF; transpose an NCHW input to NHWC first)",
             lambda p, caps: None if p.layout is None else p.layout == "nhwc"),
        Rule("groups=1", lambda p, caps: None if p.groups is None else p.groups == 1)), 10,
        "the SIMT GEMM with its A tiles gathered from the NHWC image (implicit GEMM), bias in the epilogue",
        frozenset({"simd"})),
     lambda v, name, caps=None: simt_conv(v, name, spirv=False)),
    (Variant("rocm.attention.flash_simt", "rocm", ("attention",), (ON_ROCM, DtypeIn(("f32", "f16")),
                                                                    SharedMemoryAtLeast(SHARED_BYTES)), 10,
             f"flash attention: a workgroup per {QUERIES} queries, key and value blocks in LDS, online softmax per "
             "lane", frozenset({"simd"})),
     lambda v, name, caps=None: _launch(*attention_module_text(v, name, spirv=False))),
    (Variant("rocm.softmax.workgroup_row", "rocm", ("softmax",), (
        ON_ROCM, DtypeIn(("f32", "f16")), SharedMemoryAtLeast(4 * MAX_WORKGROUP),
        Rule("along the last axis", lambda p, caps: p.last_axis)), 10,
        "a workgroup per row: max, then sum of exp, reduced in LDS; one read of the row each", frozenset({"simd"})),
     lambda v, name, caps=None: _launch(*softmax_module_text(v, name, spirv=False))),
):
    register_variant(_variant)
    EMITTERS[_variant.id] = _emitter


@register
@dataclass(frozen=True)
class RocdlKernelsPass(TraceaPass):
    NAME = "tracea-rocdl-kernels"
    SUMMARY = ("make each function's gemm / fused_gemm / NHWC conv2d / attention / softmax an AMD GPU kernel with its "
               "launch configuration")
    chip: str = option("gfx942", "the AMD processor the kernels are for", CHIPS)

    def run(self, module: ir.Operation) -> None:
        functions_to_kernels(module, named(self.chip), KERNEL_OPS, "ROCm", EMITTERS, self.NAME)
