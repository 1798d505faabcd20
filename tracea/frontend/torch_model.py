"""`tracea.compile(model, example_inputs)`: a PyTorch module compiled into one Tracea kernel,
called with torch tensors and returning torch tensors."""
from __future__ import annotations

import sys
import time

from ..errors import ArgumentError, CompileError
from .torch_import import import_module


class CompiledModel:
    """Callable like the module it was compiled from, for inputs of the example inputs' shapes and
    dtypes on the CPU. `kernel` is the Tracea kernel (weights first, then the inputs)."""

    def __init__(self, kernel, graph, import_seconds: float):
        self.kernel = kernel
        self.graph = graph
        self.import_seconds = import_seconds
        self.compile_seconds = kernel.compile_seconds
        self._weights = [w.detach().contiguous().numpy() for w in graph.weights]  # views of the tensors
        self._inputs = kernel.signature.inputs[len(self._weights):]

    def __call__(self, *inputs):
        import torch
        if len(inputs) != len(self._inputs):
            raise ArgumentError(f"the compiled model takes {len(self._inputs)} input(s), got {len(inputs)}")
        arrays = []
        for i, (x, spec) in enumerate(zip(inputs, self._inputs)):
            if not isinstance(x, torch.Tensor):
                raise ArgumentError(f"input #{i} must be a torch.Tensor, got {type(x).__name__}")
            if x.device.type != "cpu":
                raise ArgumentError(f"input #{i} is on {x.device}; this model was compiled for the CPU "
                                    "(move it with .cpu(), or use torch.compile(model, backend='tracea'), "
                                    "which falls back to PyTorch)")
            if tuple(x.shape) != spec.shape:
                raise ArgumentError(f"input #{i} has shape {list(x.shape)} but the model was compiled for "
                                    f"{list(spec.shape)}; compile it again for this shape (torch.compile with "
                                    "backend='tracea' recompiles on shape changes)")
            arrays.append(x.detach().contiguous().numpy())
        outputs = self.kernel(*self._weights, *arrays)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        tensors = [torch.from_numpy(o) for o in outputs]
        return tensors[0] if self.graph.single_output else tuple(tensors)


def is_torch_module(program) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(program, torch.nn.Module)


def compile_model(model, example_inputs, *, target: str = "cpu", threads: int | None = None,
                  strategy: str = "tiled") -> CompiledModel:
    from ..compiler import compile as compile_program
    if example_inputs is None:
        raise CompileError("compiling a torch.nn.Module needs example_inputs (a tuple of tensors of the "
                           "shapes it will be called with)")
    if target != "cpu":
        raise CompileError(f"PyTorch models compile for the CPU target only so far, not '{target}'")
    example_inputs = (example_inputs,) if not isinstance(example_inputs, (tuple, list)) else tuple(example_inputs)
    start = time.perf_counter()
    graph = import_module(model, example_inputs)
    imported = time.perf_counter() - start
    kernel = compile_program(graph.text, target=target, strategy=strategy, threads=threads)
    return CompiledModel(kernel, graph, imported)
