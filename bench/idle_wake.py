"""What a 2-thread call pays after the process sat idle: Tracea's kernel and torch's op, each timed
right after a pause of 0-20 ms, in one process.

    .venv/bin/python bench/idle_wake.py
    .venv/bin/python bench/idle_wake.py --pauses 0,1,5 --rounds 200

A pause lets the OpenMP team's second thread stop spinning (GNU OpenMP: GOMP_SPINCOUNT, by default
~7 ms) and sleep; the next parallel call wakes it and waits for it at the end of
its parallel region. How long that takes is the machine's: on a VM whose idle vCPU halts at once
(e.g. cpuidle's haltpoll with guest_halt_poll_ns=0) the host may have given the core away. Both
calls run on the same threads (torch's; runtime/gnu_openmp.py), so a wake-up that costs torch's op
as much as Tracea's kernel is not Tracea's doing. A third call uses no thread pool at all: numpy
copying 8 MiB (layer norm 512x4096's input) on the calling thread. What it loses after a pause is
the caches': called back to back, its data stays in the L3 (32 MiB, shared with the host's other
tenants), and after 1 ms, idle or busy, part of it is gone (on this project's Zen 5 VM 8 MiB
copied in 0.14 ms back to back, 0.17-0.19 ms after 1 ms asleep or spinning). Prints the median,
10th and 90th percentile of each call after each pause; nothing is asserted.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))


def percentiles(call, pause: float, rounds: int) -> tuple[float, float, float]:
    times = []
    for _ in range(rounds):
        if pause:
            time.sleep(pause)
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    times.sort()
    return times[rounds // 10], times[rounds // 2], times[9 * rounds // 10]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pauses", default="0,0.5,1,2,5,20", help="idle pauses in ms (comma-separated)")
    parser.add_argument("--rounds", type=int, default=100)
    args = parser.parse_args()
    for name in ("OMP_NUM_THREADS", "TRACEA_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(name, "2")
    import numpy as np
    import tracea
    import torch
    from tracea import dialects as td
    torch.set_num_threads(2)
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((1, 768)).astype(np.float32), rng.standard_normal((2304, 768)).astype(np.float32)
    linear = tracea.compile(td.function(td.tensor((1, 768)), td.tensor((2304, 768)), name="linear")(
        lambda a, b: td.gemm(a, b, transpose_b=True)), threads=2)
    big = torch.ones(1 << 20)
    source, copy = np.ones(1 << 21, np.float32), np.empty(1 << 21, np.float32)
    calls = {"Tracea linear 1x2304x768 (B^T)": lambda: linear(x, w),
             "torch add, 4 MB": lambda: torch.add(big, big),
             "numpy copy, 8 MB, 1 thread": lambda: np.copyto(copy, source)}
    for call in calls.values():
        call()
    print(f"{torch.get_num_threads()} threads; median (10th-90th percentile) in us, {args.rounds} calls each")
    for pause_ms in (float(p) for p in args.pauses.split(",")):
        cells = []
        for name, call in calls.items():
            low, mid, high = (t * 1e6 for t in percentiles(call, pause_ms / 1e3, args.rounds))
            cells.append(f"{name} {mid:7.0f} ({low:.0f}-{high:.0f})")
        print(f"after {pause_ms:4g} ms idle: " + "   ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
