// An index read from a tensor is clamped into its dim where it is used, and whether any was out
// of range is reduced beside the gather, over the loops the index depends on; the fault is
// counted once, after it; torch-mlir's asserts are gone (they called abort()).
// RUN: tracea-opt %s --pass-pipeline='builtin.module(tracea-check-indices)' | FileCheck %s

// CHECK: memref.global "private" @__tracea_index_faults : memref<i32> = dense<0>
// CHECK-LABEL: func.func @embedding(
// CHECK-NOT: cf.assert
// CHECK: %[[ANY:.*]] = linalg.generic {{.*}}iterator_types = ["reduction"]{{.*}} ins(%arg1 : tensor<3xi64>)
// CHECK: arith.cmpi ult
// CHECK: arith.ori
// CHECK: %[[BYTE:.*]] = tensor.extract %[[ANY]][] : tensor<i8>
// CHECK: %[[BAD:.*]] = arith.cmpi ne, %[[BYTE]]
// CHECK: scf.if %[[BAD]] {
// CHECK: memref.atomic_rmw addi
// CHECK: linalg.generic
// CHECK: %[[OK:.*]] = arith.cmpi ult, %[[ROW:.*]], %{{.*}} : index
// CHECK: %[[SAFE:.*]] = arith.select %[[OK]], %[[ROW]], %{{.*}} : index
// CHECK: tensor.extract %arg0[%[[SAFE]], %{{.*}}] : tensor<100x8xf32>
// CHECK-NOT: cf.assert
#map = affine_map<(d0, d1) -> (d0)>
#map1 = affine_map<(d0, d1) -> (d0, d1)>
func.func @embedding(%arg0: tensor<100x8xf32>, %arg1: tensor<3xi64>) -> tensor<3x8xf32> {
  %c100 = arith.constant 100 : index
  %c0_i64 = arith.constant 0 : i64
  %0 = tensor.empty() : tensor<3x8xf32>
  %1 = linalg.generic {indexing_maps = [#map, #map1], iterator_types = ["parallel", "parallel"]} ins(%arg1 : tensor<3xi64>) outs(%0 : tensor<3x8xf32>) {
  ^bb0(%in: i64, %out: f32):
    %2 = arith.index_cast %in : i64 to index
    %3 = linalg.index 1 : index
    %4 = arith.cmpi slt, %2, %c100 : index
    cf.assert %4, "index must be smaller than dim size"
    %5 = arith.cmpi sge, %in, %c0_i64 : i64
    cf.assert %5, "index must be larger or equal to 0"
    %extracted = tensor.extract %arg0[%2, %3] : tensor<100x8xf32>
    linalg.yield %extracted : f32
  } -> tensor<3x8xf32>
  return %1 : tensor<3x8xf32>
}
