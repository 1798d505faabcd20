"""`tracea doctor`: the machine's profile, its toolchains, and per op and precision the kernel
variant each device would run, with the ones that fit after it and why the others do not."""
from __future__ import annotations

import dataclasses

from ..runtime import blas_threads
from .capabilities import Capabilities, probe_nvidia
from .engine import PlanError, devices, plan
from .toolchains import toolchains
from ..codegen.variants import DTYPES, FEATURES, OPS, Problem, variants
from ..tuner import TIMED_BACKENDS


def report(targets: list[Capabilities] | None = None) -> dict:
    """Everything the doctor prints, as plain data (`tracea doctor --json`)."""
    nvidia = probe_nvidia()
    targets = targets if targets is not None else devices()
    plans = []
    for caps in targets:
        for op in OPS:
            for dtype in DTYPES:
                entry = {"device": caps.name, "op": op, "precision": dtype.upper()}
                try:
                    d = plan(Problem(op, dtype), caps)
                    entry.update(variant=d.variant_id, conditions=list(d.conditions), also=list(d.ranking[1:]),
                                 rejected=[list(r) for r in d.rejected],
                                 schedule=d.schedule.as_dict() if d.schedule is not None else None)
                except PlanError as e:
                    entry.update(variant=None, error=str(e))
                plans.append(entry)
    return {
        "devices": [{"name": c.name, "backend": c.backend, "summary": c.describe(),
                     "cpu" if c.cpu else "gpu": dataclasses.asdict(c.cpu or c.gpu)} for c in targets],
        "nvidia_probe": nvidia if isinstance(nvidia, str) else f"{len(nvidia)} device(s)",
        "toolchains": [dataclasses.asdict(t) for t in toolchains()],
        "thread_pools": blas_threads.status(),
        "variants": [{"id": v.id, "backend": v.backend, "ops": list(v.ops), "priority": v.priority,
                      "constraints": [str(c) for c in v.constraints], "summary": v.summary} for v in variants()],
        "plans": plans,
    }


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]


def format_report(data: dict) -> str:
    lines = ["Devices"]
    lines += [f"  {d['summary']}" for d in data["devices"]]
    lines.append(f"  NVIDIA GPUs: {data['nvidia_probe']}")
    lines += ["", "Toolchains"]
    lines += _table([[t["name"], (t["version"] or "found") if t["found"] else "MISSING",
                      t["purpose"] if t["found"] else t["missing"]] for t in data["toolchains"]])
    pools = data["thread_pools"]
    lines += ["", "Other thread pools (sharing the cores with Tracea's; TRACEA_SHARE_CORES)"]
    lines += _table([["OpenBLAS", f"{path}: {how}"] for path, how in pools["openblas"].items()]
                    + [["GNU OpenMP (torch)", pools["gnu_openmp"]]])
    for device in data["devices"]:
        rows = [["OP", "PRECISION", "VARIANT", "ALSO FITS", "IF / WHY NOT"]]
        for p in (p for p in data["plans"] if p["device"] == device["name"]):
            if p["variant"] is None:
                rows.append([p["op"], p["precision"], "-", "-", p["error"].split(": ", 1)[-1]])
            else:
                rows.append([p["op"], p["precision"], p["variant"], ", ".join(p["also"]) or "-",
                             "; ".join(p["conditions"]) or "-"])
        lines += ["", f"Kernel variants on {device['name']} ({device['backend']}), best first"] + _table(rows)
    return "\n".join(lines)


# the seeds' backends, in their order; a backend with no variant yet shows none of the features
BACKENDS = {"cuda": "CUDA", "rocm": "ROCm", "metal": "Metal", "vulkan": "Vulkan", "cpu": "CPU"}


def support_matrix() -> str:
    """docs/BACKENDS.md: the backend support matrix and every variant, from the registry."""
    registered = variants()
    # Auto-Tuning: a variant with a search space on a backend the tuner can time kernels on
    has = {b: set().union(*[v.features | ({"autotune"} if v.search_space and b in TIMED_BACKENDS else set())
                            for v in registered if v.backend == b]) for b in BACKENDS}
    lines = ["# Backends and kernel variants", "",
             "Generated from the variant registry (`tracea/doctor`) by "
             "`python -c 'from tracea.doctor.report import support_matrix; print(support_matrix(), end=\"\")'`; "
             "test_doctor.py fails when this page and the registry disagree. `tracea doctor` shows which "
             "variant each op gets on a device.", "",
             "## Support matrix", "",
             "● the backend has a kernel variant with the feature; × it has none ("
             + "".join(f"{BACKENDS[b]}: no variants yet; " for b in BACKENDS if not any(v.backend == b for v in registered))
             + "the tuner times kernels on the CPU and on Vulkan devices: `tracea tune`).", "",
             "| Feature | " + " | ".join(BACKENDS.values()) + " |", "| :--- |" + " :---: |" * len(BACKENDS)]
    for key, label in FEATURES.items():
        lines.append(f"| {label} | " + " | ".join("●" if key in has[b] else "×" for b in BACKENDS) + " |")
    lines += ["", "## Variants", "",
              "Highest priority first; the Doctor takes the first whose constraints hold.", "",
              "| Variant | Ops | Priority | Constraints | What it is |", "| :--- | :--- | ---: | :--- | :--- |"]
    for v in sorted(registered, key=lambda v: (list(BACKENDS).index(v.backend), -v.priority, v.id)):
        constraints = "; ".join(str(c) for c in v.constraints)
        lines.append(f"| `{v.id}` | {', '.join(v.ops)} | {v.priority} | {constraints} | {v.summary} |")
    return "\n".join(lines) + "\n"
