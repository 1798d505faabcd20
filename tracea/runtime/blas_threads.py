"""Other libraries' thread pools share the cores with Tracea's instead of spinning on them.

OpenBLAS's parallel jobs run on Tracea's OpenMP threads, so a program that calls numpy and
Tracea in turn has one pool of worker threads, not two fighting for the cores.

Why: after each threaded call, OpenBLAS's own workers spin for 2^28 cycles (~0.1 s) before they
sleep (driver/others/blas_server.c, THREAD_TIMEOUT). A Tracea kernel called in that window
shares its cores with them: a 2-thread GEMM 1024^3 took 25.6 ms right after a numpy matmul,
12.6 ms alone (Zen 3, 2 cores). OpenBLAS (0.3.27 and later) lets its caller run its jobs instead
(openblas_set_threads_callback_function); here they run on the OpenMP team Tracea's kernels
use (libomp's, whose idle workers sleep after 1 ms, runtime/libraries.py; or GNU OpenMP's,
gnu_openmp.py), and OpenBLAS's own workers stay asleep. numpy computes exactly as before: the
jobs are OpenBLAS's own, each on its own thread (a threaded level-3 job waits for its siblings'
panels, so all of them run at once).

Every OpenBLAS in the process is shared (numpy's, scipy's, a system one) once a threaded Tracea
kernel is loaded.

OpenBLAS's own workers still exist, and a fork (Tracea's compiler process is a forked child,
passes/isolation.py) stops them (OpenBLAS's pthread_atfork handler): its next threaded call starts
new ones, callback or not, and they spin 2^28 cycles (0.1-0.25 s here) for jobs that never come,
on the cores Tracea's next kernels run on. So while its jobs are shared, OpenBLAS re-reads its
settings with OPENBLAS_THREAD_TIMEOUT=4 (16 cycles: they sleep at once), unless the user set it.

GNU OpenMP (torch's intra-op threads) has no such hook: its idle threads spin GOMP_SPINCOUNT
(300,000 pauses, ~7 ms at ~24 ns a pause on Zen 3 to Zen 5) before they sleep, and a Tracea kernel
on its own threads called after a torch op shared a core with one (2 threads, GEMM 1024^3
interleaved with torch: 0.60x of torch's speed). So `import tracea` loads torch's libgomp when
torch is installed but not loaded yet, so that Tracea's kernels run on torch's threads in either
import order (`share_gnu_openmp`, gnu_openmp.py): its spinning threads are then the ones the next
kernel needs. Their spin is libgomp's default (or the user's GOMP_SPINCOUNT / OMP_WAIT_POLICY),
the same whichever is imported first: a kernel called up to ~7 ms after the last parallel call
finds the team awake, and no other pool needs the cores meanwhile (OpenBLAS's jobs run on this team,
its own workers asleep). A shorter spin costs short kernels the team's wake-up: with ~1 ms
(GOMP_SPINCOUNT=40000, set by `import tracea` until 2026-11-30), of 39 2-thread kernels called 1 ms
after the last parallel call 20 kept less than 0.9x of their speed after themselves, 0.47x at the
lowest (Zen 5 VM, `bench/cpu.py --after`); with the default 9, 0.70x at the lowest. With ~70 us
(3,000) even one-row GEMMs right after a torch op kept 0.55-0.77x.
TRACEA_SHARE_CORES=0 does none of this.
"""
from __future__ import annotations

import ctypes
import os
import threading

from .. import knobs

# The callback OpenBLAS calls from exec_blas with its jobs: callback(sync, dojob, numjobs,
# jobdata_elsize, jobdata, dojob_data); each job runs as dojob(job, jobdata + job * elsize,
# dojob_data), the job's index naming its per-thread buffer. A libomp team of numjobs threads
# runs one job each. The team's size comes from libomp's omp_get_num_threads through a pointer set
# at load: by name it could bind to libgomp's (torch's), which knows nothing of this team.
CALLBACK, TEAM_SIZE = "tracea_openblas_threads", "tracea_libomp_team_size"
CALLBACK_IR = r"""
%ident = type { i32, i32, i32, i32, ptr }
@tracea_libomp_team_size = global ptr null
@where = private unnamed_addr constant [30 x i8] c";tracea;OpenBLAS jobs;0;0;;\00\00\00"
@ident = private global %ident { i32 0, i32 2, i32 0, i32 0, ptr @where }

declare i32 @__kmpc_global_thread_num(ptr)
declare void @__kmpc_push_num_threads(ptr, i32, i32)
declare void @__kmpc_fork_call(ptr, i32, ptr, ...)

define internal void @run_jobs(ptr %gtid, ptr %btid, ptr %dojob, ptr %jobdata, i64 %elsize, i64 %numjobs, i64 %data) {
entry:
  %first = load i32, ptr %btid
  %team_size = load ptr, ptr @tracea_libomp_team_size
  %team = call i32 %team_size()
  %first64 = sext i32 %first to i64
  %team64 = sext i32 %team to i64
  %data32 = trunc i64 %data to i32
  br label %loop
loop:
  %job = phi i64 [ %first64, %entry ], [ %next, %body ]
  %more = icmp slt i64 %job, %numjobs
  br i1 %more, label %body, label %done
body:
  %offset = mul i64 %job, %elsize
  %jobptr = getelementptr i8, ptr %jobdata, i64 %offset
  %job32 = trunc i64 %job to i32
  call void %dojob(i32 %job32, ptr %jobptr, i32 %data32)
  %next = add i64 %job, %team64
  br label %loop
done:
  ret void
}

define void @tracea_openblas_threads(i32 %sync, ptr %dojob, i32 %numjobs, i64 %elsize, ptr %jobdata, i32 %data) {
entry:
  %gtid = call i32 @__kmpc_global_thread_num(ptr @ident)
  call void @__kmpc_push_num_threads(ptr @ident, i32 %gtid, i32 %numjobs)
  %numjobs64 = sext i32 %numjobs to i64
  %data64 = sext i32 %data to i64
  call void (ptr, i32, ptr, ...) @__kmpc_fork_call(ptr @ident, i32 5, ptr @run_jobs, ptr %dojob, ptr %jobdata,
                                                   i64 %elsize, i64 %numjobs64, i64 %data64)
  ret void
}
"""
# What each OpenBLAS build calls its setter: the reference name, numpy's (scipy-openblas, 64-bit
# ints) and scipy's (32-bit ints)
SETTERS = ("openblas_set_threads_callback_function", "scipy_openblas_set_threads_callback_function64_",
           "scipy_openblas_set_threads_callback_function")

_lock = threading.Lock()
_callbacks: dict[str, tuple[object, int]] = {}  # "gnu" / "llvm" -> (the JIT library that owns it, its address)
_team: str | None = None  # whose team OpenBLAS's jobs run on now: "gnu" or "llvm"
TEAMS = {"gnu": "GNU OpenMP's team, torch's", "llvm": "libomp's team"}
shared: dict[str, tuple] = {}  # the OpenBLAS libraries whose jobs run on Tracea's threads: (setter, its library)
IDLE_WORKERS_SPIN = "4"  # OPENBLAS_THREAD_TIMEOUT while shared: 2^4 cycles
_tried: set[str] = set()  # paths looked at once (shared, or without the callback)


def _loaded_libraries(name: str) -> list[str]:
    """The shared libraries mapped in this process whose path holds `name`."""
    try:
        with open("/proc/self/maps") as maps:
            return sorted({line.split(None, 5)[5].strip() for line in maps
                           if line.count(" ") >= 5 and ".so" in line and name in line.lower()})
    except OSError:  # not Linux
        return []


def _openblas(path: str) -> tuple | None:
    """The OpenBLAS at `path` and its threads-callback setter, or None (not loadable, before 0.3.27)."""
    try:
        library = ctypes.CDLL(path)
    except OSError:
        return None
    setter = next((getattr(library, name) for name in SETTERS if hasattr(library, name)), None)
    return None if setter is None else (setter, library)


def _set_idle_spin(library: ctypes.CDLL, timeout: str | None) -> None:
    """Have OpenBLAS re-read its settings with OPENBLAS_THREAD_TIMEOUT=timeout (None: its default)
    for the workers it starts next; the process's environment is left as it was. Nothing when
    the user set the variable, or the library cannot re-read (its workers then spin after a fork)."""
    read = getattr(library, "openblas_read_env", None)
    if read is None or "OPENBLAS_THREAD_TIMEOUT" in os.environ:
        return
    if timeout is None:
        read()
        return
    os.environ["OPENBLAS_THREAD_TIMEOUT"] = timeout
    try:
        read()
    finally:
        del os.environ["OPENBLAS_THREAD_TIMEOUT"]


def share_with_openblas(libomp: ctypes.CDLL | None) -> list[str]:
    """Point every OpenBLAS loaded in this process at the OpenMP team Tracea's kernels run on:
    `libomp`'s (loaded), or with None GNU OpenMP's (gnu_openmp.py); returns the libraries newly
    shared. The latest threaded kernel's team takes the jobs: a kernel read from the disk cache
    is first loaded on libomp, then linked again for GNU OpenMP (targets/cpu/target.py), and
    its jobs must follow it there (else two teams fight for the cores again)."""
    global _team
    from . import gnu_openmp
    if not knobs.share_cores() or (libomp is None and gnu_openmp.in_forked_child()):
        return []
    team = "llvm" if libomp is not None else "gnu"
    with _lock:
        newly = []
        for path in _loaded_libraries("openblas"):
            if path not in _tried:
                _tried.add(path)
                if (found := _openblas(path)) is not None:
                    found[0].argtypes, found[0].restype = [ctypes.c_void_p], None
                    shared[path] = found
                    newly.append(path)
        if shared and (newly or team != _team):
            address = _callback(team, libomp)
            for setter, library in shared.values():
                setter(address)
                _set_idle_spin(library, IDLE_WORKERS_SPIN)
            _team = team
    return newly


def _callback(team: str, libomp: ctypes.CDLL | None) -> int:
    """The address of the function that runs OpenBLAS's jobs on `team`'s threads (built once)."""
    if team not in _callbacks:
        from ..targets.cpu import native
        from . import gnu_openmp
        code = native.compile_llvm_ir(CALLBACK_IR, [], optimize=False)
        if team == "gnu":
            jit = native.JitLibrary(code, [CALLBACK, TEAM_SIZE], also=[gnu_openmp.shim_object()])
            team_size = gnu_openmp.team_size_function()
        else:
            jit = native.JitLibrary(code, [CALLBACK, TEAM_SIZE])
            team_size = ctypes.cast(libomp.omp_get_num_threads, ctypes.c_void_p).value
        ctypes.c_void_p.from_address(jit.addresses[TEAM_SIZE]).value = team_size
        _callbacks[team] = (jit, jit.addresses[CALLBACK])
    return _callbacks[team][1]


_gnu_openmp = "not set: TRACEA_SHARE_CORES=0"  # what share_gnu_openmp found and did
gnu_openmp_library: str | None = None  # the libgomp Tracea's threaded kernels run on (gnu_openmp.py)


def share_gnu_openmp() -> None:
    """At `import tracea`: when torch is installed, its libgomp loaded now, so that torch's ops and
    Tracea's kernels run on one team of threads whichever of the two the program imports first
    (gnu_openmp.py)."""
    global _gnu_openmp, gnu_openmp_library
    if not knobs.share_cores():
        return
    chosen = [f"{v}={os.environ[v]}" for v in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY") if os.environ.get(v)]
    _gnu_openmp = f"idle threads spin as you set: {', '.join(chosen)}" if chosen else \
        "idle threads spin its default (~7 ms)"
    if loaded := _loaded_libraries("libgomp"):
        gnu_openmp_library = loaded[0]
        return
    try:
        keep_libomp = knobs.openmp_runtime() == "llvm"
    except ValueError:  # a bad value is reported where kernels are compiled, not by `import tracea`
        keep_libomp = False
    if keep_libomp or (path := _torch_libgomp()) is None:
        return
    try:  # global: a libomp loaded later must not take over the GOMP_* names torch binds to
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError:
        return
    gnu_openmp_library = path
    _gnu_openmp += "; torch's libgomp loaded by tracea"


def _torch_libgomp() -> str | None:
    """The GNU OpenMP an installed torch runs on, found without importing torch: its wheel ships
    one (torch/lib/libgomp.so.1; older wheels torch.libs/libgomp-<hash>.so.1), which torch's
    libraries then find loaded under its soname."""
    import importlib.util
    from pathlib import Path
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    for folder in (root / "lib", root.parent / "torch.libs"):
        if found := sorted(folder.glob("libgomp*.so*")):
            return str(found[0])
    return None


def _stop_sharing_in_forked_child() -> None:
    """GNU OpenMP's team does not survive fork() (gnu_openmp.py runs kernels serially in a child),
    and OpenBLAS's jobs must all run at once: in a child OpenBLAS takes them back onto its own
    threads (by the setters kept from the parent: no dlopen in a child of a threaded process).
    libomp re-creates its team in a child: jobs shared with it stay."""
    global _team
    if _team == "gnu":
        for setter, library in shared.values():
            setter(None)
            _set_idle_spin(library, None)  # its workers take jobs again: the default spin
        shared.clear()
        _team = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_stop_sharing_in_forked_child)


def status() -> dict:
    """How other thread pools share the cores in this process (for tracea doctor)."""
    openblas = {}
    for path in _loaded_libraries("openblas"):
        if path in shared:
            openblas[path] = f"runs its jobs on Tracea's OpenMP threads ({TEAMS[_team]})"
        elif _openblas(path) is None:
            openblas[path] = "its own threads (before OpenBLAS 0.3.27: no threads callback)"
        elif not knobs.share_cores():
            openblas[path] = "its own threads (TRACEA_SHARE_CORES=0)"
        else:
            openblas[path] = "its own threads until a threaded Tracea kernel is loaded"
    from . import gnu_openmp
    gnu = _gnu_openmp
    if gnu_openmp_library:
        gnu += (", and Tracea's threaded kernels run on its threads" if gnu_openmp.chosen_runtime() == "gnu"
                else "; Tracea's threaded kernels keep libomp (TRACEA_OPENMP=llvm)")
    return {"openblas": openblas, "gnu_openmp": gnu}
