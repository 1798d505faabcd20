"""The Vulkan backend: gpu-dialect kernels lowered to SPIR-V compute shaders (target.py), their
variants (kernels.py), run by runtime/vulkan_runtime.py on any Vulkan device (lavapipe, Mesa's
driver on the CPU, in the tests)."""
from . import kernels, target  # noqa: F401  (importing registers the target and its passes)
