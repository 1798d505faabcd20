// The whole CPU path ends in the LLVM dialect with a C-interface wrapper per entry point.
// RUN: tracea-opt %s --pass-pipeline='builtin.module(tracea-cpu)' | FileCheck %s

// No tracea op is left (the module keeps tracea.plan, what the passes chose, as an attribute).
// CHECK-NOT: tracea.{{(gemm|fused_gemm|softmax|conv2d|attention)}}
// CHECK-NOT: linalg.
// CHECK-NOT: memref.
// The kernel writes straight into the caller's buffer: no allocation at all.
// CHECK-NOT: @malloc
// The entry only calls the loop nest, outlined (tracea-outline-loops), and is left unoptimized.
// CHECK: llvm.func @_tracea_entry_softmax_rows(
// CHECK-SAME: passthrough = ["noinline", "optnone"]
// CHECK: llvm.call @_tracea_loop_0(
// CHECK: llvm.func @_mlir_ciface__tracea_entry_softmax_rows(%{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr)
// The vectorized softmax (a row in cache: its max, then exp as a polynomial on vectors of f32,
// summed across lanes as a tree), no libm call.
// CHECK: llvm.func internal @_tracea_loop_0(
// CHECK: llvm.intr.vector.reduce.fmaximum
// CHECK: llvm.intr.floor
// CHECK: llvm.intr.vector.reduce.fadd{{.*}}reassoc
// CHECK-NOT: llvm.call @expf
func.func @softmax_rows(%x: tensor<3x5xf32>) -> tensor<3x5xf32> {
  %y = "tracea.softmax"(%x) : (tensor<3x5xf32>) -> tensor<3x5xf32>
  return %y : tensor<3x5xf32>
}
