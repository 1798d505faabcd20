// tracea-gpu-kernels{chip=sm_90a}: f16 / bf16 GEMMs become the Hopper kernel. Scheduled with
// barrier "none" and no warp_tile: one warpgroup, TMA copies paced by mbarriers (prologue: tiles 0-2 of a 4-stage plan; loop: wait on the
// buffer's barrier with the parity of its use, one wgmma group from shared-memory descriptors,
// wgmma.wait_group 1, then thread 0 refills the buffer the previous group read), the epilogue
// on the accumulators. The kernel takes each operand's TMA descriptor as a trailing pointer.
// RUN: tracea-opt %s --pass-pipeline='builtin.module(tracea-gpu-kernels{chip=sm_90a})' | FileCheck %s

// CHECK: gpu.func @linear(%{{.*}}: memref<200x128xbf16>, %{{.*}}: memref<96x128xbf16>, %{{.*}}: memref<96xf32>, %{{.*}}: memref<200x96xbf16>, %[[MAPA:.*]]: !llvm.ptr, %[[MAPB:.*]]: !llvm.ptr) kernel
// CHECK-SAME: tracea.launch = {block = array<i64: 128, 1, 1>, dynamic_shared_bytes = 132096 : i64, grid = array<i64: 1, 2, 1>, tensor_maps = [array<i64: 0, 64, 128, 128, 2>, array<i64: 1, 64, 128, 128, 2>]}
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
       schedule = {tile = array<i64: 128, 128, 64>, stages = 4 : i64},
       operandSegmentSizes = array<i32: 1, 1, 1, 0>} : (tensor<200x128xbf16>, tensor<96x128xbf16>, tensor<96xf32>) -> tensor<200x96xbf16>
  return %y : tensor<200x96xbf16>
}

// A row-major B: 64-column boxes, N-major descriptors (NVVM's B "row"). Unscheduled, this small
// GEMM gets the default tile giving it the most blocks: 64 x 128, one MMA warpgroup and a
// producer warp (160 threads).
// CHECK: gpu.func @nn
// CHECK-SAME: block = array<i64: 160, 1, 1>
// CHECK-SAME: tensor_maps = [array<i64: 0, 64, 64, 128, 2>, array<i64: 1, 64, 64, 128, 2>]
// CHECK: nvvm.wgmma.mma_async {{.*}} B[<f16>, <one>, <row>]
func.func @nn(%a: tensor<128x64xf16>, %b: tensor<64x256xf16>) -> tensor<128x256xf32> {
  %c = "tracea.gemm"(%a, %b) : (tensor<128x64xf16>, tensor<64x256xf16>) -> tensor<128x256xf32>
  return %c : tensor<128x256xf32>
}

// Unscheduled and large enough to fill the GPU: the warp-specialized 128 x 256 tile. Threads
// 0-255 are two MMA warpgroups (64 x 256 each), thread 256 the producer. Per stage a "full"
// mbarrier (1 arrival + the copies' bytes) and an "empty" one (8 arrivals: each MMA warp's
// release). The producer waits on the empty barrier before refilling a used buffer (parity of
// the release phase, use - 1); the consumers wait on the full one, compute, retire all but the
// newest wgmma group and release the buffer of tile k - 1.
// CHECK-LABEL: gpu.func @specialized
// CHECK-SAME: block = array<i64: 288, 1, 1>, dynamic_shared_bytes = 197632 : i64, grid = array<i64: 8, 16, 1>
// CHECK: %[[FULL:.*]] = nvgpu.mbarrier.create
// CHECK: %[[EMPTY:.*]] = nvgpu.mbarrier.create
// CHECK: nvgpu.mbarrier.init %[[FULL]][%c0], %c1
// CHECK: nvgpu.mbarrier.init %[[EMPTY]][%c0], %c8
// CHECK: %[[PRODUCER:.*]] = arith.cmpi eq, %thread_id_x, %c256
// CHECK: scf.if %[[PRODUCER]]
// CHECK: scf.for %[[KP:.*]] = %c0 to %c8 step %c1
// CHECK: %[[REUSE:.*]] = arith.cmpi uge, %[[KP]], %c4
// CHECK: scf.if %[[REUSE]]
// CHECK: arith.subi
// CHECK: nvgpu.mbarrier.try_wait.parity %[[EMPTY]]
// CHECK: nvgpu.mbarrier.arrive.expect_tx %[[FULL]][%{{.*}}], %c49152 :
// CHECK: nvgpu.tma.async.load {{.*}} to %{{.*}} : {{.*}} -> memref<128x64xbf16
// CHECK: nvgpu.tma.async.load {{.*}} to %{{.*}} : {{.*}} -> memref<256x64xbf16
// CHECK: %[[CONSUMER:.*]] = arith.cmpi ult, %thread_id_x, %c256
// CHECK: scf.if %[[CONSUMER]]
// CHECK: scf.for %[[K:.*]] = %c0 to %c8 step %c1 iter_args
// CHECK: nvgpu.mbarrier.try_wait.parity %[[FULL]]
// CHECK: nvvm.wgmma.mma_async {{.*}} <m = 64, n = 256, k = 16>
// CHECK: nvvm.wgmma.commit.group.sync.aligned
// CHECK-NEXT: nvvm.wgmma.wait.group.sync.aligned 1
// CHECK: arith.cmpi uge, %[[K]], %c1
// CHECK: arith.subi %[[K]], %c1
// CHECK: nvgpu.mbarrier.arrive %[[EMPTY]]
// CHECK: scf.yield
// CHECK: nvvm.wgmma.wait.group.sync.aligned 0
func.func @specialized(%a: tensor<2048x512xbf16>, %b: tensor<2048x512xbf16>) -> tensor<2048x2048xf32> {
  %c = "tracea.gemm"(%a, %b) {transpose_b = true} : (tensor<2048x512xbf16>, tensor<2048x512xbf16>) -> tensor<2048x2048xf32>
  return %c : tensor<2048x2048xf32>
}

// schedule cluster = 2: blocks 2c and 2c + 1 share the B tile of one column. Each reads its
// rank, copies half of B (a 64 x 128 box, at 128 rows x 128 bytes times the rank) into both
// blocks with one multicast copy, and releases a buffer on the empty barriers of both (16
// arrivals: 8 MMA warps a block); cluster barriers after the initialization and before exiting.
// CHECK-LABEL: gpu.func @cluster
// CHECK-SAME: nvvm.cluster_dim = array<i32: 2, 1, 1>
// CHECK-SAME: grid = array<i64: 128, 1, 1>, tensor_maps = [array<i64: 0, 64, 128, 128, 2>, array<i64: 1, 64, 128, 128, 2>]
// CHECK: %[[RANK32:.*]] = nvvm.read.ptx.sreg.cluster.ctarank : i32
// CHECK: %[[RANK:.*]] = arith.index_cast %[[RANK32]] : i32 to index
// CHECK: %[[EVERYONE:.*]] = arith.constant 3 : i16
// CHECK: nvgpu.mbarrier.create
// CHECK: %[[EMPTY:.*]] = nvgpu.mbarrier.create
// CHECK: nvgpu.mbarrier.init %[[EMPTY]][%c0], %c16
// CHECK: nvvm.fence.mbarrier.init
// CHECK: gpu.barrier
// CHECK-NEXT: nvvm.cluster.arrive
// CHECK-NEXT: nvvm.cluster.wait
// CHECK: nvgpu.mbarrier.arrive.expect_tx %{{.*}}[%{{.*}}], %c49152 :
// CHECK: nvgpu.tma.async.load {{.*}} to %{{.*}} : {{.*}} -> memref<128x64xbf16
// CHECK: arith.muli %[[RANK]], %c16384
// CHECK: arith.muli %[[RANK]], %c128
// CHECK: nvgpu.tma.async.load {{.*}} to %{{.*}} multicast_mask = %[[EVERYONE]] : {{.*}} -> memref<128x64xbf16
// CHECK: nvgpu.mbarrier.get %[[EMPTY]]
// CHECK: mapa.shared::cluster.u32
// CHECK: mapa.shared::cluster.u32
// CHECK: nvvm.cluster.arrive
// CHECK-NEXT: nvvm.cluster.wait
// CHECK-NEXT: gpu.return
func.func @cluster(%a: tensor<2048x512xbf16>, %b: tensor<2048x512xbf16>) -> tensor<2048x2048xf32> {
  %c = "tracea.gemm"(%a, %b) {transpose_b = true, schedule = {cluster = 2 : i64}} : (tensor<2048x512xbf16>, tensor<2048x512xbf16>) -> tensor<2048x2048xf32>
  return %c : tensor<2048x2048xf32>
}

// schedule store = "tma": C gets a tensor map (64-row x 128-byte boxes). Each MMA warpgroup
// stages one box at a time in two buffers after the pipeline's (2 x 8 KB): its first thread
// waits until no TMA store still reads the buffer (all of them at the tile's first box, all but
// the last one later), the warpgroup meets at its named barrier, writes its accumulator pairs
// swizzled (16-byte chunk XOR row % 8: the lane group times 16), fences them for the async
// proxy, meets again, and the first thread stores the box and commits it; before exiting it
// waits until every store has read its box.
// CHECK-LABEL: gpu.func @tma_store
// CHECK-SAME: dynamic_shared_bytes = 115712 : i64, grid = array<i64: 2, 2, 1>, tensor_maps = [array<i64: 0, 64, 128, 128, 2>, array<i64: 1, 64, 64, 128, 2>, array<i64: 2, 64, 64, 128, 2>]
// CHECK: arith.addi %c98304, %{{.*}} : index
// CHECK-NEXT: %[[STAGING:.*]] = arith.addi
// CHECK-NEXT: %[[SWIZZLE:.*]] = arith.muli %{{.*}}, %c16 : index
// CHECK-NEXT: %[[FIRST:.*]] = arith.remui %thread_id_x, %c128 : index
// CHECK-NEXT: %[[LEADER:.*]] = arith.cmpi eq, %[[FIRST]], %c0 : index
// CHECK-NEXT: arith.addi
// CHECK-NEXT: %[[BAR:.*]] = arith.index_cast %{{.*}} : index to i32
// CHECK: nvvm.wgmma.wait.group.sync.aligned 0
// CHECK: scf.if %[[LEADER]] {
// CHECK-NEXT: nvvm.cp.async.bulk.wait_group 0 {read}
// CHECK: nvvm.barrier id = %[[BAR]] number_of_threads = %c128_i32
// CHECK-NEXT: memref.view %{{.*}}[%[[STAGING]]][]
// CHECK: arith.xori %{{.*}}, %[[SWIZZLE]] : index
// CHECK: memref.store %{{.*}} : memref<2048xi32, #gpu.address_space<workgroup>>
// CHECK: nvvm.fence.proxy {kind = #nvvm.proxy_kind<async.shared>, space = #nvvm.shared_space<cta>}
// CHECK-NEXT: nvvm.barrier id = %[[BAR]] number_of_threads = %c128_i32
// CHECK-NEXT: scf.if %[[LEADER]] {
// CHECK: nvgpu.tma.async.store %{{.*}} to %{{.*}}[%{{.*}}, %{{.*}}] : memref<64x64xbf16, #gpu.address_space<workgroup>> -> <tensor = memref<64x64xbf16, 3>, swizzle = swizzle_128b
// CHECK-NEXT: nvvm.cp.async.bulk.commit.group
// CHECK: arith.addi %{{.*}}, %c8192 : index
// CHECK: nvvm.cp.async.bulk.wait_group 1 {read}
// CHECK: nvvm.cp.async.bulk.wait_group 0 {read}
// CHECK-NEXT: }
// CHECK-NEXT: }
// CHECK-NEXT: gpu.return
func.func @tma_store(%a: tensor<256x512xbf16>, %b: tensor<512x256xbf16>) -> tensor<256x256xbf16> {
  %c = "tracea.gemm"(%a, %b) {schedule = {tile = array<i64: 128, 128, 64>, stages = 3 : i64, barrier = "producer_consumer", store = "tma"}} : (tensor<256x512xbf16>, tensor<512x256xbf16>) -> tensor<256x256xbf16>
  return %c : tensor<256x256xbf16>
}
