"""The main job: a transformer block built with the Python API, compiled for the CPU, checked
against a float64 numpy reference, and timed."""
from __future__ import annotations

import time

import numpy as np

from .. import compile as tracea_compile
from .. import dialects as td


def build_block(batch: int, seq: int, dim: int, hidden: int, vocab: int) -> td.Function:
    """Single-head attention + GELU MLP + output softmax, as tracea ops."""
    x_t, sq = td.tensor((batch, seq, dim)), td.tensor((dim, dim))

    @td.function(x_t, sq, sq, sq, sq, td.tensor(dim), td.tensor((dim, hidden)), td.tensor(hidden),
                 td.tensor((hidden, dim)), td.tensor(dim), td.tensor((dim, vocab)))
    def transformer_block(x, wq, wk, wv, wo, bo, w1, b1, w2, b2, w_out):
        q, k, v = td.gemm(x, wq), td.gemm(x, wk), td.gemm(x, wv)
        a = td.attention(q, k, v, causal=True)
        h = td.fused_gemm(a, wo, [td.bias_add(bo), td.residual_add(x)])
        m = td.fused_gemm(h, w1, [td.bias_add(b1), td.gelu("tanh")])
        y = td.fused_gemm(m, w2, [td.bias_add(b2), td.residual_add(h)])
        return td.softmax(td.gemm(y, w_out), axis=-1)

    return transformer_block


def reference(x, wq, wk, wv, wo, bo, w1, b1, w2, b2, w_out):
    """The same block in float64 numpy."""
    x, wq, wk, wv, wo, bo, w1, b1, w2, b2, w_out = (a.astype(np.float64) for a in
                                                    (x, wq, wk, wv, wo, bo, w1, b1, w2, b2, w_out))
    q, k, v = x @ wq, x @ wk, x @ wv
    s = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1])
    s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    a = (p / p.sum(-1, keepdims=True)) @ v
    h = a @ wo + bo + x
    m = h @ w1 + b1
    m = 0.5 * m * (1 + np.tanh(np.sqrt(2 / np.pi) * (m + 0.044715 * m ** 3)))
    y = m @ w2 + b2 + h
    logits = y @ w_out
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def flops(batch, seq, dim, hidden, vocab) -> float:
    rows = batch * seq
    return 2.0 * rows * (4 * dim * dim + 2 * dim * hidden + dim * vocab) + 4.0 * batch * seq * seq * dim


def run(batch: int = 2, seq: int = 128, dim: int = 128, hidden: int = 512, vocab: int = 256,
        repeat: int = 5, seed: int = 0) -> bool:
    print(f"tracea demo: transformer block (batch {batch}, seq {seq}, dim {dim}, mlp {hidden}, "
          f"vocab {vocab}), f32, target cpu")
    t0 = time.perf_counter()
    block = build_block(batch, seq, dim, hidden, vocab)
    t_build = time.perf_counter() - t0
    ops = [line.split('"')[1] for line in str(block).splitlines() if '"tracea.' in line]
    print(f"  built with the Python API in {t_build * 1e3:.1f} ms: {len(ops)} ops "
          f"({', '.join(sorted(set(ops), key=ops.index))})")

    t0 = time.perf_counter()
    kernel = tracea_compile(block)
    t_compile = time.perf_counter() - t0
    how = ("loaded from the disk cache" if kernel.origin == "disk cache"
           else "compiled (tracea -> linalg -> bufferized -> LLVM -> JIT)")
    print(f"  {how} in {t_compile:.3f} s", flush=True)

    rng = np.random.default_rng(seed)
    # Weights scaled by 1/sqrt(fan-in) so activations stay O(1), as in a trained model.
    args = [(rng.standard_normal(s.shape) / np.sqrt(s.shape[0] if len(s.shape) == 2 else 1)).astype(np.float32)
            for s in kernel.signature.inputs]
    out = kernel(*args)
    expected = reference(*args)
    err = float(np.abs(out - expected).max())
    ok = bool(np.allclose(out, expected, rtol=1e-4, atol=1e-5))
    print(f"  result {out.shape} {out.dtype}: max |error| vs float64 numpy = {err:.2e} "
          f"-> {'OK' if ok else 'MISMATCH'}")

    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        kernel(*args)
        times.append(time.perf_counter() - t0)
    t_run = float(np.median(times))
    np_times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        reference(*args)
        np_times.append(time.perf_counter() - t0)
    gflops = flops(batch, seq, dim, hidden, vocab) / t_run / 1e9
    print(f"  run: median {t_run * 1e3:.1f} ms over {repeat} runs = {gflops:.2f} GFLOP/s "
          f"(numpy float64 reference: {float(np.median(np_times)) * 1e3:.1f} ms)")
    return ok
