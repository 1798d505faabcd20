// Each loop nest of a bufferized function moves into a function of its own; identical nests (a
// model's repeated layers) share one; constants are copied in, not passed; the function left
// with only glue is marked for LLVM not to optimize.
// RUN: tracea-opt %s --pass-pipeline='builtin.module(tracea-outline-loops)' | FileCheck %s

// CHECK-LABEL: func.func @two_layers(
// CHECK-SAME: passthrough = ["noinline", "optnone"]
// CHECK: call @_tracea_loop_0(%arg0, %arg1)
// CHECK: call @_tracea_loop_0(%arg1, %arg2)
// CHECK: call @_tracea_loop_1(%arg2)
// CHECK-NOT: scf.for
// CHECK: return
func.func @two_layers(%a: memref<8xf32>, %b: memref<8xf32>, %c: memref<8xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c8 = arith.constant 8 : index
  %two = arith.constant 2.0 : f32
  scf.for %i = %c0 to %c8 step %c1 {
    %x = memref.load %a[%i] : memref<8xf32>
    %y = arith.mulf %x, %two : f32
    memref.store %y, %b[%i] : memref<8xf32>
  }
  scf.for %i = %c0 to %c8 step %c1 {
    %x = memref.load %b[%i] : memref<8xf32>
    %y = arith.mulf %x, %two : f32
    memref.store %y, %c[%i] : memref<8xf32>
  }
  scf.for %i = %c0 to %c8 step %c1 {
    %x = memref.load %c[%i] : memref<8xf32>
    %y = arith.addf %x, %two : f32
    memref.store %y, %c[%i] : memref<8xf32>
  }
  return
}
// CHECK: func.func private @_tracea_loop_0(%[[IN:.*]]: memref<8xf32>, %[[OUT:.*]]: memref<8xf32>)
// CHECK-DAG: arith.constant 8 : index
// CHECK-DAG: %[[TWO:.*]] = arith.constant 2.0
// CHECK: scf.for
// CHECK: arith.mulf %{{.*}}, %[[TWO]]
// CHECK: func.func private @_tracea_loop_1(%{{.*}}: memref<8xf32>)
// CHECK: arith.addf
// CHECK-NOT: func.func
