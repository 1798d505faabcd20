"""The errors Tracea raises: each names the problem and, where one exists, the fix."""
from __future__ import annotations

import os
import sys
import warnings
from dataclasses import dataclass


@dataclass(frozen=True)
class Diagnostic:
    """One compiler message, detached from any MLIR context so it can cross processes."""

    severity: str  # "error" | "warning" | "note" | "remark"
    message: str
    file: str | None = None
    line: int | None = None
    col: int | None = None
    notes: tuple["Diagnostic", ...] = ()

    def __str__(self) -> str:
        where = ""
        if self.file is not None and self.line is not None:
            where = f"{self.file}:{self.line}:{self.col}: "
        text = f"{where}{self.severity}: {self.message}"
        for note in self.notes:
            text += "\n" + str(note)
        return text


class TraceaError(Exception):
    """Base of every error Tracea raises on purpose."""


class OpError(TraceaError):
    """A tracea op (or the arguments to its builder) is invalid."""


class CompileError(TraceaError):
    """Compilation failed with compiler diagnostics (parse, verify or pass errors)."""

    def __init__(self, message: str, diagnostics: list[Diagnostic] | tuple = ()):
        self.diagnostics = list(diagnostics)
        text = message
        if self.diagnostics:
            text += "\n" + "\n".join(str(d) for d in self.diagnostics)
        super().__init__(text)


class InternalCompilerError(TraceaError):
    """The MLIR/LLVM build aborted (an assertion) while compiling; the input was saved."""

    def __init__(self, message: str, reproducer: str | None = None, log: str = ""):
        self.reproducer = reproducer
        self.log = log
        super().__init__(message)


class ArgumentError(TraceaError, ValueError):
    """A compiled kernel was called with arrays of the wrong shape, dtype or count."""


class IndexOutOfRangeError(TraceaError, IndexError, RuntimeError):
    """A compiled kernel was given an index outside the dim it indexes. It is an IndexError and a
    RuntimeError, so that it is caught as eager PyTorch's error is for every op: IndexError from
    embedding and `x[idx]`, RuntimeError from gather and index_select."""


_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn(message: str, category: type[Warning] = RuntimeWarning) -> None:
    """warnings.warn, attributed to the user's line that called into Tracea (or into torch.compile
    / Dynamo, which call Tracea), not to Tracea's or torch's own code."""
    torch = sys.modules.get("torch")
    internal = (_PACKAGE,) + ((os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,) if torch else ())
    level, frame = 2, sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(internal):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level if frame is not None else 2)
