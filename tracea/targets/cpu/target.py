"""The CPU target: tracea -> linalg -> bufferized memrefs -> LLVM dialect -> object code (targets/cpu/native.py).

All of the CPU's knowledge lives here: its stages (each a pipeline whose output can be dumped and
tested), the C entry points it adds, and how the LLVM dialect becomes callable code.
"""
from __future__ import annotations

import functools
import importlib.metadata
import math
from dataclasses import dataclass
from pathlib import Path

import mlir.ir as ir
from mlir.dialects import arith, memref

from ... import knobs
from ...dialects.functions import function_signature, public_functions
from ...dialects.ops import TensorSpec
from ...errors import CompileError, OpError
from .linalg import GENERIC_LOOPS
from ...passes.pipeline import Pipeline, parse_pipeline
from ...passes.registry import PassFailed, TraceaPass, register, register_pipeline
from ...doctor.capabilities import host_cpu
from ...runtime import gnu_openmp
from ...runtime.kernel import Kernel
from ...runtime.libraries import load_runtime_library
from ..base import Build, Target, package_version, register_target
from . import native

ENTRY_PREFIX = "_tracea_entry_"


def memref_type(spec: TensorSpec) -> str:
    return "memref" + str(spec)[len("tensor"):]


@register
@dataclass(frozen=True)
class CpuAbiPass(TraceaPass):
    NAME = "tracea-cpu-abi"
    SUMMARY = ("give each public tensor function a C entry point `_tracea_entry_<name>` taking one "
               "memref per argument and per result (destination passing); the function becomes private")

    def run(self, module: ir.Operation) -> None:
        failed = False
        for func_op in public_functions(module):
            name = ir.StringAttr(func_op.attributes["sym_name"]).value
            try:
                inputs, outputs = function_signature(func_op)
            except OpError as e:
                func_op.location.emit_error(f"cannot compile @{name} for the CPU: {e}")
                failed = True
                continue
            ins = [f"%in{i}: {memref_type(s)}" for i, s in enumerate(inputs)]
            outs = [f"%out{i}: {memref_type(s)}" for i, s in enumerate(outputs)]
            # The declaration lets the entry verify on its own; it is dropped once moved.
            lines = [f"func.func private @{name}({', '.join(map(str, inputs))}) -> ({', '.join(map(str, outputs))})",
                     f"func.func @{ENTRY_PREFIX}{name}({', '.join(ins + outs)}) attributes {{llvm.emit_c_interface}} {{"]
            for i, s in enumerate(inputs):
                lines.append(f"  %t{i} = bufferization.to_tensor %in{i} restrict : {memref_type(s)} to {s}")
            results = ", ".join(f"%r{i}" for i in range(len(outputs)))
            call = f"func.call @{name}({', '.join(f'%t{i}' for i in range(len(inputs)))}) : " \
                   f"({', '.join(map(str, inputs))}) -> ({', '.join(map(str, outputs))})"
            lines.append(f"  {results} = {call}" if outputs else f"  {call}")
            for i, s in enumerate(outputs):
                lines.append(f"  bufferization.materialize_in_destination %r{i} in restrict writable %out{i} "
                             f": ({s}, {memref_type(s)}) -> ()")
            lines += ["  return", "}"]
            entry_module = ir.Module.parse("\n".join(lines), module.context)
            declaration, entry = entry_module.body.operations
            entry.operation.move_after(func_op)
            declaration.operation.erase()
            func_op.attributes["sym_visibility"] = ir.StringAttr.get("private")
        if failed:
            raise PassFailed()


def openmp_library() -> Path | None:
    """LLVM's OpenMP runtime (the cmeel-libomp wheel), which threaded kernels use when it is
    installed: its fork/join costs a few microseconds where MLIR's async runtime costs tens, and
    its outlining compiles faster than the async lowering's coroutines.
    TRACEA_PARALLEL_RUNTIME=async chooses the async runtime anyway (tracea.knobs)."""
    return _installed_libomp() if knobs.parallel_runtime() == "openmp" else None


def _on_gnu_openmp(code: bytes, threads: int) -> bool:
    """Whether a kernel's parallel regions run on GNU OpenMP's threads: torch loaded it first
    (runtime/gnu_openmp.py)."""
    return b"__kmpc_fork_call" in code and threads > 1 and gnu_openmp.chosen_runtime() == "gnu"


@functools.cache
def _installed_libomp() -> Path | None:
    try:
        path = Path(importlib.metadata.distribution("cmeel-libomp").locate_file("cmeel.prefix/lib/libomp.so"))
    except importlib.metadata.PackageNotFoundError:
        return None
    return path if path.exists() else None


def llvm_lowering(threads: int, openmp: bool = False) -> str:
    """Bufferized IR to the LLVM dialect; scf.parallel runs on `threads` OpenMP threads or
    workers of MLIR's async runtime, or as plain loops for one thread."""
    if threads > 1 and openmp:
        # The memref lowering goes first: it removes the alloca scopes scf-to-openmp wraps loop
        # bodies in, which cannot hold the many blocks scf-to-cf would make of them.
        parallel = (f"convert-scf-to-openmp{{num-threads={threads}}}, expand-strided-metadata, lower-affine, "
                    "finalize-memref-to-llvm, ")
    elif threads > 1:
        parallel = (f"async-parallel-for{{num-workers={threads} min-task-size=1}}, async-to-async-runtime, "
                    "async-runtime-ref-counting, async-runtime-ref-counting-opt, convert-async-to-llvm, ")
    else:
        parallel = ""
    # vector transfers the LLVM conversion cannot take (a broadcast from a 0-d memref, a strided
    # innermost dimension: the leftover ops once made the LLVM translation crash) become loads,
    # broadcasts and scalar loops; integer divisions get their divisors guarded (int_division.py)
    return ("tracea-outline-loops, convert-vector-to-scf, scf-forall-to-parallel, convert-linalg-to-loops, tracea-guard-int-division, "
            "lower-affine, " + parallel +
            # address arithmetic out of the loops while they are still loops: kernel-only modules get
            # no LLVM -O pipeline (targets/cpu/native.py); measured with that clean-up, the encoder ran 2.46 ->
            # 2.38 ms and the CNN 2.87 -> 2.67 ms with it
            "loop-invariant-code-motion, cse, "
            "convert-scf-to-cf, expand-strided-metadata, lower-affine, "
            # math first: libm calls for vector math are made element by element with vector ops
            "arith-expand{include-bf16=true}, "  # bf16 conversions as integer ops: no compiler-rt builtin
            "convert-math-to-llvm, convert-math-to-libm, convert-vector-to-llvm, finalize-memref-to-llvm, "
            # OpenMP regions last: their conversion lowers the arith ops inside them too, which
            # must be expanded first (bf16)
            + ("convert-openmp-to-llvm, " if threads > 1 and openmp else "") +
            "convert-func-to-llvm, convert-arith-to-llvm, convert-cf-to-llvm, convert-index-to-llvm, convert-ub-to-llvm, "
            "reconcile-unrealized-casts")


@register
@dataclass(frozen=True)
class ForwardOutputsPass(TraceaPass):
    NAME = "tracea-cpu-forward-outputs"
    SUMMARY = ("after bufferization: let a result be computed in the caller's output buffer instead of "
               "a fresh allocation copied into it at the end (also through reshapes of it)")

    def run(self, module: ir.Operation) -> None:
        for func_op in module.regions[0].blocks[0].operations:
            func_op = func_op.operation
            if func_op.name != "func.func" or not ir.StringAttr(func_op.attributes["sym_name"]).value.startswith(ENTRY_PREFIX):
                continue
            block = func_op.regions[0].blocks[0]
            for op in list(block.operations):
                op = op.operation
                if op.name != "memref.copy":
                    continue
                src, dst = op.operands
                if not (isinstance(dst, ir.BlockArgument) and dst.owner == block and len(list(dst.uses)) == 1):
                    continue
                # the copied value: the allocation, or reshapes of it (a conv's GEMM result
                # [N, K, H*W] copied out as [N, K, H, W]: a third of a 1x1 conv with 16 channels)
                views, value = [], src
                while isinstance(value, ir.OpResult) and value.owner.name in _RESHAPES:
                    views.append(value.owner.operation)
                    value = value.owner.operands[0]
                if not isinstance(value, ir.OpResult) or value.owner.name != "memref.alloc" \
                        or value.owner.parent != func_op or src.type != dst.type \
                        or any(_expanded_sizes(view) is None for view in views):
                    continue
                users = [use.owner.operation for v in [value] + [w.results[0] for w in views] for use in v.uses]
                if any(u != op and u not in views and u.block == block and not u.is_before_in_block(op)
                       for u in users):
                    continue  # the buffer is used after the copy
                alloc = value.owner.operation
                with ir.InsertionPoint(alloc), alloc.location:
                    for view in views:  # dst seen as the allocation: each reshape undone, outermost first
                        dst = _inverse_reshape(view, dst)  # (of the allocation's type: each view's source type)
                op.erase()
                value.replace_all_uses_with(dst)
                alloc.erase()


_RESHAPES = ("memref.expand_shape", "memref.collapse_shape")


@register
@dataclass(frozen=True)
class DistinctResultsPass(TraceaPass):
    NAME = "tracea-cpu-distinct-results"
    SUMMARY = ("after bufferization: a function returning one buffer more than once returns a copy for "
               "each repeat (MLIR's buffer-results-to-out-params{hoist-static-allocs} crashed on "
               "`return %x, %x`)")

    def run(self, module: ir.Operation) -> None:
        for func_op in module.regions[0].blocks[0].operations:
            func_op = func_op.operation
            if func_op.name != "func.func":
                continue
            for block in func_op.regions[0].blocks:
                returned = list(block.operations)[-1].operation
                if returned.name != "func.return":
                    continue
                seen = []
                for i, value in enumerate(list(returned.operands)):
                    if value not in seen:
                        seen.append(value)
                        continue
                    kind = value.type
                    if not isinstance(kind, ir.MemRefType) or kind.layout.value != ir.AffineMap.get_identity(kind.rank):
                        continue  # (tensors, views: not what bufferization returns here)
                    with ir.InsertionPoint(returned), returned.location:
                        sizes = [memref.DimOp(value, arith.ConstantOp(ir.IndexType.get(), d)).result
                                 for d in range(kind.rank) if kind.is_dynamic_dim(d)]
                        copy = memref.AllocOp(kind, sizes, []).result
                        memref.CopyOp(value, copy)
                    returned.operands[i] = copy


def _expanded_sizes(view: ir.Operation) -> list[tuple[int, int]] | None:
    """For undoing the collapse `view` (an expand_shape back to its source's type): each size of
    that type known at run time only, as (the collapsed dim it is part of, the product of the
    other sizes there); None when a collapsed dim holds two of them (no way to split it)."""
    if view.name != "memref.collapse_shape":
        return []
    shape = ir.MemRefType(view.operands[0].type).shape
    sizes = []
    for collapsed, group in enumerate(ir.ArrayAttr(view.attributes["reassociation"])):
        dims = [ir.IntegerAttr(d).value for d in ir.ArrayAttr(group)]
        dynamic = [d for d in dims if ir.ShapedType.is_dynamic_size(shape[d])]
        if len(dynamic) > 1:
            return None
        if dynamic:
            sizes.append((collapsed, math.prod(shape[d] for d in dims if d != dynamic[0])))
    return sizes


def _inverse_reshape(view: ir.Operation, value: ir.Value) -> ir.Value:
    """`value` (shaped as the reshape `view`'s result) shaped as its source, by the opposite reshape
    (an expand's run-time sizes read from `value`: memref.expand_shape takes them as operands)."""
    source_type = view.operands[0].type
    attributes = {"reassociation": view.attributes["reassociation"]}
    operands = [value]
    if view.name == "memref.collapse_shape":
        name = "memref.expand_shape"
        attributes["static_output_shape"] = ir.DenseI64ArrayAttr.get(list(ir.MemRefType(source_type).shape))
        index = ir.IndexType.get()
        for collapsed, others in _expanded_sizes(view):
            size = memref.DimOp(value, arith.ConstantOp(index, collapsed)).result
            operands.append(size if others == 1 else arith.DivUIOp(size, arith.ConstantOp(index, others)).result)
    else:
        name = "memref.collapse_shape"
    return ir.Operation.create(name, results=[source_type], operands=operands, attributes=attributes).results[0]


STRATEGIES = ("tiled", "reference")


# Rewrites of ops torch-mlir emits, on linalg on tensors before anything vectorizes them (after the
# tracea ops are lowered, whose kernels have neither): integer floor division through f64 made
# exact (passes/int_division.py), math.fpowi as torch computes pow (passes/fpowi.py), indices
# read from tensors checked and asserts made errors instead of aborts (passes/check_indices.py)
TORCH_NUMERICS = "tracea-int-floor-division, tracea-expand-fpowi, tracea-check-indices"


# Each canonicalize / cse in the CPU pipelines changes the final code of some kernel or model:
# the others were dropped (~5 ms each) after hashing the LLVM-dialect output of GEMMs, convs,
# attention, softmax and the three PyTorch models of bench/torch_models.py with and without them.
def tiled_lowering(threads: int = 0) -> str:
    """Tracea ops to linalg on tensors: raised patterns, CPU kernels where one exists, the rest
    split among the threads and vectorized (0 threads: the host's cores)."""
    t = f"{{threads={threads}}}" if threads else ""
    return (f"tracea-verify, tracea-widen-i1, tracea-raise-linalg, canonicalize, tracea-select-variant{t}, "
            f"tracea-cpu-conv{t}, tracea-cpu-kernels{t}, tracea-lower-to-linalg, {TORCH_NUMERICS}, "
            # unit dims dropped and elementwise producers fused into their consumers: torch's
            # decomposed layer norm becomes a few loop nests instead of ten (encoder 2.11 -> 1.90 ms)
            f"linalg-generalize-named-ops, tracea-exact-windows, linalg-fold-unit-extent-dims, tracea-split-casts, linalg-fuse-elementwise-ops, "
            "canonicalize, "
            f"cse, tracea-cpu-tile-linalg{t}, tracea-vector-exp")


def tiled_copies(threads: int = 0) -> str:
    """After bufferization: the copies it made, split and vectorized like other linalg ops."""
    t = f"{{threads={threads}}}" if threads else ""
    return f"tracea-cpu-copies-to-linalg, linalg-generalize-named-ops, tracea-cpu-tile-linalg{t}"


register_pipeline("tracea-to-linalg", "verify and lower tracea ops to linalg on tensors, then simplify",
                  "tracea-verify, tracea-lower-to-linalg, canonicalize, cse")
register_pipeline("tracea-cpu-tiled", "host-sized schedules, fast CPU kernels where one exists, the remaining "
                  "linalg split among the host's cores and vectorized", tiled_lowering())
register_pipeline("tracea-cpu-bufferize", "C entry points, inlining, one-shot bufferization, deallocation",
                  "tracea-cpu-abi, inline{default-pipeline=}, symbol-dce, canonicalize, eliminate-empty-tensors, "
                  "one-shot-bufferize{bufferize-function-boundaries "
                  "function-boundary-type-conversion=identity-layout-map}, "
                  # a row group's temporaries (targets/cpu/linalg.py) allocated once per thread, not per row
                  "func.func(buffer-loop-hoisting), "
                  # functions a model's layers were imported into (frontend/layers.py) are called
                  # with buffers for their results: returned buffers made the deallocation check
                  # aliasing at run time in i1 memrefs, which this LLVM build cannot lower
                  "tracea-cpu-distinct-results, buffer-results-to-out-params{hoist-static-allocs=true}, "
                  "tracea-cpu-forward-outputs, buffer-deallocation-pipeline")
register_pipeline("tracea-cpu-to-llvm", "lower bufferized IR to the LLVM dialect (parallel loops run serially)",
                  llvm_lowering(1))
register_pipeline("tracea-cpu", "the whole CPU path: tracea ops to the LLVM dialect (parallel loops run serially)",
                  f"tracea-cpu-tiled, tracea-cpu-bufferize, {tiled_copies()}, tracea-cpu-to-llvm")


MLIR_LIB = Path(__import__("mlir").__path__[0]) / "lib"  # a namespace package: no __file__
ASYNC_RUNTIME = MLIR_LIB / "libmlir_async_runtime.so"
RUNNER_UTILS = MLIR_LIB / "libmlir_c_runner_utils.so"  # memrefCopy, for strided copies


@dataclass(frozen=True)
class CpuOptions:
    strategy: str  # "tiled" or "reference"
    threads: int  # the size of parallel loops' thread teams
    parallel_runtime: str  # "openmp" or "async" (tracea.knobs)
    cpu: str  # what the schedules are planned for (the host, or the CPU $TRACEA_CPU names)


@register_target
class CpuTarget(Target):
    name = "cpu"
    persistent = True

    def options(self, *, strategy: str = "tiled", threads: int | None = None, chip: str | None = None) -> CpuOptions:
        if chip is not None:
            raise ValueError(f"chip={chip!r} names an NVIDIA architecture: use it with target='cuda' or compile_gpu")
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown CPU strategy '{strategy}'; available: {', '.join(STRATEGIES)}")
        if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool) or threads < 1):
            raise ValueError(f"threads must be a positive number of threads (or None: $TRACEA_NUM_THREADS or "
                             f"the host's {host_cpu().cores} cores), got {threads!r}")
        return CpuOptions(strategy, threads or knobs.num_threads() or host_cpu().cores, knobs.parallel_runtime(),
                          host_cpu().describe())

    def stages(self, options: CpuOptions) -> dict[str, Pipeline]:
        tiled, threads = options.strategy == "tiled", options.threads
        return {
            "linalg": parse_pipeline(tiled_lowering(threads) if tiled
                                     else f"tracea-widen-i1, tracea-to-linalg, {TORCH_NUMERICS}"),
            "bufferized": parse_pipeline("tracea-cpu-bufferize" + (f", {tiled_copies(threads)}" if tiled else "")),
            "llvm": parse_pipeline(llvm_lowering(threads, openmp_library() is not None)),
        }

    def toolchain(self, options: CpuOptions) -> tuple[str, ...]:
        return (*super().toolchain(options), package_version("llvmlite"), package_version("cmeel-libomp"))

    def prepare(self, options: CpuOptions) -> None:
        native.warm_up()

    def codegen(self, module: ir.Operation, options: CpuOptions) -> bytes:
        """Object code for the LLVM-dialect module, with a packed entry beside each C entry point."""
        prefix = f"_mlir_ciface_{ENTRY_PREFIX}"
        entries = [name for op in module.regions[0].blocks[0].operations
                   if op.operation.name == "llvm.func"
                   and (name := ir.StringAttr(op.operation.attributes["sym_name"]).value).startswith(prefix)]
        return native.object_code(module, entries, optimize=GENERIC_LOOPS in module.attributes)

    def from_cache(self, kernel: Kernel, object_code, options: CpuOptions) -> Kernel:
        """A cached library calls LLVM's OpenMP; on GNU OpenMP's threads its object code is linked
        here instead (runtime/gnu_openmp.py)."""
        if kernel.threads > 1 and kernel.openmp == "llvm" and gnu_openmp.chosen_runtime() == "gnu" \
                and (code := object_code()):
            return self.load(Build(kernel.signature, code, {}, 0.0, kernel.plan), options)
        return kernel

    def load(self, build: Build, options: CpuOptions, device=None) -> Kernel:
        """Link the object code into this process, after the runtime libraries it calls into."""
        code, entry = build.artifact, build.signature.name
        libraries = []  # loaded globally, and linked into exported libraries
        if b"mlirAsyncRuntime" in code:
            libraries.append(ASYNC_RUNTIME)
        if b"__kmpc_fork_call" in code:
            libomp = _installed_libomp()
            if libomp is None:
                raise CompileError(f"@{entry} was lowered for OpenMP but its runtime (pip package cmeel-libomp) "
                                   "is not installed")
            libraries.append(libomp)
        if b"memrefCopy" in code:
            libraries.append(RUNNER_UTILS)
        for library in libraries:
            load_runtime_library(library)
        symbol = f"_mlir_ciface_{ENTRY_PREFIX}{entry}"
        packed = native.PACKED_PREFIX + symbol
        on_gnu = _on_gnu_openmp(code, options.threads)
        objects = native.OBJECTS_PREFIX + symbol
        exported = [packed] + ([objects] if objects.encode() in code else [])  # not in older cached code
        library = native.JitLibrary(code, exported, also=[gnu_openmp.shim_object()] if on_gnu else ())
        kernel = Kernel(build.signature, library.addresses[packed], library, self.name, build.stages, build.seconds,
                        symbol, [str(lib) for lib in libraries], code, options.threads,
                        openmp="gnu" if on_gnu else "llvm" if b"__kmpc_fork_call" in code else None,
                        objects_address=library.addresses.get(objects))
        kernel.plan = build.plan
        return kernel
