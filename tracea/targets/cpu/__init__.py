"""The CPU backend: its Target (target.py: stages to LLVM, native code through llvmlite in
native.py), its kernels (gemm.py, conv.py, attention.py, softmax.py, transpose.py, and linalg.py
for the ops no kernel takes, vector_math.py for exp in them) and their variant declarations (kernels.py)."""
from . import kernels, linalg, target, vector_math  # noqa: F401  (importing registers the target and its passes)
