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
// A bias that keeps one key past the diagonal is not torch's causal mask: attention with the bias
// as its mask operand (one plane, [1, Sq, Skv]), not causal; the softmax and both gemms gone.
// CHECK-LABEL: func.func @shifted
// CHECK-NOT: causal
// CHECK: "tracea.attention"(%arg0, %arg1, %arg2, %{{.*}}) {scale = 1.000000e+00 : f64} : ({{.*}}, tensor<1x4x4xf32>) -> tensor<2x4x8xf32>
// CHECK-NOT: tracea.softmax
// CHECK-NOT: tracea.gemm
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

// -----
// torch-mlir's own lowering of SDPA over a key length known at run time only (a decoding step over a
// KV cache that grows): the scale after Q K^T, a max carrying an argmax. One tracea.attention whose
// key and value keep their `?` length.
// CHECK-LABEL: func.func @main
// CHECK: "tracea.attention"({{.*}}) {scale = 1.250000e-01 : f64} : (tensor<2x1x8xf32>, tensor<2x?x8xf32>, tensor<2x?x8xf32>) -> tensor<2x1x8xf32>
// CHECK-NOT: linalg.batch_matmul
// CHECK-NOT: math.exp
#map = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
#map1 = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>
#map2 = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, 0)>
func.func @main(%arg0: tensor<1x2x1x8xf32>, %arg1: tensor<1x2x?x8xf32>, %arg2: tensor<1x2x?x8xf32>) -> tensor<1x2x1x8xf32> {
  %c0_i64 = arith.constant 0 : i64
  %c2 = arith.constant 2 : index
  %cst = arith.constant 0.000000e+00 : f32
  %cst_0 = arith.constant 0xFF800000 : f32
  %cst_1 = arith.constant 1.250000e-01 : f32
  %dim = tensor.dim %arg1, %c2 : tensor<1x2x?x8xf32>
  %0 = tensor.empty(%dim) : tensor<1x2x8x?xf32>
  %transposed = linalg.transpose ins(%arg1 : tensor<1x2x?x8xf32>) outs(%0 : tensor<1x2x8x?xf32>) permutation = [0, 1, 3, 2] 
  %collapsed = tensor.collapse_shape %arg0 [[0, 1], [2], [3]] : tensor<1x2x1x8xf32> into tensor<2x1x8xf32>
  %collapsed_2 = tensor.collapse_shape %transposed [[0, 1], [2], [3]] : tensor<1x2x8x?xf32> into tensor<2x8x?xf32>
  %1 = tensor.empty(%dim) : tensor<2x1x?xf32>
  %2 = linalg.fill ins(%cst : f32) outs(%1 : tensor<2x1x?xf32>) -> tensor<2x1x?xf32>
  %3 = linalg.batch_matmul ins(%collapsed, %collapsed_2 : tensor<2x1x8xf32>, tensor<2x8x?xf32>) outs(%2 : tensor<2x1x?xf32>) -> tensor<2x1x?xf32>
  %expanded = tensor.expand_shape %3 [[0, 1], [2], [3]] output_shape [1, 2, 1, %dim] : tensor<2x1x?xf32> into tensor<1x2x1x?xf32>
  %4 = tensor.empty(%dim) : tensor<1x2x1x?xf32>
  %5 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%expanded : tensor<1x2x1x?xf32>) outs(%4 : tensor<1x2x1x?xf32>) {
  ^bb0(%in: f32, %out: f32):
    %23 = arith.mulf %in, %cst_1 : f32
    linalg.yield %23 : f32
  } -> tensor<1x2x1x?xf32>
  %6 = tensor.empty() : tensor<1x2x1xi64>
  %7 = linalg.fill ins(%c0_i64 : i64) outs(%6 : tensor<1x2x1xi64>) -> tensor<1x2x1xi64>
  %8 = tensor.empty() : tensor<1x2x1xf32>
  %9 = linalg.fill ins(%cst_0 : f32) outs(%8 : tensor<1x2x1xf32>) -> tensor<1x2x1xf32>
  %10:2 = linalg.generic {indexing_maps = [#map, #map1, #map1], iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%5 : tensor<1x2x1x?xf32>) outs(%9, %7 : tensor<1x2x1xf32>, tensor<1x2x1xi64>) {
  ^bb0(%in: f32, %out: f32, %out_8: i64):
    %23 = linalg.index 3 : index
    %24 = arith.index_cast %23 : index to i64
    %25 = arith.maximumf %in, %out : f32
    %26 = arith.cmpf ogt, %in, %out : f32
    %27 = arith.select %26, %24, %out_8 : i64
    linalg.yield %25, %27 : f32, i64
  } -> (tensor<1x2x1xf32>, tensor<1x2x1xi64>)
  %expanded_3 = tensor.expand_shape %10#0 [[0], [1], [2, 3]] output_shape [1, 2, 1, 1] : tensor<1x2x1xf32> into tensor<1x2x1x1xf32>
  %11 = linalg.generic {indexing_maps = [#map, #map2, #map], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%5, %expanded_3 : tensor<1x2x1x?xf32>, tensor<1x2x1x1xf32>) outs(%4 : tensor<1x2x1x?xf32>) {
  ^bb0(%in: f32, %in_8: f32, %out: f32):
    %23 = arith.subf %in, %in_8 : f32
    linalg.yield %23 : f32
  } -> tensor<1x2x1x?xf32>
  %12 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%11 : tensor<1x2x1x?xf32>) outs(%4 : tensor<1x2x1x?xf32>) {
  ^bb0(%in: f32, %out: f32):
    %23 = math.exp %in : f32
    linalg.yield %23 : f32
  } -> tensor<1x2x1x?xf32>
  %13 = tensor.empty() : tensor<1x2x1x1xf32>
  %14 = linalg.fill ins(%cst : f32) outs(%13 : tensor<1x2x1x1xf32>) -> tensor<1x2x1x1xf32>
  %15 = linalg.generic {indexing_maps = [#map, #map2], iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%12 : tensor<1x2x1x?xf32>) outs(%14 : tensor<1x2x1x1xf32>) {
  ^bb0(%in: f32, %out: f32):
    %23 = arith.addf %in, %out : f32
    linalg.yield %23 : f32
  } -> tensor<1x2x1x1xf32>
  %16 = linalg.generic {indexing_maps = [#map, #map2, #map], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%12, %15 : tensor<1x2x1x?xf32>, tensor<1x2x1x1xf32>) outs(%4 : tensor<1x2x1x?xf32>) {
  ^bb0(%in: f32, %in_8: f32, %out: f32):
    %23 = arith.divf %in, %in_8 : f32
    linalg.yield %23 : f32
  } -> tensor<1x2x1x?xf32>
  %dim_4 = tensor.dim %arg2, %c2 : tensor<1x2x?x8xf32>
  %17 = arith.index_cast %dim : index to i64
  %18 = arith.index_cast %dim_4 : index to i64
  %19 = arith.cmpi eq, %17, %18 : i64
  cf.assert %19, "mismatching contracting dimension"
  %collapsed_5 = tensor.collapse_shape %16 [[0, 1], [2], [3]] : tensor<1x2x1x?xf32> into tensor<2x1x?xf32>
  %collapsed_6 = tensor.collapse_shape %arg2 [[0, 1], [2], [3]] : tensor<1x2x?x8xf32> into tensor<2x?x8xf32>
  %20 = tensor.empty() : tensor<2x1x8xf32>
  %21 = linalg.fill ins(%cst : f32) outs(%20 : tensor<2x1x8xf32>) -> tensor<2x1x8xf32>
  %22 = linalg.batch_matmul ins(%collapsed_5, %collapsed_6 : tensor<2x1x?xf32>, tensor<2x?x8xf32>) outs(%21 : tensor<2x1x8xf32>) -> tensor<2x1x8xf32>
  %expanded_7 = tensor.expand_shape %22 [[0, 1], [2], [3]] output_shape [1, 2, 1, 8] : tensor<2x1x8xf32> into tensor<1x2x1x8xf32>
  return %expanded_7 : tensor<1x2x1x8xf32>
}
