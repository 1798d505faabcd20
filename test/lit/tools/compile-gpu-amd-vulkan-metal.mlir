// tracea compile-gpu for the other GPUs: an AMD code object (HSACO), Vulkan SPIR-V, Metal MSL, each
// with its launch description; the chip picks the backend.
// RUN: rm -rf %t && tracea compile-gpu %s --chip gfx942 -o %t/amd | FileCheck %s --check-prefix=AMD
// RUN: tracea compile-gpu %s --chip vulkan-lavapipe -o %t/vk | FileCheck %s --check-prefix=VK
// RUN: tracea compile-gpu %s --chip metal-apple -o %t/mtl | FileCheck %s --check-prefix=MTL
// RUN: FileCheck %s --check-prefix=MSL < %t/mtl.metal
// RUN: FileCheck %s --check-prefix=JSON < %t/amd.json

// AMD: linear for gfx942: grid (2, 1, 1), block (16, 16, 1), {{[0-9]+}} VGPRs, 8192 bytes LDS, 0 bytes scratch; wrote {{.*}}amd.hsaco and {{.*}}amd.json
// VK: linear for vulkan1.3: (2, 1, 1) workgroups of (16, 16, 1); wrote {{.*}}vk.spv and {{.*}}vk.json
// MTL: linear for metal2.3: (2, 1, 1) threadgroups of (16, 16, 1); wrote {{.*}}mtl.metal and {{.*}}mtl.json
// MSL: kernel void linear(device {{.*}} {{\[\[buffer\(0\)\]\]}}, device {{.*}} {{\[\[buffer\(1\)\]\]}}, device {{.*}} {{\[\[buffer\(2\)\]\]}}
// JSON: "format": "tracea-hsaco-kernel-1"
// JSON: "chip": "gfx942"
func.func @linear(%x: tensor<64x48xf32>, %w: tensor<80x48xf32>) -> tensor<64x80xf32> {
  %y = "tracea.gemm"(%x, %w) {transpose_b = true} : (tensor<64x48xf32>, tensor<80x48xf32>) -> tensor<64x80xf32>
  return %y : tensor<64x80xf32>
}
