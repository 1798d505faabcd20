"""CPU benchmark: Tracea against numpy (OpenBLAS), torch (MKL / oneDNN, SDPA) and, when installed,
IREE's llvm-cpu, side by side in one run.

    .venv/bin/python bench/cpu.py                    # 1 and 2 threads, every shape
    .venv/bin/python bench/cpu.py --threads 2 --only gemm --markdown
    .venv/bin/python bench/cpu.py --interleaved      # as a program mixing them calls them
    .venv/bin/python bench/cpu.py --after --threads 2  # Tracea right after numpy / torch vs alone
    .venv/bin/python bench/cpu.py --interleaved --tune 30   # + each case tuned, beside the default
    .venv/bin/python bench/cpu.py --interleaved --isa avx2  # everyone held to AVX2 on an AVX-512 host

Each thread count runs in a worker process whose thread pools (OpenBLAS, torch, IREE, Tracea)
are all set to that count before they start. Within a case the implementations are timed in
blocks of calls, a pause before each block (median_times: each library at its best, alone), or
with --interleaved call by call, one after the other with no pause (interleaved_samples: each
call meets the thread pools the previous library left running, as in a program that calls
numpy, torch and Tracea in turn). The median over all calls is reported, after warm-up.
With --after, Tracea's kernel is timed right after a call of each peer, right after itself and
after a 1 ms pause (times_after): the share of its stand-alone (back-to-back) speed it keeps when
it meets the thread pools numpy's OpenBLAS or torch left running (>= 0.9x is the goal). The peer
(torch, else numpy) is timed the same way, right after the same calls and right after Tracea's:
the control, compared in the time a call adds (a fixed loss is a larger share of a faster call).
A loss the peer shares is the machine's, not Tracea's threads': the caches another
call filled (its temporaries, its packed copies), or a core left idle long enough to sleep (after
a pause, or a predecessor's long single-threaded stretch) and slow to come back; on this
project's Firecracker VMs an idle vCPU halts at once (haltpoll, guest_halt_poll_ns=0) and after
5 ms idle the next 2-thread call, Tracea's or torch's, took ~2 ms longer (bench/idle_wake.py).
Tracea's ratio to each peer is peer time / Tracea time (> 1: Tracea is faster); interleaved, the
median over the rounds of that ratio within each round (paired_speedups: a slow spell of the VM
cancels in each round), beside each one's median GFLOP/s. With --tune, the
kernel on its variants' default schedules (TRACEA_USE_TUNED=0) and on the tuning cache's, after
tuning the ops it lacks (tracea/tuner), are timed side by side.
With --isa avx2 on an AVX-512 host, every implementation is held to AVX2 (ISA_ENV): Tracea plans and
compiles for the zen3-avx2 profile (TRACEA_CPU), OpenBLAS runs its Zen (Haswell) kernels, oneDNN
and ATen their AVX2 ones, IREE compiles for znver3. The closest this host comes to an AVX2 machine
of its own kind: same cores and caches, AVX2 code on both sides.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
from tracea.tools.timing import interleaved_samples, paired_speedups, times_after  # noqa: E402


@dataclass
class Case:
    group: str
    name: str
    flops: float
    build: Callable  # () -> (tracea Function, inputs as numpy arrays)
    peers: dict[str, Callable] = field(default_factory=dict)  # name -> (inputs) -> callable


def cases(only: str | None):
    import numpy as np
    from tracea import dialects as td

    rng = np.random.default_rng(0)
    out = []

    def arr(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    for m, n, k in [(256, 256, 256), (512, 512, 512), (1024, 1024, 1024), (2048, 2048, 2048), (1000, 3000, 500)]:
        def build(m=m, n=n, k=k):
            fn = td.function(td.tensor((m, k)), td.tensor((k, n)), name="gemm")(td.gemm)
            return fn, [arr(m, k), arr(k, n)]
        out.append(Case("gemm", f"GEMM {m}x{n}x{k}", 2.0 * m * n * k, build, {
            "numpy": lambda a, b: (lambda: a @ b),
            "torch": lambda a, b: _torch_call(lambda ta, tb: ta @ tb, a, b)}))

    # The GEMMs of the PyTorch models (bench/torch_models.py): few rows, nn.Linear's [N, K] weights.
    for m, n, k in [(64, 2048, 2048), (64, 512, 2048), (128, 1024, 256), (128, 256, 1024)]:
        def build(m=m, n=n, k=k):
            fn = td.function(td.tensor((m, k)), td.tensor((n, k)), name="linear")(
                lambda x, w: td.gemm(x, w, transpose_b=True))
            return fn, [arr(m, k), arr(n, k)]
        out.append(Case("gemm-small", f"linear {m}x{n}x{k} (B^T)", 2.0 * m * n * k, build, {
            "numpy": lambda a, b: (lambda: a @ b.T),
            "torch": lambda a, b: _torch_call(lambda ta, tb: __import__("torch").nn.functional.linear(ta, tb), a, b)}))

    # A decoding step's GEMMs (a token per sequence: 1 or 4 rows): nn.Linear's weights, and GPT-2's
    # Conv1D weights as they lie ([K, N]; 1280 x 5120: GPT-2 large's MLP), from L2-sized to an LLM
    # layer's 64 MB
    for m, n, k, transpose_b in [(1, 4096, 4096, True), (1, 2304, 768, True), (4, 2304, 768, True),
                                 (1, 3072, 768, False), (1, 768, 3072, False), (4, 3072, 768, False),
                                 (1, 5120, 1280, False)]:
        def build(m=m, n=n, k=k, transpose_b=transpose_b):
            fn = td.function(td.tensor((m, k)), td.tensor((n, k) if transpose_b else (k, n)), name="gemv")(
                lambda x, w: td.gemm(x, w, transpose_b=transpose_b))
            return fn, [arr(m, k), arr(n, k) if transpose_b else arr(k, n)]
        label = f"linear {m}x{n}x{k} (B^T)" if transpose_b else f"x @ W {m}x{n}x{k}"
        out.append(Case("gemm-small", label, 2.0 * m * n * k, build, {
            "numpy": (lambda a, b: (lambda: a @ b.T)) if transpose_b else (lambda a, b: (lambda: a @ b)),
            "torch": (lambda a, b: _torch_call(lambda ta, tb: __import__("torch").nn.functional.linear(ta, tb), a, b))
            if transpose_b else (lambda a, b: _torch_call(lambda ta, tb: ta @ tb, a, b))}))

    for batch, m, n, k in [(16, 256, 256, 64), (16, 256, 64, 256)]:  # attention-shaped batched products
        def build(batch=batch, m=m, n=n, k=k):
            fn = td.function(td.tensor((batch, m, k)), td.tensor((batch, k, n)), name="bmm")(td.gemm)
            return fn, [arr(batch, m, k), arr(batch, k, n)]
        out.append(Case("gemm-small", f"batched GEMM {batch}x({m}x{n}x{k})", 2.0 * batch * m * n * k, build, {
            "numpy": lambda a, b: (lambda: a @ b),
            "torch": lambda a, b: _torch_call(lambda ta, tb: __import__("torch").bmm(ta, tb), a, b)}))

    # (channels, size, filters, kernel, stride, padding, groups, layout)
    for name, (c, hw, f, kk, stride, pad, groups, layout) in {
            "conv 3x3 N1 C64 56x56 K64 p1": (64, 56, 64, 3, 1, 1, 1, "nchw"),
            "conv 7x7 s2 p3 N1 C3 224x224 K64": (3, 224, 64, 7, 2, 3, 1, "nchw"),
            "conv 1x1 N1 C256 28x28 K128": (256, 28, 128, 1, 1, 0, 1, "nchw"),
            "conv 3x3 depthwise N1 C128 56x56 p1": (128, 56, 128, 3, 1, 1, 128, "nchw"),
            "conv 3x3 N1 C64 56x56 K64 p1 ": (64, 56, 64, 3, 1, 1, 1, "nhwc"),
            "conv 1x1 N1 C256 28x28 K128 ": (256, 28, 128, 1, 1, 0, 1, "nhwc"),
            "conv 3x3 depthwise N1 C128 56x56 p1 ": (128, 56, 128, 3, 1, 1, 128, "nhwc")}.items():
        oh = (hw + 2 * pad - kk) // stride + 1
        x_shape = (1, c, hw, hw) if layout == "nchw" else (1, hw, hw, c)
        w_shape = (f, c // groups, kk, kk) if layout == "nchw" else (kk, kk, c // groups, f)

        def build(x_shape=x_shape, w_shape=w_shape, stride=stride, pad=pad, groups=groups, layout=layout):
            fn = td.function(td.tensor(x_shape), td.tensor(w_shape), name="conv")(
                lambda x, w: td.conv2d(x, w, stride=stride, padding=pad, groups=groups, layout=layout))
            return fn, [arr(*x_shape), arr(*w_shape)]

        def torch_conv(x, w, stride=stride, pad=pad, groups=groups, layout=layout):
            import torch
            if layout == "nhwc":  # the same memory, seen by torch as channels-last NCHW
                return _torch_call(lambda tx, tw: torch.nn.functional.conv2d(
                    tx.permute(0, 3, 1, 2), tw.permute(3, 2, 0, 1), stride=stride, padding=pad,
                    groups=groups).permute(0, 2, 3, 1), x, np.ascontiguousarray(w.transpose(3, 0, 1, 2)).transpose(1, 2, 3, 0))
            return _torch_call(lambda tx, tw: torch.nn.functional.conv2d(
                tx, tw, stride=stride, padding=pad, groups=groups), x, w)

        out.append(Case("conv", name.strip() + " " + layout.upper(),
                        2.0 * f * oh * oh * (c // groups) * kk * kk, build, {"torch": torch_conv}))

    # (batch, heads, queries, keys, head dim, causal); one query over a KV cache is a decoding step
    for b, h, sq, s, d, causal in [(1, 8, 512, 512, 64, False), (1, 8, 512, 512, 64, True), (1, 8, 512, 512, 128, False),
                                   (8, 12, 128, 128, 64, False), (1, 4, 2048, 2048, 64, True),
                                   (1, 12, 1, 1024, 64, False), (8, 12, 1, 512, 64, False), (1, 32, 1, 2048, 128, False)]:
        def build_attention(b=b, h=h, sq=sq, s=s, d=d, causal=causal):
            fn = td.function(td.tensor((b, h, sq, d)), *[td.tensor((b, h, s, d))] * 2, name="attention")(
                lambda q, k, v: td.attention(q, k, v, causal=causal))
            return fn, [arr(b, h, sq, d), arr(b, h, s, d), arr(b, h, s, d)]

        def numpy_attention(q, k, v, sq=sq, s=s, d=d, causal=causal):
            mask = np.triu(np.full((sq, s), -np.inf, np.float32), 1) if causal else np.float32(0)

            def run():
                scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d) + mask
                p = np.exp(scores - scores.max(-1, keepdims=True))
                return (p / p.sum(-1, keepdims=True)) @ v
            return run

        shape = f"S{s}" if sq == s else f"Sq{sq} S{s}"
        out.append(Case("attention", f"attention B{b} H{h} {shape} D{d}" + (" causal" if causal else ""),
                        4.0 * b * h * sq * s * d / (2 if causal else 1), build_attention, {
            "numpy": numpy_attention,
            "torch": lambda q, k, v, causal=causal: _torch_call(
                lambda tq, tk, tv: __import__("torch").nn.functional.scaled_dot_product_attention(
                    tq, tk, tv, is_causal=causal), q, k, v)}))

    # Decoding steps as Hugging Face's generate() makes them: over a static KV cache of 1,024
    # positions, 700 filled (a mask operand, -inf past them; SDPA with the boolean mask), and over
    # a growing cache (K and V of a length known at run time only, here 1,024)
    for b, h, s, d, kind in [(1, 12, 1024, 64, "masked"), (1, 12, 1024, 64, "run-time length")]:
        filled = np.arange(s) < 700

        def build_step(b=b, h=h, s=s, d=d, kind=kind, filled=filled):
            keys = None if kind == "run-time length" else s
            args = [td.tensor((b, h, 1, d)), *[td.tensor((b, h, keys, d))] * 2]
            inputs = [arr(b, h, 1, d), arr(b, h, s, d), arr(b, h, s, d)]
            if kind == "masked":
                args.append(td.tensor((1, 1, s)))
                inputs.append(np.where(filled, 0.0, -np.inf).astype(np.float32)[None, None])
            fn = td.function(*args, name="attention")(lambda q, k, v, *m: td.attention(q, k, v, mask=m[0] if m else None))
            return fn, inputs

        def torch_step(q, k, v, *mask, kind=kind, filled=filled):
            import torch
            keep = torch.from_numpy(filled)[None, None, None] if kind == "masked" else None
            return _torch_call(lambda tq, tk, tv: torch.nn.functional.scaled_dot_product_attention(
                tq, tk, tv, attn_mask=keep), q, k, v)

        out.append(Case("attention", f"attention B{b} H{h} Sq1 S{s} D{d} {kind}", 4.0 * b * h * s * d, build_step,
                        {"torch": torch_step}))

    # Memory-bound ops: GFLOP/s counts a nominal 5 operations per element; the ratios are what count.
    for rows, cols in [(4096, 1024), (512, 30522)]:
        def build_softmax(rows=rows, cols=cols):
            return td.function(td.tensor((rows, cols)), name="softmax")(td.softmax), [arr(rows, cols)]
        out.append(Case("softmax", f"softmax {rows}x{cols}", 5.0 * rows * cols, build_softmax, {
            "torch": lambda x: _torch_call(lambda tx: __import__("torch").softmax(tx, -1), x)}))

    for rows, cols in [(4096, 768), (512, 4096)]:
        def build_norm(rows=rows, cols=cols):
            import torch  # no layer-norm op in the dialect: the torch front end's kernel
            return torch.nn.LayerNorm(cols).eval(), [arr(rows, cols)]
        out.append(Case("norm", f"layer norm {rows}x{cols}", 5.0 * rows * cols, build_norm, {
            "torch": lambda x, cols=cols: _torch_call(
                lambda tx: __import__("torch").nn.functional.layer_norm(tx, (cols,)), x)}))
    return [c for c in out if only in (None, c.group)]


def _torch_call(fn, *arrays):
    import torch
    tensors = [torch.from_numpy(a) for a in arrays]

    def run():
        with torch.inference_mode():
            return fn(*tensors)
    return run


# --isa: what holds each implementation to an ISA below the host's, and IREE's target CPU
ISA_ENV = {"avx2": {"TRACEA_CPU": "zen3-avx2", "OPENBLAS_CORETYPE": "Zen", "ONEDNN_MAX_CPU_ISA": "AVX2",
                    "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "BENCH_IREE_CPU": "znver3"}}


def _iree_call(fn, arrays, threads):
    """IREE llvm-cpu with its best flags on the same program, lowered to linalg by Tracea. The
    compiler runs as a command: its MLIR libraries cannot share a process with Tracea's."""
    import tempfile

    import iree.runtime as iree_rt

    from tracea.passes import parse_pipeline, run_pipeline
    linalg = run_pipeline(fn.text(), parse_pipeline("tracea-to-linalg"), asm={"print_generic_op_form": True})
    if not linalg.ok:
        raise RuntimeError("tracea-to-linalg failed")
    with tempfile.TemporaryDirectory() as tmp:
        src, out = os.path.join(tmp, "in.mlir"), os.path.join(tmp, "out.vmfb")
        with open(src, "w") as f:
            f.write(linalg.text)
        compiler = os.path.join(os.path.dirname(sys.executable), "iree-compile")
        subprocess.run([compiler, src, "-o", out, "--iree-hal-target-backends=llvm-cpu",
                        f"--iree-llvmcpu-target-cpu={os.environ.get('BENCH_IREE_CPU', 'host')}", "--iree-opt-data-tiling=true",
                        "--iree-llvmcpu-enable-ukernels=all"], check=True, capture_output=True, text=True)
        with open(out, "rb") as f:
            flatbuffer = f.read()
    module = iree_rt.load_vm_flatbuffer(flatbuffer, driver="local-task")
    entry = getattr(module, fn.name)
    return lambda: entry(*arrays)


def median_times(calls: dict[str, Callable], rounds: int, cycles: int = 5) -> dict[str, float]:
    """Each implementation runs in blocks of calls, the blocks cycling through the implementations
    (so drift in machine speed hits all alike), with a pause between blocks: on a 2-core machine
    a thread pool still spinning after its block (OpenBLAS spins ~0.1 s) would otherwise slow the
    next implementation. Short blocks, many cycles: these VMs have spells of a second or so in
    which only one core runs, and a long block caught in one would misreport its implementation."""
    samples = {name: [] for name in calls}
    per_block = max(1, rounds // cycles)
    for cycle in range(cycles):
        for name, call in calls.items():
            time.sleep(0.3)
            call()  # warm-up
            for _ in range(per_block):
                start = time.perf_counter()
                call()
                samples[name].append(time.perf_counter() - start)
    return {name: sorted(ts)[len(ts) // 2] for name, ts in samples.items()}


def _default_and_tuned(fn, threads: int, budget: int):
    """The kernel on its variant's default schedules, its compile seconds, and (budget > 0) the
    kernel on the tuning cache's schedules, after tuning its ops that the cache lacks (None when
    it has nothing to tune)."""
    import tracea
    from tracea.tuner.autotuner import AutoTuner, tune_program
    os.environ["TRACEA_USE_TUNED"] = "0"
    start = time.perf_counter()
    try:
        default = tracea.compile(fn, threads=threads)
    finally:
        del os.environ["TRACEA_USE_TUNED"]
    default = (default, time.perf_counter() - start)
    if budget <= 0:
        return default, None
    results = tune_program(fn, AutoTuner("cpu", threads=threads, budget=budget, progress=False))
    if not results:
        return default, None
    for r in results:
        print(f"  tuned: {r.describe()}", file=sys.stderr, flush=True)
    return default, tracea.compile(fn, threads=threads)


def worker(threads: int, only: str | None, rounds: int, mode: str = "blocks", tune: int = 0) -> list[dict]:
    import tracea
    try:
        import torch
        torch.set_num_threads(threads)
        have_torch = True
    except ImportError:
        have_torch = False
    try:
        import iree.runtime as iree_rt
        iree_rt.flags.parse_flags(f"--task_topology_max_group_count={threads}")
        have_iree = True
    except ImportError:
        have_iree = False

    print(f"  {threads} thread(s); {_isas()}", file=sys.stderr, flush=True)
    results = []
    for case in cases(only):
        fn, inputs = case.build()
        start = time.perf_counter()
        tuned = None
        if isinstance(fn, tracea.dialects.Function):
            ((kernel, compile_s), tuned), args = _default_and_tuned(fn, threads, tune), inputs
        else:  # a torch module, through the torch front end: called with tensors
            import torch
            args = [torch.from_numpy(a) for a in inputs]
            kernel = tracea.compile(fn, tuple(args), threads=threads)
            compile_s = time.perf_counter() - start
        calls = {"tracea": lambda k=kernel, a=args: k(*a)}
        if tuned is not None:
            calls["tuned"] = lambda k=tuned, a=args: k(*a)
        for peer, make in case.peers.items():
            if peer == "torch" and not have_torch:
                continue
            calls[peer] = make(*inputs)
        if have_iree and isinstance(fn, tracea.dialects.Function):
            try:
                calls["iree"] = _iree_call(fn, inputs, threads)
            except Exception as e:  # report, keep benchmarking the others
                print(f"  (iree failed on {case.name}: {type(e).__name__}: {str(e)[:200]})", file=sys.stderr)
        _check_against_peers(case.name, calls)
        if mode == "after":
            pause = lambda: time.sleep(0.001)  # noqa: E731
            before = {n: c for n, c in calls.items() if n != "tuned"} | {"pause": pause}
            times = times_after(calls["tracea"], before, rounds)
            # The control: the best-known peer timed the same way, right after the same calls (and
            # right after Tracea's): a loss it shares is the machine's (caches another call filled,
            # a core left idle long enough to be slow to wake), not Tracea's threads.
            peer = next(p for p in ("torch", "numpy") if p in calls)
            own = times_after(calls[peer], before, rounds)
            row = {"case": case.name, "threads": threads, "after_ms": {n: t * 1e3 for n, t in times.items()},
                   "peer": peer, "peer_after_ms": {n: t * 1e3 for n, t in own.items()}}
            results.append(row)
            print(_format_after_row(row), file=sys.stderr, flush=True)
            continue
        speedup = None
        if mode == "interleaved":
            samples = interleaved_samples(calls, rounds)
            times = {n: statistics.median(ts) for n, ts in samples.items()}
            speedup = {n: paired_speedups(samples, n) for n in ("tracea", "tuned") if n in calls}
        else:
            times = median_times(calls, rounds)
        row = {"case": case.name, "threads": threads, "compile_s": compile_s,
               "gflops": {n: case.flops / t / 1e9 for n, t in times.items()}}
        if speedup:
            row["speedup"] = speedup
        results.append(row)
        print(_format_row(row), file=sys.stderr, flush=True)
    return results


def _isas() -> str:
    """The ISA each implementation runs (what --isa asked for, as each library reports it)."""
    from tracea.doctor.capabilities import host_cpu
    parts = [f"Tracea plans {host_cpu().isa}"]
    try:
        from threadpoolctl import threadpool_info
        parts += [f"OpenBLAS {i.get('architecture')}" for i in threadpool_info() if i["internal_api"] == "openblas"]
    except ImportError:
        pass
    if "torch" in sys.modules:
        parts.append(f"torch {sys.modules['torch'].backends.cpu.get_cpu_capability()}")
    return ", ".join(parts)


def _check_against_peers(name: str, calls: dict[str, Callable]) -> None:
    """Every peer computes what Tracea computes (a peer set up wrong would make its ratio meaningless)."""
    import numpy as np
    ours = np.asarray(calls["tracea"](), dtype=np.float64)
    for peer, call in calls.items():
        theirs = np.asarray(call(), dtype=np.float64)
        error = np.abs(ours - theirs).max() / max(1.0, np.abs(theirs).max())
        if theirs.shape != ours.shape or not error < 1e-3:
            raise SystemExit(f"{name}: tracea and {peer} disagree (shapes {ours.shape} / {theirs.shape}, "
                             f"max error {error:.1e})")


PEERS = ["numpy", "torch", "iree"]
AFTER = PEERS + ["pause"]  # --after's predecessors besides Tracea itself


def _speedup(row, name: str, peer: str) -> float:
    """`name`'s speed over `peer`'s: the paired per-round ratio where the rounds were interleaved
    (timing.paired_speedups), else the ratio of the medians."""
    paired = row.get("speedup", {}).get(name)
    return paired[peer] if paired else row["gflops"][name] / row["gflops"][peer]


def _format_row(row) -> str:
    g = row["gflops"]
    parts = [f"{row['case']:<38} {row['threads']}T  tracea {g['tracea']:7.1f} GFLOP/s"]
    if "tuned" in g:
        parts.append(f"tuned {g['tuned']:7.1f} (x{_speedup(row, 'tuned', 'tracea'):.2f} default)")
    for peer in PEERS:
        if peer in g:
            parts.append(f"{peer} {g[peer]:7.1f} (x{_speedup(row, 'tracea', peer):.2f}"
                         + (f", tuned x{_speedup(row, 'tuned', peer):.2f})" if "tuned" in g else ")"))
    parts.append(f"compile {row['compile_s']:.2f}s")
    return "  ".join(parts)


def _after_cells(row, bold: str = "") -> dict[str, str]:
    """Per predecessor: the share of its stand-alone speed Tracea keeps right after it (between
    `bold` marks), the time that adds, and the time the same call adds to the peer's (a loss both
    pay in equal time is the machine's: caches, a core to wake; a ratio would flatter the slower one)."""
    ours, theirs, peer = row["after_ms"], row["peer_after_ms"], row["peer"]
    cells = {}
    for p in (p for p in AFTER if p in ours):
        control = f"; {peer} {theirs[p] - theirs[peer]:+.3f} ms" if p != peer else ""
        cells[p] = f"{bold}{ours['tracea'] / ours[p]:.2f}x{bold} ({ours[p] - ours['tracea']:+.3f} ms{control})"
    return cells


def _format_after_row(row) -> str:
    peer, theirs = row["peer"], row["peer_after_ms"]
    return (f"{row['case']:<38} {row['threads']}T  tracea alone {row['after_ms']['tracea']:8.3f} ms  "
            + "  ".join(f"after {p} {cell}" for p, cell in _after_cells(row).items())
            + f"  ({peer} alone {theirs[peer]:.3f} ms, after tracea {theirs['tracea'] - theirs[peer]:+.3f} ms)")


def markdown_after(rows: list[dict]) -> str:
    lines = ["Each cell: the share of its stand-alone speed Tracea keeps right after that call, the time that "
             "adds to its call, and the time the same call adds to the peer's (torch, else numpy).", "",
             "| case | threads | Tracea alone (after itself) | right after numpy | right after torch | right after IREE "
             "| after a 1 ms pause | the peer alone; right after Tracea |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        cells, peer, theirs = _after_cells(row, bold="**"), row["peer"], row["peer_after_ms"]
        lines.append(f"| {row['case']} | {row['threads']} | {row['after_ms']['tracea']:.3f} ms | "
                     + " | ".join(cells.get(p, "-") for p in AFTER)
                     + f" | {peer} {theirs[peer]:.3f} ms; {theirs['tracea'] - theirs[peer]:+.3f} ms |")
    return "\n".join(lines)


def markdown(rows: list[dict]) -> str:
    tuned = any("tuned" in row["gflops"] for row in rows)
    lines = ["| case | threads | Tracea GFLOP/s | " + ("tuned GFLOP/s (vs default) | " if tuned else "")
             + "numpy (OpenBLAS) | torch | IREE llvm-cpu | Tracea compile |",
             "| --- | --- | --- | " + ("--- | " if tuned else "") + "--- | --- | --- | --- |"]
    for row in rows:
        g = row["gflops"]

        def ratio(p):  # default's ratio to the peer, and the tuned kernel's
            text = f"{g[p]:.1f} (**{_speedup(row, 'tracea', p):.2f}x**"
            return text + (f", tuned **{_speedup(row, 'tuned', p):.2f}x**)" if "tuned" in g else ")")
        cells = [ratio(p) if p in g else "-" for p in PEERS]
        extra = [f"{g['tuned']:.1f} ({_speedup(row, 'tuned', 'tracea'):.2f}x)" if "tuned" in g else "-"] if tuned else []
        lines.append(f"| {row['case']} | {row['threads']} | {g['tracea']:.1f} | " + " | ".join(extra + cells)
                     + f" | {row['compile_s']:.2f} s |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    parser.add_argument("--only", choices=["gemm", "gemm-small", "conv", "attention", "softmax", "norm"], help="one group of cases")
    parser.add_argument("--rounds", type=int, default=15, help="timed rounds per case (median reported)")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table at the end")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--interleaved", action="store_const", dest="mode", const="interleaved", default="blocks",
                      help="time call by call, implementations in turn, no pauses (default: blocks after a pause)")
    mode.add_argument("--after", action="store_const", dest="mode", const="after",
                      help="time Tracea's kernel right after each peer's call and right after itself: the "
                           "share of its stand-alone speed it keeps beside numpy and torch")
    parser.add_argument("--tune", type=int, default=0, metavar="BUDGET",
                        help="also tune each case's ops (BUDGET evaluations each; the tuning cache answers "
                             "those it has) and time the tuned kernel beside the default")
    parser.add_argument("--isa", choices=sorted(ISA_ENV),
                        help="hold Tracea and every peer to this ISA (on a host with a wider one), e.g. avx2 on AVX-512")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.only, args.rounds, args.mode, args.tune)))
        return 0
    rows = []
    for threads in [int(t) for t in args.threads.split(",")]:
        # No OMP_WAIT_POLICY=PASSIVE: it would make every OpenMP user (torch's libgomp, Tracea's
        # libomp) wake sleeping workers at each parallel region (a 256 GEMM on 2 threads: 230 us ->
        # 480 us) while OpenBLAS's own threads ignore it. Idle workers spinning into the next
        # implementation's block are handled by the pause between blocks (median_times): libgomp
        # spins ~ms, Tracea's libomp 1 ms, OpenBLAS ~0.1 s.
        env = {**os.environ, "OPENBLAS_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads),
               "MKL_NUM_THREADS": str(threads), "TRACEA_NUM_THREADS": str(threads),
               # a fresh kernel cache: real compiles are timed, and the tuner's compile workers can hand
               # their kernels over through it
               "TRACEA_CACHE_DIR": tempfile.mkdtemp(prefix="tracea-bench-"), **ISA_ENV.get(args.isa, {})}
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", str(threads), "--rounds", str(args.rounds)]
        if args.only:
            cmd += ["--only", args.only]
        if args.mode != "blocks":
            cmd.append(f"--{args.mode}")
        if args.tune:
            cmd += ["--tune", str(args.tune)]
        done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True)
        if done.returncode:
            return done.returncode
        rows += json.loads(done.stdout)
    if args.markdown:
        print(markdown_after(rows) if args.mode == "after" else markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
