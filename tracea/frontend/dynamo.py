"""`torch.compile(model, backend="tracea")`: a TorchDynamo backend.

Each FX graph Dynamo captures is compiled with Tracea for its input shapes and dtypes, once per
distinct set (an identical graph met again is a hit in Tracea's kernel cache). A graph Tracea
cannot take runs eagerly, with one warning per distinct reason.
"""
from __future__ import annotations

import logging
import threading
import warnings

log = logging.getLogger("tracea.dynamo")
_warned: set[str] = set()
_lock = threading.Lock()
fallbacks: dict[str, int] = {}  # reason -> graphs that ran eagerly for it


def _fall_back(gm, reason: str):
    with _lock:
        fallbacks[reason] = fallbacks.get(reason, 0) + 1
        first = reason not in _warned
        _warned.add(reason)
    if first:
        warnings.warn(f"tracea: running a graph with PyTorch instead: {reason}", RuntimeWarning, stacklevel=3)
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
        if x.dtype != torch.float32:
            return f"graph input #{i} has dtype {x.dtype}; Tracea compiles float32 PyTorch graphs"
    return None


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
        from .torch_model import compile_model
        gm, sizes = self.gm, {i: int(a) for i, a in enumerate(args) if not isinstance(a, torch.Tensor)}

        class Specialized(torch.nn.Module):  # the sizes become constants of the traced graph
            def __init__(self):
                super().__init__()
                self.gm = gm

            def forward(self, *tensors):
                it = iter(tensors)
                return self.gm(*[sizes[i] if i in sizes else next(it) for i in range(len(sizes) + len(tensors))])

        tensors = tuple(a for a in args if isinstance(a, torch.Tensor))
        try:
            return compile_model(Specialized() if sizes else gm, tensors, export_fallback=False)
        except Exception as e:  # noqa: BLE001 - torch.export fails in many ways; the graph still runs
            hint = (" (Dynamo made this graph's shapes dynamic after a shape change; "
                    "torch.compile(..., dynamic=False) recompiles per shape instead)") if sizes else ""
            _fall_back(gm, _reason(e) + hint)
            return None


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
    runner = _PerShape(gm)
    if not any(isinstance(x, torch.SymInt) for x in example_inputs):
        runner.prepare(example_inputs)  # compile now, for the shapes Dynamo traced with
    # (a graph with symbolic sizes compiles at its first call, for the sizes it is called with)
    return runner


def register() -> None:
    """Make backend="tracea" known to torch.compile (torch must be importable)."""
    from torch._dynamo import list_backends, register_backend
    if "tracea" not in list_backends(exclude_tags=()):
        register_backend(tracea_backend, name="tracea")
