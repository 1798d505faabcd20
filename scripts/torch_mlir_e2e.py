#!/usr/bin/env python3
"""Run torch-mlir's end-to-end test suite (torch_mlir_e2e_test) against tracea.compile.

Each test of the suite is a torch.nn.Module factory plus an invoker that calls module.forward(...)
with inputs made by a TestUtils. As torch-mlir's own framework does, the test is first run eagerly
through a tracer that records every forward call with its inputs and output; then a fresh module
from the factory is compiled with tracea.compile(module, inputs) for each recorded call, the
compiled callable is run on the same inputs, and its result is compared with the eager one by
torch-mlir's own reporting.ValueReport (tensors: same shape, same dtype, torch.allclose with
rtol=1e-3, atol=1e-7, NaN equal to NaN; ints, bools and strings equal; floats within 1e-4 relative;
tuples, lists and dicts element by element). A test passes when every recorded call matches.

The suite's source is not part of Tracea: pass a torch-mlir checkout, or a bare git mirror of it
(projects/pt1/python and projects/pt1/e2e_testing are then extracted with `git archive` into
$TMPDIR/tracea-torch-mlir-e2e/<commit>), with --torch-mlir PATH or $TORCH_MLIR_SRC. It is imported
from there at run time (the installed torch-mlir wheel supplies torch_mlir.fx and the bindings).

The test modules are imported one by one: one that fails to import (e.g. vision_models when
torchvision cannot load its operators) is named in the summary, and the tests it registered before
failing still run.

Tests run in worker processes (-j of them), each handling one test at a time; a worker that dies
(segfault, abort, ...) or overruns the timeout is charged to the test it was running and replaced.
Statuses:
  pass                 every recorded call matched the eager result
  fail                 wrong values, shape, dtype or result type
  compile-error        tracea.CompileError (categorized by its message)
  ice                  tracea.InternalCompilerError: Tracea's compiler process died (signal, reason)
  crash                the worker process itself died (signal name, and the innermost Python
                       frame of the crashing thread from faulthandler's report in the worker log)
  timeout              the test ran longer than its timeout
  other-exception      any other exception (compiling, running, or in the eager reference run)
Each test also records what torch-mlir expects of its own reference backend (the fx_importer
config, linalg-on-tensors on the reference backend): "pass", "xfail" (FX_IMPORTER_XFAIL_SET) or
"crashing" (FX_IMPORTER_CRASHING_SET) from projects/pt1/e2e_testing/xfail_sets.py, so that the
summary can count the tests that backend passes and Tracea does not.

Progress goes to stderr; the summary (counts by status, the top categories with example tests,
every crash, ICE and timeout) to stdout. --out writes per-test results as JSON (rewritten as the
run goes, "complete": false until it ends). Worker logs (each worker's stderr: the compiler's and
Python's messages, fault tracebacks) stay in a directory the summary names.

Kernels run with TRACEA_NUM_THREADS = cores / jobs (at least 1) unless it is set.

Exit status: 0 when the run completed, whatever the tests' results; 1 when the suite could not be
loaded or a worker could not start; 2 on usage errors (no torch-mlir source, bad source path, bad
--filter, no test selected); 130 when interrupted (the partial results are still written)."""
from __future__ import annotations

import argparse
import ast
import collections
import contextlib
import importlib
import importlib.util
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SUITE_SUBDIRS = ("projects/pt1/python", "projects/pt1/e2e_testing")
PROGRESS_EVERY = 25  # tests between progress lines (also at least one per minute)
STARTUP_TIMEOUT = 300  # seconds a new worker may take to import torch, Tracea and the suite


# ----------------------------------------------------------------------------------------------
# Locating and loading the suite

def suite_root(source: str) -> tuple[Path, str]:
    """(directory holding projects/pt1/..., a description of the source) for a checkout or a git
    directory; raises ValueError when `source` is neither."""
    path = Path(source).expanduser()
    if (path / SUITE_SUBDIRS[0] / "torch_mlir_e2e_test").is_dir():
        return path, str(path)
    git = ["git", f"--git-dir={path}"]
    head = subprocess.run(git + ["rev-parse", "--verify", "HEAD^{commit}"], capture_output=True, text=True)
    if head.returncode != 0:
        raise ValueError(f"{source} is neither a torch-mlir checkout nor a git directory of one")
    commit = head.stdout.strip()
    root = Path(tempfile.gettempdir()) / "tracea-torch-mlir-e2e" / commit
    if not root.is_dir():  # extracted once per commit; renamed into place so a half copy is never used
        root.parent.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(dir=root.parent, prefix=f"{commit}.partial-"))
        archive = subprocess.run(git + ["archive", commit, *SUITE_SUBDIRS], capture_output=True)
        if archive.returncode != 0:
            raise ValueError(f"git archive failed in {source}: {archive.stderr.decode().strip()}")
        subprocess.run(["tar", "-x", "-C", str(partial)], input=archive.stdout, check=True)
        try:
            partial.rename(root)
        except OSError:  # another run extracted it meanwhile
            subprocess.run(["rm", "-rf", str(partial)], check=True)
    return root, f"{source} @ {commit}"


def load_suite(root: Path):
    """Import the test suite from `root`: returns (tests by name, {module: why it failed to import}).

    torch-mlir's framework.py imports `multiprocess` (a pip package) only for its own parallel
    runner, which is not used here; when it is missing, a stand-in with the one function called
    at import time is installed. The wheel's torch_mlir is a namespace package, so appending the
    source tree to sys.path also makes its pure-Python torch_mlir._version importable."""
    sys.path.append(str(root / SUITE_SUBDIRS[0]))
    try:
        import multiprocess  # noqa: F401
    except ImportError:
        import types
        sys.modules["multiprocess"] = types.SimpleNamespace(set_start_method=lambda *args, **kwargs: None)
    # PyPI's torchvision is a CUDA build whose operators cannot load with the CPU torch; the model
    # zoo's workaround makes its pure-Python models (the vision_models and conv tests) importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "test"))
    from model_zoo import import_torchvision
    try:
        import_torchvision()
    except ImportError:
        pass  # no torchvision: its test modules are reported as not importable
    from torch_mlir_e2e_test import registry, test_suite

    # register_all_tests() imports each test module in turn and stops at the first that fails
    # (e.g. a torchvision that cannot load its operators); importing them one by one keeps the
    # others, and the tests a failing module registered before its failure.
    body = ast.parse(Path(test_suite.__file__).read_text())
    function = next(n for n in body.body if isinstance(n, ast.FunctionDef) and n.name == "register_all_tests")
    names = [alias.name for node in ast.walk(function) if isinstance(node, ast.ImportFrom) and node.level == 1
             for alias in node.names]
    broken = {}
    for name in names:
        before = len(registry.GLOBAL_TEST_REGISTRY)
        try:
            importlib.import_module(f"torch_mlir_e2e_test.test_suite.{name}")
        except Exception as e:  # noqa: BLE001 - reported in the summary
            kept = len(registry.GLOBAL_TEST_REGISTRY) - before
            broken[name] = f"{type(e).__name__}: {first_line(str(e))} ({kept} of its tests registered before that)"
    return {t.unique_name: t for t in registry.GLOBAL_TEST_REGISTRY}, broken


def reference_expectations(root: Path) -> dict[str, str]:
    """Test name -> "xfail" / "crashing" for torch-mlir's fx_importer config (its default:
    FX importer, linalg-on-tensors, reference backend); tests not named are expected to pass."""
    spec = importlib.util.spec_from_file_location("xfail_sets", root / SUITE_SUBDIRS[1] / "xfail_sets.py")
    sets = importlib.util.module_from_spec(spec)
    with contextlib.redirect_stdout(sys.stderr):  # it prints the torch version it compares with
        spec.loader.exec_module(sets)
    expected = {name: "xfail" for name in sets.FX_IMPORTER_XFAIL_SET}
    expected.update({name: "crashing" for name in sets.FX_IMPORTER_CRASHING_SET})
    return expected


# ----------------------------------------------------------------------------------------------
# Classifying errors

def first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def pattern(text: str) -> str:
    """`text` with its specifics (numbers, tensor types, SSA names, paths) blurred, so that errors
    of one kind share a category."""
    text = re.sub(r"tensor<[^>]*>", "tensor<...>", text)
    text = re.sub(r"%[\w.#]+", "%v", text)
    text = re.sub(r"(?<![\w>])(/[\w.+-]+){2,}", "<path>", text)
    text = re.sub(r"\b(zuf|u|s)\d+\b", r"\1N", text)  # torch.export's symbol names
    text = re.sub(r"(?<![A-Za-z\d])\d+", "N", text)  # numbers, but not the 16 of BFloat16
    return text[:120]


def gist(text: str) -> str:
    """The part of a message that names the problem, before any hint or detail, blurred."""
    return pattern(re.split(r"; | \(|\. ", text, maxsplit=1)[0])


def describe(error: BaseException) -> str:
    """An exception's first line (for a CompileError, with its first compiler diagnostic, which
    says what failed when the message only says that it did)."""
    message = first_line(str(error))
    if getattr(error, "diagnostics", None):
        message = f"{message} {first_line(error.diagnostics[0].message)}"
    return message


def compile_error_category(message: str) -> str:
    m = re.match(r"(torch-mlir could not import .*? to linalg|torch\.export could not trace .*?): (\w+)(?:: (.*))?$",
                 message)
    if m:
        return f"{m[1]}: {m[2]}" + (f": {gist(m[3])}" if m[3] else "")
    m = re.match(r"(.*? uses .*?), which torch-mlir does not lower", message)
    return m[1] if m else gist(message)


def fail_category(reasons: str) -> str:
    """The kind of mismatch in a reporting.ValueReport error ("@ context ... ERROR: what")."""
    what = next((line[len("ERROR: "):] for line in reasons.splitlines() if line.startswith("ERROR: ")), reasons)
    if what.startswith("shape ("):
        return "wrong shape"
    m = re.match(r"dtype \((.*?)\) is not equal to golden dtype \((.*?)\)", what)
    if m:
        return f"wrong dtype: {m[1]} instead of {m[2]}"
    if "is not close to" in what or "is not equal to golden value" in what:
        return "wrong values"
    return pattern(what)


# ----------------------------------------------------------------------------------------------
# The worker: runs tests named on stdin, one JSON line per test on its protocol stream

def worker_main(root: Path) -> None:
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever tests, torch or the compiler print goes to the worker log
    import faulthandler
    faulthandler.enable()  # a fatal signal leaves the Python stack in the log
    import tracea  # before anything imports torch_mlir (tracea refuses the other order)
    import torch
    torch.set_num_threads(int(os.environ["TRACEA_NUM_THREADS"]))
    tests, _ = load_suite(root)
    from torch_mlir_e2e_test.framework import clone_torch_script_value, generate_golden_trace
    from torch_mlir_e2e_test.reporting import ErrorContext, ValueReport

    def other(stage: str, e: Exception) -> tuple[str, str, str, dict]:
        return "other-exception", f"{stage}: {type(e).__name__}: {gist(describe(e))}", \
            f"{type(e).__name__}: {describe(e)}", {}

    def run(test) -> tuple[str, str, str, dict]:
        """(status, category, error, extra fields) for one test."""
        try:
            golden = generate_golden_trace(test)  # the eager run: factory, TestUtils, recorded calls
        except Exception as e:  # noqa: BLE001
            return other("eager run", e)
        module = test.program_factory()  # a fresh module for the compiler, as torch-mlir's framework does
        extra = {}
        for i, item in enumerate(golden):
            if item.symbol != "forward":
                return "other-exception", "calls a method other than forward", f"the test calls {item.symbol}", {}
            try:
                compiled = tracea.compile(module, tuple(clone_torch_script_value(item.inputs)))
            except tracea.CompileError as e:
                return "compile-error", compile_error_category(describe(e)), describe(e), {}
            except tracea.InternalCompilerError as e:
                # "... was killed by signal 6 (SIGABRT)" or "... exited with status 1", then the
                # reason when the compiler printed one (an assertion, LLVM ERROR, Python error)
                lines = [line.strip() for line in str(e).splitlines()]
                reason = f": {lines[1]}" if len(lines) > 1 and not lines[1].startswith("the input was saved") else ""
                how = re.search(r"killed by signal \d+ \((\w+)\)|exited with status \d+", lines[0])
                category = (how[1] or how[0] if how else gist(lines[0])) + pattern(reason)
                return "ice", category, lines[0] + reason, {"reproducer": e.reproducer}
            except Exception as e:  # noqa: BLE001
                return other("compiling", e)
            # Tracea runs what it cannot compile in eager PyTorch and says so in `placement`:
            # count those ops (and the compiled ones), so that passes are told apart from
            # whole-model compiles, and keep why (an internal compiler error among them, which
            # the fallback does not raise). Tracea versions without the fallback have no placement.
            placement = getattr(compiled, "placement", None)
            if placement is not None and placement.eager:
                extra["eager_ops"] = max(extra.get("eager_ops", 0), sum(placement.eager.values()))
                extra["compiled_ops"] = min(extra.get("compiled_ops", 1 << 30), sum(placement.compiled.values()))
                extra.setdefault("eager_reasons", {}).update(
                    {kind: first_line(why)[:300] for kind, why in placement.reasons.items()})
            try:
                output = compiled(*clone_torch_script_value(item.inputs))
            except Exception as e:  # noqa: BLE001
                return other("running", e)
            try:
                report = ValueReport(output, item.output, ErrorContext.empty().chain(f"call #{i} of forward"))
            except Exception as e:  # noqa: BLE001 - ValueReport itself can raise (e.g. a golden float of 0)
                return other("comparing", e)
            if report.failed:
                reasons = report.error_str()
                return "fail", fail_category(reasons), " ".join(reasons.split("\n"))[:500], extra
        return "pass", "", "", extra

    protocol.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        name = line.strip()
        print(f"=== {name}", file=sys.stderr, flush=True)
        status, category, error, extra = run(tests[name])
        protocol.write(json.dumps({"name": name, "status": status, "category": category, "error": error, **extra}) + "\n")


# ----------------------------------------------------------------------------------------------
# The driver: a pool of workers, each replaced when it dies or times out

class Worker:
    def __init__(self, number: int, root: Path, log_dir: Path, env: dict):
        self.log_path = log_dir / f"worker-{number}.log"
        self.log = open(self.log_path, "ab")
        # Its own session, so that killing its process group also ends Tracea's compiler process,
        # which is forked from the worker and would otherwise outlive it.
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker", str(root)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                     env=env, start_new_session=True)
        os.set_blocking(self.proc.stdout.fileno(), False)
        self.started = time.monotonic()
        self.ready = False
        self.buffer = b""
        self.test = None  # (name, timeout) of the test it is running
        self.since = 0.0  # when that test was sent
        self.log_offset = 0  # the log's size then

    def send(self, name: str, timeout: float) -> None:
        self.test, self.since = (name, timeout), time.monotonic()
        self.log_offset = self.log_path.stat().st_size
        self.proc.stdin.write(f"{name}\n".encode())
        self.proc.stdin.flush()

    def messages(self) -> list[dict]:
        """The protocol lines the worker has written since the last call."""
        try:
            while data := os.read(self.proc.stdout.fileno(), 1 << 16):
                self.buffer += data
        except BlockingIOError:
            pass
        *lines, self.buffer = self.buffer.split(b"\n")
        return [json.loads(line) for line in lines]

    def log_lines(self) -> list[str]:
        """What the worker wrote to its log since its current test began."""
        with open(self.log_path, "rb") as f:
            f.seek(self.log_offset)
            text = f.read().decode(errors="replace")
        return [line for line in text.splitlines() if line.strip() and not line.startswith("=== ")]

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.log.close()


def crash_site(lines: list[str]) -> str:
    """Where faulthandler's report in a worker log says the crashing thread was: its innermost
    Python frame, e.g. "tracea/runtime/kernel.py:195 in __call__"."""
    for i in range(len(lines) - 1, 0, -1):
        if lines[i - 1].startswith("Current thread"):
            m = re.match(r'\s*File "(?:.*/)?([^/]+/[^/]+)", line (\d+) in (.*)', lines[i])
            return f"{m[1]}:{m[2]} in {m[3]}" if m else lines[i].strip()
    return ""


def death_reason(returncode: int) -> str:
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit status {returncode}"


def select_tests(names: list[str], args) -> list[str]:
    names = sorted(n for n in names if re.search(args.filter, n))
    if args.sample and args.sample < len(names):  # evenly spaced over the sorted names
        names = [names[i * len(names) // args.sample] for i in range(args.sample)]
    return names[:args.limit] if args.limit else names


def run_pool(root, tests, names, args, log_dir, on_result) -> None:
    """Run `names` on args.jobs workers, calling on_result(dict) as each test ends."""
    env = dict(os.environ)
    env.setdefault("TRACEA_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // args.jobs)))
    pending = collections.deque(names)
    selector = selectors.DefaultSelector()
    workers: list[Worker] = []
    spawned = 0

    def spawn():
        nonlocal spawned
        spawned += 1
        worker = Worker(spawned, root, log_dir, env)
        selector.register(worker.proc.stdout, selectors.EVENT_READ, worker)
        workers.append(worker)

    def retire(worker, status=None, error=None):
        """Stop `worker`; charge `status` to the test it was running; replace it while tests remain."""
        selector.unregister(worker.proc.stdout)
        worker.kill()
        workers.remove(worker)
        lines = worker.log_lines()
        if not worker.ready:
            raise RuntimeError(f"a worker exited while starting ({death_reason(worker.proc.returncode)}); "
                               f"the end of its log, {worker.log_path}:\n  " + "\n  ".join(lines[-25:]))
        if worker.test:
            if status == "crash":
                category = error + (f" in {crash_site(lines)}" if crash_site(lines) else "")
                error = f"the worker was killed by {category}" if error.startswith("SIG") else \
                    f"the worker exited with {category}"
            else:
                category, error = "no result within the timeout", f"no result after {worker.test[1]:g} s"
            on_result({"name": worker.test[0], "status": status, "category": category, "error": error,
                       "seconds": round(time.monotonic() - worker.since, 2), "log_tail": lines[-15:]})
        elif status:
            print(f"warning: a worker died between tests ({error}); log: {worker.log_path}", file=sys.stderr)
        if pending:
            spawn()

    def take(worker):
        for message in worker.messages():
            if message.get("ready"):
                worker.ready = True
            else:
                message["seconds"] = round(time.monotonic() - worker.since, 2)
                worker.test = None
                on_result(message)

    for _ in range(min(args.jobs, len(names))):
        spawn()
    try:
        while workers:
            for worker in list(workers):
                if worker.ready and worker.test is None:
                    if pending:
                        name = pending.popleft()
                        worker.send(name, min(args.timeout, tests[name].timeout_seconds))
                    else:
                        retire(worker)
            for key, _ in selector.select(timeout=1.0):
                take(key.data)
            now = time.monotonic()
            for worker in list(workers):
                if worker.proc.poll() is not None:  # died: results it wrote first still count
                    take(worker)
                    retire(worker, "crash", death_reason(worker.proc.returncode))
                elif worker.test is not None and now - worker.since > worker.test[1]:
                    retire(worker, "timeout")
                elif not worker.ready and now - worker.started > STARTUP_TIMEOUT:
                    raise RuntimeError(f"a worker did not start within {STARTUP_TIMEOUT} s (log: {worker.log_path})")
    finally:
        for worker in workers:
            worker.kill()


# ----------------------------------------------------------------------------------------------
# Reporting

STATUSES = ("pass", "fail", "compile-error", "ice", "crash", "timeout", "other-exception")


def summarize(results: list[dict], total: int, elapsed: float, broken: dict, meta: dict) -> str:
    out = []
    done = len(results)
    counts = collections.Counter(r["status"] for r in results)
    passed = counts["pass"]
    out.append(f"Tracea ({meta['tracea']}) on torch-mlir's e2e suite ({meta['torch_mlir']})")
    out.append(f"{done} of {total} tests run in {elapsed / 60:.1f} min; passed {passed} "
               f"({100 * passed / max(done, 1):.1f}%)")
    out.append("\nby status:")
    for status in STATUSES:
        if counts[status]:
            out.append(f"  {status:16} {counts[status]:5}  {100 * counts[status] / done:5.1f}%")

    by_category = collections.defaultdict(list)
    for r in results:
        if r["status"] != "pass":
            by_category[(r["status"], r["category"])].append(r["name"])
    top = sorted(by_category.items(), key=lambda kv: -len(kv[1]))[:40]
    out.append(f"\ntop {len(top)} of {len(by_category)} categories (count, status: category, examples):")
    for (status, category), tests in top:
        out.append(f"  {len(tests):5}  {status}: {category}\n         e.g. {', '.join(tests[:3])}")

    eager = [r for r in results if r["status"] == "pass" and r.get("eager_ops")]
    if eager:
        none = [r["name"] for r in eager if not r["compiled_ops"]]
        out.append(f"\n{len(eager)} of the passes ran some ops in eager PyTorch (Tracea's fallback), e.g. "
                   + ", ".join(r["name"] for r in eager[:3]) + f"; {len(none)} of them compiled no op at all"
                   + (f", e.g. {', '.join(none[:3])}" if none else ""))

    fallbacks = collections.defaultdict(list)
    for r in results:
        for kind, why in r.get("eager_reasons", {}).items():
            reason = compile_error_category(why)
            reason = reason[len(kind) + 1:] if reason.startswith(f"{kind} ") else reason  # "aten.sort uses ..."
            fallbacks[f"{kind}: {reason}"].append(r["name"])
    if fallbacks:
        top = sorted(fallbacks.items(), key=lambda kv: -len(kv[1]))[:15]
        out.append(f"\ntop {len(top)} of {len(fallbacks)} reasons an op ran in PyTorch (tests, op: reason, examples):")
        for reason, tests in top:
            out.append(f"  {len(tests):5}  {reason}\n         e.g. {', '.join(tests[:3])}")
    hidden = sorted((r["name"], kind, why) for r in results for kind, why in r.get("eager_reasons", {}).items()
                    if "internal compiler error" in why)
    if hidden:
        out.append(f"\ninternal compiler errors the fallback absorbed (the op then ran in PyTorch; {len(hidden)}):")
        out.extend(f"  {name}: {kind}: {why}" for name, kind, why in hidden)

    severe = [r for r in results if r["status"] in ("crash", "ice", "timeout")]
    out.append(f"\ncrashes, internal compiler errors and timeouts ({len(severe)}):")
    for r in sorted(severe, key=lambda r: (r["status"], r["name"])):
        out.append(f"  {r['status']:8} {r['name']}: {r['error']}")

    expected_pass = [r for r in results if r["reference"] == "pass"]
    lost = collections.Counter(r["status"] for r in expected_pass if r["status"] != "pass")
    helped = sum(r["status"] == "pass" and bool(r.get("eager_ops")) for r in expected_pass)
    gained = sum(r["status"] == "pass" for r in results if r["reference"] != "pass")
    out.append(f"\ntorch-mlir's reference backend (fx_importer config) is expected to pass {len(expected_pass)} "
               f"of these tests; Tracea fails {sum(lost.values())} of them ("
               + ", ".join(f"{s} {lost[s]}" for s in STATUSES if lost[s]) + ")"
               + (f" and passes {helped} of them with some ops in eager PyTorch" if helped else "")
               + f"; it passes {gained} that backend is expected to fail or crash on.")
    if broken:
        out.append("\ntest modules that could not be imported (their later tests are not in the suite here):")
        out.extend(f"  {name}: {why}" for name, why in broken.items())
    return "\n".join(out)


def write_json(path: Path, meta: dict, results: list[dict], complete: bool) -> None:
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(json.dumps({**meta, "complete": complete, "tests": sorted(results, key=lambda r: r["name"])},
                                  indent=1))
    partial.replace(path)


def tracea_revision() -> str:
    """Where the workers import Tracea from, and its git commit when that is a work tree."""
    package = Path(importlib.util.find_spec("tracea").origin).parent
    git = ["git", "-C", str(package)]
    commit = subprocess.run(git + ["rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if commit.returncode != 0:
        return f"{package} (not in a git work tree)"
    dirty = subprocess.run(git + ["status", "--porcelain", "--", "."], capture_output=True, text=True)
    return f"{package} @ {commit.stdout.strip()}" + (" with uncommitted changes" if dirty.stdout.strip() else "")


def interrupt(*_):
    raise KeyboardInterrupt


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker_main(Path(sys.argv[2]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--torch-mlir", metavar="PATH", default=os.environ.get("TORCH_MLIR_SRC"),
                        help="a torch-mlir checkout or git directory (default: $TORCH_MLIR_SRC)")
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1,
                        help="worker processes (default: the number of cores)")
    parser.add_argument("--timeout", type=float, default=120,
                        help="seconds per test (default 120; a test registered with a shorter timeout_seconds, "
                             "like TimeOutModule_basic's 10, gets that)")
    parser.add_argument("--filter", default="", metavar="REGEX", help="run the tests whose names match (re.search)")
    parser.add_argument("--sample", type=int, metavar="K",
                        help="run K tests evenly spaced over the sorted selection (deterministic)")
    parser.add_argument("--limit", type=int, metavar="N", help="run at most the first N selected tests")
    parser.add_argument("--out", type=Path, metavar="FILE",
                        help="write per-test results as JSON (name, status, category, error: its first line, "
                             "seconds, reference: what torch-mlir expects of its own backend; eager_ops, "
                             "compiled_ops and eager_reasons when Tracea ran part of the model in PyTorch)")
    args = parser.parse_args()
    if not args.torch_mlir:
        print("torch_mlir_e2e.py: no torch-mlir source: pass --torch-mlir PATH or set TORCH_MLIR_SRC to a "
              "checkout of https://github.com/llvm/torch-mlir (git clone --depth 1 ...) or a git mirror of it",
              file=sys.stderr)
        return 2
    if args.jobs < 1 or args.timeout <= 0 or (args.sample is not None and args.sample < 1) \
            or (args.limit is not None and args.limit < 1):
        parser.error("-j, --timeout, --sample and --limit must be positive")
    try:
        re.compile(args.filter)
        root, source = suite_root(args.torch_mlir)
    except (re.error, ValueError) as e:
        print(f"torch_mlir_e2e.py: {e}", file=sys.stderr)
        return 2

    try:
        tests, broken = load_suite(root)
        expectations = reference_expectations(root)
    except Exception as e:  # noqa: BLE001
        print(f"torch_mlir_e2e.py: could not load the suite from {root}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    names = select_tests(list(tests), args)
    if not names:
        print(f"torch_mlir_e2e.py: no test matches --filter {args.filter!r}", file=sys.stderr)
        return 2
    for name, why in broken.items():
        print(f"warning: test module {name} could not be imported: {why}", file=sys.stderr)

    log_dir = Path(tempfile.mkdtemp(prefix="tracea-e2e-logs-"))
    meta = {"torch_mlir": source, "tracea": tracea_revision(), "jobs": args.jobs, "timeout": args.timeout,
            "selected": len(names), "unimported_modules": broken, "worker_logs": str(log_dir)}
    print(f"{len(names)} of {len(tests)} tests, {args.jobs} workers, worker logs in {log_dir}", file=sys.stderr)
    results: list[dict] = []
    start = time.monotonic()
    last_report = [start]

    def on_result(result: dict) -> None:
        result["reference"] = expectations.get(result["name"], "pass")
        results.append(result)
        now = time.monotonic()
        if result["status"] in ("crash", "ice", "timeout"):
            print(f"  {result['status']}: {result['name']}: {result['error']}", file=sys.stderr)
        if len(results) % PROGRESS_EVERY == 0 or len(results) == len(names) or now - last_report[0] > 60:
            last_report[0] = now
            elapsed = now - start
            eta = elapsed / len(results) * (len(names) - len(results))
            counts = collections.Counter(r["status"] for r in results)
            print(f"[{len(results)}/{len(names)}] {elapsed / 60:.1f} min, ETA {eta / 60:.1f} min: "
                  + ", ".join(f"{s} {counts[s]}" for s in STATUSES if counts[s]), file=sys.stderr)
            if args.out:
                write_json(args.out, {**meta, "elapsed_seconds": round(elapsed)}, results, complete=False)

    # SIGTERM (e.g. from `kill`) ends the run like Ctrl-C: partial results are still reported
    signal.signal(signal.SIGTERM, interrupt)
    status = 0
    try:
        run_pool(root, tests, names, args, log_dir, on_result)
    except KeyboardInterrupt:
        print("interrupted: reporting the tests run so far", file=sys.stderr)
        status = 130
    except RuntimeError as e:  # a worker could not start: report what ran before
        print(f"torch_mlir_e2e.py: {e}", file=sys.stderr)
        status = 1
    elapsed = time.monotonic() - start
    if args.out:
        write_json(args.out, {**meta, "elapsed_seconds": round(elapsed)}, results, complete=status == 0)
    print(summarize(results, len(names), elapsed, broken, meta))
    print(f"\nworker logs: {log_dir}" + (f"; results: {args.out}" if args.out else ""))
    return status


if __name__ == "__main__":
    sys.exit(main())
