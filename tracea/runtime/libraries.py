"""The runtime libraries compiled kernels call into (OpenMP, MLIR's async runtime and runner
utilities), each loaded once per process."""
from __future__ import annotations

import ctypes
import os
from pathlib import Path

# by file name: a kernel from the disk cache names the copy of the environment that compiled it
# (another checkout's venv shares ~/.cache/tracea), and a second copy of libomp in one process
# aborts it ("OMP: Error #15: ... already initialized"), so the first copy loaded serves them all
_loaded_libraries: dict[str, ctypes.CDLL] = {}


def load_runtime_library(path: str | Path) -> None:
    """Load a library kernels call into (a parallel runtime, MLIR's runner utilities) once,
    globally, for JIT and shared-library kernels alike (loaded per kernel, the async runtime
    would be torn down with the first kernel freed, crashing every other threaded kernel)."""
    path = Path(path)
    if path.name in _loaded_libraries:
        return
    library = _loaded_libraries[path.name] = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    if path.name == "libomp.so" and "KMP_BLOCKTIME" not in os.environ:
        # Idle OpenMP threads spin 1 ms (not 200) before sleeping: enough to bridge a kernel's
        # consecutive parallel loops and back-to-back calls, short enough to leave the cores to
        # the caller's other thread pools (torch, OpenBLAS) in between.
        library.kmp_set_blocktime(1)


def loaded_library(path: str | Path) -> ctypes.CDLL | None:
    """The library of this file name loaded in this process (whichever copy came first)."""
    return _loaded_libraries.get(Path(path).name)
