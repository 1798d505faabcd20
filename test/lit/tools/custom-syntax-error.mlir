// A tracea op in custom syntax: MLIR's parser fails without a diagnostic for unregistered ops;
// tracea-opt names the line and the generic form instead of exiting silently.
// RUN: not tracea-opt %s 2>&1 | FileCheck %s
// CHECK: custom-syntax-error.mlir:8:8: error: 'tracea.gemm' must be written in MLIR's generic form
// CHECK-NOT: Traceback

func.func @f(%a: tensor<4x8xf32>, %b: tensor<8x3xf32>) -> tensor<4x3xf32> {
  %c = tracea.gemm %a, %b : (tensor<4x8xf32>, tensor<8x3xf32>) -> tensor<4x3xf32>
  return %c : tensor<4x3xf32>
}
