"""The Metal target: the Vulkan target's kernels and SPIR-V (target.py), turned into the Metal
Shading Language by SPIRV-Cross (`spirv-cross --msl`, buffer i at [[buffer(i)]] as its SPIR-V
binding), packaged with the launch; runtime/metal_runtime.py compiles and runs the MSL on macOS.
No Metal compiler exists elsewhere: off macOS the MSL is the product (tests compare it with
golden files)."""
from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import mlir.ir as ir

from ...errors import CompileError
from ...passes.pipeline import Pipeline, parse_pipeline
from ...runtime.gpu_artifact import MetalKernelArtifact, buffer_params
from ..base import Build, Target, register_target
from .kernels import device_capabilities
from .target import spirv_code, spirv_lowering, validate


@dataclass(frozen=True)
class MetalOptions:
    device: str  # a Metal profile ("metal-apple")
    name: str
    arch: str  # the MSL version: "metal2.3"
    simdgroup_matrix: bool = False  # f16 GEMMs on simdgroup matrices (SPIR-V cooperative matrices)

    @property
    def vulkan(self) -> str:
        """The Vulkan environment the SPIR-V is made and validated for (cooperative matrices: 1.3's SPIR-V 1.6)."""
        return "vulkan1.3" if self.simdgroup_matrix else "vulkan1.1"


def msl_version(arch: str) -> str:
    """SPIRV-Cross's --msl-version number: metal2.3 -> 20300."""
    major, minor = arch.removeprefix("metal").split(".")
    return f"{int(major)}{int(minor):02d}00"


def spirv_cross() -> str | None:
    """SPIRV-Cross: $TRACEA_SPIRV_CROSS, else the one on PATH."""
    return os.environ.get("TRACEA_SPIRV_CROSS") or shutil.which("spirv-cross")


def spirv_to_msl(binary: bytes, arch: str, kernel: str, matrices: bool = False) -> str:
    """The MSL SPIRV-Cross writes for the module (`matrices`: it uses cooperative matrices)."""
    tool = spirv_cross()
    if tool is None:
        raise CompileError("the Metal target needs SPIRV-Cross to write MSL: apt-get install spirv-cross "
                           "(brew install spirv-cross on macOS)")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.spv"
        path.write_bytes(binary)
        done = subprocess.run([tool, "--msl", "--msl-version", msl_version(arch), "--msl-decoration-binding", str(path)],
                              capture_output=True, text=True)
    if done.returncode:
        why = (done.stderr or done.stdout).strip()
        if matrices:  # SPIRV-Cross before the Vulkan SDK 1.4.350 (March 2026) throws on them
            why += ("\nthis SPIRV-Cross predates simdgroup matrices (the Vulkan SDK 1.4.350's or newer writes them; "
                    "scripts/newer_debian.py fetch unpacks one, then TRACEA_SPIRV_CROSS=.cache/newer-debian/bin/"
                    "spirv-cross), or compile for chip='metal-apple' (SIMT kernels)")
        raise CompileError(f"SPIRV-Cross could not write MSL for {kernel}:\n{why}")
    return done.stdout


@register_target
class MetalTarget(Target):
    """compile(..., target="metal") on macOS: a callable on numpy arrays; compile_gpu(fn,
    chip="metal-apple") anywhere: the MSL and its launch (MetalKernelArtifact)."""
    name = "metal"

    def options(self, *, strategy: str = "tiled", threads: int | None = None, chip: str | None = None) -> MetalOptions:
        if strategy != "tiled" or threads is not None:
            raise ValueError("target 'metal' takes neither strategy= nor threads= (its kernels' threadgroups come "
                             "from their variants)")
        caps = device_capabilities(chip or "metal-apple")
        if caps.backend != "metal":
            raise ValueError(f"{chip!r} is a {caps.backend} device, not a Metal one (profiles: metal-apple)")
        return MetalOptions(chip or "metal-apple", caps.gpu.name, caps.gpu.arch,
                            caps.gpu.matrix_units == "simdgroup_matrix")

    def stages(self, options: MetalOptions) -> dict[str, Pipeline]:
        return {"gpu": parse_pipeline(f"tracea-verify, tracea-spirv-kernels{{device={options.device}}}"),
                "spirv": parse_pipeline(spirv_lowering(options.vulkan, cooperative_matrix=options.simdgroup_matrix))}

    def toolchain(self, options: MetalOptions) -> tuple[str, ...]:
        tool = spirv_cross()
        return (*super().toolchain(options), f"spirv-cross {Path(tool).resolve() if tool else 'missing'}")

    def device(self, options: MetalOptions):
        from ...runtime.metal_runtime import MetalDevice
        return MetalDevice.get()

    def codegen(self, module: ir.Operation, options: MetalOptions) -> bytes:
        return spirv_code(module)

    def package(self, code: bytes, signature, options: MetalOptions) -> MetalKernelArtifact:
        from ..nvvm.kernels import Launch

        code = json.loads(code)
        binary = base64.b64decode(code["spirv"])
        validate(binary, options.vulkan, f"@{signature.name}")
        msl = spirv_to_msl(binary, options.arch, f"@{signature.name}", "CooperativeMatrixKHR" in code["capabilities"])
        launch = Launch.of(code, signature.name)
        params = buffer_params(signature)
        return MetalKernelArtifact(signature.name, options.arch, msl, launch.grid, launch.block, tuple(params))

    def load(self, build: Build, options: MetalOptions, device):
        from ...runtime.metal_runtime import MetalKernel
        kernel = MetalKernel(build.artifact, device)
        kernel.stages = build.stages
        return kernel
