"""The Metal target: MSL written by SPIRV-Cross from the Vulkan target's SPIR-V, compared with
golden files (no Metal compiler exists off macOS), parsed and type-checked by clang's front end
(msl_check) and checked for its entry point, buffers and threadgroup use; run through PyObjC on
macOS only.

Regenerate the golden files after an intended change: TRACEA_UPDATE_GOLDEN=1 pytest test/test_metal.py"""
from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import reference as ref
import tracea
from tracea import dialects as td
from tracea.runtime.gpu_artifact import MetalKernelArtifact
from tracea.targets.spirv.msl_check import msl_errors

GOLDEN = Path(__file__).parent / "golden" / "metal"
pytestmark = pytest.mark.skipif(shutil.which("spirv-cross") is None,
                                reason="SPIRV-Cross is not installed (apt-get install spirv-cross)")
on_macos = pytest.mark.skipif(sys.platform != "darwin", reason="Metal runs on macOS only; here the MSL is checked "
                                                                "against golden files and clang's front end")


def _programs():
    t = td.tensor
    return {
        "gemm_bias_gelu": td.function(t((70, 33)), t((130, 33)), t(130), name="gemm_bias_gelu")(
            lambda a, w, b: td.fused_gemm(a, w, [td.bias_add(b), td.gelu()], transpose_b=True)),
        "softmax": td.function(t((4, 100)), name="softmax")(td.softmax),
        "attention_causal": td.function(t((1, 2, 40, 16)), t((1, 2, 40, 16)), t((1, 2, 40, 16)), name="attention_causal")(
            lambda q, k, v: td.attention(q, k, v, causal=True)),
        "conv_nhwc": td.function(t((1, 8, 8, 3)), t((3, 3, 3, 5)), name="conv_nhwc")(
            lambda x, f: td.conv2d(x, f, padding=1, layout="nhwc")),
    }


@pytest.mark.parametrize("name", list(_programs()))
def test_msl_matches_its_golden_file_and_is_a_whole_kernel(name):
    artifact = tracea.compile_gpu(_programs()[name], chip="metal-apple")
    golden = GOLDEN / f"{name}.metal"
    if os.environ.get("TRACEA_UPDATE_GOLDEN"):
        golden.write_text(artifact.msl)
    assert artifact.msl == golden.read_text(), f"the MSL of {name} changed: TRACEA_UPDATE_GOLDEN=1 to accept it"
    signature = re.search(rf"kernel void {name}\((.*)\)\n\{{", artifact.msl)
    assert signature, "no kernel entry point named after the function"
    buffers = sorted(int(i) for i in re.findall(r"\[\[buffer\((\d+)\)\]\]", signature.group(1)))
    assert buffers == list(range(len(artifact.params)))  # buffer i is parameter i
    assert "[[threadgroup_position_in_grid]]" in signature.group(1)
    assert msl_errors(artifact.msl) == []
    threads = artifact.block[0] * artifact.block[1] * artifact.block[2]
    assert threads <= 1024 and threads % 32 == 0  # whole simdgroups, within Metal's limit


def _more_programs():
    t = td.tensor
    return {
        "batched_gemm": td.function(t((3, 20, 30)), t((3, 30, 10)))(td.gemm),
        "gemm_silu": td.function(t((20, 30)), t((40, 30)))(lambda a, w: td.fused_gemm(a, w, [td.silu()], transpose_b=True)),
        "gemm_hardswish": td.function(t((20, 30)), t((40, 30)))(
            lambda a, w: td.fused_gemm(a, w, [td.hardswish()], transpose_b=True)),
        "gemm_gelu_tanh": td.function(t((20, 30)), t((40, 30)))(
            lambda a, w: td.fused_gemm(a, w, [td.gelu(approximate="tanh")], transpose_b=True)),
        "softmax_3d": td.function(t((2, 3, 257)))(td.softmax),
        "attention_scaled": td.function(t((2, 2, 17, 16)), t((2, 2, 33, 16)), t((2, 2, 33, 24)))(
            lambda q, k, v: td.attention(q, k, v, scale=0.3)),
    }


@pytest.mark.parametrize("name", list(_more_programs()))
def test_msl_of_every_kind_of_kernel_type_checks(name):
    """Beyond the golden files: the MSL of the other kernels the Metal target makes (batched,
    other epilogues, a 3-D softmax, attention with its own scale and value width) parses and
    type-checks (msl_check: clang's front end against a shim of Metal's library)."""
    assert msl_errors(tracea.compile_gpu(_more_programs()[name], chip="metal-apple").msl) == []


@pytest.mark.parametrize("edit, error", [
    (("_workgroup_mem_0._m0[gl_LocalInvocationID.x] = ", "_workgroup_mem_0._m0[gl_LocalInvocationID.x] = _undeclared + "),
     "undeclared identifier '_undeclared'"),
    (("threadgroup _7 _workgroup_mem_0;", "threadgroup _7 _workgroup_mem_0; device float* p = &_workgroup_mem_0._m0[0];"),
     "__global float .* with an rvalue of type '__local float"),
    (("gl_LocalInvocationID.x;", "gl_LocalInvocationID;"), "uint3"),
    (("threadgroup_barrier(mem_flags::mem_threadgroup);", "threadgroup_barrier(mem_flags::mem_threadgroups);"),
     "no member named 'mem_threadgroups'"),
])
def test_the_msl_check_finds_what_a_metal_compiler_would(edit, error):
    """The check is not a formality: MSL with an undeclared name, a threadgroup pointer taken as a
    device one, a vector where a scalar goes, or a misspelt barrier flag is reported, with the
    line."""
    msl = tracea.compile_gpu(_programs()["softmax"], chip="metal-apple").msl
    assert edit[0] in msl
    errors = msl_errors(msl.replace(edit[0], edit[1], 1))
    assert len(errors) == 1 and re.search(error, errors[0]), errors
    line = int(errors[0].split(":")[0])
    assert edit[1].split()[0] in msl.replace(edit[0], edit[1], 1).splitlines()[line - 1]


def test_an_artifact_round_trips_and_compiling_for_metal_off_macos_names_the_reason(tmp_path):
    fn = _programs()["softmax"]
    artifact = tracea.compile_gpu(fn, chip="metal-apple")
    assert MetalKernelArtifact.load(artifact.save(tmp_path / "k")) == artifact
    if sys.platform != "darwin":
        from tracea.runtime.metal_runtime import MetalError
        with pytest.raises(MetalError, match="macOS only"):
            tracea.compile(fn, target="metal")
    from tracea.targets import get_target
    with pytest.raises(ValueError, match="not a Metal one"):
        get_target("metal").options(chip="vulkan-lavapipe")


@on_macos
def test_kernels_run_on_the_mac_against_numpy():
    rng = np.random.default_rng(0)
    a, w, b = ref.random(rng, (70, 33)), ref.random(rng, (130, 33)), ref.random(rng, (130,))
    kernel = tracea.compile(_programs()["gemm_bias_gelu"], target="metal")
    import torch
    expected = torch.nn.functional.gelu(torch.from_numpy(ref.gemm(a, w, transpose_b=True) + b)).numpy()
    ref.assert_close(kernel(a, w, b), expected, "f32", 33)


NEWER_SPIRV_CROSS = Path(__file__).parent.parent / ".cache" / "newer-debian" / "bin" / "spirv-cross"


def _f16_gemm(transpose_b: bool, m: int = 64, n: int = 48, k: int = 32):
    return td.function(td.tensor((m, k), "f16"), td.tensor((n, k) if transpose_b else (k, n), "f16"), name="gemm_f16")(
        lambda a, b: td.gemm(a, b, transpose_b=transpose_b, out_dtype="f32"))


@pytest.mark.skipif(not NEWER_SPIRV_CROSS.exists(), reason=f"no SPIRV-Cross new enough for simdgroup matrices at "
                    f"{NEWER_SPIRV_CROSS} (./dev test unpacks Debian unstable's: scripts/newer_debian.py fetch)")
@pytest.mark.parametrize("transpose_b", [False, True])
def test_f16_gemm_on_simdgroup_matrices(monkeypatch, transpose_b):
    """On metal3-apple (MSL 3.1) an f16 GEMM of whole 8 x 8 tiles runs on simdgroup matrices:
    the cooperative-matrix SPIR-V made into simdgroup_load / simdgroup_multiply_accumulate /
    simdgroup_store by SPIRV-Cross (Vulkan SDK 1.4.350 and newer), B^T loaded transposed, the
    accumulator from a zeroed threadgroup tile; clang's front end type-checks it against the
    shim's simdgroup_matrix (a half matrix loaded from a float buffer is an error there)."""
    monkeypatch.setenv("TRACEA_SPIRV_CROSS", str(NEWER_SPIRV_CROSS))
    artifact = tracea.compile_gpu(_f16_gemm(transpose_b), chip="metal3-apple")
    msl = artifact.msl
    assert artifact.arch == "metal3.1" and artifact.grid == (48 // 8, 64 // 8, 1) and artifact.block == (32, 1, 1)
    assert "#include <metal_simdgroup_matrix>" in msl
    assert msl.count("simdgroup_multiply_accumulate(") == 1 and msl.count("simdgroup_store(") == 1
    loads = re.findall(r"simdgroup_load\((\w+), &(\w+)\._m0\[[^;]*\);", msl)
    assert len(loads) == 3 and loads[0][1].startswith("_workgroup_mem")  # the zero accumulator, then A and B
    assert ("ulong2(0), true);" in msl) == transpose_b  # B [N, K] read as the transposed [K, N] operand
    assert re.search(r"simdgroup_half8x8 \w+;\n\s*simdgroup_load", msl) and "simdgroup_float8x8" in msl
    assert msl_errors(msl) == []
    assert msl_errors(msl.replace("simdgroup_half8x8", "simdgroup_float8x8")) != []
    # f32: the SIMT kernel, in the same MSL 3.1; f16 off the tile: no Metal kernel, and why
    simt = tracea.compile_gpu(td.function(td.tensor((64, 32)), td.tensor((32, 48)))(td.gemm), chip="metal3-apple").msl
    assert "simdgroup_matrix" not in simt and msl_errors(simt) == []
    with pytest.raises(tracea.CompileError, match="multiples of the device's matrix tile.*simt: inputs are f16"):
        tracea.compile_gpu(_f16_gemm(transpose_b, m=60), chip="metal3-apple")


def test_simdgroup_matrices_need_metal_3_1_and_a_new_spirv_cross(monkeypatch):
    """metal-apple (MSL 2.3) has no kernel for the f16 GEMM (the reason named); on metal3-apple a
    SPIRV-Cross that predates them (Debian's) fails with an error that names both ways out."""
    from tracea.doctor import Context
    plan = Context("metal3-apple").plan_kernel("gemm", precision="f16", m=64, n=48, k=32, out_dtype="f32")
    assert plan.variant_id == "metal.gemm.simdgroup_matrix"
    with pytest.raises(Exception, match=r"on metal-apple: metal.gemm.simdgroup_matrix: needs simdgroup matrices "
                                        r"and MSL 3.1 \(the metal3-apple profile\)"):
        Context("metal-apple").plan_kernel("gemm", precision="f16", m=64, n=48, k=32, out_dtype="f32")
    monkeypatch.setenv("TRACEA_SPIRV_CROSS", shutil.which("spirv-cross"))  # Debian 12's (2021)
    with pytest.raises(tracea.CompileError, match=r"predates simdgroup matrices .*scripts/newer_debian.py fetch"
                                                  r".*chip='metal-apple'"):
        tracea.compile_gpu(_f16_gemm(False), chip="metal3-apple")
