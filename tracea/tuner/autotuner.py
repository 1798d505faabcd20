"""AutoTuner: the seeds' `AutoTuner(device).optimize(problem)`: the Doctor picks the variant, the
variant gives the search space and its legality check, the GP search tries schedules (each
compiled, checked against the reference lowering, timed), and the tuning cache keeps every
measurement and the winner, which later compiles use (doctor/engine.py: plan)."""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field, replace

from .. import knobs
from ..dialects.schedule import Schedule
from ..doctor.engine import Context, plan
from ..codegen.variants import variant as variant_by_id
from ..errors import OpError, TraceaError
from . import TIMED_BACKENDS, cache as tuning_cache
from .measure import Measurer, TuningProblem
from .search import Evaluation, search
from .space import SearchSpace, config_key

RECHECK = 3  # configurations of a stale entry timed again before anything new
TOLERANCE = 0.02  # timings closer than this are ties (to the default, then to the space's order)


@dataclass(frozen=True)
class Shape:
    """The seed's problem shape: m x n x k GEMMs (`batch` of them); attention uses batch,
    heads, seq (queries and keys) and head_dim."""
    m: int = 0
    n: int = 0
    k: int = 0
    batch: int = 1
    heads: int = 1
    seq: int = 0
    head_dim: int = 0


@dataclass(frozen=True)
class ProblemDescriptor:
    """The seed's ProblemDescriptor: layer_type "gemm" or "attention", a Shape, a dtype."""
    layer_type: str = "gemm"
    shape: Shape = field(default_factory=Shape)
    dtype: str = "f32"
    device: str | None = None
    causal: bool = False

    def function(self):
        from .. import dialects as td
        s, kind = self.shape, self.layer_type.lower()
        if kind in ("gemm", "matmul"):
            lead = (s.batch,) if s.batch > 1 else ()
            return td.function(td.tensor(lead + (s.m, s.k), self.dtype), td.tensor(lead + (s.k, s.n), self.dtype),
                               name="kernel")(td.gemm)
        if kind in ("attention", "flash_attention"):
            spec = td.tensor((s.batch, s.heads, s.seq, s.head_dim), self.dtype)
            return td.function(spec, spec, spec, name="kernel")(
                lambda q, k, v: td.attention(q, k, v, causal=self.causal))
        raise TraceaError(f"ProblemDescriptor layer_type {self.layer_type!r}: the tuner builds 'gemm' and "
                          "'attention' problems; tune any other op from a program with tracea.tuner.AutoTuner.optimize")


@dataclass
class TunedSchedule:
    """What optimize returns: the winner and how it compares with the variant's default."""
    schedule: Schedule
    variant_id: str
    seconds: float | None  # the winner's median time (None: nothing could run)
    default_seconds: float | None
    evaluations: list[Evaluation]  # this call's, in order
    key: str
    label: str
    stopped: str = ""
    from_cache: bool = False

    @property
    def speedup(self) -> float | None:
        if self.seconds and self.default_seconds:
            return self.default_seconds / self.seconds
        return None

    def describe(self) -> str:
        where = "from the tuning cache" if self.from_cache else f"after {len(self.evaluations)} evaluations"
        gain = f", {self.speedup:.2f}x the default" if self.speedup else ""
        time_text = f"{self.seconds * 1e3:.3f} ms" if self.seconds else "no time"
        return f"{self.label} on {self.variant_id}: {self.schedule.as_dict()} {time_text}{gain} ({where})"


def configuration_of(space: SearchSpace, complete, schedule: Schedule | None) -> dict | None:
    """The configuration of `space` whose schedule, as the variant completes it, is `schedule`:
    where a search starts from the default."""
    return next((c for c in space.configurations() if complete(space.schedule(c)) == schedule), None)


class AutoTuner:
    """Tunes kernel ops on `device` ("cpu" / None: this machine's CPU; a Capabilities: a machine
    whose measurements come from elsewhere, see campaign.py). budget: new evaluations per op;
    seconds: a time limit per op; workers: compile processes (default: the cores, when the disk
    cache is on); progress: a line per evaluation on stderr (default: when stderr is a terminal
    or TRACEA_PROGRESS=1)."""

    def __init__(self, device=None, *, threads: int | None = None, budget: int = 40, seconds: float | None = None,
                 cache: tuning_cache.TuningCache | None = None, workers: int | None = None,
                 progress: bool | None = None, repeats: int = 7, seed: int = 0, initial: int = 6,
                 retune: bool = False):
        self.context = Context("cpu" if device is None else device)
        caps = self.context.capabilities
        if caps.backend not in TIMED_BACKENDS:
            raise TraceaError(f"tuning for {caps.name} times kernels on that device, and Tracea's tuner times kernels "
                              f"on {' and '.join(TIMED_BACKENDS)} devices only (no {caps.backend} launcher is wired to "
                              "it); tune on the CPU (AutoTuner('cpu')) or a Vulkan device (AutoTuner('vulkan:0'))")
        self.caps = caps
        on_cpu = caps.backend == "cpu"
        if not on_cpu and threads not in (None, 1):
            raise TraceaError(f"threads= sizes the CPU's thread teams; a {caps.backend} kernel's workgroups come from "
                              "its schedule")
        # a GPU kernel's key has threads 1, as its compile's plan() gives it (tuner/cache.py entry_key)
        self.threads = (threads or knobs.num_threads() or caps.cpu.cores) if on_cpu else 1
        self.budget, self.seconds, self.repeats, self.seed, self.initial = budget, seconds, repeats, seed, initial
        self.cache = cache or tuning_cache.TuningCache()
        # compile workers fill the CPU's disk cache; GPU kernels are compiled where they are timed
        self.workers = (caps.cpu.cores if workers is None else workers) if on_cpu else 0
        self.progress = knobs.show_progress() if progress is None else progress
        self.retune = retune  # search again where the cache has an entry
        self.results: list[TunedSchedule] = []  # what tune() returned, in order
        # where measurements come from: this machine, or a cluster's nodes (campaign.py sets both)
        self.environment = tuning_cache.environment(caps)
        self.measurer = lambda tp, variant_id: Measurer(tp, variant_id, self.threads, repeats=self.repeats,
                                                        workers=self.workers, seed=self.seed, device=caps)

    # --- the seeds' API ---------------------------------------------------------------------
    def optimize(self, problem, *, retune: bool | None = None) -> TunedSchedule:
        """The best schedule for `problem` (a ProblemDescriptor, or a program with one kernel
        op: IR text, a Path, a tracea Function). A fresh cache entry answers at once unless
        `retune`; otherwise a search runs and its results are stored."""
        if isinstance(problem, ProblemDescriptor):
            problem = problem.function()
        tp = problem if isinstance(problem, TuningProblem) else TuningProblem.of(problem)
        return self.tune(tp, retune=retune)

    def tune(self, tp: TuningProblem, *, retune: bool | None = None) -> TunedSchedule:
        result = self._tune(tp, self.retune if retune is None else retune)
        self.results.append(result)
        return result

    def _tune(self, tp: TuningProblem, retune: bool) -> TunedSchedule:
        if tp.problem.dynamic:
            raise TraceaError(f"{tp.label} has sizes known at run time only, which a timing needs; tune it "
                              "at a representative size (the tuned schedule is the op's, whatever its sizes)")
        decision = plan(tp.problem, self.caps, self.threads, tuned=False)
        chosen = variant_by_id(decision.variant_id)
        key = tuning_cache.entry_key(tp.facts, chosen.id, self.caps, self.threads)
        env = self.environment
        entry = self.cache.get(key)
        default = decision.schedule
        if chosen.search_space is None:
            raise TraceaError(f"{tp.label} runs on {chosen.id}, which has no schedule to tune "
                              f"(variants with a search space: {', '.join(_tunable())})")
        space = self._space(chosen, tp).include(default)
        # a hit: a fresh entry searched over this same space (a widened space searches again,
        # re-using every configuration the entry measured)
        if entry is not None and entry.fresh(env) and entry.data.get("schedule") and not retune \
                and entry.data.get("space") == space.describe():
            return TunedSchedule(Schedule.from_dict(entry.data["schedule"]), chosen.id, entry.data.get("seconds"),
                                 entry.data.get("default_seconds"), [], key, tp.label, "cached", True)
        complete = self._completer(chosen, tp)
        measurer = self.measurer(tp, chosen.id)
        started = time.perf_counter()
        try:
            def evaluate(configs: list[dict]) -> list[Evaluation]:
                return measurer.evaluate([(c, complete(space.schedule(c))) for c in configs])

            def compare(configs: list[dict]) -> list[Evaluation]:
                return measurer.compare([(c, complete(space.schedule(c))) for c in configs])

            prior = [] if retune else self._prior(entry, env, space, evaluate)
            first = configuration_of(space, complete, default)
            result = search(space, evaluate, budget=self.budget, seconds=self.seconds, initial=self.initial,
                            batch=max(1, self.workers), seed=self.seed, first=first, prior=prior,
                            confirm=compare, tolerance=TOLERANCE, progress=self._printer(tp, started),
                            hints=self._hints(tp, chosen.id))
            best = result.best
            schedule, seconds, default_time = default, None, None
            if best is not None:
                schedule, seconds = complete(space.schedule(best.config)), best.seconds
            if best is not None and default is not None and schedule != default:
                # the verdict against the default: both timed together, in rounds (the search's own
                # first measurement of the default may have met a slow moment of the machine); a
                # winner must be faster by more than the tolerance, else the default stays
                final, baseline = measurer.compare([(best.config, schedule), ({}, default)])
                seconds, default_time = final.seconds, baseline.seconds
                if seconds is None or (default_time is not None and seconds >= default_time * (1 - TOLERANCE)):
                    schedule, seconds = default, default_time
            elif best is not None:
                default_time = seconds
        finally:
            measurer.close()
        self._store(key, tp, chosen.id, env, space, prior + result.evaluations, schedule, seconds, default_time, retune)
        return TunedSchedule(schedule, chosen.id, seconds, default_time, result.evaluations, key, tp.label,
                             result.stopped)

    # --- pieces -----------------------------------------------------------------------------
    def _space(self, chosen, tp: TuningProblem) -> SearchSpace:
        space = chosen.search_space(tp.problem, self.caps)
        if self.caps.backend == "cpu" and self.threads > 1:
            space.threads([0, 1])  # the program's team, or the calling thread alone
        complete = self._completer(chosen, tp)
        if chosen.check_schedule is not None:
            def legal(config: dict, schedule: Schedule) -> bool:
                try:
                    chosen.check_schedule(tp.problem, self.caps, complete(schedule))
                except OpError:
                    return False
                return True
            space.constrain(f"{chosen.id}'s own check of the schedule (registers, tiles, shapes)", legal)
        return space

    def _completer(self, chosen, tp: TuningProblem):
        """The schedule the kernel runs: the variant completes what a configuration leaves out."""
        if chosen.default_schedule is None:
            return lambda s: s
        return lambda s: chosen.default_schedule(replace(tp.problem, schedule=s), self.caps, self.threads) or s

    def _prior(self, entry, env: dict, space: SearchSpace, evaluate) -> list[Evaluation]:
        """What the cache already measured in this space: all of a fresh entry; of a stale one,
        its few best timed again (a driver or compiler update may have changed them)."""
        if entry is None:
            return []
        keys = {config_key(c) for c in space.configurations()}
        stored = [c for c in entry.data["configs"].values() if config_key(c["config"]) in keys]
        if entry.fresh(env):
            return [Evaluation(c["config"], c.get("seconds"), c.get("error")) for c in stored]
        best = [c["config"] for c in sorted((c for c in stored if c.get("seconds") is not None),
                                            key=lambda c: c["seconds"])[:RECHECK]]
        return evaluate(best) if best else []

    def _hints(self, tp: TuningProblem, variant_id: str) -> list[list[Evaluation]]:
        """What other machines measured for this problem, per machine: the search tries the
        configurations they rank best right after the default (bench/tuner_replay.py measures
        it, leaving the replayed machine out)."""
        problem = tuning_cache.problem_key(tp.facts, variant_id)
        return [[Evaluation(c["config"], c.get("seconds"), c.get("error")) for c in other.data["configs"].values()]
                for other in self.cache.others(problem, self.caps.describe())]

    def _printer(self, tp: TuningProblem, started: float):
        if not self.progress:
            return None

        def show(e: Evaluation, count: int, best: Evaluation | None) -> None:
            total = self.budget
            what = f"{e.seconds * 1e3:.3f} ms" if e.feasible else f"failed: {e.error.splitlines()[0][:80]}"
            best_text = f"{best.seconds * 1e3:.3f} ms" if best else "-"
            print(f"tune {tp.label} [{count}/{total}] {config_key(e.config)}: {what} (best {best_text}, "
                  f"{time.perf_counter() - started:.1f} s)", file=sys.stderr, flush=True)
        return show

    def _store(self, key, tp, variant_id, env, space, evaluations, schedule, seconds, default_time, retune) -> None:
        def change(old: dict | None) -> dict:
            data = dict(old) if old is not None and not retune else {"configs": {}}
            if old is not None and old.get("environment") != env:
                data = {"configs": {}}  # measured elsewhere: only this run's (re-checked) times count
            configs = dict(data.get("configs", {}))
            for e in evaluations:
                configs[config_key(e.config)] = {"config": e.config, "seconds": e.seconds, "error": e.error,
                                                 "samples": len(e.samples)}
            data.update(configs=configs, label=tp.label, variant=variant_id, threads=self.threads,
                        problem=tuning_cache.problem_key(tp.facts, variant_id),
                        device=self.caps.describe(), environment=env, space=space.describe(),
                        schedule=schedule.as_dict() if schedule is not None else None,
                        default_seconds=default_time, tuned=tuning_cache.now())
            data["seconds"] = seconds
            return data
        self.cache.update(key, change)


def _tunable() -> list[str]:
    from ..codegen.variants import variants
    return [v.id for v in variants() if v.search_space is not None]


# the start of the CPU pipeline (targets/cpu/target.py tiled_lowering): the kernel ops a program
# will run, torch-mlir's linalg raised to tracea ops, before any variant or schedule is chosen
RAISE = "tracea-verify, tracea-widen-i1, tracea-raise-linalg, canonicalize"


def kernel_problems(program) -> list[TuningProblem]:
    """The kernel ops `program` (IR text, a Path, an MLIR module, a tracea Function) will run on
    the CPU, each as a TuningProblem, without repeats (a model's layers share shapes)."""
    from ..compiler import _source
    from ..dialects.context import parse_module, shared_context
    from ..dialects.verify import tracea_ops
    from ..passes.pipeline import compile_or_raise, parse_pipeline
    from ..passes.select_variant import KERNEL_OPS
    text, name = _source(program)
    raised = compile_or_raise(text, [("raised", parse_pipeline(RAISE))], source_name=name).text
    found: dict[tuple, TuningProblem] = {}
    with shared_context("host"):
        module = parse_module(raised, name)
        for op in tracea_ops(module.operation):
            if op.name in KERNEL_OPS and "schedule" not in op.attributes:
                tp = TuningProblem.from_op(op)
                found.setdefault(tp.facts, tp)
    return list(found.values())


def tune_program(program, tuner: AutoTuner | None = None, *, retune: bool | None = None) -> list[TunedSchedule]:
    """Tune every kernel op of `program` that has no schedule of its own (a fresh tuning-cache
    entry answers at once); later compiles of it use the results. Ops whose variant has nothing
    to tune (e.g. softmax) are skipped."""
    import warnings
    tuner = tuner or AutoTuner()
    results = []
    for tp in kernel_problems(program):
        if tp.problem.dynamic:
            continue  # (no sizes to time it at: the default schedule, as for a symbolic kernel's other ops)
        try:
            decision = plan(tp.problem, tuner.caps, tuner.threads, tuned=False)
            if variant_by_id(decision.variant_id).search_space is None:
                continue
            results.append(tuner.tune(tp, retune=retune))
        except TraceaError as e:  # the op keeps its default schedule; the program still compiles
            warnings.warn(f"tracea: could not tune {tp.label}: {e}; it keeps its default schedule", stacklevel=2)
    return results
