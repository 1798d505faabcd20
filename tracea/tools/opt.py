"""tracea-opt: run Tracea and upstream MLIR passes over a file, like mlir-opt.

Errors come out as `file:line:col: error: message` with exit status 1; an abort inside the MLIR
build is reported as an internal compiler error (exit status 2) with the input saved.
"""
from __future__ import annotations

import argparse
import io
import re
import sys
from dataclasses import dataclass

from .. import __version__
from ..errors import Diagnostic, InternalCompilerError, TraceaError
from ..passes import describe, parse_pipeline, run_pipeline
from ..dialects.context import make_context
from ..passes.pipeline import Pipeline, build_pass_manager

SPLIT_MARKER = re.compile(r"^// -----\s*$", re.M)
EXPECTED = re.compile(r"expected-(error|warning|note|remark)\s*(?:@(above|below|[+-]\d+))?\s*\{\{(.*?)\}\}")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tracea-opt",
        description="Run Tracea and upstream MLIR passes over MLIR input (like mlir-opt).",
        epilog="example: tracea-opt kernel.mlir --pass-pipeline='builtin.module(tracea-lower-to-linalg, "
               "canonicalize)'\nTracea passes and pipelines: tracea-opt --list-passes",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input", nargs="?", default="-", help="input .mlir file ('-' or nothing: stdin)")
    p.add_argument("-o", dest="output", default="-", help="output file (default: stdout)")
    p.add_argument("--pass-pipeline", default="", metavar="PIPELINE",
                   help="textual pipeline, e.g. 'builtin.module(tracea-lower-to-linalg, cse)'")
    p.add_argument("--list-passes", action="store_true", help="describe Tracea's passes, options and pipelines")
    p.add_argument("--split-input-file", action="store_true",
                   help="process each chunk between '// -----' lines on its own")
    p.add_argument("--verify-diagnostics", action="store_true",
                   help="check emitted diagnostics against expected-error/warning/note/remark comments")
    p.add_argument("--mlir-print-ir-after-all", action="store_true", help="print the IR after every pass (stderr)")
    p.add_argument("--mlir-print-op-generic", action="store_true", help="print ops in the generic form")
    p.add_argument("--mlir-print-debuginfo", action="store_true", help="print locations")
    p.add_argument("--version", action="version", version=f"tracea-opt {__version__}")
    return p


@dataclass
class Expected:
    severity: str
    line: int
    text: str
    matched: bool = False


def expected_diagnostics(chunk: str, first_line: int) -> list[Expected]:
    """Parse expected-* comments; line numbers are those of the whole file."""
    found: list[Expected] = []
    pending_below: list[Expected] = []
    last_plain_line = None
    for offset, line in enumerate(chunk.splitlines()):
        lineno = first_line + offset
        matches = list(EXPECTED.finditer(line))
        if not matches:
            for e in pending_below:
                e.line = lineno
            pending_below.clear()
            if line.strip():
                last_plain_line = lineno
            continue
        for m in matches:
            severity, where, text = m.groups()
            e = Expected(severity, lineno, text)
            if where == "above":
                e.line = last_plain_line if last_plain_line is not None else lineno - 1
            elif where == "below":
                pending_below.append(e)
            elif where:
                e.line = lineno + int(where)
            found.append(e)
    return found


def check_diagnostics(diagnostics: list[Diagnostic], expected: list[Expected], filename: str) -> list[str]:
    """Mismatches between emitted and expected diagnostics, as error lines."""
    problems = []
    flat = []
    for d in diagnostics:
        flat.append(d)
        flat.extend(d.notes)
    for d in flat:
        match = next((e for e in expected if not e.matched and e.severity == d.severity
                      and e.line == d.line and e.text in d.message), None)
        if match:
            match.matched = True
        elif d.severity != "note":  # notes are only checked when expected
            where = f"{filename}:{d.line}:{d.col}: " if d.line else f"{filename}: "
            problems.append(f"{where}error: unexpected {d.severity}: {d.message}")
    for e in expected:
        if not e.matched:
            problems.append(f"{filename}:{e.line}: error: expected {e.severity} \"{e.text}\" was not produced")
    return problems


def _chunks(text: str, split: bool) -> list[tuple[str, int]]:
    """(chunk padded with blank lines so locations keep the file's line numbers, first line)."""
    if not split:
        return [(text, 1)]
    chunks, start, line = [], 0, 1
    for m in SPLIT_MARKER.finditer(text):
        chunks.append((text[start:m.start()], line))
        line += text[start:m.end()].count("\n")
        start = m.end()
    chunks.append((text[start:], line))
    return [("\n" * (first - 1) + body, first) for body, first in chunks]


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.list_passes:
        print(describe())
        return 0
    try:
        pipeline = parse_pipeline(args.pass_pipeline) if args.pass_pipeline.strip() else Pipeline(())
        with make_context():  # reject an unknown upstream pass before reading any input
            build_pass_manager(pipeline)
    except TraceaError as e:
        print(f"tracea-opt: error: {e}", file=sys.stderr)
        return 1
    filename = "<stdin>" if args.input == "-" else args.input
    try:
        if args.input == "-":  # decoded strictly: sys.stdin passes other bytes on as lone surrogates
            text = io.TextIOWrapper(io.BytesIO(sys.stdin.buffer.read()), encoding="utf-8").read()
        else:
            with open(args.input, encoding="utf-8") as f:
                text = f.read()
    except OSError as e:
        print(f"tracea-opt: error: cannot read {filename}: {e.strerror}", file=sys.stderr)
        return 1
    except UnicodeDecodeError as e:
        print(f"tracea-opt: error: {filename} is not UTF-8 text (byte {e.start}): is it an MLIR file?", file=sys.stderr)
        return 1

    asm = {"print_generic_op_form": args.mlir_print_op_generic, "enable_debug_info": args.mlir_print_debuginfo}
    outputs, failed, problems = [], False, []
    for chunk, first_line in _chunks(text, args.split_input_file):
        try:
            result = run_pipeline(chunk, pipeline, source_name=filename,
                                  print_ir_after_all=args.mlir_print_ir_after_all, asm=asm)
        except InternalCompilerError as e:
            print(f"tracea-opt: {e}", file=sys.stderr)
            return 2
        if result.log:
            sys.stderr.write(result.log)
        if args.verify_diagnostics:
            problems += check_diagnostics(result.diagnostics, expected_diagnostics(chunk, 1), filename)
        else:
            for d in result.diagnostics:
                print(d, file=sys.stderr)
            failed |= not result.ok
        if result.ok:
            outputs.append(result.text)

    for line in problems:
        print(line, file=sys.stderr)
    out_text = "// -----\n".join(outputs)
    if args.output == "-":
        sys.stdout.write(out_text)
    else:
        try:
            with open(args.output, "w") as f:
                f.write(out_text)
        except OSError as e:
            print(f"tracea-opt: error: cannot write {args.output}: {e.strerror}", file=sys.stderr)
            return 1
    return 1 if problems or failed else 0


if __name__ == "__main__":
    sys.exit(main())
