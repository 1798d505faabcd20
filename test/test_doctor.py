"""The Doctor: capability profiles, the variant registry's constraints, the decision engine,
the seeds' `Context().plan_kernel`, the choice written into the IR, and `tracea doctor`."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

import tracea
from tracea import dialects as td
from tracea.doctor import PROFILES, Context, PlanError, Problem, named, plan, variants
from tracea.doctor.capabilities import probe_nvidia
from tracea.doctor.engine import KERNELS
from tracea.codegen.variants import (ArchIs, BackendIs, DtypeIn, Rule, SharedMemoryAtLeast, SimdWidthAtLeast,
                                     SmAtLeast, WarpSizeIs)


def test_constraints_say_why_they_reject():
    gemm, sm80, sm90, avx2 = Problem("gemm", "bf16", k=20, n=30), named("sm_80"), named("sm_90a"), named("zen3-avx2")
    assert BackendIs("cuda").check(gemm, avx2) == "backend is cpu, not cuda"
    assert ArchIs("sm_90a").check(gemm, sm80) == "architecture is sm_80, not sm_90a"
    assert SmAtLeast(90).check(gemm, sm80) == "compute capability 80 < 90"
    assert WarpSizeIs(64).check(gemm, sm90) == "warp / wavefront size is 32, not 64"
    assert SimdWidthAtLeast(512).check(gemm, avx2) == "SIMD width 256 bits < 512"
    assert SharedMemoryAtLeast(200 * 1024).check(gemm, sm80) == "163 KiB shared memory per block < 200 KiB"
    assert DtypeIn(("f32",)).check(gemm, sm80) == "inputs are bf16, not f32"
    assert all(c.check(gemm, sm90) is None for c in (ArchIs("sm_90a"), SmAtLeast(80), DtypeIn(("f16", "bf16"))))
    even = Rule("K even", lambda p, caps: None if p.k is None else p.k % 2 == 0)
    assert even.check(gemm, sm80) is None and even.check(Problem("gemm", "f32", k=3), sm80) == "needs K even"
    assert even.check(Problem("gemm", "f32"), sm80) is None and even.unknown(Problem("gemm", "f32"), sm80)
    few_rows = Rule("few rows", lambda p, caps: None, preference=True)  # a heuristic: unknown is no
    assert few_rows.check(Problem("gemm", "f32"), sm80) == "needs few rows"


@pytest.mark.parametrize("profile", list(PROFILES))
def test_every_kernel_and_precision_is_planned_on_every_named_profile(profile):
    """Each decision is a variant of the profile's backend whose constraints hold; only what no
    variant computes is refused (the NVIDIA GPU has no softmax kernel, and its Tensor Core
    convolution and attention take 16-bit inputs; Vulkan and Metal run f32, and 16-bit GEMMs only on
    cooperative matrices with an f32 result; ROCm runs f32), naming every variant's
    reason."""
    context = Context(profile)
    for kernel in KERNELS:
        for precision in ("F32", "FP16", "BF16"):
            try:
                decision = context.plan_kernel(kernel, precision=precision)
            except PlanError as e:
                op = KERNELS[kernel]
                assert (context.backend == "cuda" and (op == "softmax" or op in ("conv2d", "attention")
                                                       and precision == "F32")
                        or context.backend in ("vulkan", "metal") and precision != "F32"
                        or context.backend == "rocm" and precision != "F32"), (kernel, precision, e)
                assert f"on {profile}" in str(e)
                continue
            chosen = next(v for v in variants() if v.id == decision.variant_id)
            assert chosen.backend == context.backend == decision.backend and decision.device == profile
            assert chosen.rejects(Problem(KERNELS[kernel], {"F32": "f32", "FP16": "f16", "BF16": "bf16"}[precision]),
                                  context.capabilities) is None


@pytest.mark.parametrize("device,kernel,facts,variant,rejected", [
    ("sm_90a", "gemm", dict(m=512, n=512, k=512, transpose_a=False, batched_b=False), "cuda.gemm.wgmma", {}),
    ("sm_80", "gemm", dict(m=512, n=512, k=512), "cuda.gemm.mma_sync", {"cuda.gemm.wgmma": "architecture is sm_80"}),
    ("sm_90a", "gemm", dict(m=512, n=512, k=512, transpose_a=True), "cuda.gemm.mma_sync",
     {"cuda.gemm.wgmma": "needs a plain A (not transposed)"}),
    ("sm_90a", "fused_gemm", dict(m=64, n=30, k=64), "cuda.gemm.simt",
     {"cuda.gemm.wgmma": "needs K and N multiples of 8", "cuda.gemm.mma_sync": "needs K and N multiples of 8"}),
    ("sm_90a", "flash_attention_2", dict(head_dim=32), "cuda.attention.mma_sync",
     {"cuda.attention.wgmma": "needs a head dim of 64, 128, 192 or 256"}),
    ("skylake-avx512", "gemm", dict(m=32, n=2048, k=2048, transpose_a=False, transpose_b=True),
     "cpu.gemm.inner_product", {}),
    ("skylake-avx512", "gemm", dict(m=512, n=2048, k=2048, transpose_a=False, transpose_b=True), "cpu.gemm.packed",
     {"cpu.gemm.inner_product": "needs x @ W^T with at most 32 rows"}),
    ("graviton3-neon", "attention", dict(head_dim=6), "cpu.reference",
     {"cpu.attention.flash": "needs head dims multiples of the SIMD lanes"}),
])
def test_decisions_and_their_reasons(device, kernel, facts, variant, rejected):
    decision = Context(device).plan_kernel(kernel, precision="BF16", **facts)
    assert decision.variant_id == variant
    reasons = dict(decision.rejected)
    for other, why in rejected.items():
        assert reasons[other].startswith(why), (other, reasons[other])


def test_a_key_length_known_at_run_time_or_a_mask_is_the_cpu_kernels_alone():
    """Attention over a KV cache of run-time length, or with a mask operand: the CPU flash kernel
    takes it (its head dims fitting the lanes, else the reference loops); no GPU variant does,
    and says why."""
    assert Context("zen3-avx2").plan_kernel("attention", "F32", head_dim=64, dynamic=True).variant_id \
        == "cpu.attention.flash"
    assert Context("zen3-avx2").plan_kernel("attention", "F32", head_dim=6, dynamic=True).variant_id == "cpu.reference"
    with pytest.raises(PlanError, match="needs static shapes"):
        Context("sm_90a").plan_kernel("attention", "F16", head_dim=64, dynamic=True)
    assert Context("zen3-avx2").plan_kernel("attention", "F32", head_dim=64, masked=True).variant_id \
        == "cpu.attention.flash"
    with pytest.raises(PlanError, match="takes no attention mask"):
        Context("sm_90a").plan_kernel("attention", "F16", head_dim=64, masked=True)


def test_a_plan_with_shapes_carries_the_schedule_it_will_use():
    decision = Context("zen3-avx2").plan_kernel("gemm", "F32", m=1024, n=1024, k=1024, threads=2)
    assert decision.schedule.lane_map.shape == (8,) and decision.schedule.warp_tile[1] == 16  # 2 x 8 lanes
    assert Context("sm_80").plan_kernel("gemm", "F16").schedule.as_dict() == {
        "tile": [128, 128, 32], "warp_tile": [64, 64, 32], "stages": 3}
    assert Context("sm_90a").plan_kernel("attention", "BF16", head_dim=256).schedule.as_dict() == {
        "tile": [128, 64], "stages": 2, "barrier": "pingpong"}


def test_the_seeds_api():
    """tracea.Context() profiles this machine (its best device) and plans the seeds' kernel name."""
    decision = tracea.Context().plan_kernel("flash_attention_2", precision="BF16")
    expected = "cuda.attention" if not isinstance(probe_nvidia(), str) else "cpu.attention.flash"
    assert decision.variant_id.startswith(expected) and decision.backend in ("cpu", "cuda")
    assert f"{decision.variant_id} on {decision.backend}" in decision.describe()


def test_unknown_names_list_the_known_ones():
    with pytest.raises(PlanError, match="unknown kernel 'flash_attention_3'; known: gemm, matmul"):
        Context("cpu").plan_kernel("flash_attention_3")
    with pytest.raises(PlanError, match="unknown precision 'FP8'; known: BF16, F16, F32"):
        Context("cpu").plan_kernel("gemm", precision="FP8")
    with pytest.raises(PlanError, match="does not take tile; it takes"):
        Context("cpu").plan_kernel("gemm", tile=(1, 2))
    with pytest.raises(PlanError, match="unknown device profile 'sm_75'; known: zen3-avx2"):
        Context("sm_75")
    if isinstance(probe_nvidia(), str):
        with pytest.raises(PlanError, match="no NVIDIA device here: .*'sm_90a'"):
            Context("cuda")


def _selected(ir_text: str, arch: str) -> list[str]:
    from tracea.passes.pipeline import parse_pipeline, run_pipeline
    result = run_pipeline(ir_text, parse_pipeline(f"tracea-select-variant{{arch={arch} threads=2}}"))
    assert result.ok, result.diagnostics
    return [line.split('tracea.variant = "')[1].split('"')[0] for line in result.text.splitlines()
            if "tracea.variant" in line]


def test_the_choice_written_into_the_ir_is_the_engines():
    fn = td.function(td.tensor((64, 2048), "bf16"), td.tensor((256, 2048), "bf16"), td.tensor((4, 64, 64), "bf16"),
                     name="f")(lambda x, w, q: (td.gemm(x, w, transpose_b=True), td.attention(q, q, q, causal=True),
                                                td.softmax(q)))
    for arch in ("sm_90a", "skylake-avx512", "x86-64-sse"):
        facts = [dict(kernel="gemm", m=64, n=256, k=2048, transpose_a=False, transpose_b=True, batched_b=False),
                 dict(kernel="attention", head_dim=64), dict(kernel="softmax", last_axis=True)]
        expected = []
        for f in facts:
            try:
                expected.append(Context(arch).plan_kernel(precision="BF16", threads=2, **f).variant_id)
            except PlanError:
                expected.append(None)
        if None in expected:  # the GPU has no softmax: the pass names the op it cannot place
            from tracea.passes.pipeline import parse_pipeline, run_pipeline
            result = run_pipeline(fn.text(), parse_pipeline(f"tracea-select-variant{{arch={arch}}}"))
            assert not result.ok and "'tracea.softmax' op no kernel variant computes softmax" in str(result.diagnostics[0])
            continue
        assert _selected(fn.text(), arch) == expected


def _doctor(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tracea.tools.cli", "doctor", *args], capture_output=True, text=True,
                          timeout=300)


def test_tracea_doctor_on_this_host():
    done = _doctor()
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.startswith("Devices\n  host (cpu): ") and "NVIDIA GPUs: " in out
    assert all(tool in out for tool in ("llvmlite", "ptxas", "torch-mlir", "spirv-val"))
    assert "Kernel variants on host (cpu), best first" in out
    assert "fused_gemm  BF16       cpu.gemm.packed" in out
    data = json.loads(_doctor("--json", "--target", "sm_90a", "--target", "zen3-avx2").stdout)
    assert [d["name"] for d in data["devices"]] == ["sm_90a", "zen3-avx2"]
    chosen = {(p["device"], p["op"], p["precision"]): p["variant"] for p in data["plans"]}
    assert chosen["sm_90a", "gemm", "BF16"] == "cuda.gemm.wgmma" and chosen["sm_90a", "softmax", "F32"] is None
    assert chosen["zen3-avx2", "conv2d", "F32"] == "cpu.conv2d.direct_nchw"
    bad = _doctor("--target", "gfx9000")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "unknown device profile 'gfx9000'" in bad.stderr


def test_the_support_matrix_in_the_docs_is_the_registrys():
    from pathlib import Path

    from tracea.doctor.report import support_matrix
    page = Path(__file__).parent.parent / "docs" / "BACKENDS.md"
    assert page.read_text() == support_matrix(), "regenerate docs/BACKENDS.md (see its first lines)"


def test_a_variant_checks_a_schedule_without_emitting_it():
    """The tuner's legality check: each variant names what is wrong with a schedule."""
    from tracea.codegen.variants import variant
    from tracea.errors import OpError
    gemm, attention = Problem("gemm", "f16", transpose_b=False), Problem("attention", "f16", head_dim=64)
    good, sm80, sm90 = td.Schedule(tile=(128, 128, 32), warp_tile=(64, 64, 32), stages=3), named("sm_80"), named("sm_90a")
    variant("cuda.gemm.mma_sync").check_schedule(gemm, sm80, good)
    with pytest.raises(OpError, match="warp tile 48x64 must divide the block tile"):
        variant("cuda.gemm.mma_sync").check_schedule(gemm, sm80, td.Schedule(tile=(128, 128, 32), warp_tile=(48, 64, 32)))
    with pytest.raises(OpError, match="only the sm_90a GEMM of plain matrices"):
        variant("cuda.gemm.mma_sync").check_schedule(gemm, sm80, td.Schedule(tile=(128, 128, 32), cluster=2))
    with pytest.raises(OpError, match="block_k must be 64"):
        variant("cuda.gemm.wgmma").check_schedule(gemm, sm90, good)
    with pytest.raises(OpError, match="block_m 96 must be 64, 128, 192 or 256"):
        variant("cuda.attention.wgmma").check_schedule(attention, sm90, td.Schedule(tile=(96, 64), stages=2))
    with pytest.raises(OpError, match="needs NR a multiple of the 8 SIMD lanes"):
        variant("cpu.gemm.packed").check_schedule(gemm, named("zen3-avx2"), td.Schedule(
            tile=(64, 60, 64), warp_tile=(4, 12, 1), lane_map=td.LaneMap("simd", (8,))))
