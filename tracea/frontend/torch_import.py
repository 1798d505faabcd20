"""PyTorch -> MLIR text that Tracea compiles: torch.export, then torch-mlir's FX importer down to
linalg on tensors, handed over as generic-form text (torch-mlir bundles its own MLIR, whose objects
the xtc bindings cannot take).

Parameters and buffers become leading function arguments rather than constants: the compiled
kernel then depends only on shapes (one kernel per shape, shared by models with other weights),
and the IR text stays small. (Convolutions with a folded batch norm get new weights: a copy.)

A model may return any pytree torch knows (tuples, dicts, Hugging Face ModelOutputs) whose leaves
are tensors or constants; the traced function returns the tensor leaves as a flat tuple and
`OutputLayout` puts the results back into the model's structure."""
from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import re
import sys
import tempfile
import warnings
from dataclasses import dataclass, field

from ..errors import CompileError, warn
from .attention_masks import settle_constant_masks


def require_torch_mlir():
    try:
        import torch  # noqa: F401
        from torch_mlir import fx  # noqa: F401
    except ImportError as e:
        raise CompileError(f"compiling PyTorch models needs torch and torch-mlir ({e}); install them with "
                           "`pip install 'tracea[torch]'` (torch==2.13.0, torch-mlir==20261001)") from None


@dataclass
class OutputLayout:
    """Where a model's outputs go: its pytree spec, and per leaf either None (the next tensor the
    compiled function returns) or the constant the model always returns there."""

    spec: object = None
    constants: list = field(default_factory=list)
    dtypes: list = field(default_factory=list)  # of the tensor leaves

    def record(self, output) -> tuple:
        """The tensor leaves of `output` (called while tracing), remembering the rest."""
        import torch
        from torch.utils._pytree import tree_flatten
        leaves, self.spec = tree_flatten(output)
        self.constants = []
        numbers = {torch.SymInt: (int, torch.int64), torch.SymFloat: (float, torch.float64),
                   torch.SymBool: (bool, torch.bool)}
        for i, leaf in enumerate(leaves):
            if isinstance(leaf, torch.Tensor):
                self.constants.append(None)
            elif type(leaf) in numbers:  # x.item(), a symbolic size: a 0-d tensor until the end
                kind, dtype = numbers[type(leaf)]
                leaves[i] = torch.scalar_tensor(leaf, dtype=dtype)
                self.constants.append(("number", kind))
            elif _holds_tensor(leaf):
                raise CompileError(
                    f"the model returns a {type(leaf).__name__} holding tensors, which Tracea cannot rebuild on "
                    "each call (it is not a tuple, list, dict or registered pytree node): return its tensors "
                    "instead; for a Hugging Face model's cache pass use_cache=False; or use "
                    "torch.compile(model, backend='tracea'), which keeps Python objects")
            else:
                self.constants.append(("constant", leaf))
        tensors = tuple(leaf for leaf in leaves if isinstance(leaf, torch.Tensor))
        self.dtypes = [t.dtype for t in tensors]
        return tensors

    def rebuild(self, tensors):
        from torch.utils._pytree import tree_unflatten
        it = iter(tensors)
        leaves = [next(it) if c is None else c[1](next(it).item()) if c[0] == "number" else c[1]
                  for c in self.constants]
        return tree_unflatten(leaves, self.spec)


def _holds_tensor(value, depth: int = 4) -> bool:
    """Whether `value` (an output leaf that is not a tensor) refers to a tensor in its attributes
    or containers, a few levels deep: returned as a constant, it would hand out the tensors of
    the trace (a Hugging Face DynamicCache of FakeTensors)."""
    import torch
    if isinstance(value, torch.Tensor):
        return True
    if depth == 0 or isinstance(value, (str, bytes, int, float, bool, type(None), type)):
        return False
    if isinstance(value, dict):
        children = list(value.values())
    elif isinstance(value, (list, tuple, set, frozenset)):
        children = list(value)
    else:
        children = list(getattr(value, "__dict__", {}).values())
    return any(_holds_tensor(child, depth - 1) for child in children[:1000])


@dataclass
class ExportedGraph:
    program: object  # torch.export.ExportedProgram of forward(*weights, *inputs) -> flat tensor tuple
    weights: list  # torch tensors passed ahead of the user's inputs, in argument order
    outputs: OutputLayout
    input_dtypes: list  # torch dtypes of the user's tensor inputs
    # the arguments (weights, then inputs) the model updates in place, in the order the program
    # returns their new values, ahead of its outputs (a KV cache's index_copy_, an add_ on an input)
    updated: list = field(default_factory=list)


@dataclass
class ImportedGraph:
    text: str  # linalg-on-tensors module, generic form
    exported: ExportedGraph

    @property
    def weights(self):
        return self.exported.weights


def _functional(model, constants: dict[int, object], layout: OutputLayout):
    """`model` wrapped so that its parameters and buffers are leading inputs of forward() and its
    non-tensor example inputs (`constants`: position -> value) are baked in; returns (wrapper,
    those tensors). The wrapper returns the tensor leaves of the model's output as a flat tuple."""
    import torch
    state = dict(model.named_parameters())
    state.update(dict(model.named_buffers()))
    names = list(state)

    class Functional(torch.nn.Module):  # `model` is not its submodule: export would lift its state
        def forward(self, *flat):
            weights = dict(zip(names, flat[:len(names)]))
            tensors = iter(flat[len(names):])
            args = [constants[i] if i in constants else next(tensors)
                    for i in range(len(constants) + len(flat) - len(names))]
            return layout.record(torch.func.functional_call(model, weights, tuple(args)))

    return Functional(), [state[n] for n in names]


def fold_batch_norms(model):
    """Conv2d followed by BatchNorm2d in eval mode, folded into the convolution's weights and
    bias (a copy; the model is left as it is, and the compiled model does not see later changes
    to those weights: compile again). Models torch.fx cannot trace are returned as they are: their
    batch norms are then compiled as elementwise code."""
    import torch
    if model.training or not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        return model  # nothing to fold: the compiled model reads the model's own weights
    try:
        from torch.fx.experimental.optimization import fuse
        return fuse(model)
    except Exception:  # noqa: BLE001 - not symbolically traceable: keep the batch norms
        return model


_DIALECTS = ("builtin", "func", "linalg", "tensor", "arith", "math", "cf", "scf", "bufferization", "affine")


def foreign_ops(module) -> list[str]:
    """Ops outside the dialects Tracea lowers (e.g. tm_tensor.sort, torch.* left unconverted)."""
    from torch_mlir import ir as tir
    found: set[str] = set()

    def visit(op):
        if op.operation.name.split(".")[0] not in _DIALECTS:
            found.add(op.operation.name)
        return tir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return sorted(found)


log = logging.getLogger("tracea.torch")
_warned: set[str] = set()


def tensor_bytes(value) -> bytes:
    """A tensor's contents as bytes (for cache keys and digests)."""
    import torch
    return value.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def warn_once(key: str, message: str) -> None:
    """One RuntimeWarning per key (an op kind, say) in this process."""
    if key not in _warned:
        _warned.add(key)
        warn(f"tracea: {message}")


@contextlib.contextmanager
def quiet():
    """torch.export's and torch-mlir's own noise kept out of the user's way: Python warnings,
    torch's error-level log lines about failures Tracea handles, and what MLIR's diagnostic
    handler prints on file descriptor 2; all of it goes to the 'tracea.torch' debug log."""
    noisy = [logging.getLogger(name) for name in ("torch._subclasses.fake_tensor", "torch.export",
                                                  "torch._export", "torch.fx.experimental.symbolic_shapes")]
    levels = [logger.level for logger in noisy]
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for logger in noisy:
            logger.setLevel(logging.CRITICAL)
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            for logger, level in zip(noisy, levels):
                logger.setLevel(level)
            captured.seek(0)
            text = captured.read().decode(errors="replace").strip()
            if text:
                log.debug("torch / torch-mlir printed:\n%s", text)


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


SCALAR_INPUTS = (int, float, bool, type(None), str)


MODULE_KEY = "tracea_module"  # node.meta["custom"][MODULE_KEY]: the path of the module that made it


@contextlib.contextmanager
def module_paths(model):
    """While torch.export traces `model` inside this, the nodes it records carry the submodule
    calls they were made in, outermost first, each as "path@n" (the n-th call of that module:
    a layer applied twice, its weights shared, is two layers)."""
    import torch.fx.traceback as fx_traceback
    active, calls, annotations = [], {}, []

    def enter(path):
        def hook(module, args):
            calls[path] = calls.get(path, 0) + 1
            active.append(f"{path}@{calls[path]}")
            annotation = fx_traceback.annotate({MODULE_KEY: tuple(active)})
            annotation.__enter__()
            annotations.append(annotation)
        return hook

    def leave(module, args, output):
        if annotations:
            annotations.pop().__exit__(None, None, None)
            active.pop()

    handles = []
    for path, module in model.named_modules():
        if path:
            handles.append(module.register_forward_pre_hook(enter(path)))
            handles.append(module.register_forward_hook(leave, always_call=True))
    try:
        with fx_traceback.preserve_node_meta():  # what makes the tracer copy the annotation
            yield
    finally:
        for handle in handles:
            handle.remove()
        while annotations:
            annotations.pop().__exit__(None, None, None)


def export_model(model, example_inputs, *, fold_bn: bool = True, dynamic_dims=None) -> ExportedGraph:
    """torch.export of `model` on `example_inputs` (tensors; Python scalars are baked in).
    dynamic_dims: {input position: dim or dims} whose sizes stay symbolic (see _export_dynamic)."""
    require_torch_mlir()
    import torch

    if not isinstance(model, torch.nn.Module):
        raise CompileError(f"tracea.compile expected a torch.nn.Module, got {type(model).__name__}")
    example_inputs = tuple(example_inputs)
    constants = {}
    for i, x in enumerate(example_inputs):
        if isinstance(x, SCALAR_INPUTS):
            constants[i] = x
        elif not isinstance(x, torch.Tensor):
            raise CompileError(f"example input #{i} is a {type(x).__name__}; Tracea compiles models whose "
                               "inputs are tensors (and Python numbers, which it bakes in)")
    if fold_bn:
        model = fold_batch_norms(model)
    layout = OutputLayout()
    wrapped, weights = _functional(model, constants, layout)
    tensors = tuple(x for x in example_inputs if isinstance(x, torch.Tensor))
    args = tuple(t.detach() for t in weights) + tensors
    dynamic_shapes = None
    if dynamic_dims:
        positions = [i for i, x in enumerate(example_inputs) if isinstance(x, torch.Tensor)]
        per_tensor = []
        for i in positions:
            rank = example_inputs[i].dim()
            named = dynamic_dims.get(i, ())
            if any(not -rank <= d < rank for d in ((named,) if isinstance(named, int) else named)):
                raise CompileError(f"dynamic_dims names dim(s) {named} of input #{i}, which has {rank}")
            per_tensor.append({d: f"in{i}_dim{d}" for d in dims_named(dynamic_dims, i, rank)} or None)
        unknown = set(dynamic_dims) - set(positions)
        if unknown:
            raise CompileError(f"dynamic_dims names input(s) {sorted(unknown)}, which are not tensor inputs")
        dynamic_shapes = (tuple([None] * len(weights) + per_tensor),)
    with quiet(), module_paths(model):  # (where the layers are: see layers.py)
        try:
            program = _export_dynamic(wrapped, args, dynamic_shapes)
        except CompileError:
            raise
        except Exception as e:  # noqa: BLE001 - torch.export names the construct it cannot trace
            hint = ""
            if "training" in str(e).lower() or model.training:
                hint = " (is the model in training mode? call model.eval() first)"
            raise CompileError(f"torch.export could not trace the model: {first_line(e)}{hint}") from None
    program, updated = _functionalized(program)
    _views_as_reshapes(program)
    settle_constant_masks(program.graph_module)
    drop_metadata_asserts(program.graph_module)  # (recompiles the edited graph)
    return ExportedGraph(program, weights, layout, [x.dtype for x in tensors], updated)


def _functionalized(program):
    """(program, the arguments it updates in place). torch.export leaves in-place ops in the
    graph (`cache.index_copy_(...)`), and torch-mlir's import returns each updated argument's new
    value ahead of the outputs; taken for an output, it was a silent wrong answer, and the update
    was lost (a static KV cache never filled: the third generated token on was wrong). A program
    with an op that writes an argument (or a view of one) is functionalized, its signature then
    naming what it updates; others are left as they are (a retrace; in-place ops on values made
    inside, a ReLU's, are layers.py's to place)."""
    import torch
    from torch.export.graph_signature import InputKind, OutputKind

    def written(node):  # the values an op writes, each taken back through the views it is of
        schema = node.target._schema if isinstance(node.target, torch._ops.OpOverload) else None
        for argument, value in zip(schema.arguments if schema else [], node.args):
            if argument.alias_info is not None and argument.alias_info.is_write and isinstance(value, torch.fx.Node):
                while value.op == "call_function" and isinstance(value.target, torch._ops.OpOverload) \
                        and value.target._schema.returns and value.target._schema.returns[0].alias_info is not None:
                    value = value.args[0]
                yield value

    if not any(value.op == "placeholder" for node in program.graph_module.graph.nodes
               if node.op == "call_function" for value in written(node)):
        return program, []
    try:
        program = program.run_decompositions({})
    except Exception as e:  # noqa: BLE001 - as decomposed_program's
        raise CompileError(f"torch could not functionalize the model's in-place updates: {first_line(e)}") from None
    signature = program.graph_signature
    arguments = [spec.arg.name for spec in signature.input_specs if spec.kind == InputKind.USER_INPUT]
    updated = []
    for spec in signature.output_specs:
        if spec.kind == OutputKind.USER_INPUT_MUTATION:
            updated.append(arguments.index(spec.target))
        elif spec.kind != OutputKind.USER_OUTPUT:
            raise CompileError(f"the model changes {spec.target} in place ({spec.kind.name}), which Tracea cannot "
                               "return")
    return program, updated


def dims_named(dynamic_dims, position: int, rank: int) -> set[int]:
    """The dims (0..rank-1) that dynamic_dims makes symbolic for the input at `position`."""
    dims = dynamic_dims.get(position, ())
    return {d % rank for d in ((dims,) if isinstance(dims, int) else dims)}


def _export_dynamic(wrapped, args, dynamic_shapes):
    """torch.export with each named dim a symbol of range 1.. (size 1 included: a batch of one);
    if the model ties some of them together (equal sizes, which named dims must declare), with
    Dim.AUTO instead, which works the ties out but traces sizes of 2 and up only."""
    import torch
    if dynamic_shapes is None:
        return torch.export.export(wrapped, args, strict=False)
    named = [{d: torch.export.Dim(name, min=1) for d, name in dims.items()} if dims else None
             for dims in dynamic_shapes[0]]
    try:
        return torch.export.export(wrapped, args, dynamic_shapes=(tuple(named),), strict=False)
    except Exception:  # noqa: BLE001 - constraint violations among the named dims
        auto = [{d: torch.export.Dim.AUTO for d in dims} if dims else None for dims in dynamic_shapes[0]]
        return torch.export.export(wrapped, args, dynamic_shapes=(tuple(auto),), strict=False)


def _views_as_reshapes(program) -> None:
    """aten.view -> aten.reshape, in place. Decompositions run later (torch-mlir's) can change the
    strides a value was traced with (SDPA's result, say), and a view of it then fails to retrace;
    a reshape computes the same (the graph mutates nothing) and copies only if it must."""
    import torch
    for node in program.graph_module.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten.view.default:
            node.target = torch.ops.aten.reshape.default


def drop_metadata_asserts(graph_module) -> None:
    """Remove checks of traced dtypes, devices and input shapes (they hold by construction, or
    are checked by the caller, and torch-mlir has no lowering for them); checks of numbers read
    from tensors stay (torch-mlir turns them into run-time checks)."""
    import torch
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
    asserts = {torch.ops.aten._assert_tensor_metadata.default, torch.ops.aten._assert_scalar.default}
    graph = graph_module.graph
    for node in list(graph.nodes):
        if node.users:
            continue
        if node.op == "call_function" and node.target in asserts:
            condition = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
            if isinstance(condition, torch.SymBool) and free_unbacked_symbols(condition):
                continue  # a check of values read from tensors (x.item() > 3): it must still fail
            graph.erase_node(node)
        elif node.op == "call_module" and node.target == "_guards_fn":  # export's check of its inputs
            graph.erase_node(node)
    graph_module.recompile()


def decomposition_table() -> dict:
    """torch-mlir's table, except layer norm: torch's reference decomposition computes it through
    var_mean, which torch-mlir computes in f64 (a whole f64 copy of the input and f64 sums: a
    4096x768 LayerNorm at 0.35x eager); torch-mlir's own decomposition of native_layer_norm
    stays in the input's precision, as eager does."""
    import torch
    from torch_mlir.extras.fx_decomp_util import get_decomposition_table
    table = get_decomposition_table()
    table.pop(torch.ops.aten.native_layer_norm.default, None)
    table[torch.ops.aten.cumsum.default] = _cumsum_as_triangular_sum
    sdpa = torch.ops.aten.scaled_dot_product_attention.default
    table[sdpa] = functools.partial(_sdpa_kept_when_dynamic, table[sdpa])
    return table


def _sdpa_kept_when_dynamic(decompose, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                            scale=None, enable_gqa=False):
    """SDPA for the attention kernel. Over a key length known at run time only (a decoding step
    over a KV cache that grows) it is left whole for torch-mlir, whose own lowering of it (no mask,
    dropout, causal mask or grouped heads) raise_linalg finds and makes tracea.attention; torch's
    decomposition, written for static shapes, lowers a symbolic length to broadcasts by
    tensor.extract and row checks no pattern takes. Grouped heads (queries of H heads, keys and
    values of H / g) without a causal mask become g query rows per key head, their mask rows
    stacked alike: every query row attends alone, so K and V are read once per key head, not
    repeated g times (torch's decomposition copies them)."""
    import torch
    sdpa = torch.ops.aten.scaled_dot_product_attention.default
    if enable_gqa and query.dim() >= 3 and dropout_p == 0.0 and not is_causal:
        heads, groups = query.shape[-3], key.shape[-3]
        if heads == groups:
            return sdpa(query, key, value, attn_mask, scale=scale)
        rows = _grouped_rows(query, attn_mask, groups) if isinstance(heads, int) and isinstance(groups, int) else None
        if rows is not None:
            stacked, mask = rows
            return sdpa(stacked, key, value, mask, scale=scale).reshape(*query.shape[:-1], value.shape[-1])
    # only the key length may be symbolic: tracea.attention's one dynamic size
    others = [*query.shape, *key.shape[:-2], key.shape[-1], *value.shape[:-2], value.shape[-1]]
    if not isinstance(key.shape[-2], int) and all(isinstance(d, int) for d in others) and dropout_p == 0.0 \
            and not is_causal and not enable_gqa and query.dim() >= 3:
        if attn_mask is None:
            return NotImplemented
        if query.dtype == torch.float32 and attn_mask.dtype in (torch.bool, torch.float32):
            return _masked_attention_of_symbolic_length(query, key, value, attn_mask, scale)
    return decompose(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)


def _masked_attention_of_symbolic_length(query, key, value, mask, scale):
    """SDPA with a mask over a key length known at run time only (a padded batch's decoding step),
    written as ops whose torch-mlir lowering raise_linalg makes tracea.attention with the mask
    operand: products over the batch dims flattened (torch's decomposition broadcasts K and V to
    symbolic sizes, by tensor.extract, which no pattern takes; torch-mlir's own takes no mask), the
    mask added to the scaled scores, a softmax. Torch's safe softmax (0 for a query whose keys are
    all masked) is a select after the product, by the mask's rows: the kernel's result already,
    so only it stays beside the kernel, over the mask alone."""
    import torch
    *batch, queries, depth = query.shape
    rows, length, value_depth = math.prod(batch), key.shape[-2], value.shape[-1]
    bias = torch.where(mask, 0.0, -math.inf) if mask.dtype == torch.bool else mask
    scores = torch.bmm(query.reshape(rows, queries, depth), key.reshape(rows, length, depth).transpose(1, 2))
    scores = scores * (1 / math.sqrt(depth) if scale is None else scale)
    probabilities = torch.softmax(scores.reshape(*batch, queries, length) + bias, -1)
    out = torch.bmm(probabilities.reshape(rows, queries, length), value.reshape(rows, length, value_depth))
    unseen = (bias == -math.inf).all(-1, keepdim=True)
    return torch.where(unseen, 0.0, out.reshape(*batch, queries, value_depth))


def _grouped_rows(query, mask, groups: int):
    """(query, mask) of grouped-query attention with each key head's g query heads stacked as its
    rows ([..., H, Sq, D] -> [..., H / g, g Sq, D]; head h reads key head h // g, as torch's
    enable_gqa), the mask's rows alike; None where the shapes do not allow it."""
    *batch, heads, queries, depth = query.shape
    if heads % groups or not all(isinstance(d, int) for d in (*batch, queries)):
        return None
    g = heads // groups
    stacked = query.reshape(*batch, groups, g * queries, depth)
    if mask is None:
        return stacked, None
    mask = mask.reshape((1,) * (query.dim() - mask.dim()) + tuple(mask.shape))
    mask_heads, mask_rows = mask.shape[-3], mask.shape[-2]
    if mask_heads == 1 and mask_rows == 1:  # the same for every query row: broadcast as it is
        return stacked, mask
    mask = mask.expand(*mask.shape[:-2], queries, mask.shape[-1])
    if mask_heads == heads:  # per head: the heads' rows stacked as the queries are
        return stacked, mask.reshape(*mask.shape[:-3], groups, g * queries, mask.shape[-1])
    if mask_heads == 1:  # per query: every head of a group takes the same rows
        return stacked, mask.repeat(*[1] * (mask.dim() - 2), g, 1)
    return None


# Scans torch-mlir lowers to tm_tensor.scan (no linalg): a model with one was cut in two around it
# (Hugging Face's causal masks take a cumsum of position ids)
CUMSUM_MAX_WORK = 1 << 22


def _cumsum_as_triangular_sum(x, dim, dtype=None):
    """cumsum along `dim` (n long) as y[..., i] = sum_j x[..., j] * (j <= i): n times the work, so
    only while numel * n stays under CUMSUM_MAX_WORK (else torch-mlir's scan, run in PyTorch)."""
    import torch
    n = x.shape[dim]
    if not isinstance(n, int) or x.numel() * n > CUMSUM_MAX_WORK:
        return NotImplemented
    if dtype is None:  # torch's promotion: integers and booleans sum in int64
        dtype = x.dtype if x.is_floating_point() or x.is_complex() else torch.int64
    index = torch.arange(n, device=x.device)
    lower = (index.unsqueeze(0) <= index.unsqueeze(1)).to(dtype)
    return (x.to(dtype).movedim(dim, -1).unsqueeze(-2) * lower).sum(-1).movedim(-1, dim)


def decomposed_program(program):
    """The ExportedProgram decomposed with torch-mlir's table, as torch-mlir's own import does
    (make_fx with that table was 3x faster on a ViT-base but decomposed differently: torch-mlir
    then folded isfinite's x == x to true, wrong for NaN). A CompileError when torch cannot (a
    prims op returning a view: its functionalization refuses it)."""
    with quiet():
        try:
            program = program.run_decompositions(decomposition_table())
        except Exception as e:  # noqa: BLE001 - torch's decompositions fail in many ways
            raise CompileError(f"torch could not decompose the model: {first_line(e)}") from None
    drop_metadata_asserts(program.graph_module)
    return program


def _in_child(what: str, lower, *args) -> str:
    """lower(*args) -> linalg text, run in a forked child: torch-mlir's lowering segfaults on some
    inputs (arithmetic on uint8, for one), which must not take the caller down."""
    from .. import knobs
    from ..passes.isolation import ChildDied, call_in_fork

    def attempt():
        try:
            return "ok", lower(*args)
        except CompileError as e:
            return "error", str(e)

    if not knobs.isolate_compiler():
        status, value = attempt()
    else:
        try:
            (status, value), _ = call_in_fork(attempt, ())
        except ChildDied as died:
            how = (f"signal {os.WTERMSIG(died.wait_status)}" if os.WIFSIGNALED(died.wait_status)
                   else f"exit status {os.WEXITSTATUS(died.wait_status)}")
            raise CompileError(f"torch-mlir crashed ({how}) importing {what} to linalg") from None
    if status == "error":
        raise CompileError(value)
    return value


def to_linalg(program, what: str = "the model") -> str:
    """linalg-on-tensors text of an ExportedProgram, or a CompileError naming what is not lowered."""
    return _in_child(what, _imported, lambda fx: fx.export_and_import(
        program, output_type="linalg-on-tensors", func_name="main", decomposition_table=decomposition_table()), what)


def graph_to_linalg(graph_module, what: str) -> str:
    """linalg-on-tensors text of an already decomposed ATen graph whose nodes carry their traced
    values (meta["val"]): no export, no decomposition, so cheap enough to ask op by op."""
    return _in_child(what, lower_graph, graph_module, what)


def lower_graph(graph_module, what: str) -> str:
    """graph_to_linalg in this process."""
    return _imported(lambda fx: fx.stateless_fx_import(graph_module, output_type="linalg-on-tensors",
                                                       model_name="main"), what)


def _imported(importer, what: str) -> str:
    """importer(torch_mlir.fx) -> module, as checked linalg text; its failure a CompileError."""
    from torch_mlir import fx
    with quiet():
        try:
            module = importer(fx)
        except Exception as e:  # noqa: BLE001 - torch-mlir names the unsupported construct
            # (its "Unimplemented call_function: target=..., {node meta}" is cut before the meta dump)
            reason = re.sub(r"(Unimplemented call_function: target=.*?), \{'val'.*", r"\1", first_line(e))
            raise CompileError(f"torch-mlir could not import {what} to linalg: {reason}") from None
    return _checked_text(module, what)


# torch-mlir (TorchToLinalg, gelu with approximate="tanh") writes sqrt(2/pi) as 0.7977240352174656;
# it is 0.7978845608028654. The wrong one shifts GELU's output by up to 2e-5 relative (17,000 ulps
# around x = -2.5), which a 4-layer GPT-2-style decoder carried to 1.4e-3 on its logits (eager: 7e-5).
_TORCH_MLIR_GELU_BETA = 0.7977240352174656
# Part of the disk cache's key for imported graphs: raise it when what the import writes changes
# for the same graph and tool versions (2: the GELU constant corrected; 3: layer norm in f32, cumsum
# as a sum; 4: torch.compile's graphs imported by layers).
IMPORT_REVISION = 4


def _fix_gelu_constant(module) -> None:
    """Put sqrt(2/pi) in place of torch-mlir's wrong constant, in a module that computes tanh (the
    constant is hoisted out of the linalg.generic that uses it). `module` is torch-mlir's: its own
    MLIR bindings, not Tracea's."""
    from torch_mlir import ir
    constants, has_tanh = [], False

    def visit(op):
        nonlocal has_tanh
        for region in op.regions:
            for block in region.blocks:
                for inner in block.operations:
                    name = inner.operation.name
                    has_tanh |= name == "math.tanh"
                    if name == "arith.constant" and isinstance(inner.operation.attributes["value"], ir.FloatAttr):
                        constants.append(inner.operation)
                    visit(inner.operation)

    visit(module.operation)
    with module.context, ir.Location.unknown():
        for op in constants if has_tanh else ():
            value = op.attributes["value"]
            if value.value == ir.FloatAttr.get(value.type, _TORCH_MLIR_GELU_BETA).value:
                op.attributes["value"] = ir.FloatAttr.get(value.type, math.sqrt(2 / math.pi))


def _checked_text(module, what: str) -> str:
    _fix_gelu_constant(module)
    unsupported = foreign_ops(module)
    if unsupported:
        raise CompileError(f"{what} uses {', '.join(unsupported)}, which torch-mlir does not lower to linalg "
                           "and Tracea cannot compile")
    text = module.operation.get_asm(print_generic_op_form=True, large_elements_limit=None)
    for source, result in re.findall(r'"tensor.cast"\(%\w+\) : \(tensor<([^>]*)>\) -> tensor<([^>]*)>', text):
        if any(a == "?" and b != "?" for a, b in zip(source.split("x"), result.split("x"))):
            # seen: a reshape merging two dynamic dims became a cast of ? to 1, wrong for other sizes
            raise CompileError(f"torch-mlir gave a dynamic size a fixed value (tensor<{source}> cast to "
                               f"tensor<{result}>) importing {what}: it mishandles reshapes that merge several "
                               "dynamic dimensions; make fewer dimensions dynamic")
    return text


def import_module(model, example_inputs, *, fold_bn: bool = True) -> ImportedGraph:
    """Trace `model` on `example_inputs` (torch tensors) and import it as linalg on tensors."""
    exported = export_model(model, example_inputs, fold_bn=fold_bn)
    return ImportedGraph(to_linalg(exported.program), exported)
