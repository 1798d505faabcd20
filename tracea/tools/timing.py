"""Timing the way users call: implementations in turn, call by call, no pause between them."""
from __future__ import annotations

import time
from typing import Callable


def interleaved_times(calls: dict[str, Callable], rounds: int, seconds: float = 2.0) -> dict[str, float]:
    """The median seconds of each of `calls`, timed as interleaved_samples does."""
    return _medians(interleaved_samples(calls, rounds, seconds))


def interleaved_samples(calls: dict[str, Callable], rounds: int, seconds: float = 2.0) -> dict[str, list[float]]:
    """Each round calls every implementation once, back to back, no pause (each call meets the
    thread pools the previous one left running): the seconds of every call of each, over at
    least `rounds` rounds and `seconds` of them (a case of a few milliseconds fits whole in one
    of a busy VM's spells with a core missing). The rounds run the implementations in orders
    (round_orders) in which each follows each of the others about equally often: what runs just
    before a call matters (a 2-thread GEMM 256^3 right after a torch op ran 20 % slower than right
    after another Tracea call), and rotating one order put the same one before it every time."""
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for call in calls.values():
        call()  # warm-up
    orders = round_orders(list(calls))
    began, done = time.perf_counter(), 0
    while done < rounds or time.perf_counter() - began < seconds:
        order = orders[done % len(orders)]
        done += 1
        for name in order:
            start = time.perf_counter()
            calls[name]()
            samples[name].append(time.perf_counter() - start)
    return samples


def round_orders(names: list[str]) -> list[list[str]]:
    """Orders of `names` in which each name comes right after each other name equally often
    inside the rounds: a Williams design (the rows of a balanced Latin square, as crossover
    trials use; for an odd count its rows and their reverses)."""
    n = len(names)
    first = [0]
    for j in range(1, n):  # 0, 1, n-1, 2, n-2, ...
        first.append((j + 1) // 2 if j % 2 else n - j // 2)
    rows = [[names[(x + i) % n] for x in first] for i in range(n)]
    return rows if n % 2 == 0 or n == 1 else rows + [list(reversed(r)) for r in rows]


def times_after(target: Callable, before: dict[str, Callable], rounds: int, seconds: float = 2.0) -> dict[str, float]:
    """The median seconds of `target` called right after each of `before` (no pause between the
    two), in rounds that run the predecessors in round_orders: what a kernel keeps of its speed
    when it meets the thread pools another library left running. Give `target` itself as one of
    `before` for its stand-alone speed."""
    samples: dict[str, list[float]] = {name: [] for name in before}
    for call in [*before.values(), target]:
        call()  # warm-up
    orders = round_orders(list(before))
    began, done = time.perf_counter(), 0
    while done < rounds or time.perf_counter() - began < seconds:
        for name in orders[done % len(orders)]:
            before[name]()
            start = time.perf_counter()
            target()
            samples[name].append(time.perf_counter() - start)
        done += 1
    return _medians(samples)


def _medians(samples: dict[str, list[float]]) -> dict[str, float]:
    return {name: sorted(ts)[len(ts) // 2] for name, ts in samples.items()}


def paired_speedups(samples: dict[str, list[float]], name: str) -> dict[str, float]:
    """How much faster `name` ran than each other implementation: the median over the rounds of
    interleaved_samples of other's time / name's time in the same round. Calls of one round run
    within a fraction of a second of each other, so a slow spell of the VM (a core taken away for
    seconds, which slows every call it covers by up to 2x) cancels in each round's ratio instead of
    moving one median more than another by the rounds it happened to cover."""
    own = samples[name]
    return {other: sorted(t / o for t, o in zip(ts, own))[len(own) // 2]
            for other, ts in samples.items() if other != name}
