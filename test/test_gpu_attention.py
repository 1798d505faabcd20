"""Flash attention for NVIDIA (targets/nvvm/attention.py) without a GPU: ptxas accepts it on sm_80
and sm_90a, the machine code has the mma.sync / ldmatrix / quad-shuffle structure of the mapping,
and the shapes it cannot take are named. (Against torch SDPA: test_cuda_launcher.py, on a GPU.)"""
from __future__ import annotations

import re

import pytest

import tracea
from tracea import dialects as td
from tracea.targets.nvvm import wgmma_attention
from tracea.targets.nvvm import phase_cycle
from tracea.targets.nvvm.attention import AttentionTiles, MmaAttention, attention_module_text
from tracea.targets.nvvm import target as nvvm


@pytest.mark.parametrize("chip", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("dtype,causal", [("f16", False), ("bf16", True)])
def test_attention_machine_code(sass, chip, dtype, causal):
    a = MmaAttention((2, 4), 200, 200, 64, dtype, dtype, 0.125, causal)
    tiles = AttentionTiles()
    cubin = nvvm.assemble(nvvm.to_ptx(attention_module_text(a, tiles), chip), chip)
    machine_code = sass(cubin)
    hmma = "HMMA.16816.F32.BF16" if dtype == "bf16" else "HMMA.16816.F32"
    # per key block: Q K^T (D/16 x BN/8) and P V (BN/16 x D/8) m16n8k16 MMAs
    assert len(re.findall(rf"\b{re.escape(hmma)}\b", machine_code)) == 2 * (64 // 16) * (64 // 8)
    assert "LDSM.16.M88.4" in machine_code and "LDSM.16.MT88.4" in machine_code  # K as B^T, V transposed on load
    assert "LDGSTS.E.BYPASS.128" in machine_code
    assert len(re.findall(r"\bMUFU.EX2\b", machine_code)) >= 64 // 8 * 4  # one exp per score held
    assert "SHFL.BFLY" in machine_code  # row max and sum across the 4 lanes of a row
    assert cubin.spilled_bytes <= 32  # (ptxas keeps this kernel to 128 registers: 20 bytes spill when causal on sm_80)
    nvvm.check_launch("attention", cubin, tiles.threads, tiles.shared_bytes(64))


def test_compile_gpu_attention_artifact(ptxas):
    fn = td.function(*[td.tensor((2, 4, 200, 64), "f16")] * 3, name="attn")(
        lambda q, k, v: td.attention(q, k, v, causal=True))
    art = tracea.compile_gpu(fn, chip="sm_80")
    assert (art.grid, art.block) == ((4, 8, 1), (128, 1, 1))
    assert [(p.name, p.shape) for p in art.params] == [(n, (2, 4, 200, 64)) for n in ("q", "k", "v", "out")]


@pytest.mark.parametrize("shapes,message", [
    (((1, 64, 40), (1, 64, 40), (1, 64, 40)), r"head_dim 40.*needs a head dim of 16, 32, 64, 128, 256 \(pad"),
    (((1, 64, 80), (1, 64, 80), (1, 64, 80)), "head_dim 80.*pad Q, K and V's last dim with zeros"),
    (((1, 64, 64), (1, 64, 64), (1, 64, 32)), "value_head_dim 32.*needs value's head dim equal to the query's"),
])
def test_attention_shapes_the_kernel_cannot_take_are_named(shapes, message):
    fn = td.function(*[td.tensor(s, "f16") for s in shapes], name="attn")(lambda q, k, v: td.attention(q, k, v))
    with pytest.raises(tracea.CompileError, match=message):
        tracea.compile_gpu(fn, chip="sm_80")


@pytest.mark.parametrize("schedule", [td.Schedule(persistent=132), td.Schedule(group_m=4), td.Schedule(cluster=2),
                                      td.Schedule(store="tma")])
def test_gemm_only_schedule_keys_are_refused_for_attention(schedule):
    fn = td.function(*[td.tensor((1, 64, 64), "f16")] * 3, name="attn")(
        lambda q, k, v: td.attention(q, k, v, schedule=schedule))
    with pytest.raises(tracea.CompileError, match="persistent, group_m, cluster and store are for the NVIDIA GEMMs"):
        tracea.compile_gpu(fn, chip="sm_90a")


def test_the_key_value_pipeline_is_the_checked_plan(monkeypatch):
    """K and V stream through phase_cycle's cp.async plan, proved for every block's count of key
    blocks (causal blocks visit fewer); a plan that refills a buffer still being read is refused."""
    from tracea.targets.nvvm import attention as gpu_attention
    from tracea.targets.nvvm import phase_cycle
    a = MmaAttention((1, 2), 300, 300, 64, "f16", "f16", 0.125, True)
    text = attention_module_text(a, AttentionTiles(stages=3))
    loop = text[text.index("scf.for"):]
    assert "nvvm.cp.async.wait.group 1" in loop  # 3 stages: one block's copies may stay in flight
    plan = phase_cycle.cp_async_plan(2)
    broken = phase_cycle.LoopPlan(2, plan.prologue, (phase_cycle.WaitGroups(0), phase_cycle.Load(1, 1),
                                                    phase_cycle.Commit(), phase_cycle.Barrier(),
                                                    phase_cycle.Compute(0, 0)))
    monkeypatch.setattr(gpu_attention, "cp_async_plan", lambda stages: broken)
    with pytest.raises(phase_cycle.PhaseError, match="while some threads may still read"):
        attention_module_text(a)


# -- the Hopper kernel (targets/nvvm/wgmma_attention.py) --------------------------------------

@pytest.mark.parametrize("dim,dtype,causal", [(64, "f16", False), (128, "bf16", True), (256, "bf16", False)])
def test_wgmma_attention_machine_code(sass, dim, dtype, causal):
    """Per key block: D/16 HGMMAs for S = Q K^T from shared memory and BN/16 for P V with P in
    registers, each product one pipelined group (ptxas serializes every wgmma of a kernel whose
    wgmma registers are written after their fence: a DEPBAR after each); 3-D TMA copies; the
    producer warpgroup's registers go to the MMA ones; no spills."""
    a = MmaAttention((2, 4), 1000, 1000, dim, dtype, dtype, dim ** -0.5, causal)
    tiles = wgmma_attention.default_tiles(a)
    cubin = nvvm.assemble(nvvm.to_ptx(wgmma_attention.wgmma_attention_module_text(a, tiles), "sm_90a"), "sm_90a")
    code = sass(cubin)
    kind = r"\.BF16" if dtype == "bf16" else ""  # (f16 is the default)
    scores = re.findall(rf"HGMMA\.64x{tiles.block_n}x16\.F32{kind} R\d+, gdesc", code)
    pv = re.findall(rf"HGMMA\.64x{dim}x16\.F32{kind} R\d+, R\d+, gdesc\[UR\d+\]\.tnspB", code)
    assert len(scores) == dim // 16 and len(pv) == tiles.block_n // 16
    assert len(re.findall(r"HGMMA\S* .*gsb0", code)) == 2  # one wgmma group per product
    assert "UTMALDG.3D" in code and "USETMAXREG.DEALLOC" in code and "USETMAXREG.TRY_ALLOC" in code
    assert re.search(r"BAR\.SYNC\S* R\d+, 0x100", code) and re.search(r"BAR\.ARV\S* R\d+, 0x100", code)  # turns
    assert cubin.spilled_bytes == 0
    nvvm.check_launch("attention", cubin, tiles.threads, tiles.shared_bytes(dim))


def test_compile_gpu_attention_on_hopper_takes_the_wgmma_kernel(ptxas):
    """Head dims 64, 128, 192, 256 on sm_90a: the wgmma kernel, with a 3-D tensor map per operand
    (boxes one batch-head deep); other head dims: the mma.sync kernel."""
    fn = td.function(*[td.tensor((2, 4, 200, 128), "bf16")] * 3, name="attn")(
        lambda q, k, v: td.attention(q, k, v, causal=True))
    art = tracea.compile_gpu(fn, chip="sm_90a")
    assert (art.grid, art.block) == ((2, 8, 1), (384, 1, 1))
    assert [(p.name, p.tensor_map) for p in art.params[4:]] == [
        ("q.tensor_map", (0, 64, 128, 128, 3)), ("k.tensor_map", (1, 64, 128, 128, 3)),
        ("v.tensor_map", (2, 64, 128, 128, 3))]
    small = td.function(*[td.tensor((2, 4, 200, 32), "f16")] * 3, name="attn")(lambda q, k, v: td.attention(q, k, v))
    assert tracea.compile_gpu(small, chip="sm_90a").block == (128, 1, 1)  # mma.sync: 4 warps
    scheduled = td.function(*[td.tensor((1, 300, 64), "f16")] * 3, name="attn")(
        lambda q, k, v: td.attention(q, k, v, schedule=td.Schedule(tile=(192, 64, 64), stages=3)))
    art = tracea.compile_gpu(scheduled, chip="sm_90a")
    assert art.block == (512, 1, 1) and art.dynamic_shared_bytes == (192 + 2 * 3 * 64) * 64 * 2 + 1024


def test_wgmma_attention_tiles_are_validated():
    with pytest.raises(tracea.TraceaError, match="block_m 96 must be 64, 128, 192 or 256"):
        wgmma_attention.WgmmaAttentionTiles(96, 128).validate(64)
    with pytest.raises(tracea.TraceaError, match="block_n 40 must be a multiple of 16"):
        wgmma_attention.WgmmaAttentionTiles(128, 40).validate(64)
    with pytest.raises(tracea.TraceaError, match="need about 264 registers a thread, 2 MMA warpgroups get 240"):
        wgmma_attention.WgmmaAttentionTiles(128, 128).validate(256)
    a = MmaAttention((), 64, 64, 96, "f16", "f16", 0.1)
    with pytest.raises(tracea.TraceaError, match="head dim of 64, 128, 192 or 256, got 96"):
        wgmma_attention.wgmma_attention_module_text(a)


def test_wgmma_attention_pipeline_is_the_checked_plan(monkeypatch):
    """K and V stream through phase_cycle's warp-specialized plan, proved for every causal
    block's count of key blocks; a consumer that releases the buffer it is about to read is refused."""
    from tracea.targets.nvvm import phase_cycle
    a = MmaAttention((1,), 300, 300, 64, "f16", "f16", 0.125, True)
    good = phase_cycle.specialized_plan(2, 8)
    broken = phase_cycle.AgentPlan(2, 8, good.producer, (phase_cycle.WaitFull(0, 0), phase_cycle.Release(0),
                                                         phase_cycle.Compute(0, 0)), good.consumer_epilogue)
    monkeypatch.setattr(wgmma_attention, "specialized_plan", lambda stages, consumers, turns: broken)
    with pytest.raises(phase_cycle.PhaseError):
        wgmma_attention.wgmma_attention_module_text(a, wgmma_attention.WgmmaAttentionTiles(128, 64, 2))
    # a plan the writer does not implement (it passes the turn after the release) is refused
    other = phase_cycle.AgentPlan(2, 8, good.producer, (
        phase_cycle.WaitFull(0, 0), phase_cycle.Compute(0, 0), phase_cycle.WaitMma(1), phase_cycle.Release(-1),
        phase_cycle.PassTurn(), phase_cycle.AwaitTurn()), good.consumer_epilogue, turns=2)
    monkeypatch.setattr(wgmma_attention, "specialized_plan", lambda stages, consumers, turns: other)
    with pytest.raises(tracea.TraceaError, match="the wgmma attention kernel emits the consumer steps"):
        wgmma_attention.wgmma_attention_module_text(a, wgmma_attention.WgmmaAttentionTiles(128, 64, 2))


@pytest.mark.parametrize("tiles,turns", [((128, 64, 2), 2), ((192, 32, 3), 3), ((128, 64, 1), 0), ((64, 64, 2), 0)])
def test_mma_warpgroups_take_turns_at_the_tensor_cores(tiles, turns):
    """FlashAttention-3's ping-pong: with two or more MMA warpgroups and two or more buffers,
    warpgroup w waits at named barrier 1 + w for its turn to issue P V and the next Q K^T, and
    arrives at the next one's once they are issued (256 threads: its waiters and its arrivals);
    the last warpgroup opens the first round, the others close their last turn. With one buffer
    a turn would wait for a release that only the next turn makes: no turns (the plan's checker
    finds that deadlock)."""
    a = MmaAttention((1,), 300, 300, 64, "f16", "f16", 0.125, True)
    text = wgmma_attention.wgmma_attention_module_text(a, wgmma_attention.WgmmaAttentionTiles(*tiles))
    syncs = text.count("nvvm.barrier id = %turn number_of_threads = %turn_threads")
    arrivals = text.count("nvvm.barrier.arrive id = %next_turn number_of_threads = %turn_threads")
    assert (syncs, arrivals) == ((2, 3) if turns else (0, 0))  # before the loop, in it; seed, in it, after it
    if turns:
        assert f"arith.constant {turns} : i32" in text and "%turn_threads = arith.constant 256 : i32" in text
        assert not wgmma_attention.WgmmaAttentionTiles(*tiles, pingpong=False).pingpong
    with pytest.raises(ValueError, match="turns need stages >= 2"):
        phase_cycle.specialized_plan(1, 8, 2)


def test_schedule_barrier_chooses_whether_warpgroups_take_turns(ptxas):
    def attention(schedule):
        return td.function(*[td.tensor((1, 2, 256, 64), "f16")] * 3, name="attn")(
            lambda q, k, v: td.attention(q, k, v, schedule=schedule))
    turns = tracea.compile_gpu(attention(td.Schedule(barrier="pingpong", stages=2)), chip="sm_90a")
    free = tracea.compile_gpu(attention(td.Schedule(barrier="producer_consumer", stages=2)), chip="sm_90a")
    assert "bar.arrive" in turns.ptx and "bar.arrive" not in free.ptx
    assert "bar.arrive" in tracea.compile_gpu(attention(None), chip="sm_90a").ptx  # the default
    with pytest.raises(tracea.CompileError, match="'pingpong' .* is for the sm_90a attention kernel; the mma.sync"):
        tracea.compile_gpu(attention(td.Schedule(barrier="pingpong", stages=2)), chip="sm_80")
    gemm = td.function(td.tensor((64, 64), "f16"), td.tensor((64, 64), "f16"), name="gemm")(
        lambda x, y: td.gemm(x, y, schedule=td.Schedule(barrier="pingpong", stages=2)))
    with pytest.raises(tracea.CompileError, match="is for the sm_90a attention kernel; the GEMM takes"):
        tracea.compile_gpu(gemm, chip="sm_90a")
    with pytest.raises(tracea.TraceaError, match="'pingpong' needs stages >= 2"):
        td.Schedule(barrier="pingpong").validate()
