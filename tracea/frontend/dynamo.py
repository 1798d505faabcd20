"""`torch.compile(model, backend="tracea")`: a TorchDynamo backend.

Each FX graph Dynamo captures is compiled with Tracea for its input shapes and dtypes, once per
distinct set (an identical graph met again is a hit in Tracea's kernel cache). A graph Tracea
cannot take runs eagerly, with one warning per distinct reason.
"""
from __future__ import annotations

import logging
import re
import threading
import time

from ..errors import CompileError
from .dynamic import DynamicModel
from .partition import Placement
from .torch_import import MODULE_KEY, warn_once
from .torch_model import compile_model

log = logging.getLogger("tracea.dynamo")
_lock = threading.Lock()
fallbacks: dict[str, int] = {}  # reason -> graphs that ran eagerly for it


def _fall_back(gm, reason: str):
    with _lock:
        fallbacks[reason] = fallbacks.get(reason, 0) + 1
    warn_once(f"graph: {reason}", f"running a graph with PyTorch instead: {reason}")
    log.debug("graph falls back to eager: %s", reason)
    return gm.forward


def _unsupported_input(example_inputs) -> str | None:
    import torch
    for i, x in enumerate(example_inputs):
        if isinstance(x, (int, torch.SymInt)):
            continue  # a size Dynamo made dynamic: specialized per call below
        if not isinstance(x, torch.Tensor):
            return f"graph input #{i} is a {type(x).__name__}; Tracea compiles graphs of tensors"
        if x.device.type != "cpu":
            return f"graph input #{i} is on {x.device}; Tracea compiles PyTorch graphs for the CPU"
        if x.dtype.is_complex:
            return f"graph input #{i} has dtype {x.dtype}; Tracea compiles graphs of real tensors"
    return None


def _layer_calls(gm) -> None:
    """Tag each node of a Dynamo graph with the module calls it was made in, as torch.export's
    trace of a model is tagged (torch_import.module_paths), so that its repeated layers are
    imported and compiled once (layers.py): from Dynamo's nn_module_stack, whose paths read
    "L['self'].transformer.h.1" (a path met again after another call at its depth is a new call)."""
    calls: dict[str, int] = {}
    previous: tuple[str, ...] = ()
    for node in gm.graph.nodes:
        stack = [re.sub(r"\[(\d+)\]", r".\1", re.sub(r"^L\['self'\]\.?|^L__self__", "", path))
                 for path, _ in (node.meta.get("nn_module_stack") or {}).values()]
        paths = tuple(p for p in stack if p)
        for depth, path in enumerate(paths):
            if depth >= len(previous) or previous[depth] != path:
                calls[path] = calls.get(path, 0) + 1
        previous = paths
        if paths:
            node.meta.setdefault("custom", {})[MODULE_KEY] = tuple(f"{p}@{calls[p]}" for p in paths)


def _interpreted(gm):
    """A module running `gm` node by node (torch.fx.Interpreter): traced under
    preserve_node_meta, each op it records keeps the tags of the node it came from (_layer_calls)."""
    import torch
    from torch import fx

    class Interpreted(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gm = gm

        def forward(self, *args):
            return fx.Interpreter(self.gm).run(*args)
    return Interpreted()


def _reason(e: Exception) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return " ".join(lines[:2]) if lines else type(e).__name__


class _PerShape:
    """Runs a Dynamo graph through Tracea kernels compiled for each distinct set of input shapes
    (and values of the size arguments Dynamo made symbolic), falling back to the graph itself for
    shapes Tracea cannot compile."""

    def __init__(self, gm):
        self.gm = gm
        self.kernels: dict[tuple, object] = {}

    def prepare(self, args):
        """The model compiled for these arguments' shapes (None: it runs with PyTorch)."""
        import torch
        key = tuple((tuple(a.shape), str(a.dtype)) if isinstance(a, torch.Tensor) else int(a) for a in args)
        if key not in self.kernels:
            self.kernels[key] = self._compile(args)
        return self.kernels[key]

    def __call__(self, *args):
        import torch
        compiled = self.prepare(args)
        if compiled is None:
            return self.gm.forward(*args)
        return compiled(*[a for a in args if isinstance(a, torch.Tensor)])

    def _compile(self, args):
        import torch
        gm, sizes = _interpreted(self.gm), {i: int(a) for i, a in enumerate(args) if not isinstance(a, torch.Tensor)}

        class Specialized(torch.nn.Module):  # the sizes become constants of the traced graph
            def __init__(self):
                super().__init__()
                self.gm = gm

            def forward(self, *tensors):
                it = iter(tensors)
                return self.gm(*[sizes[i] if i in sizes else next(it) for i in range(len(sizes) + len(tensors))])

        tensors = tuple(a for a in args if isinstance(a, torch.Tensor))
        try:
            return compile_model(Specialized() if sizes else gm, tensors, export_fallback=None)
        except Exception as e:  # noqa: BLE001 - torch.export fails in many ways; the graph still runs
            hint = (" (Dynamo made this graph's shapes dynamic after a shape change; "
                    "torch.compile(..., dynamic=False) recompiles per shape instead)") if sizes else ""
            _fall_back(gm, _reason(e) + hint)
            return None


class _Symbolic:
    """A graph Dynamo traced with symbolic sizes, compiled once for all of them
    (dynamic.DynamicModel, with no kernel for the shapes Dynamo met first) at its first call
    (compiling inside the backend call trips Dynamo's own guards); its size arguments are read
    from the tensors' shapes at each call. Where a shape cannot be compiled for, the graph is
    compiled per shape from then on (_PerShape: falling back to PyTorch with a warning)."""

    def __init__(self, gm, example_inputs):
        import torch
        self.gm, self.model = gm, None
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        positions = [i for i, a in enumerate(example_inputs) if isinstance(a, torch.Tensor)]
        # the sizes Dynamo passes as arguments are the ones that vary (others it specialized)
        symbols = {a.node.expr for a in example_inputs if isinstance(a, torch.SymInt)}
        self.dims, source = {}, {}  # tensor number -> its symbolic dims; size symbol -> (tensor, dim)
        for t, i in enumerate(positions):
            for d, size in enumerate(getattr(placeholders[i].meta.get("example_value"), "shape", ())):
                if isinstance(size, torch.SymInt) and size.node.expr in symbols:
                    self.dims.setdefault(t, []).append(d)
                    source.setdefault(size.node.expr, (t, d))
        self.sizes = {}  # argument position of a size -> (tensor, dim) it is read from
        for i, a in enumerate(example_inputs):
            if isinstance(a, torch.SymInt):
                if a.node.expr not in source:
                    raise ValueError(f"size argument #{i} is no tensor's dim")
                self.sizes[i] = source[a.node.expr]
        self.n_args = len(example_inputs)

    @property
    def kernels(self) -> dict:  # (what DynamoModel.placement reads)
        return {"symbolic": self.model} if isinstance(self.model, DynamicModel) else {}

    def __call__(self, *args):
        import torch
        tensors = tuple(a for a in args if isinstance(a, torch.Tensor))
        if self.model is None:
            try:
                self.model = self._compile(tensors)
            except Exception as e:  # noqa: BLE001 - the graph still runs, per shape
                log.debug("graph compiled per shape: %s", _reason(e))
                self.model = _PerShape(self.gm)
        if isinstance(self.model, DynamicModel):
            try:
                return self.model(*tensors)
            except CompileError as e:
                log.debug("graph compiled per shape: %s", _reason(e))
                self.model = _PerShape(self.gm)
        return self.model(*args)

    def _compile(self, tensors):
        import torch
        gm, sizes, n_args = _interpreted(self.gm), self.sizes, self.n_args

        class SizesFromShapes(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.gm = gm

            def forward(self, *tensors):
                it = iter(tensors)
                return self.gm(*[tensors[sizes[i][0]].shape[sizes[i][1]] if i in sizes else next(it)
                                 for i in range(n_args)])

        return compile_model(SizesFromShapes(), tensors, export_fallback=None, dynamic_dims=self.dims,
                             example_kernel=False)


def tracea_backend(gm, example_inputs):
    """The backend function Dynamo calls with a GraphModule and its example inputs."""
    import torch
    reason = _unsupported_input(example_inputs)
    if reason is None and torch.is_grad_enabled() and any(
            isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs):
        reason = ("the graph needs gradients and Tracea compiles inference graphs only; call the model "
                  "under torch.no_grad() or torch.inference_mode()")
    if reason is not None:
        return _fall_back(gm, reason)
    _layer_calls(gm)  # once per graph, however many shapes it is compiled for
    if any(isinstance(x, torch.SymInt) for x in example_inputs):
        try:
            return _Symbolic(gm, example_inputs)  # compiled at its first call
        except ValueError as e:  # a size Tracea cannot read from the tensors: per-shape kernels
            log.debug("graph compiled per shape: %s", e)
            return _PerShape(gm)
    runner = _PerShape(gm)
    runner.prepare(example_inputs)  # compile now, for the shapes Dynamo traced with
    return runner


def register() -> None:
    """Make backend="tracea" known to torch.compile (torch must be importable)."""
    from torch._dynamo import list_backends, register_backend
    if "tracea" not in list_backends(exclude_tags=()):
        register_backend(tracea_backend, name="tracea")


class DynamoModel:
    """A model torch.export cannot trace whole (data-dependent Python control flow, .item(), ...),
    run through TorchDynamo with Tracea as its backend: each graph Dynamo captures is compiled
    (split where needed), the Python between graphs runs as Python."""

    def __init__(self, model, example_inputs, why: str):
        import torch
        self.why = why
        self.kernel = None
        self.graphs = []  # the backend's runner per captured graph

        def backend(gm, inputs):
            runner = tracea_backend(gm, inputs)
            self.graphs.append(runner)
            return runner

        self._compiled = torch.compile(model, backend=backend, dynamic=False)
        start = time.perf_counter()
        self(*example_inputs)  # capture and compile now, for the example inputs
        self.compile_seconds = time.perf_counter() - start
        self.import_seconds = 0.0

    @property
    def placement(self) -> Placement:
        total = Placement()
        for model in self._models():
            total.compiled.update(model.placement.compiled)
            total.eager.update(model.placement.eager)
            total.reasons.update(model.placement.reasons)
            total.regions += model.placement.regions
        return total

    def _models(self):
        return [m for runner in self.graphs for m in getattr(runner, "kernels", {}).values() if m is not None]

    def explain(self) -> str:
        return (f"torch.export could not trace the model whole ({self.why}); TorchDynamo captured "
                f"{len(self.graphs)} graph(s), the Python between them runs as Python\n" + self.placement.explain())

    def __call__(self, *inputs):
        import torch
        with torch.no_grad():
            return self._compiled(*inputs)
