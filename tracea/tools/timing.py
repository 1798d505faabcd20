"""Timing the way users call: implementations in turn, call by call, no pause between them."""
from __future__ import annotations

import time
from typing import Callable


def interleaved_times(calls: dict[str, Callable], rounds: int, seconds: float = 2.0) -> dict[str, float]:
    """The median seconds of each of `calls`, timed as interleaved_samples does."""
    return {name: sorted(ts)[len(ts) // 2] for name, ts in interleaved_samples(calls, rounds, seconds).items()}


def interleaved_samples(calls: dict[str, Callable], rounds: int, seconds: float = 2.0) -> dict[str, list[float]]:
    """Each round calls every implementation once, back to back, no pause (each call meets the
    thread pools the previous one left running): the median seconds of each, over at least
    `rounds` rounds and `seconds` of them (a case of a few milliseconds fits whole in one of a
    busy VM's spells with a core missing): the seconds of every call of each. Each round starts one implementation further on, so
    each follows each of the others equally often (a small 2-thread kernel called right after a
    torch op ran 7-10 % slower than the same code called after Tracea's)."""
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for call in calls.values():
        call()  # warm-up
    order = list(calls.items())
    began, done = time.perf_counter(), 0
    while done < rounds or time.perf_counter() - began < seconds:
        shift = done % len(order)
        done += 1
        for name, call in order[shift:] + order[:shift]:
            start = time.perf_counter()
            call()
            samples[name].append(time.perf_counter() - start)
    return samples
