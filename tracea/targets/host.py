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


@lru_cache(maxsize=1)
def host_cpu() -> HostCPU:
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
                   caches.get(3, 8 * 1024 * 1024), len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                   else (os.cpu_count() or 1))
