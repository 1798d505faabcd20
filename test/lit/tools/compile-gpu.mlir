// tracea compile-gpu: MLIR in, an NVIDIA kernel artifact out (cubin + launch description), for a
// machine with a GPU; errors name the problem.
// RUN: rm -rf %t && tracea compile-gpu %s --chip sm_90a -o %t/linear | FileCheck %s
// RUN: FileCheck %s --check-prefix=JSON < %t/linear.json
// RUN: not tracea compile-gpu %s.missing -o %t/x 2>&1 | FileCheck %s --check-prefix=MISSING

// CHECK: linear for sm_90a: grid (1, 1, 1), block (160, 1, 1), 99328 bytes dynamic shared memory, {{[0-9]+}} registers; wrote {{.*}}linear.cubin and {{.*}}linear.json
// JSON: "format": "tracea-gpu-kernel-1"
// JSON: "name": "linear"
// JSON: "tensor_map": [
// MISSING: tracea: error: no such file: {{.*}}compile-gpu.mlir.missing
func.func @linear(%x: tensor<64x128xbf16>, %w: tensor<96x128xbf16>) -> tensor<64x96xf32> {
  %y = "tracea.gemm"(%x, %w) {transpose_b = true} : (tensor<64x128xbf16>, tensor<96x128xbf16>) -> tensor<64x96xf32>
  return %y : tensor<64x96xf32>
}
