// tracea-gpu-kernels{chip=sm_90a}: f16 / bf16 GEMMs become the Hopper kernel: one warpgroup,
// TMA copies paced by mbarriers (prologue: tiles 0-2 of a 4-stage plan; loop: wait on the
// buffer's barrier with the parity of its use, one wgmma group from shared-memory descriptors,
// wgmma.wait_group 1, then thread 0 refills the buffer the previous group read), the epilogue
// on the accumulators. The kernel takes each operand's TMA descriptor as a trailing pointer.
// RUN: tracea-opt %s --pass-pipeline='builtin.module(tracea-gpu-kernels{chip=sm_90a})' | FileCheck %s

// CHECK: gpu.func @linear(%{{.*}}: memref<200x128xbf16>, %{{.*}}: memref<96x128xbf16>, %{{.*}}: memref<96xf32>, %{{.*}}: memref<200x96xbf16>, %[[MAPA:.*]]: !llvm.ptr, %[[MAPB:.*]]: !llvm.ptr) kernel
// CHECK-SAME: tracea.launch = {block = array<i64: 128, 1, 1>, dynamic_shared_bytes = 132096 : i64, grid = array<i64: 1, 2, 1>, tensor_maps = [array<i64: 0, 64, 128, 128>, array<i64: 1, 64, 128, 128>]}
// CHECK: builtin.unrealized_conversion_cast %[[MAPA]] : !llvm.ptr to !nvgpu.tensormap.descriptor<tensor = memref<128x64xbf16, 3>, swizzle = swizzle_128b
// CHECK: nvgpu.mbarrier.create
// CHECK: nvgpu.mbarrier.init
// CHECK: gpu.barrier
// CHECK: nvgpu.mbarrier.arrive.expect_tx %{{.*}}[%{{.*}}], %c32768
// CHECK: nvgpu.tma.async.load
// CHECK: nvgpu.tma.async.load
// CHECK: nvgpu.mbarrier.arrive.expect_tx
// CHECK: scf.for %{{.*}} = %c0 to %c2 step %c1
// CHECK: nvgpu.mbarrier.try_wait.parity
// CHECK: nvvm.wgmma.fence.aligned
// CHECK: nvvm.wgmma.mma_async %{{.*}}, %{{.*}}, %{{.*}}, <m = 64, n = 128, k = 16>, D[<f32>, <one>, <wrapped>], A[<bf16>, <one>, <row>], B[<bf16>, <one>, <col>]
// CHECK: nvvm.wgmma.commit.group.sync.aligned
// CHECK-NEXT: nvvm.wgmma.wait.group.sync.aligned 1
// CHECK: nvgpu.mbarrier.arrive.expect_tx
// CHECK: nvgpu.tma.async.load
// CHECK: scf.yield
// CHECK: nvvm.wgmma.wait.group.sync.aligned 0
// CHECK: llvm.extractvalue
// CHECK: vector.load %arg2
// CHECK: arith.truncf %{{.*}} : vector<2xf32> to vector<2xbf16>
// CHECK-NEXT: vector.store
func.func @linear(%x: tensor<200x128xbf16>, %w: tensor<96x128xbf16>, %bias: tensor<96xf32>) -> tensor<200x96xbf16> {
  %y = "tracea.fused_gemm"(%x, %w, %bias) {transpose_b = true, epilogue = [{kind = "bias_add"}, {kind = "relu"}],
       operandSegmentSizes = array<i32: 1, 1, 1, 0>} : (tensor<200x128xbf16>, tensor<96x128xbf16>, tensor<96xf32>) -> tensor<200x96xbf16>
  return %y : tensor<200x96xbf16>
}

// A row-major B: 64-column boxes, N-major descriptors (NVVM's B "row").
// CHECK: gpu.func @nn
// CHECK-SAME: tensor_maps = [array<i64: 0, 64, 128, 128>, array<i64: 1, 64, 64, 128>]
// CHECK: nvvm.wgmma.mma_async {{.*}} B[<f16>, <one>, <row>]
func.func @nn(%a: tensor<128x64xf16>, %b: tensor<64x256xf16>) -> tensor<128x256xf32> {
  %c = "tracea.gemm"(%a, %b) : (tensor<128x64xf16>, tensor<64x256xf16>) -> tensor<128x256xf32>
  return %c : tensor<128x256xf32>
}
