"""Flash attention for NVIDIA (passes/gpu_attention.py) without a GPU: ptxas accepts it on sm_80
and sm_90a, the machine code has the mma.sync / ldmatrix / quad-shuffle structure of the mapping,
and the shapes it cannot take are named. (Against torch SDPA: test_cuda_launcher.py, on a GPU.)"""
from __future__ import annotations

import re

import pytest

import tracea
from tracea import dialects as td
from tracea.passes.gpu_attention import AttentionTiles, MmaAttention, attention_module_text
from tracea.targets import nvvm


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
    assert cubin.spilled_bytes <= 32  # (ptxas spills 28 bytes for bf16 + causal on sm_90a)
    nvvm.check_launch("attention", cubin, tiles.threads, tiles.shared_bytes(64))


def test_compile_gpu_attention_artifact(ptxas):
    fn = td.function(*[td.tensor((2, 4, 200, 64), "f16")] * 3, name="attn")(
        lambda q, k, v: td.attention(q, k, v, causal=True))
    art = tracea.compile_gpu(fn, chip="sm_80")
    assert (art.grid, art.block) == ((4, 8, 1), (128, 1, 1))
    assert [(p.name, p.shape) for p in art.params] == [(n, (2, 4, 200, 64)) for n in ("q", "k", "v", "out")]


@pytest.mark.parametrize("shapes,message", [
    (((1, 64, 40), (1, 64, 40), (1, 64, 40)), "head dim of 16, 32, 64, 128, 256 .* got 40: pad"),
    (((1, 64, 80), (1, 64, 80), (1, 64, 80)), "got 80: pad Q, K and V's last dim"),
    (((1, 64, 64), (1, 64, 64), (1, 64, 32)), r"value's head dim \(32\)"),
])
def test_attention_shapes_the_kernel_cannot_take_are_named(shapes, message):
    fn = td.function(*[td.tensor(s, "f16") for s in shapes], name="attn")(lambda q, k, v: td.attention(q, k, v))
    with pytest.raises(tracea.CompileError, match=message):
        tracea.compile_gpu(fn, chip="sm_80")


def test_the_key_value_pipeline_is_the_checked_plan(monkeypatch):
    """K and V stream through phase_cycle's cp.async plan, proved for every block's count of key
    blocks (causal blocks visit fewer); a plan that refills a buffer still being read is refused."""
    from tracea.passes import gpu_attention, phase_cycle
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
