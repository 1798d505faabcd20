"""The NVIDIA target: tracea ops -> gpu-dialect kernels (stage "gpu": tracea-select-variant's
choice emitted by tracea-gpu-kernels, kernels.py) -> NVVM -> PTX for sm_80 / sm_90a (stage "ptx":
MLIR's NVPTX back end, in the compiler child) -> cubin through `ptxas`, whose resource report
(registers, shared memory, spills) is checked against the device's limits before anything is
launched. The artifact (runtime/gpu_artifact.py) holds cubin, PTX and launch configuration;
runtime/cuda_launcher.py runs it.
"""
from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import mlir.ir as ir

from ...doctor.capabilities import GPU_PROFILES
from ...errors import CompileError
from ...passes.pipeline import Pipeline, compile_or_raise, parse_pipeline
from ...passes.registry import TraceaPass, register
from ...runtime.gpu_artifact import GpuKernelArtifact, Param, buffer_params
from ..base import Build, Target, register_target


@dataclass(frozen=True)
class DeviceLimits:
    chip: str
    ptx_features: str  # the PTX ISA MLIR's NVPTX back end emits for it
    shared_bytes_per_block: int  # with the opt-in for dynamic shared memory
    registers_per_thread: int
    threads_per_block: int


LIMITS = {chip: DeviceLimits(chip, "+ptx80", gpu.shared_bytes_per_block, gpu.registers_per_thread, gpu.threads_per_block)
          for chip, gpu in GPU_PROFILES.items()}


def device_limits(chip: str) -> DeviceLimits:
    try:
        return LIMITS[chip]
    except KeyError:
        raise CompileError(f"unsupported NVIDIA architecture '{chip}'; Tracea targets {', '.join(LIMITS)}") from None


def cuda_toolkit() -> Path | None:
    """A CUDA directory holding nvvm/libdevice/libdevice.10.bc (NVIDIA's wheel, CUDA_HOME or
    /usr/local/cuda): linked into kernels that call its math functions (__nv_floorf, ...)."""
    roots = [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"]
    spec = importlib.util.find_spec("nvidia")
    roots += [str(p) for root in ((spec.submodule_search_locations or []) if spec else [])
              for p in sorted(Path(root).glob("cu*"))]
    for root in filter(None, roots):
        if (Path(root) / "nvvm" / "libdevice" / "libdevice.10.bc").is_file():
            return Path(root)
    return None


def ptx_lowering(chip: str) -> str:
    """gpu-dialect kernels to PTX (a gpu.binary holding it), each kernel's launch kept on the
    module (tracea-keep-launches) where it outlives the gpu.module."""
    toolkit = cuda_toolkit()
    return (f"tracea-keep-launches, nvvm-attach-target{{chip={chip} features={device_limits(chip).ptx_features}}}, "
            "gpu.module(convert-nvgpu-to-nvvm, expand-strided-metadata, lower-affine, convert-vector-to-llvm, "
            "convert-scf-to-cf, convert-gpu-to-nvvm, convert-nvvm-to-llvm, reconcile-unrealized-casts), "
            "tracea-extern-dynamic-shared, "
            f"gpu-module-to-binary{{format=isa{f' toolkit={toolkit}' if toolkit else ''}}}")


def to_ptx(gpu_module_text: str, chip: str, source_name: str = "<gpu kernels>") -> str:
    """PTX for the (single) gpu.module of `gpu_module_text` (kernels written by hand or by a test)."""
    result = compile_or_raise(gpu_module_text, [("ptx", parse_pipeline(ptx_lowering(chip)))], source_name=source_name,
                              verify_each=False, finish=_assembly_of_binary)
    return result.artifact.decode()


def _assembly_of_binary(module: ir.Operation) -> bytes:
    from mlir.dialects import gpu
    binaries = [op.operation for op in module.regions[0].blocks[0].operations if op.operation.name == "gpu.binary"]
    if len(binaries) != 1:
        raise CompileError(f"expected one gpu.module to compile, found {len(binaries)}")
    return gpu.ObjectAttr(ir.ArrayAttr(binaries[0].attributes["objects"])[0]).object


@dataclass(frozen=True)
class Cubin:
    chip: str
    image: bytes
    registers: int  # per thread, the kernel using the most
    static_shared_bytes: int
    spilled_bytes: int  # spill stores + loads, a warning sign for the register tile
    log: str  # ptxas -v


def cuda_tool(name: str, package: str) -> Path:
    """A CUDA command-line tool: on PATH, or from NVIDIA's wheel (nvidia/cu*/bin)."""
    found = shutil.which(name)
    if found:
        return Path(found)
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        for candidate in Path(root).glob(f"cu*/bin/{name}"):
            return candidate
    raise CompileError(f"this needs CUDA's {name}: pip install {package} (or put it on PATH)")


def ptxas_path() -> Path:
    return cuda_tool("ptxas", "nvidia-cuda-nvcc==13.0.88")


def sass(cubin: Cubin) -> str:
    """The cubin's machine code (cuobjdump -sass, which runs nvdisasm): what a kernel really
    executes (FFMA, HMMA, HGMMA, LDGSTS...)."""
    cuobjdump = cuda_tool("cuobjdump", "nvidia-cuda-cuobjdump==13.2.51 nvidia-cuda-nvdisasm==13.2.51")
    nvdisasm = cuda_tool("nvdisasm", "nvidia-cuda-nvdisasm==13.2.51")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin.image)
        env = {**os.environ, "PATH": f"{nvdisasm.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        done = subprocess.run([str(cuobjdump), "-sass", str(path)], capture_output=True, text=True, env=env)
    if done.returncode:
        raise CompileError(f"cuobjdump could not disassemble the {cubin.chip} cubin:\n{done.stderr.strip()}")
    return done.stdout


def assemble(ptx: str, chip: str) -> Cubin:
    """ptxas the PTX for `chip`; its verbose report gives the kernel's resources."""
    device_limits(chip)
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "kernel.ptx", Path(tmp) / "kernel.cubin"
        src.write_text(ptx)
        done = subprocess.run([str(ptxas_path()), f"-arch={chip}", "-v", "-o", str(out), str(src)],
                              capture_output=True, text=True)
        if done.returncode:
            raise CompileError(f"ptxas rejected the PTX for {chip}:\n{done.stderr.strip()}")
        image = out.read_bytes()
    log = done.stderr
    registers = max((int(n) for n in re.findall(r"Used (\d+) registers", log)), default=0)
    shared = max((int(n) for n in re.findall(r"(\d+) bytes smem", log)), default=0)
    spills = sum(int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", log))
    return Cubin(chip, image, registers, shared, spills, log)


def check_launch(kernel: str, cubin: Cubin, threads_per_block: int, dynamic_shared_bytes: int = 0) -> None:
    """Refuse a launch configuration the device cannot run, naming the resource and the fix."""
    limits = device_limits(cubin.chip)
    shared = cubin.static_shared_bytes + dynamic_shared_bytes
    if shared > limits.shared_bytes_per_block:
        raise CompileError(f"{kernel} needs {shared / 1024:.0f} KB shared memory, {cubin.chip} allows "
                           f"{limits.shared_bytes_per_block // 1024} KB per block; reduce stages or the tile")
    if threads_per_block > limits.threads_per_block:
        raise CompileError(f"{kernel} asks for {threads_per_block} threads per block, {cubin.chip} allows "
                           f"{limits.threads_per_block}; use fewer warps per block")
    if cubin.registers * threads_per_block > 64 * 1024:
        raise CompileError(f"{kernel} uses {cubin.registers} registers per thread x {threads_per_block} threads, "
                           f"more than the 65536 of an SM; use fewer threads or a smaller register tile")


@dataclass(frozen=True)
class NvvmOptions:
    chip: str  # the architecture the PTX and cubin are for (sm_80, sm_90a)


@register_target
class NvvmTarget(Target):
    """compile(..., target="cuda") loads the kernel on GPU 0 (its architecture detected, or
    `chip`); compile_gpu(..., chip=...) stops at the artifact, for a GPU elsewhere. One gemm /
    fused_gemm / NHWC conv2d / attention per function (kernels.py)."""
    name = "cuda"

    def options(self, *, strategy: str = "tiled", threads: int | None = None, chip: str | None = None) -> NvvmOptions:
        if strategy != "tiled":
            raise ValueError(f"target 'cuda' has one strategy, 'tiled' (got {strategy!r}); the reference "
                             "strategy is the CPU's")
        if threads is not None:
            raise ValueError("threads= sizes the CPU's thread teams; a cuda kernel's blocks and warps come from "
                             "its schedule")
        if chip is None:
            chip = self.device(None).chip
        device_limits(chip)
        return NvvmOptions(chip)

    def stages(self, options: NvvmOptions) -> dict[str, Pipeline]:
        return {"gpu": parse_pipeline(f"tracea-verify, tracea-gpu-kernels{{chip={options.chip}}}"),
                "ptx": parse_pipeline(ptx_lowering(options.chip))}

    def toolchain(self, options: NvvmOptions) -> tuple[str, ...]:
        return (*super().toolchain(options), *_nvidia_toolchain())

    def device(self, options: NvvmOptions | None):
        from ...runtime.cuda_launcher import Device
        return Device.get(0)  # CudaError naming what is missing on a machine without one

    def codegen(self, module: ir.Operation, options: NvvmOptions) -> bytes:
        """The PTX and each kernel's launch (its attribute's text), as JSON."""
        launches = ir.DictAttr(module.attributes[KEPT_LAUNCHES]) if KEPT_LAUNCHES in module.attributes else {}
        return json.dumps({"ptx": _assembly_of_binary(module).decode(),
                           "launches": {a.name: str(a.attr) for a in launches}}).encode()

    def package(self, code: bytes, signature, options: NvvmOptions) -> GpuKernelArtifact:
        """The cubin of the kernel `signature` names, assembled and checked against the chip's
        limits, with its PTX and launch metadata: ready to save and launch where a GPU is."""
        from .kernels import Launch

        code = json.loads(code)
        ptx, chip = code["ptx"], options.chip
        launch = Launch.of(code, signature.name)
        cubin = assemble(ptx, chip)
        block_threads = launch.block[0] * launch.block[1] * launch.block[2]
        check_launch(f"@{signature.name}", cubin, block_threads, launch.dynamic_shared_bytes)
        params = buffer_params(signature)
        params += [Param(f"{params[m.operand].name}.tensor_map", "tensormap", None, False,
                         (m.operand, *m.box, m.swizzle_bytes, m.rank)) for m in launch.tensor_maps]
        return GpuKernelArtifact(signature.name, chip, cubin.image, ptx, launch.grid, launch.block,
                                 launch.dynamic_shared_bytes, tuple(params), cubin.registers, cubin.static_shared_bytes)

    def load(self, build: Build, options: NvvmOptions, device):
        from ...runtime.cuda_launcher import CudaKernel
        kernel = CudaKernel(build.artifact, device)
        kernel.stages = build.stages
        return kernel


@functools.cache  # found once: every compile call, cache hits included, hashes the toolchain
def _nvidia_toolchain() -> tuple[str, str]:
    """(ptxas's version, the CUDA directory libdevice comes from)."""
    try:
        done = subprocess.run([str(ptxas_path()), "--version"], capture_output=True, text=True, timeout=20)
        ptxas = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "ptxas without a version"
    except (CompileError, OSError, subprocess.TimeoutExpired) as e:
        ptxas = f"ptxas unavailable ({e})"
    return ptxas, str(cuda_toolkit())


KEPT_LAUNCHES = "tracea.launches"


@register
@dataclass(frozen=True)
class KeepLaunchesPass(TraceaPass):
    NAME = "tracea-keep-launches"
    SUMMARY = ("copy each kernel's tracea.launch onto the top-level module (tracea.launches = {kernel: launch}), "
               "where it outlives gpu-module-to-binary")

    def run(self, module: ir.Operation) -> None:
        launches = {}

        def visit(op):
            op = op.operation
            if op.name == "gpu.func" and "tracea.launch" in op.attributes:
                launches[ir.StringAttr(op.attributes["sym_name"]).value] = op.attributes["tracea.launch"]
            return ir.WalkResult.ADVANCE

        module.walk(visit)
        if launches:
            module.attributes[KEPT_LAUNCHES] = ir.DictAttr.get(launches, context=module.context)
