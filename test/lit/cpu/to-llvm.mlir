// The whole CPU path ends in the LLVM dialect with a C-interface wrapper per entry point.
// RUN: tracea-opt %s --pass-pipeline='builtin.module(tracea-cpu)' | FileCheck %s

// CHECK-NOT: tracea.
// CHECK-NOT: linalg.
// CHECK-NOT: memref.
// The kernel writes straight into the caller's buffer: no allocation at all.
// CHECK-NOT: @malloc
// The entry only calls the loop nest, outlined (tracea-outline-loops), and is left unoptimized.
// CHECK: llvm.func @_tracea_entry_softmax_rows(
// CHECK-SAME: passthrough = ["noinline", "optnone"]
// CHECK: llvm.call @_tracea_loop_0(
// CHECK: llvm.func @_mlir_ciface__tracea_entry_softmax_rows(%{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr)
// The vectorized softmax: exp as a polynomial on <16 x f32>-style vectors, no libm call.
// CHECK: llvm.func internal @_tracea_loop_0(
// CHECK: llvm.intr.floor
// CHECK: llvm.intr.vector.reduce.fmaximum
// CHECK-NOT: llvm.call @expf
func.func @softmax_rows(%x: tensor<3x5xf32>) -> tensor<3x5xf32> {
  %y = "tracea.softmax"(%x) : (tensor<3x5xf32>) -> tensor<3x5xf32>
  return %y : tensor<3x5xf32>
}
