"""Partial fallback: a traced graph that Tracea cannot compile whole is split into regions that
it compiles and ops that run in eager PyTorch.

The exported program is decomposed the way torch-mlir decomposes it, and each op is asked in
isolation whether torch-mlir lowers it to linalg (answers cached per op and operand types);
torch.fx's CapabilityBasedPartitioner groups the supported ops into regions; each region is
compiled on its own. A region whose compile still fails is split again, op by op, so one bad op
costs only itself; where each op compiles alone but not together, the shortest run of them that
fails is found by bisection and only it runs in PyTorch. The result is the decomposed graph with
every region replaced by a `CompiledRegion`, and a `Placement` saying what ran where and why."""
from __future__ import annotations

import operator
from collections import Counter
from dataclasses import dataclass, field

from ..errors import CompileError, InternalCompilerError
from .bridge import TensorBridge
from .torch_import import graph_to_linalg, lower_graph, warn_once

_probe_cache: dict[tuple, str | None] = {}


@dataclass
class Placement:
    """What ran where: op kind -> count, for compiled and eager ops, with the reason per eager kind."""

    compiled: Counter = field(default_factory=Counter)
    eager: Counter = field(default_factory=Counter)
    reasons: dict[str, str] = field(default_factory=dict)
    regions: int = 0

    def explain(self) -> str:
        lines = [f"{sum(self.compiled.values())} op(s) in {self.regions} Tracea kernel(s), "
                 f"{sum(self.eager.values())} op(s) in eager PyTorch"]
        for kind, n in sorted(self.eager.items()):
            lines.append(f"  eager    {kind} x{n}: {self.reasons.get(kind, '')}")
        for kind, n in sorted(self.compiled.items()):
            lines.append(f"  compiled {kind} x{n}")
        return "\n".join(lines)


def op_kind(node) -> str:
    """'aten.sort.default' for an ATen op, the function's name otherwise."""
    import torch
    return str(node.target) if isinstance(node.target, torch._ops.OpOverload) else node.target.__name__


def _untraceable(value) -> str | None:
    import torch
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
    values = value if isinstance(value, (tuple, list)) else (value,)
    for v in values:
        if isinstance(v, torch.Tensor) and v.dtype.is_complex:
            return f"complex tensors ({v.dtype}) are not compiled by Tracea"
        if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)) and free_unbacked_symbols(v):
            return "a data-dependent size or scalar"
    return None


def _ops_module(nodes):
    """A GraphModule computing `nodes` (in program order) from placeholders for what they take
    from outside; it returns each value used outside them, or the last one (traced values kept
    on its nodes)."""
    import torch
    from torch import fx
    graph, mapping, inside = fx.Graph(), {}, set(nodes)

    def lift(arg):
        if isinstance(arg, fx.Node):
            if arg not in mapping:
                mapping[arg] = graph.placeholder(f"in{len(mapping)}")
                mapping[arg].meta = dict(arg.meta)
            return mapping[arg]
        return arg

    outputs, several = [], False
    for node in nodes:
        result = graph.call_function(node.target, fx.node.map_aggregate(node.args, lift),
                                     fx.node.map_aggregate(node.kwargs, lift))
        result.meta = dict(node.meta)
        mapping[node] = result
        if isinstance(node.meta.get("val"), (tuple, list)):  # one result per getitem, as the importer wants
            several = True
            for i, v in enumerate(node.meta["val"]):
                item = graph.call_function(operator.getitem, (result, i))
                item.meta = {"val": v}
                outputs.append(item)
                for user in node.users:  # the op's own getitems read the item
                    if user.target is operator.getitem and user.args[1] == i:
                        mapping[user] = item
        elif node is nodes[-1] or any(user not in inside for user in node.users):
            outputs.append(result)
    graph.output(tuple(outputs) if several or len(outputs) > 1 else outputs[0])
    return fx.GraphModule(torch.nn.Module(), graph)


def _signature_key(node, shapes: bool = True) -> tuple:
    """The op and its operands' types (with their shapes, or only their ranks)."""
    import torch
    from torch import fx

    def describe(arg):
        if isinstance(arg, fx.Node):
            v = arg.meta.get("val")
            if not isinstance(v, torch.Tensor):
                return ("value", repr(v))
            return ("tensor", str(v.dtype), str(tuple(v.shape)) if shapes else v.dim())
        return repr(arg)
    return (str(node.target), tuple(fx.node.map_aggregate(node.args, describe)),
            tuple(sorted((k, str(fx.node.map_aggregate(v, describe))) for k, v in node.kwargs.items())))


def _value_problem(node) -> str | None:
    """Why the values this op takes or makes keep it out of Tracea (complex, data-dependent)."""
    for value in [node.meta.get("val")] + [arg.meta.get("val") for arg in node.all_input_nodes]:
        reason = _untraceable(value)
        if reason is not None:
            return reason
    return None


def lowering_problem(node) -> str | None:
    """Why torch-mlir cannot lower this op to linalg on its own (None: it can); probe_lowering
    asks for many ops at once."""
    reason = _value_problem(node)
    if reason is not None:
        return reason
    key = _signature_key(node)
    if key not in _probe_cache:
        try:
            graph_to_linalg(_ops_module([node]), op_kind(node))
            _probe_cache[key] = None
        except CompileError as e:
            _probe_cache[key] = error_reason(e)
    return _probe_cache[key]


def probe_lowering(nodes) -> None:
    """Fill the probe cache for these ops in one forked child (a fork per op costs ~40 ms); if
    torch-mlir crashes in it, lowering_problem asks again op by op, each in a child of its own."""
    from .. import knobs
    from ..passes.isolation import ChildDied, call_in_fork
    todo = {}
    for node in nodes:
        if node.op == "call_function" and node.target is not operator.getitem and not _value_problem(node):
            todo.setdefault(_signature_key(node), node)
    todo = {key: node for key, node in todo.items() if key not in _probe_cache}
    if not todo or not knobs.isolate_compiler():
        return

    def ask_all():
        answers = {}
        for key, node in todo.items():
            try:
                lower_graph(_ops_module([node]), op_kind(node))
                answers[key] = None
            except CompileError as e:
                answers[key] = error_reason(e)
        return answers

    try:
        answers, _ = call_in_fork(ask_all, ())
    except ChildDied:
        return
    _probe_cache.update(answers)


def _compile_region(submodule, compile_text):
    """A partition of the graph as a Tracea kernel: an nn.Module (what an fx call_module node
    calls) taking and returning torch tensors as the partition did."""
    import torch

    text = graph_to_linalg(submodule, "a region")
    out = submodule.graph.find_nodes(op="output")[0].args[0]
    single = not isinstance(out, (tuple, list))
    bridge = TensorBridge(compile_text(text), [v.meta["val"].dtype for v in ([out] if single else out)])

    class CompiledRegion(torch.nn.Module):
        def forward(self, *tensors):
            outputs = bridge(tensors)
            return outputs[0] if single else tuple(outputs)

    return CompiledRegion()


def partition(graph_module, compile_text, placement: Placement):
    """`graph_module` (a decomposed program's) with its compilable regions replaced by Tracea
    kernels: called like it."""
    import copy

    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
    from torch.fx.passes.operator_support import OperatorSupportBase

    probe_lowering(graph_module.graph.nodes)
    eager: dict[str, str] = {}  # node name -> why it runs in PyTorch
    original = {node.name: node for node in graph_module.graph.nodes}

    class Support(OperatorSupportBase):
        def is_node_supported(self, submodules, node) -> bool:
            if node.op != "call_function" or node.name in eager:
                return False
            if node.target is operator.getitem:
                return node.args[0].name not in eager
            reason = lowering_problem(node)
            if reason is not None:
                eager[node.name] = reason
            return reason is None

    while True:  # each round that fails moves at least one more op to PyTorch
        gm = copy.deepcopy(graph_module)
        partitioner = CapabilityBasedPartitioner(gm, Support(), allows_single_node_partition=True)
        partitions = partitioner.propose_partitions()
        # the ops of each region, as nodes of the unfused graph (fusing erases the copy's nodes)
        members = {f"fused_{i}": [original[n.name] for n in p.nodes if n.op == "call_function"
                                  and n.target is not operator.getitem] for i, p in enumerate(partitions)}
        work = partitioner.fuse_partitions(partitions)
        failed = False
        for node in list(work.graph.nodes):
            if node.op != "call_module" or node.target not in members:
                continue
            try:
                region = _compile_region(getattr(work, node.target), compile_text)
            except (CompileError, InternalCompilerError) as e:
                failed = True
                ops = members[node.target]
                alone = {n.name: _op_alone_problem(n, compile_text) for n in ops} if len(ops) > 1 else {}
                if any(alone.values()):
                    eager.update({name: why for name, why in alone.items() if why})
                else:  # every op compiles alone, not together: the ops that fail together run in PyTorch
                    order = {n: i for i, n in enumerate(graph_module.graph.nodes)}
                    window = _failing_window(sorted(ops, key=order.get), compile_text)
                    why = error_reason(e)
                    if len(window) < len(ops):
                        kinds = ", ".join(dict.fromkeys(op_kind(n) for n in window))
                        why = f"compiles alone but not in one kernel with {kinds}: {why}"
                    eager.update({n.name: why for n in window})
                break
            setattr(work, node.target, region)
        if not failed:
            break
    placement.regions = sum(1 for n in work.graph.nodes if n.op == "call_module" and n.target in members)
    for node in graph_module.graph.nodes:
        if node.op != "call_function" or node.target is operator.getitem:
            continue
        kind = op_kind(node)
        if node.name in eager:
            placement.eager[kind] += 1
            placement.reasons.setdefault(kind, eager[node.name])
            warn_once(kind, f"{kind} runs in PyTorch: {eager[node.name]}")
        else:
            placement.compiled[kind] += 1
    return work


# Compiles a bisection may spend finding the ops that fail together in a region (each compiles
# a part of it): 2 log2 of the region's ops, capped; beyond, the window found so far is kept.
MAX_BISECTION_COMPILES = 16


def _failing_window(ops, compile_text) -> list:
    """The shortest run of `ops` (in program order; together they fail to compile, each alone
    compiles) found to fail by itself: the shortest failing prefix, then its shortest failing
    suffix. Every run returned was seen to fail, so the ops outside it keep compiling in the
    next round instead of following one bad combination to PyTorch."""
    budget = MAX_BISECTION_COMPILES

    def fails(run) -> bool | None:  # None: out of budget
        nonlocal budget
        if budget == 0:
            return None
        budget -= 1
        try:
            _compile_region(_ops_module(run), compile_text)
            return False
        except (CompileError, InternalCompilerError):
            return True

    compiles, failing = 1, len(ops)  # ops[:compiles] compiles (one op alone does), ops[:failing] fails
    while failing - compiles > 1:
        mid = (compiles + failing) // 2
        answer = fails(ops[:mid])
        if answer is None:
            break
        compiles, failing = (compiles, mid) if answer else (mid, failing)
    end, start, compiles = failing, 0, failing - 1  # ops[start:end] fails, ops[compiles:end] compiles
    while compiles - start > 1:
        mid = (start + compiles) // 2
        answer = fails(ops[mid:end])
        if answer is None:
            break
        start, compiles = (mid, compiles) if answer else (start, mid)
    return ops[start:end]


def _op_alone_problem(node, compile_text) -> str | None:
    """Why this one op does not compile by itself (None: it does). Asked per op kind and operand
    ranks, not shapes, to keep a big failing region cheap to split; a failure that depends on
    shapes shows again in the next round, which then leaves the whole region to PyTorch."""
    key = ("compile",) + _signature_key(node, shapes=False)
    if key not in _probe_cache:
        try:
            _compile_region(_ops_module([node]), compile_text)
            _probe_cache[key] = None
        except (CompileError, InternalCompilerError) as e:
            _probe_cache[key] = error_reason(e)
    return _probe_cache[key]


def error_reason(e: Exception) -> str:
    """The line of a compiler error that says what went wrong."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return next((line for line in lines if "error:" in line), lines[0] if lines else type(e).__name__)
