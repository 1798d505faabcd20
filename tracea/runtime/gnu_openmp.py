"""Tracea's threaded kernels on GNU OpenMP's threads (torch's), when torch is loaded or installed.

Why: torch's intra-op threads are GNU OpenMP's (libgomp), whose idle threads spin 300,000 pauses
(~7 ms on Zen 3) after each parallel op. libgomp reads its settings when it loads: after `import
torch; import tracea` (the natural order) every Tracea kernel on its own (libomp) threads called
after a torch op shared its cores with two spinning threads. Measured (2 threads, Zen 3, pieces of
a GPT-2-style block interleaved with eager torch): a 128x256x768 linear 5.2 ms instead of
0.58 ms, a layer norm 3.9 ms instead of 0.16 ms. Even with the spin shortened
(GOMP_SPINCOUNT set before torch loaded it), a 2-thread GEMM 256^3 right after a torch op ran at 0.88x of its
speed after another Tracea call, in two runs: torch's threads still held the cores. So `import
tracea` loads torch's libgomp when torch is installed but not loaded yet (torch then finds it
loaded), and in either order one team of threads runs both (the same GEMM after torch:
0.95-0.97x, as after numpy).

The fix: the kernels' parallel regions run on the threads that are spinning. Kernels call LLVM
OpenMP's entry points (MLIR's OpenMP lowering: `__kmpc_fork_call`, `__kmpc_push_num_threads`,
`__kmpc_global_thread_num`, `__kmpc_for_static_init_8u` with the static schedule,
`__kmpc_for_static_fini`, `__kmpc_barrier`); when libgomp was loaded first, each kernel is linked
with definitions of those six over libgomp's `GOMP_parallel`, `GOMP_barrier`,
`omp_get_thread_num` and `omp_get_num_threads`, taken from libgomp itself by address (LLVM's
libomp exports the same names; by name a call could bind to the wrong runtime). The static
schedule splits iterations as LLVM's runtime does: equal shares, the first `trip % threads`
threads one more. OpenBLAS's jobs (blas_threads.py) follow the kernels onto the same threads.

GNU OpenMP's team does not survive fork(): a forked child's parallel regions (torch's too) wait
forever for threads that were not copied. In a child, the kernels' regions run on the calling
thread (correct, one core), and OpenBLAS takes its jobs back (blas_threads.py).

`TRACEA_OPENMP=gnu` or `=llvm` forces one runtime (default `auto`). Kernels exported as shared
libraries (`Kernel.export`) keep LLVM's runtime.
"""
from __future__ import annotations

import ctypes
import functools
import os

from .. import knobs

MAX_ARGS = 16  # MLIR passes a parallel region one argument (its captures, packed); blas_threads 5

# Set in a forked child, where the kernels' regions run on the calling thread (see above).
_in_forked_child = ctypes.c_int32(0)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: setattr(_in_forked_child, "value", 1))


def in_forked_child() -> bool:
    return bool(_in_forked_child.value)

_SHIM = r"""
%task_call = type {{ ptr, i32, [{max_args} x ptr] }}
@pushed_threads = internal global i32 0

declare void @llvm.va_start.p0(ptr)
declare void @llvm.va_end.p0(ptr)
declare void @llvm.trap()

define i32 @__kmpc_global_thread_num(ptr %loc) {{
  ret i32 0
}}

define void @__kmpc_push_num_threads(ptr %loc, i32 %gtid, i32 %n) {{
  store i32 %n, ptr @pushed_threads
  ret void
}}

define void @__kmpc_for_static_fini(ptr %loc, i32 %gtid) {{
  ret void
}}

define void @__kmpc_barrier(ptr %loc, i32 %gtid) {{
  %barrier = inttoptr i64 {barrier} to ptr
  call void %barrier()
  ret void
}}

; this thread's share of lower..upper (inclusive, step incr): equal shares, the first trip % threads
; one more; an empty share is lower = upper + incr
define void @__kmpc_for_static_init_8u(ptr %loc, i32 %gtid, i32 %schedule, ptr %plast, ptr %plower, ptr %pupper,
                                       ptr %pstride, i64 %incr, i64 %chunk) {{
entry:
  %num_threads_fn = inttoptr i64 {num_threads} to ptr
  %thread_num_fn = inttoptr i64 {thread_num} to ptr
  %nth32 = call i32 %num_threads_fn()
  %tid32 = call i32 %thread_num_fn()
  %nth = zext i32 %nth32 to i64
  %tid = zext i32 %tid32 to i64
  %lower = load i64, ptr %plower
  %upper = load i64, ptr %pupper
  %span = sub i64 %upper, %lower
  %steps = udiv i64 %span, %incr
  %trip = add i64 %steps, 1
  %small = udiv i64 %trip, %nth
  %extras = urem i64 %trip, %nth
  %before_extras = icmp ult i64 %tid, %extras
  %extra_before = select i1 %before_extras, i64 %tid, i64 %extras
  %first_step = mul i64 %tid, %small
  %first_step2 = add i64 %first_step, %extra_before
  %offset = mul i64 %first_step2, %incr
  %start = add i64 %lower, %offset
  %one_more = zext i1 %before_extras to i64
  %count = add i64 %small, %one_more
  %empty = icmp eq i64 %count, 0
  %count_less = sub i64 %count, 1
  %length = mul i64 %count_less, %incr
  %end = add i64 %start, %length
  %past = add i64 %upper, %incr
  %new_lower = select i1 %empty, i64 %past, i64 %start
  %new_upper = select i1 %empty, i64 %upper, i64 %end
  store i64 %new_lower, ptr %plower
  store i64 %new_upper, ptr %pupper
  %whole = mul i64 %trip, %incr
  store i64 %whole, ptr %pstride
  %last_of_many = sub i64 %nth, 1
  %few = icmp ult i64 %trip, %nth
  %last_of_few = sub i64 %trip, 1
  %last_tid = select i1 %few, i64 %last_of_few, i64 %last_of_many
  %is_last = icmp eq i64 %tid, %last_tid
  %is_last32 = zext i1 %is_last to i32
  store i32 %is_last32, ptr %plast
  ret void
}}

; each thread of GNU OpenMP's team: task(&thread, &thread, args...)
define internal void @run_task(ptr %call) {{
entry:
  %thread_num_fn = inttoptr i64 {thread_num} to ptr
  %tid = call i32 %thread_num_fn()
  %gtid = alloca i32
  store i32 %tid, ptr %gtid
  %task = load ptr, ptr %call
  %argcp = getelementptr %task_call, ptr %call, i32 0, i32 1
  %argc = load i32, ptr %argcp
{load_args}
  switch i32 %argc, label %a{max_args} [{cases}]
{calls}
}}

define void @__kmpc_fork_call(ptr %loc, i32 %argc, ptr %task, ...) {{
entry:
  %too_many = icmp ugt i32 %argc, {max_args}
  br i1 %too_many, label %trap, label %fork
trap:
  call void @llvm.trap()
  unreachable
fork:
  %ap = alloca [32 x i8], align 16
  %call = alloca %task_call, align 8
  store ptr %task, ptr %call
  %argcp = getelementptr %task_call, ptr %call, i32 0, i32 1
  store i32 %argc, ptr %argcp
  call void @llvm.va_start.p0(ptr %ap)
{read_args}
  br label %go
go:
  call void @llvm.va_end.p0(ptr %ap)
  %n = load i32, ptr @pushed_threads
  store i32 0, ptr @pushed_threads
  %in_child = load volatile i32, ptr inttoptr (i64 {forked} to ptr)
  %serial = icmp ne i32 %in_child, 0
  br i1 %serial, label %alone, label %team
alone:
  call void @run_task(ptr %call)  ; outside a parallel region: thread 0 of 1, the whole range
  ret void
team:
  %parallel = inttoptr i64 {parallel} to ptr
  call void %parallel(ptr @run_task, ptr %call, i32 %n, i32 0)
  ret void
}}
"""


def _shim_ir(parallel: int, barrier: int, thread_num: int, num_threads: int, forked: int) -> str:
    n = MAX_ARGS
    load_args = "\n".join(
        f"  %argp{i} = getelementptr %task_call, ptr %call, i32 0, i32 2, i32 {i}\n  %arg{i} = load ptr, ptr %argp{i}"
        for i in range(n))
    cases = " ".join(f"i32 {k}, label %a{k}" for k in range(n))
    calls = "\n".join(
        f"a{k}:\n  call void %task({', '.join(['ptr %gtid', 'ptr %gtid'] + [f'ptr %arg{i}' for i in range(k)])})\n"
        "  ret void" for k in range(n + 1))
    read = []
    for i in range(n):  # read argument i when argc > i
        read.append(f"  %more{i} = icmp ugt i32 %argc, {i}\n  br i1 %more{i}, label %read{i}, label %go\n"
                    f"read{i}:\n  %v{i} = va_arg ptr %ap, ptr\n"
                    f"  %slot{i} = getelementptr %task_call, ptr %call, i32 0, i32 2, i32 {i}\n"
                    f"  store ptr %v{i}, ptr %slot{i}")
    return _SHIM.format(max_args=n, load_args=load_args, cases=cases, calls=calls, read_args="\n".join(read),
                        parallel=parallel, barrier=barrier, thread_num=thread_num, num_threads=num_threads,
                        forked=forked)


def chosen_runtime() -> str:
    """"gnu" when threaded kernels run on GNU OpenMP's threads, else "llvm"."""
    from . import blas_threads
    choice = knobs.openmp_runtime()
    if choice == "auto":
        return "gnu" if blas_threads.gnu_openmp_library and knobs.share_cores() else "llvm"
    if choice == "gnu" and _libgomp_path() is None:
        return "llvm"  # nothing to run on: GNU OpenMP is not loaded
    return choice


def _libgomp_path() -> str | None:
    from .blas_threads import _loaded_libraries, gnu_openmp_library
    found = [p for p in _loaded_libraries("libgomp") if "libgomp" in p.rsplit("/", 1)[-1]]
    return gnu_openmp_library or (found[0] if found else None)


@functools.cache
def _address(name: str) -> int:
    """The address of libgomp's `name` (by address: libomp exports the same names)."""
    return ctypes.cast(getattr(ctypes.CDLL(_libgomp_path()), name), ctypes.c_void_p).value


@functools.cache
def shim_object() -> bytes:
    """Object code of the six entry points over the loaded libgomp (its addresses built in)."""
    from ..targets.cpu import native
    text = _shim_ir(_address("GOMP_parallel"), _address("GOMP_barrier"), _address("omp_get_thread_num"),
                    _address("omp_get_num_threads"), ctypes.addressof(_in_forked_child))
    return native.compile_llvm_ir(text, [], optimize=False)


def team_size_function() -> int:
    """The address of GNU OpenMP's omp_get_num_threads."""
    return _address("omp_get_num_threads")
