# The Python builder API produces tracea ops with the caller's source location.
# RUN: %PYTHON %s | FileCheck %s
from tracea import dialects as td


# CHECK-LABEL: func.func @block
# CHECK-SAME: (%arg0: tensor<2x16x32xf32>, %arg1: tensor<32x32xf32>, %arg2: tensor<32xf32>)
@td.function(td.tensor((2, 16, 32)), td.tensor((32, 32)), td.tensor(32))
def block(x, w, b):
    # CHECK: %[[Q:.+]] = "tracea.gemm"(%arg0, %arg1) : (tensor<2x16x32xf32>, tensor<32x32xf32>) -> tensor<2x16x32xf32>
    q = td.gemm(x, w)
    # CHECK: %[[A:.+]] = "tracea.attention"(%[[Q]], %[[Q]], %arg0) {causal = true} : (tensor<2x16x32xf32>, tensor<2x16x32xf32>, tensor<2x16x32xf32>) -> tensor<2x16x32xf32>
    a = td.attention(q, q, x, causal=True)
    # CHECK: %[[H:.+]] = "tracea.fused_gemm"(%[[A]], %arg1, %arg2, %arg0) {epilogue = [{kind = "bias_add"}, {approximate = "tanh", kind = "gelu"}, {kind = "residual_add"}], operandSegmentSizes = array<i32: 1, 1, 1, 1>, schedule = {stages = 2 : i64, tile = array<i64: 64, 64, 32>}}
    h = td.fused_gemm(a, w, [td.bias_add(b), td.gelu("tanh"), td.residual_add(x)],
                      schedule=td.Schedule(tile=(64, 64, 32), stages=2))
    # CHECK: "tracea.softmax"(%[[H]]) : (tensor<2x16x32xf32>) -> tensor<2x16x32xf32>
    return td.softmax(h)


print(block)
# Each op records where it was built:
# CHECK: #loc1 = loc("{{.*}}builder.py":11:1)
print(block.text())
