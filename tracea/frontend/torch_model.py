"""`tracea.compile(model, example_inputs)`: a PyTorch module compiled with Tracea, called with
torch tensors and returning what the module returns.

The whole traced graph becomes one Tracea kernel when it can; otherwise (ops torch-mlir leaves
outside linalg, ops Tracea's compiler refuses) it is split, the compilable regions run as Tracea
kernels and the rest in eager PyTorch (`frontend/partition.py`); `explain()` says which."""
from __future__ import annotations

import sys
import time

from .. import knobs
from ..compiler import compile_program
from ..errors import ArgumentError, CompileError, InternalCompilerError
from ..runtime import disk_cache
from . import layers
from .bridge import TensorBridge
from .dynamic import DynamicModel, SlowSymbolicKernel, products_of_run_time_size, program_shapes, traceable_example
from .partition import Placement, op_kind, partition
from .weight_layouts import WeightLayouts, channels_last
from .torch_import import (IMPORT_REVISION, SCALAR_INPUTS, decomposed_program, export_model, tensor_bytes, to_linalg,
                           warn_once)


class CompiledModel:
    """Callable like the module it was compiled from, for inputs of the example inputs' shapes and
    dtypes on the CPU. `kernel` is the Tracea kernel when the whole model is one (weights first,
    then the inputs), else None; `placement` and `explain()` say what ran where."""

    def __init__(self, exported, example_inputs, *, kernel=None, runner=None,
                 placement: Placement, import_seconds: float, compile_seconds: float,
                 weight_layouts: WeightLayouts | None = None):
        self.exported = exported
        self.weight_layouts = weight_layouts or WeightLayouts()
        self.kernel = kernel
        self.placement = placement
        self.import_seconds = import_seconds
        self.compile_seconds = compile_seconds
        self._expected = [(tuple(x.shape), x.dtype) if not isinstance(x, SCALAR_INPUTS) else ("value", x)
                          for x in example_inputs]
        self.shapes = program_shapes(exported.program)
        if self.shapes.dynamic:  # sizes are checked against the symbols, per call (TensorBridge)
            self._expected = [(None, e[1]) if e[0] != "value" else e for e in self._expected]
        if kernel is not None:
            dtypes = [w.dtype for w in exported.weights] + exported.input_dtypes
            self._run = TensorBridge(kernel, [dtypes[i] for i in exported.updated] + exported.outputs.dtypes,
                                     self.shapes)
        else:
            self._run = runner  # the partitioned graph's

    def explain(self) -> str:
        """What ran in Tracea kernels and what in PyTorch (and why), op kind by op kind; then the
        kernel's plan: its kernels in program order, function by function (a model's repeated
        layers are one function called once per layer), each with its shapes and the variant
        it runs on, and counts of the loop nests left to the generic lowering."""
        text = self.placement.explain()
        if self.kernel is None:
            return text
        plan = getattr(self.kernel, "plan", "")
        return text + ("\nkernel plan (in program order):\n" + plan if plan else
                       "\nkernel plan: none recorded (the whole graph took the generic lowering)")

    def accepts(self, inputs) -> bool:
        """Whether these inputs have shapes this compiled model takes."""
        try:
            self._check(inputs)
            if self.shapes.dynamic:
                weights = [tuple(w.shape) for w in self.exported.weights]
                self.shapes.bind(weights + [tuple(x.shape) for x in inputs if hasattr(x, "shape")])
            return True
        except ArgumentError:
            return False

    def _check(self, inputs) -> list:
        import torch
        if len(inputs) != len(self._expected):
            raise ArgumentError(f"the compiled model takes {len(self._expected)} input(s), got {len(inputs)}")
        tensors = []
        for i, (x, want) in enumerate(zip(inputs, self._expected)):
            if want[0] == "value":
                if x != want[1]:
                    raise ArgumentError(f"input #{i} was compiled as the constant {want[1]!r}, got {x!r}; "
                                        "compile again for this value")
                continue
            if not isinstance(x, torch.Tensor):
                raise ArgumentError(f"input #{i} must be a torch.Tensor, got {type(x).__name__}")
            if x.device.type != "cpu":
                raise ArgumentError(f"input #{i} is on {x.device}; this model was compiled for the CPU "
                                    "(move it with .cpu(), or use torch.compile(model, backend='tracea'), "
                                    "which falls back to PyTorch)")
            if (want[0] is not None and tuple(x.shape) != want[0]) or x.dtype != want[1]:
                shape = "any shape" if want[0] is None else list(want[0])  # dynamic sizes: bound per call
                raise ArgumentError(f"input #{i} is {x.dtype} {list(x.shape)} but the model was compiled for "
                                    f"{want[1]} {shape}; compile it again for this input (torch.compile "
                                    "with backend='tracea' recompiles on shape changes)")
            tensors.append(x)
        return tensors

    def __call__(self, *inputs):
        tensors = self._check(inputs)
        # read now: in-place updates are seen (also by the weights laid out anew, on a change)
        if self.kernel is None:
            results = self._run([w.detach() for w in self.exported.weights] + tensors)
        else:
            weights = self.weight_layouts(list(self.exported.weights))  # detached where made into arrays
            results = self._run(weights + tensors, weights=len(weights))
        updated = self.exported.updated
        if updated:  # the new values of what the model updates in place come first: written back
            import torch
            arguments = list(self.exported.weights) + tensors
            with torch.no_grad():
                for argument, value in zip(updated, results):
                    arguments[argument].copy_(value)
        return self.exported.outputs.rebuild(results[len(updated):])


def _program_runner(program, graph):
    """Runs a partitioned program's graph: placeholders filled from the user's arguments (weights
    first) and the program's own parameters, buffers and constants; the new values of the inputs
    it updates in place, then its outputs, picked."""
    from torch.export.graph_signature import InputKind, OutputKind
    signature = program.graph_signature
    outputs = [i for i, o in enumerate(signature.output_specs)  # (the updates of inputs first)
               if o.kind in (OutputKind.USER_INPUT_MUTATION, OutputKind.USER_OUTPUT)]

    def run(user_args):
        args = iter(user_args)
        values = [next(args) if spec.kind == InputKind.USER_INPUT else
                  program.state_dict[spec.target] if spec.target in program.state_dict else program.constants[spec.target]
                  for spec in signature.input_specs]
        results = graph(*values)
        results = results if isinstance(results, (tuple, list)) else (results,)
        return [results[i] for i in outputs]
    return run


def is_torch_module(program) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(program, torch.nn.Module)


def compile_model(model, example_inputs, *, target: str = "cpu", threads: int | None = None,
                  strategy: str = "tiled", export_fallback=None, dynamic_dims=None, keep_stages: bool = False,
                  tune=None, example_kernel: bool = True):
    """Compile `model` for `example_inputs` -> CompiledModel. A model torch.export cannot trace
    is given to `export_fallback(model, example_inputs, why)` when there is one (tracea.compile's
    is TorchDynamo: dynamo.DynamoModel, with a warning), else refused. dynamic_dims ({input
    position: dim or dims}) adds one compile for symbolic sizes of those dims, made at the first
    call with other sizes (a dynamic.DynamicModel); with example_kernel=False that is the only
    compile, the example's shapes being one of the sizes (a graph Dynamo traced with symbolic
    sizes: the shape it met is no likelier to recur than the next one)."""
    if example_inputs is None:
        raise CompileError("compiling a torch.nn.Module needs example_inputs (a tuple of tensors of the "
                           "shapes it will be called with)")
    if target != "cpu":
        raise CompileError(f"PyTorch models compile for the CPU target only so far, not '{target}'")
    example_inputs = (example_inputs,) if not isinstance(example_inputs, (tuple, list)) else tuple(example_inputs)
    options = dict(target=target, threads=threads, strategy=strategy, keep_stages=keep_stages, tune=tune)
    static = None
    if example_kernel or not dynamic_dims:
        static = _compile(model, example_inputs, options, export_fallback, None)
        if not dynamic_dims or not isinstance(static, CompiledModel):  # (a fallback's model)
            return static

    def compile_general(model, inputs, dynamic_dims):
        if dynamic_dims is None:  # for these shapes only
            return _compile(model, inputs, options, None, None)
        return _compile(model, traceable_example(inputs, dynamic_dims), options, None, dynamic_dims)
    return DynamicModel(model, example_inputs, dynamic_dims, compile_general, static)


def _import_key(exported) -> str:
    """The disk-cache key of a traced model's linalg import: its exported graph's code, the
    types of its inputs, the values of the constants it holds, and the versions of the tools."""
    import hashlib

    import importlib.metadata

    import torch
    program = exported.program
    digest = hashlib.sha256(program.graph_module.code.encode())
    for node in program.graph_module.graph.nodes:
        if node.op == "placeholder":
            value = node.meta.get("val")
            digest.update(repr((node.name, getattr(value, "shape", value), getattr(value, "dtype", None))).encode())
    for name, value in sorted(program.constants.items()):
        digest.update(name.encode())
        if isinstance(value, torch.Tensor):
            digest.update(tensor_bytes(value))
    versions = f"{torch.__version__} {importlib.metadata.version('torch-mlir')} import {IMPORT_REVISION}"
    return disk_cache.entry_key(["torch-import", versions, digest.hexdigest()])


def _progress(step: str, start: float) -> None:
    """One line on stderr per step of a model compile (knobs.show_progress)."""
    from .. import knobs
    if knobs.show_progress():
        print(f"tracea: {time.perf_counter() - start:6.1f} s  {step}", file=sys.stderr, flush=True)


def _import(program, start: float) -> str:
    """linalg text of a static program: its repeated layers imported once each when it has some
    (layers.py), else whole."""
    pieces = layers.plan(program)
    if pieces is not None:
        distinct = len({p.key for p in pieces})
        _progress(f"decomposing and importing to linalg with torch-mlir: {distinct} distinct piece(s) "
                  f"of {len(pieces)}", start)
        try:
            return layers.import_pieces(program, pieces, "the model")
        except CompileError as e:  # imported whole instead, which names the problem if it has one
            _progress(f"importing the model whole: {str(e).splitlines()[0]}", start)
    _progress("decomposing and importing to linalg with torch-mlir", start)
    return to_linalg(program)


def _compile(model, example_inputs, options, export_fallback, dynamic_dims):
    start = time.perf_counter()
    _progress(f"tracing {type(model).__name__} with torch.export", start)
    try:
        exported = export_model(model, example_inputs, dynamic_dims=dynamic_dims)
    except CompileError as e:
        if export_fallback is None or "torch.export could not trace" not in str(e):
            raise
        why = str(e).split(": ", 1)[1]
        warn_once(f"export: {why}", f"torch.export could not trace the model ({why}); TorchDynamo splits it "
                  "into graphs Tracea compiles, with Python in between")
        return export_fallback(model, example_inputs, why)

    def compile_text(text):
        _progress(f"compiling {text.count(chr(10))} lines of linalg", start)
        return compile_program(text, **options)

    if dynamic_dims and knobs.symbolic_kernel() == "auto" and (products := products_of_run_time_size(exported.program)):
        raise SlowSymbolicKernel(f"not compiled: the graph's products of symbolic size ({', '.join(products)}) would "
                                 "run as generic loops (TRACEA_SYMBOLIC_KERNEL=always compiles and uses it)")
    placement = Placement()
    try:
        if dynamic_dims:  # symbolic sizes: torch-mlir's own path (it keeps them '?')
            kernel, weight_layouts = compile_text(to_linalg(exported.program)), None
        else:
            text = disk_cache.lookup_text(key := _import_key(exported))
            if text is None:
                text = _import(exported.program, start)
                disk_cache.store_text(key, text)
            text, weight_layouts = channels_last(text, len(exported.weights), key)
            kernel = compile_text(text)
    except (CompileError, InternalCompilerError) as whole_error:
        if dynamic_dims:  # a symbolic graph is not split: regions would pass sizes between them
            raise
        _progress(f"splitting the graph: {str(whole_error).splitlines()[0]}", start)
        try:
            program = decomposed_program(exported.program)
            graph = partition(program.graph_module, compile_text, placement)
        except (CompileError, InternalCompilerError):
            raise whole_error from None
        seconds = time.perf_counter() - start
        return CompiledModel(exported, example_inputs, runner=_program_runner(program, graph), placement=placement,
                             import_seconds=0.0, compile_seconds=seconds)
    placement.regions = 1
    placement.compiled.update(op_kind(n) for n in exported.program.graph_module.graph.nodes
                              if n.op == "call_function")
    seconds = time.perf_counter() - start
    return CompiledModel(exported, example_inputs, kernel=kernel, placement=placement,
                         import_seconds=seconds - kernel.compile_seconds, compile_seconds=kernel.compile_seconds,
                         weight_layouts=weight_layouts)
