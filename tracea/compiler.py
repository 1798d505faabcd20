"""A program of tracea ops (IR text, an MLIR module, or a Function built in Python) to a callable
kernel for a target, by the one path every backend takes (targets/base.py), with an in-process
cache keyed by the exact input, the target and its options and toolchain (Target.hash)."""
from __future__ import annotations

import functools
import hashlib
import threading
import time
from pathlib import Path

import mlir.ir as ir

from . import knobs
from .dialects.builder import Function
from .dialects.context import parse_module, shared_context
from .dialects.functions import function_signature, public_functions
from .errors import CompileError, OpError
from .passes.check_indices import is_index_check
from .passes.pipeline import compile_or_raise
from .passes.registry import ops_named
from .runtime import disk_cache
from .runtime.kernel import Kernel, Signature
from .targets import get_target
from .targets.base import Build, Target
from .tuner.cache import stamp as tuning_stamp

_CACHE: dict[str, Kernel] = {}
_CACHE_LOCK = threading.Lock()


def _source(program) -> tuple[str, str]:
    """(IR text, name used in diagnostics)."""
    if isinstance(program, Function):
        return program.text(), f"<function {program.name}>"
    if isinstance(program, ir.Module):
        return program.operation.get_asm(enable_debug_info=True), "<module>"
    if isinstance(program, ir.Operation):
        return program.get_asm(enable_debug_info=True), "<module>"
    if isinstance(program, Path):
        try:
            return program.read_text(), str(program)
        except UnicodeDecodeError as e:
            raise CompileError(f"{program} is not UTF-8 text (byte {e.start}): is it an MLIR file?") from None
        except OSError as e:
            raise CompileError(f"cannot read {program}: {e.strerror}") from None
    if isinstance(program, str):
        try:
            program.encode()
        except UnicodeEncodeError as e:
            raise CompileError(f"the IR text is not valid Unicode (character {e.start} is a lone surrogate, as from "
                               "bytes decoded with errors='surrogateescape'): decode it as UTF-8") from None
        return program, "<string>"
    raise TypeError(f"tracea.compile takes IR text, a Path, an mlir Module or a tracea Function; "
                    f"got {type(program).__name__}")


def _signature(text: str, entry: str | None, source_name: str) -> Signature:
    with shared_context("host"):
        module = parse_module(text, source_name)
        funcs = public_functions(module.operation)
        names = [ir.StringAttr(f.attributes["sym_name"]).value for f in funcs]
        if entry is None:
            if len(funcs) != 1:
                raise CompileError(f"{source_name} has {len(funcs)} public functions ({', '.join(names) or 'none'}); "
                                   "name the one to run with entry=")
            entry = names[0]
        if entry not in names:
            raise CompileError(f"no public function @{entry} in {source_name}; found: {', '.join(names) or 'none'}")
        func = funcs[names.index(entry)]
        try:
            inputs, outputs = function_signature(func)
        except OpError as e:
            raise CompileError(f"cannot compile @{entry}: {e}") from None
        checks = [] if "cf.assert" not in text else [  # what a failed run-time check names
            message for op in ops_named(module.operation, "cf.assert")  # (layers' functions too)
            if not is_index_check(message := ir.StringAttr(op.attributes["msg"]).value)]
    return Signature(entry, inputs, outputs, checks=list(dict.fromkeys(checks)))


def compile_program(program, *, target: str = "cpu", entry: str | None = None, strategy: str = "tiled",
                    threads: int | None = None, keep_stages: bool = False, chip: str | None = None, tune=None):
    """tracea.compile of a program (tracea.api.compile documents the options): a Kernel for the
    CPU, a CudaKernel for target="cuda"; cached in this process for this exact input and options,
    CPU kernels also on disk."""
    backend = get_target(target)
    text, source_name = _source(program)
    tuner = _tuner(tune, target, strategy, threads, chip)
    if tuner is not None:
        from .tuner.autotuner import tune_program
        tune_program(text, tuner)
    options = backend.options(strategy=strategy, threads=threads, chip=chip)
    # the tuning cache's state: kernels compiled before a tuning run are not reused after it
    parts = [text, str(entry), str(keep_stages), backend.hash(options), tuning_stamp()]
    key = hashlib.sha256("\0".join(parts).encode()).hexdigest()
    with _CACHE_LOCK:
        if key in _CACHE:
            return _CACHE[key]
    device = backend.device(options)
    persistent = backend.persistent and not keep_stages and knobs.dump_dir() is None  # a cached kernel keeps no IR
    if persistent:
        disk_key = disk_cache.entry_key(parts)
        kernel = disk_cache.lookup(disk_key, target)
        if kernel is not None:
            kernel = backend.from_cache(kernel, functools.partial(disk_cache.object_code, disk_key), options)
            kernel.origin = "disk cache"
            if isinstance(program, Function):
                kernel.signature.arg_names = program.arg_names
            with _CACHE_LOCK:
                _CACHE[key] = kernel
            return kernel
    kernel = backend.load(_build(program, text, source_name, backend, options, entry, keep_stages), options, device)
    if persistent:
        disk_cache.store(disk_key, kernel)
    with _CACHE_LOCK:
        _CACHE[key] = kernel
    return kernel


def _tuner(tune, target: str, strategy: str, threads: int | None, chip: str | None = None):
    """The AutoTuner a compile tunes its ops with on a tuning-cache miss, or None: `tune` is
    True, False, an AutoTuner, or None for $TRACEA_TUNE. A Vulkan compile tunes on its device."""
    if tune is None:
        tune = knobs.tune()
    if not tune:  # the usual case: the tuner is not even imported
        return None
    from .tuner.autotuner import AutoTuner
    if isinstance(tune, AutoTuner):
        return tune
    if strategy != "tiled":
        return None
    if target == "vulkan":
        return AutoTuner(chip if chip and chip.startswith("vulkan:") else "vulkan:0", budget=knobs.tune_budget())
    if target != "cpu":
        raise CompileError(f"tune=True times kernels on the CPU and on Vulkan devices; Tracea has no {target} launcher "
                           f"wired to the tuner: compile for {target!r} without tuning")
    return AutoTuner("cpu", threads=threads, budget=knobs.tune_budget())


def compile_gpu(program, *, chip: str = "sm_80", entry: str | None = None):
    """An NVIDIA kernel for a function computing one gemm / fused_gemm / NHWC conv2d / attention
    (f16 / bf16 on Tensor Cores, f32 on the SIMT kernel): a runtime.gpu_artifact.GpuKernelArtifact
    holding the cubin (ptxas-checked against `chip`'s limits), its PTX and the launch
    configuration; `.save(path)` writes it for a machine with a GPU (no MLIR needed there). The
    same path as compile(..., target="cuda"), stopped before loading. A Vulkan `chip` (a device
    "vulkan:N" or a profile such as "vulkan-coopmat") gives a SpirvKernelArtifact the same way, a
    Metal one ("metal-apple") a MetalKernelArtifact (MSL), an AMD one ("gfx90a", "gfx942",
    "gfx1100") a HsacoKernelArtifact (code object).
    Raises CompileError."""
    backend = get_target(next((t for t in ("vulkan", "metal") if chip.startswith(t)), "rocm" if chip.startswith("gfx")
                              else "cuda"))
    text, source_name = _source(program)
    return _build(program, text, source_name, backend, backend.options(chip=chip), entry, False).artifact


def _build(program, text: str, source_name: str, backend: Target, options, entry: str | None,
           keep_stages: bool) -> Build:
    """Every backend's one path: its stages, its code generator, its packaging (dumped to
    $TRACEA_DUMP_DIR when set)."""
    start = time.perf_counter()
    dump = knobs.dump_dir()
    # Tracea's own pipelines verify once per stage, not after every pass (the input is verified
    # when parsed); tracea-opt keeps MLIR's per-pass verification
    backend.prepare(options)
    result = compile_or_raise(text, list(backend.stages(options).items()), source_name=source_name,
                              keep_stages=keep_stages or dump is not None, verify_each=False,
                              finish=functools.partial(backend.codegen, options=options))
    signature = _signature(text, entry, source_name)  # after the stages, which report bad input best
    if isinstance(program, Function):
        signature.arg_names = program.arg_names
    if dump is not None:
        dump.mkdir(parents=True, exist_ok=True)
        (dump / f"{signature.name}.0-input.mlir").write_text(text)
        for i, (stage, stage_text) in enumerate(result.stages.items(), 1):
            (dump / f"{signature.name}.{i}-{stage}.mlir").write_text(stage_text)
    artifact = backend.package(result.artifact, signature, options)
    return Build(signature, artifact, result.stages if keep_stages else {}, time.perf_counter() - start, result.plan)


def clear_cache() -> None:
    with _CACHE_LOCK:
        _CACHE.clear()
