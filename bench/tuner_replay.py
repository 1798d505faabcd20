"""Sample efficiency of the tuner, replayed on recorded spaces (issue 25, item 3).

    .venv/bin/python bench/tuner_replay.py             # every table in bench/tuning_spaces/
    .venv/bin/python bench/tuner_replay.py --seeds 20 --markdown

Each table (scripts/record_tuning_space.py) holds the measured time of every configuration of a
variant's search space on one machine. The GP search and random search run on it as they would
on the machine, an evaluation being a lookup of the recorded median, over `--seeds` seeds,
neither given the variant's default to start from: the search alone. Reported: evaluations until
a configuration within 5 % of the table's best was tried (median and 90th percentile over the
seeds), random's exact expectation ((N + 1) / (W + 1) with W of N configurations within 5 %),
random's median over the GP's, and the tuner as it runs (`AutoTuner`: the default first, then the
GP with it among its data), from the default of the day the table was recorded and from the one
today's Tracea plans for the recorded machine (its CPU as the table describes it). Nothing is
timed here, so the result is exact for the recorded data.

W / N bounds what the search alone can do: its first point is chosen knowing nothing of the
space, so it lands within 5 % no more often than random's first draw (W / N). With less than
half the space within 5 %, its median is then at least 2 evaluations, and being 2x better than
random is out of reach wherever random's median is below 4.

A warm start from other machines (`search(hints=...)`, what `AutoTuner` passes from tuning-cache
entries of the same problem on other devices) is measured leave-one-machine-out: replaying a
table, the hints are the tables of the same problem recorded on other machines. A machine is
the host the table was recorded on (its zen generation): AVX2 forced on the zen4 host is the
same machine as zen4's AVX-512 table, so it never hints it. Columns: the search alone with
hints, and the tuner from today's default with hints, each with random's median over its own.
`--only COLUMN ...` runs a few columns (JSON out), to iterate quickly.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))


def replay_space(configs: list[dict]):
    """A SearchSpace whose configurations are exactly the recorded ones, its knobs their values."""
    from tracea.tuner.space import SearchSpace, config_key
    knobs: dict[str, list] = {}
    for c in configs:
        for name, value in c.items():
            value = tuple(value) if isinstance(value, list) else value
            if value not in knobs.setdefault(name, []):
                knobs[name].append(value)
    for choices in knobs.values():
        if all(isinstance(v, (int, float)) for v in choices):
            choices.sort()
    ordered = sorted(configs, key=config_key)

    class Recorded(SearchSpace):
        def configurations(self):
            return ordered

    return Recorded(knobs=knobs)


def _on_host(table: dict) -> str:
    """The host's ISA (" on avx512") for a table recorded with a narrower ISA forced on that host."""
    found = re.search(r"x86_64 (\w+) ", table["machine"].get("host", ""))
    return f" on {found.group(1)}" if found else ""


def _tag(table: dict) -> str:
    """The machine kind the table was recorded on (", zen5"), where the recording named it."""
    tag = table["machine"].get("tag")
    return f", {tag}" if tag else ""


def _machine(table: dict) -> str:
    """The recorded machine (the host the table was measured on), whatever ISA was forced on it."""
    m = table["machine"]
    return m.get("tag") or m.get("host") or m["cpu"]


def other_machines(table: dict, tables: dict[str, dict]) -> list[dict]:
    """The tables hinting a replay of `table`, leave-one-machine-out: the same problem recorded on
    other machines. Strict: a table of the same host with another ISA forced (AVX2 on an AVX-512
    host) is the same machine and is left out, as `table` itself is."""
    return [other for other in tables.values()
            if other["problem"] == table["problem"] and _machine(other) != _machine(table)]


def hints_of(others: list[dict]) -> list[list]:
    """Each table's evaluations, as search(hints=...) takes them."""
    from tracea.tuner.search import Evaluation
    return [[Evaluation(r["config"], r["seconds"], r["error"]) for r in other["configs"].values()] for other in others]


def evaluations_to_reach(table: dict, strategy: str, seed: int, cap: int, within: float = 0.05,
                         default: str | None = None, hints=()) -> int | None:
    from tracea.tuner.search import Evaluation, search
    from tracea.tuner.space import config_key
    configs = [row["config"] for row in table["configs"].values()]
    times = {config_key(row["config"]): row["seconds"] for row in table["configs"].values()}
    errors = {config_key(row["config"]): row["error"] for row in table["configs"].values()}
    best = min(t for t in times.values() if t is not None)

    def evaluate(batch):
        return [Evaluation(c, times[config_key(c)], errors[config_key(c)]) for c in batch]

    first = table["configs"][default]["config"] if default else None
    result = search(replay_space(configs), evaluate, budget=cap, seed=seed, strategy=strategy, first=first,
                    stop_below=best * (1 + within), hints=hints)
    return result.evaluations_to_reach(best * (1 + within))


def recorded_caps(table: dict):
    """The Capabilities of the machine a table was recorded on, from its CPU's description."""
    from tracea.doctor.capabilities import CPU, Capabilities
    found = re.search(r"(\w+) (\w+) \((\d+) f32 lanes, (\d+) vector registers\), L1d (\d+) KiB, L2 (\d+) KiB, "
                      r"L3 (\d+) KiB, (\d+) core", table["machine"]["cpu"])
    arch, isa, lanes, registers, l1, l2, l3, cores = found.groups()
    cpu = CPU(arch, isa, int(lanes), int(registers), int(l1) << 10, int(l2) << 10, int(l3) << 10, int(cores))
    return Capabilities("cpu", "recorded", cpu=cpu)


def todays_default(table: dict) -> str | None:
    """The key of the configuration today's Tracea plans by default for the table's problem on
    the machine it was recorded on (the first the tuner tries there now), or None when the
    recorded space does not hold it."""
    from tracea.doctor import plan
    from tracea.codegen.variants import variant
    from tracea.tuner.autotuner import AutoTuner
    from tracea.tuner.measure import TuningProblem
    from tracea.tuner.space import config_key
    from record_tuning_space import problems
    tuner = AutoTuner("cpu", threads=table["threads"], workers=0, progress=False)
    tuner.caps = recorded_caps(table)
    tp = TuningProblem.of(problems()[table["problem"]]())
    decision = plan(tp.problem, tuner.caps, tuner.threads, tuned=False)
    if decision.variant_id != table["variant"]:
        return None
    space = tuner._space(variant(decision.variant_id), tp)
    complete = tuner._completer(variant(decision.variant_id), tp)
    return next((config_key(row["config"]) for row in table["configs"].values()
                 if complete(space.schedule(row["config"])) == decision.schedule), None)


def within_band(table: dict, within: float = 0.05) -> int:
    """How many configurations run within `within` of the table's best."""
    times = [r["seconds"] for r in table["configs"].values()]
    best = min(t for t in times if t is not None)
    return sum(t is not None and t <= best * (1 + within) for t in times)


def random_expectation(table: dict, within: float = 0.05) -> float:
    """Random search's expected evaluations to reach within `within` of the best: drawing
    without replacement from N configurations of which W qualify, (N + 1) / (W + 1)."""
    return (len(table["configs"]) + 1) / (within_band(table, within) + 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tables", nargs="*", help="recorded tables (default: bench/tuning_spaces/*.json)")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--cap", type=int, default=150, help="evaluations before a run counts as not reaching it")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--only", nargs="+", metavar="COLUMN", help="run only these columns (gp random tuner "
                        "tuner_today gp_hints tuner_today_hints), to iterate quickly; output is JSON")
    args = parser.parse_args()
    recorded = sorted(glob.glob(os.path.join(HERE, "tuning_spaces", "*.json")))
    paths = args.tables or recorded
    if not paths:
        print("no recorded tables: run scripts/record_tuning_space.py first", file=sys.stderr)
        return 1
    # hints for any replayed table come from every recorded one (of other machines)
    tables = {os.path.abspath(p): json.load(open(p)) for p in sorted(set(recorded) | set(paths))}
    rows = []
    for path in paths:
        table = tables[os.path.abspath(path)]
        ran = [r["seconds"] for r in table["configs"].values() if r["seconds"] is not None]
        default = table["configs"].get(table.get("default") or "", {}).get("seconds")
        result = {"table": os.path.basename(path), "label": table["label"], "variant": table["variant"],
                  "threads": table["threads"], "isa": recorded_caps(table).cpu.isa + _on_host(table) + _tag(table), "configs": len(table["configs"]), "failed": len(table["configs"]) - len(ran),
                  "best_ms": min(ran) * 1e3, "default_ms": default * 1e3 if default else None,
                  "random_expected": random_expectation(table), "band": within_band(table)}
        today = todays_default(table)
        result["today_default_ms"] = table["configs"][today]["seconds"] * 1e3 if today else None
        others = other_machines(table, tables)
        hints = hints_of(others)
        result["hints_from"] = sorted({_machine(o) for o in others})
        result["hint_tables"] = len(hints)
        for column, strategy, default, given in (
                ("gp", "gp", None, ()), ("random", "random", None, ()), ("tuner", "gp", table["default"], ()),
                ("tuner_today", "gp", today, ()), ("gp_hints", "gp", None, hints),
                ("tuner_today_hints", "gp", today, hints)):
            if (args.only and column not in args.only) or (column.startswith("tuner_today") and today is None):
                result[column] = None
                continue
            counts = [evaluations_to_reach(table, strategy, seed, args.cap, default=default, hints=given)
                      for seed in range(args.seeds)]
            reached = sorted(c if c is not None else args.cap + 1 for c in counts)
            result[column] = {"median": statistics.median(reached), "p90": reached[int(0.9 * (len(reached) - 1))],
                              "missed": sum(c is None for c in counts)}
            print(f"{result['table']}: {column} median {result[column]['median']} p90 {result[column]['p90']}",
                  file=sys.stderr, flush=True)
        rows.append(result)
    if args.markdown and not args.only:
        print("| space (recorded table) | configurations (failed) | within 5 % of the best | default / best "
              "| GP median (p90) | random median (p90) | random expected | random / GP "
              "| tuner, default first: median (p90) | today's default / best | tuner from today's default: median (p90) "
              "| hints: tables (machines) | search with hints: median (p90) | random / search with hints "
              "| tuner from today's default with hints: median (p90) | random / tuner with hints |")
        print("|" + " --- |" * 16)
        for r in rows:
            ratio = r["random"]["median"] / r["gp"]["median"]
            default = f"{r['default_ms'] / r['best_ms']:.2f}x" if r["default_ms"] else "-"
            print(f"| {r['label']} ({r['variant']}, {r['threads']}T, {r['isa']}) | {r['configs']} ({r['failed']}) | "
                  f"{r['band']} ({r['band'] / r['configs']:.0%}) | {default} | "
                  f"{r['gp']['median']:g} ({r['gp']['p90']}) | {r['random']['median']:g} ({r['random']['p90']}) | "
                  f"{r['random_expected']:.1f} | {ratio:.1f}x | {r['tuner']['median']:g} ({r['tuner']['p90']}) | "
                  + (f"{r['today_default_ms'] / r['best_ms']:.2f}x | {r['tuner_today']['median']:g} "
                     f"({r['tuner_today']['p90']}) |" if r["tuner_today"] else "not in the recorded space | - |")
                  + f" {r['hint_tables']} ({', '.join(r['hints_from'])}) | {r['gp_hints']['median']:g} "
                    f"({r['gp_hints']['p90']}) | {r['random']['median'] / r['gp_hints']['median']:.1f}x | "
                  + (f"{r['tuner_today_hints']['median']:g} ({r['tuner_today_hints']['p90']}) | "
                     f"{r['random']['median'] / r['tuner_today_hints']['median']:.1f}x |" if r["tuner_today_hints"]
                     else "- | - |"))
    else:
        print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
