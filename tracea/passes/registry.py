"""Tracea's passes: each a frozen dataclass whose fields are its typed options.

`builtin.module(tracea-lower-to-linalg{strategy=reference}, canonicalize)` maps the option text
onto the dataclass fields; `tracea-opt --list-passes` prints each pass, its options and their help.
Named pipelines (aliases) expand to a list of passes and are listed too.
"""
from __future__ import annotations

import dataclasses
import re
import traceback
from dataclasses import dataclass
from typing import ClassVar, get_type_hints

import mlir.ir as ir

from ..errors import TraceaError


class PassFailed(TraceaError):
    """Raised by a pass after it has emitted its errors at the ops concerned; a message given
    here is emitted too (at the module), for failures no op location explains."""


def option(default, help: str, choices: tuple | None = None):
    """Declare a pass option: a dataclass field with its help text (and allowed values)."""
    return dataclasses.field(default=default, metadata={"help": help, "choices": choices})


@dataclass(frozen=True)
class TraceaPass:
    NAME: ClassVar[str] = ""
    SUMMARY: ClassVar[str] = ""

    def run(self, module: ir.Operation) -> None:
        """Transform `module` in place; emit errors at op locations and raise PassFailed."""
        raise PassFailed(f"pass {self.NAME} does not define run()")

    # -- options --------------------------------------------------------------------
    @classmethod
    def option_fields(cls) -> list[dataclasses.Field]:
        return list(dataclasses.fields(cls))

    @classmethod
    def from_options(cls, text: str) -> "TraceaPass":
        """Parse `key=value key2=value2` (MLIR's pass option syntax) into a pass instance."""
        fields = {f.name.replace("_", "-"): f for f in cls.option_fields()}
        hints = get_type_hints(cls)
        values = {}
        for key, raw in re.findall(r"([\w-]+)\s*=\s*(\"[^\"]*\"|[^\s]+)", text):
            f = fields.get(key)
            if f is None:
                known = ", ".join(fields) or "none"
                raise TraceaError(f"pass '{cls.NAME}' has no option '{key}'; its options: {known}")
            values[f.name] = _convert(raw.strip('"'), hints[f.name], f, cls.NAME)
        leftover = re.sub(r"([\w-]+)\s*=\s*(\"[^\"]*\"|[^\s]+)", "", text).strip()
        if leftover:
            raise TraceaError(f"cannot parse options of pass '{cls.NAME}': '{leftover}' (expected key=value)")
        return cls(**values)

    def pipeline_text(self) -> str:
        opts = " ".join(f"{f.name.replace('_', '-')}={_format(getattr(self, f.name))}"
                        for f in self.option_fields() if getattr(self, f.name) != f.default)
        return f"{self.NAME}{{{opts}}}" if opts else self.NAME

    # -- running inside an MLIR PassManager ------------------------------------------------
    def as_callable(self):
        def run(op, pass_):
            try:
                self.run(op)
            except PassFailed as e:
                if str(e):
                    op.location.emit_error(f"{self.NAME}: {e}")
                pass_.signal_pass_failure()
            except TraceaError as e:
                op.location.emit_error(f"{self.NAME}: {e}")
                pass_.signal_pass_failure()
            except Exception as e:  # a bug in Tracea: report it as such, never crash the caller
                op.location.emit_error(f"internal error in pass {self.NAME}: {type(e).__name__}: {e}\n"
                                       + traceback.format_exc())
                pass_.signal_pass_failure()
        run.__name__ = self.NAME
        return run


def _convert(raw: str, hint, f: dataclasses.Field, pass_name: str):
    choices = f.metadata.get("choices")
    try:
        if hint in (bool, "bool"):
            if raw.lower() not in ("true", "false", "1", "0"):
                raise ValueError
            value = raw.lower() in ("true", "1")
        elif hint in (int, "int"):
            value = int(raw)
        elif hint in (float, "float"):
            value = float(raw)
        else:
            value = raw
    except ValueError:
        raise TraceaError(f"option '{f.name}' of pass '{pass_name}' expects {getattr(hint, '__name__', hint)}, "
                          f"got '{raw}'") from None
    if choices and value not in choices:
        raise TraceaError(f"option '{f.name}' of pass '{pass_name}' must be one of "
                          f"{', '.join(map(str, choices))}; got '{raw}'")
    return value


def _format(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


PASSES: dict[str, type[TraceaPass]] = {}
_registrations = 0  # the compiler process is replaced when a pass is registered after its fork


def generation() -> int:
    return _registrations


@dataclass(frozen=True)
class NamedPipeline:
    name: str
    summary: str
    elements: str  # pipeline text without anchor; may name Tracea passes and other pipelines


PIPELINES: dict[str, NamedPipeline] = {}


def ops_named(root: ir.Operation, name: str) -> list[ir.Operation]:
    """The ops called `name` nested in `root`, in walk order (collected first: rewrites may follow)."""
    found = []

    def visit(op):
        if op.operation.name == name:
            found.append(op.operation)
        return ir.WalkResult.ADVANCE

    root.walk(visit)
    return found


def register(cls: type[TraceaPass]) -> type[TraceaPass]:
    if cls.NAME in PASSES or cls.NAME in PIPELINES:
        raise ValueError(f"pass name {cls.NAME} registered twice")
    global _registrations
    PASSES[cls.NAME] = cls
    _registrations += 1
    return cls


def register_pipeline(name: str, summary: str, elements: str) -> None:
    if name in PASSES or name in PIPELINES:
        raise ValueError(f"pipeline name {name} registered twice")
    PIPELINES[name] = NamedPipeline(name, summary, elements)


def describe() -> str:
    """The --list-passes text."""
    lines = ["Tracea passes:"]
    for name in sorted(PASSES):
        cls = PASSES[name]
        lines.append(f"  {name}: {cls.SUMMARY}")
        hints = get_type_hints(cls)
        for f in cls.option_fields():
            typ = getattr(hints[f.name], "__name__", str(hints[f.name]))
            choices = f.metadata.get("choices")
            allowed = f" (one of: {', '.join(map(str, choices))})" if choices else ""
            lines.append(f"      {f.name.replace('_', '-')}=<{typ}>  {f.metadata.get('help', '')}"
                         f"{allowed} [default: {_format(f.default)}]")
    lines.append("")
    lines.append("Tracea pipelines (names usable inside --pass-pipeline):")
    for name in sorted(PIPELINES):
        p = PIPELINES[name]
        lines.append(f"  {name}: {p.summary}")
        lines.append(f"      = {p.elements}")
    lines.append("")
    lines.append("Every upstream MLIR pass is available too (see mlir-opt --help).")
    return "\n".join(lines)
