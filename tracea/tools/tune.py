"""`tracea tune` and `tracea cache`: the tuner and its cache from the command line."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ..errors import TraceaError


def _load_model(spec: str):
    """FILE.py:FUNCTION -> (module, example inputs) from calling FUNCTION()."""
    import importlib.util
    path, _, name = spec.rpartition(":")
    if not Path(path).is_file():
        raise TraceaError(f"no such file: {path}")
    module_spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    build = getattr(module, name, None)
    if not callable(build):
        raise TraceaError(f"{path} has no function {name!r}")
    made = build()
    if not (isinstance(made, tuple) and len(made) == 2):
        raise TraceaError(f"{spec}() must return (torch.nn.Module, tuple of example inputs); got {type(made).__name__}")
    return made


def run_tune(args) -> int:
    from ..tuner.autotuner import AutoTuner, tune_program
    tuner = AutoTuner(args.device, threads=args.threads, budget=args.budget, seconds=args.seconds,
                      workers=args.workers, progress=not args.quiet, seed=args.seed, retune=args.retune)
    if args.input.endswith(".py") or ".py:" in args.input:
        if tuner.caps.backend != "cpu":
            raise TraceaError(f"a PyTorch model is compiled for the CPU; tune its ops with --device cpu, or tune an "
                              f".mlir file's ops on {args.device}")
        if ".py:" not in args.input:
            raise TraceaError(f"name the function that builds the model: {args.input}:build")
        import tracea
        model, inputs = _load_model(args.input)
        tracea.compile(model, inputs, tune=tuner)  # tunes its kernel ops, then compiles with their schedules
        results = tuner.results
    else:
        source = Path(args.input)
        if not source.is_file():
            raise TraceaError(f"no such file: {source}")
        results = tune_program(source, tuner)
    if not results:
        print("nothing to tune: no gemm / fused_gemm / conv2d / attention op without a schedule of its own")
    for r in results:
        print(r.describe())
    print(f"tuning cache: {tuner.cache.path}")
    return 0


def run_cache(args) -> int:
    from ..doctor import devices
    from ..tuner.cache import TuningCache, environment
    cache = TuningCache()
    if args.action == "clear":
        print(f"removed {cache.clear()} entries from {cache.path}")
        return 0
    entries = cache.entries()
    here = [environment(device) for device in devices()]  # the CPU's, and each GPU's with its driver
    if args.action == "list":
        rows = [{"key": key, "label": e.get("label"), "variant": e.get("variant"), "threads": e.get("threads"),
                 "seconds": e.get("seconds"), "default_seconds": e.get("default_seconds"),
                 "configurations": len(e["configs"]), "fresh": e.get("environment") in here, "tuned": e.get("tuned")}
                for key, e in sorted(entries.items(), key=lambda kv: kv[1].get("label") or "")]
        if args.json:
            print(json.dumps(rows, indent=1))
            return 0
        print(f"{cache.path}: {len(rows)} entries")
        for r in rows:
            ms = f"{r['seconds'] * 1e3:.3f} ms" if r["seconds"] else "-"
            gain = f" ({r['default_seconds'] / r['seconds']:.2f}x default)" if r["seconds"] and r["default_seconds"] else ""
            state = "" if r["fresh"] else " [stale: measured with other versions; re-checked when tuned again]"
            print(f"{r['key'][:12]}  {r['label']}  {r['variant']} {r['threads']}T  {ms}{gain}  "
                  f"{r['configurations']} configurations  {r['tuned']}{state}")
        return 0
    if not args.key:
        print("tracea cache show: give an entry's key (or a prefix of it: see tracea cache list)", file=sys.stderr)
        return 2
    found = [k for k in entries if k.startswith(args.key)]
    if len(found) != 1:
        print(f"tracea cache show: {'no entry' if not found else f'{len(found)} entries'} with a key starting "
              f"{args.key!r} in {cache.path}", file=sys.stderr)
        return 1
    entry = entries[found[0]]
    if args.json:
        print(json.dumps({"key": found[0], **entry}, indent=1))
        return 0
    print(f"{found[0]}: {entry.get('label')} on {entry.get('variant')}, {entry.get('threads')} threads, {entry.get('device')}")
    print(f"  schedule: {entry.get('schedule')}  tuned {entry.get('tuned')}  environment {entry.get('environment')}")
    print(f"  space: {entry.get('space')}")
    ranked = sorted(entry["configs"].values(), key=lambda c: (c["seconds"] is None, c["seconds"] or 0))
    for c in ranked:
        what = f"{c['seconds'] * 1e3:.3f} ms" if c["seconds"] is not None else f"failed: {c['error']}"
        print(f"  {what:>12}  {c['config']}")
    return 0
