"""The main job, on the CPU: a transformer block written with Tracea's Python API and a GPT-2-style
decoder written in PyTorch, each compiled, checked (float64 numpy / eager PyTorch) and timed beside
its peers as a program calling them in turn would see them: numpy, eager PyTorch and
torch.compile (inductor), call by call in one process, medians."""
from __future__ import annotations

import math
import sys
import time

import numpy as np

from .. import compile as tracea_compile
from .. import dialects as td
from .timing import interleaved_times


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


def reference(x, wq, wk, wv, wo, bo, w1, b1, w2, b2, w_out, dtype=np.float64):
    """The same block in numpy (float64: the check; float32: the timing peer)."""
    x, wq, wk, wv, wo, bo, w1, b1, w2, b2, w_out = (a.astype(dtype) for a in
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


class Row:
    """One line of the demo's table: milliseconds per call, compile seconds, the error checked."""

    def __init__(self, name: str, peer: str):
        self.name, self.peer = name, peer
        self.ms: dict[str, float] = {}
        self.compile_s: dict[str, float] = {}
        self.error = math.nan
        self.ok = False


def api_program(batch, seq, dim, hidden, vocab, rounds) -> Row:
    row = Row(f"Tracea API: transformer block (batch {batch}, seq {seq}, d{dim}, mlp {hidden}, vocab {vocab})",
              "numpy f32")
    t0 = time.perf_counter()
    block = build_block(batch, seq, dim, hidden, vocab)
    ops = [line.split('"')[1] for line in str(block).splitlines() if '"tracea.' in line]
    print(f"  built with the Python API in {(time.perf_counter() - t0) * 1e3:.1f} ms: {len(ops)} ops "
          f"({', '.join(sorted(set(ops), key=ops.index))})")
    t0 = time.perf_counter()
    kernel = tracea_compile(block)
    row.compile_s["tracea"] = time.perf_counter() - t0
    how = ("loaded from the disk cache" if kernel.origin == "disk cache"
           else "compiled (tracea -> linalg -> bufferized -> LLVM -> JIT)")
    print(f"  {how} in {row.compile_s['tracea']:.3f} s", flush=True)
    rng = np.random.default_rng(0)
    # weights scaled by 1/sqrt(fan-in) so activations stay O(1), as in a trained model
    args = [(rng.standard_normal(s.shape) / np.sqrt(s.shape[0] if len(s.shape) == 2 else 1)).astype(np.float32)
            for s in kernel.signature.inputs]
    out, expected = kernel(*args), reference(*args)
    row.error = float(np.abs(out - expected).max())
    row.ok = bool(np.allclose(out, expected, rtol=1e-4, atol=1e-5))
    print(f"  result {out.shape} {out.dtype}: max |error| vs float64 numpy = {row.error:.2e} "
          f"-> {'OK' if row.ok else 'MISMATCH'}")
    t = interleaved_times({"tracea": lambda: kernel(*args), "peer": lambda: reference(*args, dtype=np.float32)},
                          rounds, seconds=1.0)
    row.ms = {name: seconds * 1e3 for name, seconds in t.items()}
    print(f"  run: median {row.ms['tracea']:.2f} ms = "
          f"{flops(batch, seq, dim, hidden, vocab) / t['tracea'] / 1e9:.2f} GFLOP/s "
          f"(numpy float32: {row.ms['peer']:.2f} ms)", flush=True)
    return row


def gpt_decoder(layers: int = 4, dim: int = 256, heads: int = 4, vocab: int = 1024, context: int = 256):
    """A GPT-2-style decoder written in PyTorch: token and position embeddings, pre-LayerNorm
    blocks of causal multi-head attention and a GELU MLP, a final LayerNorm and an LM head tied to
    the embeddings. Random weights (nothing downloaded)."""
    import torch
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
            self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU("tanh"), nn.Linear(4 * dim, dim))

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, heads, dim // heads).permute(2, 0, 3, 1, 4)
            a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, s, dim))
            return x + self.mlp(self.ln2(x))

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens, self.positions = nn.Embedding(vocab, dim), nn.Embedding(context, dim)
            self.blocks = nn.Sequential(*[Block() for _ in range(layers)])
            self.ln = nn.LayerNorm(dim)

        def forward(self, ids):
            positions = torch.arange(ids.shape[1], device=ids.device)
            x = self.blocks(self.tokens(ids) + self.positions(positions))
            return self.ln(x) @ self.tokens.weight.T  # logits, LM head tied to the embeddings

    torch.manual_seed(0)
    return Decoder().eval()


def torch_model(batch: int, seq: int, rounds: int, inductor: bool) -> Row:
    import torch
    model = gpt_decoder()
    row = Row(f"PyTorch: GPT-2-style decoder (4 layers, d256, 4 heads; batch {batch}, seq {seq})", "eager")
    ids = torch.randint(0, 1024, (batch, seq), generator=torch.Generator().manual_seed(1))
    t0 = time.perf_counter()
    ours = tracea_compile(model, (ids,))
    row.compile_s["tracea"] = time.perf_counter() - t0
    print(f"  tracea.compile(model, (ids,)) in {row.compile_s['tracea']:.2f} s "
          f"(torch.export + import {ours.import_seconds:.2f} s)", flush=True)
    calls = {"tracea": lambda: ours(ids)}
    with torch.inference_mode():
        expected = model(ids)
        calls["peer"] = lambda: model(ids)
        if inductor:
            compiled = torch.compile(model)
            try:
                t0 = time.perf_counter()
                got = compiled(ids)
                row.compile_s["inductor"] = time.perf_counter() - t0
                print(f"  torch.compile(model) (inductor) in {row.compile_s['inductor']:.2f} s, max |error| vs "
                      f"eager {float((got - expected).abs().max()):.2e}", flush=True)
                calls["inductor"] = lambda: compiled(ids)
            except Exception as e:  # no C++ compiler, say: the rest of the demo still runs
                print(f"  torch.compile (inductor) failed, left out: {type(e).__name__}: {str(e)[:200]}")
        got = ours(ids)
        row.error = float((got - expected).abs().max())
        row.ok = bool(torch.allclose(got, expected, rtol=1e-3, atol=1e-3))
        print(f"  logits {tuple(got.shape)}: max |error| vs eager = {row.error:.2e} "
              f"-> {'OK' if row.ok else 'MISMATCH'}", flush=True)
        t = interleaved_times(calls, rounds, seconds=2.0)
    row.ms = {name: seconds * 1e3 for name, seconds in t.items()}
    return row


def table(rows: list[Row], threads: int) -> str:
    def ms(row, name):
        return f"{row.ms[name]:.2f}" if name in row.ms else "-"

    def ratio(row, name):  # > 1: Tracea is faster
        return f"{row.ms[name] / row.ms['tracea']:.2f}x" if name in row.ms else "-"

    def seconds(row, name):
        return f"{row.compile_s[name]:.1f} s" if name in row.compile_s else "-"

    lines = [f"Tracea vs its peers, interleaved call by call in this process, medians, {threads} threads "
             "(ratios > 1: Tracea faster)",
             "| program | Tracea ms | peer | peer ms | inductor ms | vs peer | vs inductor | compile Tracea "
             "| compile inductor | max error |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r.name} | {ms(r, 'tracea')} | {r.peer} | {ms(r, 'peer')} | {ms(r, 'inductor')} | "
                     f"{ratio(r, 'peer')} | {ratio(r, 'inductor')} | {seconds(r, 'tracea')} | "
                     f"{seconds(r, 'inductor')} | {r.error:.1e} |")
    return "\n".join(lines)


def run(batch: int = 2, seq: int = 128, dim: int = 128, hidden: int = 512, vocab: int = 256,
        repeat: int = 21, model: bool = True, inductor: bool = True, model_batch: int = 1,
        model_seq: int = 128) -> bool:
    """Both programs, then the table; False if a result does not match its reference."""
    import os
    print("tracea demo, target cpu, f32")
    print("1. a program of Tracea ops (the Python API)", flush=True)
    rows = [api_program(batch, seq, dim, hidden, vocab, repeat)]
    if model:
        try:
            import torch
        except ImportError:
            print("2. skipped: the PyTorch model needs torch (pip install 'tracea[torch]')")
        else:
            print("2. a PyTorch model through tracea.compile", flush=True)
            rows.append(torch_model(model_batch, model_seq, repeat, inductor))
    print()
    print(table(rows, os.cpu_count() or 1))
    sys.stdout.flush()
    return all(r.ok for r in rows)
