"""Dynamic shapes: one compile for every size of the dimensions a user names.

`tracea.compile(model, inputs, dynamic_dims={0: 0})` keeps the example's shapes on the fast path
(a kernel specialized for them, Tracea's tuned kernels included) and compiles, at the first call
with other sizes, one more kernel whose named dimensions are symbolic (torch.export's symbols
become `?` sizes in MLIR; the kernel reads them from its memref descriptors at run time). Every
later size is served by that kernel: no recompiles. `SymbolicShapes` binds the symbols to the
sizes of a call, checks them, and gives the result shapes the caller allocates.

Where the symbolic kernel would run products (GEMMs, convs) of run-time size as generic loops
(tracea's GEMM and conv kernels take static shapes; a 96x768x3072 linear ran 110 ms there, torch
4.5 ms: a transformer whose sequence length Dynamo made symbolic ran 40-300x slower than eager),
it is not used (TRACEA_SYMBOLIC_KERNEL=always uses it): the traced graph's linears and convs of
symbolic size say so before anything is compiled (products_of_run_time_size), the compiled
kernel's plan in the cases that graph does not show. Where it cannot be compiled there is none:
then a new shape runs in PyTorch, and is compiled for at its second call, so shapes that
recur run Tracea's kernels and one-off shapes (prompts of every length) cost no compile."""
from __future__ import annotations

import time

from .. import knobs
from ..errors import ArgumentError, CompileError
from ..targets.cpu.linalg import RUN_TIME_PRODUCTS
from .partition import Placement
from .torch_import import dims_named, warn_once


# Products a kernel for symbolic sizes runs as generic loops whenever an operand has a symbolic
# size: no GEMM or conv kernel takes one. matmul-like ops count only with one operand of symbolic
# size (x @ W); two (attention's q @ k^T, a KV cache's) may become the attention kernel, which does.
_WEIGHT_PRODUCTS = {"aten.linear.default", "aten.addmm.default", "aten.mm.default", "aten.convolution.default",
                    "aten.conv1d.default", "aten.conv2d.default", "aten.conv3d.default"}
_MATMULS = {"aten.matmul.default", "aten.bmm.default", "aten.baddbmm.default"}


class SlowSymbolicKernel(Exception):
    """The kernel for symbolic sizes would run products of run-time size as generic loops; raised
    before it is compiled (its compile costs seconds: 6.5 s for a 4-layer GPT-2)."""


def products_of_run_time_size(program) -> list[str]:
    """The ops of an ExportedProgram's graph that a kernel of symbolic sizes runs as generic loops
    (see _WEIGHT_PRODUCTS), with their counts: ["aten.linear.default x14"]."""
    import torch
    counts: dict[str, int] = {}
    for node in program.graph_module.graph.nodes:
        target = str(node.target)
        if node.op != "call_function" or target not in _WEIGHT_PRODUCTS | _MATMULS:
            continue
        symbolic = [any(isinstance(d, torch.SymInt) for d in getattr(a.meta.get("val"), "shape", ()))
                    for a in node.args if isinstance(a, torch.fx.Node)]
        if sum(symbolic) >= 1 if target in _WEIGHT_PRODUCTS else sum(symbolic) == 1:
            counts[target] = counts.get(target, 0) + 1
    return [f"{target} x{count}" for target, count in counts.items()]


def _dims(value) -> list:
    """A traced value's sizes: ints, or sympy expressions of torch.export's size symbols."""
    import torch
    return [d.node.expr if isinstance(d, torch.SymInt) else int(d) for d in value.shape]


def _size_at(env: dict):
    """expr -> its size at the sizes `env` binds (converted to sympy once for all of a call's
    dims). xreplace, 15-25x cheaper than subs: a GPT-2 decoding step's result sizes took 5 ms of
    subs under cProfile, a third of the step."""
    import sympy
    values = {symbol: sympy.Integer(size) for symbol, size in env.items()}
    return lambda expr: int(expr.xreplace(values))


class SymbolicShapes:
    """The sizes a kernel's inputs have (ints or symbol expressions) and its results' shapes.

    Binding runs on every call of a kernel of symbolic sizes (a decoding step: once per token),
    so what each dim asks is worked out once here and sympy is left to the derived sizes: the
    generic walk took 25-30 us a call, a third of a small kernel's time."""

    def __init__(self, input_values, output_values, ranges=None):
        self.inputs = [_dims(v) for v in input_values]
        self.outputs = [_dims(v) for v in output_values]
        self.ranges = ranges or {}  # symbol -> torch ValueRanges (lower, upper)
        self.dynamic = any(not isinstance(d, int) for dims in self.inputs + self.outputs for d in dims)
        # per dim of an input, in order: ("fixed", size), ("symbol", symbol) or ("derived", expression)
        self._checks = [(i, d, "fixed" if isinstance(want, int) else "symbol" if want.is_Symbol else "derived", want)
                        for i, dims in enumerate(self.inputs) for d, want in enumerate(dims)]
        # as Python numbers (torch's and sympy's infinities as inf)
        self._bounds = {symbol: (float(bounds.lower), float(bounds.upper)) for symbol, bounds in self.ranges.items()}
        self._last: tuple | None = None  # (shapes, env) of the last bind: a call binds twice

    def bind(self, shapes) -> dict:
        """{symbol: size} for these input shapes; ArgumentError when they contradict the traced ones."""
        shapes = tuple(tuple(shape) for shape in shapes)
        if self._last is not None and self._last[0] == shapes:
            return self._last[1]
        for i, (shape, dims) in enumerate(zip(shapes, self.inputs)):
            if len(shape) != len(dims):
                raise ArgumentError(f"input #{i} has {len(shape)} dimensions, the model was compiled for {len(dims)}")
        env = {}
        derived = []
        for i, d, kind, want in self._checks:
            if i >= len(shapes):
                break
            size = shapes[i][d]
            if kind == "fixed":
                if size != want:
                    raise ArgumentError(f"input #{i} has size {size} in dim {d}, where the model was compiled "
                                        f"for {want} only (name it in dynamic_dims to make it vary)")
            elif kind == "symbol":
                if env.setdefault(want, size) != size:
                    raise ArgumentError(f"input #{i} has size {size} in dim {d}, but another input's size "
                                        f"there is {env[want]}: the model needs them equal")
            else:
                derived.append((i, d, size, want))
        if derived:  # sizes derived from others
            size_of = _size_at(env)
            for i, d, size, want in derived:
                if not want.free_symbols - env.keys() and (needed := size_of(want)) != size:
                    raise ArgumentError(f"input #{i} has size {size} in dim {d}; the model needs {needed}")
        for symbol, size in env.items():
            lower, upper = self._bounds.get(symbol, (-float("inf"), float("inf")))
            if not lower <= size <= upper:
                raise ArgumentError(f"a dynamic size of {size} is outside the range {self.ranges[symbol].lower}.."
                                    f"{self.ranges[symbol].upper} torch.export traced the model for")
        self._last = (shapes, env)
        return env

    def output_shapes(self, env) -> list[tuple]:
        """The result shapes for the sizes `env` binds."""
        size_of = None
        shapes = []
        for dims in self.outputs:
            shape = []
            for d in dims:
                if isinstance(d, int):
                    shape.append(d)
                elif d in env:
                    shape.append(env[d])
                else:
                    size_of = size_of or _size_at(env)
                    shape.append(size_of(d))
            shapes.append(tuple(shape))
        return shapes


def program_shapes(program) -> SymbolicShapes:
    """The SymbolicShapes of an ExportedProgram's user inputs and its results: the new values of
    the inputs it updates in place, then its outputs."""
    from torch.export.graph_signature import InputKind, OutputKind
    graph = program.graph_module.graph
    placeholders = {n.name: n for n in graph.nodes if n.op == "placeholder"}
    inputs = [placeholders[s.arg.name].meta["val"] for s in program.graph_signature.input_specs
              if s.kind == InputKind.USER_INPUT]
    results = graph.output_node().args[0]
    outputs = [r.meta["val"] for r, s in zip(results, program.graph_signature.output_specs)  # (updates first)
               if s.kind in (OutputKind.USER_INPUT_MUTATION, OutputKind.USER_OUTPUT)]
    return SymbolicShapes(inputs, outputs, dict(program.range_constraints))


def traceable_example(inputs, dynamic_dims):
    """`inputs` with every dynamic dim of size 0 or 1 doubled (repeating the data, so indices
    stay valid) until it is at least 2: torch.export fixes dims traced at 0 or 1."""
    import torch
    inputs = list(inputs)
    for i in dynamic_dims:
        x = inputs[i]
        for d in dims_named(dynamic_dims, i, x.dim()):
            if x.shape[d] == 0:
                x = torch.zeros([2 if k == d else n for k, n in enumerate(x.shape)], dtype=x.dtype)
            while x.shape[d] < 2:
                x = torch.cat([x, x], dim=d)
        inputs[i] = x
    return tuple(inputs)


class DynamicModel:
    """A model compiled for its example shapes (`static`; None for a graph Dynamo traced with
    symbolic sizes, whose example is a shape like any other), and once more for any sizes of
    `dynamic_dims`."""

    def __init__(self, model, example_inputs, dynamic_dims, compile_model, static=None):
        self.model, self.dynamic_dims, self._compile_model = model, dynamic_dims, compile_model
        self.static = static
        self.general = None  # compiled at the first call with other sizes
        self.special = {}  # shapes the general kernel cannot take -> a model compiled for them
        self.general_failed = None  # why the general kernel could not be compiled
        self.general_slow = False  # it runs products of run-time size as generic loops: not used
        self.general_skipped = None  # the graph's products that said so before it was compiled
        self.eager_shapes = set()  # shapes run in PyTorch once (compiled for at their second call)
        self.compiles = 0 if static is None else 1
        self._example = [tuple(x.shape) if hasattr(x, "shape") else x for x in example_inputs]
        self.compile_seconds = 0.0 if static is None else static.compile_seconds

    @property
    def new_shapes_start_eager(self) -> bool:
        """No kernel for symbolic sizes to use (it failed, or is slow): a new shape runs in PyTorch,
        and is compiled for at its second call."""
        return self.general_slow or self.general_failed is not None

    def _models(self) -> list:
        return [m for m in (self.static, self.general, *self.special.values()) if m is not None]

    @property
    def kernel(self):
        return self._models()[0].kernel if self._models() else None

    @property
    def placement(self) -> Placement:
        return self._models()[0].placement if self._models() else Placement()

    def explain(self) -> str:
        general = ("compiled for symbolic sizes too:\n" + self.general.explain()) if self.general else \
            f"no kernel for symbolic sizes: {self.general_failed}" if self.general_failed else \
            f"no kernel for symbolic sizes: {self.general_skipped}" if self.general_skipped else \
            "a kernel for symbolic sizes is compiled at the first call with other sizes"
        if self.general_slow and self.general:
            general += ("\nnot used: its products of run-time size are generic loops "
                        "(TRACEA_SYMBOLIC_KERNEL=always uses it)")
        if self.new_shapes_start_eager:
            general += ("\na new shape runs in PyTorch, and is compiled for at its second call "
                        f"({len(self.eager_shapes)} shape(s) so far)")
        if self.special:
            general += f"\nand for {len(self.special)} other shape(s): {', '.join(map(str, self.special))}"
        return f"for the example shapes:\n{self.static.explain()}\n{general}" if self.static else general

    def __call__(self, *inputs):
        shapes = [tuple(x.shape) if hasattr(x, "shape") else x for x in inputs]
        if self.static is not None and shapes == self._example:
            return self.static(*inputs)
        if self.general is None and self.general_failed is None and not self.general_slow:
            try:
                self.general = self._compiled(lambda: self._compile_model(self.model, inputs, self.dynamic_dims))
            except SlowSymbolicKernel as e:
                self.general_slow, self.general_skipped = True, str(e)
            except CompileError as e:
                self.general_failed = str(e)
                warn_once(f"dynamic: {e}", f"{e}; a new shape runs in PyTorch instead, and is compiled for at its "
                                           "second call")
            else:
                # (said by explain(): a policy, not a problem to warn of)
                self.general_slow = knobs.symbolic_kernel() == "auto" and RUN_TIME_PRODUCTS in self.general.explain()
        if self.general is not None and not self.general_slow and self.general.accepts(inputs):
            return self.general(*inputs)
        self._check_fixed_dims(shapes)
        # sizes outside the symbolic kernel's range (0 or 1 where torch.export traced only 2 and
        # up), or every size when there is no such kernel or it is slow (after one call in
        # PyTorch: a shape that never recurs costs no compile): a kernel for these shapes, kept
        key = tuple(shapes)
        if self.new_shapes_start_eager and key not in self.special and key not in self.eager_shapes:
            self.eager_shapes.add(key)
            return self._eager(inputs)
        if key not in self.special:
            self.special[key] = self._compiled(lambda: self._compile_model(self.model, inputs, None))
        return self.special[key](*inputs)

    def _eager(self, inputs):
        import torch
        with torch.no_grad():
            return self.model(*inputs)

    def _check_fixed_dims(self, shapes) -> None:
        """ArgumentError unless `shapes` differ from the example's in the dynamic dims only."""
        if len(shapes) != len(self._example):
            raise ArgumentError(f"the compiled model takes {len(self._example)} input(s), got {len(shapes)}")
        for i, (shape, example) in enumerate(zip(shapes, self._example)):
            if not isinstance(example, tuple) or len(shape) != len(example):
                continue  # the compiled model names that mistake
            dims = dims_named(self.dynamic_dims, i, len(example))
            for d, (size, want) in enumerate(zip(shape, example)):
                if d not in dims and size != want:
                    raise ArgumentError(f"input #{i} has size {size} in dim {d}, where the model was compiled "
                                        f"for {want} only (name it in dynamic_dims to make it vary)")

    def _compiled(self, compile_now):
        start = time.perf_counter()
        try:
            model = compile_now()
        except CompileError as e:
            raise CompileError(f"compiling the model for other sizes failed: {e}") from None
        self.compiles += 1
        self.compile_seconds += time.perf_counter() - start
        return model
