"""OpenMP worker placement (tracea/runtime/placement.py): a threaded kernel's workers on LLVM's
libomp are kept off the CPU its caller runs on, and nothing is placed where the user chose OpenMP
affinity."""
from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import tracea
from tracea import dialects as td
from tracea.runtime import placement
from tracea.targets.cpu.target import openmp_library

pytestmark = [
    pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="thread affinity is Linux-only"),
    pytest.mark.skipif(openmp_library() is None, reason="LLVM's OpenMP runtime (pip package cmeel-libomp) is not installed"),
]
CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1


@pytest.fixture(autouse=True)
def on_libomp(monkeypatch):
    """Placement is libomp's: with torch installed, threaded kernels run on GNU OpenMP's team."""
    monkeypatch.setenv("TRACEA_OPENMP", "llvm")


def threaded_gemm():
    fn = td.function(td.tensor((64, 32)), td.tensor((32, 48)), name="placed_gemm")(td.gemm)
    return tracea.compile(fn, threads=2)


def test_team_worker_ids_are_this_process_threads():
    kernel = threaded_gemm()  # loads the OpenMP runtime
    ids = placement.team_worker_ids(kernel._libomp, 3)
    assert ids[0] == threading.get_native_id()
    assert len(set(ids)) == 3
    assert {str(i) for i in ids} <= set(os.listdir("/proc/self/task"))
    assert kernel.threads == 2


@pytest.mark.skipif(CPUS < 2, reason="needs 2 CPUs to place a worker off the caller's")
def test_workers_leave_the_callers_cpu(rng):
    kernel = threaded_gemm()
    a, b = rng.standard_normal((64, 32), np.float32), rng.standard_normal((32, 48), np.float32)
    np.testing.assert_allclose(kernel(a, b), a @ b, rtol=1e-4, atol=1e-4)
    team = kernel._frames.frame.team
    if team is None:
        pytest.skip("worker placement is off in this environment (OpenMP affinity set by the user)")
    allowed = os.sched_getaffinity(0)
    assert len(team.workers) == 1 and team.cpu in allowed
    assert os.sched_getaffinity(team.workers[0]) == allowed - {team.cpu}
    assert os.sched_getaffinity(0) == allowed  # the caller itself is never bound


def test_user_affinity_and_knob_turn_placement_off():
    code = ("import numpy as np, tracea; from tracea import dialects as td\n"
            "k = tracea.compile(td.function(td.tensor((8, 8)), td.tensor((8, 8)), name='g')(td.gemm), threads=2)\n"
            "a = np.ones((8, 8), np.float32); assert (k(a, a) == 8).all()\n"
            "print(k._frames.frame.team is None)")
    for env in ({"OMP_PROC_BIND": "true"}, {"TRACEA_PLACE_WORKERS": "0"}):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env={**os.environ, "TRACEA_DISK_CACHE": "0", **env})
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "True", env


@pytest.mark.skipif(CPUS < 2, reason="needs 2 CPUs to place a worker off the caller's")
def test_forked_child_never_places_the_parents_workers(rng):
    kernel = threaded_gemm()
    a, b = rng.standard_normal((64, 32), np.float32), rng.standard_normal((32, 48), np.float32)
    kernel(a, b)
    team = kernel._frames.frame.team
    if team is None:
        pytest.skip("worker placement is off in this environment (OpenMP affinity set by the user)")
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the team it inherited names the parent's threads
        ok = team.workers == [] and np.allclose(kernel(a, b), a @ b, rtol=1e-4, atol=1e-4)
        os.write(write_fd, b"1" if ok else b"0")
        os._exit(0)
    os.close(write_fd)
    answer = os.read(read_fd, 1)
    os.waitpid(pid, 0)
    assert answer == b"1"
    assert team.workers  # the parent's team is untouched
