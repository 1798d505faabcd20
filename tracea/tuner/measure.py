"""What a tuner evaluates: one kernel op as a function of its own (`TuningProblem`), compiled
with a candidate schedule, checked against the reference lowering, and timed.

Compiles of a batch run in a pool of worker processes (each compile lands in the disk cache,
from which this process loads it); timings run here, one at a time, with the pool idle, so no
compile steals a core from a measurement.
"""
from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass, field

import numpy as np

from .. import knobs
from ..codegen.variants import Problem
from ..dialects.ops import view
from ..dialects.schedule import Schedule
from ..errors import TraceaError
from ..passes.select_variant import KERNEL_OPS
from ..tools.timing import interleaved_samples
from .cache import op_facts
from .search import Evaluation

# |tuned - reference| <= tolerance x max(1, max |reference|), by the result's element type
TOLERANCE = {"f32": 2e-4, "f64": 1e-9, "f16": 2e-2, "bf16": 5e-2}


@dataclass(frozen=True)
class TuningProblem:
    """One kernel op as the function @kernel of its operands."""
    text: str
    problem: Problem  # what the Doctor plans, with the op's view (conv defaults read the op)
    label: str  # "gemm 1024x1024 1024x1024 f32": the kind, the operands' shapes, the result's dtype
    facts: tuple  # what identifies it in the tuning cache: op, operand and result types, attributes
    module: object = field(default=None, compare=False, repr=False)  # keeps the view's op alive

    @staticmethod
    def from_op(op) -> "TuningProblem":
        """The op (an ir.Operation of a kernel op) alone in a function, its schedule and variant
        dropped so the tuner can set them."""
        import mlir.ir as ir
        from mlir.dialects import func
        if op.name not in KERNEL_OPS:
            raise TraceaError(f"{op.name} is not a kernel op the tuner can tune; it tunes {', '.join(KERNEL_OPS)}")
        with op.context, ir.Location.unknown():
            module = ir.Module.create()
            with ir.InsertionPoint(module.body):
                f = func.FuncOp("kernel", ([v.type for v in op.operands], [r.type for r in op.results]))
                block = f.add_entry_block()
                with ir.InsertionPoint(block):
                    clone = op.clone()
                    for i, arg in enumerate(block.arguments):
                        clone.operands[i] = arg
                    for name in ("schedule", "tracea.variant"):
                        if name in clone.attributes:
                            del clone.attributes[name]
                    func.ReturnOp(clone.results)
            v = view(clone)
            problem = Problem.from_view(v)
            return TuningProblem(str(module), problem, _label(v), op_facts(clone), module)

    @staticmethod
    def of(program) -> "TuningProblem":
        """The single kernel op of `program` (IR text, a Path, a tracea Function)."""
        from ..compiler import _source
        from ..dialects.context import parse_module, shared_context
        from ..dialects.verify import tracea_ops
        text, name = _source(program)
        with shared_context("host"):
            module = parse_module(text, name)
            ops = [op for op in tracea_ops(module.operation) if op.name in KERNEL_OPS]
            if len(ops) != 1:
                raise TraceaError(f"{name} has {len(ops)} kernel ops; tune a program with exactly one "
                                  "(tracea tune and tracea.tuner.autotuner.tune_program take whole programs)")
            return TuningProblem.from_op(ops[0])

    def with_schedule(self, variant_id: str, schedule: Schedule | None) -> str:
        """The function text with the op pinned to `variant_id` and `schedule`."""
        import mlir.ir as ir
        from ..dialects.context import parse_module, shared_context
        from ..dialects.verify import tracea_ops
        with shared_context("host"):
            module = parse_module(self.text, "<tuning>")
            op = next(o for o in tracea_ops(module.operation) if o.name in KERNEL_OPS)
            with op.context:
                op.attributes["tracea.variant"] = ir.StringAttr.get(variant_id)
                if schedule is not None:
                    op.attributes["schedule"] = schedule.to_attr()
            return str(module)


def _label(v) -> str:
    kind = v.op.name.removeprefix("tracea.")
    shapes = " ".join(spec.dims for spec in v.operands.values() if spec is not None)
    return f"{kind} {shapes} {v.result.dtype}"


class CompilePool:
    """Worker processes (tracea.tuner.compile_worker) that compile function texts into the disk
    cache, a batch at a time; a worker that dies is replaced and its compile reported failed."""

    def __init__(self, workers: int):
        self.procs: list = [None] * workers

    def _worker(self, i: int):
        import os
        import subprocess
        proc = self.procs[i]
        if proc is None or proc.poll() is not None:
            # workers must not spin up their own thread teams while timings run here
            env = {**os.environ, "OMP_NUM_THREADS": "1", "TRACEA_PROGRESS": "0"}
            proc = subprocess.Popen([sys.executable, "-m", "tracea.tuner.compile_worker"], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
            self.procs[i] = proc
        return proc

    def compile(self, texts: list[str], threads: int) -> list[str | None]:
        """Each text's compile error, or None; batches of as many texts as workers."""
        import json
        errors: list[str | None] = []
        for start in range(0, len(texts), len(self.procs)):
            batch = texts[start:start + len(self.procs)]
            sent = []
            for i, text in enumerate(batch):
                proc = self._worker(i)
                try:
                    proc.stdin.write(json.dumps({"text": text, "threads": threads}) + "\n")
                    proc.stdin.flush()
                    sent.append(proc)
                except OSError as e:
                    sent.append(f"the compile worker could not be reached: {e}")
            for proc in sent:
                if isinstance(proc, str):
                    errors.append(proc)
                    continue
                line = proc.stdout.readline()
                if not line:
                    errors.append(f"the compile worker died (exit code {proc.wait()})")
                else:
                    errors.append(json.loads(line)["error"])
        return errors

    def close(self) -> None:
        for proc in self.procs:
            if proc is not None and proc.poll() is None:
                proc.stdin.close()
                try:
                    proc.wait(timeout=10)
                except Exception:
                    proc.kill()
        self.procs = [None] * len(self.procs)


class Measurer:
    """Evaluates schedules of one TuningProblem on `device` (None: this CPU; or the Capabilities
    of a device of this machine, e.g. a Vulkan one): compile (on the CPU, a pool of `workers`
    processes when the disk cache is on), check against the CPU's reference lowering, time."""

    def __init__(self, problem: TuningProblem, variant_id: str, threads: int, *, repeats: int = 7,
                 min_seconds: float = 0.05, workers: int = 0, seed: int = 0, device=None):
        import tracea
        self.problem, self.variant_id, self.threads = problem, variant_id, threads
        self.repeats, self.min_seconds = repeats, min_seconds
        on_cpu = device is None or device.backend == "cpu"
        # how a candidate is compiled: for the CPU's thread team, or for the device by its name
        self.target = dict(threads=threads) if on_cpu else dict(target=device.backend, chip=device.name)
        reference = tracea.compile(problem.text, strategy="reference", threads=threads if on_cpu else None)
        rng = np.random.default_rng(seed)
        self.inputs = [_random(spec, rng) for spec in reference.signature.inputs]
        self.expected = np.asarray(reference(*self.inputs), dtype=np.float64)
        self.dtype = reference.signature.outputs[0].dtype
        # without the disk cache a worker's compile could not reach this process
        self.pool = CompilePool(workers) if on_cpu and workers > 1 and knobs.cache_dir() is not None else None

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()

    def evaluate(self, schedules: list[tuple[dict, Schedule]]) -> list[Evaluation]:
        texts = [self.problem.with_schedule(self.variant_id, s) for _, s in schedules]
        errors: list[str | None] = [None] * len(texts)
        if self.pool is not None and len(texts) > 1:
            errors = self.pool.compile(texts, self.threads)
        return [Evaluation(config, None, error) if error else self._run(config, text)
                for (config, _), text, error in zip(schedules, texts, errors)]

    def _checked(self, text: str):
        """The compiled kernel of `text` if it computes the reference's numbers, else the reason."""
        import tracea
        try:
            kernel = tracea.compile(text, **self.target)
            out = np.asarray(kernel(*self.inputs), dtype=np.float64)
        except TraceaError as e:
            return f"{type(e).__name__}: {e}"
        return _mismatch(out, self.expected, self.dtype) or kernel

    def _run(self, config: dict, text: str) -> Evaluation:
        kernel = self._checked(text)
        if isinstance(kernel, str):
            return Evaluation(config, None, kernel)
        samples = time_calls(lambda: kernel(*self.inputs), self.repeats, self.min_seconds)
        return Evaluation(config, statistics.median(samples), None, samples)

    def compare(self, schedules: list[tuple[dict, Schedule]]) -> list[Evaluation]:
        """The finalists timed again in rounds, one call of each per round (the machine's drift
        then weighs on all alike): medians over at least `repeats` rounds and `min_seconds` each."""
        kernels = [self._checked(self.problem.with_schedule(self.variant_id, s)) for _, s in schedules]
        ready = {i: (lambda k=k: k(*self.inputs)) for i, k in enumerate(kernels) if not isinstance(k, str)}
        samples = interleaved_samples(ready, 2 * self.repeats, self.min_seconds * len(ready)) if ready else {}
        return [Evaluation(config, None, kernels[i]) if isinstance(kernels[i], str)
                else Evaluation(config, statistics.median(samples[i]), None, samples[i])
                for i, (config, _) in enumerate(schedules)]


def time_calls(call, repeats: int, min_seconds: float) -> list[float]:
    """Seconds of each call after one warm-up: at least `repeats` calls and `min_seconds`."""
    return interleaved_samples({"call": call}, repeats, min_seconds)["call"]


def _random(spec, rng) -> np.ndarray:
    from ..runtime.dtypes import to_numpy
    dtype = to_numpy(spec.dtype)
    if np.issubdtype(dtype, np.integer):
        return rng.integers(-3, 4, size=spec.shape).astype(dtype)
    return rng.standard_normal(spec.shape).astype(dtype)


def _mismatch(out: np.ndarray, expected: np.ndarray, dtype: str) -> str | None:
    if out.shape != expected.shape:
        return f"wrong result shape {out.shape}, expected {expected.shape}"
    if not np.all(np.isfinite(out) == np.isfinite(expected)):
        return "non-finite values where the reference has none (or the reverse)"
    finite = np.isfinite(expected)
    scale = max(1.0, float(np.abs(expected[finite]).max(initial=0.0)))
    worst = float(np.abs(out[finite] - expected[finite]).max(initial=0.0))
    tolerance = TOLERANCE.get(dtype, 2e-4) * scale
    if worst > tolerance:
        return f"wrong numbers: max |error| {worst:.3g} vs the reference (allowed {tolerance:.3g})"
    return None
