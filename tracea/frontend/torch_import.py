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
    single_output: bool  # the model returned one tensor, not a tuple/list


def _weights_as_inputs(model):
    """`model` wrapped so that its parameters and buffers are leading inputs of forward();
    returns (wrapper, those tensors)."""
    import torch
    state = dict(model.named_parameters(remove_duplicate=False))
    state.update(dict(model.named_buffers(remove_duplicate=False)))
    names = list(state)

    class Functional(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = model

        def forward(self, *flat):
            weights = dict(zip(names, flat[:len(names)]))
            return torch.func.functional_call(self.inner, weights, flat[len(names):])

    return Functional(), [state[n] for n in names]


def fold_batch_norms(model):
    """Conv2d followed by BatchNorm2d in eval mode, folded into the convolution's weights and
    bias (a copy; the model is left as it is). Models torch.fx cannot trace are returned as
    they are: their batch norms are then compiled as elementwise code."""
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
    wrapped, weights = _weights_as_inputs(model)
    args = tuple(t.detach() for t in weights) + example_inputs
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.export's own deprecation noise
        try:
            program = torch.export.export(wrapped, args, strict=False)
            out_spec = program.call_spec.out_spec
            single = out_spec.num_children == 0
            if not all(type(o.arg).__name__ == "TensorArgument" for o in program.graph_signature.output_specs) \
                    or not (single or out_spec.type in (tuple, list)) \
                    or any(c.num_children for c in out_spec.children()):
                raise CompileError("the model returns something other than a tensor or a tuple/list of tensors; "
                                   "Tracea compiles models that return those")
            module = fx.export_and_import(program, output_type="linalg-on-tensors", func_name="main")
        except CompileError:
            raise
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
    return ImportedGraph(text, weights, single)
