"""The Tensor Core GEMM for NVIDIA (targets/nvvm/mma.py, targets/nvvm/kernels.py) without a GPU: the
pipeline it emits is the checked phase plan, its shared-memory layouts are conflict-free, ptxas
accepts it for sm_80 and sm_90a and the machine code has the instructions the mapping promises.
Running it against torch needs a GPU and a CUDA launcher (not in this suite)."""
from __future__ import annotations

import re

import pytest

import tracea
from tracea import dialects as td
from tracea.dialects.ops import Epilogue
from tracea.dialects.schedule import Schedule, Swizzle
from tracea.codegen import bank_conflicts
from tracea.targets.nvvm import mma as gpu_mma
from tracea.targets.nvvm import phase_cycle
from tracea.targets.nvvm.mma import MmaGemm, MmaTiles, mma_gemm_module_text
from tracea.targets.nvvm import target as nvvm


@pytest.mark.parametrize("chip", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("dtype,transpose_b,epilogue", [
    ("f16", False, ()),
    ("bf16", True, (Epilogue("bias_add"), Epilogue("gelu", approximate="tanh"))),
], ids=["f16-nn", "bf16-linear-bias-gelu"])
def test_mma_gemm_machine_code(sass, chip, dtype, transpose_b, epilogue):
    g = MmaGemm(200, 264, 104, dtype, "f32", transpose_b, epilogue, "f32" if epilogue else None)
    tiles = MmaTiles()
    cubin = nvvm.assemble(nvvm.to_ptx(mma_gemm_module_text(g, tiles), chip), chip)
    machine_code = sass(cubin)
    k16_steps = tiles.block_k // 16
    mma_per_step = (tiles.warp_m // 16) * (tiles.warp_n // 8)
    hmma = "HMMA.16816.F32.BF16" if dtype == "bf16" else "HMMA.16816.F32"
    assert len(re.findall(rf"\b{re.escape(hmma)}\b", machine_code)) >= k16_steps * mma_per_step
    assert "LDSM.16.M88.4" in machine_code  # ldmatrix.x4 of A (and of B^T)
    assert ("LDSM.16.MT88.4" in machine_code) == (not transpose_b)  # .trans for a row-major B
    assert all(op in machine_code for op in ("LDGSTS.E.BYPASS.128", "DEPBAR", "BAR.SYNC"))  # cp.async groups
    assert "STG.E.64" in machine_code  # accumulator pairs stored as one 64-bit access
    assert cubin.spilled_bytes == 0
    nvvm.check_launch("gemm", cubin, tiles.threads, tiles.shared_bytes())


def test_shared_memory_layouts_are_conflict_free():
    """The swizzles the kernel uses leave no bank conflicts for its cp.async stores and ldmatrix
    reads; the same tiles unswizzled conflict."""
    for transpose_a, transpose_b in ((False, False), (False, True), (True, False)):
        for layout in gpu_mma.tile_layouts(MmaTiles(), transpose_b, transpose_a):
            assert bank_conflicts.report(layout) == {"store": 0, "ldmatrix": 0}
    plain_b = bank_conflicts.TileLayout(32, 128, 2, Swizzle())
    assert bank_conflicts.report(plain_b)["ldmatrix"] > 0


def test_emitted_pipeline_is_the_checked_plan(monkeypatch):
    """The kernel's waits and commits are the LoopPlan's, and a plan the checker rejects is never
    emitted."""
    g = MmaGemm(128, 128, 256, "f16", "f32")
    for stages in (1, 2, 3, 4):
        text = mma_gemm_module_text(g, MmaTiles(stages=stages))
        loop = text[text.index("scf.for"):]
        waits = re.findall(r"nvvm.cp.async.wait.group (\d+)", loop)
        assert waits == [str(max(0, stages - 2))]
        assert text[:text.index("scf.for")].count("nvvm.cp.async.commit.group") == stages - 1

    broken = phase_cycle.LoopPlan(3, phase_cycle.cp_async_plan(3).prologue,
                                  (phase_cycle.WaitGroups(2), phase_cycle.Barrier(), phase_cycle.Load(2, 2),
                                   phase_cycle.Commit(), phase_cycle.Compute(0, 0)))
    monkeypatch.setattr(gpu_mma, "cp_async_plan", lambda stages: broken)
    with pytest.raises(phase_cycle.PhaseError, match="before its copy is known complete"):
        mma_gemm_module_text(g, MmaTiles())


@pytest.mark.parametrize("stages", [1, 2, 3, 4, 5])
def test_loop_plans_are_safe_for_every_trip_count(stages):
    plan = phase_cycle.cp_async_plan(stages)
    for trips in range(0, 3 * stages + 3):  # fewer trips than stages included
        plan.verify(trips)
        assert plan.unroll(trips) == phase_cycle.schedule(stages, trips, "cp.async")


def test_bad_tiles_and_shapes_are_named():
    with pytest.raises(tracea.TraceaError, match="multiple of 16"):
        MmaTiles(block_k=24).validate()
    with pytest.raises(tracea.TraceaError, match="must divide the block tile"):
        MmaTiles(block_m=96, warp_m=64).validate()
    with pytest.raises(tracea.TraceaError, match="f32 runs the SIMT GEMM"):
        MmaGemm(64, 64, 64, "f32", "f32").validate()


@pytest.mark.parametrize("n_tiles,m_tiles", [(1, 1), (3, 5), (7, 2), (32, 64), (5, 17)])
@pytest.mark.parametrize("group", [1, 2, 3, 8, 100])
def test_launch_order_visits_every_output_tile_once_in_groups(n_tiles, m_tiles, group):
    order = [gpu_mma.launch_order_tile(b, n_tiles, m_tiles, group, gpu_mma.int_arith)
             for b in range(n_tiles * m_tiles)]
    assert sorted(order) == [(r, c) for r in range(m_tiles) for c in range(n_tiles)]
    if group == 1:
        assert order == sorted(order)  # row by row
    # within a group (the last one may be short) the blocks go down each column in turn
    rows = min(group, m_tiles)
    assert order[:rows] == [(r, 0) for r in range(rows)]
    first_rows = {b // (group * n_tiles): set() for b in range(len(order))}
    for b, (r, _) in enumerate(order):
        first_rows[b // (group * n_tiles)].add(r // group)
    assert all(len(groups) == 1 for groups in first_rows.values())


def test_schedule_group_m_reaches_the_kernels(ptxas):
    def gemm(schedule):
        return td.function(td.tensor((512, 256), "f16"), td.tensor((256, 512), "f16"), name="gemm")(
            lambda a, b: td.gemm(a, b, schedule=schedule))
    g = MmaGemm(512, 512, 256, "f16", "f16", False)
    assert "arith.constant 12 : index" in mma_gemm_module_text(g, MmaTiles(group_m=3))  # 3 rows x 4 columns
    assert "arith.constant 12 : index" not in mma_gemm_module_text(g, MmaTiles(group_m=2))
    art = tracea.compile_gpu(gemm(Schedule(group_m=3)), chip="sm_80")  # no tile: the default tiles, grouped
    assert art.grid == (4, 4, 1)
    with pytest.raises(tracea.TraceaError, match="group_m must be >= 1"):
        MmaTiles(group_m=0).validate()
    with pytest.raises(tracea.TraceaError, match="group_m .* must be >= 0"):
        Schedule(group_m=-1).validate()


def test_compile_gpu_gives_a_checked_artifact(ptxas, tmp_path):
    fn = td.function(td.tensor((300, 256), "bf16"), td.tensor((512, 256), "bf16"), name="linear")(
        lambda x, w: td.gemm(x, w, transpose_b=True, out_dtype="f32"))
    art = tracea.compile_gpu(fn, chip="sm_80")
    assert (art.name, art.grid, art.block, art.dynamic_shared_bytes) == ("linear", (4, 3, 1), (128, 1, 1), 49152)
    assert [(p.name, p.dtype, p.shape) for p in art.params] == [
        ("x", "bf16", (300, 256)), ("w", "bf16", (512, 256)), ("out", "f32", (300, 512))]
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in art.ptx and 0 < art.registers <= 255
    art.save(tmp_path / "linear")
    assert type(art).load(tmp_path / "linear") == art


def test_a_schedule_that_does_not_fit_names_the_fix(ptxas):
    big = Schedule(tile=(128, 128, 64), warp_tile=(64, 64, 64), stages=6)  # 6 x 32 KB of tiles
    fn = td.function(td.tensor((256, 256), "f16"), td.tensor((256, 256), "f16"), name="gemm")(
        lambda a, b: td.gemm(a, b, schedule=big))
    with pytest.raises(tracea.CompileError, match=r"needs 192 KB shared memory, sm_80 allows 163 KB per block; "
                                                  "reduce stages"):
        tracea.compile_gpu(fn, chip="sm_80")


def test_nhwc_conv2d_is_an_implicit_gemm_on_tensor_cores(sass):
    """conv2d NHWC (filter HWCF) + bias: the mma.sync kernel with its A tiles gathered from the
    image while copying (zero-filled in the padding); on sm_90a too."""
    fn = td.function(td.tensor((2, 28, 28, 64), "f16"), td.tensor((3, 3, 64, 96), "f16"), td.tensor((96,), "f32"),
                     name="conv")(lambda x, w, b: td.conv2d(x, w, b, stride=2, padding=1, layout="nhwc",
                                                           out_dtype="f32"))
    art = tracea.compile_gpu(fn, chip="sm_80")
    m = 2 * 14 * 14
    assert (art.grid, art.block) == ((1, -(-m // 128), 1), (128, 1, 1))
    assert [(p.name, p.shape) for p in art.params] == [("x", (2, 28, 28, 64)), ("w", (3, 3, 64, 96)), ("b", (96,)),
                                                       ("out", (2, 14, 14, 96))]
    machine_code = sass(nvvm.Cubin("sm_80", art.cubin, art.registers, art.static_shared_bytes, 0, ""))
    assert all(op in machine_code for op in ("HMMA.16816.F32", "LDGSTS.E.BYPASS.128", "LDSM.16.MT88.4"))
    assert "sm_90a" == tracea.compile_gpu(fn, chip="sm_90a").chip


@pytest.mark.parametrize("build,message", [
    (lambda x, w: td.conv2d(x, w, layout="nchw"), r"layout nchw.*needs layout='nhwc' \(filter HWCF; transpose"),
    (lambda x, w: td.conv2d(x, w, layout="nhwc", groups=2), "groups=1"),
])
def test_conv2d_the_gpu_cannot_take_is_named(build, message):
    shapes = ((1, 8, 8, 16), (3, 3, 8, 16)) if "groups" in message else ((1, 16, 8, 8), (16, 16, 3, 3))
    fn = td.function(td.tensor(shapes[0], "f16"), td.tensor(shapes[1], "f16"), name="conv")(build)
    with pytest.raises(tracea.CompileError, match=message):
        tracea.compile_gpu(fn, chip="sm_80")


def test_conv2d_with_channels_not_in_16_byte_runs_is_named():
    fn = td.function(td.tensor((1, 32, 32, 3), "f16"), td.tensor((7, 7, 3, 64), "f16"), name="stem")(
        lambda x, w: td.conv2d(x, w, stride=2, padding=3, layout="nhwc"))
    with pytest.raises(tracea.CompileError, match=r"C \(3\) must be a multiple of 8; pad the channels"):
        tracea.compile_gpu(fn, chip="sm_80")


@pytest.mark.parametrize("chip", ["sm_80", "sm_90a"])
def test_batched_activations_times_shared_weights_is_one_gemm(sass, chip):
    """x [B, S, D] @ W^T + bias, GELU, + residual [B, S, N] (a transformer's nn.Linear): one GEMM over
    B x S rows, the N-d parameters seen as matrices. With a batched B (bmm), block z computes
    matrix z through strided views (the mma.sync kernel, on sm_90a too)."""
    fn = td.function(td.tensor((4, 50, 64), "f16"), td.tensor((96, 64), "f16"), td.tensor((96,), "f16"),
                     td.tensor((4, 50, 96), "f16"), name="linear")(
        lambda x, w, b, r: td.fused_gemm(x, w, [td.bias_add(b), td.gelu(), td.residual_add(r)], transpose_b=True))
    art = tracea.compile_gpu(fn, chip=chip)
    block_m = 128 if chip == "sm_80" else 64  # sm_90a: the default tile giving 200 rows the most blocks
    assert art.grid[:2] == (1, -(-200 // block_m))
    assert [p.shape for p in art.params[:5]] == [(4, 50, 64), (96, 64), (96,), (4, 50, 96), (4, 50, 96)]
    fields = sum(len(p.fields) for p in art.params)
    assert f"linear_param_{fields - 1}" in art.ptx and f"linear_param_{fields}" not in art.ptx
    bmm = td.function(td.tensor((2, 3, 50, 64), "f16"), td.tensor((2, 3, 64, 40), "f16"), name="bmm")(td.gemm)
    art = tracea.compile_gpu(bmm, chip=chip)
    assert art.grid == (1, 1, 6) and "HMMA" in sass(nvvm.Cubin(chip, art.cubin, 0, 0, 0, ""))


@pytest.mark.parametrize("chip", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("dtype", ["f16", "f32"])
def test_transposed_a(sass, chip, dtype):
    """C = A^T B with A stored [K, M]: on Tensor Cores its tiles are copied as they lie and
    transposed by ldmatrix (the mma.sync kernel on sm_90a too); f32 on the SIMT kernel."""
    fn = td.function(td.tensor((72, 136), dtype), td.tensor((72, 40), dtype), name="at_b")(
        lambda a, b: td.gemm(a, b, transpose_a=True, out_dtype="f32"))
    art = tracea.compile_gpu(fn, chip=chip)
    assert [p.shape for p in art.params] == [(72, 136), (72, 40), (136, 40)]
    machine_code = sass(nvvm.Cubin(chip, art.cubin, 0, 0, 0, ""))
    if dtype == "f16":
        assert "HMMA.16816.F32" in machine_code and "LDSM.16.MT88.4" in machine_code and art.block == (128, 1, 1)
    else:
        assert "FFMA" in machine_code and art.block == (16, 16, 1)
