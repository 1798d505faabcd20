"""MLIR contexts with the tracea dialect loaded, and diagnostics captured as values."""
from __future__ import annotations

import contextlib
import math
import re
import threading
from typing import Iterator

import mlir.ir as ir
from mlir.dialects import irdl
# Loaded up front: the bindings import a dialect's Python module the first time one of its ops is
# seen from Python, and linalg's (its OpDSL op definitions) takes ~0.15 s -- which every compile
# would pay again in its forked pass run.
from mlir.dialects import linalg  # noqa: F401

from ..errors import CompileError, Diagnostic
from .ops import irdl_source

_SEVERITY = {"ERROR": "error", "WARNING": "warning", "NOTE": "note", "REMARK": "remark"}


def load_tracea_dialect(ctx: ir.Context) -> None:
    """Register the tracea ops in `ctx` (idempotent)."""
    if ctx.is_registered_operation("tracea.gemm"):
        return
    with ctx:
        irdl.load_dialects(ir.Module.parse(irdl_source()))


def make_context(threads: bool = True) -> ir.Context:
    """A fresh context with every upstream dialect and the tracea dialect loaded."""
    ctx = ir.Context()
    if not threads:
        ctx.enable_multithreading(False)
    load_tracea_dialect(ctx)
    return ctx


# A shaped type's static dims: tensor<4x?x8xf32> -> "4x?x8"
_SHAPED_TYPE = re.compile(r"\b(?:tensor|memref|vector)<((?:\d+|\?)(?:x(?:\d+|\?))*)x")
MAX_ELEMENTS = 2 ** 62  # MLIR's element count is an int64_t (and byte sizes multiply it further)
_INDEX_ARRAY = re.compile(r"\barray<index\s*:")


class ParserAbort(CompileError):
    """Input that MLIR's parser aborts on (an assertion) rather than reporting."""


def check_parser_aborts(text: str, source_name: str) -> None:
    """Raise ParserAbort naming the first construct in `text` that MLIR's parser asserts on (the
    IR fuzzer's mutants): a shaped type with more elements than an int64 counts
    (tensor<9223372036854775807x4xf32>), a dense array of index (array<index: 1>). Asked once
    the compiler process has died (a regular expression over a model's IR costs ~40 ms a MB),
    so that the abort becomes the input's error at its line and column."""
    def abort(start: int, message: str):
        line, col = text.count("\n", 0, start) + 1, start - text.rfind("\n", 0, start)
        return ParserAbort("compilation failed:", [Diagnostic("error", message, source_name, line, col)])

    for match in _SHAPED_TYPE.finditer(text):
        elements = math.prod(int(d) for d in match.group(1).split("x") if d != "?")
        if elements > MAX_ELEMENTS:
            raise abort(match.start(), f"the type {match.group(0)}... has {elements:.3g} elements: too large for "
                                       "64-bit sizes")
    if match := _INDEX_ARRAY.search(text):
        raise abort(match.start(), "array<index: ...>: MLIR has no dense arrays of index (its parser aborts on "
                                   "them); use array<i64: ...>")


def parse_module(text: str, source_name: str):
    """Parse a module as mlir-opt does: top-level ops without a `module` get one. Returns an
    object whose `.operation` is the builtin.module. Raises ir.MLIRError on bad input."""
    try:
        op = ir.Operation.parse(text, source_name=source_name)
    except ir.MLIRError as e:
        if "single top-level operation" not in str(e):
            raise
        # Zero or several top-level ops: Module.parse wraps them (its locations say "-",
        # which to_diagnostic maps back to source_name).
        return ir.Module.parse(text)
    if op.operation.name == "builtin.module":
        return op
    module = ir.Module.create(loc=ir.Location.file(source_name, 1, 1))
    module.body.append(op.operation)
    return module


_shared: dict[str, ir.Context] = {}
pipeline_lock = threading.Lock()  # the shared pipeline context has no locks of its own


def shared_context(purpose: str) -> ir.Context:
    """One long-lived single-threaded context per purpose ("pipeline": compiling, copied into
    each forked compiler process; "host": parsing signatures and JIT input in this process), so
    a compile does not pay for creating a context and loading the dialect each time."""
    if purpose not in _shared:
        # The pipeline context runs passes, also in forked children: no thread pool may exist
        # when a process forks. The host one is used from the caller's threads: keep its locks.
        _shared[purpose] = make_context(threads=purpose != "pipeline")
    return _shared[purpose]


def to_diagnostic(d, source_name: str | None = None) -> Diagnostic:
    """Copy an MLIR diagnostic into a plain value (locations resolved to file:line:col)."""
    file = line = col = None
    loc = d.location
    while loc.is_a_callsite() if hasattr(loc, "is_a_callsite") else False:
        loc = loc.caller
    if loc.is_a_fused() and loc.locations:
        loc = loc.locations[0]
    if loc.is_a_name():
        loc = loc.child_loc
    if loc.is_a_file():
        file, line, col = loc.filename, loc.start_line, loc.start_col
        if source_name and file in ("", "-"):
            file = source_name
    severity = _SEVERITY.get(str(d.severity).rsplit(".", 1)[-1], "error")
    notes = tuple(to_diagnostic(n, source_name) for n in d.notes)
    return Diagnostic(severity, str(d.message), file, line, col, notes)


class DiagnosticLog:
    """Collects every diagnostic emitted in a context while active."""

    def __init__(self, source_name: str | None = None):
        self.source_name = source_name
        self.diagnostics: list[Diagnostic] = []

    def _handler(self, d) -> bool:
        self.diagnostics.append(to_diagnostic(d, self.source_name))
        return True

    @contextlib.contextmanager
    def capture(self, ctx: ir.Context) -> Iterator["DiagnosticLog"]:
        handler = ctx.attach_diagnostic_handler(self._handler)
        try:
            yield self
        finally:
            handler.detach()

    def absorb(self, error: ir.MLIRError) -> None:
        """The bindings route diagnostics raised with an exception into the exception."""
        self.diagnostics.extend(to_diagnostic(d, self.source_name) for d in error.error_diagnostics)

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity == "error"]
