// tracea-gpu-kernels{chip=sm_90a}: attention with head dim 128 becomes the Hopper flash-attention
// kernel. Two MMA warpgroups (64 queries each) and a producer warpgroup that gives its registers
// away (setmaxnreg) and copies Q once, then K and V per key block, through 3-D tensor maps (head
// dim, sequence, batch-head: boxes stop at a head's end). Causal: a block visits the key blocks
// up to its last query (minui). The MMA warpgroups take turns at the Tensor Cores (named
// barriers: the last opens the first round, each waits for its turn). Per key block a warpgroup
// waits on the buffer's full barrier, issues S = Q K^T in one wgmma group from shared memory,
// passes the turn on, retires S, releases the previous block's buffer on its empty barrier, runs
// the online softmax (quad shuffles, exp2), and at its next turn issues O += P V with P in
// registers (inline PTX wgmma, V N-major).
// RUN: tracea-opt %s --pass-pipeline='builtin.module(tracea-gpu-kernels{chip=sm_90a})' | FileCheck %s

// CHECK: gpu.func @attn(%{{.*}}: memref<2x4x200x128xbf16>, %{{.*}}: memref<2x4x200x128xbf16>, %{{.*}}: memref<2x4x200x128xbf16>, %{{.*}}: memref<2x4x200x128xbf16>, %{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr) kernel
// CHECK-SAME: tracea.launch = {block = array<i64: 384, 1, 1>, dynamic_shared_bytes = 164864 : i64, grid = array<i64: 2, 8, 1>, tensor_maps = [array<i64: 0, 64, 128, 128, 3>, array<i64: 1, 64, 128, 128, 3>, array<i64: 2, 64, 128, 128, 3>]}
// CHECK: nvgpu.mbarrier.init %[[FULL:.*]][%c0], %c1
// CHECK-NEXT: nvgpu.mbarrier.init %[[EMPTY:.*]][%c0], %c8
// CHECK: %[[BOUND:.*]] = arith.minui %{{.*}}, %c2 : index
// CHECK: nvvm.setmaxregister decrease 24
// CHECK: nvgpu.mbarrier.arrive.expect_tx %{{.*}}[%c0], %c32768
// CHECK: nvgpu.tma.async.load %{{.*}}[%c0, %{{.*}}, %block_id_y], {{.*}} : <tensor = memref<1x128x64xbf16, 3>, swizzle = swizzle_128b
// CHECK: nvgpu.tma.async.load %{{.*}}[%c64, %{{.*}}, %block_id_y]
// CHECK: scf.for %{{.*}} = %c0 to %[[BOUND]] step %c1 {
// CHECK: nvgpu.mbarrier.try_wait.parity %[[EMPTY]]
// CHECK: nvgpu.mbarrier.arrive.expect_tx %[[FULL]][%{{.*}}], %c65536
// CHECK-COUNT-4: nvgpu.tma.async.load
// CHECK: nvvm.setmaxregister increase 240
// CHECK: %[[THREADS:.*]] = arith.constant 256 : i32
// CHECK: scf.if
// CHECK-NEXT: nvvm.barrier.arrive id = %[[NEXT:.*]] number_of_threads = %[[THREADS]]
// CHECK: nvvm.barrier id = %[[TURN:.*]] number_of_threads = %[[THREADS]]
// CHECK: scf.for %{{.*}} = %c0 to %[[BOUND]] step %c1 iter_args(
// CHECK: nvgpu.mbarrier.try_wait.parity %[[FULL]]
// CHECK: nvvm.wgmma.fence.aligned
// CHECK-COUNT-8: nvvm.wgmma.mma_async %{{.*}}, %{{.*}}, %{{.*}}, <m = 64, n = 128, k = 16>, D[<f32>, <one>, <wrapped>], A[<bf16>, <one>, <row>], B[<bf16>, <one>, <col>]
// CHECK-NEXT: nvvm.wgmma.commit.group.sync.aligned
// CHECK-NEXT: nvvm.barrier.arrive id = %[[NEXT]] number_of_threads = %[[THREADS]]
// CHECK-NEXT: nvvm.wgmma.wait.group.sync.aligned 0
// CHECK: nvgpu.mbarrier.arrive %[[EMPTY]]
// CHECK: gpu.shuffle xor
// CHECK: math.exp2
// CHECK: nvvm.barrier id = %[[TURN]] number_of_threads = %[[THREADS]]
// CHECK-NEXT: nvvm.wgmma.fence.aligned
// CHECK-COUNT-8: wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {{.*}}, p, 1, 1, 1;
// CHECK: nvvm.wgmma.commit.group.sync.aligned
// CHECK: scf.yield
// CHECK: scf.if
// CHECK-NEXT: nvvm.barrier.arrive id = %[[NEXT]] number_of_threads = %[[THREADS]]
// CHECK: nvvm.wgmma.wait.group.sync.aligned 0
// CHECK: arith.divf
// CHECK: vector.store %{{.*}}, %subview[%{{.*}}, %{{.*}}] : memref<200x128xbf16, strided<[128, 1], offset: ?>>, vector<2xbf16>
func.func @attn(%q: tensor<2x4x200x128xbf16>, %k: tensor<2x4x200x128xbf16>, %v: tensor<2x4x200x128xbf16>) -> tensor<2x4x200x128xbf16> {
  %o = "tracea.attention"(%q, %k, %v) {causal = true} : (tensor<2x4x200x128xbf16>, tensor<2x4x200x128xbf16>, tensor<2x4x200x128xbf16>) -> tensor<2x4x200x128xbf16>
  return %o : tensor<2x4x200x128xbf16>
}
