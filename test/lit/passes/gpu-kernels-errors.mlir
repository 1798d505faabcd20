// tracea-gpu-kernels rejects what it cannot tile, at the function, naming the fix.
// RUN: tracea-opt %s --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(tracea-gpu-kernels{chip=sm_90a})' -o /dev/null

// expected-error @+1 {{an NVIDIA kernel is made from a function computing one gemm / fused_gemm / conv2d / attention; @two has tracea.gemm, tracea.gemm}}
func.func @two(%a: tensor<16x16xf16>, %b: tensor<16x16xf16>) -> tensor<16x16xf16> {
  %c = "tracea.gemm"(%a, %b) : (tensor<16x16xf16>, tensor<16x16xf16>) -> tensor<16x16xf16>
  %d = "tracea.gemm"(%c, %b) : (tensor<16x16xf16>, tensor<16x16xf16>) -> tensor<16x16xf16>
  return %d : tensor<16x16xf16>
}


// -----
// expected-error @+1 {{batched A^T is not supported on this target yet}}
func.func @batched_transposed_a(%a: tensor<2x32x16xf16>, %b: tensor<32x16xf16>) -> tensor<2x16x16xf32> {
  %c = "tracea.gemm"(%a, %b) {transpose_a = true} : (tensor<2x32x16xf16>, tensor<32x16xf16>) -> tensor<2x16x16xf32>
  return %c : tensor<2x16x16xf32>
}
