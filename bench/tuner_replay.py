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
GP with it among its data). Nothing is timed here, so the result is exact for the recorded data.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))


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


def evaluations_to_reach(table: dict, strategy: str, seed: int, cap: int, within: float = 0.05,
                         from_default: bool = False) -> int | None:
    from tracea.tuner.search import Evaluation, search
    from tracea.tuner.space import config_key
    configs = [row["config"] for row in table["configs"].values()]
    times = {config_key(row["config"]): row["seconds"] for row in table["configs"].values()}
    errors = {config_key(row["config"]): row["error"] for row in table["configs"].values()}
    best = min(t for t in times.values() if t is not None)

    def evaluate(batch):
        return [Evaluation(c, times[config_key(c)], errors[config_key(c)]) for c in batch]

    first = table["configs"][table["default"]]["config"] if from_default else None
    result = search(replay_space(configs), evaluate, budget=cap, seed=seed, strategy=strategy, first=first,
                    stop_below=best * (1 + within))
    return result.evaluations_to_reach(best * (1 + within))


def random_expectation(table: dict, within: float = 0.05) -> float:
    """Random search's expected evaluations to reach within `within` of the best: drawing
    without replacement from N configurations of which W qualify, (N + 1) / (W + 1)."""
    times = [r["seconds"] for r in table["configs"].values()]
    best = min(t for t in times if t is not None)
    good = sum(t is not None and t <= best * (1 + within) for t in times)
    return (len(times) + 1) / (good + 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tables", nargs="*", help="recorded tables (default: bench/tuning_spaces/*.json)")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--cap", type=int, default=150, help="evaluations before a run counts as not reaching it")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    paths = args.tables or sorted(glob.glob(os.path.join(HERE, "tuning_spaces", "*.json")))
    if not paths:
        print("no recorded tables: run scripts/record_tuning_space.py first", file=sys.stderr)
        return 1
    rows = []
    for path in paths:
        table = json.load(open(path))
        ran = [r["seconds"] for r in table["configs"].values() if r["seconds"] is not None]
        default = table["configs"].get(table.get("default") or "", {}).get("seconds")
        result = {"table": os.path.basename(path), "label": table["label"], "variant": table["variant"],
                  "threads": table["threads"], "configs": len(table["configs"]), "failed": len(table["configs"]) - len(ran),
                  "best_ms": min(ran) * 1e3, "default_ms": default * 1e3 if default else None,
                  "random_expected": random_expectation(table)}
        for column, strategy, from_default in (("gp", "gp", False), ("random", "random", False), ("tuner", "gp", True)):
            counts = [evaluations_to_reach(table, strategy, seed, args.cap, from_default=from_default)
                      for seed in range(args.seeds)]
            reached = sorted(c if c is not None else args.cap + 1 for c in counts)
            result[column] = {"median": statistics.median(reached), "p90": reached[int(0.9 * (len(reached) - 1))],
                              "missed": sum(c is None for c in counts)}
            print(f"{result['table']}: {column} median {result[column]['median']} p90 {result[column]['p90']}",
                  file=sys.stderr, flush=True)
        rows.append(result)
    if args.markdown:
        print("| space (recorded table) | configurations (failed) | default / best | GP median (p90) | random median (p90) "
              "| random expected | random / GP | tuner, default first: median (p90) |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for r in rows:
            ratio = r["random"]["median"] / r["gp"]["median"]
            default = f"{r['default_ms'] / r['best_ms']:.2f}x" if r["default_ms"] else "-"
            print(f"| {r['label']} ({r['variant']}, {r['threads']}T) | {r['configs']} ({r['failed']}) | {default} | "
                  f"{r['gp']['median']:g} ({r['gp']['p90']}) | {r['random']['median']:g} ({r['random']['p90']}) | "
                  f"{r['random_expected']:.1f} | {ratio:.1f}x | {r['tuner']['median']:g} ({r['tuner']['p90']}) |")
    else:
        print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
