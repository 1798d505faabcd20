"""The CUDA launcher (runtime/cuda_launcher.py). Without a GPU: parameter packing, argument checks,
DLPack parsing, binary compatibility and the errors a machine without a driver gets. With one
(and torch built for CUDA): the Tensor Core GEMM against torch."""
from __future__ import annotations

import ctypes
import subprocess
import sys

import numpy as np
import pytest

import tracea
from tracea.runtime import cuda_launcher as cl
from tracea.runtime import gpu_artifact as ga


def _cuda_device_or_none():
    try:
        return cl.Device.get(0)
    except tracea.TraceaError:
        return None


def test_parameters_are_packed_as_cuLaunchKernel_reads_them():
    art = ga.GpuKernelArtifact("k", "sm_80", b"", "", (1, 1, 1), (32, 1, 1), 0,
                               (ga.Param("x", "f16", (3, 5)), ga.Param("alpha", "f32"),
                                ga.Param("out", "f16", (3, 5), output=True)))
    arguments = art.launch_arguments([0xA000, 0.5, 0xB000])
    array, values = cl.pack_parameters(arguments)
    assert len(array) == len(arguments) == 7 + 1 + 7
    read = {"ptr": ctypes.c_void_p, "i64": ctypes.c_int64, "f32": ctypes.c_float}
    assert [read[kind].from_address(array[i]).value for i, (kind, _) in enumerate(arguments)] == \
        [0xA000, 0xA000, 0, 3, 5, 5, 1, 0.5, 0xB000, 0xB000, 0, 3, 5, 5, 1]


def test_host_memory_and_foreign_objects_are_refused_with_the_fix():
    with pytest.raises(tracea.ArgumentError, match=r"x is in host memory; .*x\.cuda\(\)"):
        cl.DeviceBuffer.from_dlpack(np.zeros((2, 2), np.float16), "x")
    with pytest.raises(tracea.ArgumentError, match="y is a list; pass a DeviceBuffer or a CUDA tensor"):
        cl.DeviceBuffer.from_dlpack([1, 2], "y")
    torch = pytest.importorskip("torch")
    with pytest.raises(tracea.ArgumentError, match="in host memory"):
        cl.DeviceBuffer.from_dlpack(torch.zeros(4, dtype=torch.bfloat16), "w")


def test_which_devices_run_which_code():
    def device(major, minor):
        d = object.__new__(cl.Device)
        d.compute_capability = (major, minor)
        return d

    assert device(8, 0).runs("sm_80") == "cubin" and device(8, 6).runs("sm_80") == "cubin"
    assert device(9, 0).runs("sm_80") == "ptx"  # another major architecture: the driver compiles the PTX
    assert device(9, 0).runs("sm_90a") == "cubin"
    assert device(10, 0).runs("sm_90a") is None and device(8, 0).runs("sm_90a") is None
    assert device(7, 5).runs("sm_80") is None


def test_a_machine_without_a_driver_gets_a_clear_error():
    pytest.importorskip("cuda.bindings")
    if _cuda_device_or_none() is not None:
        pytest.skip("this machine has a CUDA device")
    with pytest.raises(cl.CudaError, match="no CUDA driver on this machine|there is no CUDA device 0"):
        cl.Device.get(0)


def test_launcher_imports_without_tracea_or_mlir():
    """On a GPU machine without the compiler: tracea/runtime on sys.path, nothing else of Tracea."""
    import os
    runtime = os.path.dirname(cl.__file__)
    script = (f"import sys; sys.path.insert(0, {runtime!r}); import cuda_launcher, gpu_artifact; "
              "assert 'tracea' not in sys.modules and not any(m.startswith('mlir') for m in sys.modules); "
              "print(cuda_launcher.CudaKernel.__name__, issubclass(cuda_launcher.CudaError, gpu_artifact.TraceaError))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["CudaKernel", "True"]


# -- on a GPU ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gpu():
    device = _cuda_device_or_none()
    if device is None:
        pytest.skip("needs an NVIDIA GPU with its driver and cuda-bindings (none here)")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs torch built for CUDA")
    return device


def _skip_unless_runs(gpu, chip: str) -> None:
    if gpu.runs(chip) is None:
        pytest.skip(f"{gpu} cannot run {chip} code")


@pytest.mark.parametrize("chip", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("dtype,transpose_b", [("f16", False), ("bf16", True)])
def test_tensor_core_gemm_matches_torch(gpu, chip, dtype, transpose_b):
    """sm_80: mma.sync (on Hopper from its PTX); sm_90a: TMA + wgmma, on Hopper only."""
    import ml_dtypes
    import torch
    from tracea import dialects as td
    _skip_unless_runs(gpu, chip)
    m, n, k = 200, 264, 104
    b_shape = (n, k) if transpose_b else (k, n)
    fn = td.function(td.tensor((m, k), dtype), td.tensor(b_shape, dtype), name="gemm")(
        lambda a, b: td.gemm(a, b, transpose_b=transpose_b, out_dtype="f32"))
    kernel = cl.CudaKernel(tracea.compile_gpu(fn, chip=chip), gpu)
    torch_dtype = torch.float16 if dtype == "f16" else torch.bfloat16
    a = torch.randn(m, k, device="cuda", dtype=torch_dtype)
    b = torch.randn(*b_shape, device="cuda", dtype=torch_dtype)
    c = kernel(a, b)
    torch.cuda.synchronize()
    expected = a.float() @ (b.float().T if transpose_b else b.float())
    torch.testing.assert_close(c, expected, rtol=2e-2, atol=2e-2)
    host_a = a.cpu().view(torch.int16).numpy().view(np.float16 if dtype == "f16" else ml_dtypes.bfloat16)
    with cl.DeviceBuffer.from_numpy(host_a, gpu) as a_buffer:
        out = kernel(a_buffer, b)  # a DeviceBuffer and a torch tensor mixed
        torch.cuda.synchronize()
        torch.testing.assert_close(out, expected, rtol=2e-2, atol=2e-2)
        assert np.array_equal(a_buffer.to_numpy().view(np.int16), host_a.view(np.int16))
    assert a_buffer.ptr == 0  # freed on leaving the block
    with pytest.raises(tracea.ArgumentError, match=r"must be"):
        kernel(a[:, :-1].contiguous(), b)


@pytest.mark.parametrize("stride,padding", [(1, 1), (2, 0)])
def test_nhwc_conv2d_matches_torch(gpu, stride, padding):
    import torch
    from tracea import dialects as td
    n, h, w, c, f = 2, 20, 18, 32, 48
    fn = td.function(td.tensor((n, h, w, c), "f16"), td.tensor((3, 3, c, f), "f16"), td.tensor((f,), "f32"),
                     name="conv")(lambda x, k, b: td.conv2d(x, k, b, stride=stride, padding=padding, layout="nhwc",
                                                            out_dtype="f32"))
    kernel = cl.CudaKernel(tracea.compile_gpu(fn, chip="sm_80"), gpu)
    x = torch.randn(n, h, w, c, device="cuda", dtype=torch.float16)
    k = torch.randn(3, 3, c, f, device="cuda", dtype=torch.float16)
    b = torch.randn(f, device="cuda", dtype=torch.float32)
    out = kernel(x, k, b)
    torch.cuda.synchronize()
    expected = torch.nn.functional.conv2d(x.float().permute(0, 3, 1, 2), k.float().permute(3, 2, 0, 1), b,
                                          stride=stride, padding=padding).permute(0, 2, 3, 1)
    torch.testing.assert_close(out, expected, rtol=2e-2, atol=5e-2)


@pytest.mark.parametrize("chip", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("dtype,causal,seq,dim", [("f16", False, 200, 64), ("bf16", True, 129, 64),
                                                  ("bf16", True, 300, 128)])
def test_flash_attention_matches_torch_sdpa(gpu, chip, dtype, causal, seq, dim):
    """sm_80: mma.sync; sm_90a: the wgmma kernel (producer warpgroup, 3-D TMA maps), on Hopper only."""
    import torch
    from tracea import dialects as td
    _skip_unless_runs(gpu, chip)
    shape = (2, 3, seq, dim)
    fn = td.function(*[td.tensor(shape, dtype)] * 3, name="attn")(lambda q, k, v: td.attention(q, k, v, causal=causal))
    kernel = cl.CudaKernel(tracea.compile_gpu(fn, chip=chip), gpu)
    torch_dtype = torch.float16 if dtype == "f16" else torch.bfloat16
    q, k, v = (torch.randn(*shape, device="cuda", dtype=torch_dtype) for _ in range(3))
    out = kernel(q, k, v)
    torch.cuda.synchronize()
    expected = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
    torch.testing.assert_close(out.float(), expected, rtol=2e-2, atol=2e-2)


def test_simt_linear_with_epilogue_matches_torch(gpu):
    import torch
    from tracea import dialects as td
    m, n, k = 70, 96, 40
    fn = td.function(td.tensor((m, k)), td.tensor((n, k)), td.tensor((n,)), name="linear")(
        lambda x, w, b: td.fused_gemm(x, w, [td.bias_add(b), td.gelu()], transpose_b=True))
    kernel = cl.CudaKernel(tracea.compile_gpu(fn, chip="sm_80"), gpu)
    x, w, b = torch.randn(m, k, device="cuda"), torch.randn(n, k, device="cuda"), torch.randn(n, device="cuda")
    out = kernel(x, w, b)
    torch.cuda.synchronize()
    torch.testing.assert_close(out, torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b)), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("chip", ["sm_80", "sm_90a"])
def test_batched_linear_with_residual_matches_torch(gpu, chip):
    import torch
    from tracea import dialects as td
    _skip_unless_runs(gpu, chip)
    fn = td.function(td.tensor((4, 50, 64), "f16"), td.tensor((96, 64), "f16"), td.tensor((96,), "f16"),
                     td.tensor((4, 50, 96), "f16"), name="linear")(
        lambda x, w, b, r: td.fused_gemm(x, w, [td.bias_add(b), td.gelu(), td.residual_add(r)], transpose_b=True))
    kernel = cl.CudaKernel(tracea.compile_gpu(fn, chip=chip), gpu)
    x, w = torch.randn(4, 50, 64, device="cuda", dtype=torch.half), torch.randn(96, 64, device="cuda", dtype=torch.half)
    b, r = torch.randn(96, device="cuda", dtype=torch.half), torch.randn(4, 50, 96, device="cuda", dtype=torch.half)
    out = kernel(x, w, b, r)
    torch.cuda.synchronize()
    expected = torch.nn.functional.gelu(torch.nn.functional.linear(x.float(), w.float(), b.float())) + r.float()
    torch.testing.assert_close(out.float(), expected, rtol=2e-2, atol=5e-2)


def test_compile_for_cuda_names_what_is_missing_or_runs():
    from tracea import dialects as td
    fn = td.function(td.tensor((64, 64), "f16"), td.tensor((64, 64), "f16"), name="gemm")(
        lambda a, b: td.gemm(a, b, out_dtype="f32"))
    if _cuda_device_or_none() is None:
        with pytest.raises(tracea.TraceaError, match="no CUDA driver on this machine|there is no CUDA device|cuda-bindings"):
            tracea.compile(fn, target="cuda")
        return
    kernel = tracea.compile(fn, target="cuda")
    assert kernel.artifact.chip == kernel.device.chip and tracea.compile(fn, target="cuda") is kernel


def test_device_chip_is_the_target_tracea_builds_for():
    def device(major, minor):
        d = object.__new__(cl.Device)
        d.compute_capability, d.ordinal, d.name = (major, minor), 0, "test"
        return d

    assert device(9, 0).chip == "sm_90a" and device(8, 6).chip == "sm_80" and device(12, 0).chip == "sm_80"
    with pytest.raises(cl.CudaError, match="older than sm_80"):
        device(7, 5).chip


@pytest.mark.parametrize("dtype", ["f16", "f32"])
def test_batched_matmul_matches_torch(gpu, dtype):
    import torch
    from tracea import dialects as td
    fn = td.function(td.tensor((2, 3, 50, 64), dtype), td.tensor((2, 3, 64, 40), dtype), name="bmm")(
        lambda a, b: td.gemm(a, b, out_dtype="f32"))
    kernel = cl.CudaKernel(tracea.compile_gpu(fn, chip=gpu.chip), gpu)
    torch_dtype = torch.float16 if dtype == "f16" else torch.float32
    a, b = (torch.randn(*s, device="cuda", dtype=torch_dtype) for s in ((2, 3, 50, 64), (2, 3, 64, 40)))
    out = kernel(a, b)
    torch.cuda.synchronize()
    torch.testing.assert_close(out, a.float() @ b.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", ["f16", "f32"])
def test_transposed_a_matches_torch(gpu, dtype):
    import torch
    from tracea import dialects as td
    fn = td.function(td.tensor((72, 136), dtype), td.tensor((72, 40), dtype), name="at_b")(
        lambda a, b: td.gemm(a, b, transpose_a=True, out_dtype="f32"))
    kernel = cl.CudaKernel(tracea.compile_gpu(fn, chip=gpu.chip), gpu)
    torch_dtype = torch.float16 if dtype == "f16" else torch.float32
    a, b = torch.randn(72, 136, device="cuda", dtype=torch_dtype), torch.randn(72, 40, device="cuda", dtype=torch_dtype)
    out = kernel(a, b)
    torch.cuda.synchronize()
    torch.testing.assert_close(out, a.float().T @ b.float(), rtol=2e-2, atol=2e-2)
