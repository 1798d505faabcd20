"""The runtime libraries compiled kernels call into (OpenMP, MLIR's async runtime and runner
utilities), each loaded once per process."""
from __future__ import annotations

import ctypes
import os
from pathlib import Path

_loaded_libraries: dict[str, ctypes.CDLL] = {}


def load_runtime_library(path: str | Path) -> None:
    """Load a library kernels call into (a parallel runtime, MLIR's runner utilities) once,
    globally, for JIT and shared-library kernels alike (loaded per kernel, the async runtime
    would be torn down with the first kernel freed, crashing every other threaded kernel)."""
    path = Path(path)
    if str(path) in _loaded_libraries:
        return
    library = _loaded_libraries[str(path)] = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    if path.name == "libomp.so" and "KMP_BLOCKTIME" not in os.environ:
        # Idle OpenMP threads spin 1 ms (not 200) before sleeping: enough to bridge a kernel's
        # consecutive parallel loops and back-to-back calls, short enough to leave the cores to
        # the caller's other thread pools (torch, OpenBLAS) in between.
        library.kmp_set_blocktime(1)


def loaded_library(path: str | Path) -> ctypes.CDLL | None:
    return _loaded_libraries.get(str(Path(path)))
