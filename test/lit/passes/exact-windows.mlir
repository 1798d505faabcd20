// A max pool 3/2 on a 4 x 4 map reads rows and columns 0-2: its input is cut to 3 x 3, so that
// folding the unit output dims leaves a valid op (before, the op claimed all 4 rows for a loop
// of 3 and the max ran over the whole map).
// RUN: tracea-opt %s --pass-pipeline='builtin.module(linalg-generalize-named-ops, tracea-exact-windows, linalg-fold-unit-extent-dims)' | FileCheck %s

// CHECK-LABEL: func.func @pool
// CHECK: %[[CUT:.+]] = tensor.extract_slice %arg0[0, 0, 0, 0] [1, 2, 3, 3] [1, 1, 1, 1] : tensor<1x2x4x4xf32> to tensor<2x3x3xf32>
// CHECK: linalg.generic {{.*}} ins(%[[CUT]], %{{.*}} : tensor<2x3x3xf32>, tensor<3x3xf32>)
func.func @pool(%x: tensor<1x2x4x4xf32>) -> tensor<1x2x1x1xf32> {
  %window = tensor.empty() : tensor<3x3xf32>
  %init = arith.constant dense<0xFF800000> : tensor<1x2x1x1xf32>
  %y = linalg.pooling_nchw_max {dilations = dense<1> : vector<2xi64>, strides = dense<2> : vector<2xi64>}
       ins(%x, %window : tensor<1x2x4x4xf32>, tensor<3x3xf32>) outs(%init : tensor<1x2x1x1xf32>) -> tensor<1x2x1x1xf32>
  return %y : tensor<1x2x1x1xf32>
}

// Windows that reach the input's end, and dynamic shapes, are left as they are.
// CHECK-LABEL: func.func @exact
// CHECK-NOT: tensor.extract_slice
func.func @exact(%x: tensor<1x2x5x5xf32>, %d: tensor<1x2x?x5xf32>, %o: tensor<1x2x?x2xf32>) -> (tensor<1x2x2x2xf32>, tensor<1x2x?x2xf32>) {
  %window = tensor.empty() : tensor<3x3xf32>
  %init = arith.constant dense<0xFF800000> : tensor<1x2x2x2xf32>
  %y = linalg.pooling_nchw_max {dilations = dense<1> : vector<2xi64>, strides = dense<2> : vector<2xi64>}
       ins(%x, %window : tensor<1x2x5x5xf32>, tensor<3x3xf32>) outs(%init : tensor<1x2x2x2xf32>) -> tensor<1x2x2x2xf32>
  %z = linalg.pooling_nchw_max {dilations = dense<1> : vector<2xi64>, strides = dense<2> : vector<2xi64>}
       ins(%d, %window : tensor<1x2x?x5xf32>, tensor<3x3xf32>) outs(%o : tensor<1x2x?x2xf32>) -> tensor<1x2x?x2xf32>
  return %y, %z : tensor<1x2x2x2xf32>, tensor<1x2x?x2xf32>
}
