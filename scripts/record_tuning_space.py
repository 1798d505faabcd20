"""Time every configuration of a variant's search space on this machine and save the table, the
data bench/tuner_replay.py replays the tuner and random search on (issue 25, item 3).

    .venv/bin/python scripts/record_tuning_space.py gemm-512 --threads 1
    .venv/bin/python scripts/record_tuning_space.py all --threads 1      # every problem below
    .venv/bin/python scripts/record_tuning_space.py gemm-512 --device vulkan:0   # on a Vulkan device
    .venv/bin/python scripts/record_tuning_space.py all --tag zen5   # names the machine kind

Writes bench/tuning_spaces/<problem>-<threads>t-<isa>[-<tag>].json (avx2, avx512, ...: the host's
vectors; <isa>-on-<host's isa> when TRACEA_CPU plans for a narrower ISA than the host's, e.g.
TRACEA_CPU=zen3-avx2 on an AVX-512 host, the table's machine then naming both; <problem>-vulkan.json on a Vulkan device): the machine (CPU record, model name, kernel; the device and its driver), the date, the space, and per configuration its time (the lower of two passes' medians,
the second pass in reverse order) with each pass's samples, or its error. Takes minutes per
problem: each configuration is compiled (in worker processes) and timed twice.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
OUT = os.path.join(HERE, "..", "bench", "tuning_spaces")


def problems():
    from tracea import dialects as td

    def gemm(m, n, k):
        return td.function(td.tensor((m, k)), td.tensor((k, n)), name="kernel")(td.gemm)

    def conv():  # ResNet's 3x3 conv on 56x56 NHWC: the implicit GEMM's space
        return td.function(td.tensor((1, 56, 56, 64)), td.tensor((3, 3, 64, 64)), name="kernel")(
            lambda x, w: td.conv2d(x, w, padding=1, layout="nhwc"))

    def attention(s, d):
        spec = td.tensor((1, 8, s, d))
        return td.function(spec, spec, spec, name="kernel")(lambda q, k, v: td.attention(q, k, v))

    return {"gemm-512": lambda: gemm(512, 512, 512), "linear-128x1024x1024": lambda: gemm(128, 1024, 1024),
            "conv3x3-nhwc-56": conv, "attention-s512-d64": lambda: attention(512, 64)}


def machine(device) -> dict:
    from tracea.doctor import host
    model = ""
    try:
        model = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    found = {"cpu": host().describe(), "model": model, "kernel": platform.release()}
    if narrower_than_host():  # TRACEA_CPU plans (and compiles) for a narrower ISA than the host's
        from tracea.doctor.capabilities import probe_cpu
        found["host"] = probe_cpu().describe()
    if device.backend != "cpu":
        found["device"] = device.describe()
    return found


def narrower_than_host() -> str | None:
    """The host's ISA when the plan is for a narrower one (TRACEA_CPU=zen3-avx2 on AVX-512)."""
    from tracea.doctor.capabilities import host_cpu, probe_cpu
    planned, found = host_cpu(), probe_cpu()
    return found.isa if planned.arch == found.arch and planned.isa != found.isa else None


def record(name: str, threads: int, workers: int, device: str = "cpu", tag: str = "") -> str:
    from tracea.codegen.variants import variant
    from tracea.doctor import plan
    from tracea.tuner.autotuner import AutoTuner, configuration_of
    from tracea.tuner.measure import TuningProblem
    from tracea.tuner.space import config_key

    tp = TuningProblem.of(problems()[name]())
    tuner = AutoTuner(device, threads=threads if device == "cpu" else None, workers=workers, progress=False)
    threads, workers = tuner.threads, tuner.workers  # a GPU's kernels: threads 1, compiled here
    decision = plan(tp.problem, tuner.caps, threads, tuned=False)
    chosen = variant(decision.variant_id)
    space = tuner._space(chosen, tp).include(decision.schedule)
    complete = tuner._completer(chosen, tp)
    configs = space.configurations()
    measurer = tuner.measurer(tp, chosen.id)
    table, began = {}, time.perf_counter()
    try:
        # two passes, the second in reverse order, each configuration keeping the lower median: a
        # recording takes minutes, and a configuration timed in a slow minute of the VM would
        # otherwise look slower than one timed in a quick minute
        for rank, order in enumerate((configs, configs[::-1])):
            step = max(1, workers) if rank == 0 else 1  # the second pass finds every kernel compiled
            for start in range(0, len(order), step):
                batch = order[start:start + step]
                for e in measurer.evaluate([(c, complete(space.schedule(c))) for c in batch]):
                    row = table.setdefault(config_key(e.config), {"config": e.config, "passes": []})
                    row["passes"].append({"seconds": e.seconds, "error": e.error, "samples": e.samples})
                done = min(start + len(batch), len(order))
                print(f"{name}: pass {rank + 1}, {done}/{len(order)} configurations, "
                      f"{time.perf_counter() - began:.0f} s", file=sys.stderr, flush=True)
    finally:
        measurer.close()
    for row in table.values():
        ran = [p["seconds"] for p in row["passes"] if p["seconds"] is not None]
        row["seconds"] = min(ran) if len(ran) == len(row["passes"]) else None
        row["error"] = next((p["error"] for p in row["passes"] if p["error"]), None)
    found = configuration_of(space, complete, decision.schedule)
    default = config_key(found) if found is not None else None
    data = {"problem": name, "label": tp.label, "variant": chosen.id, "threads": threads,
            "machine": machine(tuner.caps) | ({"tag": tag} if tag else {}),
            "date": datetime.date.today().isoformat(), "space": space.describe(), "default": default,
            "seconds": round(time.perf_counter() - began, 1), "configs": table}
    os.makedirs(OUT, exist_ok=True)
    cpu = tuner.caps.backend == "cpu"
    on = f"-on-{narrower_than_host()}" if cpu and narrower_than_host() else ""
    suffix = f"-{tag}" if tag else ""
    path = os.path.join(OUT, f"{name}-{threads}t-{tuner.caps.cpu.isa}{on}{suffix}.json" if cpu else f"{name}-vulkan{suffix}.json")
    with open(path, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    return path


def _tag(text: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_.-]*", text) or text.startswith("."):
        raise argparse.ArgumentTypeError(f"{text!r}: a tag is a word of letters, digits, '_', '-' or '.' (it ends the file's name)")
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("problem", choices=[*problems(), "all"])
    parser.add_argument("--threads", type=int, default=1, help="threads the kernels run on (default 1)")
    parser.add_argument("--workers", type=int, default=2, help="compile worker processes (default 2)")
    parser.add_argument("--device", default="cpu", help="cpu (default) or a Vulkan device of this machine, vulkan:N")
    parser.add_argument("--tag", default="", type=_tag, help="the machine kind (zen5, ...): named in the table and its "
                        "file, so tables of several machines of one ISA sit side by side")
    args = parser.parse_args()
    for name in (list(problems()) if args.problem == "all" else [args.problem]):
        print(record(name, args.threads, args.workers, args.device, args.tag))
    return 0


if __name__ == "__main__":
    sys.exit(main())
