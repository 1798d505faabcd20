"""What the host CPU offers, read from the machine (never assumed): SIMD width, vector
registers, cache sizes, cores. The CPU target sizes its default schedules from this."""
from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path


@dataclass(frozen=True)
class HostCPU:
    arch: str
    isa: str  # "avx512", "avx2", "neon", "sse" or "scalar": the widest f32 FMA SIMD found
    f32_lanes: int  # f32 lanes of the widest vector register
    vector_registers: int
    l1d_bytes: int  # per core
    l2_bytes: int  # per core
    l3_bytes: int  # shared
    cores: int

    def describe(self) -> str:
        return (f"{self.arch} {self.isa} ({self.f32_lanes} f32 lanes, {self.vector_registers} vector registers), "
                f"L1d {self.l1d_bytes // 1024} KiB, L2 {self.l2_bytes // 1024} KiB, L3 {self.l3_bytes // 1024} KiB, "
                f"{self.cores} core(s)")


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


KiB, MiB = 1024, 1024 * 1024
# CPUs that are not here, by name (TRACEA_CPU): default schedules follow their ISA, registers
# and caches (per core L1d / L2, shared L3; public specifications).
PROFILES = {
    "zen3-avx2": HostCPU("x86_64", "avx2", 8, 16, 32 * KiB, 512 * KiB, 32 * MiB, 8),
    "skylake-avx512": HostCPU("x86_64", "avx512", 16, 32, 32 * KiB, 1 * MiB, 22 * MiB, 16),
    "sapphire-rapids-avx512": HostCPU("x86_64", "avx512", 16, 32, 48 * KiB, 2 * MiB, 105 * MiB, 56),
    "x86-64-sse": HostCPU("x86_64", "sse", 4, 16, 32 * KiB, 256 * KiB, 8 * MiB, 4),
    "graviton3-neon": HostCPU("aarch64", "neon", 4, 32, 64 * KiB, 1 * MiB, 32 * MiB, 64),
    "apple-m2-neon": HostCPU("aarch64", "neon", 4, 32, 128 * KiB, 4 * MiB, 8 * MiB, 8),
}


def host_cpu() -> HostCPU:
    """This machine's CPU, or the named profile TRACEA_CPU asks for."""
    from .. import knobs
    name = knobs.cpu_profile()
    if name is None:
        return _probe()
    if name not in PROFILES:
        raise ValueError(f"TRACEA_CPU={name!r} is not a known CPU profile; known: {', '.join(PROFILES)}")
    return PROFILES[name]


@lru_cache(maxsize=1)
def _probe() -> HostCPU:
    arch = platform.machine().lower()
    flags = _cpu_flags()
    if arch in ("x86_64", "amd64"):
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
    return HostCPU(arch, isa, lanes, regs, caches.get(1, 32 * 1024), caches.get(2, 1024 * 1024),
                   caches.get(3, 8 * 1024 * 1024), machine_cores())


def machine_cores() -> int:
    """Cores this process may run on (whatever profile kernels are planned for)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
