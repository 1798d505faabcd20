"""The Hopper GEMM (targets/nvvm/wgmma.py) without a GPU: its pipeline is the checked TMA/wgmma
phase plan, ptxas accepts it for sm_90a and the machine code has what the mapping promises
(HGMMA from shared-memory descriptors, TMA copies, mbarrier waits), and compile_gpu describes the
tensor maps the launcher must encode."""
from __future__ import annotations

import re

import pytest

import tracea
from tracea import dialects as td
from tracea.dialects.ops import Epilogue
from tracea.targets.nvvm import wgmma as gpu_wgmma
from tracea.targets.nvvm import phase_cycle
from tracea.targets.nvvm.mma import MmaGemm
from tracea.targets.nvvm.wgmma import WgmmaTiles, wgmma_gemm_module_text
from tracea.targets.nvvm import target as nvvm


@pytest.mark.parametrize("dtype,transpose_b,epilogue", [
    ("f16", False, ()),
    ("bf16", True, (Epilogue("bias_add"), Epilogue("gelu", approximate="tanh"))),
], ids=["f16-nn", "bf16-linear-bias-gelu"])
def test_wgmma_gemm_machine_code(sass, dtype, transpose_b, epilogue):
    g = MmaGemm(200, 264, 104, dtype, "f32", transpose_b, epilogue, "f32" if epilogue else None)
    tiles = WgmmaTiles()
    ptx = nvvm.to_ptx(wgmma_gemm_module_text(g, tiles), "sm_90a")
    # B's layout: K-major for nn.Linear's B^T (imm-trans-b 0), N-major for a row-major B (1)
    wgmmas = re.findall(rf"wgmma\.mma_async\.sync\.aligned\.m64n128k16\.f32\.{dtype}\.{dtype}\s.*,\s*(\d);", ptx)
    assert wgmmas and set(wgmmas) == {"0" if transpose_b else "1"}
    assert "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes" in ptx
    assert "mbarrier.try_wait.parity" in ptx and "mbarrier.arrive.expect_tx" in ptx
    assert re.search(r"wgmma\.wait_group\.sync\.aligned\s+1;", ptx) and re.search(r"wait_group\.sync\.aligned\s+0;", ptx)
    cubin = nvvm.assemble(ptx, "sm_90a")
    machine_code = sass(cubin)
    hgmma = "HGMMA.64x128x16.F32.BF16" if dtype == "bf16" else "HGMMA.64x128x16.F32"
    # one K tile: 64 / 16 steps x 2 m64 blocks
    assert len(re.findall(rf"\b{re.escape(hgmma)}\b", machine_code)) == 8
    assert "UTMALDG.2D" in machine_code and "SYNCS.PHASECHK.TRANS64.TRYWAIT" in machine_code
    assert "WARPGROUP.ARRIVE" in machine_code and "WARPGROUP.DEPBAR.LE" in machine_code
    assert "STG.E.64" in machine_code  # accumulator pairs stored as one 64-bit access
    assert cubin.spilled_bytes == 0
    nvvm.check_launch("gemm", cubin, tiles.threads, tiles.shared_bytes())


def test_the_emitted_pipeline_is_the_checked_plan(monkeypatch):
    """The waits, loads and MMA groups come from phase_cycle.tma_wgmma_plan, proved for the
    kernel's trip count; a plan that reloads a buffer its MMAs may still read is refused."""
    g = MmaGemm(128, 128, 64 * 7, "f16", "f32")
    for stages in (1, 2, 4):
        text = wgmma_gemm_module_text(g, WgmmaTiles(stages=stages))
        loop = text[text.index("scf.for"):]
        assert loop.count("nvvm.wgmma.wait.group.sync.aligned") == (1 if stages == 1 else 2)
        assert text[:text.index("scf.for")].count("nvgpu.mbarrier.arrive.expect_tx") == stages - 1
    plan = phase_cycle.tma_wgmma_plan(3)
    broken = phase_cycle.LoopPlan(3, plan.prologue, (phase_cycle.WaitFull(0, 0), phase_cycle.Compute(0, 0),
                                                    phase_cycle.WaitMma(2), phase_cycle.Load(2, 2)),
                                  plan.epilogue, plan.mechanism)
    monkeypatch.setattr(gpu_wgmma, "tma_wgmma_plan", lambda stages: broken)
    with pytest.raises(phase_cycle.PhaseError, match="while the MMAs of tile 0 may still read it"):
        wgmma_gemm_module_text(g, WgmmaTiles(stages=3))


def test_the_specialized_kernel_is_its_checked_plan(monkeypatch):
    """The producer and consumer loops come from phase_cycle.specialized_plan (one release per
    MMA warp per tile), proved for the kernel's trip count; releasing a buffer before wgmma.wait_group
    retired its MMAs is refused."""
    g = MmaGemm(256, 256, 64 * 7, "bf16", "f32", True)
    tiles = WgmmaTiles(128, 256, 3, warpgroups=2, specialized=True)
    text = wgmma_gemm_module_text(g, tiles)
    consumer = text[text.index("arith.cmpi ult, %tid"):]
    assert consumer.count("nvgpu.mbarrier.arrive %empty") == 1 and "expect_tx" not in consumer
    plan = phase_cycle.specialized_plan(3, 8)
    calls = []
    monkeypatch.setattr(gpu_wgmma, "specialized_plan", lambda stages, consumers: calls.append(consumers) or plan)
    wgmma_gemm_module_text(g, tiles)
    assert calls == [8]  # two warpgroups of four MMA warps
    early = phase_cycle.AgentPlan(3, 8, plan.producer, (phase_cycle.WaitFull(0, 0), phase_cycle.Compute(0, 0),
                                                        phase_cycle.WaitMma(1), phase_cycle.Release(0)),
                                  plan.consumer_epilogue)
    monkeypatch.setattr(gpu_wgmma, "specialized_plan", lambda stages, consumers: early)
    with pytest.raises(phase_cycle.PhaseError, match="may overwrite buffer 0 while consumer 0's MMAs still read"):
        wgmma_gemm_module_text(g, tiles)


def test_bad_tiles_are_named():
    with pytest.raises(tracea.TraceaError, match="block_k must be 64"):
        WgmmaTiles(block_k=32).validate(True)
    with pytest.raises(tracea.TraceaError, match="block_n 96 must be a multiple of 64"):
        WgmmaTiles(block_n=96).validate(False)  # a row-major B arrives in 64-column boxes
    WgmmaTiles(block_n=96).validate(True)
    with pytest.raises(tracea.TraceaError, match="256 accumulator registers"):
        WgmmaTiles(block_m=256, block_n=128).validate(True)


def test_compile_gpu_for_hopper_describes_the_tensor_maps(ptxas, tmp_path):
    fn = td.function(td.tensor((300, 256), "bf16"), td.tensor((512, 256), "bf16"), name="linear")(
        lambda x, w: td.gemm(x, w, transpose_b=True, out_dtype="f32"))
    art = tracea.compile_gpu(fn, chip="sm_90a")
    tiles = WgmmaTiles(64, 128, 4, specialized=True)  # the default that gives this small problem the most blocks
    assert gpu_wgmma.default_tiles(MmaGemm(300, 512, 256, "bf16", "f32", True)) == tiles
    assert (art.grid, art.block, art.dynamic_shared_bytes) == ((4, 5, 1), (160, 1, 1), tiles.shared_bytes())
    assert [(p.name, p.dtype, p.tensor_map) for p in art.params[3:]] == [
        ("x.tensor_map", "tensormap", (0, 64, 64, 128, 2)), ("w.tensor_map", "tensormap", (1, 64, 128, 128, 2))]
    assert art.launch_arguments([0x100, 0x200, 0x300, 0x400, 0x500])[-2:] == [("ptr", 0x400), ("ptr", 0x500)]
    assert ".param .u64 .ptr .align 1 linear_param_22" in art.ptx  # 3 x 7 memref fields, then the 2 maps
    # the tiles live in the dynamic shared memory proper, after the static mbarriers (a demoted
    # 1-byte static symbol put the first TMA tile over the mbarriers)
    assert ".extern .shared .align 16 .b8 __dynamic_shmem__0[];" in art.ptx
    assert art.static_shared_bytes == 2 * 8 * tiles.stages  # a full and an empty 64-bit mbarrier per stage
    art.save(tmp_path / "linear")
    assert type(art).load(tmp_path / "linear") == art


@pytest.mark.parametrize("size,expected", [
    (8192, WgmmaTiles(128, 256, 4, warpgroups=2, specialized=True)),
    (2048, WgmmaTiles(128, 256, 4, warpgroups=2, specialized=True)),  # 128 blocks: about one per SM
    (1024, WgmmaTiles(64, 128, 4, specialized=True)),  # 128 blocks; 128 x 256 tiles would give 32
])
def test_default_tiles_fill_the_gpu(size, expected):
    assert gpu_wgmma.default_tiles(MmaGemm(size, size, size, "bf16", "f32")) == expected


def test_warp_specialized_kernel_machine_code(sass):
    """Two MMA warpgroups and a producer warp: 288 threads (ptxas keeps to the registers that
    allows), each MMA warp releasing its buffers on the empty mbarriers, which the producer waits
    on before refilling; 64 x 256 wgmma per warpgroup; no spills."""
    g = MmaGemm(512, 512, 1024, "bf16", "f32", True)
    tiles = WgmmaTiles(128, 256, 4, warpgroups=2, specialized=True)
    ptx = nvvm.to_ptx(wgmma_gemm_module_text(g, tiles), "sm_90a")
    assert ".maxntid 288, 1, 1" in ptx
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n256k16\.f32\.bf16\.bf16", ptx)
    assert len(re.findall(r"mbarrier\.init\.shared\.b64", ptx)) == 2 * tiles.stages
    assert re.search(r"mbarrier\.arrive\.shared\.b64", ptx)  # a release
    assert ptx.count("mbarrier.try_wait.parity") == 2  # the producer's on empty, the consumers' on full
    cubin = nvvm.assemble(ptx, "sm_90a")
    machine_code = sass(cubin)
    assert len(re.findall(r"\bHGMMA\.64x256x16\.F32\.BF16\b", machine_code)) == 4  # one K tile: 64 / 16
    assert "UTMALDG.2D" in machine_code and "SYNCS.ARRIVE" in machine_code
    assert cubin.spilled_bytes == 0 and cubin.registers * tiles.threads <= 65536
    nvvm.check_launch("gemm", cubin, tiles.threads, tiles.shared_bytes())


def test_warpgroup_tiles_are_validated():
    with pytest.raises(tracea.TraceaError, match="need the producer warp"):
        WgmmaTiles(128, 128, warpgroups=2).validate(True)
    with pytest.raises(tracea.TraceaError, match="3 warpgroups cannot share 128 rows"):
        WgmmaTiles(128, 128, warpgroups=3, specialized=True).validate(True)
    with pytest.raises(tracea.TraceaError, match="a 128x256 tile per warpgroup needs 256 accumulator registers"):
        WgmmaTiles(256, 256, warpgroups=2, specialized=True).validate(True)
    with pytest.raises(tracea.TraceaError, match="544 threads get at most 120 registers each"):
        WgmmaTiles(256, 256, warpgroups=4, specialized=True).validate(True)
    WgmmaTiles(256, 128, warpgroups=4, specialized=True).validate(True)


def test_tensor_map_arguments_are_what_cuda_bindings_takes():
    """Without a driver the call fails at loading libcuda, after cuda-bindings accepted every
    argument's type (a wrong one raises TypeError first)."""
    driver = pytest.importorskip("cuda.bindings.driver")
    from tracea.runtime import cuda_launcher as cl
    arguments = cl.tensor_map_arguments(0x10000, (300, 256), "bf16", (0, 64, 128, 128))
    assert [int(x) for x in arguments[3]] == [256, 300] and [int(x) for x in arguments[4]] == [512]
    # rank 3 (the attention's operands): head dim, sequence, batch-heads; boxes one matrix deep
    sliced = cl.tensor_map_arguments(0x10000, (2, 4, 300, 128), "f16", (0, 64, 128, 128, 3))
    assert sliced[1] == 3 and [int(x) for x in sliced[3]] == [128, 300, 8]
    assert [int(x) for x in sliced[4]] == [256, 256 * 300] and [int(x) for x in sliced[5]] == [64, 128, 1]
    for args in (arguments, sliced):
        try:
            driver.cuTensorMapEncodeTiled(*args)
        except RuntimeError as e:  # no libcuda here
            assert "libcuda" in str(e)


def test_persistent_kernel(ptxas):
    """schedule persistent = n: n blocks (at most one per output tile) loop over the output tiles,
    the producer loading the next tile while the MMA warps store the last; needs the producer warp."""
    fn = td.function(td.tensor((1000, 256), "bf16"), td.tensor((1024, 256), "bf16"), name="linear")(
        lambda x, w: td.gemm(x, w, transpose_b=True, schedule=td.Schedule(tile=(128, 256, 64), warp_tile=(64, 256, 64),
                                                                         stages=4, persistent=5)))
    art = tracea.compile_gpu(fn, chip="sm_90a")
    assert art.grid == (5, 1, 1) and art.block == (288, 1, 1)  # 4 x 8 output tiles over 5 blocks
    g = MmaGemm(1000, 1024, 256, "bf16", "bf16", True)
    text = wgmma_gemm_module_text(g, WgmmaTiles(128, 256, 4, warpgroups=2, specialized=True, persistent=5))
    assert text.count("to %c32 step %c5") == 2  # the producer's and the MMA warps' loops over output tiles
    assert gpu_wgmma.grid(g, WgmmaTiles(128, 256, 4, warpgroups=2, specialized=True, persistent=132)) == (32, 1, 1)
    with pytest.raises(tracea.TraceaError, match="a persistent kernel needs the producer warp"):
        WgmmaTiles(persistent=132).validate(True)
    with pytest.raises(tracea.TraceaError, match="schedule persistent: only the sm_90a GEMM of plain matrices"):
        tracea.compile_gpu(fn, chip="sm_80")
    default_tiles = td.function(td.tensor((1000, 256), "bf16"), td.tensor((1024, 256), "bf16"), name="linear")(
        lambda x, w: td.gemm(x, w, transpose_b=True, schedule=td.Schedule(persistent=5)))
    assert tracea.compile_gpu(default_tiles, chip="sm_90a").grid == (5, 1, 1)  # no tile: the default ones


def test_cluster_kernel(sass):
    """schedule cluster = 2: blocks in pairs on tile rows m, m + 1 of one column, each copying half
    of the B tile into both with a multicast TMA copy; each releases a buffer on the empty
    barriers of both; a cluster barrier after the mbarriers' initialization and before exiting.
    Tile rows are rounded up to whole clusters; the launch is one block per tile along x."""
    fn = td.function(td.tensor((1000, 256), "bf16"), td.tensor((1024, 256), "bf16"), name="linear")(
        lambda x, w: td.gemm(x, w, transpose_b=True, schedule=td.Schedule(tile=(128, 256, 64), warp_tile=(64, 256, 64),
                                                                         stages=4, cluster=2)))
    art = tracea.compile_gpu(fn, chip="sm_90a")
    assert art.grid == (4 * 8, 1, 1)  # 8 tile rows (1000 / 128, rounded up to even) x 4 columns
    assert [p.tensor_map[1:3] for p in art.params if p.tensor_map] == [(64, 128), (64, 128)]  # B: half the rows
    assert ".reqnctapercluster 2, 1, 1" in art.ptx
    copies = re.findall(r"cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global[.\w:]*", art.ptx)
    multicast = [c for c in copies if c.endswith(".multicast::cluster")]
    assert multicast and len(copies) == 2 * len(multicast)  # B's copies multicast, A's not
    releases = len(re.findall(r"mbarrier\.arrive\.shared::cluster\.b64", art.ptx))
    assert releases and releases == len(re.findall(r"mapa\.shared::cluster\.u32", art.ptx))
    assert releases % 2 == 0  # each on both blocks' barriers
    assert art.ptx.count("barrier.cluster.arrive") == 2 and "fence.mbarrier_init.release.cluster" in art.ptx
    machine_code = sass(nvvm.assemble(art.ptx, "sm_90a"))
    assert "UTMALDG.2D.MULTICAST" in machine_code and "UCGABAR_WAIT" in machine_code
    assert gpu_wgmma.grid(MmaGemm(1000, 1024, 256, "bf16", "bf16", True),
                          WgmmaTiles(128, 256, 4, warpgroups=2, specialized=True, persistent=131, cluster=2)) == \
        (32, 1, 1)  # all 32 tiles; 131 blocks would be rounded down to whole clusters


def test_cluster_tiles_are_validated():
    with pytest.raises(tracea.TraceaError, match="a cluster needs the producer warp"):
        WgmmaTiles(cluster=2).validate(True)
    with pytest.raises(tracea.TraceaError, match="group_m 3 must be a multiple of the cluster"):
        WgmmaTiles(specialized=True, cluster=2, group_m=3).validate(True)
    with pytest.raises(tracea.TraceaError, match="block_n 64 must be a multiple of 128 in a cluster of 2"):
        WgmmaTiles(64, 64, specialized=True, cluster=2).validate(False)  # a row-major B: two 64-column boxes
    with pytest.raises(tracea.TraceaError, match="cluster must be 1 or 2"):
        WgmmaTiles(specialized=True, cluster=4).validate(True)
    fn = td.function(td.tensor((64, 64), "f16"), td.tensor((64, 64), "f16"), name="gemm")(
        lambda a, b: td.gemm(a, b, schedule=td.Schedule(cluster=2)))
    with pytest.raises(tracea.TraceaError, match="schedule cluster: only the sm_90a GEMM"):
        tracea.compile_gpu(fn, chip="sm_80")
    with pytest.raises(tracea.TraceaError, match="cluster .blocks per cluster. must be 0, 1 or 2"):
        td.Schedule(cluster=3).validate()


def test_tma_store_kernel(sass):
    """schedule store = "tma": each MMA warpgroup writes its accumulators (epilogue applied) box
    by box into two swizzled staging buffers after the pipeline's, and its first thread copies
    each box to C with a TMA store (C gets a tensor map of 64-row x 128-byte boxes); the only
    global stores in the machine code are TMA's."""
    fn = td.function(td.tensor((1000, 256), "bf16"), td.tensor((1024, 256), "bf16"), td.tensor((1024,), "f32"),
                     name="linear")(
        lambda x, w, b: td.fused_gemm(x, w, [td.bias_add(b), td.gelu()], transpose_b=True,
                                      schedule=td.Schedule(tile=(128, 256, 64), warp_tile=(64, 256, 64), stages=4,
                                                           store="tma")))
    art = tracea.compile_gpu(fn, chip="sm_90a")
    assert [p.tensor_map for p in art.params if p.tensor_map][2] == (3, 64, 64, 128, 2)  # C (bf16): 64 x 64 boxes
    assert art.dynamic_shared_bytes == 4 * (16384 + 32768) + 2 * 2 * 8192 + 1024
    assert art.ptx.count("cp.async.bulk.tensor.2d.global.shared::cta") == 4  # a warpgroup's 64 x 256 in 4 boxes
    assert "fence.proxy.async.shared::cta" in art.ptx and "cp.async.bulk.wait_group.read" in art.ptx
    machine_code = sass(nvvm.assemble(art.ptx, "sm_90a"))
    assert "UTMASTG.2D" in machine_code and not re.search(r"\bSTG\.", machine_code)
    assert art.registers * 288 <= 65536
    f32 = WgmmaTiles(128, 128, 4, specialized=True, tma_store=True)
    assert gpu_wgmma.tensor_maps(MmaGemm(256, 256, 64, "f16", "f32", False), f32)[2] == \
        gpu_wgmma.TensorMap(2, (32, 64))  # f32: 32 columns a box


def test_tma_store_is_validated():
    with pytest.raises(tracea.TraceaError, match=r"block_n \(136\) must be a multiple of 64"):
        wgmma_gemm_module_text(MmaGemm(256, 256, 64, "bf16", "bf16", True),
                               WgmmaTiles(128, 136, 2, specialized=True, tma_store=True))
    fn = td.function(td.tensor((64, 64), "f16"), td.tensor((64, 64), "f16"), name="gemm")(
        lambda a, b: td.gemm(a, b, schedule=td.Schedule(store="tma")))
    with pytest.raises(tracea.TraceaError, match="schedule store 'tma': only the sm_90a GEMM"):
        tracea.compile_gpu(fn, chip="sm_80")
    bmm = td.function(td.tensor((2, 64, 64), "f16"), td.tensor((2, 64, 64), "f16"), name="bmm")(
        lambda a, b: td.gemm(a, b, schedule=td.Schedule(store="tma", persistent=8)))
    with pytest.raises(tracea.TraceaError, match=r"schedule persistent and store 'tma': .* a batched B"):
        tracea.compile_gpu(bmm, chip="sm_90a")  # a batched B runs the mma.sync kernel there too
    with pytest.raises(tracea.TraceaError, match="schedule store must be one of registers, tma"):
        td.Schedule(store="smem").validate()
