// RUN: tracea-opt %s --split-input-file --pass-pipeline='builtin.module(tracea-channels-last{weights=3}, canonicalize)' | FileCheck %s
// conv 3x3 + bias -> ReLU -> max pool 3x3/2 (-inf pad) -> 1x1 conv, residual add of the pooled
// value, ReLU: computed NHWC, the filters HWCF, one transpose in and one out.
// CHECK: module attributes {tracea.weight_layouts = {"0" = array<i64: 2, 3, 1, 0>, "2" = array<i64: 2, 3, 1, 0>}}
// CHECK-LABEL: func.func @main
// CHECK-SAME: %arg0: tensor<3x3x4x8xf32>, %arg1: tensor<8xf32>, %arg2: tensor<1x1x8x8xf32>, %arg3: tensor<2x4x10x10xf32>
// CHECK: linalg.transpose ins(%{{.*}} : tensor<2x4x12x12xf32>) outs(%{{.*}} : tensor<2x12x12x4xf32>) permutation = [0, 2, 3, 1]
// CHECK: linalg.conv_2d_nhwc_hwcf
// CHECK-SAME: tensor<2x10x10x8xf32>
// CHECK: tensor.pad
// CHECK-SAME: low[0, 1, 1, 0] high[0, 1, 1, 0]
// CHECK-NOT: linalg.pooling
// CHECK: linalg.matmul ins(%{{.*}}, %{{.*}} : tensor<50x8xf32>, tensor<8x8xf32>)
// CHECK: linalg.transpose ins(%{{.*}} : tensor<2x5x5x8xf32>) outs(%{{.*}} : tensor<2x8x5x5xf32>) permutation = [0, 3, 1, 2]
// CHECK-NOT: linalg.transpose
// CHECK: return
#id = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
func.func @main(%w: tensor<8x4x3x3xf32>, %b: tensor<8xf32>, %w2: tensor<8x8x1x1xf32>, %x: tensor<2x4x10x10xf32>) -> tensor<2x8x5x5xf32> {
  %zero = arith.constant 0.0 : f32
  %ninf = arith.constant 0xFF800000 : f32
  %xp = tensor.pad %x low[0, 0, 1, 1] high[0, 0, 1, 1] {
  ^bb0(%i: index, %j: index, %k: index, %l: index):
    tensor.yield %zero : f32
  } : tensor<2x4x10x10xf32> to tensor<2x4x12x12xf32>
  %e = tensor.empty() : tensor<2x8x10x10xf32>
  %bias = linalg.broadcast ins(%b : tensor<8xf32>) outs(%e : tensor<2x8x10x10xf32>) dimensions = [0, 2, 3]
  %c = linalg.conv_2d_nchw_fchw {dilations = dense<1> : vector<2xi64>, strides = dense<1> : vector<2xi64>}
       ins(%xp, %w : tensor<2x4x12x12xf32>, tensor<8x4x3x3xf32>) outs(%bias : tensor<2x8x10x10xf32>) -> tensor<2x8x10x10xf32>
  %r = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
       ins(%c : tensor<2x8x10x10xf32>) outs(%e : tensor<2x8x10x10xf32>) {
  ^bb0(%in: f32, %out: f32):
    %m = arith.maximumf %in, %zero : f32
    linalg.yield %m : f32
  } -> tensor<2x8x10x10xf32>
  %rp = tensor.pad %r low[0, 0, 1, 1] high[0, 0, 1, 1] {
  ^bb0(%i: index, %j: index, %k: index, %l: index):
    tensor.yield %ninf : f32
  } : tensor<2x8x10x10xf32> to tensor<2x8x12x12xf32>
  %pe = tensor.empty() : tensor<2x8x5x5xf32>
  %pf = linalg.fill ins(%ninf : f32) outs(%pe : tensor<2x8x5x5xf32>) -> tensor<2x8x5x5xf32>
  %win = tensor.empty() : tensor<3x3xf32>
  %p = linalg.pooling_nchw_max {dilations = dense<1> : vector<2xi64>, strides = dense<2> : vector<2xi64>}
       ins(%rp, %win : tensor<2x8x12x12xf32>, tensor<3x3xf32>) outs(%pf : tensor<2x8x5x5xf32>) -> tensor<2x8x5x5xf32>
  %zf = linalg.fill ins(%zero : f32) outs(%pe : tensor<2x8x5x5xf32>) -> tensor<2x8x5x5xf32>
  %c2 = linalg.conv_2d_nchw_fchw {dilations = dense<1> : vector<2xi64>, strides = dense<1> : vector<2xi64>}
        ins(%p, %w2 : tensor<2x8x5x5xf32>, tensor<8x8x1x1xf32>) outs(%zf : tensor<2x8x5x5xf32>) -> tensor<2x8x5x5xf32>
  %s = linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
       ins(%c2, %p : tensor<2x8x5x5xf32>, tensor<2x8x5x5xf32>) outs(%pe : tensor<2x8x5x5xf32>) {
  ^bb0(%a: f32, %q: f32, %out: f32):
    %t = arith.addf %a, %q : f32
    %m = arith.maximumf %t, %zero : f32
    linalg.yield %m : f32
  } -> tensor<2x8x5x5xf32>
  return %s : tensor<2x8x5x5xf32>
}

// -----

// A depthwise conv in the module: nothing changes (all or nothing).
// CHECK-NOT: tracea.weight_layouts
// CHECK-LABEL: func.func @main
// CHECK: linalg.conv_2d_nchw_fchw
// CHECK: linalg.depthwise_conv_2d_nchw_chw
// CHECK-NOT: linalg.transpose
func.func @main(%w: tensor<4x4x3x3xf32>, %dw: tensor<4x3x3xf32>, %unused: tensor<1xf32>, %x: tensor<1x4x8x8xf32>) -> tensor<1x4x4x4xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<1x4x6x6xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<1x4x6x6xf32>) -> tensor<1x4x6x6xf32>
  %c = linalg.conv_2d_nchw_fchw ins(%x, %w : tensor<1x4x8x8xf32>, tensor<4x4x3x3xf32>) outs(%f : tensor<1x4x6x6xf32>) -> tensor<1x4x6x6xf32>
  %e2 = tensor.empty() : tensor<1x4x4x4xf32>
  %f2 = linalg.fill ins(%zero : f32) outs(%e2 : tensor<1x4x4x4xf32>) -> tensor<1x4x4x4xf32>
  %d = linalg.depthwise_conv_2d_nchw_chw ins(%c, %dw : tensor<1x4x6x6xf32>, tensor<4x3x3xf32>) outs(%f2 : tensor<1x4x4x4xf32>) -> tensor<1x4x4x4xf32>
  return %d : tensor<1x4x4x4xf32>
}
