"""Every environment knob Tracea reads, in one place."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def _flag(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() not in ("0", "false", "no", "off", "")


def isolate_compiler() -> bool:
    """TRACEA_ISOLATE=0 runs MLIR passes in-process (faster to debug, but an LLVM
    assertion then kills the caller). Default: passes run in a forked child."""
    return _flag("TRACEA_ISOLATE", True) and hasattr(os, "fork")


def crash_dir() -> Path:
    """TRACEA_CRASH_DIR: where reproducers of internal compiler errors are written."""
    return Path(os.environ.get("TRACEA_CRASH_DIR") or Path(tempfile.gettempdir()) / "tracea-crashes")


def dump_dir() -> Path | None:
    """TRACEA_DUMP_DIR: when set, every compile writes the IR after each stage there."""
    value = os.environ.get("TRACEA_DUMP_DIR")
    return Path(value) if value else None


def num_threads() -> int | None:
    """TRACEA_NUM_THREADS: threads compiled kernels use by default (default: the host's cores)."""
    value = os.environ.get("TRACEA_NUM_THREADS")
    if not value:
        return None
    if not value.strip().isdigit() or int(value) < 1:
        raise ValueError(f"TRACEA_NUM_THREADS must be a positive number of threads, got {value!r}")
    return int(value)


def cpu_profile() -> str | None:
    """TRACEA_CPU: plan CPU kernels for a named CPU profile instead of this host (e.g.
    skylake-avx512; the names are in tracea.doctor.capabilities.CPU_PROFILES). The kernels still run here:
    LLVM splits vectors wider than the host's, and a narrower ISA's kernels are that ISA's machine
    code (targets/cpu/native.py: host_machine). For tests of other ISAs' code paths, for timing a
    narrower ISA on this host, and for inspecting what another machine would get."""
    return os.environ.get("TRACEA_CPU", "").strip() or None


def channels_last() -> bool:
    """TRACEA_CHANNELS_LAST=0 keeps a PyTorch model's NCHW convolutions NCHW. By default, a model
    whose convolutions can all be is computed channels-last (passes/channels_last.py)."""
    return _flag("TRACEA_CHANNELS_LAST", True)


def tune_malloc() -> bool:
    """TRACEA_TUNE_MALLOC=0 leaves glibc's malloc settings alone. By default the first kernel
    loaded raises its mmap and trim thresholds (32 MiB, 128 MiB) and its top pad (1 GiB, at most
    an eighth of the memory), so the large buffers a kernel allocates per call are reused instead
    of mapped and page-faulted anew each time (this halved the CNN benchmark's time, and ResNet-50
    at batch 8); the process then keeps up to that much freed memory resident."""
    return _flag("TRACEA_TUNE_MALLOC", True)


def place_workers() -> bool:
    """TRACEA_PLACE_WORKERS=0 leaves OpenMP's worker threads wherever the OS puts them. By default
    (Linux) they are kept off the CPU the calling thread runs on (see tracea.runtime.placement)."""
    return _flag("TRACEA_PLACE_WORKERS", True)


def share_cores() -> bool:
    """TRACEA_SHARE_CORES=0 leaves other libraries' thread pools as they are. By default, so that
    they do not spin on the cores Tracea's kernels run on: OpenBLAS (numpy's) runs its jobs on
    Tracea's OpenMP threads once a threaded kernel is loaded, and GNU OpenMP (torch's) runs
    Tracea's kernels too (loaded by `import tracea` when torch is installed and not loaded yet;
    runtime/blas_threads.py, gnu_openmp.py)."""
    return _flag("TRACEA_SHARE_CORES", True)


def parallel_runtime() -> str:
    """TRACEA_PARALLEL_RUNTIME: what threaded CPU kernels run on: "openmp" (the default, when the
    cmeel-libomp package is installed) or "async" (MLIR's async runtime, always available)."""
    value = os.environ.get("TRACEA_PARALLEL_RUNTIME", "openmp").strip().lower()
    if value not in ("openmp", "async"):
        raise ValueError(f"TRACEA_PARALLEL_RUNTIME must be 'openmp' or 'async', got {value!r}")
    return value


def symbolic_kernel() -> str:
    """TRACEA_SYMBOLIC_KERNEL: which sizes a model compiled for symbolic sizes (`dynamic_dims`, or
    a graph TorchDynamo traced with symbolic sizes) runs on its kernel of symbolic sizes: "auto"
    (the default) all of them unless that kernel runs products of run-time size as generic loops
    (10-100x slower than the kernels; then a new shape runs in PyTorch, and is compiled for at its
    second call), "always" all of them (frontend/dynamic.py)."""
    value = os.environ.get("TRACEA_SYMBOLIC_KERNEL", "auto").strip().lower() or "auto"
    if value not in ("auto", "always"):
        raise ValueError(f"TRACEA_SYMBOLIC_KERNEL must be 'auto' or 'always', got {value!r}")
    return value


def openmp_runtime() -> str:
    """TRACEA_OPENMP: whose threads threaded CPU kernels run on: "auto" (the default: GNU OpenMP's,
    torch's, when torch is loaded or installed, else LLVM's libomp), "gnu" or "llvm"
    (runtime/gnu_openmp.py). Read once more at `import tracea`: with "llvm" it does not load
    torch's libgomp."""
    value = os.environ.get("TRACEA_OPENMP", "auto").strip().lower() or "auto"
    if value not in ("auto", "gnu", "llvm"):
        raise ValueError(f"TRACEA_OPENMP must be 'auto', 'gnu' or 'llvm', got {value!r}")
    return value


def tuning_dir() -> Path:
    """TRACEA_TUNING_DIR: where the tuning cache (tuning_cache.json) lives (default ~/.tracea)."""
    return Path(os.environ.get("TRACEA_TUNING_DIR") or Path.home() / ".tracea")


def use_tuned() -> bool:
    """TRACEA_USE_TUNED=0: compile with the variants' default schedules, ignoring the tuning
    cache (an A/B of tuned against default)."""
    return _flag("TRACEA_USE_TUNED", True)


def tune() -> bool:
    """TRACEA_TUNE=1: compiles tune each kernel op the tuning cache has no schedule for (as
    tracea.compile(..., tune=True)); ~TRACEA_TUNE_BUDGET evaluations per op."""
    return _flag("TRACEA_TUNE", False)


def tune_budget() -> int:
    """TRACEA_TUNE_BUDGET: evaluations per op when a compile tunes (default 40)."""
    value = os.environ.get("TRACEA_TUNE_BUDGET", "40")
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"TRACEA_TUNE_BUDGET must be a positive number of evaluations, got {value!r}")
    return int(value)


def cache_dir() -> Path | None:
    """TRACEA_CACHE_DIR: where compiled kernels persist across processes (default
    $XDG_CACHE_HOME/tracea/kernels or ~/.cache/tracea/kernels); TRACEA_DISK_CACHE=0 turns it off."""
    if not _flag("TRACEA_DISK_CACHE", True):
        return None
    if os.environ.get("TRACEA_CACHE_DIR"):
        return Path(os.environ["TRACEA_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "tracea" / "kernels"


def show_progress() -> bool:
    """TRACEA_PROGRESS=1 prints the steps of a model compile (tracing, importing, compiling) to
    stderr as they start, =0 never; by default only when stderr is a terminal."""
    import sys
    return _flag("TRACEA_PROGRESS", sys.stderr.isatty())


def perf_map() -> bool:
    """TRACEA_PERF_MAP=1 writes each JIT-linked kernel's functions (the outlined loop nests
    included) to /tmp/perf-<pid>.map, so that `perf record` / `perf report` name them."""
    return _flag("TRACEA_PERF_MAP", False)


def amd_emulator() -> bool:
    """TRACEA_AMD_EMULATOR=1: compile(..., target="rocm", chip=...) runs its kernels on Tracea's
    AMD ISA emulator (runtime/amd_emulator.py) instead of a GPU through HIP: slow, exact, anywhere."""
    return _flag("TRACEA_AMD_EMULATOR", False)
