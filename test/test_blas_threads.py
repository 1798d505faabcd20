"""Other libraries' thread pools leave the cores to Tracea's (runtime/blas_threads.py): numpy's
OpenBLAS runs its jobs on Tracea's OpenMP threads once a threaded kernel is loaded (results
unchanged), and Tracea's kernels run on torch's GNU OpenMP threads, which spin a few ms after a
torch op, then sleep. Checked by the CPU time the other threads take a moment after numpy or torch returns (from
/proc), not by timing."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from tracea.runtime import blas_threads

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="needs Linux's /proc")

# The scripts' threaded kernel is a 64x64 @ 64x128 GEMM: N spans several register-tile columns on
# every host (a 32-wide GEMM is one 16-lane AVX-512 column, one work item: a kernel without threads).


RESULTS = textwrap.dedent("""
    import numpy as np
    import tracea
    from tracea import dialects as td
    from tracea.runtime import blas_threads
    tracea.compile(td.function(td.tensor((64, 64)), td.tensor((64, 128)), name="k")(td.gemm), threads=2)
    if not any("openblas" in path for path in blas_threads.shared):
        print("skip: numpy here is not built on OpenBLAS")
        raise SystemExit
    rng = np.random.default_rng(0)
    for m, k, n in [(3, 5, 7), (300, 200, 100), (513, 257, 1031), (1024, 64, 1024)]:
        for dtype, rtol in ((np.float32, 2e-5), (np.float64, 1e-12)):
            a, b = rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((n, k)).astype(dtype)
            want = a.astype(np.longdouble) @ b.T.astype(np.longdouble)
            scale = np.abs(a).astype(np.float64) @ np.abs(b.T).astype(np.float64)
            for got in (a @ b.T, np.dot(a, b.T), (b @ a.T).T):
                assert np.all(np.abs(got - want) <= rtol * scale + 1e-30), (m, k, n, dtype)
    print("ok")
""")


def _run(script: str, **env) -> str:
    """In a fresh process (its own thread pools; `env` on top of this one's, None removing a
    variable), with a deadline: a job OpenBLAS waits for that never runs would hang it. On the
    deadline its whole process group goes, forked children too (a hung one spins on a core)."""
    environment = {**os.environ, "OPENBLAS_NUM_THREADS": "2", **env}
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True,
                               env={k: v for k, v in environment.items() if v is not None})
    try:
        stdout, stderr = process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        pytest.fail("a process hung with Tracea's kernels or numpy's jobs on OpenMP threads (a job that never "
                    "ran, or a team lost in a fork?)")
    assert process.returncode == 0, stderr
    return stdout.strip()


def test_numpy_computes_the_same_on_tracea_threads():
    out = _run(RESULTS)
    if out.startswith("skip"):
        pytest.skip(out[len("skip: "):])
    assert out == "ok"


BUSY = textwrap.dedent("""
    import os, threading, time

    def on_cpu_ns():  # the time this process's other threads have spent on a CPU (schedstat: exact)
        me, total = str(threading.get_native_id()), 0
        for task in os.listdir("/proc/self/task"):
            try:
                total += int(open(f"/proc/self/task/{task}/schedstat").read().split()[0]) if task != me else 0
            except OSError:  # a thread gone meanwhile
                pass
        return total

    def busy_after(work, pause, rounds):
        # The share of `rounds` pauses right after `work` that the other threads spent on a CPU:
        # ~1 while a pool spins, ~0 once it sleeps. Not a thread state: on a loaded machine a
        # thread waiting for a core is "R" without running.
        busy = paused = 0
        for _ in range(rounds):
            work()
            before, start = on_cpu_ns(), time.perf_counter_ns()
            time.sleep(pause)
            busy, paused = busy + on_cpu_ns() - before, paused + time.perf_counter_ns() - start
        return round(busy / paused, 3)

""")

SPINNERS = BUSY + textwrap.dedent("""
    import numpy as np
    import tracea
    from tracea import dialects as td
    k = tracea.compile(td.function(td.tensor((64, 64)), td.tensor((64, 128)), name="k")(td.gemm), threads=2)
    a = np.random.default_rng(0).standard_normal((768, 768)).astype(np.float32)
    a @ a
    if os.fork() == 0:  # OpenBLAS stops its workers at a fork, and starts new ones at its next call
        os._exit(0)
    os.wait()
    # OpenBLAS's own workers spin 0.1-0.25 s after a call; Tracea's team 1 ms (libomp) or ~7 (GNU OpenMP)
    print(busy_after(lambda: a @ a, 0.1, 8))
""")


@pytest.mark.parametrize("share", ["1", "0"])
def test_no_openblas_worker_spins_after_numpy_returns(share):
    busy = float(_run(SPINNERS, TRACEA_SHARE_CORES=share).split()[-1])
    if share == "1":
        assert busy < 0.15, f"other threads ran {busy:.0%} of the 100 ms after numpy returned: OpenBLAS's workers " \
                           "spin (its own pool kept, or new workers started after a fork)"
    elif busy < 0.2:
        pytest.skip("this OpenBLAS does not spin after a call (the control shows nothing to fix)")


TORCH_SPINNERS = BUSY + textwrap.dedent("""
    import sys
    if sys.argv[1] == "torch first":
        import torch
    import tracea
    import torch
    torch.set_num_threads(2)
    x = torch.randn(1, 32, 64, 64)
    w = torch.randn(32, 32, 3, 3)
    conv = lambda: torch.nn.functional.conv2d(x, w, padding=1)
    # GNU OpenMP's default spin lasts ~7 ms (~1 ms at GOMP_SPINCOUNT=40000, ~70 us at 3000): of
    # the 20 ms after each op a worker spins ~0.35 (0.05, 0.005), of 100 ms ~0.07. A spin is a
    # count of pauses, so its CPU time holds on a loaded machine too, where a worker waiting for a
    # core loses no spins
    print(os.environ.get("GOMP_SPINCOUNT"), busy_after(conv, 0.02, 7), busy_after(conv, 0.1, 5))
""")


@pytest.mark.parametrize("order", ["tracea first", "torch first"])
def test_torch_threads_stay_awake_for_the_next_kernel_then_sleep(order):
    """Tracea's kernels run on torch's GNU OpenMP threads, whose spin is libgomp's default in
    either import order: right after a torch op they must be spinning for a few ms (with ~1 ms,
    half of bench/cpu.py's 2-thread kernels called 1 ms after the last parallel call kept less
    than 0.9x of their speed, Zen 5; with ~70 us even right after a torch op), and asleep after that, not spinning on the
    cores for good (OMP_WAIT_POLICY=active). Measured as the CPU time torch's other threads take
    in the 20 and 100 ms after an op (from /proc), not by timing."""
    pytest.importorskip("torch")
    spin_count, soon, later = _run(TORCH_SPINNERS.replace("sys.argv[1]", repr(order)), GOMP_SPINCOUNT=None,
                                   OMP_WAIT_POLICY=None).split()[-3:]
    assert spin_count == "None", "import tracea set GOMP_SPINCOUNT"
    assert float(soon) > 0.1, f"torch's threads ran {float(soon) * 20:.2f} ms of the 20 after its op returned: " \
                              "they sleep before the next kernel comes (~7 ms of spinning wanted)"
    assert float(later) < 0.3, f"torch's threads ran {float(later):.0%} of the 100 ms after its op returned"


STATUS = textwrap.dedent("""
    import sys
    if sys.argv[1] == "torch first":
        import torch
    import tracea
    import torch
    from tracea import dialects as td
    from tracea.doctor.report import format_report, report
    from tracea.runtime import blas_threads
    before = blas_threads.status()
    tracea.compile(td.function(td.tensor((64, 64)), td.tensor((64, 128)), name="k")(td.gemm), threads=2)
    after = blas_threads.status()
    print(repr((before, after, "Other thread pools" in format_report(report()))))
""")


@pytest.mark.parametrize("order", ["tracea first", "torch first"])
def test_the_doctor_says_how_other_pools_share_the_cores(order):
    pytest.importorskip("torch")
    import ast
    script = STATUS.replace('sys.argv[1]', repr(order))
    before, after, shown = ast.literal_eval(_run(script, GOMP_SPINCOUNT=None, OMP_WAIT_POLICY=None).splitlines()[-1])
    assert shown
    assert before["gnu_openmp"].startswith("idle threads spin its default (~7 ms)")
    if order == "torch first":
        assert "Tracea's threaded kernels run on its threads" in before["gnu_openmp"]
    if after["openblas"]:  # numpy on OpenBLAS
        assert all("until a threaded Tracea kernel" in how for how in before["openblas"].values())
        assert any(how.startswith("runs its jobs on Tracea's OpenMP threads") for how in after["openblas"].values())


ON_TORCH_THREADS = textwrap.dedent("""
    import os, sys
    if sys.argv[1] == "torch first":
        import torch  # its GNU OpenMP spins its default (runtime/gnu_openmp.py)
    import numpy as np
    import tracea
    import torch  # tracea first: tracea loaded torch's libgomp, which torch finds loaded
    from tracea import dialects as td
    torch.set_num_threads(2)
    rng = np.random.default_rng(0)
    torch.mm(torch.randn(256, 256), torch.randn(256, 256))  # torch's worker thread exists now
    threads_before = len(os.listdir("/proc/self/task"))
    runtimes = set()
    for threads in (2, 3):  # 3: shares of unequal size, and loops with fewer iterations than threads
        for m in (1, 5, 67, 300):
            a, b = rng.standard_normal((m, 70)).astype(np.float32), rng.standard_normal((70, 45)).astype(np.float32)
            k = tracea.compile(td.function(td.tensor(a.shape), td.tensor(b.shape))(td.gemm), threads=threads)
            runtimes.add(k.openmp)
            assert np.abs(k(a, b) - a @ b).max() < 1e-4, (threads, m)
            x = rng.standard_normal((m, 3, 40)).astype(np.float32)
            k = tracea.compile(td.function(td.tensor(x.shape))(td.softmax), threads=threads)
            assert np.abs(k(x) - torch.softmax(torch.from_numpy(x), -1).numpy()).max() < 1e-6, (threads, m)
        q = rng.standard_normal((2, 3, 37, 16)).astype(np.float32)
        k = tracea.compile(td.function(*[td.tensor(q.shape)] * 3)(
            lambda a, b, c: td.attention(a, b, c, causal=True)), threads=threads)
        expected = torch.nn.functional.scaled_dot_product_attention(*[torch.from_numpy(q)] * 3, is_causal=True)
        assert np.abs(k(q, q, q) - expected.numpy()).max() < 1e-5
        torch.mm(torch.randn(64, 64), torch.randn(64, 64))  # interleaved with torch's own parallel ops
    big = rng.standard_normal((512, 512)).astype(np.float32)
    assert np.abs(big @ big.T - (big.astype(np.float64) @ big.T)).max() < 1e-2  # numpy's jobs too
    gnu = {line.split()[-1] for line in open("/proc/self/maps") if "libgomp" in line}
    print(len(gnu), sorted(runtimes), len(os.listdir("/proc/self/task")) - threads_before)
""")


@pytest.mark.parametrize("order", ["tracea first", "torch first"])
@pytest.mark.parametrize("runtime", ["auto", "llvm"])
def test_kernels_run_on_torchs_threads(runtime, order):
    """Whichever is imported first, Tracea's parallel regions run on torch's GNU OpenMP threads
    (the ones spinning after each torch op; one libgomp in the process), correct for every share
    of the static schedule, and no thread of another runtime is started; TRACEA_OPENMP=llvm, the
    control, starts libomp's workers."""
    pytest.importorskip("torch")
    libraries, found, new_threads = _run(ON_TORCH_THREADS.replace("sys.argv[1]", repr(order)), TRACEA_OPENMP=runtime,
                                         GOMP_SPINCOUNT=None, OMP_WAIT_POLICY=None).splitlines()[-1].split(" ")
    assert libraries == "1", "two GNU OpenMP runtimes in one process"
    if runtime == "auto":
        assert found == "['gnu']" and int(new_threads) <= 1, (found, new_threads)  # GNU OpenMP's third thread (threads=3)
    else:
        assert found == "['llvm']" and int(new_threads) >= 2, (found, new_threads)


FORKED = textwrap.dedent("""
    import os
    import numpy as np
    import tracea
    from tracea import dialects as td
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((300, 70)).astype(np.float32), rng.standard_normal((70, 45)).astype(np.float32)
    big = rng.standard_normal((512, 512)).astype(np.float32)
    gemm = tracea.compile(td.function(td.tensor(a.shape), td.tensor(b.shape))(td.gemm), threads=2)
    x = rng.standard_normal((64, 3, 40)).astype(np.float32)
    softmax = tracea.compile(td.function(td.tensor(x.shape))(td.softmax), threads=2)  # a barrier between loops

    def check():
        assert np.abs(gemm(a, b) - a @ b).max() < 1e-4
        e = np.exp(x - x.max(-1, keepdims=True))
        assert np.abs(softmax(x) - e / e.sum(-1, keepdims=True)).max() < 1e-6
        assert np.abs(big @ big.T - big.astype(np.float64) @ big.T).max() < 1e-2  # OpenBLAS's jobs

    check()
    pid = os.fork()
    if pid == 0:
        check()
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    check()
    print(gemm.openmp, os.waitstatus_to_exitcode(status))
""")


@pytest.mark.parametrize("runtime", ["auto", "llvm"])
def test_threaded_kernels_run_in_a_forked_child(runtime):
    """GNU OpenMP's team does not survive fork(): a child's kernels must still run (on its one
    thread), and numpy's jobs go back to OpenBLAS's own threads, instead of waiting forever."""
    pytest.importorskip("torch")
    found, child = _run(FORKED, TRACEA_OPENMP=runtime).split()[-2:]
    assert (found, child) == ("gnu" if runtime == "auto" else "llvm", "0")


CACHED = textwrap.dedent("""
    import numpy as np
    import tracea
    from tracea import dialects as td
    from tracea.runtime import blas_threads
    k = tracea.compile(td.function(td.tensor((64, 64)), td.tensor((64, 128)), name="k")(td.gemm), threads=2)
    print(repr((k.origin, k.openmp, sorted(blas_threads.status()["openblas"].values()))))
""")


@pytest.mark.parametrize("runtime", ["auto", "llvm"])
def test_numpys_jobs_follow_a_kernel_read_from_the_disk_cache(runtime, tmp_path):
    """A cached kernel is loaded on libomp, then linked again for GNU OpenMP when that is the
    team in use: OpenBLAS's jobs must end on the kernel's team, not on a second one."""
    import ast
    import importlib.util
    from tracea.runtime.blas_threads import TEAMS
    default = "gnu" if importlib.util.find_spec("torch") else "llvm"  # torch's GNU OpenMP when installed
    outcomes = [ast.literal_eval(_run(CACHED, TRACEA_CACHE_DIR=str(tmp_path), TRACEA_OPENMP=runtime).splitlines()[-1])
                for _ in range(2)]
    assert [origin for origin, _, _ in outcomes] == ["compiled", "disk cache"]
    for _, openmp, openblas in outcomes:
        if openblas:  # numpy on OpenBLAS
            assert openmp == ("llvm" if runtime == "llvm" else default)
            assert openblas == [f"runs its jobs on Tracea's OpenMP threads ({TEAMS[openmp]})"] * len(openblas)



ENVIRONMENT = textwrap.dedent("""
    import os
    import numpy as np
    import tracea
    from tracea import dialects as td
    from tracea.runtime import blas_threads
    before = os.environ.get("OPENBLAS_THREAD_TIMEOUT")
    tracea.compile(td.function(td.tensor((64, 64)), td.tensor((64, 128)), name="k")(td.gemm), threads=2)
    print(repr((before, os.environ.get("OPENBLAS_THREAD_TIMEOUT"), bool(blas_threads.shared))))
""")


@pytest.mark.parametrize("users", [None, "10"])
def test_sharing_leaves_the_environment_as_it_was(users):
    """OpenBLAS re-reads its settings with a short spin while shared, but the process's
    environment (what child processes inherit) is not changed, and a user's own setting stands."""
    import ast
    before, after, _ = ast.literal_eval(_run(ENVIRONMENT, OPENBLAS_THREAD_TIMEOUT=users).splitlines()[-1])
    assert before == after == users
