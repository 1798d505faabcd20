"""The AMD (ROCm) backend: gpu-dialect kernels lowered through ROCDL to LLVM IR, made AMDGPU
machine code by llvmlite's AMDGPU back end and linked into HSACO code objects by ld.lld
(target.py), their variants (kernels.py); runtime/hip_launcher.py launches them where ROCm is."""
from . import kernels, target  # noqa: F401  (importing registers the target and its passes)
