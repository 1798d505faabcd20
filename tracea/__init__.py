"""Tracea: an MLIR-based kernel compiler (GEMM, fused GEMM, softmax, conv2d, attention)."""
__version__ = "0.1.0"

from . import dialects, passes, targets  # noqa: E402,F401  (registers the dialect, passes, targets)
from .compiler import clear_cache, compile  # noqa: E402
from .errors import (ArgumentError, CompileError, InternalCompilerError, OpError,  # noqa: E402
                     TraceaError)
from .runtime.kernel import Kernel  # noqa: E402

__all__ = ["ArgumentError", "CompileError", "InternalCompilerError", "Kernel", "OpError", "TraceaError",
           "__version__", "clear_cache", "compile", "dialects", "passes", "targets"]
