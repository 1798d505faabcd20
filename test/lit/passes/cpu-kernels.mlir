// tracea-select-variant picks each op's kernel variant and sizes a schedule for the device;
// tracea-cpu-kernels turns a gemm of the packed variant into blocked loops whose inner step is a
// register tile of vector FMAs.
// RUN: tracea-opt %s --pass-pipeline='builtin.module(tracea-select-variant{threads=2})' | FileCheck %s --check-prefix=SCHED
// RUN: tracea-opt %s --pass-pipeline='builtin.module(tracea-cpu-kernels)' | FileCheck %s

// An op's own schedule is kept; one without gets the device's.
// SCHED-LABEL: func.func @gemm
// SCHED: schedule = {lane_map = {kind = "simd", shape = array<i64: 4>}, tile = array<i64: 4, 16, 8>, warp_tile = array<i64: 2, 8, 1>}, tracea.variant = "cpu.gemm.packed"
// SCHED-LABEL: func.func @plain
// SCHED: "tracea.gemm"(%arg0, %arg1) {schedule = {lane_map = {kind = "simd", shape = array<i64: {{[0-9]+}}>}, tile = array<i64: {{[0-9]+}}, {{[0-9]+}}, {{[0-9]+}}>, warp_tile = array<i64: {{[0-9]+}}, {{[0-9]+}}, 1>}, tracea.variant = "cpu.gemm.packed"}

// A 2x8 register tile of 4-lane vectors: 2 x 2 accumulators, B packed in 8-wide strips.
// CHECK-LABEL: func.func @gemm
// CHECK: bufferization.to_buffer %arg0 read_only
// CHECK: memref.alloc() {alignment = 64 : i64} : memref<{{[0-9]+}}xf32>
// CHECK: scf.parallel
// CHECK: vector.load {{.*}} : memref<1x13x21xf32>, vector<4xf32>
// CHECK: scf.parallel
// CHECK: scf.for {{.*}} iter_args({{.*}}) -> (vector<4xf32>, vector<4xf32>, vector<4xf32>, vector<4xf32>)
// CHECK-COUNT-4: vector.fma
// CHECK: scf.yield
// CHECK: arith.maximumf {{.*}} : vector<4xf32>
// CHECK: vector.store {{.*}} : memref<1x7x21xf32>, vector<4xf32>
// CHECK: bufferization.to_tensor {{.*}} restrict writable
// CHECK-NOT: tracea.fused_gemm
func.func @gemm(%a: tensor<7x13xf32>, %b: tensor<13x21xf32>) -> tensor<7x21xf32> {
  %c = "tracea.fused_gemm"(%a, %b) {epilogue = [{kind = "relu"}], operandSegmentSizes = array<i32: 1, 1, 0, 0>,
       schedule = {tile = array<i64: 4, 16, 8>, warp_tile = array<i64: 2, 8, 1>, lane_map = {kind = "simd", shape = array<i64: 4>}}}
       : (tensor<7x13xf32>, tensor<13x21xf32>) -> tensor<7x21xf32>
  return %c : tensor<7x21xf32>
}

func.func @plain(%a: tensor<64x64xf32>, %b: tensor<64x64xf32>) -> tensor<64x64xf32> {
  %c = "tracea.gemm"(%a, %b) : (tensor<64x64xf32>, tensor<64x64xf32>) -> tensor<64x64xf32>
  return %c : tensor<64x64xf32>
}
