// Malformed input: file:line:col, exit status 1, no Python traceback.
// RUN: not tracea-opt %s 2>&1 | FileCheck %s
// CHECK: parse-error.mlir:8:28: error: expected ')' to end operand list
// CHECK-NOT: Traceback

func.func @f(%a: tensor<4x8xf32>, %b: tensor<8x3xf32>) -> tensor<4x3xf32> {
  // a missing parenthesis:
  %c = "tracea.gemm"(%a, %b : (tensor<4x8xf32>, tensor<8x3xf32>) -> tensor<4x3xf32>
  return %c : tensor<4x3xf32>
}
