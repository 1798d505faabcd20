"""Tuning campaigns on a Ray cluster: many ops, tuned on every kind of machine the cluster has,
the results merged into this machine's tuning cache.

What travels, and where the work runs:
- The driver (here) extracts each kernel op as its one-op function (IR text, a few KB) and runs
  the GP search for each (op, machine kind): the model is small and the search sequential.
- Each batch of proposed schedules goes to nodes of that machine kind as Ray tasks carrying the
  IR text and the schedules; the node compiles them itself (object code is specific to the
  host's ISA, caches and LLVM build, so compiled code never travels), checks each against its
  own reference lowering, times it, and returns the times: a few numbers per configuration.
- A task asks for all of its node's CPUs, so a node times one kernel at a time.
- Machines are grouped by what the cache keys on (the CPU record: ISA, lanes, registers, caches,
  cores) and by the environment (versions), probed by a task on each node; an entry is stored
  under the machine's key, exactly as if it had been tuned there, and is used by compiles on
  any machine of that kind that reads the cache (copy the file, or share TRACEA_TUNING_DIR).

`ray` is an optional dependency (pip install ray); `ray.init()` starts a local cluster of this
machine, which is what the tests use.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import TraceaError
from .measure import TuningProblem
from .search import Evaluation
from .space import config_key


def _ray():
    try:
        import ray
    except ImportError:
        raise TraceaError("tuning on a cluster needs Ray: pip install 'ray==2.60.0' (or tune here with "
                          "AutoTuner / tracea tune)") from None
    return ray


def _probe() -> dict:
    """Runs on a node: what its kernels would be tuned for."""
    from ..doctor import host
    from .cache import environment
    caps = host()
    return {"caps": caps, "environment": environment(caps), "pid": os.getpid()}


def _evaluate(text: str, variant_id: str, schedules: list[tuple[dict, dict | None]], threads: int,
              repeats: int, together: bool = False) -> list[tuple]:
    """Runs on a node: compile, check and time each schedule of the op in `text` (together:
    in rounds, as Measurer.compare)."""
    from ..dialects.schedule import Schedule
    from .measure import Measurer
    tp = TuningProblem.of(text)
    measurer = Measurer(tp, variant_id, threads, repeats=repeats, workers=0)
    try:
        work = [(config, Schedule.from_dict(s) if s is not None else None) for config, s in schedules]
        done = measurer.compare(work) if together else measurer.evaluate(work)
    finally:
        measurer.close()
    return [(e.config, e.seconds, e.error, e.samples, os.getpid()) for e in done]


@dataclass
class MachineKind:
    caps: object  # doctor.Capabilities of its nodes
    environment: dict
    nodes: list[str]  # Ray node ids


class RemoteMeasurer:
    """The Measurer interface (evaluate, close) on the nodes of one machine kind: a batch is
    spread over them, one task per node at a time."""

    def __init__(self, tp: TuningProblem, variant_id: str, threads: int, kind: MachineKind, repeats: int):
        ray = _ray()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        self.ray, self.tp, self.variant_id, self.threads, self.repeats = ray, tp, variant_id, threads, repeats
        cpus = kind.caps.cpu.cores
        self.tasks = [ray.remote(_evaluate).options(
            num_cpus=cpus, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)) for node in kind.nodes]
        self.pids: set[int] = set()  # the worker processes that measured (the tests check they are not this one)

    def evaluate(self, schedules, together: bool = False) -> list[Evaluation]:
        """Spread over the nodes; `together`: all on one node, timed in rounds (the finalists)."""
        shares = [schedules] if together else [schedules[i::len(self.tasks)] for i in range(len(self.tasks))]
        futures = [task.remote(self.tp.text, self.variant_id,
                               [(c, s.as_dict() if s is not None else None) for c, s in share], self.threads,
                               self.repeats, together) for task, share in zip(self.tasks, shares) if share]
        by_key = {}
        for rows in self.ray.get(futures):
            for config, seconds, error, samples, pid in rows:
                self.pids.add(pid)
                by_key[config_key(config)] = Evaluation(config, seconds, error, samples)
        return [by_key[config_key(c)] for c, _ in schedules]

    def compare(self, schedules) -> list[Evaluation]:
        return self.evaluate(schedules, together=True)

    def close(self) -> None:
        pass


def machine_kinds(address: str | None = None) -> list[MachineKind]:
    """The cluster's nodes grouped by capabilities and environment (a probe task on each)."""
    ray = _ray()
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, logging_level="ERROR")
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    probe = ray.remote(_probe)
    nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
    found = ray.get([probe.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote()
                     for n in nodes])
    kinds: dict[tuple, MachineKind] = {}
    for node, info in zip(nodes, found):
        key = (repr(info["caps"].cpu), tuple(sorted(info["environment"].items())))
        kinds.setdefault(key, MachineKind(info["caps"], info["environment"], [])).nodes.append(node)
    return list(kinds.values())


def tune_campaign(programs, *, address: str | None = None, budget: int = 40, threads: int | None = None,
                  progress: bool | None = None, seed: int = 0, repeats: int = 7, retune: bool = False):
    """Tune every kernel op of `programs` (IR texts, Paths, tracea Functions) on every machine
    kind of the Ray cluster at `address` (None: the one ray.init() finds or starts); results go
    to this machine's tuning cache under each machine's key. Returns the TunedSchedules."""
    from .autotuner import AutoTuner, kernel_problems
    problems: dict[tuple, TuningProblem] = {}
    for program in programs:
        for tp in kernel_problems(program):
            problems.setdefault(tp.facts, tp)
    results = []
    for kind in machine_kinds(address):
        tuner = AutoTuner(kind.caps, threads=threads, budget=budget, progress=progress, seed=seed, repeats=repeats,
                          retune=retune, workers=len(kind.nodes))
        tuner.environment = kind.environment
        tuner.measurer = lambda tp, variant_id, kind=kind, t=tuner: RemoteMeasurer(tp, variant_id, t.threads, kind,
                                                                                   repeats)
        for tp in problems.values():
            results.append(tuner.tune(tp))
    return results
