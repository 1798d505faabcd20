"""PyTorch -> MLIR text that Tracea compiles: torch.export, then torch-mlir's FX importer down to
linalg on tensors, handed over as generic-form text (torch-mlir bundles its own MLIR, whose objects
the xtc bindings cannot take).

Parameters and buffers become leading function arguments rather than constants: the compiled
kernel then depends only on shapes (one kernel per shape, shared by models with other weights),
and the IR text stays small. (Convolutions with a folded batch norm get new weights: a copy.)"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

from ..errors import CompileError


def require_torch_mlir():
    import sys

    from ..targets import cpu
    if "torch_mlir" not in sys.modules and cpu.jit_used:
        # Its native library carries its own LLVM; loaded after a JIT has made this process's
        # libLLVM.so symbols global, LLVM aborts the process on duplicate command-line options.
        raise CompileError("torch-mlir must be imported before Tracea compiles its first kernel in this "
                           "process: add `import torch_mlir.fx` at the top of your program")
    try:
        import torch  # noqa: F401
        from torch_mlir import fx  # noqa: F401
    except ImportError as e:
        raise CompileError(f"compiling PyTorch models needs torch and torch-mlir ({e}); install them with "
                           "`pip install 'tracea[torch]'` (torch==2.13.0, torch-mlir==20261001)") from None


@dataclass
class ImportedGraph:
    text: str  # linalg-on-tensors module, generic form
    weights: list  # torch tensors passed ahead of the user's inputs, in argument order
    weight_names: list[str]
    num_outputs: int
    single_output: bool  # the model returned one tensor, not a tuple/list


class _WeightsAsInputs:
    """Wraps a module so that its parameters and buffers are inputs of forward()."""

    @staticmethod
    def build(model):
        import torch

        class Functional(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.inner = model
                state = dict(model.named_parameters(remove_duplicate=False))
                state.update(dict(model.named_buffers(remove_duplicate=False)))
                self.names = list(state)
                self.tensors = [state[n] for n in self.names]

            def forward(self, *flat):
                n = len(self.names)
                return torch.func.functional_call(self.inner, dict(zip(self.names, flat[:n])), flat[n:])

        return Functional()


def fold_batch_norms(model):
    """Conv2d followed by BatchNorm2d in eval mode, folded into the convolution's weights and
    bias (a copy; the model is left as it is). Models torch.fx cannot trace are returned as
    they are: their batch norms are then compiled as elementwise code."""
    import torch
    if model.training:
        return model
    try:
        from torch.fx.experimental.optimization import fuse
        return fuse(model)
    except Exception:  # noqa: BLE001 - not symbolically traceable: keep the batch norms
        return model


_DIALECTS = ("builtin", "func", "linalg", "tensor", "arith", "math", "cf", "scf", "bufferization")


def _foreign_ops(module) -> list[str]:
    """Ops outside the dialects Tracea lowers (e.g. tm_tensor.sort, torch.* left unconverted)."""
    from torch_mlir import ir as tir
    found: set[str] = set()

    def visit(op):
        if op.operation.name.split(".")[0] not in _DIALECTS:
            found.add(op.operation.name)
        return tir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return sorted(found)


def import_module(model, example_inputs, *, fold_bn: bool = True) -> ImportedGraph:
    """Trace `model` on `example_inputs` (torch tensors) and import it as linalg on tensors."""
    require_torch_mlir()
    import torch
    from torch_mlir import fx

    if not isinstance(model, torch.nn.Module):
        raise CompileError(f"tracea.compile expected a torch.nn.Module, got {type(model).__name__}")
    example_inputs = tuple(example_inputs)
    for i, x in enumerate(example_inputs):
        if not isinstance(x, torch.Tensor):
            raise CompileError(f"example input #{i} is a {type(x).__name__}; Tracea compiles models whose "
                               "inputs are tensors")
    if fold_bn:
        model = fold_batch_norms(model)
    wrapped = _WeightsAsInputs.build(model)
    with torch.no_grad():
        expected = model(*example_inputs)
    single = isinstance(expected, torch.Tensor)
    outputs = [expected] if single else list(expected) if isinstance(expected, (tuple, list)) else None
    if outputs is None or not all(isinstance(o, torch.Tensor) for o in outputs):
        raise CompileError(f"the model returned {type(expected).__name__}; Tracea compiles models that "
                           "return a tensor or a tuple/list of tensors")
    args = tuple(t.detach() for t in wrapped.tensors) + example_inputs
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.export's own deprecation noise
        try:
            module = fx.export_and_import(wrapped, *args, output_type="linalg-on-tensors", func_name="main")
        except Exception as e:  # noqa: BLE001 - torch.export / torch-mlir name the unsupported construct
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise CompileError(f"torch-mlir could not import the model to linalg: {type(e).__name__}: "
                               f"{first}") from None
    unsupported = _foreign_ops(module)
    if unsupported:
        raise CompileError(f"the model uses {', '.join(unsupported)}, which torch-mlir does not lower to linalg "
                           "and Tracea cannot compile (torch.compile(model, backend='tracea') runs such graphs "
                           "with PyTorch)")
    text = module.operation.get_asm(print_generic_op_form=True, large_elements_limit=None)
    return ImportedGraph(text, list(wrapped.tensors), list(wrapped.names), len(outputs), single)
