"""Keeping a threaded kernel's OpenMP workers off the CPU its caller runs on (Linux).

Why: between calls an OpenMP worker sleeps (after KMP_BLOCKTIME), and the caller's next parallel
region wakes it. Linux tends to wake a thread onto the waker's CPU; on a machine with few cores
the worker then shares that CPU with the caller (thread 0 of the same team) until the load
balancer moves one of them, which was measured to take tens of milliseconds: a 2-thread conv
ran at half speed, block after block, once other thread pools (torch, IREE) had run in the
process. OMP_PROC_BIND avoids it but pins the caller's thread too, which then starves every
other library the caller uses. Here only the workers are restricted: to the CPUs the caller may
use, minus the one it is on. Each call costs one getcpu (a vDSO call); the workers' masks change
only when the caller has moved.

The worker threads are learned once per calling thread and team size, by running a parallel
region whose threads report their ids (each calling thread is its own OpenMP root with its own
team). Nothing is done when the user chose OpenMP affinity (OMP_PROC_BIND, OMP_PLACES,
KMP_AFFINITY), when the team is larger than the caller's CPUs, off Linux, or with
TRACEA_PLACE_WORKERS=0.
"""
from __future__ import annotations

import ctypes
import os
import threading
import weakref

from .. import knobs

_USER_AFFINITY = ("OMP_PROC_BIND", "OMP_PLACES", "KMP_AFFINITY", "GOMP_CPU_AFFINITY")


class _Ident(ctypes.Structure):  # libomp's source-location record (ident_t), required by its entry points
    _fields_ = [("reserved_1", ctypes.c_int32), ("flags", ctypes.c_int32), ("reserved_2", ctypes.c_int32),
                ("reserved_3", ctypes.c_int32), ("psource", ctypes.c_char_p)]


_IDENT = _Ident(0, 2, 0, 0, b";tracea;worker placement;0;0;;")  # flags 2: KMP_IDENT_KMPC
_MICROTASK = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_int32))


def team_worker_ids(libomp: ctypes.CDLL, size: int) -> list[int]:
    """The OS thread ids of the calling thread's OpenMP team of `size` threads, thread 0 (the
    caller) first: the threads a kernel's `omp parallel num_threads(size)` runs on."""
    ids = [0] * size

    def report(global_id, bound_id):
        ids[libomp.omp_get_thread_num()] = threading.get_native_id()

    microtask = _MICROTASK(report)
    ident = ctypes.byref(_IDENT)
    libomp.__kmpc_push_num_threads(ident, libomp.__kmpc_global_thread_num(ident), size)
    libomp.__kmpc_fork_call(ident, 0, microtask)
    return ids


def _libc_getcpu():
    try:
        return ctypes.CDLL(None).sched_getcpu
    except AttributeError:  # not glibc
        return None


current_cpu = _libc_getcpu()  # () -> the CPU the calling thread runs on


class Team:
    """The workers of one calling thread's team. Before each call: `if current_cpu() != team.cpu:
    team.place(current_cpu())` (inlined by the caller: it runs on every kernel call)."""

    def __init__(self, workers: list[int], allowed: set[int]):
        self.workers, self.allowed, self.cpu = workers, allowed, -1

    def place(self, cpu: int) -> None:
        self.cpu = cpu
        try:
            for worker in self.workers:
                os.sched_setaffinity(worker, self.allowed - {cpu})
        except OSError:  # a worker gone (the runtime shut down) or not ours to place: stop trying
            self.workers = []


_teams = threading.local()  # per calling thread: team size -> Team | None
_all_teams: "weakref.WeakSet[Team]" = weakref.WeakSet()  # also those kernels' call frames hold


def team_of_this_thread(libomp: ctypes.CDLL, threads: int) -> Team | None:
    """The calling thread's team of `threads` OpenMP threads to place, or None where placement does
    not apply (see the module's documentation)."""
    by_size = getattr(_teams, "by_size", None)
    if by_size is None:
        by_size = _teams.by_size = {}
    if threads not in by_size:
        by_size[threads] = None
        allowed = os.sched_getaffinity(0) if hasattr(os, "sched_setaffinity") else set()
        if (2 <= threads <= len(allowed) and current_cpu is not None and knobs.place_workers()
                and not any(os.environ.get(name) for name in _USER_AFFINITY)):
            by_size[threads] = Team(team_worker_ids(libomp, threads)[1:], allowed)
            _all_teams.add(by_size[threads])
    return by_size[threads]


def _forget_in_child() -> None:
    # A forked child has none of its parent's worker threads, and their ids must never be placed
    # from it (they are the parent's threads): teams kernels already hold stop placing, new
    # callers learn the child's own workers.
    global _teams
    _teams = threading.local()
    for team in list(_all_teams):
        team.workers = []


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
