// RUN: tracea-opt %s --split-input-file --pass-pipeline='builtin.module(tracea-raise-linalg, canonicalize)' | FileCheck %s
// Q K^T plus a bias computed from indices alone (0 where key j <= query i, else -inf: "not j > i",
// written with xori), softmax over the keys, times V: one causal tracea.attention.
// CHECK-LABEL: func.func @causal
// CHECK: "tracea.attention"(%arg0, %arg1, %arg2) {causal = true, scale = 1.000000e+00 : f64}
// CHECK-NOT: linalg.batch_matmul
// CHECK-NOT: tracea.softmax
#id = affine_map<(d0, d1, d2) -> (d0, d1, d2)>
#plane = affine_map<(d0, d1, d2) -> (d1, d2)>
#row = affine_map<(d0, d1, d2) -> (d0, d1)>
#ij = affine_map<(d0, d1) -> (d0, d1)>
func.func @causal(%q: tensor<2x4x8xf32>, %k: tensor<2x4x8xf32>, %v: tensor<2x4x8xf32>) -> tensor<2x4x8xf32> {
  %zero = arith.constant 0.0 : f32
  %ninf = arith.constant 0xFF800000 : f32
  %true = arith.constant true
  %e = tensor.empty() : tensor<4x4xf32>
  %bias = linalg.generic {indexing_maps = [#ij], iterator_types = ["parallel", "parallel"]} outs(%e : tensor<4x4xf32>) {
  ^bb0(%out: f32):
    %i = linalg.index 0 : index
    %j = linalg.index 1 : index
    %ii = arith.index_cast %i : index to i64
    %jj = arith.index_cast %j : index to i64
    %later = arith.cmpi sgt, %jj, %ii : i64
    %keep = arith.xori %later, %true : i1
    %b = arith.select %keep, %zero, %ninf : f32
    linalg.yield %b : f32
  } -> tensor<4x4xf32>
  %kt0 = tensor.empty() : tensor<2x8x4xf32>
  %kt = linalg.transpose ins(%k : tensor<2x4x8xf32>) outs(%kt0 : tensor<2x8x4xf32>) permutation = [0, 2, 1]
  %s0 = tensor.empty() : tensor<2x4x4xf32>
  %sf = linalg.fill ins(%zero : f32) outs(%s0 : tensor<2x4x4xf32>) -> tensor<2x4x4xf32>
  %s = linalg.batch_matmul ins(%q, %kt : tensor<2x4x8xf32>, tensor<2x8x4xf32>) outs(%sf : tensor<2x4x4xf32>) -> tensor<2x4x4xf32>
  %masked = linalg.generic {indexing_maps = [#id, #plane, #id], iterator_types = ["parallel", "parallel", "parallel"]} ins(%s, %bias : tensor<2x4x4xf32>, tensor<4x4xf32>) outs(%s0 : tensor<2x4x4xf32>) {
  ^bb0(%a: f32, %b: f32, %out: f32):
    %r = arith.addf %a, %b : f32
    linalg.yield %r : f32
  } -> tensor<2x4x4xf32>
  %m0 = tensor.empty() : tensor<2x4xf32>
  %mf = linalg.fill ins(%ninf : f32) outs(%m0 : tensor<2x4xf32>) -> tensor<2x4xf32>
  %max = linalg.generic {indexing_maps = [#id, #row], iterator_types = ["parallel", "parallel", "reduction"]} ins(%masked : tensor<2x4x4xf32>) outs(%mf : tensor<2x4xf32>) {
  ^bb0(%a: f32, %out: f32):
    %r = arith.maximumf %a, %out : f32
    linalg.yield %r : f32
  } -> tensor<2x4xf32>
  %shifted = linalg.generic {indexing_maps = [#id, #row, #id], iterator_types = ["parallel", "parallel", "parallel"]} ins(%masked, %max : tensor<2x4x4xf32>, tensor<2x4xf32>) outs(%s0 : tensor<2x4x4xf32>) {
  ^bb0(%a: f32, %m: f32, %out: f32):
    %r = arith.subf %a, %m : f32
    linalg.yield %r : f32
  } -> tensor<2x4x4xf32>
  %exp = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel", "parallel"]} ins(%shifted : tensor<2x4x4xf32>) outs(%s0 : tensor<2x4x4xf32>) {
  ^bb0(%a: f32, %out: f32):
    %r = math.exp %a : f32
    linalg.yield %r : f32
  } -> tensor<2x4x4xf32>
  %zf = linalg.fill ins(%zero : f32) outs(%m0 : tensor<2x4xf32>) -> tensor<2x4xf32>
  %sum = linalg.generic {indexing_maps = [#id, #row], iterator_types = ["parallel", "parallel", "reduction"]} ins(%exp : tensor<2x4x4xf32>) outs(%zf : tensor<2x4xf32>) {
  ^bb0(%a: f32, %out: f32):
    %r = arith.addf %a, %out : f32
    linalg.yield %r : f32
  } -> tensor<2x4xf32>
  %p = linalg.generic {indexing_maps = [#id, #row, #id], iterator_types = ["parallel", "parallel", "parallel"]} ins(%exp, %sum : tensor<2x4x4xf32>, tensor<2x4xf32>) outs(%s0 : tensor<2x4x4xf32>) {
  ^bb0(%a: f32, %t: f32, %out: f32):
    %r = arith.divf %a, %t : f32
    linalg.yield %r : f32
  } -> tensor<2x4x4xf32>
  %o0 = tensor.empty() : tensor<2x4x8xf32>
  %of = linalg.fill ins(%zero : f32) outs(%o0 : tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  %o = linalg.batch_matmul ins(%p, %v : tensor<2x4x4xf32>, tensor<2x4x8xf32>) outs(%of : tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  return %o : tensor<2x4x8xf32>
}
// -----
// A bias that keeps one key past the diagonal is not torch's causal mask: nothing is raised to
// attention (the softmax and both gemms stay).
// CHECK-LABEL: func.func @shifted
// CHECK-NOT: tracea.attention
// CHECK: "tracea.softmax"
#id = affine_map<(d0, d1, d2) -> (d0, d1, d2)>
#plane = affine_map<(d0, d1, d2) -> (d1, d2)>
#row = affine_map<(d0, d1, d2) -> (d0, d1)>
#ij = affine_map<(d0, d1) -> (d0, d1)>
func.func @shifted(%q: tensor<2x4x8xf32>, %k: tensor<2x4x8xf32>, %v: tensor<2x4x8xf32>) -> tensor<2x4x8xf32> {
  %zero = arith.constant 0.0 : f32
  %ninf = arith.constant 0xFF800000 : f32
  %true = arith.constant true
  %e = tensor.empty() : tensor<4x4xf32>
  %bias = linalg.generic {indexing_maps = [#ij], iterator_types = ["parallel", "parallel"]} outs(%e : tensor<4x4xf32>) {
  ^bb0(%out: f32):
    %i = linalg.index 0 : index
    %j = linalg.index 1 : index
    %ii = arith.index_cast %i : index to i64
    %jj = arith.index_cast %j : index to i64
    %one = arith.constant 1 : i64
    %next = arith.addi %ii, %one : i64
    %later = arith.cmpi sgt, %jj, %next : i64
    %keep = arith.xori %later, %true : i1
    %b = arith.select %keep, %zero, %ninf : f32
    linalg.yield %b : f32
  } -> tensor<4x4xf32>
  %kt0 = tensor.empty() : tensor<2x8x4xf32>
  %kt = linalg.transpose ins(%k : tensor<2x4x8xf32>) outs(%kt0 : tensor<2x8x4xf32>) permutation = [0, 2, 1]
  %s0 = tensor.empty() : tensor<2x4x4xf32>
  %sf = linalg.fill ins(%zero : f32) outs(%s0 : tensor<2x4x4xf32>) -> tensor<2x4x4xf32>
  %s = linalg.batch_matmul ins(%q, %kt : tensor<2x4x8xf32>, tensor<2x8x4xf32>) outs(%sf : tensor<2x4x4xf32>) -> tensor<2x4x4xf32>
  %masked = linalg.generic {indexing_maps = [#id, #plane, #id], iterator_types = ["parallel", "parallel", "parallel"]} ins(%s, %bias : tensor<2x4x4xf32>, tensor<4x4xf32>) outs(%s0 : tensor<2x4x4xf32>) {
  ^bb0(%a: f32, %b: f32, %out: f32):
    %r = arith.addf %a, %b : f32
    linalg.yield %r : f32
  } -> tensor<2x4x4xf32>
  %m0 = tensor.empty() : tensor<2x4xf32>
  %mf = linalg.fill ins(%ninf : f32) outs(%m0 : tensor<2x4xf32>) -> tensor<2x4xf32>
  %max = linalg.generic {indexing_maps = [#id, #row], iterator_types = ["parallel", "parallel", "reduction"]} ins(%masked : tensor<2x4x4xf32>) outs(%mf : tensor<2x4xf32>) {
  ^bb0(%a: f32, %out: f32):
    %r = arith.maximumf %a, %out : f32
    linalg.yield %r : f32
  } -> tensor<2x4xf32>
  %shifted = linalg.generic {indexing_maps = [#id, #row, #id], iterator_types = ["parallel", "parallel", "parallel"]} ins(%masked, %max : tensor<2x4x4xf32>, tensor<2x4xf32>) outs(%s0 : tensor<2x4x4xf32>) {
  ^bb0(%a: f32, %m: f32, %out: f32):
    %r = arith.subf %a, %m : f32
    linalg.yield %r : f32
  } -> tensor<2x4x4xf32>
  %exp = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel", "parallel"]} ins(%shifted : tensor<2x4x4xf32>) outs(%s0 : tensor<2x4x4xf32>) {
  ^bb0(%a: f32, %out: f32):
    %r = math.exp %a : f32
    linalg.yield %r : f32
  } -> tensor<2x4x4xf32>
  %zf = linalg.fill ins(%zero : f32) outs(%m0 : tensor<2x4xf32>) -> tensor<2x4xf32>
  %sum = linalg.generic {indexing_maps = [#id, #row], iterator_types = ["parallel", "parallel", "reduction"]} ins(%exp : tensor<2x4x4xf32>) outs(%zf : tensor<2x4xf32>) {
  ^bb0(%a: f32, %out: f32):
    %r = arith.addf %a, %out : f32
    linalg.yield %r : f32
  } -> tensor<2x4xf32>
  %p = linalg.generic {indexing_maps = [#id, #row, #id], iterator_types = ["parallel", "parallel", "parallel"]} ins(%exp, %sum : tensor<2x4x4xf32>, tensor<2x4xf32>) outs(%s0 : tensor<2x4x4xf32>) {
  ^bb0(%a: f32, %t: f32, %out: f32):
    %r = arith.divf %a, %t : f32
    linalg.yield %r : f32
  } -> tensor<2x4x4xf32>
  %o0 = tensor.empty() : tensor<2x4x8xf32>
  %of = linalg.fill ins(%zero : f32) outs(%o0 : tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  %o = linalg.batch_matmul ins(%p, %v : tensor<2x4x4xf32>, tensor<2x4x8xf32>) outs(%of : tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  return %o : tensor<2x4x8xf32>
}
// -----
// An all-zero bias masks nothing: a plain attention.
// CHECK-LABEL: func.func @zero_bias
// CHECK: "tracea.attention"(%arg0, %arg1, %arg2) {scale = 1.000000e+00 : f64}
// CHECK-NOT: tracea.softmax
#id = affine_map<(d0, d1, d2) -> (d0, d1, d2)>
#plane = affine_map<(d0, d1, d2) -> (d1, d2)>
#row = affine_map<(d0, d1, d2) -> (d0, d1)>
#ij = affine_map<(d0, d1) -> (d0, d1)>
func.func @zero_bias(%q: tensor<2x4x8xf32>, %k: tensor<2x4x8xf32>, %v: tensor<2x4x8xf32>) -> tensor<2x4x8xf32> {
  %zero = arith.constant 0.0 : f32
  %ninf = arith.constant 0xFF800000 : f32
  %true = arith.constant true
  %bias = arith.constant dense<0.0> : tensor<4x4xf32>
  %kt0 = tensor.empty() : tensor<2x8x4xf32>
  %kt = linalg.transpose ins(%k : tensor<2x4x8xf32>) outs(%kt0 : tensor<2x8x4xf32>) permutation = [0, 2, 1]
  %s0 = tensor.empty() : tensor<2x4x4xf32>
  %sf = linalg.fill ins(%zero : f32) outs(%s0 : tensor<2x4x4xf32>) -> tensor<2x4x4xf32>
  %s = linalg.batch_matmul ins(%q, %kt : tensor<2x4x8xf32>, tensor<2x8x4xf32>) outs(%sf : tensor<2x4x4xf32>) -> tensor<2x4x4xf32>
  %masked = linalg.generic {indexing_maps = [#id, #plane, #id], iterator_types = ["parallel", "parallel", "parallel"]} ins(%s, %bias : tensor<2x4x4xf32>, tensor<4x4xf32>) outs(%s0 : tensor<2x4x4xf32>) {
  ^bb0(%a: f32, %b: f32, %out: f32):
    %r = arith.addf %a, %b : f32
    linalg.yield %r : f32
  } -> tensor<2x4x4xf32>
  %m0 = tensor.empty() : tensor<2x4xf32>
  %mf = linalg.fill ins(%ninf : f32) outs(%m0 : tensor<2x4xf32>) -> tensor<2x4xf32>
  %max = linalg.generic {indexing_maps = [#id, #row], iterator_types = ["parallel", "parallel", "reduction"]} ins(%masked : tensor<2x4x4xf32>) outs(%mf : tensor<2x4xf32>) {
  ^bb0(%a: f32, %out: f32):
    %r = arith.maximumf %a, %out : f32
    linalg.yield %r : f32
  } -> tensor<2x4xf32>
  %shifted = linalg.generic {indexing_maps = [#id, #row, #id], iterator_types = ["parallel", "parallel", "parallel"]} ins(%masked, %max : tensor<2x4x4xf32>, tensor<2x4xf32>) outs(%s0 : tensor<2x4x4xf32>) {
  ^bb0(%a: f32, %m: f32, %out: f32):
    %r = arith.subf %a, %m : f32
    linalg.yield %r : f32
  } -> tensor<2x4x4xf32>
  %exp = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel", "parallel"]} ins(%shifted : tensor<2x4x4xf32>) outs(%s0 : tensor<2x4x4xf32>) {
  ^bb0(%a: f32, %out: f32):
    %r = math.exp %a : f32
    linalg.yield %r : f32
  } -> tensor<2x4x4xf32>
  %zf = linalg.fill ins(%zero : f32) outs(%m0 : tensor<2x4xf32>) -> tensor<2x4xf32>
  %sum = linalg.generic {indexing_maps = [#id, #row], iterator_types = ["parallel", "parallel", "reduction"]} ins(%exp : tensor<2x4x4xf32>) outs(%zf : tensor<2x4xf32>) {
  ^bb0(%a: f32, %out: f32):
    %r = arith.addf %a, %out : f32
    linalg.yield %r : f32
  } -> tensor<2x4xf32>
  %p = linalg.generic {indexing_maps = [#id, #row, #id], iterator_types = ["parallel", "parallel", "parallel"]} ins(%exp, %sum : tensor<2x4x4xf32>, tensor<2x4xf32>) outs(%s0 : tensor<2x4x4xf32>) {
  ^bb0(%a: f32, %t: f32, %out: f32):
    %r = arith.divf %a, %t : f32
    linalg.yield %r : f32
  } -> tensor<2x4x4xf32>
  %o0 = tensor.empty() : tensor<2x4x8xf32>
  %of = linalg.fill ins(%zero : f32) outs(%o0 : tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  %o = linalg.batch_matmul ins(%p, %v : tensor<2x4x4xf32>, tensor<2x4x8xf32>) outs(%of : tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  return %o : tensor<2x4x8xf32>
}
