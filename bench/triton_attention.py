"""The Triton peer for the attention goal (GOALS.md: ">= Triton's fused attention in the same
run"): a FlashAttention-2 style forward kernel written for this benchmark. One program per
BLOCK_M query rows of one (batch, head) walks the keys BLOCK_N at a time with an online softmax
in base 2 (exp2 of scores pre-scaled by log2(e) / sqrt(D)); only the blocks that need masks get
them (the ragged last key block; for causal attention, the blocks on the diagonal). Autotuned per
problem over the tile sizes, warps and pipeline stages such kernels run best with on an H100.

Runs where Triton does: on the GPU machine, or on the CPU with TRITON_INTERPRET=1 (slow; that is
how it was checked without a GPU).
"""
from __future__ import annotations

import triton
import triton.language as tl

LOG2_E = 1.4426950408889634
CONFIGS = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)
           for m, n, w, s in [(128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 4, 3), (128, 32, 4, 4),
                              (64, 64, 4, 4), (128, 128, 8, 2)]]


@triton.jit
def _attend(acc, l, m, q, K, V, base, key_lo, key_hi, rows, seq, qk_scale,
            HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr):
    """Fold keys [key_lo, key_hi) into the running (acc, row sum l, row max m)."""
    dims = tl.arange(0, HEAD_DIM)
    for key0 in range(key_lo, key_hi, BLOCK_N):
        keys = key0 + tl.arange(0, BLOCK_N)
        k_ptrs = K + base + keys[None, :] * HEAD_DIM + dims[:, None]  # K^T: HEAD_DIM x BLOCK_N
        v_ptrs = V + base + keys[:, None] * HEAD_DIM + dims[None, :]
        if MASKED:
            k_t = tl.load(k_ptrs, mask=keys[None, :] < seq, other=0.0)
        else:
            k_t = tl.load(k_ptrs)
        s = tl.dot(q, k_t) * qk_scale
        if MASKED:
            keep = keys[None, :] < seq
            if CAUSAL:
                keep = keep & (keys[None, :] <= rows[:, None])
            s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m - m_new)
        l = l * alpha + tl.sum(p, 1)
        if MASKED:
            v = tl.load(v_ptrs, mask=keys[:, None] < seq, other=0.0)
        else:
            v = tl.load(v_ptrs)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m = m_new
    return acc, l, m


@triton.autotune(configs=CONFIGS, key=["seq", "HEAD_DIM", "CAUSAL"])
@triton.jit
def _attention_kernel(Q, K, V, O, seq, qk_scale, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start = tl.program_id(0) * BLOCK_M
    base = tl.program_id(1).to(tl.int64) * seq * HEAD_DIM  # contiguous (batch, head, seq, dim)
    rows = start + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + base + rows[:, None] * HEAD_DIM + dims[None, :], mask=rows[:, None] < seq, other=0.0)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    if CAUSAL:  # keys before the block's first query unmasked, the diagonal ones masked
        acc, l, m = _attend(acc, l, m, q, K, V, base, 0, start, rows, seq, qk_scale, HEAD_DIM, BLOCK_N, False, True)
        acc, l, m = _attend(acc, l, m, q, K, V, base, start, tl.minimum(start + BLOCK_M, seq), rows, seq, qk_scale,
                            HEAD_DIM, BLOCK_N, True, True)
    else:
        full = seq // BLOCK_N * BLOCK_N
        acc, l, m = _attend(acc, l, m, q, K, V, base, 0, full, rows, seq, qk_scale, HEAD_DIM, BLOCK_N, False, False)
        acc, l, m = _attend(acc, l, m, q, K, V, base, full, seq, rows, seq, qk_scale, HEAD_DIM, BLOCK_N, True, False)
    out = acc / l[:, None]
    tl.store(O + base + rows[:, None] * HEAD_DIM + dims[None, :], out.to(O.dtype.element_ty), mask=rows[:, None] < seq)


def attention(q, k, v, causal: bool):
    """softmax(q k^T / sqrt(D)) v for (batch, heads, seq, D) tensors (D a power of two >= 16)."""
    batch, heads, seq, dim = q.shape
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    out = q.new_empty(q.shape)
    grid = lambda meta: (triton.cdiv(seq, meta["BLOCK_M"]), batch * heads)  # noqa: E731
    _attention_kernel[grid](q, k, v, out, seq, dim ** -0.5 * LOG2_E, HEAD_DIM=dim, CAUSAL=causal)
    return out
