"""Mutation fuzzing of tracea-opt: damaged MLIR must give a clean error, never a crash.

    .venv/bin/python scripts/fuzz_ir.py                           # 500 mutants of each corpus, 2 jobs
    .venv/bin/python scripts/fuzz_ir.py --corpus lit --count 50   # a quick look
    .venv/bin/python scripts/fuzz_ir.py --corpus all --count 1000 --jobs 2 --seed 7 --out fuzz.json

Inputs: the lit corpus (test/lit/**/*.mlir, split on `// -----`, comments dropped) and the
linalg IR that tracea.compile makes of PyTorch models from test/model_zoo.py (imported once with
torch-mlir, in a subprocess, and kept in WORK/models/). Each mutant is one to four mutations of
one input: bit flips, a character changed, lines deleted / duplicated / swapped, tokens swapped,
an integer set to 0, -1 or a huge value, a shape's dim or rank changed, a size changed in every
type that has it, an element type changed (in one place or everywhere: some mutants stay valid
programs), an op or an iterator
type replaced, an affine map permuted, a float made NaN / huge, the text truncated.

Each mutant is run through `tracea-opt` in a subprocess with a timeout: with no pipeline (parse
and verify), then, if that succeeded, through each CPU pipeline (`tracea-cpu`, the whole CPU path
to the LLVM dialect) and the pipelines of the input's own RUN lines. Each run is classified:

    ok         exit 0
    error      exit 1 or 2 with the error printed, no Python traceback: a clean error
    ice        exit 2, an internal compiler error: the MLIR/LLVM build aborted (an assertion) in
               the compiler process and tracea-opt reported it with a reproducer, as designed;
               not a crash, but an input the verifiers let through (--fail-on-ice counts them)
    crash      killed by a signal, or an exit status other than 0, 1, 2
    hang       still running at the timeout (its process group is killed)
    traceback  a Python traceback on stderr, or a Python exception that killed the compiler
               process (reported as an internal compiler error whose cause is Python's)

Every crash, hang and traceback (with --save-ice each ice too) is saved to WORK/defects/ as the
mutant (.mlir) and a note (.txt: the command, the mutations, stderr), with --minimize also a
line-minimized input that fails the same way (the first of each cause). The exit status is 1 if
there was a crash, hang or traceback.

test/test_probes.py imports this file (mutate, lit_corpus, run_opt, classify) for a short sample.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("ok", "error", "ice", "crash", "hang", "traceback")  # in increasing severity
DEFECTS = ("crash", "hang", "traceback")
CPU_PIPELINES = ("builtin.module(tracea-cpu)",)
DEFAULT_MODELS = ("bert", "vit_hf", "t5_encoder", "resnet50", "mobilenet_v3", "convnext", "swin")  # gpt2 and llama
# import whole only with tm_tensor.scan (a cumsum), which tracea.compile runs in PyTorch


# --- corpora --------------------------------------------------------------------------------------
@dataclass
class Seed:
    """One input: its name (file#chunk), text, and the pipelines it is run through."""
    name: str
    text: str
    pipelines: tuple[str, ...] = CPU_PIPELINES
    corpus: str = "lit"


_RUN_PIPELINE = re.compile(r"--pass-pipeline='([^']*)'")
_SPLIT = re.compile(r"^// -----\s*$", re.M)


def lit_corpus(root: Path = ROOT) -> list[Seed]:
    """test/lit/**/*.mlir, each `// -----` chunk an input, full-line comments dropped (RUN and
    CHECK lines, expected-error annotations: text a mutation would waste itself on); each runs
    through the CPU pipelines and the pipelines its file's RUN lines name (but that of the test
    of internal compiler errors, which aborts on purpose)."""
    seeds = []
    for path in sorted((root / "test" / "lit").rglob("*.mlir")):
        if "Output" in path.parts:
            continue
        text = path.read_text()
        own = tuple(p for p in dict.fromkeys(m.group(1) for m in _RUN_PIPELINE.finditer(text)) if _valid(p))
        if "internal compiler error" in text:  # a test of the ICE report: its pipeline aborts by design
            own = ()
        pipelines = tuple(dict.fromkeys(CPU_PIPELINES + own))
        for i, chunk in enumerate(_SPLIT.split(text)):
            body = "\n".join(line for line in chunk.splitlines() if not line.lstrip().startswith("//")).strip()
            if body:
                seeds.append(Seed(f"{path.relative_to(root)}#{i}", body + "\n", pipelines, "lit"))
    return seeds


@functools.lru_cache(maxsize=None)
def _valid(pipeline: str) -> bool:
    """Whether tracea-opt accepts `pipeline` (the test of bad pipelines names some it refuses)."""
    from tracea.dialects.context import make_context
    from tracea.errors import TraceaError
    from tracea.passes import parse_pipeline
    from tracea.passes.pipeline import build_pass_manager
    try:
        with make_context():
            build_pass_manager(parse_pipeline(pipeline))
    except TraceaError:
        return False
    return True


_IMPORT_MODEL = """
import sys, time
sys.path.insert(0, {test!r})
import tracea
from tracea.frontend import torch_import, torch_model
import model_zoo
model, inputs = model_zoo.build({name!r})
exported = torch_import.export_model(model, inputs)
text = torch_model._import(exported.program, time.perf_counter())  # what tracea.compile compiles
open({out!r}, "w").write(text)
"""


def models_corpus(work: Path, names=DEFAULT_MODELS, log=print) -> list[Seed]:
    """The linalg text tracea.compile makes of each model_zoo model (repeated layers as private
    functions), imported in a subprocess once and kept in WORK/models/NAME.mlir. A model whose
    import fails is left out, with a line saying so."""
    directory = work / "models"
    directory.mkdir(parents=True, exist_ok=True)
    seeds = []
    for name in names:
        path = directory / f"{name}.mlir"
        if not path.exists():
            log(f"importing {name} from test/model_zoo.py with torch-mlir (once; kept in {path})")
            tmp = path.with_suffix(".tmp")
            code = _IMPORT_MODEL.format(test=str(ROOT / "test"), name=name, out=str(tmp))
            env = {**os.environ, "TRACEA_DISK_CACHE": "0", "TRACEA_PROGRESS": "0"}
            try:
                done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                      timeout=600, env=env)
            except subprocess.TimeoutExpired:
                log(f"  {name}: import timed out; left out")
                continue
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["?"])[-1]
                log(f"  {name}: import failed ({last[:200]}); left out")
                continue
            os.replace(tmp, path)
        seeds.append(Seed(f"models/{name}", path.read_text(), CPU_PIPELINES, "models"))
    return seeds


# --- mutations ------------------------------------------------------------------------------------
# Each mutation takes (rng, text) and returns (mutated text, description), or None when the text
# has nothing it applies to. flip_bits works on bytes (it may make the text invalid UTF-8).
INTS = ["0", "-1", "1", "2", "3", "-7", "127", "128", "255", "256", "65536", "2147483647", "2147483648",
        "-2147483648", "4294967296", "1099511627776", "9223372036854775807", "-9223372036854775808",
        "18446744073709551616", "123456789012345678901234567890"]
DIMS = ["0", "1", "2", "3", "7", "-1", "?", "1099511627776", "4294967297", "9223372036854775807",
        "99999999999999999999"]
ELEMENT_TYPES = ["f32", "f16", "bf16", "f64", "f8E4M3FN", "i1", "i8", "i16", "i32", "i64", "i128", "ui8", "si32",
                 "index", "complex<f32>", "none", "vector<4xf32>", "tensor<2xf32>"]
FLOATS = ["0.0", "-0.0", "1.0e+39", "-1.0e+308", "1.0e-45", "0x7FC00000", "0x7F800000", "0xFF800000",
          "3.4028235e+38", "nan", "inf"]
CHARS = "()<>{}[]%@#^:,=x?-+0123456789\"!.; \n"

_INT = re.compile(r"(?<![\w%#@.^])-?\d+(?![\w.])")
_SHAPED = re.compile(r"\b(tensor|memref|vector)<((?:[0-9?]+x)*)([a-z][a-zA-Z0-9]*)")
_ELEMENT = re.compile(r"\b(f16|bf16|f32|f64|i1|i8|i16|i32|i64|index)\b")
_FLOAT = re.compile(r"(?<![\w.])-?\d+\.\d+(?:[eE][-+]?\d+)?")
_OP = re.compile(r"\b([a-z_]+\.[a-z_][a-z_0-9.]*)\b")
_TOKEN_CLASSES = {"ssa": re.compile(r"%[\w#]+"), "symbol": re.compile(r"@\w+"), "int": _INT,
                  "word": re.compile(r"\b[a-z_][a-z_0-9]*\b")}
_MAP = re.compile(r"affine_map<\(([^)]*)\)\s*->\s*\(([^)]*)\)>")


def _pick(rng, matches):
    matches = list(matches)
    return rng.choice(matches) if matches else None


def _replace(text, m, new, group=0):
    return text[:m.start(group)] + new + text[m.end(group):]


def flip_bits(rng, data: bytes):
    if not data:
        return None
    data = bytearray(data)
    where = []
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(data))
        bit = rng.randrange(8) if rng.random() < 0.15 else rng.randrange(7)  # mostly stays ASCII
        data[i] ^= 1 << bit
        where.append(f"{i}^{1 << bit}")
    return bytes(data), "flip_bits " + ",".join(where)


def change_char(rng, text):
    if not text:
        return None
    i = rng.randrange(len(text))
    c = rng.choice(CHARS)
    return text[:i] + c + text[i + 1:], f"change_char @{i} {text[i]!r}->{c!r}"


def _lines(text):
    return text.split("\n")


def delete_lines(rng, text):
    lines = _lines(text)
    i, n = rng.randrange(len(lines)), rng.randint(1, 3)
    return "\n".join(lines[:i] + lines[i + n:]), f"delete_lines {i + 1}..{i + n}"


def duplicate_line(rng, text):
    lines = _lines(text)
    i, j = rng.randrange(len(lines)), rng.randrange(len(lines) + 1)
    return "\n".join(lines[:j] + [lines[i]] + lines[j:]), f"duplicate_line {i + 1} before {j + 1}"


def swap_lines(rng, text):
    lines = _lines(text)
    if len(lines) < 2:
        return None
    i, j = rng.sample(range(len(lines)), 2)
    lines[i], lines[j] = lines[j], lines[i]
    return "\n".join(lines), f"swap_lines {i + 1},{j + 1}"


def swap_tokens(rng, text):
    kind = rng.choice(list(_TOKEN_CLASSES))
    found = list(_TOKEN_CLASSES[kind].finditer(text))
    if len(found) < 2:
        return None
    a, b = sorted(rng.sample(found, 2), key=lambda m: m.start())
    if a.end() > b.start() or a.group() == b.group():
        return None
    out = text[:a.start()] + b.group() + text[a.end():b.start()] + a.group() + text[b.end():]
    return out, f"swap_tokens {kind} {a.group()!r}<->{b.group()!r}"


def change_int(rng, text):
    m = _pick(rng, _INT.finditer(text))
    if m is None:
        return None
    old = int(m.group())
    new = rng.choice(INTS + [str(old + 1), str(old - 1), str(old * 2)])
    return _replace(text, m, new), f"change_int {m.group()}->{new} @{m.start()}"


def change_dim(rng, text):
    """One dim of a shaped type, in that place or in every occurrence of the same type."""
    m = _pick(rng, (m for m in _SHAPED.finditer(text) if m.group(2)))
    if m is None:
        return None
    dims = m.group(2)[:-1].split("x")
    k = rng.randrange(len(dims))
    dims[k] = rng.choice(DIMS + [str(int(dims[k]) + 1) if dims[k].isdigit() else "5"])
    old, new = m.group(), f"{m.group(1)}<{'x'.join(dims)}x{m.group(3)}"
    return _local_or_everywhere(rng, text, m, old, new, "change_dim")


def change_rank(rng, text):
    m = _pick(rng, _SHAPED.finditer(text))
    if m is None:
        return None
    dims = m.group(2)[:-1].split("x") if m.group(2) else []
    if dims and rng.random() < 0.5:
        del dims[rng.randrange(len(dims))]
    else:
        dims.insert(rng.randrange(len(dims) + 1), rng.choice(["1", "2", "3"]))
    old = m.group()
    new = f"{m.group(1)}<{''.join(d + 'x' for d in dims)}{m.group(3)}"
    return _local_or_everywhere(rng, text, m, old, new, "change_rank")


def change_element_type(rng, text):
    """An element type (mostly a shaped type's), in that place or everywhere."""
    shaped = [m for m in _SHAPED.finditer(text) if _ELEMENT.fullmatch(m.group(3))]
    if shaped and rng.random() < 0.7:
        s = rng.choice(shaped)
        m = _ELEMENT.match(text, s.start(3))
    else:
        m = _pick(rng, _ELEMENT.finditer(text))
    if m is None:
        return None
    new = rng.choice([t for t in ELEMENT_TYPES if t != m.group()])
    return _local_or_everywhere(rng, text, m, m.group(), new, "change_element_type", word=True)


def resize(rng, text):
    """One size changed in every shaped type that has it (a gemm's K in both operands, a model's
    hidden size): mutants that often still verify, with sizes a pass may not expect."""
    sizes = sorted({d for m in _SHAPED.finditer(text) for d in m.group(2)[:-1].split("x") if d.isdigit()})
    if not sizes:
        return None
    old = rng.choice(sizes)
    new = rng.choice([d for d in DIMS if d not in ("-1", old)] + [str(int(old) + 1), str(max(int(old) - 1, 0))])

    def edit(m):
        dims = [new if d == old else d for d in m.group(2)[:-1].split("x")] if m.group(2) else []
        return f"{m.group(1)}<{''.join(d + 'x' for d in dims)}{m.group(3)}"
    out, n = _SHAPED.subn(edit, text)
    return out, f"resize {old}->{new} in every shaped type"


def _local_or_everywhere(rng, text, m, old, new, name, word=False):
    if rng.random() < 0.5:
        return _replace(text, m, new), f"{name} {old!r}->{new!r} @{m.start()}"
    pattern = re.compile(rf"\b{re.escape(old)}\b" if word else re.escape(old))
    out, n = pattern.subn(new.replace("\\", "\\\\"), text)
    return out, f"{name} {old!r}->{new!r} everywhere ({n})"


def change_op(rng, text):
    """An op name replaced by another op of the same dialect found in the text."""
    found = [m for m in _OP.finditer(text) if m.group(1).split(".")[0] not in ("func", "builtin")]
    if not found:
        return None
    m = rng.choice(found)
    dialect = m.group(1).split(".")[0]
    same = sorted({f.group(1) for f in found if f.group(1) != m.group(1) and f.group(1).split(".")[0] == dialect})
    if not same:
        return None
    new = rng.choice(same)
    return _replace(text, m, new, 1), f"change_op {m.group(1)}->{new} @{m.start()}"


def change_iterator(rng, text):
    m = _pick(rng, re.finditer(r'"(parallel|reduction)"|#linalg\.iterator_type<(parallel|reduction)>', text))
    if m is None:
        return None
    old = m.group(1) or m.group(2)
    new = "reduction" if old == "parallel" else "parallel"
    group = 1 if m.group(1) else 2
    return _replace(text, m, new, group), f"change_iterator {old}->{new} @{m.start()}"


def permute_map(rng, text):
    """An affine map's results shuffled, one dropped, or one made a constant or a sum."""
    m = _pick(rng, _MAP.finditer(text))
    if m is None:
        return None
    dims = [d.strip() for d in m.group(1).split(",") if d.strip()]
    results = [r.strip() for r in m.group(2).split(",") if r.strip()]
    choice = rng.randrange(4)
    if choice == 0 and len(results) > 1:
        rng.shuffle(results)
    elif choice == 1 and results:
        del results[rng.randrange(len(results))]
    elif choice == 2 and results:
        results[rng.randrange(len(results))] = rng.choice(["0", "1", "-1"])
    elif dims:
        i = rng.randrange(len(results)) if results else None
        expr = f"{rng.choice(dims)} + {rng.choice(dims)}"
        if i is None:
            results = [expr]
        else:
            results[i] = expr
    new = f"affine_map<({', '.join(dims)}) -> ({', '.join(results)})>"
    return _replace(text, m, new), f"permute_map {m.group()} -> {new}"


def change_float(rng, text):
    m = _pick(rng, _FLOAT.finditer(text))
    if m is None:
        return None
    new = rng.choice(FLOATS)
    return _replace(text, m, new), f"change_float {m.group()}->{new} @{m.start()}"


def truncate(rng, text):
    if len(text) < 2:
        return None
    i = rng.randrange(1, len(text))
    return text[:i], f"truncate at {i} of {len(text)}"


# name -> (mutation, weight)
MUTATIONS = {  # the syntactic ones mostly test MLIR's parser; the others make programs that verify
    "flip_bits": (flip_bits, 1), "change_char": (change_char, 1), "delete_lines": (delete_lines, 2),
    "duplicate_line": (duplicate_line, 1), "swap_lines": (swap_lines, 1), "swap_tokens": (swap_tokens, 2),
    "change_int": (change_int, 4), "change_dim": (change_dim, 2), "resize": (resize, 6),
    "change_rank": (change_rank, 2),
    "change_element_type": (change_element_type, 4), "change_op": (change_op, 3),
    "change_iterator": (change_iterator, 2), "permute_map": (permute_map, 2), "change_float": (change_float, 1),
    "truncate": (truncate, 1),
}


def mutate(rng: random.Random, text: str) -> tuple[bytes, list[str]]:
    """One to four mutations of `text`: (the mutant's bytes, what was done)."""
    data, done = text.encode(), []
    count = rng.choices([1, 2, 3, 4], weights=[65, 22, 9, 4])[0]
    names = list(MUTATIONS)
    weights = [MUTATIONS[n][1] for n in names]
    attempts = 0
    while len(done) < count and attempts < 50:
        attempts += 1
        fn = MUTATIONS[rng.choices(names, weights)[0]][0]
        if fn is flip_bits:
            result = fn(rng, data)
        else:
            try:
                current = data.decode()
            except UnicodeDecodeError:  # an earlier flip: text mutations no longer apply
                continue
            result = fn(rng, current)
            if result is not None:
                result = (result[0].encode(), result[1])
        if result is None or result[0] == data:
            continue
        data = result[0]
        done.append(result[1])
    return data, done


def mutant(seed_number: int, corpus: str, index: int, seeds: list[Seed]) -> tuple[Seed, bytes, list[str]]:
    """Mutant `index` of `corpus` for a run with --seed `seed_number`: the same whatever the
    order runs finish in, so one can be made again from the numbers alone."""
    rng = random.Random(f"{seed_number}:{corpus}:{index}")
    files = sorted({s.name.split("#")[0] for s in seeds})  # a file, then one of its chunks: the 30
    file = rng.choice(files)                                # chunks of invalid.mlir are one file
    seed = rng.choice([s for s in seeds if s.name.split("#")[0] == file])
    data, done = mutate(rng, seed.text)
    return seed, data, done


# --- running and classifying ----------------------------------------------------------------------
def opt_command() -> list[str]:
    """tracea-opt beside this Python (the venv's), else the module."""
    script = Path(sys.executable).parent / "tracea-opt"
    return [str(script)] if script.exists() else [sys.executable, "-m", "tracea.tools.opt"]


@dataclass
class Run:
    kind: str
    returncode: int | None
    stderr: str
    seconds: float
    command: list[str] = field(default_factory=list)
    reason: str = ""
    stdout: bytes = b""


def classify(returncode: int | None, stderr: str, timed_out: bool = False) -> tuple[str, str]:
    """(kind, one-line reason) of a finished tracea-opt (or Python) process; see KINDS."""
    lines = stderr.strip().splitlines()
    if timed_out:
        return "hang", "no answer within the timeout"
    if returncode is not None and returncode < 0:
        return "crash", f"killed by {signal.Signals(-returncode).name}"
    if "Traceback (most recent call last)" in stderr:
        return "traceback", next((line for line in reversed(lines) if line.strip() and not line.startswith(" ")),
                                 lines[-1] if lines else "")
    if returncode == 0:
        return "ok", ""
    if returncode not in (1, 2):
        return "crash", f"exit status {returncode}"
    ice = next((i for i, line in enumerate(lines) if "internal compiler error" in line), None)
    if ice is not None:
        head = lines[ice]
        cause = lines[ice + 1].strip() if ice + 1 < len(lines) else ""
        if "exited with status" in head and not cause.startswith("the input was saved"):
            # the compiler process died of a Python exception: its last line is the cause
            return "traceback", f"Python exception in the compiler process: {cause}"
        return "ice", cause if cause and not cause.startswith("the input was saved") else head
    if not lines:
        return "crash", f"exit status {returncode} with nothing on stderr"
    return "error", lines[0][:300]


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_command(command: list[str], timeout: float, env: dict | None = None, input_bytes: bytes | None = None,
                cwd: str | None = None) -> Run:
    """Run `command` in a session of its own (a hang kills its forked compiler process too)."""
    start = time.perf_counter()
    process = subprocess.Popen(command, stdin=subprocess.PIPE if input_bytes is not None else subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd,
                               start_new_session=True)
    try:
        out, err = process.communicate(input_bytes, timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        _kill_group(process)
        out, err = process.communicate()
        timed_out = True
    finally:
        _kill_group(process)  # what it left behind (a compiler process whose parent died)
    stderr = err.decode(errors="replace")
    kind, reason = classify(process.returncode, stderr, timed_out)
    return Run(kind, None if timed_out else process.returncode, stderr, time.perf_counter() - start, command, reason,
               out)


def opt_env(work: Path | None = None) -> dict:
    env = {**os.environ, "TRACEA_DISK_CACHE": "0"}
    if work is not None:
        env["TRACEA_CRASH_DIR"] = str(work / "ice-reproducers")
    return env


def run_opt(path: Path, pipeline: str | None, timeout: float = 60, env: dict | None = None) -> Run:
    """tracea-opt on `path` with `--pass-pipeline=pipeline` (None: parse and verify only)."""
    command = opt_command() + [str(path)] + ([f"--pass-pipeline={pipeline}"] if pipeline else [])
    return run_command(command, timeout, env or opt_env())


def check_mutant(path: Path, seed: Seed, timeout: float, env: dict) -> list[tuple[str | None, Run]]:
    """Runs of one mutant: parse and verify; if that passed, each of the seed's pipelines."""
    runs = [(None, run_opt(path, None, timeout, env))]
    if runs[0][1].kind == "ok":
        runs += [(p, run_opt(path, p, timeout, env)) for p in seed.pipelines]
    return runs


def shell_command(path: Path, pipeline: str | None) -> str:
    return f"tracea-opt {path}" + (f" --pass-pipeline='{pipeline}'" if pipeline else "")


# --- minimizing -----------------------------------------------------------------------------------
def minimize(data: bytes, pipeline: str | None, kind: str, reason: str, timeout: float, env: dict,
             budget: int = 150) -> bytes:
    """Lines of `data` removed (chunks, then one at a time) while tracea-opt still fails with the
    same kind and reason; at most `budget` runs."""
    try:
        lines = data.decode().split("\n")
    except UnicodeDecodeError:
        return data
    runs = 0

    def same(candidate: list[str]) -> bool:
        nonlocal runs
        runs += 1
        with tempfile.NamedTemporaryFile("wb", suffix=".mlir", delete=False) as f:
            f.write("\n".join(candidate).encode())
        try:
            got = run_opt(Path(f.name), pipeline, timeout, env)
        finally:
            os.unlink(f.name)
        return got.kind == kind and (kind == "hang" or _normalized(got.reason) == _normalized(reason))

    chunk = max(1, len(lines) // 2)
    while chunk >= 1 and runs < budget:
        i, removed = 0, False
        while i < len(lines) and runs < budget:
            candidate = lines[:i] + lines[i + chunk:]
            if candidate and same(candidate):
                lines, removed = candidate, True
            else:
                i += chunk
        if not removed:
            chunk //= 2
    return "\n".join(lines).encode()


def _normalized(reason: str) -> str:
    """A reason without the details that change with the input (locations, numbers, names)."""
    return re.sub(r"\d+|%\w+|@\w+|'[^']*'|\"[^\"]*\"", "#", reason.split(" at ")[0])[:120]


# --- the campaign ---------------------------------------------------------------------------------
class Campaign:
    def __init__(self, args, seeds: dict[str, list[Seed]]):
        self.args, self.seeds = args, seeds
        self.work = Path(args.work)
        self.env = opt_env(self.work)
        self.lock = threading.Lock()
        self.counts = {c: dict.fromkeys(("mutants", "runs") + KINDS, 0) for c in seeds}
        self.defects: list[dict] = []
        self.reasons: dict[str, int] = {}
        self.minimized: set[str] = set()
        self.done = 0
        self.start = time.perf_counter()
        self.last_progress = 0.0

    def one(self, corpus: str, index: int) -> None:
        seed, data, mutations = mutant(self.args.seed, corpus, index, self.seeds[corpus])
        with tempfile.TemporaryDirectory(dir=self.work / "tmp") as tmp:
            path = Path(tmp) / f"{corpus}-{index}.mlir"
            path.write_bytes(data)
            runs = check_mutant(path, seed, self.args.timeout, self.env)
        with self.lock:
            counts = self.counts[corpus]
            counts["mutants"] += 1
            for pipeline, run in runs:
                counts["runs"] += 1
                counts[run.kind] += 1
                if run.kind in ("ice",) + DEFECTS:
                    self.reasons[f"{run.kind}: {_normalized(run.reason)}"] = \
                        self.reasons.get(f"{run.kind}: {_normalized(run.reason)}", 0) + 1
            self.done += 1
        for pipeline, run in runs:
            if run.kind in DEFECTS or (run.kind == "ice" and self.args.save_ice):
                self.save(corpus, index, seed, data, mutations, pipeline, run)
        self.progress()

    def save(self, corpus, index, seed, data, mutations, pipeline, run) -> None:
        directory = self.work / "defects"
        directory.mkdir(parents=True, exist_ok=True)
        stem = directory / f"{run.kind}-{corpus}-{index}"
        path = stem.with_suffix(".mlir")
        path.write_bytes(data)
        entry = {"kind": run.kind, "reason": run.reason, "corpus": corpus, "index": index, "input": seed.name,
                 "mutations": mutations, "pipeline": pipeline, "command": shell_command(path, pipeline),
                 "returncode": run.returncode, "seconds": round(run.seconds, 2), "file": str(path),
                 "stderr": run.stderr[-6000:]}
        cause = f"{run.kind}: {_normalized(run.reason)}"
        with self.lock:
            first = cause not in self.minimized
            self.minimized.add(cause)
        if self.args.minimize and run.kind != "hang" and first:
            small = minimize(data, pipeline, run.kind, run.reason, self.args.timeout, self.env)
            small_path = Path(f"{stem}.min.mlir")
            small_path.write_bytes(small)
            entry["minimized"] = str(small_path)
            entry["minimized_command"] = shell_command(small_path, pipeline)
        note = [f"{run.kind}: {run.reason}", f"reproduce: {entry['command']}",
                f"from {seed.name} (corpus {corpus}, mutant {index} of --seed {self.args.seed}) by:"]
        note += [f"  {m}" for m in mutations]
        if "minimized" in entry:
            note.append(f"minimized: {entry['minimized_command']}")
        note += ["stderr:", run.stderr[-6000:]]
        Path(f"{stem}.txt").write_text("\n".join(note) + "\n")
        with self.lock:
            self.defects.append(entry)
            print(f"  {run.kind.upper()}: {entry['command']}  ({run.reason[:160]})", flush=True)

    def progress(self, final: bool = False) -> None:
        now = time.perf_counter() - self.start
        with self.lock:
            if not final and now - self.last_progress < self.args.progress_every:
                return
            self.last_progress = now
            total = {k: sum(c[k] for c in self.counts.values()) for k in KINDS}
            print(f"[{self.done:5d}/{self.args.total}] {now:7.1f} s  "
                  + "  ".join(f"{k} {total[k]}" for k in KINDS), flush=True)

    def summary(self) -> str:
        header = ["corpus", "mutants", "runs"] + list(KINDS)
        rows = [[c] + [str(v[k]) for k in header[1:]] for c, v in self.counts.items()]
        rows.append(["total"] + [str(sum(v[k] for v in self.counts.values())) for k in header[1:]])
        widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
        out = ["  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(r, widths)))
               for r in [header] + rows]
        out.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(out)


def _memory_limit(gigabytes: float) -> None:
    """Children inherit it: a mutant that makes the compiler allocate without bound fails there
    (an error or an abort) instead of taking the machine's memory."""
    if gigabytes > 0:
        import resource
        limit = int(gigabytes * 2 ** 30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description="Mutate MLIR inputs (the lit corpus, PyTorch models' imported IR) and run tracea-opt on each "
                    "mutant, parse-only and through the CPU pipelines, in subprocesses with a timeout; count ok / "
                    "clean errors / internal compiler errors / crashes / hangs / tracebacks; save each defective "
                    "input. Exit status 1 if any run crashed, hung or printed a traceback.",
        epilog=__doc__.split("\n\n", 2)[2], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", choices=["lit", "models", "all"], default="all",
                   help="which inputs to mutate (default: all)")
    p.add_argument("--count", type=int, default=500, metavar="N", help="mutants of each corpus (default: 500)")
    p.add_argument("--seed", type=int, default=0,
                   help="mutant i of a corpus is the same for the same seed (default: 0)")
    p.add_argument("--jobs", type=int, default=2, help="tracea-opt processes at once (default: 2)")
    p.add_argument("--timeout", type=float, default=60,
                   help="seconds before a run counts as a hang (default: 60)")
    p.add_argument("--models", default=",".join(DEFAULT_MODELS),
                   help="model_zoo models for --corpus models (default: %(default)s)")
    p.add_argument("--work", default=str(ROOT / "build" / "fuzz"),
                   help="directory for the imported models, defective inputs and ICE reproducers "
                        "(default: build/fuzz)")
    p.add_argument("--out", default=None, metavar="FILE",
                   help="JSON report: the summary and every defect (default: WORK/report.json)")
    p.add_argument("--minimize", action="store_true",
                   help="also save a line-minimized copy of the first defect of each kind and cause")
    p.add_argument("--save-ice", action="store_true", help="save internal compiler errors' inputs too")
    p.add_argument("--fail-on-ice", action="store_true", help="exit 1 on internal compiler errors too")
    p.add_argument("--memory-limit", type=float, default=8, metavar="GB",
                   help="address-space limit of each tracea-opt process (default: 8; 0: none)")
    p.add_argument("--progress-every", type=float, default=15, metavar="SECONDS",
                   help="seconds between progress lines (default: 15)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    work = Path(args.work)
    (work / "tmp").mkdir(parents=True, exist_ok=True)
    seeds = {}
    if args.corpus in ("lit", "all"):
        seeds["lit"] = lit_corpus()
    if args.corpus in ("models", "all"):
        seeds["models"] = models_corpus(work, [n for n in args.models.split(",") if n])
        if not seeds["models"]:
            print("no model could be imported (is torch-mlir installed?)", file=sys.stderr)
            del seeds["models"]
    if not seeds:
        return 2
    for corpus, items in seeds.items():
        print(f"{corpus}: {len(items)} inputs, {sum(len(s.text) for s in items)} characters")
    args.total = args.count * len(seeds)
    _memory_limit(args.memory_limit)
    campaign = Campaign(args, seeds)
    print(f"{args.total} mutants (--seed {args.seed}), {args.jobs} jobs, timeout {args.timeout:g} s; "
          f"defects go to {work / 'defects'}", flush=True)
    jobs = [(c, i) for i in range(args.count) for c in seeds]
    pool = ThreadPoolExecutor(max_workers=args.jobs)
    try:
        for future in [pool.submit(campaign.one, c, i) for c, i in jobs]:
            future.result()
    except KeyboardInterrupt:
        pool.shutdown(wait=False, cancel_futures=True)
        print("interrupted: the summary covers the mutants that finished", flush=True)
    else:
        pool.shutdown()
    seconds = time.perf_counter() - campaign.start
    campaign.progress(final=True)
    print()
    print(campaign.summary())
    print(f"\nwall time {seconds:.0f} s")
    if campaign.reasons:
        print("\nby cause (kind: reason, runs):")
        for reason, n in sorted(campaign.reasons.items(), key=lambda kv: -kv[1]):
            print(f"  {n:5d}  {reason}")
    report = {"command": " ".join([Path(sys.argv[0]).name] + (argv if argv is not None else sys.argv[1:])),
              "seed": args.seed, "count": args.count, "seconds": round(seconds, 1), "counts": campaign.counts,
              "causes": campaign.reasons, "defects": campaign.defects}
    out = Path(args.out) if args.out else work / "report.json"
    out.write_text(json.dumps(report, indent=1))
    print(f"report: {out}")
    shutil.rmtree(work / "tmp", ignore_errors=True)
    failing = DEFECTS + (("ice",) if args.fail_on_ice else ())
    return 1 if any(c[k] for c in campaign.counts.values() for k in failing) else 0


if __name__ == "__main__":
    sys.exit(main())
