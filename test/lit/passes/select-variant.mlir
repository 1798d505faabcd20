// tracea-select-variant writes the Doctor's choice onto each kernel op: the variant and, unless
// the op has one, its default schedule; an op no variant computes is an error naming why.
// RUN: not tracea-opt %s --split-input-file --pass-pipeline='builtin.module(tracea-select-variant{arch=sm_90a})' | FileCheck %s --check-prefix=H100
// RUN: not tracea-opt %s --split-input-file --pass-pipeline='builtin.module(tracea-select-variant{arch=sm_80})' | FileCheck %s --check-prefix=A100
// RUN: tracea-opt %s --split-input-file --pass-pipeline='builtin.module(tracea-select-variant{arch=skylake-avx512 threads=4})' | FileCheck %s --check-prefix=AVX512
// RUN: not tracea-opt %s --pass-pipeline='builtin.module(tracea-select-variant{arch=sm_80})' 2>&1 >/dev/null | FileCheck %s --check-prefix=ERR

// H100-LABEL: func.func @linear
// H100: schedule = {barrier = "producer_consumer", stages = 4 : i64, tile = array<i64: 64, 128, 64>, warp_tile = array<i64: 64, 128, 64>}, tracea.variant = "cuda.gemm.wgmma"
// A100-LABEL: func.func @linear
// A100: schedule = {stages = 3 : i64, tile = array<i64: 128, 128, 32>, warp_tile = array<i64: 64, 64, 32>}, tracea.variant = "cuda.gemm.mma_sync"
// AVX512-LABEL: func.func @linear
// AVX512: schedule = {lane_map = {kind = "simd", shape = array<i64: 16>}, tile = array<i64: {{[0-9]+}}, 512, 1024>, warp_tile = array<i64: {{[0-9]+}}, 32, 1>}, tracea.variant = "cpu.gemm.packed"
func.func @linear(%x: tensor<64x1024xbf16>, %w: tensor<512x1024xbf16>) -> tensor<64x512xf32> {
  %y = "tracea.gemm"(%x, %w) {transpose_b = true} : (tensor<64x1024xbf16>, tensor<512x1024xbf16>) -> tensor<64x512xf32>
  return %y : tensor<64x512xf32>
}

// -----

// An op's own schedule is kept; head dim 32 is not the wgmma kernel's; on the CPU a schedule
// without SIMD lanes asks for the reference loops.
// H100-LABEL: func.func @attention
// H100: schedule = {stages = 3 : i64, tile = array<i64: 64, 32>}, tracea.variant = "cuda.attention.mma_sync"
// AVX512-LABEL: func.func @attention
// AVX512: tracea.variant = "cpu.reference"
func.func @attention(%q: tensor<2x128x32xf16>) -> tensor<2x128x32xf16> {
  %o = "tracea.attention"(%q, %q, %q) {schedule = {tile = array<i64: 64, 32>, stages = 3}} : (tensor<2x128x32xf16>, tensor<2x128x32xf16>, tensor<2x128x32xf16>) -> tensor<2x128x32xf16>
  return %o : tensor<2x128x32xf16>
}

// -----

// ERR: :[[# @LINE + 4]]:8: error: 'tracea.softmax' op no kernel variant computes softmax (f32, last_axis True) on sm_80: no cuda variant implements it
// AVX512-LABEL: func.func @softmax
// AVX512: schedule = {lane_map = {kind = "simd", shape = array<i64: 16>}}, tracea.variant = "cpu.softmax.online"
func.func @softmax(%x: tensor<4x100xf32>) -> tensor<4x100xf32> {
  %y = "tracea.softmax"(%x) : (tensor<4x100xf32>) -> tensor<4x100xf32>
  return %y : tensor<4x100xf32>
}
