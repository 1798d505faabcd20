"""The entry point users call: `tracea.compile` of a PyTorch module (the torch front end,
frontend/torch_model.py, with TorchDynamo where torch.export cannot trace it) or of a program of
tracea ops (compiler.py)."""
from __future__ import annotations

from .compiler import compile_program
from .frontend.dynamo import DynamoModel
from .frontend.torch_import import warn_once
from .frontend.torch_model import compile_model, is_torch_module


def compile(program, example_inputs=None, *, target: str = "cpu", entry: str | None = None, strategy: str = "tiled",
            threads: int | None = None, keep_stages: bool = False, chip: str | None = None, dynamic_dims=None,
            tune=None):
    """Compile `program` for `target`; the result is cached for this exact input and options.

    `program` is IR text, a Path, an MLIR module, a tracea Function, or a torch.nn.Module; a module
    needs `example_inputs` (tensors of the shapes it will be called with) and compiles into a
    CompiledModel called with torch tensors (see tracea.frontend.torch_model); `dynamic_dims`
    ({input position: dim or dims}, e.g. {0: 0} for a batch) makes those sizes free: one more
    compile at the first call with other sizes serves them all (tracea.frontend.dynamic).

    strategy: "tiled" (fast kernels where the target has them) or "reference" (plain linalg
    loops, the ground truth for tests). threads: worker threads for parallel loops (default:
    $TRACEA_NUM_THREADS or the host's cores).

    target="cuda": a kernel for the NVIDIA GPU 0 (its architecture detected, or `chip`), launched
    through runtime/cuda_launcher.py with torch / cupy tensors or DeviceBuffers (one gemm /
    fused_gemm / NHWC conv2d / attention per function, see compile_gpu).

    tune=True tunes, before compiling, each kernel op (gemm, conv2d, attention) that the tuning
    cache ($TRACEA_TUNING_DIR/tuning_cache.json) has no schedule for on this machine: a
    Gaussian-process search over its variant's schedules, each compiled, checked and timed
    ($TRACEA_TUNE_BUDGET evaluations per op, default 40; an AutoTuner instead of True sets them
    all). Every compile uses the cache's schedules; tune=None follows $TRACEA_TUNE.

    keep_stages=True keeps the IR after every stage in `kernel.stages` (also written to
    $TRACEA_DUMP_DIR when set). CPU kernels also persist on disk ($TRACEA_CACHE_DIR), so the same
    compile in a later process is a load (kept-stage and dumped compiles always compile). Raises
    CompileError with file:line:col diagnostics for invalid input, and InternalCompilerError (with
    a saved reproducer) if the compiler itself aborts.
    """
    if is_torch_module(program):
        if _trains_differently(program):
            warn_once(f"training mode: {type(program).__qualname__}",
                      f"{type(program).__name__} is in training mode: its dropout and batch-norm updates run as "
                      "in training (in PyTorch where Tracea cannot compile them); for inference, call "
                      "model.eval() before tracea.compile")
        return compile_model(program, example_inputs, target=target, threads=threads, strategy=strategy,
                             export_fallback=DynamoModel, dynamic_dims=dynamic_dims, keep_stages=keep_stages,
                             tune=tune)
    if dynamic_dims is not None:
        raise TypeError("dynamic_dims is for torch.nn.Module programs; in IR, write '?' for a dynamic size")
    if example_inputs is not None:
        raise TypeError("example_inputs is for torch.nn.Module programs; tracea IR carries its own shapes")
    return compile_program(program, target=target, entry=entry, strategy=strategy, threads=threads,
                           keep_stages=keep_stages, chip=chip, tune=tune)


def _trains_differently(model) -> bool:
    """Whether `model` is in training mode with modules that then compute otherwise (dropout,
    batch norm)."""
    import torch
    modes = (torch.nn.modules.dropout._DropoutNd, torch.nn.modules.batchnorm._BatchNorm)
    return any(m.training and isinstance(m, modes) for m in model.modules())
