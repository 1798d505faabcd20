// A verifier error without --verify-diagnostics: reported at the op, exit status 1.
// RUN: not tracea-opt %s --pass-pipeline='builtin.module(tracea-lower-to-linalg)' 2>&1 | FileCheck %s
// CHECK: verify-error.mlir:7:8: error: 'tracea.softmax' op axis -3 is out of range for rank 2 (expected -2..1)
// CHECK-NOT: Traceback

func.func @f(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %y = "tracea.softmax"(%x) {axis = -3 : i64} : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return %y : tensor<4x8xf32>
}
