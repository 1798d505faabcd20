"""Faults a compiled kernel reports instead of trapping or reading out of bounds.

Each kind has a counter, a module global of the kernel (its passes add one atomic increment on
the rare path where the fault happens, then continue with a harmless value); the packed entry
point (targets/cpu/native.py) returns a status with bit i set when counter i moved during the call,
and the runtime raises the error PyTorch raises for the same input. Pure Python: the AOT loader
and the runtime use it without MLIR.
"""
from __future__ import annotations

from ..errors import IndexOutOfRangeError

# (counter global, exception, what happened), bit i of the status for entry i
FAULTS = (
    ("__tracea_int_faults", ZeroDivisionError,
     "integer division or remainder by zero (as in PyTorch, whose integer division raises ZeroDivisionError)"),
    ("__tracea_index_faults", IndexOutOfRangeError,
     "index out of range in an indexing op (embedding, gather, index_select, x[idx]...), as PyTorch reports"),
    ("__tracea_check_faults", RuntimeError,
     "a run-time check of the program failed (an assertion torch-mlir put in the program)"),
)


def raise_for(status: int, kernel_name: str, checks=()) -> None:
    """Raise the error of the first fault set in a packed entry's status (nothing for 0); a failed
    run-time check names the kernel's `checks` (their messages: which failed is not recorded)."""
    for bit, (counter, error, what) in enumerate(FAULTS):
        if status & (1 << bit):
            if counter == FAULTS[2][0] and checks:
                shown = "; ".join(checks[:3]) + (f"; and {len(checks) - 3} more" if len(checks) > 3 else "")
                what += f": {shown}" if len(checks) == 1 else f", one of: {shown}"
            raise error(f"{kernel_name}: {what}")
