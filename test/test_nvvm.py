"""NVIDIA code generation without a GPU: gpu-dialect kernels to PTX for sm_80 / sm_90a, ptxas
accepts them, and the resources it reports are checked against the device limits."""
from __future__ import annotations

import dataclasses

import pytest

import tracea
from tracea.targets.nvvm.mma import MmaGemm
from tracea.targets.nvvm import target as nvvm

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


@pytest.mark.parametrize("chip", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("shape", [(128, 128, 64), (100, 70, 37)], ids=["whole-tiles", "edges"])
def test_simt_gemm_assembles(chip, shape):
    """The SIMT GEMM (f32, shared-memory tiles, a 4 x 4 register tile per thread): ptxas accepts it
    and reports the shared memory of its two tiles; the FMAs are fused in the PTX."""
    from tracea.targets.nvvm.simt import SimtTiles, grid, simt_gemm_module_text
    tiles = SimtTiles()
    ptx = nvvm.to_ptx(simt_gemm_module_text(MmaGemm(*shape, "f32", "f32"), tiles), chip)
    assert ptx.count("fma.rn.f32") >= tiles.thread_m * tiles.thread_n and "bar.sync" in ptx and ".shared" in ptx
    assert grid(shape[0], shape[1], tiles) == (-(-shape[1] // 64), -(-shape[0] // 64), 1)
    _ptxas_or_skip()
    cubin = nvvm.assemble(ptx, chip)
    tile_bytes = 4 * tiles.block_k * (tiles.block_m + tiles.block_n)
    assert cubin.static_shared_bytes == tile_bytes and cubin.spilled_bytes == 0
    nvvm.check_launch("gemm", cubin, threads_per_block=tiles.threads[0] * tiles.threads[1])
    try:
        machine_code = nvvm.sass(cubin)  # fused multiply-adds from shared memory, not FMUL + FADD
    except tracea.CompileError as e:
        pytest.skip(f"no SASS disassembler: {e}")
    assert machine_code.count("FFMA") >= tiles.block_k * tiles.thread_m * tiles.thread_n
    assert "LDS" in machine_code and "BAR" in machine_code and "FMUL" not in machine_code


def test_simt_tiles_are_checked():
    from tracea.targets.nvvm.simt import SimtTiles
    with pytest.raises(ValueError, match="multiple of the thread tile"):
        SimtTiles(block_m=62).validate()
    with pytest.raises(ValueError, match="2048 threads per block"):
        SimtTiles(block_m=128, block_n=256, thread_m=2, thread_n=8).validate()


def test_gpu_kernel_artifact_loads_without_mlir(tmp_path):
    """The artifact (cubin + launch metadata) round-trips through files, and its loader runs
    with the standard library alone (python -S: no site-packages, so no MLIR)."""
    import subprocess
    import sys

    from tracea.targets.nvvm.simt import SimtTiles, grid, simt_gemm_module_text
    from tracea.runtime import gpu_artifact as ga
    _ptxas_or_skip()
    m, n, k = 100, 70, 37
    tiles = SimtTiles()
    ptx = nvvm.to_ptx(simt_gemm_module_text(MmaGemm(m, n, k, "f32", "f32"), tiles), "sm_80")
    cubin = nvvm.assemble(ptx, "sm_80")
    art = ga.GpuKernelArtifact("gemm", "sm_80", cubin.image, ptx, grid(m, n, tiles), (*tiles.threads, 1), 0,
                               (ga.Param("A", "f32", (m, k)), ga.Param("B", "f32", (k, n)),
                                ga.Param("C", "f32", (m, n))), cubin.registers, cubin.static_shared_bytes)
    art.save(tmp_path / "gemm")
    assert ga.GpuKernelArtifact.load(tmp_path / "gemm") == art
    args = art.launch_arguments([0x1000, 0x2000, 0x3000])
    assert len(args) == 3 * 7 and args[:7] == [("ptr", 0x1000), ("ptr", 0x1000), ("i64", 0), ("i64", m), ("i64", k),
                                               ("i64", k), ("i64", 1)]
    # the PTX's parameter list has exactly as many entries as the layout
    assert ptx.count(".param .u64") + ptx.count(".param .f32") == len(args)
    with pytest.raises(tracea.ArgumentError, match="takes 3 argument"):
        art.launch_arguments([1])
    script = (f"import sys, importlib.util as u; s = u.spec_from_file_location('gpu_artifact', {ga.__file__!r}); "
              f"m = sys.modules['gpu_artifact'] = u.module_from_spec(s); s.loader.exec_module(m); "
              f"a = m.GpuKernelArtifact.load({str(tmp_path / 'gemm')!r}); "
              f"print(a.name, a.chip, a.grid, a.block, len(a.cubin), len(a.launch_arguments([1, 2, 3])))")
    done = subprocess.run([sys.executable, "-S", "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[:2] == ["gemm", "sm_80"] and done.stdout.split()[-2:] == [str(len(cubin.image)), "21"]


@pytest.mark.parametrize("dtype,shape", [("f32", (70, 96, 40)), ("f16", (64, 30, 36))],
                         ids=["f32-linear-bias-gelu", "f16-fallback"])
def test_simt_gemm_takes_b_transposed_and_the_epilogue(ptxas, dtype, shape):
    """f32 nn.Linear + bias + GELU, and an f16 GEMM whose N is not a multiple of 8 (no Tensor Core
    copies): both on the SIMT kernel, the epilogue applied to each accumulator before the store."""
    from tracea import dialects as td
    m, n, k = shape
    fn = td.function(td.tensor((m, k), dtype), td.tensor((n, k), dtype), td.tensor((n,), dtype), name="linear")(
        lambda x, w, b: td.fused_gemm(x, w, [td.bias_add(b), td.gelu()], transpose_b=True))
    art = tracea.compile_gpu(fn, chip="sm_80")
    assert art.block == (16, 16, 1) and art.dynamic_shared_bytes == 0
    assert [(p.name, p.shape) for p in art.params] == [("x", (m, k)), ("w", (n, k)), ("b", (n,)), ("out", (m, n))]
    assert "fma.rn.f32" in art.ptx
