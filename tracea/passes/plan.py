"""What the CPU passes decided for a program, kept on its module: `tracea.plan` (a dictionary of
counts: kernel variants by id, row groups, generic loop nests) and `tracea.steps` (each kernel
in program order: the function it is in, what it computes, on which variant). The compiler
keeps the rendered plan with the kernel (Kernel.plan, also in the disk cache and exported libraries), so that
`CompiledModel.explain()` can report it."""
from __future__ import annotations

import re

import mlir.ir as ir

PLAN = "tracea.plan"
STEPS = "tracea.steps"
CALLS = "tracea.calls"


def count(module: ir.Operation, what: str, n: int = 1) -> None:
    if n <= 0:
        return
    counts = plan_of(module)
    counts[what] = counts.get(what, 0) + n
    i64 = ir.IntegerType.get_signless(64)
    module.attributes[PLAN] = ir.DictAttr.get({k: ir.IntegerAttr.get(i64, v) for k, v in sorted(counts.items())})


def plan_of(module: ir.Operation) -> dict[str, int]:
    if PLAN not in module.attributes:
        return {}
    return {a.name: ir.IntegerAttr(a.attr).value for a in ir.DictAttr(module.attributes[PLAN])}


def _strings(module: ir.Operation, name: str) -> list[str]:
    return [ir.StringAttr(a).value for a in ir.ArrayAttr(module.attributes[name])] if name in module.attributes else []


def record_step(module: ir.Operation, op: ir.Operation, what: str) -> None:
    """Append `what` (a kernel and its variant) to the steps, under the function holding `op`;
    the first step also records how often each function is called (a model's layers: once
    per layer)."""
    if CALLS not in module.attributes:
        calls: dict[str, int] = {}
        for func_op in module.regions[0].blocks[0].operations:
            for block in func_op.regions[0].blocks if func_op.operation.regions else ():
                for inner in block.operations:
                    if inner.operation.name == "func.call":
                        callee = ir.FlatSymbolRefAttr(inner.operation.attributes["callee"]).value
                        calls[callee] = calls.get(callee, 0) + 1
        module.attributes[CALLS] = ir.ArrayAttr.get([ir.StringAttr.get(f"{k}\t{v}") for k, v in calls.items()])
    function = op.parent
    while function is not None and function.name != "func.func":
        function = function.parent
    name = ir.StringAttr(function.attributes["sym_name"]).value if function is not None else "?"
    steps = _strings(module, STEPS) + [f"{name}\t{what}"]
    module.attributes[STEPS] = ir.ArrayAttr.get([ir.StringAttr.get(s) for s in steps])


def render(module: ir.Operation) -> str:
    """The plan as explain() prints it: the kernels in program order, function by function
    (with how often each is called), then the counts."""
    lines = []
    calls = dict(line.split("\t") for line in _strings(module, CALLS))
    current = None
    for step in _strings(module, STEPS):
        function, what = step.split("\t", 1)
        if function != current:
            current, number = function, 0
            times = f", called {calls[function]}x" if function in calls else ""
            lines.append(f"  @{function}{times}:")
        number += 1
        lines.append(f"    {number:3d}. {what}")
    counts = plan_of(module)
    if counts:
        lines.append("  in all (a function called several times counted once):")
        lines += [f"    {n:4d} x {what}" for what, n in counts.items()]
    return "\n".join(lines)


def read_plan(text: str) -> dict[str, int]:
    """The counts recorded in a stage's text (empty when there are none)."""
    match = re.search(r"tracea\.plan = \{([^}]*)\}", text)
    if not match:
        return {}
    return {k.strip('"'): int(v) for k, v in re.findall(r'("[^"]+"|[\w.]+) = (\d+) : i64', match.group(1))}
