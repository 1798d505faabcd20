// RUN: tracea-opt --list-passes | FileCheck %s
// CHECK: Tracea passes:
// CHECK: tracea-cpu-abi: give each public tensor function a C entry point
// CHECK: tracea-cpu-conv: run conv2d (groups = 1) on CPU kernels: NCHW f32 directly (phase planes, no transposes)
// CHECK: tracea-cpu-copies-to-linalg: after bufferization: each memref.copy
// CHECK: tracea-cpu-kernels: replace gemm / fused_gemm / attention / softmax ops by the vectorized CPU kernel of their variant
// CHECK-NEXT: threads=<int>  threads the kernels will run on (0: the host's cores) [default: 0]
// CHECK: tracea-cpu-tile-linalg: split each linalg.generic no kernel took among the threads
// CHECK-NEXT: threads=<int>
// CHECK-NEXT: min-work=<int>
// CHECK: tracea-lower-to-linalg: replace tracea ops by linalg/tensor/arith/math ops on tensors
// CHECK-NEXT: strategy=<str>  how each op is written in linalg (one of: reference) [default: reference]
// CHECK: tracea-select-variant: choose each gemm / fused_gemm / conv2d / attention / softmax op's kernel variant
// CHECK-NEXT: arch=<str>
// CHECK-NEXT: threads=<int>
// CHECK: tracea-verify:
// CHECK: Tracea pipelines
// CHECK: tracea-cpu: the whole CPU path: tracea ops to the LLVM dialect (parallel loops run serially)
// CHECK-NEXT: = tracea-cpu-tiled, tracea-cpu-bufferize, tracea-cpu-copies-to-linalg, linalg-generalize-named-ops, tracea-cpu-tile-linalg, tracea-cpu-to-llvm
