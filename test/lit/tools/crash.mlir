// An assertion inside an upstream pass (this LLVM build asserts on i1 memref stores) is an
// internal compiler error: reported with the assertion and a saved reproducer (exit status 2,
// checked in test_opt.py), and tracea-opt itself survives to say so.
// RUN: not tracea-opt %s --pass-pipeline='builtin.module(finalize-memref-to-llvm)' 2> %t.err
// RUN: FileCheck %s < %t.err
// CHECK: tracea-opt: internal compiler error: the MLIR pass pipeline was killed by signal 6 (SIGABRT)
// CHECK-NEXT: Assertion `integralElementType.getWidth() >= 8' failed.
// CHECK-NEXT: the input was saved to [[REPRO:.*\.mlir]]
// CHECK-NEXT: reproduce with: tracea-opt [[REPRO]] --pass-pipeline='builtin.module(finalize-memref-to-llvm)'

func.func @store_i1(%m: memref<4xi1>, %v: i1) {
  %c0 = arith.constant 0 : index
  memref.store %v, %m[%c0] : memref<4xi1>
  return
}
