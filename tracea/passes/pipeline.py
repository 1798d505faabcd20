"""Textual pass pipelines that mix Tracea's Python passes with every upstream MLIR pass, and
running them so that an LLVM abort inside a pass cannot take the caller down.

`parse_pipeline("builtin.module(tracea-lower-to-linalg, canonicalize, func.func(cse))")` gives a
`Pipeline`; `run_pipeline(text, pipeline)` parses the IR, verifies it, runs the passes and
returns the resulting IR text with every diagnostic; a `finish` step (a target's code generator)
may turn the final module into bytes in the same process. By default it runs in the compiler
process (isolation.py): an assertion in the MLIR or LLVM build kills only that process, and the
caller gets an InternalCompilerError with the input saved for a bug report.
"""
from __future__ import annotations

import os
import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import mlir.ir as ir
from mlir.passmanager import PassManager

from .. import knobs
from ..dialects.context import (DiagnosticLog, ParserAbort, check_parser_aborts, parse_module, pipeline_lock,
                               shared_context)
from ..dialects.verify import verify_tracea_ops
from ..errors import CompileError, Diagnostic, InternalCompilerError, TraceaError
from .isolation import ChildDied, call_isolated
from .plan import render as render_plan
from .registry import PASSES, PIPELINES, TraceaPass


@dataclass(frozen=True)
class Pipeline:
    """An ordered list of elements: Tracea pass instances or upstream pipeline text."""

    elements: tuple[TraceaPass | str, ...]

    def text(self) -> str:
        parts = [e if isinstance(e, str) else e.pipeline_text() for e in self.elements]
        return f"builtin.module({', '.join(parts)})"

    def __add__(self, other: "Pipeline") -> "Pipeline":
        return Pipeline(self.elements + other.elements)


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside (), {} and quotes."""
    parts, depth, quoted, start = [], 0, False, 0
    for i, ch in enumerate(text):
        if ch == '"':
            quoted = not quoted
        elif quoted:
            continue
        elif ch in "({":
            depth += 1
        elif ch in ")}":
            depth -= 1
            if depth < 0:
                raise TraceaError(f"unbalanced '{ch}' in pass pipeline at: {text[i:]!r}")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth or quoted:
        raise TraceaError(f"unbalanced brackets or quotes in pass pipeline: {text!r}")
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def parse_pipeline(text: str, _seen: tuple[str, ...] = ()) -> Pipeline:
    """Parse `builtin.module(a, b{opt=1}, func.func(c))` (the anchor may be omitted)."""
    text = text.strip()
    if text.startswith("builtin.module(") and text.endswith(")"):
        text = text[len("builtin.module("):-1]
    elements: list[TraceaPass | str] = []
    for part in _split_top_level(text):
        name = part.split("{", 1)[0].split("(", 1)[0].strip()
        if name in PASSES:
            opts = part[len(name):].strip()
            if opts and not (opts.startswith("{") and opts.endswith("}")):
                raise TraceaError(f"cannot parse '{part}': options go in braces, e.g. {name}{{key=value}}")
            elements.append(PASSES[name].from_options(opts[1:-1] if opts else ""))
        elif name in PIPELINES:
            if name in _seen:
                raise TraceaError(f"pipeline '{name}' refers to itself")
            elements.extend(parse_pipeline(PIPELINES[name].elements, _seen + (name,)).elements)
        else:
            if "(" in part and any(p in part for p in list(PASSES) + list(PIPELINES)):
                raise TraceaError(f"Tracea passes run on the whole module; move them out of the "
                                  f"nested pipeline '{part}'")
            elements.append(part)
    return Pipeline(tuple(elements))


def build_pass_manager(pipeline: Pipeline, print_ir_after_all: bool = False, verify_each: bool = True) -> PassManager:
    """Needs an active context. Consecutive upstream elements are parsed by MLIR together.
    verify_each=False skips MLIR's verifier after every pass (nearly half of a kernel's pass time)."""
    pm = PassManager("builtin.module")
    pm.enable_verifier(verify_each)
    pending: list[str] = []

    def flush():
        if pending:
            try:
                pm.add(", ".join(pending))
            except ValueError as e:
                raise TraceaError(f"invalid pass pipeline '{', '.join(pending)}': {e}") from None
            pending.clear()

    for element in pipeline.elements:
        if isinstance(element, str):
            pending.append(element)
        else:
            flush()
            pm.add(element.as_callable(), name=element.NAME, argument=element.NAME)
    flush()
    if print_ir_after_all:
        pm.enable_ir_printing(print_after_all=True)
    return pm


@dataclass
class PipelineResult:
    ok: bool
    text: str | None  # the resulting IR (None on failure, and after a `finish` step unless kept)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    stages: dict[str, str] = field(default_factory=dict)  # stage name -> IR text, when asked
    log: str = ""  # what the compiler printed on stderr (e.g. --mlir-print-ir-after-all)
    artifact: bytes | None = None  # what the `finish` step made of the final module
    plan: str = ""  # what the passes decided (passes/plan.py), kept always: explain() reports it


def _silent_parse_failure(source: str, source_name: str) -> Diagnostic:
    """MLIR's parser rejects an unregistered op written in custom syntax (`%c = tracea.gemm %a,
    %b ...`) without any diagnostic; name the likely line instead of failing silently."""
    for number, line in enumerate(source.splitlines(), 1):
        match = re.search(r"=\s*(tracea\.\w+)\b", line)
        if match:
            return Diagnostic("error", f"'{match.group(1)}' must be written in MLIR's generic form, "
                              f"e.g. %c = \"tracea.gemm\"(%a, %b) : (tensor<...>, tensor<...>) -> tensor<...>",
                              source_name, number, match.start(1) + 1)
    return Diagnostic("error", "the input could not be parsed (MLIR gave no location)", source_name)


def _silent_pass_failure(source: str, stages: list[tuple[str, Pipeline]], failed: str, source_name: str) -> str:
    """A stage failed without a diagnostic: run it again from the input, one pass at a time, to
    name the pass (a compiler bug: every failing pass should say why)."""
    module = parse_module(source, source_name)
    for stage_name, pipeline in stages:
        for element in pipeline.elements if stage_name == failed else (pipeline,):
            try:
                build_pass_manager(element if isinstance(element, Pipeline) else Pipeline((element,))).run(
                    module.operation)
            except (ir.MLIRError, TraceaError):
                if stage_name != failed:
                    break
                name = element if isinstance(element, str) else element.NAME
                return (f"pass '{name}' failed in stage '{stage_name}' without saying why: a bug in Tracea; "
                        "please report it with the input")
        if stage_name == failed:
            break
    return f"pass pipeline failed in stage '{failed}' without saying why: a bug in Tracea; please report it with the input"


def _run_in_process(source: str, stages: list[tuple[str, Pipeline]], source_name: str,
                    print_ir_after_all: bool, keep_stages: bool, asm: dict, verify_each: bool,
                    finish: Callable[[ir.Operation], bytes] | None) -> PipelineResult:
    ctx = shared_context("pipeline")
    log = DiagnosticLog(source_name)
    kept: dict[str, str] = {}
    with ctx, log.capture(ctx):
        try:
            module = parse_module(source, source_name)
        except ir.MLIRError as e:
            log.absorb(e)
            if not log.errors:
                log.diagnostics.append(_silent_parse_failure(source, source_name))
            return PipelineResult(False, None, log.diagnostics)
        if verify_tracea_ops(module.operation):
            return PipelineResult(False, None, log.diagnostics)
        for stage_name, pipeline in stages:
            try:
                pm = build_pass_manager(pipeline, print_ir_after_all, verify_each)
                pm.run(module.operation)
                if not verify_each:  # still verified once per stage
                    module.operation.verify()
            except ir.MLIRError as e:
                log.absorb(e)
                if not log.errors:
                    seen = len(log.diagnostics)  # the rerun's warnings are already there
                    why = _silent_pass_failure(source, stages, stage_name, source_name)
                    del log.diagnostics[seen:]
                    log.diagnostics.append(Diagnostic("error", why))
                return PipelineResult(False, None, log.diagnostics)
            except TraceaError as e:
                log.diagnostics.append(Diagnostic("error", str(e)))
                return PipelineResult(False, None, log.diagnostics)
            if keep_stages:
                kept[stage_name] = module.operation.get_asm(**asm)
        plan = render_plan(module.operation)
        if finish is None:
            return PipelineResult(True, module.operation.get_asm(**asm), log.diagnostics, kept, plan=plan)
        try:
            artifact = finish(module.operation)
        except TraceaError as e:
            log.diagnostics.append(Diagnostic("error", str(e)))
            return PipelineResult(False, None, log.diagnostics)
    return PipelineResult(True, kept[stages[-1][0]] if keep_stages and stages else None, log.diagnostics, kept,
                          artifact=artifact, plan=plan)


def run_pipeline(source: str, stages: list[tuple[str, Pipeline]] | Pipeline, *, source_name: str = "<input>",
                 print_ir_after_all: bool = False, keep_stages: bool = False, asm: dict | None = None,
                 isolate: bool | None = None, verify_each: bool = True,
                 finish: Callable[[ir.Operation], bytes] | None = None) -> PipelineResult:
    """Parse `source`, verify its tracea ops, run the pipeline stages; never raises for bad input
    (the result carries the diagnostics). Raises InternalCompilerError if the compiler aborts.
    `asm` holds Operation.get_asm options for the output (e.g. print_generic_op_form=True).
    verify_each=False verifies the IR after each stage instead of after each pass.
    finish(final module) runs last, in the same process; its bytes become `result.artifact`
    (and the final IR is not printed, unless the stages are kept)."""
    if isinstance(stages, Pipeline):
        stages = [("output", stages)]
    args = (source, stages, source_name, print_ir_after_all, keep_stages, asm or {}, verify_each, finish)
    if not (knobs.isolate_compiler() if isolate is None else isolate):
        with pipeline_lock:
            return _run_in_process(*args)
    return _run_isolated(args)


def _run_isolated(args) -> PipelineResult:
    try:
        result, log = call_isolated(_run_in_process, args)
    except ChildDied as died:
        source, stages, finish = args[0], args[1], args[-1]
        try:  # an input MLIR's parser aborts on is the input's error, not the compiler's
            check_parser_aborts(source, args[2])
        except ParserAbort as e:
            return PipelineResult(False, None, e.diagnostics)
        raise _internal_error(died.wait_status, died.log, source, stages, args[2], finish is not None) from None
    result.log = log
    return result


def _internal_error(wait_status: int, log: str, source: str, stages, source_name: str,
                    with_codegen: bool = False) -> InternalCompilerError:
    if os.WIFSIGNALED(wait_status):
        sig = os.WTERMSIG(wait_status)
        how = f"was killed by signal {sig} ({signal.Signals(sig).name})"
    else:
        how = f"exited with status {os.WEXITSTATUS(wait_status)}"
    pipeline_text = ", ".join(p.text()[len("builtin.module("):-1] for _, p in stages)
    reproducer = save_reproducer(source, f"builtin.module({pipeline_text})", log, source_name)
    lines = log.splitlines()
    reason = next((line for line in lines if "Assertion" in line or "LLVM ERROR" in line), "")
    if not reason and lines:  # a Python error in the compiler: its traceback's last line
        reason = lines[-1]
    what = "the MLIR pass pipeline (or LLVM's code generation after it)" if with_codegen else "the MLIR pass pipeline"
    message = (f"internal compiler error: {what} {how}"
               + (f"\n  {reason.strip()}" if reason else "")
               + f"\n  the input was saved to {reproducer}"
               + f"\n  reproduce with: tracea-opt {reproducer} --pass-pipeline='builtin.module({pipeline_text})'"
               + "\n  please report it with that file attached")
    return InternalCompilerError(message, str(reproducer), log)


def save_reproducer(source: str, pipeline_text: str, log: str, source_name: str) -> Path:
    directory = knobs.crash_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"tracea-crash-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.mlir"
    header = [f"// Tracea internal compiler error reproducer (input: {source_name})",
              f"// pipeline: {pipeline_text}"]
    header += [f"// | {line}" for line in log.splitlines()[:40]]
    path.write_text("\n".join(header) + "\n" + source)
    return path


def compile_or_raise(source: str, stages, **kwargs) -> PipelineResult:
    """run_pipeline, raising CompileError with the diagnostics when the input is rejected."""
    result = run_pipeline(source, stages, **kwargs)
    if not result.ok:
        raise CompileError("compilation failed:", [d for d in result.diagnostics if d.severity == "error"]
                           or result.diagnostics)
    return result
