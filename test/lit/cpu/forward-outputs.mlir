// RUN: tracea-opt %s --split-input-file --pass-pipeline='builtin.module(tracea-cpu-forward-outputs)' | FileCheck %s
// A result computed in a fresh buffer and copied whole into the caller's output buffer is
// computed in the output buffer instead, also when the copy reads it through a reshape (the pass
// runs before the deallocation pipeline: no deallocs yet).
// CHECK-LABEL: func.func @_tracea_entry_reshaped
// CHECK-NOT: memref.alloc
// CHECK: %[[VIEW:.+]] = memref.collapse_shape %arg1 {{\[}}[0], [1, 2]] : memref<2x3x4xf32> into memref<2x12xf32>
// CHECK: memref.store %{{.*}}, %[[VIEW]]
// CHECK-NOT: memref.copy
func.func @_tracea_entry_reshaped(%arg0: memref<2x12xf32>, %arg1: memref<2x3x4xf32>) {
  %c0 = arith.constant 0 : index
  %x = memref.load %arg0[%c0, %c0] : memref<2x12xf32>
  %buf = memref.alloc() : memref<2x12xf32>
  memref.store %x, %buf[%c0, %c0] : memref<2x12xf32>
  %view = memref.expand_shape %buf [[0], [1, 2]] output_shape [2, 3, 4] : memref<2x12xf32> into memref<2x3x4xf32>
  memref.copy %view, %arg1 : memref<2x3x4xf32> to memref<2x3x4xf32>
  return
}
// -----
// The buffer read after the copy keeps its own allocation.
// CHECK-LABEL: func.func @_tracea_entry_read_after
// CHECK: memref.alloc
// CHECK: memref.copy
func.func @_tracea_entry_read_after(%arg0: memref<2x12xf32>, %arg1: memref<2x3x4xf32>) -> f32 {
  %c0 = arith.constant 0 : index
  %x = memref.load %arg0[%c0, %c0] : memref<2x12xf32>
  %buf = memref.alloc() : memref<2x12xf32>
  memref.store %x, %buf[%c0, %c0] : memref<2x12xf32>
  %view = memref.expand_shape %buf [[0], [1, 2]] output_shape [2, 3, 4] : memref<2x12xf32> into memref<2x3x4xf32>
  memref.copy %view, %arg1 : memref<2x3x4xf32> to memref<2x3x4xf32>
  %y = memref.load %buf[%c0, %c0] : memref<2x12xf32>
  return %y : f32
}
