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
from tracea.runtime.amd_emulator import EmulatedHipKernel, EmulatorError, lds_conflicts
from tracea.runtime.gpu_artifact import HsacoKernelArtifact
from tracea.dialects.schedule import Swizzle
from tracea.targets.rocdl.matrix import LDS_SWIZZLE, MatrixTiles, instruction_for, report_lds
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
    bf16 = td.function(td.tensor((64, 60), "bf16"), td.tensor((60, 64), "bf16"))(td.gemm)  # K not a multiple of 8
    with pytest.raises(CompileError, match="rocm.gemm.simt: inputs are bf16, not f32 / f16"):
        tracea.compile_gpu(bf16, chip="gfx942")
    for chip in ROCM_PROFILES:
        assert Context(chip).plan_kernel("gemm", "BF16", m=64, n=64, k=64).variant_id == "rocm.gemm.matrix_cores"


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


# --- the matrix-core GEMM (MFMA on CDNA, WMMA on RDNA3) --------------------------------------------
MATRIX_OPS = {"gfx90a": "v_mfma_f32_32x32x8{}", "gfx942": "v_mfma_f32_32x32x8_{}", "gfx1100": "v_wmma_f32_16x16x16_{}"}


def _matrix_case(case: str, dtype: str):
    """(program, inputs, expected, k) of ragged shapes: M, N past the tiles, K a multiple of 8 but
    not of the 32 of an LDS tile, several K tiles."""
    rng = np.random.default_rng(len(case) + len(dtype))
    t = td.tensor
    if case == "linear_bias_gelu_f16_out":  # nn.Linear's B^T, the epilogue, a 16-bit result
        m, n, k = 150, 264, 200
        x, w, b = ref.random(rng, (m, k), dtype), ref.random(rng, (n, k), dtype), ref.random(rng, (n,), "f32")
        fn = td.function(t((m, k), dtype), t((n, k), dtype), t((n,), "f32"))(
            lambda a, ww, bb: td.fused_gemm(a, ww, [td.bias_add(bb), td.gelu()], transpose_b=True))
        return fn, [x, w, b], ref.epilogue(ref.gemm(x, w, transpose_b=True), [("bias_add", None), ("gelu", None)], bias=b), k
    m, n, k = 70, 136, 72  # B as [K, N]: transposed while stored into LDS; an f32 result, a residual
    x, w, r = ref.random(rng, (m, k), dtype), ref.random(rng, (k, n), dtype), ref.random(rng, (m, n), "f32")
    fn = td.function(t((m, k), dtype), t((k, n), dtype), t((m, n), "f32"))(
        lambda a, ww, rr: td.fused_gemm(a, ww, [td.residual_add(rr)], out_dtype="f32"))
    return fn, [x, w, r], ref.epilogue(ref.gemm(x, w), [("residual_add", None)], residual=r), k


@pytest.mark.parametrize("chip", list(ROCM_PROFILES))
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("case", ["linear_bias_gelu_f16_out", "gemm_residual"])
def test_matrix_core_gemms_run_on_the_emulator(chip, dtype, case):
    fn, xs, expected, k = _matrix_case(case, dtype)
    artifact = tracea.compile_gpu(fn, chip=chip)
    assert MATRIX_OPS[chip].format(dtype) in artifact.asm
    gpu = ROCM_PROFILES[chip]
    tiles = MatrixTiles.default(instruction_for(gpu.matrix_units))
    assert artifact.lds_bytes == tiles.lds_bytes() and 0 < artifact.vgprs <= gpu.registers_per_thread
    assert artifact.block == (4 * gpu.warp_size, 1, 1)
    out = EmulatedHipKernel(artifact)(*xs)
    ref.assert_close(out, expected, "f32" if out.dtype == np.float32 else dtype, k)


@pytest.mark.parametrize("chip", ["gfx90a", "gfx1100"])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_matrix_core_batched_and_transposed_operands(chip, dtype):
    """A batched B (workgroup z computes matrix z of a [2, 3] batch) and an A stored [K, M]
    (transposed while stored into LDS, like a [K, N] B)."""
    rng = np.random.default_rng(4)
    cases = [((2, 3, 40, 48), (2, 3, 56, 48), dict(transpose_b=True)), ((48, 72), (48, 40), dict(transpose_a=True))]
    for a_shape, b_shape, flags in cases:
        a, b = ref.random(rng, a_shape, dtype), ref.random(rng, b_shape, dtype)
        fn = td.function(td.tensor(a_shape, dtype), td.tensor(b_shape, dtype))(
            lambda x, y: td.gemm(x, y, out_dtype="f32", **flags))
        artifact = tracea.compile_gpu(fn, chip=chip)
        assert MATRIX_OPS[chip].format(dtype) in artifact.asm
        ref.assert_close(EmulatedHipKernel(artifact)(a, b), ref.gemm(a, b, **flags), "f32", 48)


@pytest.mark.parametrize("chip", list(ROCM_PROFILES))
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_matrix_core_conv_gathers_the_image_on_the_emulator(chip, dtype):
    """An NHWC conv (stride, dilation, padding on every side, bias, a hardswish after it) as the
    matrix-core implicit GEMM: each 16-byte A chunk is 8 channels of one image pixel, zero in the
    padding; the bias and the activation are the GEMM's epilogue."""
    x_shape, w_shape = (2, 9, 11, 16), (3, 3, 16, 24)
    fn = td.function(td.tensor(x_shape, dtype), td.tensor(w_shape, dtype), td.tensor((24,), "f32"))(
        lambda x, w, b: td.conv2d(x, w, b, stride=(2, 1), padding=1, dilation=(1, 2), layout="nhwc",
                                  epilogue=[td.hardswish()]))
    artifact = tracea.compile_gpu(fn, chip=chip)
    assert MATRIX_OPS[chip].format(dtype) in artifact.asm
    rng = np.random.default_rng(2)
    xs = [ref.random(rng, x_shape, dtype), ref.random(rng, w_shape, dtype), ref.random(rng, (24,), "f32")]
    expected = ref.epilogue(ref.conv2d(*xs, stride=(2, 1), padding=(1, 1, 1, 1), dilation=(1, 2), layout="nhwc"),
                            [("hardswish", None)])
    ref.assert_close(EmulatedHipKernel(artifact)(*xs), expected, dtype, 144)
    # channels that are not whole 16-byte runs: the SIMT conv (f16), nothing for bf16
    odd = td.function(td.tensor((1, 5, 5, 12), dtype), td.tensor((3, 3, 12, 8), dtype))(
        lambda x, w: td.conv2d(x, w, padding=1, layout="nhwc"))
    if dtype == "f16":
        assert MATRIX_OPS[chip].format(dtype) not in tracea.compile_gpu(odd, chip=chip).asm
    else:
        with pytest.raises(CompileError, match="channels in and out multiples of 8"):
            tracea.compile_gpu(odd, chip=chip)


@pytest.mark.parametrize("chip", list(ROCM_PROFILES))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_matrix_core_attention_on_the_emulator(chip, causal, dtype):
    """Flash attention on MFMA / WMMA: ragged sequences (neither a multiple of the blocks), scores
    of tens and a late dominant key (the running max and the rescaling both needed), a value head
    dim other than the query's; the row max travels between lanes (ds_swizzle on CDNA,
    ds_bpermute on RDNA3)."""
    rng = np.random.default_rng(7)
    b, h, sq, sk, d, dv = 2, 2, 37, 45, 64, 32
    q, k, v = ref.random(rng, (b, h, sq, d), dtype), ref.random(rng, (b, h, sk, d), dtype), \
        ref.random(rng, (b, h, sk, dv), dtype)
    q = (q.astype(np.float32) * 4).astype(q.dtype)
    k[:, :, 40] = (q.astype(np.float32).mean(axis=2) * 2).astype(k.dtype)
    fn = td.function(td.tensor(q.shape, dtype), td.tensor(k.shape, dtype), td.tensor(v.shape, dtype))(
        lambda x, y, z: td.attention(x, y, z, causal=causal))
    artifact = tracea.compile_gpu(fn, chip=chip)
    assert MATRIX_OPS[chip].format(dtype) in artifact.asm
    assert ("ds_bpermute_b32" if chip == "gfx1100" else "ds_swizzle_b32") in artifact.asm
    assert artifact.scratch_bytes == 0 and artifact.vgprs <= ROCM_PROFILES[chip].registers_per_thread
    ref.assert_close(EmulatedHipKernel(artifact)(q, k, v), ref.attention(q, k, v, None, causal), dtype, sk)


@pytest.mark.parametrize("chip", ["gfx942", "gfx1100"])
@pytest.mark.parametrize("transpose_b", [True, False])
@pytest.mark.parametrize("transpose_a", [False, True])
def test_matrix_core_lds_tiles_are_conflict_free(chip, transpose_b, transpose_a):
    """The bank model says the swizzled tiles' 16-byte stores and fragment reads are conflict-free
    (and the unswizzled ones are not); the emulator measures the same on every LDS instruction of
    the machine code, the transposing 2-byte stores of a [K, N] B included."""
    ins = instruction_for(ROCM_PROFILES[chip].matrix_units)
    tiles = MatrixTiles.default(ins)
    assert report_lds(tiles, ins) == {"store": 0, "read": 0}
    import tracea.targets.rocdl.matrix as matrix
    try:
        matrix.LDS_SWIZZLE = Swizzle()
        assert report_lds(tiles, ins)["read"] > 0
    finally:
        matrix.LDS_SWIZZLE = LDS_SWIZZLE
    m, n, k = 136, 136, 64
    a_shape, b_shape = (k, m) if transpose_a else (m, k), (n, k) if transpose_b else (k, n)
    fn = td.function(td.tensor(a_shape, "f16"), td.tensor(b_shape, "f16"))(
        lambda a, b: td.gemm(a, b, transpose_a=transpose_a, transpose_b=transpose_b))
    kernel = EmulatedHipKernel(tracea.compile_gpu(fn, chip=chip), record_lds=True)
    rng = np.random.default_rng(1)
    kernel(ref.random(rng, a_shape, "f16"), ref.random(rng, b_shape, "f16"))
    measured = lds_conflicts(kernel.lds_accesses)
    assert len(measured) >= 8 and max(measured.values()) == 0, measured


def test_compile_for_rocm_runs_on_the_emulator_when_asked(monkeypatch):
    """TRACEA_AMD_EMULATOR=1: tracea.compile(fn, target="rocm", chip=...) returns a callable on
    numpy arrays with no GPU (the matrix-core kernel here); without a chip it says which to name."""
    monkeypatch.setenv("TRACEA_AMD_EMULATOR", "1")
    fn = td.function(td.tensor((40, 64), "f16"), td.tensor((48, 64), "f16"))(
        lambda a, b: td.gemm(a, b, transpose_b=True, out_dtype="f32"))
    kernel = tracea.compile(fn, target="rocm", chip="gfx1100")
    assert isinstance(kernel, EmulatedHipKernel)
    rng = np.random.default_rng(5)
    x, w = ref.random(rng, (40, 64), "f16"), ref.random(rng, (48, 64), "f16")
    ref.assert_close(kernel(x, w), ref.gemm(x, w, transpose_b=True), "f32", 64)
    with pytest.raises(ValueError, match="pass chip="):
        tracea.compile(fn, target="rocm")
