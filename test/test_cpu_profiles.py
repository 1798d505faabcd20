"""Other CPUs' code paths, forced on this host (TRACEA_CPU): the default schedules follow the
named profile's SIMD width, registers and caches, and the kernels, run here (LLVM splits vectors
wider than the host's), match numpy."""
from __future__ import annotations

import re

import numpy as np
import pytest

import tracea
from tracea import dialects as td
from tracea.doctor.capabilities import CPU_PROFILES as PROFILES, host_cpu, probe_cpu
import reference as ref


def _functions():
    rng = np.random.default_rng(0)
    a, b, bias = ref.random(rng, (67, 45)), ref.random(rng, (45, 70)), ref.random(rng, (70,))
    w = ref.random(rng, (70, 45))
    x = ref.random(rng, (2, 3, 11, 12), scale=30.0)
    q, k, v = ref.random(rng, (2, 19, 16)), ref.random(rng, (2, 23, 16)), ref.random(rng, (2, 23, 8))
    img, filt = ref.random(rng, (1, 3, 12, 11)), ref.random(rng, (5, 3, 3, 3))
    yield "fused_gemm", (lambda p, r, s: td.fused_gemm(p, r, [td.bias_add(s), td.gelu()])), (a, b, bias), \
        ref.epilogue(ref.gemm(a, b), [("bias_add", None), ("gelu", "erf")], bias), 45
    yield "linear", (lambda p, r: td.gemm(p, r, transpose_b=True)), (a, w), ref.gemm(a, w, False, True), 45
    yield "softmax", td.softmax, (x,), ref.softmax(x), 1
    yield "attention", (lambda p, r, s: td.attention(p, r, s, causal=True)), (q, k, v), \
        ref.attention(q, k, v, None, True), 23
    step = ref.random(rng, (2, 3, 16))  # a decoding step: three queries over the cache, read in place
    yield "decoding_attention", td.attention, (step, k, v), ref.attention(step, k, v), 23
    yield "conv2d", (lambda p, r: td.conv2d(p, r, padding=1)), (img, filt), ref.conv2d(img, filt, padding=(1, 1, 1, 1)), 27
    # NHWC with most pixels inside the image: those read by the micro-kernel from the image itself
    img, filt = ref.random(rng, (2, 20, 21, 32), scale=30.0), ref.random(rng, (3, 3, 32, 24))
    yield "conv2d_nhwc", (lambda p, r: td.conv2d(p, r, padding=1, layout="nhwc")), (img, filt), \
        ref.conv2d(img, filt, padding=(1, 1, 1, 1), layout="nhwc"), 288


@pytest.mark.parametrize("profile", list(PROFILES))
def test_kernels_planned_for_another_cpu_run_here(monkeypatch, profile):
    monkeypatch.setenv("TRACEA_CPU", profile)
    assert host_cpu() == PROFILES[profile]
    for name, body, inputs, expected, k in _functions():
        fn = td.function(*[td.tensor(x.shape) for x in inputs], name=name)(body)
        kernel = tracea.compile(fn, threads=2, keep_stages=True)
        lanes = PROFILES[profile].f32_lanes
        if name in ("fused_gemm", "softmax", "conv2d_nhwc"):  # vectors of the profile's width
            assert f"vector<{lanes}xf32>" in kernel.stages["linalg"], (profile, name)
        if name == "conv2d_nhwc":
            assert "memref<?xf32, strided<[1], offset: ?>>" in kernel.stages["linalg"], profile  # read in place
        ref.assert_close(kernel(*inputs), expected, "f32", k)


def test_an_unknown_profile_lists_the_known_ones(monkeypatch):
    monkeypatch.setenv("TRACEA_CPU", "pentium")
    fn = td.function(td.tensor((4, 4)), name="s")(td.softmax)
    with pytest.raises(ValueError, match="skylake-avx512"):
        tracea.compile(fn)


# registers an ISA's machine code never names: AVX2 has 16 ymm registers and no zmm or mask registers
_FOREIGN_REGISTERS = {"avx2": r"%zmm|%k[0-7]|%[xy]mm(?:1[6-9]|[23]\d)", "sse": r"%[yz]mm|%k[0-7]|%xmm(?:1[6-9]|[23]\d)"}
_ISA_ORDER = ["sse", "avx2", "avx512"]


@pytest.mark.parametrize("profile", [p for p in PROFILES if PROFILES[p].isa in _FOREIGN_REGISTERS])
def test_kernels_for_a_narrower_isa_are_its_machine_code(monkeypatch, profile):
    """On a host with a wider ISA (AVX2 planned on AVX-512), the kernel is compiled for the
    profile's ISA, not the host's with narrower vectors: none of the wider ISA's registers in its
    machine code, so it times here as it would on that CPU."""
    planned, host = PROFILES[profile], probe_cpu()
    if host.arch != planned.arch or _ISA_ORDER.index(host.isa) <= _ISA_ORDER.index(planned.isa):
        pytest.skip(f"this host ({host.arch} {host.isa}) has no ISA wider than {profile}'s")
    monkeypatch.setenv("TRACEA_CPU", profile)
    for name, body, inputs, expected, k in _functions():
        fn = td.function(*[td.tensor(x.shape) for x in inputs], name=name)(body)
        kernel = tracea.compile(fn, threads=2)
        foreign = re.findall(_FOREIGN_REGISTERS[planned.isa], ref.machine_code(kernel))
        assert not foreign, (profile, name, sorted(set(foreign))[:5])
        ref.assert_close(kernel(*inputs), expected, "f32", k)
