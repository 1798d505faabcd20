// tracea-gpu-kernels: a function's GEMM becomes an NVIDIA kernel with its launch configuration.
// f16 nn.Linear (B^T) + bias + relu: a 3-stage cp.async pipeline (prologue: tiles 0 and 1, one
// group each; loop: wait until one group is in flight, barrier, load tile k + 2, commit, compute),
// XOR-swizzled shared memory, ldmatrix + mma.sync m16n8k16, the epilogue on the accumulators.
// RUN: tracea-opt %s --pass-pipeline='builtin.module(tracea-gpu-kernels)' | FileCheck %s

// CHECK: module attributes {gpu.container_module}
// CHECK: gpu.module @kernels
// CHECK: gpu.func @linear(%{{.*}}: memref<200x64xf16>, %{{.*}}: memref<96x64xf16>, %{{.*}}: memref<96xf32>, %{{.*}}: memref<200x96xf16>) kernel
// CHECK-SAME: tracea.launch = {block = array<i64: 128, 1, 1>, dynamic_shared_bytes = 49152 : i64, grid = array<i64: 1, 2, 1>}
// CHECK: gpu.dynamic_shared_memory
// CHECK: arith.xori
// CHECK: nvgpu.device_async_copy %arg0[{{.*}}], %{{.*}}[{{.*}}], 8, %{{.*}} {bypassL1} : memref<200x64xf16> to memref<3x128x32xf16, #gpu.address_space<workgroup>>
// CHECK: nvvm.cp.async.commit.group
// CHECK: nvgpu.device_async_copy
// CHECK: nvvm.cp.async.commit.group
// CHECK: scf.for %{{.*}} = %c0 to %c2 step %c1
// CHECK-NEXT: nvvm.cp.async.wait.group 1
// CHECK-NEXT: gpu.barrier
// CHECK: scf.if
// CHECK: nvgpu.device_async_copy
// CHECK: nvvm.cp.async.commit.group
// CHECK: nvgpu.ldmatrix %{{.*}} {numTiles = 4 : i32, transpose = false} : memref<3x128x32xf16, #gpu.address_space<workgroup>> -> vector<4x2xf16>
// CHECK: nvgpu.mma.sync(%{{.*}}, %{{.*}}, %{{.*}}) {mmaShape = [16, 8, 16]} : (vector<4x2xf16>, vector<2x2xf16>, vector<2x2xf32>) -> vector<2x2xf32>
// CHECK: scf.yield
// CHECK: vector.load %arg2[%{{.*}}] {alignment = 8 : i64} : memref<96xf32>, vector<2xf32>
// CHECK-NEXT: arith.addf
// CHECK: arith.maximumf
// CHECK-NEXT: arith.truncf %{{.*}} : vector<2xf32> to vector<2xf16>
// CHECK-NEXT: vector.store %{{.*}}, %arg3[%{{.*}}, %{{.*}}] {alignment = 4 : i64} : memref<200x96xf16>, vector<2xf16>
func.func @linear(%x: tensor<200x64xf16>, %w: tensor<96x64xf16>, %bias: tensor<96xf32>) -> tensor<200x96xf16> {
  %y = "tracea.fused_gemm"(%x, %w, %bias) {transpose_b = true, epilogue = [{kind = "bias_add"}, {kind = "relu"}],
       operandSegmentSizes = array<i32: 1, 1, 1, 0>} : (tensor<200x64xf16>, tensor<96x64xf16>, tensor<96xf32>) -> tensor<200x96xf16>
  return %y : tensor<200x96xf16>
}

// bf16 with a [K, N] B: its fragments are loaded transposed; mma.sync on 32-bit registers.
// CHECK: gpu.func @bf16_gemm
// CHECK: nvgpu.ldmatrix %{{.*}} {numTiles = 4 : i32, transpose = true}
// CHECK: nvvm.mma.sync A[{{.*}}] B[{{.*}}] C[{{.*}}] {{.*}}multiplicandAPtxType = #nvvm.mma_type<bf16>
func.func @bf16_gemm(%a: tensor<128x64xbf16>, %b: tensor<64x256xbf16>) -> tensor<128x256xf32> {
  %c = "tracea.gemm"(%a, %b) : (tensor<128x64xbf16>, tensor<64x256xbf16>) -> tensor<128x256xf32>
  return %c : tensor<128x256xf32>
}

// f32: the SIMT kernel, FMAs from shared-memory tiles.
// CHECK: gpu.func @simt(%{{.*}}: memref<64x32xf32>, %{{.*}}: memref<32x48xf32>, %{{.*}}: memref<64x48xf32>) workgroup
// CHECK-SAME: tracea.launch = {block = array<i64: 16, 16, 1>, dynamic_shared_bytes = 0 : i64, grid = array<i64: 1, 1, 1>}
// CHECK: math.fma
func.func @simt(%a: tensor<64x32xf32>, %b: tensor<32x48xf32>) -> tensor<64x48xf32> {
  %c = "tracea.gemm"(%a, %b) : (tensor<64x32xf32>, tensor<32x48xf32>) -> tensor<64x48xf32>
  return %c : tensor<64x48xf32>
}

// NHWC conv2d + bias as an implicit GEMM: the filter and output seen as [K, F] / [M, F]; A's
// chunks gathered from the image (zero-filled where the padding is), on Tensor Cores.
// CHECK: gpu.func @conv(%{{.*}}: memref<1x16x16x32xf16>, %{{.*}}: memref<3x3x32x64xf16>, %{{.*}}: memref<64xf32>, %{{.*}}: memref<1x16x16x64xf16>) kernel
// CHECK: memref.collapse_shape %{{.*}} {{\[\[}}0, 1, 2], [3]] : memref<3x3x32x64xf16> into memref<288x64xf16>
// CHECK: memref.collapse_shape %{{.*}} {{\[\[}}0, 1, 2], [3]] : memref<1x16x16x64xf16> into memref<256x64xf16>
// CHECK: arith.cmpi sge
// CHECK: nvgpu.device_async_copy %arg0[%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}], %{{.*}}[{{.*}}], 8, %{{.*}} {bypassL1} : memref<1x16x16x32xf16> to memref<3x128x32xf16, #gpu.address_space<workgroup>>
// CHECK: nvgpu.mma.sync
func.func @conv(%x: tensor<1x16x16x32xf16>, %w: tensor<3x3x32x64xf16>, %b: tensor<64xf32>) -> tensor<1x16x16x64xf16> {
  %y = "tracea.conv2d"(%x, %w, %b) {layout = "nhwc", padding = array<i64: 1, 1>, operandSegmentSizes = array<i32: 1, 1, 1>}
       : (tensor<1x16x16x32xf16>, tensor<3x3x32x64xf16>, tensor<64xf32>) -> tensor<1x16x16x64xf16>
  return %y : tensor<1x16x16x64xf16>
}

// Attention: flash attention on mma.sync: Q fragments kept in registers, K and V blocks through a
// 2-stage cp.async pipeline (the checked plan: block j + 1's copies in flight while block j is
// computed), per key block S = Q K^T, the online softmax (keys past the query masked: one
// compare per score against a per-row limit; row max across a quad of lanes, base-2 exp,
// rescaled sums), then O += P V with P's accumulators as the A fragments; causal blocks past the
// diagonal are not visited.
// CHECK: gpu.func @attn(%{{.*}}: memref<2x4x96x64xf16>, %{{.*}}: memref<2x4x96x64xf16>, %{{.*}}: memref<2x4x96x64xf16>, %{{.*}}: memref<2x4x96x64xf16>) kernel
// CHECK-SAME: tracea.launch = {block = array<i64: 128, 1, 1>, dynamic_shared_bytes = 40960 : i64, grid = array<i64: 2, 8, 1>}
// CHECK: memref.subview
// CHECK: %[[BOUND:.*]] = arith.minui
// CHECK: nvgpu.device_async_copy {{.*}} to memref<2x64x64xf16, #gpu.address_space<workgroup>>
// CHECK: nvvm.cp.async.commit.group
// CHECK: scf.for %{{.*}} = %c0 to %[[BOUND]] step %c1 iter_args(
// CHECK-NEXT: nvvm.cp.async.wait.group 0
// CHECK-NEXT: gpu.barrier
// CHECK: scf.if
// CHECK: nvgpu.device_async_copy
// CHECK: nvvm.cp.async.commit.group
// CHECK: nvgpu.mma.sync
// CHECK: arith.minsi
// CHECK: arith.cmpi slt
// CHECK: arith.select
// CHECK: gpu.shuffle xor
// CHECK: math.exp2 {{.*}} fastmath<afn>
// CHECK: vector.from_elements {{.*}} : vector<4x2xf16>
// CHECK: nvgpu.ldmatrix %{{.*}} {numTiles = 4 : i32, transpose = true}
// CHECK: scf.yield
// CHECK: arith.divf
// CHECK: vector.store
func.func @attn(%q: tensor<2x4x96x64xf16>, %k: tensor<2x4x96x64xf16>, %v: tensor<2x4x96x64xf16>) -> tensor<2x4x96x64xf16> {
  %o = "tracea.attention"(%q, %k, %v) {causal = true} : (tensor<2x4x96x64xf16>, tensor<2x4x96x64xf16>, tensor<2x4x96x64xf16>) -> tensor<2x4x96x64xf16>
  return %o : tensor<2x4x96x64xf16>
}
