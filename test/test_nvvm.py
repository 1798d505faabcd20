"""NVIDIA code generation without a GPU: gpu-dialect kernels to PTX for sm_80 / sm_90a, ptxas
accepts them, and the resources it reports are checked against the device limits."""
from __future__ import annotations

import dataclasses

import pytest

import tracea
from tracea.targets import nvvm

SAXPY = """
module attributes {gpu.container_module} {
  gpu.module @kernels {
    gpu.func @saxpy(%a: f32, %x: memref<1024xf32>, %y: memref<1024xf32>) kernel
        attributes {known_block_size = array<i32: 128, 1, 1>} {
      %bid = gpu.block_id x
      %tid = gpu.thread_id x
      %bdim = gpu.block_dim x
      %i = arith.addi %tid, %bid : index
      %j = arith.muli %bid, %bdim : index
      %k = arith.addi %j, %tid : index
      %xv = memref.load %x[%k] : memref<1024xf32>
      %yv = memref.load %y[%k] : memref<1024xf32>
      %r = math.fma %a, %xv, %yv : f32
      memref.store %r, %y[%k] : memref<1024xf32>
      gpu.return
    }
  }
}
"""


def _ptxas_or_skip():
    try:
        return nvvm.ptxas_path()
    except tracea.CompileError:
        pytest.skip("ptxas not found (pip install nvidia-cuda-nvcc==13.0.88)")


@pytest.mark.parametrize("chip", ["sm_80", "sm_90a"])
def test_ptx_for_each_architecture_is_accepted_by_ptxas(chip):
    ptx = nvvm.to_ptx(SAXPY, chip)
    assert f".target {chip}" in ptx and ".visible .entry saxpy(" in ptx and "fma.rn.f32" in ptx
    _ptxas_or_skip()
    cubin = nvvm.assemble(ptx, chip)
    assert cubin.image.startswith(b"\x7fELF") and cubin.registers > 0 and cubin.spilled_bytes == 0
    nvvm.check_launch("saxpy", cubin, threads_per_block=128)


def test_launch_limits_name_the_resource_and_the_fix():
    cubin = nvvm.Cubin("sm_80", b"", registers=96, static_shared_bytes=0, spilled_bytes=0, log="")
    with pytest.raises(tracea.CompileError, match="needs 170 KB shared memory, sm_80 allows 163 KB per block; "
                                                  "reduce stages"):
        nvvm.check_launch("gemm", cubin, 128, dynamic_shared_bytes=170 * 1024)
    nvvm.check_launch("gemm", dataclasses.replace(cubin, chip="sm_90a"), 128, dynamic_shared_bytes=170 * 1024)
    with pytest.raises(tracea.CompileError, match="96 registers per thread x 1024 threads"):
        nvvm.check_launch("gemm", cubin, 1024)
    with pytest.raises(tracea.CompileError, match="unsupported NVIDIA architecture 'sm_70'"):
        nvvm.to_ptx(SAXPY, "sm_70")


def test_bad_ptx_is_a_compile_error():
    _ptxas_or_skip()
    with pytest.raises(tracea.CompileError, match="ptxas rejected the PTX for sm_80"):
        nvvm.assemble(".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry k() { bogus; }\n", "sm_80")
