"""What a device can do, as one frozen, hashable value: probed from this machine (never assumed)
or taken from a named profile of a machine that is not here, so kernels can be planned and
compiled for it.

A `Capabilities` is a backend ("cpu", "cuda") and its device's record: `CPU` (ISA, SIMD width,
vector registers, caches, cores) or `GPU` (architecture, SMs, shared memory, registers, warp
size, matrix units, async copies, driver and toolkit). The CPU's default schedules are sized from
it; the variant registry's constraints read it.
"""
from __future__ import annotations

import os
import platform
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

KiB, MiB = 1024, 1024 * 1024


@dataclass(frozen=True)
class CPU:
    arch: str  # "x86_64", "aarch64"
    isa: str  # "avx512", "avx2", "neon", "sse" or "scalar": the widest f32 FMA SIMD found
    f32_lanes: int  # f32 lanes of the widest vector register
    vector_registers: int
    l1d_bytes: int  # per core
    l2_bytes: int  # per core
    l3_bytes: int  # shared
    cores: int

    @property
    def simd_bits(self) -> int:
        return 32 * self.f32_lanes

    def describe(self) -> str:
        return (f"{self.arch} {self.isa} ({self.f32_lanes} f32 lanes, {self.vector_registers} vector registers), "
                f"L1d {self.l1d_bytes // 1024} KiB, L2 {self.l2_bytes // 1024} KiB, L3 {self.l3_bytes // 1024} KiB, "
                f"{self.cores} core(s)")


@dataclass(frozen=True)
class GPU:
    arch: str  # the code generation target: "sm_80", "sm_90a"
    name: str  # the product ("NVIDIA A100-SXM4-80GB")
    compute_capability: int  # 80, 90
    multiprocessors: int
    warp_size: int
    shared_bytes_per_block: int  # with the opt-in for dynamic shared memory
    shared_bytes_per_multiprocessor: int
    registers_per_multiprocessor: int
    registers_per_thread: int
    threads_per_block: int
    matrix_units: str  # the Tensor Core instructions the kernels use: "mma.sync", "wgmma"
    async_copy: str  # "cp.async", "tma"
    memory_bytes: int  # device memory
    driver_version: str | None = None  # None: a named profile, not a device here
    toolkit_version: str | None = None
    f16_storage: bool = False  # Vulkan: 16-bit storage buffers, f16 arithmetic, 16-bit integers (storageBuffer16BitAccess + shaderFloat16 + shaderInt16)
    matrix_tile: int = 0  # Vulkan cooperative / Metal simdgroup matrices: the square f16 x f16 -> f32 tile (16, 8)

    def describe(self) -> str:
        where = f", driver {self.driver_version}" if self.driver_version else " (named profile)"
        if self.arch.startswith("gfx"):
            return (f"{self.name} {self.arch}: {self.multiprocessors} CUs, wave{self.warp_size}, "
                    f"{self.shared_bytes_per_block // 1024} KiB LDS per workgroup, {self.registers_per_thread} VGPRs "
                    f"per lane, {self.matrix_units.upper()}{where}")
        if self.arch.startswith(("vulkan", "metal")):
            return (f"{self.name} {self.arch}: subgroup {self.warp_size}, {self.shared_bytes_per_block // 1024} KiB "
                    f"shared memory, {self.threads_per_block} invocations per workgroup, "
                    f"{self.matrix_units or 'no cooperative matrices'}"
                    f"{f' ({self.matrix_tile}x{self.matrix_tile}x{self.matrix_tile} f16)' if self.matrix_tile else ''}{where}")
        return (f"{self.name} {self.arch}: {self.multiprocessors} SMs, warp {self.warp_size}, "
                f"{self.shared_bytes_per_block // 1024} KiB shared memory per block "
                f"({self.shared_bytes_per_multiprocessor // 1024} per SM), {self.registers_per_thread} registers "
                f"per thread, {self.matrix_units} Tensor Cores, {self.async_copy} copies{where}")


@dataclass(frozen=True)
class Capabilities:
    backend: str  # "cpu", "cuda"
    name: str  # "host", a named profile ("sm_90a", "skylake-avx512") or a device ("cuda:0")
    cpu: CPU | None = None
    gpu: GPU | None = None

    def describe(self) -> str:
        return f"{self.name} ({self.backend}): {(self.cpu or self.gpu).describe()}"


# -- named profiles: machines that are not here (public specifications) ---------------------

CPU_PROFILES = {
    "zen3-avx2": CPU("x86_64", "avx2", 8, 16, 32 * KiB, 512 * KiB, 32 * MiB, 8),
    "skylake-avx512": CPU("x86_64", "avx512", 16, 32, 32 * KiB, 1 * MiB, 22 * MiB, 16),
    "sapphire-rapids-avx512": CPU("x86_64", "avx512", 16, 32, 48 * KiB, 2 * MiB, 105 * MiB, 56),
    "x86-64-sse": CPU("x86_64", "sse", 4, 16, 32 * KiB, 256 * KiB, 8 * MiB, 4),
    "graviton3-neon": CPU("aarch64", "neon", 4, 32, 64 * KiB, 1 * MiB, 32 * MiB, 64),
    "apple-m2-neon": CPU("aarch64", "neon", 4, 32, 128 * KiB, 4 * MiB, 8 * MiB, 8),
}

GPU_PROFILES = {
    "sm_80": GPU("sm_80", "NVIDIA A100", 80, 108, 32, 163 * KiB, 164 * KiB, 65536, 255, 1024, "mma.sync", "cp.async",
                 80 * 1024 * MiB),
    "sm_90a": GPU("sm_90a", "NVIDIA H100 SXM", 90, 132, 32, 227 * KiB, 228 * KiB, 65536, 255, 1024, "wgmma", "tma",
                  80 * 1024 * MiB),
}

# Vulkan devices (arch: the Vulkan version the SPIR-V is for). lavapipe is Mesa's Vulkan driver on
# the CPU (Debian's mesa-vulkan-drivers): subgroups of 8, 32 KiB of shared memory, no
# VK_KHR_cooperative_matrix
VULKAN_PROFILES = {
    "vulkan-lavapipe": GPU("vulkan1.3", "llvmpipe (lavapipe)", 0, 1, 8, 32 * KiB, 32 * KiB, 0, 0, 1024, "", "",
                           2048 * MiB, f16_storage=True),
    # a GPU with VK_KHR_cooperative_matrix (f16 16x16x16 -> f32) and subgroups of 32: code only here
    "vulkan-coopmat": GPU("vulkan1.3", "Vulkan GPU with cooperative matrices", 0, 1, 32, 48 * KiB, 48 * KiB, 0, 0,
                          1024, "cooperative_matrix", "", 8192 * MiB, f16_storage=True, matrix_tile=16),
}

# AMD GPUs (ROCm; arch: the LLVM AMDGPU processor): CDNA wave64 with MFMA, RDNA3 wave32 with WMMA;
# 64 KiB of LDS per workgroup; VGPRs per lane (CDNA: 512 with the accumulation registers)
ROCM_PROFILES = {
    "gfx90a": GPU("gfx90a", "AMD Instinct MI250X (one GCD)", 0, 110, 64, 64 * KiB, 64 * KiB, 0, 512, 1024, "mfma", "",
                  64 * 1024 * MiB),
    "gfx942": GPU("gfx942", "AMD Instinct MI300X", 0, 304, 64, 64 * KiB, 64 * KiB, 0, 512, 1024, "mfma", "",
                  192 * 1024 * MiB),
    "gfx1100": GPU("gfx1100", "AMD Radeon RX 7900 XTX", 0, 96, 32, 64 * KiB, 64 * KiB, 0, 256, 1024, "wmma", "",
                   24 * 1024 * MiB),
}

# Apple GPUs through Metal (arch: the Metal Shading Language version the MSL is for): simdgroups
# of 32, 32 KiB of threadgroup memory, 1024 threads per threadgroup
METAL_PROFILES = {
    "metal-apple": GPU("metal2.3", "Apple GPU (M1 or newer)", 0, 1, 32, 32 * KiB, 32 * KiB, 0, 0, 1024, "", "",
                       8192 * MiB),
    # macOS 14 and newer: MSL 3.1, which SPIRV-Cross needs to write simdgroup matrices (8 x 8)
    "metal3-apple": GPU("metal3.1", "Apple GPU (M1 or newer), macOS 14 or newer", 0, 1, 32, 32 * KiB, 32 * KiB, 0, 0,
                        1024, "simdgroup_matrix", "", 8192 * MiB, matrix_tile=8),
}

PROFILES = {**{name: Capabilities("cpu", name, cpu=cpu) for name, cpu in CPU_PROFILES.items()},
            **{name: Capabilities("cuda", name, gpu=gpu) for name, gpu in GPU_PROFILES.items()},
            **{name: Capabilities("vulkan", name, gpu=gpu) for name, gpu in VULKAN_PROFILES.items()},
            **{name: Capabilities("metal", name, gpu=gpu) for name, gpu in METAL_PROFILES.items()},
            **{name: Capabilities("rocm", name, gpu=gpu) for name, gpu in ROCM_PROFILES.items()}}


def named(name: str) -> Capabilities:
    if name not in PROFILES:
        raise ValueError(f"unknown device profile {name!r}; known: {', '.join(PROFILES)}")
    return PROFILES[name]


# -- this machine ---------------------------------------------------------------------------

def host_cpu() -> CPU:
    """This machine's CPU, or the named profile TRACEA_CPU asks for (kernels planned for another
    CPU still run here: LLVM splits vectors wider than the host's)."""
    from .. import knobs
    name = knobs.cpu_profile()
    if name is None:
        return probe_cpu()
    if name not in CPU_PROFILES:
        raise ValueError(f"TRACEA_CPU={name!r} is not a known CPU profile; known: {', '.join(CPU_PROFILES)}")
    return CPU_PROFILES[name]


def machine_cores() -> int:
    """Cores this process may run on (whatever profile kernels are planned for)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.split(":", 1)[1].split())
    return set()


def _cache_sizes() -> dict[int, int]:
    """Cache level -> size in bytes of the data/unified cache seen by cpu0."""
    sizes: dict[int, int] = {}
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            kind = (index / "type").read_text().strip()
            level = int((index / "level").read_text())
            size = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        if kind == "Instruction":
            continue
        scale = {"K": 1024, "M": 1024 * 1024}.get(size[-1], 1)
        sizes[level] = int(size.rstrip("KM")) * scale
    return sizes


@lru_cache(maxsize=1)
def probe_cpu() -> CPU:
    arch = platform.machine().lower()
    flags = _cpu_flags()
    if arch in ("x86_64", "amd64"):
        # /proc/cpuinfo lists avx2 / avx512f only where the kernel saves their registers (XCR0);
        # it need not list osxsave (this Zen 4 VM's kernel does not)
        if "avx512f" in flags:
            isa, lanes, regs = "avx512", 16, 32
        elif "avx2" in flags and "fma" in flags:
            isa, lanes, regs = "avx2", 8, 16
        else:
            isa, lanes, regs = "sse", 4, 16
    elif arch in ("aarch64", "arm64"):
        isa, lanes, regs = "neon", 4, 32
    else:
        isa, lanes, regs = "scalar", 4, 16  # LLVM legalizes 4-lane vectors on any target
    caches = _cache_sizes()
    return CPU(arch, isa, lanes, regs, caches.get(1, 32 * KiB), caches.get(2, 1 * MiB), caches.get(3, 8 * MiB),
               machine_cores())


@lru_cache(maxsize=1)
def probe_nvidia() -> list[Capabilities] | str:
    """This machine's NVIDIA GPUs that Tracea's kernels run on, or why there are none (no
    cuda-bindings, no driver, no device, only older GPUs). Probed once a process; never raises."""
    try:
        from cuda.bindings import driver
    except ImportError:
        return "cuda-bindings is not installed (pip install 'cuda-bindings==13.0.3')"
    try:
        from ..runtime.cuda_launcher import Device
        try:
            result = driver.cuInit(0)
        except RuntimeError as e:  # cuda-bindings could not load libcuda
            return f"no CUDA driver on this machine ({e})"
        if result[0] != driver.CUresult.CUDA_SUCCESS:
            return f"the CUDA driver did not start ({result[0]})"
        _, count = driver.cuDeviceGetCount()
        if not count:
            return "the CUDA driver sees no device"
        _, version = driver.cuDriverGetVersion()
        found = []
        for ordinal in range(count):
            device = Device.get(ordinal)
            major, minor = device.compute_capability
            if (major, minor) < (8, 0):
                continue
            base = GPU_PROFILES[device.chip]
            attr = driver.CUdevice_attribute
            found.append(Capabilities("cuda", f"cuda:{ordinal}", gpu=replace(
                base, name=device.name, compute_capability=10 * major + minor,
                multiprocessors=device.multiprocessors, shared_bytes_per_block=device.max_shared_bytes_per_block,
                shared_bytes_per_multiprocessor=device._attribute(
                    attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR),
                registers_per_multiprocessor=device._attribute(attr.CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR),
                warp_size=device._attribute(attr.CU_DEVICE_ATTRIBUTE_WARP_SIZE),
                memory_bytes=_total_memory(driver, device),
                driver_version=f"{version // 1000}.{version % 1000 // 10}")))
        return found or f"no NVIDIA GPU of sm_80 or newer among the {count} device(s)"
    except Exception as e:  # a probe names its failure, never crashes the doctor
        return f"the NVIDIA probe failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


@lru_cache(maxsize=1)
def probe_vulkan() -> list[Capabilities] | str:
    """This machine's Vulkan devices, or why there are none (no `vulkan` package, no loader, no
    driver). Probed once a process; never raises."""
    try:
        from ..runtime.vulkan_runtime import VulkanDevice, VulkanError
    except ImportError as e:
        return f"the Vulkan runtime cannot load ({e})"
    try:
        found = [Capabilities("vulkan", f"vulkan:{i}", gpu=d.gpu()) for i, d in enumerate(VulkanDevice.all())]
        return found or "the Vulkan loader sees no device (apt-get install mesa-vulkan-drivers gives lavapipe)"
    except VulkanError as e:
        return str(e)
    except Exception as e:  # a probe names its failure, never crashes the doctor
        return f"the Vulkan probe failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def _total_memory(driver, device) -> int:
    err, total = driver.cuDeviceTotalMem(device.handle)
    return int(total) if err == driver.CUresult.CUDA_SUCCESS else 0


def host() -> Capabilities:
    """This machine's CPU as a Capabilities (TRACEA_CPU may name another)."""
    from .. import knobs
    return Capabilities("cpu", knobs.cpu_profile() or "host", cpu=host_cpu())
