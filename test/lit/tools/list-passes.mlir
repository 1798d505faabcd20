// RUN: tracea-opt --list-passes | FileCheck %s
// CHECK: Tracea passes:
// CHECK: tracea-cpu-abi: give each public tensor function a C entry point
// CHECK: tracea-lower-to-linalg: replace tracea ops by linalg/tensor/arith/math ops on tensors
// CHECK-NEXT: strategy=<str>  how each op is written in linalg (one of: reference) [default: reference]
// CHECK: tracea-verify:
// CHECK: Tracea pipelines
// CHECK: tracea-cpu: the whole CPU path
// CHECK-NEXT: = tracea-to-linalg, tracea-cpu-bufferize, tracea-cpu-to-llvm
