"""The ROCm target without an AMD GPU: HSACO code objects for CDNA (gfx90a, gfx942: wave64) and
RDNA3 (gfx1100: wave32) made through ROCDL, llvmlite's AMDGPU back end and ld.lld, read back: the
ELF, the instructions the SIMT kernels must use (LDS, barriers, FMAs), the resources against each
chip's limits, and the machine code run on Tracea's AMD ISA emulator (runtime/amd_emulator.py)
against numpy, on every chip."""
from __future__ import annotations

import dataclasses
import struct

import numpy as np
import pytest

import tracea
from tracea import dialects as td
from tracea.doctor import Context
from tracea.doctor.capabilities import ROCM_PROFILES
from tracea.errors import CompileError
from tracea.runtime.amd_emulator import EmulatedHipKernel, EmulatorError
from tracea.runtime.gpu_artifact import HsacoKernelArtifact
from tracea.targets.rocdl.target import Resources, check_launch, lld

import reference as ref

pytestmark = pytest.mark.skipif(lld() is None, reason="ld.lld 15 or newer is not installed (apt-get install lld-19)")
EM_AMDGPU = 224


def _programs():
    t = td.tensor
    return {
        "linear_bias_gelu": td.function(t((70, 33)), t((130, 33)), t(130), name="linear_bias_gelu")(
            lambda a, w, b: td.fused_gemm(a, w, [td.bias_add(b), td.gelu()], transpose_b=True)),
        "conv_nhwc": td.function(t((2, 9, 9, 3)), t((3, 3, 3, 8)), name="conv_nhwc")(
            lambda x, f: td.conv2d(x, f, stride=2, padding=1, layout="nhwc")),
        "attention_causal": td.function(t((1, 2, 70, 64)), t((1, 2, 70, 64)), t((1, 2, 70, 64)), name="attention_causal")(
            lambda q, k, v: td.attention(q, k, v, causal=True)),
        "softmax": td.function(t((8, 1000)), name="softmax")(td.softmax),
        "linear_f16": td.function(t((70, 33), "f16"), t((130, 33), "f16"), name="linear_f16")(
            lambda a, w: td.gemm(a, w, transpose_b=True)),
    }


LDS_BYTES = {"linear_bias_gelu": 2 * 16 * 64 * 4, "conv_nhwc": 2 * 16 * 64 * 4, "attention_causal": 2 * 32 * 64 * 4,
             "softmax": 256 * 4, "linear_f16": 2 * 16 * 64 * 4}
BLOCKS = {"linear_bias_gelu": (16, 16, 1), "conv_nhwc": (16, 16, 1), "attention_causal": (64, 1, 1),
          "softmax": (256, 1, 1), "linear_f16": (16, 16, 1)}


@pytest.mark.parametrize("chip", list(ROCM_PROFILES))
@pytest.mark.parametrize("program", list(_programs()))
def test_code_objects_for_each_chip(chip, program):
    artifact = tracea.compile_gpu(_programs()[program], chip=chip)
    elf = artifact.hsaco
    assert elf[:4] == b"\x7fELF" and struct.unpack_from("<H", elf, 18)[0] == EM_AMDGPU
    assert f"{program}.kd".encode() in elf  # the kernel descriptor HIP launches by
    asm = artifact.asm
    assert f'.amdgcn_target "amdgcn-amd-amdhsa--{chip}' in asm
    assert f".wavefront_size: {ROCM_PROFILES[chip].warp_size}" in asm
    # LDS tiles (CDNA's ds_write / ds_read are RDNA3's ds_store / ds_load), a barrier between
    # (none left in a workgroup of one wave, which needs none)
    assert ("ds_write" in asm or "ds_store" in asm) and ("ds_read" in asm or "ds_load" in asm)
    lanes = artifact.block[0] * artifact.block[1] * artifact.block[2]
    assert ("s_barrier" in asm) == (lanes > ROCM_PROFILES[chip].warp_size)
    assert any(op in asm for op in ("v_fma_f32", "v_fmac_f32", "v_pk_fma_f32", "v_max_f32", "v_max_num_f32"))
    assert "__ocml" not in asm  # exp / tanh / erf are Tracea's polynomials, not device-library calls
    if program.endswith("f16"):  # f16 read, computed in f32, written back as f16
        assert "v_cvt_f32_f16" in asm and "v_cvt_f16_f32" in asm
    gpu = ROCM_PROFILES[chip]
    assert 0 < artifact.vgprs <= gpu.registers_per_thread
    assert artifact.scratch_bytes == 0 or program == "attention_causal"  # (its query and output rows are private)
    assert artifact.lds_bytes == LDS_BYTES[program] <= gpu.shared_bytes_per_block
    assert artifact.block == BLOCKS[program]


def test_launches_the_chip_cannot_run_are_refused_by_name():
    with pytest.raises(CompileError, match="KiB of LDS"):
        check_launch("@k", "gfx942", Resources(64, 96 * 1024, 0), (256, 1, 1))
    with pytest.raises(CompileError, match="VGPRs per lane"):
        check_launch("@k", "gfx1100", Resources(300, 1024, 0), (256, 1, 1))
    with pytest.raises(CompileError, match="lanes per workgroup"):
        check_launch("@k", "gfx90a", Resources(32, 0, 0), (2048, 1, 1))


def test_the_doctor_artifacts_and_the_runtime_without_rocm(tmp_path):
    for chip in ROCM_PROFILES:
        assert Context(chip).plan_kernel("gemm", m=64, n=64, k=64).variant_id == "rocm.gemm.simt"
    fn = _programs()["linear_bias_gelu"]
    artifact = tracea.compile_gpu(fn, chip="gfx942")
    assert HsacoKernelArtifact.load(artifact.save(tmp_path / "k")) == artifact
    from tracea.runtime import hip_launcher
    try:
        hip_launcher._hip()
    except hip_launcher.HipError as e:
        with pytest.raises(hip_launcher.HipError, match="no ROCm runtime"):
            tracea.compile(fn, target="rocm", chip="gfx942")
        assert "compile_gpu" in str(e)
    with pytest.raises(ValueError, match="unsupported AMD processor 'gfx803'"):
        tracea.compile_gpu(fn, chip="gfx803")
    bf16 = td.function(td.tensor((64, 64), "bf16"), td.tensor((64, 64), "bf16"))(td.gemm)
    with pytest.raises(CompileError, match="rocm.gemm.simt: inputs are bf16, not f32 / f16"):
        tracea.compile_gpu(bf16, chip="gfx942")


# --- the machine code's numbers, on the emulator -----------------------------------------------
def _inputs(program: str, rng):
    """Inputs, and the expected result from numpy (float64) alone. Attention gets scores of
    tens (exp overflows without the running max) and a late, dominant key."""
    shapes = {"linear_bias_gelu": [(70, 33), (130, 33), (130,)], "conv_nhwc": [(2, 9, 9, 3), (3, 3, 3, 8)],
              "attention_causal": [(1, 2, 70, 64)] * 3, "softmax": [(8, 1000)], "linear_f16": [(70, 33), (130, 33)]}
    dtype = "f16" if program.endswith("f16") else "f32"
    xs = [ref.random(rng, s, dtype) for s in shapes[program]]
    if program == "linear_bias_gelu":
        a, w, b = xs
        return xs, ref.epilogue(ref.gemm(a, w, transpose_b=True), [("bias_add", None), ("gelu", None)], bias=b), 33
    if program == "conv_nhwc":
        return xs, ref.conv2d(*xs, stride=(2, 2), padding=(1, 1, 1, 1), layout="nhwc"), 27
    if program == "attention_causal":
        q, k, v = xs
        q *= 6
        k[:, :, 60] = q.mean(axis=2) * 2
        return xs, ref.attention(q, k, v, None, True), 70
    if program == "softmax":
        xs[0][3] *= 80  # a row of large logits
        return xs, ref.softmax(xs[0]), 1000
    return xs, ref.gemm(*xs, transpose_b=True), 33


@pytest.mark.parametrize("chip", list(ROCM_PROFILES))
@pytest.mark.parametrize("program", list(_programs()))
def test_the_machine_code_computes_the_op_on_the_emulator(chip, program):
    artifact = tracea.compile_gpu(_programs()[program], chip=chip)
    xs, expected, k = _inputs(program, np.random.default_rng(len(program)))
    out = EmulatedHipKernel(artifact)(*xs)
    assert out.dtype == (np.float16 if program.endswith("f16") else np.float32)
    ref.assert_close(out, expected, "f16" if program.endswith("f16") else "f32", k)


def _patched(artifact, old: str, new: str, count: int = 1):
    assert old in artifact.asm
    return dataclasses.replace(artifact, asm=artifact.asm.replace(old, new, count))


def test_the_emulator_catches_wrong_machine_code():
    """One instruction changed in the assembly changes the result; an address past the buffers
    and an instruction the emulator does not know are named, not run."""
    rng = np.random.default_rng(3)
    artifact = tracea.compile_gpu(_programs()["softmax"], chip="gfx942")
    x = ref.random(rng, (8, 1000))
    good = EmulatedHipKernel(artifact)(x)
    ref.assert_close(good, ref.softmax(x), "f32", 1000)
    wrong = EmulatedHipKernel(_patched(artifact, "v_max_f32_e32", "v_min_f32_e32"))(x)  # a max that is a min
    assert not np.allclose(wrong, good, rtol=1e-3)
    # the first global load 4 KiB past where it should read
    load = next(line for line in artifact.asm.splitlines() if "global_load_dword " in line)
    with pytest.raises(EmulatorError, match="outside every buffer"):
        EmulatedHipKernel(_patched(artifact, load, load + " offset:4096"))(x)
    with pytest.raises(EmulatorError, match="v_frobnicate_f32"):
        EmulatedHipKernel(_patched(artifact, "v_max_f32_e32", "v_frobnicate_f32"))(x)


def test_the_emulator_checks_arguments_like_the_gpu_runtime():
    artifact = tracea.compile_gpu(_programs()["linear_f16"], chip="gfx1100")
    with pytest.raises(tracea.TraceaError, match="shape"):
        EmulatedHipKernel(artifact)(np.zeros((70, 33), np.float16), np.zeros((13, 33), np.float16))
