// RUN: tracea-opt %s --split-input-file --pass-pipeline='builtin.module(tracea-lower-to-linalg)' | FileCheck %s
// bf16 inputs are widened to f32, accumulated in f32, and the result truncated back to bf16.
// CHECK-DAG: #[[A:.+]] = affine_map<(d0, d1, d2) -> (d0, d2)>
// CHECK-DAG: #[[BT:.+]] = affine_map<(d0, d1, d2) -> (d1, d2)>
// CHECK-LABEL: func.func @gemm_bf16
// CHECK-NOT: tracea.
// CHECK: %[[ACC:.+]] = linalg.fill ins(%{{.*}} : f32) outs(%{{.*}} : tensor<4x3xf32>)
// CHECK: linalg.generic {indexing_maps = [#[[A]], #[[BT]], #{{.+}}], iterator_types = ["parallel", "parallel", "reduction"]}
// CHECK-SAME: outs(%[[ACC]] : tensor<4x3xf32>)
// CHECK: arith.extf %{{.*}} : bf16 to f32
// CHECK: arith.mulf {{.*}} fastmath<contract>
// CHECK: arith.addf {{.*}} fastmath<contract>
// CHECK: arith.truncf %{{.*}} : f32 to bf16
// CHECK: return %{{.*}} : tensor<4x3xbf16>
func.func @gemm_bf16(%a: tensor<4x8xbf16>, %b: tensor<3x8xbf16>) -> tensor<4x3xbf16> {
  %c = "tracea.gemm"(%a, %b) {transpose_b = true} : (tensor<4x8xbf16>, tensor<3x8xbf16>) -> tensor<4x3xbf16>
  return %c : tensor<4x3xbf16>
}
// -----
// The epilogue runs in one elementwise generic over the accumulator: bias (broadcast over rows), relu, residual.
// CHECK-DAG: #[[BIAS:.+]] = affine_map<(d0, d1, d2) -> (d2)>
// CHECK-LABEL: func.func @fused
// CHECK: iterator_types = ["parallel", "parallel", "parallel", "reduction"]
// CHECK: linalg.generic {indexing_maps = [#{{.+}}, #[[BIAS]], #{{.+}}, #{{.+}}], iterator_types = ["parallel", "parallel", "parallel"]} ins(%{{.*}}, %arg2, %arg3 :
// CHECK: %[[B:.+]] = arith.addf %in, %in_0
// CHECK: %[[R:.+]] = arith.maximumf %[[B]]
// CHECK: arith.addf %[[R]], %in_1
func.func @fused(%a: tensor<2x4x8xf32>, %b: tensor<8x3xf32>, %bias: tensor<3xf32>, %r: tensor<2x4x3xf32>) -> tensor<2x4x3xf32> {
  %c = "tracea.fused_gemm"(%a, %b, %bias, %r) {epilogue = [{kind = "bias_add"}, {kind = "relu"}, {kind = "residual_add"}], operandSegmentSizes = array<i32: 1, 1, 1, 1>} : (tensor<2x4x8xf32>, tensor<8x3xf32>, tensor<3xf32>, tensor<2x4x3xf32>) -> tensor<2x4x3xf32>
  return %c : tensor<2x4x3xf32>
}
// -----
// Softmax along axis 0: a max reduction, a sum of exponentials, then the normalization.
// CHECK-LABEL: func.func @softmax
// CHECK: arith.constant 0xFF800000 : f32
// CHECK: iterator_types = ["reduction", "parallel"]
// CHECK: arith.maximumf
// CHECK: iterator_types = ["reduction", "parallel"]
// CHECK: math.exp
// CHECK: iterator_types = ["parallel", "parallel"]
// CHECK: arith.divf
// CHECK: arith.truncf %{{.*}} : f32 to f16
func.func @softmax(%x: tensor<4x10xf16>) -> tensor<4x10xf16> {
  %y = "tracea.softmax"(%x) {axis = 0 : i64} : (tensor<4x10xf16>) -> tensor<4x10xf16>
  return %y : tensor<4x10xf16>
}
// -----
// Grouped, strided, padded NCHW conv: pad, split channels into groups, one 8-loop generic, bias.
// CHECK-DAG: #[[IN:.+]] = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d0, d1, d5, d3 * 2 + d6, d4 * 2 + d7)>
// CHECK-LABEL: func.func @conv
// CHECK: tensor.pad %arg0 low[0, 0, 1, 1] high[0, 0, 1, 1]
// CHECK: tensor.expand_shape %{{.*}} {{\[\[}}0], [1, 2], [3], [4]] output_shape [1, 2, 2, 11, 11]
// CHECK: tensor.expand_shape %arg1 {{\[\[}}0, 1], [2], [3], [4]] output_shape [2, 3, 2, 3, 3]
// CHECK: linalg.generic {indexing_maps = [#[[IN]], {{.*}} iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel", "reduction", "reduction", "reduction"]}
// CHECK: tensor.collapse_shape %{{.*}} {{\[\[}}0], [1, 2], [3], [4]] : tensor<1x2x3x5x5xf32> into tensor<1x6x5x5xf32>
// CHECK: ins(%{{.*}}, %arg2 : tensor<1x6x5x5xf32>, tensor<6xf32>)
func.func @conv(%x: tensor<1x4x9x9xf32>, %w: tensor<6x2x3x3xf32>, %b: tensor<6xf32>) -> tensor<1x6x5x5xf32> {
  %y = "tracea.conv2d"(%x, %w, %b) {stride = array<i64: 2, 2>, padding = array<i64: 1, 1>, groups = 2 : i64} : (tensor<1x4x9x9xf32>, tensor<6x2x3x3xf32>, tensor<6xf32>) -> tensor<1x6x5x5xf32>
  return %y : tensor<1x6x5x5xf32>
}
// -----
// NHWC with dilation 2: the window index is oh + kh * 2; no padding, no bias.
// CHECK-DAG: #[[IN:.+]] = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d0, d1 + d5 * 2, d2 + d6 * 2, d3, d7)>
// CHECK-DAG: #[[FLT:.+]] = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d5, d6, d7, d3, d4)>
// CHECK-LABEL: func.func @conv_nhwc
// CHECK-NOT: tensor.pad
// CHECK: linalg.generic {indexing_maps = [#[[IN]], #[[FLT]], #{{.+}}]
// CHECK: tensor.collapse_shape {{.*}} into tensor<2x4x4x5xf32>
func.func @conv_nhwc(%x: tensor<2x8x8x3xf32>, %w: tensor<3x3x3x5xf32>) -> tensor<2x4x4x5xf32> {
  %y = "tracea.conv2d"(%x, %w) {layout = "nhwc", dilation = array<i64: 2, 2>} : (tensor<2x8x8x3xf32>, tensor<3x3x3x5xf32>) -> tensor<2x4x4x5xf32>
  return %y : tensor<2x4x4x5xf32>
}
// -----
// Reference attention: scores, scale (1/sqrt(8)) and the causal mask (key j > query i), softmax, P V.
// CHECK-LABEL: func.func @attention
// CHECK: linalg.generic {{.*}} ins(%arg0, %arg1 : tensor<2x16x8xf32>, tensor<2x12x8xf32>) outs(%{{.*}} : tensor<2x16x12xf32>)
// CHECK: arith.constant 0.353553385 : f32
// CHECK: %[[J:.+]] = linalg.index 2 : index
// CHECK: %[[I:.+]] = linalg.index 1 : index
// CHECK: %[[MASKED:.+]] = arith.cmpi ugt, %[[J]], %[[I]] : index
// CHECK: arith.select %[[MASKED]], %{{.*}}, %{{.*}} : f32
// CHECK: math.exp
// CHECK: linalg.generic {{.*}} ins(%{{.*}}, %arg2 : tensor<2x16x12xf32>, tensor<2x12x4xf32>) outs(%{{.*}} : tensor<2x16x4xf32>)
func.func @attention(%q: tensor<2x16x8xf32>, %k: tensor<2x12x8xf32>, %v: tensor<2x12x4xf32>) -> tensor<2x16x4xf32> {
  %o = "tracea.attention"(%q, %k, %v) {causal = true} : (tensor<2x16x8xf32>, tensor<2x12x8xf32>, tensor<2x12x4xf32>) -> tensor<2x16x4xf32>
  return %o : tensor<2x16x4xf32>
}
