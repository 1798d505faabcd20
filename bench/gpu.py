"""NVIDIA benchmark: Tracea's GEMM kernels against torch.matmul (cuBLAS), its NHWC convolutions
against torch's conv2d (cuDNN, channels-last) and its attention against torch SDPA and a Triton
fused attention (bench/triton_attention.py), in steps, since the compiler (MLIR) and the GPU are
on different machines here:

    .venv/bin/python bench/gpu.py build .gpu-bench            # here: compile, write the artifacts
    .venv/bin/python bench/gpu.py check .gpu-bench --emulate  # here: the checks' PTX run on the CPU
    python3 bench/gpu.py check .gpu-bench                     # on the GPU machine: every kernel variant
                                                              # (small odd shapes) against torch
    python3 bench/gpu.py run .gpu-bench --out $OUT            # there: check and time the big ones
    python3 bench/gpu.py profile .gpu-bench $OUT/gpu-run.json --out $OUT  # there: ncu, best and worst

`build` also writes the `check` cases: each kernel variant Tracea emits (epilogues, batched and
transposed operands, the SIMT fallback, both attention kernels with ragged and causal sequences,
strided convs), for every chip the device can run, compared with torch in f32.

`run` needs only numpy, torch (CUDA) and cuda-bindings (Triton for the attention peer): it loads
tracea/runtime's launcher by path. The timed kernels write the inputs' dtype, as torch does. Each
kernel and peer is first checked against torch computing in f32, then they are timed in the same
process with CUDA events (median of 50 launches after 10 warm-up ones, L2 not flushed: every side
sees the same warm cache). Ratio = Tracea's TFLOP/s over the peer's (> 1: faster). `run --only
REGEX` times a subset; every case's row is in gpu-run.json as soon as it is measured, the table in
gpu-run.md at the end, and stdout ends with one line per problem. A case that runs past its time
(a deadlocked kernel) stops the process with what was measured saved.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import threading

try:  # the attention goal's peer; only where Triton is (the GPU machine)
    import triton_attention
except ImportError:
    triton_attention = None

HERE = os.path.dirname(os.path.abspath(__file__))
RUNTIME = os.path.join(HERE, "..", "tracea", "runtime")

SIZES = (1024, 2048, 4096, 8192)
CASES = [(dtype, transpose_b, size) for dtype in ("f16", "bf16") for transpose_b in (False, True) for size in SIZES]
# Schedules timed beside each GEMM's default (td.Schedule fields): a small search on the device,
# so one run shows which tiles the defaults should be
VARIANTS = {
    "sm_80": {
        "128x256x32 8warps": {"tile": [128, 256, 32], "warp_tile": [64, 64, 32], "stages": 3},
        "256x128x32 8warps": {"tile": [256, 128, 32], "warp_tile": [64, 64, 32], "stages": 3},
        "128x128x32 4stages": {"tile": [128, 128, 32], "warp_tile": [64, 64, 32], "stages": 4},
        "128x128x64": {"tile": [128, 128, 64], "warp_tile": [64, 64, 64], "stages": 3},
        "group 1": {"group_m": 1},  # the default tiles launched row by row (no L2 grouping)
    },
    "sm_90a": {
        "128x256 2wg 3stages": {"tile": [128, 256, 64], "warp_tile": [64, 256, 64], "stages": 3},
        "256x128 2wg": {"tile": [256, 128, 64], "warp_tile": [128, 128, 64], "stages": 4},
        "128x128 1wg 6stages": {"tile": [128, 128, 64], "stages": 6, "barrier": "producer_consumer"},
        "128x128 1wg no-producer": {"tile": [128, 128, 64], "stages": 4},
        "128x256 2wg persistent": {"tile": [128, 256, 64], "warp_tile": [64, 256, 64], "stages": 4,
                                   "persistent": 132},
        "group 1": {"group_m": 1},
        "group 16": {"group_m": 16},
        "cluster 2": {"cluster": 2},  # the default tiles, pairs of blocks multicasting B
        "128x256 2wg cluster 2 persistent": {"tile": [128, 256, 64], "warp_tile": [64, 256, 64], "stages": 4,
                                             "persistent": 132, "cluster": 2},
        "tma store": {"store": "tma"},  # the default tiles, the epilogue through shared memory and TMA
        "128x256 2wg persistent tma store": {"tile": [128, 256, 64], "warp_tile": [64, 256, 64], "stages": 4,
                                             "persistent": 132, "store": "tma"},
    },
}
# NHWC f16 convolutions (implicit GEMM on the mma.sync kernel): batch, H = W, C, F, kernel, stride, padding
CONVS = [(32, 56, 64, 64, 3, 1, 1), (32, 28, 128, 128, 3, 1, 1), (32, 14, 256, 256, 3, 1, 1)]
# attention (flash; wgmma on sm_90a, mma.sync on sm_80): dtype, batch, heads, sequence, head dim, causal
ATTENTIONS = [("f16", 4, 16, 1024, 64, False), ("f16", 4, 16, 4096, 64, False), ("bf16", 4, 16, 4096, 128, False),
              ("f16", 4, 16, 4096, 64, True), ("bf16", 2, 16, 8192, 128, False), ("bf16", 2, 16, 8192, 128, True)]
# attention schedules timed beside the defaults (tile = [queries per block, keys per step, -])
ATTENTION_VARIANTS = {
    "sm_80": {"128x64 8warps": {"tile": [128, 64, 64], "stages": 2}, "64x64 3stages": {"tile": [64, 64, 64], "stages": 3}},
    "sm_90a": {"128x128 3stages": {"tile": [128, 128, 64], "stages": 3}, "192x64 3wg": {"tile": [192, 64, 64], "stages": 2},
               "128x64 4stages": {"tile": [128, 64, 64], "stages": 4},
               "no ping-pong": {"barrier": "producer_consumer", "stages": 2}},
}


# (name, chip, input shapes and dtypes, kind, parameters): small, odd shapes, every variant
CHECKS = [
    (f"{chip}_{name}", chip, inputs, kind, params)
    for chip in ("sm_80", "sm_90a")
    for name, inputs, kind, params in [
        ("linear_bias_gelu_residual_f16", [((4, 50, 64), "f16"), ((96, 64), "f16"), ((96,), "f16"), ((4, 50, 96), "f16")],
         "linear", {}),
        ("linear_bf16", [((200, 104), "bf16"), ((264, 104), "bf16")], "linear", {}),
        ("gemm_nn_f16", [((200, 104), "f16"), ((104, 264), "f16")], "gemm", {}),
        ("gemm_f16_n_not_8", [((64, 36), "f16"), ((36, 30), "f16")], "gemm", {}),  # SIMT fallback
        ("linear_f32_simt", [((70, 40), "f32"), ((96, 40), "f32"), ((96,), "f32")], "linear", {}),
        ("bmm_f16", [((2, 3, 50, 64), "f16"), ((2, 3, 64, 40), "f16")], "gemm", {}),
        ("at_b_f16", [((72, 136), "f16"), ((72, 40), "f16")], "gemm", {"transpose_a": True}),
        ("batched_at_b_f16", [((2, 40, 24), "f16"), ((2, 40, 16), "f16")], "gemm", {"transpose_a": True}),
        ("batched_at_shared_b_f16", [((2, 3, 40, 24), "f16"), ((40, 16), "f16")], "gemm", {"transpose_a": True}),
        ("batched_at_b_f32_simt", [((2, 20, 12), "f32"), ((20, 10), "f32")], "gemm", {"transpose_a": True}),
        ("conv_s2_f16", [((2, 20, 18, 32), "f16"), ((3, 3, 32, 48), "f16"), ((48,), "f32")], "conv",
         {"stride": 2, "padding": 1}),
        ("attention_causal_bf16", [((2, 3, 129, 64), "bf16")] * 3, "attention", {"causal": True}),
        ("attention_f16_d128", [((1, 2, 200, 128), "f16")] * 3, "attention", {"causal": False}),
        # more key blocks than stages (buffers and phases wrap), a ragged last one
        ("attention_long_causal_bf16", [((1, 2, 150, 64), "bf16")] * 3, "attention",
         {"causal": True, "schedule": {"tile": [128, 32, 64], "stages": 2}}),
    ]
] + [  # the Hopper GEMM's other forms: two MMA warpgroups, and no producer warp
    ("sm_90a_linear_two_warpgroups_bf16", "sm_90a", [((130, 200), "bf16"), ((136, 200), "bf16")], "linear",
     {"schedule": {"tile": [128, 256, 64], "warp_tile": [64, 256, 64], "stages": 2}}),
    ("sm_90a_gemm_two_warpgroups_m256_f16", "sm_90a", [((260, 136), "f16"), ((136, 72), "f16")], "gemm",
     {"schedule": {"tile": [256, 128, 64], "warp_tile": [128, 128, 64], "stages": 2}}),
    ("sm_90a_gemm_no_producer_warp_f16", "sm_90a", [((130, 200), "f16"), ((200, 136), "f16")], "gemm",
     {"schedule": {"tile": [128, 128, 64], "stages": 3}}),
    # 144 output tiles: some of the 132 persistent blocks loop over two
    ("sm_90a_linear_persistent_bf16", "sm_90a", [((768, 16), "bf16"), ((1536, 16), "bf16")], "linear",
     {"schedule": {"tile": [64, 128, 64], "stages": 2, "persistent": 132}}),
    # launch order in groups of two tile rows, the last group short (5 tile rows)
    ("sm_80_gemm_grouped_launch_f16", "sm_80", [((157, 32), "f16"), ((32, 96), "f16")], "gemm",
     {"schedule": {"tile": [32, 32, 32], "warp_tile": [32, 32, 32], "stages": 2, "group_m": 2}}),
    ("sm_90a_linear_grouped_launch_bf16", "sm_90a", [((310, 64), "bf16"), ((256, 64), "bf16")], "linear",
     {"schedule": {"tile": [64, 128, 64], "stages": 2, "group_m": 2}}),
    # clusters of two blocks multicasting halves of B: 3 tile rows (the cluster's fourth reads
    # zeros and stores nothing); a row-major B in 64-column boxes, persistent
    ("sm_90a_linear_cluster_multicast_bf16", "sm_90a", [((130, 200), "bf16"), ((256, 200), "bf16")], "linear",
     {"schedule": {"tile": [64, 128, 64], "stages": 2, "cluster": 2}}),
    ("sm_90a_gemm_cluster_persistent_f16", "sm_90a", [((200, 72), "f16"), ((72, 264), "f16")], "gemm",
     {"schedule": {"tile": [64, 128, 64], "stages": 2, "cluster": 2, "persistent": 4}}),
    # the epilogue through shared memory and TMA stores: bf16 out, two warpgroups of 4 boxes,
    # bias and residual read inside C where the boxes cross its edges (M 130, N 200); f32 out
    # (32-column boxes), persistent in a cluster (staging buffers reused from tile to tile)
    ("sm_90a_linear_tma_store_bias_gelu_residual_bf16", "sm_90a",
     [((2, 65, 64), "bf16"), ((200, 64), "bf16"), ((200,), "bf16"), ((2, 65, 200), "bf16")], "linear",
     {"out_dtype": "bf16", "schedule": {"tile": [128, 256, 64], "warp_tile": [64, 256, 64], "stages": 2,
                                        "store": "tma"}}),
    ("sm_90a_gemm_tma_store_cluster_persistent_f16", "sm_90a", [((200, 72), "f16"), ((72, 264), "f16")], "gemm",
     {"schedule": {"tile": [64, 128, 64], "stages": 2, "cluster": 2, "persistent": 4, "store": "tma"}}),
    # the Hopper attention's: three MMA warpgroups over one buffer; head dim 256 (64 keys a step);
    # head dim 32 (not a multiple of 64): the mma.sync kernel
    ("sm_90a_attention_three_warpgroups_d192_f16", "sm_90a", [((1, 2, 100, 192), "f16")] * 3, "attention",
     {"causal": False, "schedule": {"tile": [192, 16, 64], "stages": 1}}),
    ("sm_90a_attention_three_warpgroups_taking_turns_causal_f16", "sm_90a", [((1, 2, 300, 64), "f16")] * 3,
     "attention", {"causal": True, "schedule": {"tile": [192, 32, 64], "stages": 2}}),
    ("sm_90a_attention_d256_causal_bf16", "sm_90a", [((1, 1, 70, 256), "bf16")] * 3, "attention", {"causal": True}),
    ("sm_90a_attention_d32_f16", "sm_90a", [((1, 2, 40, 32), "f16")] * 3, "attention", {"causal": False}),
]


def _schedule(td, fields: dict):
    return td.Schedule(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})


def check_function(td, inputs, kind, params):
    """The function a check runs; params["schedule"], if any: td.Schedule's fields (JSON);
    params["out_dtype"]: the GEMMs' output type (default f32); params["scale"]: attention's
    score scale (default 1/sqrt(head dim))."""
    tensors = [td.tensor(shape, dtype) for shape, dtype in inputs]
    schedule = _schedule(td, params["schedule"]) if "schedule" in params else None
    out_dtype = params.get("out_dtype", "f32")
    if kind == "linear":  # x @ W^T [+ bias, GELU [+ residual]]
        def body(x, w, *rest):
            steps = [td.bias_add(rest[0]), td.gelu()] if rest else []
            steps += [td.residual_add(rest[1])] if len(rest) > 1 else []
            return td.fused_gemm(x, w, steps, transpose_b=True, out_dtype=out_dtype, schedule=schedule)
    elif kind == "gemm":
        def body(a, b):
            return td.gemm(a, b, transpose_a=params.get("transpose_a", False), out_dtype=out_dtype, schedule=schedule)
    elif kind == "conv":
        def body(x, w, b):
            return td.conv2d(x, w, b, stride=params["stride"], padding=params["padding"], layout="nhwc",
                             out_dtype="f32")
    else:
        def body(q, k, v):
            return td.attention(q, k, v, scale=params.get("scale"), causal=params["causal"], schedule=schedule)
    return td.function(*tensors, name="kernel")(body)


def check_reference(torch, kind, params, xs):
    f = [x.float() for x in xs]
    F = torch.nn.functional
    if kind == "linear":
        y = F.linear(f[0], f[1], f[2] if len(f) > 2 else None)
        if len(f) > 2:
            y = F.gelu(y)
        return y + f[3] if len(f) > 3 else y
    if kind == "gemm":
        return (f[0].transpose(-1, -2) if params.get("transpose_a") else f[0]) @ f[1]
    if kind == "conv":
        return F.conv2d(f[0].permute(0, 3, 1, 2), f[1].permute(3, 2, 0, 1), f[2], stride=params["stride"],
                        padding=params["padding"]).permute(0, 2, 3, 1)
    return F.scaled_dot_product_attention(f[0], f[1], f[2], is_causal=params["causal"], scale=params.get("scale"))


def check(directory: str, emulate: bool = False) -> int:
    """emulate: run the PTX on the CPU (verification/ptx_emulator.py) instead of a GPU."""
    sys.path.insert(0, RUNTIME)
    import torch

    if emulate:
        device = None
        print(f"PTX emulator on the CPU, torch {torch.__version__}", flush=True)
    else:
        import cuda_launcher as cl  # noqa: E402 - by path: no MLIR on the GPU machine
        device = cl.Device.get(0)
        print(f"device: {device}, torch {torch.__version__}", flush=True)
    with open(os.path.join(directory, "checks.json")) as f:
        checks = json.load(f)
    failed = 0
    watchdog = Watchdog(900 if emulate else 60)
    for name, chip, inputs, kind, params in checks:
        if device is not None and device.runs(chip) is None:
            print(f"skip  {name}: {device} cannot run {chip} code", flush=True)
            continue
        with watchdog.case(name):
            failed += not _check_case(torch, device, os.path.join(directory, name), inputs, kind, params)
    print(f"{failed} of {len(checks)} checks failed" if failed else "all checks passed", flush=True)
    return 1 if failed else 0


def _check_case(torch, device, path: str, inputs, kind, params) -> bool:
    """One check on `device`, or emulated if None; prints the outcome, says whether it passed."""
    import gpu_artifact  # noqa: E402 - by path: no MLIR on the GPU machine
    dtypes = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}
    name = os.path.basename(path)
    torch.manual_seed(0)
    xs = [torch.randn(*shape, device="cuda" if device else "cpu", dtype=dtypes[dtype]) for shape, dtype in inputs]
    try:
        artifact = gpu_artifact.GpuKernelArtifact.load(path)
        if device is None:
            import ptx_emulator
            out = torch.from_numpy(ptx_emulator.emulate(artifact, *[x.float().numpy() for x in xs])[0])
            where = "emulated"
        else:
            import cuda_launcher as cl
            kernel = cl.CudaKernel(artifact, device)
            out = kernel(*xs)
            torch.cuda.synchronize()
            where = kernel.loaded_from
            kernel.close()
        error = _relative_error(out, check_reference(torch, kind, params, xs))
        ok = error < 2e-2
        print(f"{'ok  ' if ok else 'BAD '} {name}: max rel. error {error:.1e} [{where}]", flush=True)
    except Exception as e:  # report every case, not only the first failure
        ok = False
        print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)
    return ok


def case_name(dtype: str, transpose_b: bool, size: int, chip: str) -> str:
    return f"gemm_{dtype}_{'nt' if transpose_b else 'nn'}_{size}_{chip}"


def _build_variants(tracea, td, directory: str, chip: str, base: str, problem: dict, variants: dict,
                    make) -> list[dict]:
    """The default and each of `variants` (schedule fields) of one problem: `make(schedule)` is
    its function; each artifact is saved as base[_variant] and described in the returned cases.
    A schedule the compiler refuses for this problem (too many registers or too much shared
    memory for its head dim, say) is skipped, saying why; the default must always compile."""
    cases = []
    for variant, schedule in [("default", None)] + list(variants.items()):
        name = base + ("" if schedule is None else "_" + variant.replace(" ", "_"))
        try:
            artifact = tracea.compile_gpu(make(schedule and _schedule(td, schedule)), chip=chip)
        except tracea.TraceaError as e:
            if schedule is None:
                raise
            print(f"skip {name}: {str(e).splitlines()[-1].strip()}", flush=True)
            continue
        artifact.save(os.path.join(directory, name))
        cases.append({"name": name, "chip": chip, **problem, "variant": variant, "registers": artifact.registers,
                      "shared_bytes": artifact.dynamic_shared_bytes, "block": artifact.block})
        print(f"built {name}: {artifact.registers} registers, {artifact.dynamic_shared_bytes // 1024} KB "
              f"shared memory, grid {artifact.grid}, block {artifact.block}", flush=True)
    return cases


def build(directory: str, chips: list[str]) -> int:
    sys.path.insert(0, os.path.join(HERE, ".."))
    import tracea
    from tracea import dialects as td
    os.makedirs(directory, exist_ok=True)
    cases = []
    for chip in chips:
        for dtype, transpose_b, size in CASES:
            def gemm(schedule, t=transpose_b, d=dtype, n=size):
                return td.function(td.tensor((n, n), d), td.tensor((n, n), d), name="gemm")(
                    lambda a, b: td.gemm(a, b, transpose_b=t, schedule=schedule))
            cases += _build_variants(tracea, td, directory, chip, case_name(dtype, transpose_b, size, chip),
                                     {"dtype": dtype, "transpose_b": transpose_b, "size": size}, VARIANTS[chip], gemm)
    for batch, hw, c, f, kk, stride, pad in CONVS:
        name = f"conv_f16_n{batch}_{hw}x{hw}_c{c}_f{f}_k{kk}"
        fn = td.function(td.tensor((batch, hw, hw, c), "f16"), td.tensor((kk, kk, c, f), "f16"), name="conv")(
            lambda x, w, s=stride, p=pad: td.conv2d(x, w, stride=s, padding=p, layout="nhwc"))
        artifact = tracea.compile_gpu(fn, chip="sm_80")
        artifact.save(os.path.join(directory, name))
        cases.append({"name": name, "chip": "sm_80", "dtype": "f16", "conv": [batch, hw, c, f, kk, stride, pad]})
        print(f"built {name}: {artifact.registers} registers", flush=True)
    for chip in chips:
        for dtype, batch, heads, seq, dim, causal in ATTENTIONS:
            def attention(schedule, d=dtype, shape=(batch, heads, seq, dim), c=causal):
                return td.function(*[td.tensor(shape, d)] * 3, name="attention")(
                    lambda q, k, v: td.attention(q, k, v, causal=c, schedule=schedule))
            base = f"attention_{dtype}_b{batch}_h{heads}_s{seq}_d{dim}{'_causal' if causal else ''}_{chip}"
            cases += _build_variants(tracea, td, directory, chip, base,
                                     {"dtype": dtype, "attention": [batch, heads, seq, dim, causal]},
                                     ATTENTION_VARIANTS[chip], attention)
    with open(os.path.join(directory, "cases.json"), "w") as f:
        json.dump(cases, f, indent=1)
    for name, chip, inputs, kind, params in CHECKS:
        tracea.compile_gpu(check_function(td, inputs, kind, params), chip=chip).save(os.path.join(directory, name))
        print(f"built check {name}", flush=True)
    with open(os.path.join(directory, "checks.json"), "w") as f:
        json.dump(CHECKS, f, indent=1)
    return 0


class Watchdog:
    """Ends the process when one case runs past `seconds`: a kernel that deadlocks (a wait on a
    barrier nobody arrives at) never returns, and time on the GPU machine is short. `on_hang`
    saves what was measured first."""

    def __init__(self, seconds: float, on_hang=lambda: None):
        self.seconds, self.on_hang = seconds, on_hang

    @contextlib.contextmanager
    def case(self, name: str):
        def fire():
            print(f"HANG: {name} did not finish in {self.seconds:g} s; stopping", flush=True)
            self.on_hang()
            os._exit(3)  # the main thread is blocked in the driver: only exiting the process frees it
        timer = threading.Timer(self.seconds, fire)
        timer.start()
        try:
            yield
        finally:
            timer.cancel()


def problem(torch, case, device: str = "cuda"):
    """(inputs, f32 reference, {peer: call}, flops) of a timed case."""
    dtype = torch.float16 if case["dtype"] == "f16" else torch.bfloat16
    torch.manual_seed(0)
    F = torch.nn.functional
    if "attention" in case:
        batch, heads, seq, dim, causal = case["attention"]
        q, k, v = (torch.randn(batch, heads, seq, dim, device=device, dtype=dtype) for _ in range(3))
        expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
        peers = {"torch": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)}
        if triton_attention is not None and device == "cuda":
            peers["triton"] = lambda: triton_attention.attention(q, k, v, causal)
        return (q, k, v), expected, peers, 4.0 * batch * heads * seq * seq * dim / (2 if causal else 1)
    if "conv" in case:
        batch, hw, c, f, kk, stride, pad = case["conv"]
        x = torch.randn(batch, hw, hw, c, device=device, dtype=dtype)
        w = torch.randn(kk, kk, c, f, device=device, dtype=dtype)
        x_t = x.permute(0, 3, 1, 2)  # NCHW view of channels-last memory: cuDNN's NHWC kernels
        w_t = w.permute(3, 2, 0, 1).contiguous(memory_format=torch.channels_last)
        expected = F.conv2d(x_t.float(), w_t.float(), stride=stride, padding=pad).permute(0, 2, 3, 1)
        peers = {"torch": lambda: F.conv2d(x_t, w_t, stride=stride, padding=pad).permute(0, 2, 3, 1)}  # a view
        out_hw = (hw + 2 * pad - kk) // stride + 1
        return (x, w), expected, peers, 2.0 * batch * out_hw * out_hw * f * c * kk * kk
    size, transpose_b = case["size"], case["transpose_b"]
    a, b = (torch.randn(size, size, device=device, dtype=dtype) for _ in range(2))
    b_as_used = b.T if transpose_b else b
    expected = a.float() @ b_as_used.float()
    return (a, b), expected, {"torch": lambda: torch.matmul(a, b_as_used)}, 2.0 * size ** 3


def _relative_error(out, expected) -> float:
    return ((out.float() - expected).abs().max() / expected.abs().max().clamp(min=1e-6)).item()


def _problem_key(case) -> str:
    """The problem a case computes, whatever kernel (or chip) computes it: the peers' key."""
    return json.dumps({k: v for k, v in case.items() if k in ("dtype", "transpose_b", "size", "conv", "attention")})


def _what(r) -> str:
    if "attention" in r:
        return f"attention {r['dtype']} {r['attention']} (B, H, S, D, causal)"
    if "conv" in r:
        return f"conv {r['conv']} (N, HW, C, F, k, stride, pad)"
    return f"{r['dtype']} {'A B^T' if r['transpose_b'] else 'A B'} {r['size']}^3"


def run(directory: str, out_dir: str, only: str | None, iterations: int) -> int:
    """Check and time every case (those whose name matches `only`, if given) against torch, and
    attention against the Triton peer too; the full results go to out_dir/gpu-run.json (kept up
    to date as cases finish) and .md, a summary per problem to stdout."""
    sys.path.insert(0, RUNTIME)
    import cuda_launcher as cl  # noqa: E402 - by path: no MLIR on the GPU machine
    import gpu_artifact
    import torch

    device = cl.Device.get(0)
    print(f"device: {device}, torch {torch.__version__}, Triton peer: "
          f"{'yes' if triton_attention else 'no (triton not importable)'}", flush=True)
    with open(os.path.join(directory, "cases.json")) as f:
        cases = [c for c in json.load(f) if only is None or re.search(only, c["name"])]
    os.makedirs(out_dir, exist_ok=True)
    results = os.path.join(out_dir, "gpu-run.json")
    rows, failures = [], []
    save = lambda: _write_json(results, {"device": str(device), "torch": torch.__version__,  # noqa: E731
                                         "rows": rows, "failures": failures})
    watchdog = Watchdog(180, save)  # the first Triton call of a problem autotunes: tens of seconds
    peer_times: dict[str, dict] = {}  # per problem, shared by all its variants and chips
    for case in cases:
        if device.runs(case["chip"]) is None:
            print(f"skip {case['name']}: {device} cannot run {case['chip']} code", flush=True)
            continue
        try:
            with watchdog.case(case["name"]):
                row = _measure(cl, gpu_artifact, torch, device, directory, case, peer_times, iterations)
        except Exception as e:  # the other cases still run; a broken context makes them fail fast
            failures.append({"name": case["name"], "error": f"{type(e).__name__}: {e}"})
            print(f"FAIL {case['name']}: {failures[-1]['error']}", flush=True)
            save()
            continue
        rows.append(row)
        save()
        peers_text = "  ".join(f"{p} {_tflops(row, p)}" for p in peer_times[_problem_key(case)])
        print(f"{case['name']:<56} {'ok ' if row['ok'] else 'BAD'} err {row['max_rel_error']:.1e}  tracea "
              f"{_tflops(row, 'tracea')} TFLOP/s  {peers_text}  ({_ratio(row, 'torch')})  [{row['loaded_from']}]",
              flush=True)
    with open(os.path.join(out_dir, "gpu-run.md"), "w") as f:
        f.write(markdown_table(rows))
    print(f"\nfull results: {results}, table: {os.path.join(out_dir, 'gpu-run.md')}\n")
    print(summary(rows), flush=True)
    print(f"{len(failures)} cases failed to run: {', '.join(f['name'] for f in failures)}" if failures else "",
          flush=True)
    return 0 if all(r["ok"] for r in rows) and not failures else 1


def _measure(cl, gpu_artifact, torch, device, directory: str, case, peer_times, iterations: int) -> dict:
    """Check and time one case, and its problem's peers the first time the problem comes up."""
    kernel = cl.CudaKernel(gpu_artifact.GpuKernelArtifact.load(os.path.join(directory, case["name"])), device)
    try:
        inputs, expected, peers, flops = problem(torch, case)
        error = _relative_error(kernel(*inputs), expected)
        ours = kernel.time(*inputs, iterations=iterations, warmup=10)
    finally:
        kernel.close()
    key = _problem_key(case)
    if key not in peer_times:
        peer_times[key] = {}
        for peer, call in peers.items():
            peer_error = _relative_error(call(), expected)
            peer_times[key][peer] = _time_torch(call, iterations) if peer_error < 1e-2 else None
            if peer_error >= 1e-2:
                print(f"peer {peer} is WRONG on {_what(case)} (max rel. error {peer_error:.1e}): not timed")
    return {**case, "loaded_from": kernel.loaded_from, "ok": error < 1e-2, "max_rel_error": error,
            "tracea_tflops": flops / ours / 1e12,
            **{f"{peer}_tflops": t and flops / t / 1e12 for peer, t in peer_times[key].items()}}


def _write_json(path: str, value) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(value, f, indent=1)
    os.replace(path + ".tmp", path)


def _tflops(r, who: str) -> str:
    return f"{r[who + '_tflops']:.1f}" if r.get(who + "_tflops") else "-"


def _ratio(r, peer: str) -> str:
    return f"{r['tracea_tflops'] / r[peer + '_tflops']:.2f}x" if r.get(peer + "_tflops") else "-"


def markdown_table(rows) -> str:
    lines = ["| kernel | chip (loaded as) | schedule | correct (max rel. error) | Tracea TFLOP/s "
             "| torch (cuBLAS / cuDNN / SDPA) TFLOP/s | ratio | Triton TFLOP/s | ratio |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {_what(r)} | {r['chip']} ({r['loaded_from']}) | {r.get('variant', 'default')} "
                     f"| {'yes' if r['ok'] else 'NO'} ({r['max_rel_error']:.1e}) | {_tflops(r, 'tracea')} "
                     f"| {_tflops(r, 'torch')} | **{_ratio(r, 'torch')}** | {_tflops(r, 'triton')} "
                     f"| {_ratio(r, 'triton')} |")
    return "\n".join(lines) + "\n"


def summary(rows) -> str:
    """One line per problem: the default schedule's ratios and the best correct variant's."""
    problems: dict[str, list] = {}
    for r in rows:
        problems.setdefault((r["chip"], _problem_key(r)), []).append(r)
    lines = []
    for variants in problems.values():
        default = next((r for r in variants if r.get("variant", "default") == "default"), variants[0])
        good = [r for r in variants if r["ok"]]
        best = max(good, key=lambda r: r["tracea_tflops"]) if good else None
        text = (f"{default['chip']} {_what(default)}: default {default['tracea_tflops']:.0f} TFLOP/s "
                f"{_ratio(default, 'torch')} torch")
        text += f" {_ratio(default, 'triton')} Triton" if default.get("triton_tflops") else ""
        text += "" if default["ok"] else " WRONG"
        if best is not None and best is not default:
            text += f"; best {best['variant']} {best['tracea_tflops']:.0f} ({_ratio(best, 'torch')})"
        lines.append(text)
    return "\n".join(lines)


NCU_SECTIONS = ("SpeedOfLight", "ComputeWorkloadAnalysis", "MemoryWorkloadAnalysis", "Occupancy", "LaunchStats",
                "WarpStateStats", "SchedulerStats")
NCU_KEY_LINES = re.compile(r"^\s*(Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|L2 Hit Rate|"
                           r"Registers Per Thread|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|"
                           r"Block Limit \w+|Shared Memory Configuration Size)\b")


def launch(directory: str, name: str) -> int:
    """Launch one case's kernel once on its inputs (what `profile` runs under ncu)."""
    sys.path.insert(0, RUNTIME)
    import cuda_launcher as cl  # noqa: E402 - by path: no MLIR on the GPU machine
    import gpu_artifact
    import torch
    with open(os.path.join(directory, "cases.json")) as f:
        case = next((c for c in json.load(f) if c["name"] == name), None)
    if case is None:
        raise SystemExit(f"no case {name} in {directory}/cases.json")
    kernel = cl.CudaKernel(gpu_artifact.GpuKernelArtifact.load(os.path.join(directory, name)), cl.Device.get(0))
    inputs, _, _, _ = problem(torch, case)
    kernel(*inputs)
    torch.cuda.synchronize()
    return 0


def profile_choices(rows) -> list[tuple[str, dict]]:
    """("worst" | "best", row) of the correct default GEMMs and attentions, by ratio to torch."""
    rows = [r for r in rows if r["ok"] and r.get("variant", "default") == "default" and r.get("torch_tflops")]
    chosen = []
    for family in ([r for r in rows if "size" in r], [r for r in rows if "attention" in r]):
        family.sort(key=lambda r: r["tracea_tflops"] / r["torch_tflops"])
        chosen += [("worst", family[0]), ("best", family[-1])] if family else []
    return chosen


def profile(directory: str, results: str, out_dir: str) -> int:
    """ncu on the best and the worst default GEMM and attention kernel of a `run` (by their ratio
    to torch): the full reports go to out_dir/ncu.txt, their key lines to stdout."""
    import subprocess
    with open(results) as f:
        chosen = profile_choices(json.load(f)["rows"])
    report = os.path.join(out_dir, "ncu.txt")
    with open(report, "w") as log:
        for which, r in chosen:
            with open(os.path.join(directory, r["name"] + ".json")) as f:
                kernel_name = json.load(f)["name"]
            command = ["ncu", "--clock-control", "none", "--kernel-name", kernel_name, "--launch-count", "1",
                       *[a for section in NCU_SECTIONS for a in ("--section", section)],
                       sys.executable, os.path.abspath(__file__), "launch", directory, r["name"]]
            print(f"\n== {which}: {r['name']} ({r['tracea_tflops'] / r['torch_tflops']:.2f}x torch)", flush=True)
            done = subprocess.run(command, capture_output=True, text=True, timeout=300)
            log.write(f"== {which}: {r['name']}\n$ {' '.join(command)}\n{done.stdout}{done.stderr}\n")
            lines = [line for line in done.stdout.splitlines() if NCU_KEY_LINES.match(line)]
            print("\n".join(lines) if done.returncode == 0 and lines else
                  f"ncu failed ({done.returncode}): {(done.stderr or done.stdout)[-600:]}", flush=True)
    print(f"\nfull ncu reports: {report}")
    return 0


def _time_torch(call, iterations: int) -> float:
    import torch
    for _ in range(10):
        call()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(iterations):
        start.record()
        call()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / 1e3)
    return sorted(times)[len(times) // 2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="step", required=True)
    b = sub.add_parser("build", help="compile the kernels (needs Tracea and MLIR)")
    b.add_argument("directory")
    b.add_argument("--chips", default="sm_80,sm_90a", help="comma-separated: sm_80, sm_90a")
    r = sub.add_parser("run", help="check and time them (needs a GPU, torch and cuda-bindings)")
    r.add_argument("directory")
    r.add_argument("--out", help="where gpu-run.json and gpu-run.md go (default: the directory)")
    r.add_argument("--only", metavar="REGEX", help="only the cases whose name matches")
    r.add_argument("--iterations", type=int, default=50)
    c = sub.add_parser("check", help="compare every kernel variant with torch (needs a GPU, torch and cuda-bindings)")
    c.add_argument("directory")
    c.add_argument("--emulate", action="store_true",
                   help="run the kernels' PTX in Tracea's emulator on the CPU (no GPU; minutes)")
    p = sub.add_parser("profile", help="ncu on the best and worst kernels of a run (needs a GPU and ncu)")
    p.add_argument("directory")
    p.add_argument("results", help="a run's gpu-run.json")
    p.add_argument("--out", help="where ncu.txt goes (default: the directory)")
    one = sub.add_parser("launch", help="launch one case's kernel once (what profile runs under ncu)")
    one.add_argument("directory")
    one.add_argument("name")
    args = parser.parse_args()
    if args.step == "build":
        return build(args.directory, args.chips.split(","))
    if args.step == "check":
        return check(args.directory, args.emulate)
    if args.step == "profile":
        return profile(args.directory, args.results, args.out or args.directory)
    if args.step == "launch":
        return launch(args.directory, args.name)
    return run(args.directory, args.out or args.directory, args.only, args.iterations)


if __name__ == "__main__":
    sys.exit(main())
