"""The errors Tracea raises: each names the problem and, where one exists, the fix."""
from __future__ import annotations

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
