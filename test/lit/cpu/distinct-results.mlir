// A function returning one buffer twice (a model layer that is an in-place ReLU of its input
// returns the input's new value and its output, the same value) returns a copy for the repeat:
// MLIR's buffer-results-to-out-params{hoist-static-allocs} crashed the compiler on `return %x, %x`.
// RUN: tracea-opt %s --pass-pipeline='builtin.module(tracea-cpu-distinct-results, buffer-results-to-out-params{hoist-static-allocs=true})' | FileCheck %s

// CHECK-LABEL: func.func private @twice(
// CHECK-SAME: %[[A:.+]]: memref<4xf32>, %[[R0:.+]]: memref<4xf32>, %[[R1:.+]]: memref<4xf32>)
// CHECK: memref.copy %[[A]], %[[R0]]
// CHECK: memref.copy %[[R0]], %[[R1]]
// CHECK: return
func.func private @twice(%a: memref<4xf32>) -> (memref<4xf32>, memref<4xf32>) {
  %x = memref.alloc() : memref<4xf32>
  memref.copy %a, %x : memref<4xf32> to memref<4xf32>
  return %x, %x : memref<4xf32>, memref<4xf32>
}

// Dynamic sizes are read from the returned buffer; a value returned once is left alone.
// CHECK-LABEL: func.func private @dynamic(
// CHECK: %[[D:.+]] = memref.dim %arg0
// CHECK: %[[C:.+]] = memref.alloc(%[[D]]) : memref<?x4xf32>
// CHECK: memref.copy %arg0, %[[C]]
// CHECK: memref.copy %arg1, %arg2
// CHECK: memref.copy %arg0, %arg3
// CHECK: memref.copy %[[C]], %arg4
func.func private @dynamic(%a: memref<?x4xf32>, %b: memref<2xf32>) -> (memref<2xf32>, memref<?x4xf32>, memref<?x4xf32>) {
  return %b, %a, %a : memref<2xf32>, memref<?x4xf32>, memref<?x4xf32>
}
