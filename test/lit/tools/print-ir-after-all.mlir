// --mlir-print-ir-after-all shows the IR after Tracea's Python passes and upstream ones alike;
// stdin works as input and -o writes the output file.
// RUN: tracea-opt --pass-pipeline='builtin.module(tracea-lower-to-linalg, canonicalize)' --mlir-print-ir-after-all -o %t < %s 2>&1 | FileCheck %s
// RUN: FileCheck %s --check-prefix=OUT < %t
// CHECK: // -----// IR Dump After tracea-lower-to-linalg (tracea-lower-to-linalg) //----- //
// CHECK: linalg.generic
// CHECK: // -----// IR Dump After Canonicalizer (canonicalize) //----- //
// OUT: func.func @relu
// OUT-NOT: tracea.
func.func @relu(%a: tensor<2x2xf32>, %b: tensor<2x2xf32>) -> tensor<2x2xf32> {
  %c = "tracea.fused_gemm"(%a, %b) {epilogue = [{kind = "relu"}], operandSegmentSizes = array<i32: 1, 1, 0, 0>} : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
  return %c : tensor<2x2xf32>
}
