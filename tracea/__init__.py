"""Tracea: an MLIR-based kernel compiler (GEMM, fused GEMM, softmax, conv2d, attention)."""
__version__ = "0.1.0"

import importlib.util as _importlib_util  # noqa: E402
import sys as _sys  # noqa: E402

from .runtime import blas_threads as _blas_threads  # noqa: E402

_blas_threads.share_gnu_openmp()  # before anything loads torch's libgomp

# torch-mlir bundles its own LLVM/MLIR. Its native library must be loaded after the xtc MLIR
# libraries and before any kernel is JIT-compiled: loaded first, it makes the JIT bind to its
# copies (kernels then crash); loaded after a JIT has made libLLVM.so's symbols global, LLVM aborts
# on duplicate command-line options. So Tracea loads it here, when installed (~0.06 s).
if "torch_mlir._mlir_libs._mlir" in _sys.modules:
    raise ImportError("import tracea before torch_mlir: torch-mlir's bundled LLVM, loaded first, makes "
                      "Tracea's compiled kernels crash")

from . import dialects, ops, passes, targets  # noqa: E402,F401  (registers the dialect, passes, targets)

if _importlib_util.find_spec("torch_mlir") is not None:
    import torch_mlir._mlir_libs._mlir  # noqa: E402,F401
from .api import compile  # noqa: E402
from .compiler import clear_cache, compile_gpu  # noqa: E402
from .doctor import Context  # noqa: E402
from .errors import (ArgumentError, CompileError, IndexOutOfRangeError, InternalCompilerError, OpError,  # noqa: E402
                     TraceaError)
from .ops import patch_conv2d, unpatch_conv2d  # noqa: E402
from .runtime.kernel import Kernel  # noqa: E402


def __getattr__(name: str):
    if name == "TraceaConv2d":  # an nn.Conv2d subclass: made on first use, so torch loads only then
        return ops.TraceaConv2d
    raise AttributeError(f"module 'tracea' has no attribute '{name}'")


def _register_torch_backend() -> None:
    """backend="tracea" for torch.compile when torch is already imported (otherwise the package's
    torch_dynamo_backends entry point makes the name known)."""
    import sys
    if "torch" in sys.modules:
        try:
            from .frontend.dynamo import register
            register()
        except Exception:  # noqa: BLE001 - a torch without dynamo: the rest of Tracea still works
            pass


_register_torch_backend()

__all__ = ["ArgumentError", "CompileError", "Context", "IndexOutOfRangeError", "InternalCompilerError", "Kernel", "OpError", "TraceaConv2d",
           "TraceaError", "__version__", "clear_cache", "compile", "compile_gpu", "dialects", "ops", "passes", "patch_conv2d",
           "targets", "unpatch_conv2d"]
