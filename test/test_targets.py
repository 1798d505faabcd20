"""The Target interface (tracea/targets/base.py): options parsed into frozen, hashable values and
refused by name, the hash every cache key holds, stages kept and dumped for every backend, and
one compile path a new backend plugs into without touching the compiler."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import tracea
from tracea import dialects as td
from tracea.targets import TARGETS, get_target
from tracea.targets.base import Build, Target, register_target


def _gemm(n: int = 16, name: str = "k"):
    return td.function(td.tensor((n, n)), td.tensor((n, n)), name=name)(td.gemm)


def test_every_backend_is_registered_and_named_in_errors():
    assert {"cpu", "cuda", "rocm", "vulkan", "metal"} <= set(TARGETS)
    with pytest.raises(ValueError, match="unknown target 'opencl'.*cpu.*cuda.*metal.*rocm.*vulkan"):
        tracea.compile(_gemm(), target="opencl")


def test_options_are_frozen_hashable_and_complete():
    cpu = get_target("cpu").options()
    assert cpu.threads >= 1 and cpu.strategy == "tiled" and cpu.parallel_runtime in ("openmp", "async")
    assert hash(cpu) == hash(get_target("cpu").options())
    with pytest.raises(dataclasses.FrozenInstanceError):
        cpu.threads = 3
    nvvm = get_target("cuda").options(chip="sm_90a")
    assert nvvm.chip == "sm_90a" and hash(nvvm) != hash(get_target("cuda").options(chip="sm_80"))


@pytest.mark.parametrize("target, options, message", [
    ("cpu", {"chip": "sm_80"}, "chip='sm_80' names an NVIDIA architecture"),
    ("cpu", {"strategy": "fast"}, "unknown CPU strategy 'fast'; available: tiled, reference"),
    ("cpu", {"threads": 0}, "threads must be a positive number"),
    ("cpu", {"threads": True}, "threads must be a positive number"),
    ("cuda", {"strategy": "reference", "chip": "sm_80"}, "one strategy, 'tiled'"),
    ("cuda", {"threads": 4, "chip": "sm_80"}, "threads= sizes the CPU's thread teams"),
])
def test_an_option_a_backend_does_not_take_is_refused_by_name(target, options, message):
    with pytest.raises(ValueError, match=message):
        get_target(target).options(**options)


def test_an_unknown_chip_is_refused_with_the_known_ones():
    with pytest.raises(tracea.CompileError, match="unsupported NVIDIA architecture 'sm_70'.*sm_80"):
        tracea.compile_gpu(_gemm(), chip="sm_70")


def test_the_hash_covers_target_options_and_toolchain(monkeypatch):
    cpu = get_target("cpu")
    one, two = cpu.options(threads=1), cpu.options(threads=2)
    assert cpu.hash(one) != cpu.hash(two)
    assert cpu.hash(one) != get_target("cuda").hash(get_target("cuda").options(chip="sm_80"))
    before = cpu.hash(one)
    monkeypatch.setattr(type(cpu), "toolchain", lambda self, options: ("llvmlite 99.0",))
    assert cpu.hash(one) != before


def test_a_new_toolchain_is_a_new_compile(monkeypatch):
    """The in-process cache key holds Target.hash: another tool version never reuses a kernel."""
    monkeypatch.setenv("TRACEA_DISK_CACHE", "0")
    fn = _gemm(12)
    first = tracea.compile(fn, threads=1)
    assert tracea.compile(fn, threads=1) is first
    cpu_target = type(get_target("cpu"))
    original = cpu_target.toolchain
    monkeypatch.setattr(cpu_target, "toolchain", lambda self, options: (*original(self, options), "llvmlite next"))
    again = tracea.compile(fn, threads=1)
    assert again is not first
    a = np.random.default_rng(0).standard_normal((12, 12)).astype(np.float32)
    np.testing.assert_allclose(again(a, a), a @ a, rtol=1e-5, atol=1e-5)


def test_cpu_stages_are_ordered_and_kept():
    assert list(get_target("cpu").stages(get_target("cpu").options(threads=1))) == ["linalg", "bufferized", "llvm"]
    kernel = tracea.compile(_gemm(8), threads=1, keep_stages=True)
    assert list(kernel.stages) == ["linalg", "bufferized", "llvm"] and "llvm.func" in kernel.stages["llvm"]


def test_nvidia_stages_are_dumped_like_the_cpus(ptxas, tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEA_DUMP_DIR", str(tmp_path))
    artifact = tracea.compile_gpu(_gemm(64, name="mm"), chip="sm_80")
    dumped = sorted(p.name for p in tmp_path.iterdir())
    assert dumped == ["mm.0-input.mlir", "mm.1-gpu.mlir", "mm.2-ptx.mlir"]
    gpu_stage = (tmp_path / "mm.1-gpu.mlir").read_text()
    assert "gpu.module" in gpu_stage and "tracea.launch" in gpu_stage
    assert "gpu.binary" in (tmp_path / "mm.2-ptx.mlir").read_text()
    assert artifact.name == "mm" and ".entry mm" in artifact.ptx


def test_cuda_without_a_gpu_fails_before_compiling(monkeypatch):
    from tracea.runtime import cuda_launcher
    try:
        cuda_launcher.Device.get(0)
        pytest.skip("this machine has an NVIDIA GPU")
    except cuda_launcher.CudaError:
        pass
    compiled = []
    monkeypatch.setattr(type(get_target("cuda")), "stages", lambda self, options: compiled.append(options))
    with pytest.raises(cuda_launcher.CudaError):
        tracea.compile(_gemm(), target="cuda", chip="sm_80")
    assert not compiled


@dataclasses.dataclass(frozen=True)
class _LinalgOptions:
    strategy: str


class _LinalgTarget(Target):
    """A backend whose code is its linalg: what a new backend plugs into."""
    name = "test-linalg"

    def options(self, *, strategy="tiled", threads=None, chip=None):
        return _LinalgOptions(strategy)

    def stages(self, options):
        from tracea.passes import parse_pipeline
        return {"linalg": parse_pipeline("tracea-to-linalg")}

    def codegen(self, module, options):
        return module.get_asm().encode()

    def load(self, build: Build, options, device):
        return build


def test_a_new_backend_plugs_into_the_one_path(monkeypatch):
    monkeypatch.setitem(TARGETS, "test-linalg", None)
    register_target(_LinalgTarget)
    build = tracea.compile(_gemm(4, name="mine"), target="test-linalg")
    assert isinstance(build, Build) and build.signature.name == "mine"
    assert b"linalg.generic" in build.artifact and b"tracea.gemm" not in build.artifact
    assert tracea.compile(_gemm(4, name="mine"), target="test-linalg") is build  # cached under its hash
