"""What the CPU passes decided for a program, kept on its module as `tracea.plan` (a dictionary of
counts: kernel variants by id, row groups, generic loop nests), so that the `linalg` stage says it
and `CompiledModel.explain()` can report it."""
from __future__ import annotations

import re

import mlir.ir as ir

PLAN = "tracea.plan"


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


def read_plan(text: str) -> dict[str, int]:
    """The plan recorded in a stage's text (empty when there is none)."""
    match = re.search(r"tracea\.plan = \{([^}]*)\}", text)
    if not match:
        return {}
    return {k.strip('"'): int(v) for k, v in re.findall(r'("[^"]+"|[\w.]+) = (\d+) : i64', match.group(1))}
