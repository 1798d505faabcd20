// tracea-gpu-kernels rejects what it cannot tile, at the function, naming the fix.
// RUN: tracea-opt %s --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(tracea-gpu-kernels{chip=sm_90a})' -o /dev/null

// expected-error @+1 {{an NVIDIA kernel is made from a function computing one gemm / fused_gemm / conv2d / attention; @two has tracea.gemm, tracea.gemm}}
func.func @two(%a: tensor<16x16xf16>, %b: tensor<16x16xf16>) -> tensor<16x16xf16> {
  %c = "tracea.gemm"(%a, %b) : (tensor<16x16xf16>, tensor<16x16xf16>) -> tensor<16x16xf16>
  %d = "tracea.gemm"(%c, %b) : (tensor<16x16xf16>, tensor<16x16xf16>) -> tensor<16x16xf16>
  return %d : tensor<16x16xf16>
}


// -----
// expected-error @+1 {{wgmma tiles: block_k must be 64 (one 128-byte swizzled row of 2-byte elements), got 32}}
func.func @bad_hopper_schedule(%a: tensor<256x64xf16>, %b: tensor<64x256xf16>) -> tensor<256x256xf32> {
  %c = "tracea.gemm"(%a, %b) {schedule = {tile = array<i64: 128, 128, 32>, stages = 2 : i64}} : (tensor<256x64xf16>, tensor<64x256xf16>) -> tensor<256x256xf32>
  return %c : tensor<256x256xf32>
}
