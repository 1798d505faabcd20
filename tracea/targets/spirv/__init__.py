"""The Vulkan and Metal backends: gpu-dialect kernels lowered to SPIR-V compute shaders
(target.py), for Metal turned into MSL by SPIRV-Cross (metal.py), their variants (kernels.py);
run by runtime/vulkan_runtime.py on any Vulkan device (lavapipe, Mesa's driver on the CPU, in
the tests) and by runtime/metal_runtime.py on macOS."""
from . import kernels, metal, target  # noqa: F401  (importing registers the targets and their passes)
