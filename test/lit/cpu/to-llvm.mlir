// The whole CPU path ends in the LLVM dialect with a C-interface wrapper per entry point.
// RUN: tracea-opt %s --pass-pipeline='builtin.module(tracea-cpu)' | FileCheck %s

// CHECK-NOT: tracea.
// CHECK-NOT: linalg.
// CHECK-NOT: memref.
// CHECK-DAG: llvm.func @malloc(i64) -> !llvm.ptr
// CHECK-DAG: llvm.func @free(!llvm.ptr)
// CHECK: llvm.func @_tracea_entry_softmax_rows(
// CHECK: llvm.intr.exp
// CHECK: llvm.fdiv
// CHECK: llvm.func @_mlir_ciface__tracea_entry_softmax_rows(%{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr)
func.func @softmax_rows(%x: tensor<3x5xf32>) -> tensor<3x5xf32> {
  %y = "tracea.softmax"(%x) : (tensor<3x5xf32>) -> tensor<3x5xf32>
  return %y : tensor<3x5xf32>
}
