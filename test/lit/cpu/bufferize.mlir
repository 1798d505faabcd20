// The CPU ABI: each public tensor function gets a C entry point taking one memref per argument
// and per result; after bufferization the last op writes straight into the result buffer.
// RUN: tracea-opt %s --pass-pipeline='builtin.module(tracea-to-linalg, tracea-cpu-bufferize)' | FileCheck %s

// CHECK-NOT: func.func @mlp
// CHECK-LABEL: func.func @_tracea_entry_mlp(
// CHECK-SAME: %[[X:.+]]: memref<4x8xf32>, %[[W:.+]]: memref<8x3xf32>, %[[B:.+]]: memref<3xf32>, %[[OUT:.+]]: memref<4x3xf32>) attributes {llvm.emit_c_interface}
// CHECK: %[[ACC:.+]] = memref.alloc() {{.*}} : memref<4x3xf32>
// CHECK: linalg.generic {{.*}} ins(%[[X]], %[[W]] : memref<4x8xf32>, memref<8x3xf32>) outs(%[[ACC]] : memref<4x3xf32>)
// CHECK: linalg.generic {{.*}} ins(%[[ACC]], %[[B]] : memref<4x3xf32>, memref<3xf32>) outs(%[[OUT]] : memref<4x3xf32>)
// CHECK: math.tanh
// CHECK-NOT: memref.copy
// CHECK: memref.dealloc %[[ACC]]
// CHECK: return
func.func @mlp(%x: tensor<4x8xf32>, %w: tensor<8x3xf32>, %b: tensor<3xf32>) -> tensor<4x3xf32> {
  %y = "tracea.fused_gemm"(%x, %w, %b) {epilogue = [{kind = "bias_add"}, {kind = "gelu", approximate = "tanh"}], operandSegmentSizes = array<i32: 1, 1, 1, 0>} : (tensor<4x8xf32>, tensor<8x3xf32>, tensor<3xf32>) -> tensor<4x3xf32>
  return %y : tensor<4x3xf32>
}
