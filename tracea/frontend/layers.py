"""A model's repeated layers imported and compiled once.

A transformer's twelve layers are the same code on weights of the same shapes; imported whole,
each becomes a copy in one linalg function, and every step after (torch-mlir's decomposition and
lowering, Tracea's passes, LLVM) pays twelve times. Here the traced graph is cut where its
layers begin and end, each distinct piece is imported once as a private function, and the model's
function calls them in order: one kernel still, one call per layer inside it (ViT-base: 307 traced
ops in 14 pieces, of which 3 distinct, 54 ops, get imported and compiled; 40 s -> 5.4 s cold).

Where the layers are: while torch.export traces, hooks on the model's submodules tag each node
with the module calls it was made in (`torch_import.module_paths`). A layer is a call of a module whose path
ends in an index (a ModuleList's or Sequential's child: `encoder.layer.3`, `layer1.0`,
`features.2.1`; a shared layer applied twice is two); of the nesting levels layers have, the
outermost that leaves at most half of the nodes to compile wins, unless a finer one leaves
clearly fewer (FINER_GAIN).

Pieces are maximal runs of consecutive nodes of the same layer (or of no layer), so each takes
values only from earlier ones: the split is always a valid order. Two pieces are the same when
their ops, the way those ops connect, the constants they take and the types of what flows in are."""
from __future__ import annotations

import hashlib
import operator
from dataclasses import dataclass

from ..errors import CompileError
from .torch_import import MODULE_KEY, _imported, _in_child, tensor_bytes

MIN_SAVING = 0.5  # split when at most this fraction of the nodes is left to import and compile
MAX_DISTINCT = 64  # more distinct pieces than this cost more in per-piece overhead than they save
# A finer split must leave at most this fraction of the coarser one's nodes: pieces are compiled
# apart, so a cut between a GEMM and its activation (nn.Sequential children are layers too) costs
# the fusion (a GPT-2-style MLP's GELU ran alone through libm's tanhf: 4 layers 13.8 ms, 2 layers 5.5)
FINER_GAIN = 0.8


@dataclass
class Piece:
    nodes: list  # consecutive call_function nodes of the exported graph
    inputs: list  # nodes defined before it that it uses, in order of first use
    outputs: list  # its nodes used after it
    key: str = ""  # equal for pieces that compute the same thing


def _layer_prefixes(node) -> list[str]:
    """The calls of layers `node` was made in, outermost first."""
    calls = (node.meta.get("custom") or {}).get(MODULE_KEY) or ()
    return [call for call in calls if call.rsplit("@", 1)[0].rsplit(".", 1)[-1].isdigit()]


def _runs(nodes, level: int) -> list[list]:
    """The call_function nodes cut into runs of one layer (at nesting `level`) or of none; an
    item taken from a multi-result op stays with that op."""
    runs, current, layer_of = [], None, {}
    for node in nodes:
        if node.target is operator.getitem:
            layer = layer_of.get(node.args[0])
        else:
            prefixes = _layer_prefixes(node)
            layer = prefixes[min(level, len(prefixes) - 1)] if prefixes else None
        layer_of[node] = layer
        if not runs or layer != current:
            runs.append([])
            current = layer
        runs[-1].append(node)
    return runs


def _piece(run, program) -> Piece | None:
    """The piece a run makes, or None when something other than a static tensor crosses its edge."""
    import torch
    from torch import fx
    members = set(run)
    inputs, index = [], {}
    description = []
    for position, node in enumerate(run):
        index[node] = ("n", position)

        def name(arg):
            if not isinstance(arg, fx.Node):
                return arg
            if arg not in index:
                index[arg] = ("in", len(inputs))
                inputs.append(arg)
            return index[arg]
        args = fx.node.map_aggregate(node.args, name)
        kwargs = fx.node.map_aggregate(node.kwargs, name)
        description.append(repr((str(node.target), args, kwargs)))
    outputs = [n for n in run if any(user not in members for user in n.users)]
    crossing = inputs + outputs
    if any(not isinstance(n.meta.get("val"), torch.Tensor) for n in crossing):
        return None
    if any(_has_symbols(n.meta.get("val")) for n in run):
        return None
    description += [f"{tuple(n.meta['val'].shape)}:{n.meta['val'].dtype}" for n in inputs]
    description += [_constant_digest(program, n) or "" for n in inputs]
    description.append(repr([index[n] for n in outputs]))
    key = hashlib.sha256("\n".join(description).encode()).hexdigest()
    return Piece(run, inputs, outputs, key)


def _has_symbols(value) -> bool:
    import torch
    values = value if isinstance(value, (tuple, list)) else (value,)
    return any(isinstance(v, torch.Tensor) and any(not isinstance(s, int) for s in v.shape)
               or isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)) for v in values)


def _constant(program, node):
    """The tensor a placeholder of `program` lifted from the model's code holds (None: an input)."""
    from torch.export.graph_signature import InputKind
    if node.op != "placeholder":
        return None
    for spec in program.graph_signature.input_specs:
        if spec.arg.name == node.name and spec.kind != InputKind.USER_INPUT:
            return program.constants.get(spec.target, program.state_dict.get(spec.target))
    return None


def _constant_digest(program, node) -> str | None:
    value = _constant(program, node)
    if value is None:
        return None
    return hashlib.sha256(tensor_bytes(value)).hexdigest()


def plan(program) -> list[Piece] | None:
    """The pieces to import `program` (an ExportedProgram traced under module_paths) in, or None
    when splitting would not save enough."""
    nodes = [n for n in program.graph_module.graph.nodes if n.op == "call_function"]
    if any(n.op not in ("placeholder", "call_function", "output") for n in program.graph_module.graph.nodes):
        return None  # submodules (control flow): imported whole
    depth = max((len(_layer_prefixes(n)) for n in nodes), default=0)
    best, threshold = None, MIN_SAVING * len(nodes)
    for level in range(depth):  # outermost first
        pieces = [_piece(run, program) for run in _runs(nodes, level)]
        if any(p is None for p in pieces):
            continue
        distinct = {p.key: len(p.nodes) for p in pieces}
        cost = sum(distinct.values())
        if len(distinct) < len(pieces) and len(distinct) <= MAX_DISTINCT and cost <= threshold:
            best, threshold = pieces, FINER_GAIN * cost
    return best


def _piece_program(program, piece: Piece):
    """torch.export of a piece alone: its inputs become arguments, constants stay constants."""
    import torch
    from torch import fx
    graph, env, root, args = fx.Graph(), {}, torch.nn.Module(), []
    for i, node in enumerate(piece.inputs):
        value = _constant(program, node)
        if value is not None:
            root.register_buffer(f"constant{i}", value.detach().clone())
            env[node] = graph.get_attr(f"constant{i}")
        else:
            env[node] = graph.placeholder(f"input{i}")
            traced = node.meta["val"]
            args.append(torch.empty(traced.shape, dtype=traced.dtype))  # (no kernel runs: see lower_all)
    for node in piece.nodes:
        env[node] = graph.node_copy(node, lambda n: env[n])
    graph.output(tuple(env[n] for n in piece.outputs))
    return torch.export.export(fx.GraphModule(root, graph), tuple(args), strict=False)


def _function_name(key: str) -> str:
    return f"tracea_piece_{key[:16]}"


def import_pieces(program, pieces: list[Piece], what: str) -> str:
    """linalg text of `program` whose pieces are imported once each (in one forked child) as
    private functions, called in order from @main (arguments and results as the whole import's)."""

    distinct = {}
    for piece in pieces:
        distinct.setdefault(piece.key, piece)

    def lower_all():
        import torch
        # a forked child: torch's OpenMP pool, started in the parent, would hang the first
        # parallel kernel here (libgomp is not fork-safe)
        torch.set_num_threads(1)
        texts = {}
        for key, piece in distinct.items():
            try:
                exported = _piece_program(program, piece)
            except Exception as e:  # noqa: BLE001 - the piece does not retrace alone
                raise CompileError(f"a piece of {what} did not export alone: {e}") from None
            text = _imported(lambda fx: fx.export_and_import(  # noqa: B023 - called at once
                exported, output_type="linalg-on-tensors", func_name=_function_name(key)), what)
            texts[key] = (text, _result_layout(exported, what))
        return texts
    texts = _in_child(what, lower_all)
    return _stitch(program, pieces, texts)


def _result_layout(exported, what: str) -> list[tuple[str, int]]:
    """What each result of a piece's function is: ("output", k), its k-th output, or ("input", j),
    the new value of its j-th argument, which an op of the piece changed in place (`relu_` on the
    layer's input): torch.export returns those first."""
    from torch.export.graph_signature import InputKind, OutputKind
    arguments = [spec.arg.name for spec in exported.graph_signature.input_specs if spec.kind == InputKind.USER_INPUT]
    layout, outputs = [], 0
    for spec in exported.graph_signature.output_specs:
        if spec.kind == OutputKind.USER_INPUT_MUTATION and spec.target in arguments:
            layout.append(("input", arguments.index(spec.target)))
        elif spec.kind == OutputKind.USER_OUTPUT:
            layout.append(("output", outputs))
            outputs += 1
        else:
            raise CompileError(f"a piece of {what} changes {spec.target} in place ({spec.kind.name})")
    return layout


_ELEMENT = {"torch.float32": "f32", "torch.float16": "f16", "torch.bfloat16": "bf16", "torch.float64": "f64",
            "torch.bool": "i1", "torch.uint8": "i8", "torch.int8": "i8", "torch.int16": "i16",
            "torch.int32": "i32", "torch.int64": "i64"}


def _tensor_type(value) -> str:
    element = _ELEMENT.get(str(value.dtype))
    if element is None:
        raise CompileError(f"no linalg element type for {value.dtype}")
    return f"tensor<{''.join(f'{d}x' for d in value.shape)}{element}>"


def _stitch(program, pieces: list[Piece], texts: dict[str, tuple[str, list]]) -> str:
    import mlir.ir as ir
    from mlir.dialects import func
    from torch.export.graph_signature import InputKind

    from ..dialects.context import make_context

    placeholders = {n.name: n for n in program.graph_module.graph.nodes if n.op == "placeholder"}
    arguments = [placeholders[spec.arg.name] for spec in program.graph_signature.input_specs
                 if spec.kind == InputKind.USER_INPUT]
    results = list(program.graph_module.graph.find_nodes(op="output")[0].args[0])
    with make_context(threads=False), ir.Location.unknown():
        module = ir.Module.create()
        signatures = {}
        for key, (text, _) in texts.items():
            parsed = ir.Module.parse(text)
            for op in list(parsed.body.operations):
                op = op.operation
                if op.name == "func.func":
                    op.attributes["sym_visibility"] = ir.StringAttr.get("private")
                    signatures[key] = ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value)
                module.body.append(op)
        argument_types = [ir.Type.parse(_tensor_type(node.meta["val"])) for node in arguments]
        main = func.FuncOp("main", ir.FunctionType.get(argument_types, []), ip=ir.InsertionPoint(module.body))
        values = dict(zip(arguments, main.add_entry_block().arguments))
        with ir.InsertionPoint(main.entry_block):
            for piece in pieces:
                signature = signatures[piece.key]
                arguments_of_piece = [n for n in piece.inputs if _constant(program, n) is None]
                passed = [values[n] for n in arguments_of_piece]
                if [v.type for v in passed] != list(signature.inputs):
                    raise CompileError("a piece's imported arguments differ from the values flowing into it")
                layout = texts[piece.key][1]
                if len(layout) != len(signature.results) or sum(k == "output" for k, _ in layout) != len(piece.outputs):
                    raise CompileError("a piece's imported results differ from the values flowing out of it")
                call = func.CallOp(list(signature.results), ir.FlatSymbolRefAttr.get(_function_name(piece.key)),
                                   passed)
                call.operation.attributes["no_inline"] = ir.UnitAttr.get()
                for (kind, index), result in zip(layout, call.results):
                    # an argument changed in place: later ops see its new value, as in eager
                    values[arguments_of_piece[index] if kind == "input" else piece.outputs[index]] = result
            if any(r not in values for r in results):
                raise CompileError("the model returns a value no piece computes")
            func.ReturnOp([values[r] for r in results])
        main.attributes["function_type"] = ir.TypeAttr.get(
            ir.FunctionType.get(argument_types, [values[r].type for r in results]))
        return module.operation.get_asm(print_generic_op_form=True, large_elements_limit=None)
