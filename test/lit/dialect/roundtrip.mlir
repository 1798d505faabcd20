// Every op and schedule attribute prints and parses back unchanged.
// RUN: tracea-opt %s | tracea-opt | FileCheck %s
// RUN: tracea-opt %s --mlir-print-op-generic | tracea-opt | FileCheck %s

// CHECK-LABEL: func.func @gemm
// CHECK: "tracea.gemm"(%{{.*}}, %{{.*}}) {transpose_b = true} : (tensor<64x32xbf16>, tensor<16x32xbf16>) -> tensor<64x16xf32>
func.func @gemm(%a: tensor<64x32xbf16>, %b: tensor<16x32xbf16>) -> tensor<64x16xf32> {
  %c = "tracea.gemm"(%a, %b) {transpose_b = true} : (tensor<64x32xbf16>, tensor<16x32xbf16>) -> tensor<64x16xf32>
  return %c : tensor<64x16xf32>
}

// CHECK-LABEL: func.func @batched_gemm
// CHECK: "tracea.gemm"(%{{.*}}, %{{.*}}) {transpose_a = true} : (tensor<2x3x4x8xf16>, tensor<2x3x4x5xf16>) -> tensor<2x3x8x5xf16>
func.func @batched_gemm(%a: tensor<2x3x4x8xf16>, %b: tensor<2x3x4x5xf16>) -> tensor<2x3x8x5xf16> {
  %c = "tracea.gemm"(%a, %b) {transpose_a = true} : (tensor<2x3x4x8xf16>, tensor<2x3x4x5xf16>) -> tensor<2x3x8x5xf16>
  return %c : tensor<2x3x8x5xf16>
}

// CHECK-LABEL: func.func @scheduled
// CHECK: schedule = {barrier = "producer_consumer", lane_map = {kind = "mma_sync", shape = array<i64: 16, 8, 16>}, stages = 3 : i64, swizzle = {base = 3 : i64, bits = 3 : i64, kind = "xor", shift = 3 : i64}, tile = array<i64: 128, 128, 32>, warp_tile = array<i64: 64, 64, 32>}
func.func @scheduled(%a: tensor<256x64xf16>, %b: tensor<64x256xf16>) -> tensor<256x256xf32> {
  %c = "tracea.gemm"(%a, %b) {schedule = {tile = array<i64: 128, 128, 32>, warp_tile = array<i64: 64, 64, 32>,
      stages = 3 : i64, swizzle = {kind = "xor", bits = 3 : i64, base = 3 : i64, shift = 3 : i64},
      lane_map = {kind = "mma_sync", shape = array<i64: 16, 8, 16>}, barrier = "producer_consumer"}}
      : (tensor<256x64xf16>, tensor<64x256xf16>) -> tensor<256x256xf32>
  return %c : tensor<256x256xf32>
}

// CHECK-LABEL: func.func @fused
// CHECK: "tracea.fused_gemm"(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}) {epilogue = [{kind = "bias_add"}, {kind = "scale", value = 5.000000e-01 : f64}, {kind = "relu"}, {approximate = "erf", kind = "gelu"}, {approximate = "tanh", kind = "gelu"}, {kind = "sigmoid"}, {kind = "silu"}, {kind = "residual_add"}], operandSegmentSizes = array<i32: 1, 1, 1, 1>}
func.func @fused(%a: tensor<8x16xf32>, %b: tensor<16x4xf32>, %bias: tensor<4xf32>, %res: tensor<8x4xf32>) -> tensor<8x4xf32> {
  %c = "tracea.fused_gemm"(%a, %b, %bias, %res) {epilogue = [{kind = "bias_add"}, {kind = "scale", value = 0.5 : f64},
      {kind = "relu"}, {kind = "gelu", approximate = "erf"}, {kind = "gelu", approximate = "tanh"}, {kind = "sigmoid"},
      {kind = "silu"}, {kind = "residual_add"}], operandSegmentSizes = array<i32: 1, 1, 1, 1>}
      : (tensor<8x16xf32>, tensor<16x4xf32>, tensor<4xf32>, tensor<8x4xf32>) -> tensor<8x4xf32>
  return %c : tensor<8x4xf32>
}

// CHECK-LABEL: func.func @softmax
// CHECK: "tracea.softmax"(%{{.*}}) {axis = 1 : i64} : (tensor<4x10x3xf32>) -> tensor<4x10x3xf32>
func.func @softmax(%x: tensor<4x10x3xf32>) -> tensor<4x10x3xf32> {
  %y = "tracea.softmax"(%x) {axis = 1 : i64} : (tensor<4x10x3xf32>) -> tensor<4x10x3xf32>
  return %y : tensor<4x10x3xf32>
}

// CHECK-LABEL: func.func @conv
// CHECK: "tracea.conv2d"(%{{.*}}, %{{.*}}, %{{.*}}) {dilation = array<i64: 1, 1>, groups = 2 : i64, layout = "nchw", padding = array<i64: 1, 1>, stride = array<i64: 2, 2>} : (tensor<1x4x9x9xf32>, tensor<6x2x3x3xf32>, tensor<6xf32>) -> tensor<1x6x5x5xf32>
func.func @conv(%x: tensor<1x4x9x9xf32>, %w: tensor<6x2x3x3xf32>, %b: tensor<6xf32>) -> tensor<1x6x5x5xf32> {
  %y = "tracea.conv2d"(%x, %w, %b) {layout = "nchw", stride = array<i64: 2, 2>, padding = array<i64: 1, 1>,
      dilation = array<i64: 1, 1>, groups = 2 : i64} : (tensor<1x4x9x9xf32>, tensor<6x2x3x3xf32>, tensor<6xf32>) -> tensor<1x6x5x5xf32>
  return %y : tensor<1x6x5x5xf32>
}

// CHECK-LABEL: func.func @conv_nhwc
// CHECK: "tracea.conv2d"(%{{.*}}, %{{.*}}) {dilation = array<i64: 2, 2>, layout = "nhwc", padding = array<i64: 0, 1, 2, 3>} : (tensor<2x8x8x3xf16>, tensor<3x3x3x5xf16>) -> tensor<2x5x9x5xf16>
func.func @conv_nhwc(%x: tensor<2x8x8x3xf16>, %w: tensor<3x3x3x5xf16>) -> tensor<2x5x9x5xf16> {
  %y = "tracea.conv2d"(%x, %w) {layout = "nhwc", padding = array<i64: 0, 1, 2, 3>, dilation = array<i64: 2, 2>}
      : (tensor<2x8x8x3xf16>, tensor<3x3x3x5xf16>) -> tensor<2x5x9x5xf16>
  return %y : tensor<2x5x9x5xf16>
}

// CHECK-LABEL: func.func @attention
// CHECK: "tracea.attention"(%{{.*}}, %{{.*}}, %{{.*}}) {causal = true, scale = 1.250000e-01 : f64} : (tensor<1x8x128x64xbf16>, tensor<1x8x96x64xbf16>, tensor<1x8x96x32xbf16>) -> tensor<1x8x128x32xbf16>
func.func @attention(%q: tensor<1x8x128x64xbf16>, %k: tensor<1x8x96x64xbf16>, %v: tensor<1x8x96x32xbf16>) -> tensor<1x8x128x32xbf16> {
  %o = "tracea.attention"(%q, %k, %v) {causal = true, scale = 0.125 : f64}
      : (tensor<1x8x128x64xbf16>, tensor<1x8x96x64xbf16>, tensor<1x8x96x32xbf16>) -> tensor<1x8x128x32xbf16>
  return %o : tensor<1x8x128x32xbf16>
}
