"""The fast CPU kernels against numpy and against the reference (linalg) path: schedules small
enough to force every blocking path (several M, N and K blocks, edge tiles, f32 partial sums
for f16/bf16 results), threads, and host-derived default schedules."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest
import scipy.special
from hypothesis import given
from hypothesis import strategies as st

import reference as ref
from tracea.targets.cpu.softmax import ROW_IN_CACHE
import tracea
from tracea import dialects as td
from tracea.codegen.conv_gather import DIRECT_MIN_INTERIOR, ConvGather
from tracea.dialects.ops import TensorSpec
from tracea.targets.cpu.gemm import column_chunk, k_unroll
from tracea.targets.cpu.kernels import (FEW_ROWS, FEW_ROWS_KC, MAX_MR, ROWS_SUMS_BYTES, balanced_m_blocks,
                                       default_gemm_schedule, dot_gemm_schedule, rows_gemm_schedule)
from tracea.codegen.loop_text import busiest_thread
from tracea.targets.cpu.target import openmp_library
from tracea.doctor import PROFILES, Problem, plan
from tracea.doctor.capabilities import CPU_PROFILES, host_cpu
from tracea.targets.cpu.attention import pv_tile

LANES = host_cpu().f32_lanes
# The CPU kernels compute in buffers they allocate from the start; at the linalg stage, the
# linalg ops (vectorized or not) are still on tensors.
KERNEL_MARK = "memref.alloc"


def tiny(mr=3, nr_vectors=1, mc=6, nc_vectors=2, kc=5):
    nr = nr_vectors * LANES
    return td.Schedule(tile=(mc, nc_vectors * nr, kc), warp_tile=(mr, nr, 1), lane_map=td.LaneMap("simd", (LANES,)))


@given(m=st.integers(1, 40), n=st.integers(1, 3 * LANES + 5), k=st.integers(1, 30), ta=st.booleans(), tb=st.booleans(),
       dtype=st.sampled_from(["f32", "f16", "bf16"]), f32_out=st.booleans(), threads=st.sampled_from([1, 2]))
def test_blocked_gemm(m, n, k, ta, tb, dtype, f32_out, threads):
    rng = np.random.default_rng(m * 7919 + n * 31 + k)
    a = ref.random(rng, (k, m) if ta else (m, k), dtype)
    b = ref.random(rng, (n, k) if tb else (k, n), dtype)
    out_dtype = "f32" if f32_out else dtype
    fn = td.function(td.tensor(a.shape, dtype), td.tensor(b.shape, dtype))(
        lambda x, y: td.gemm(x, y, transpose_a=ta, transpose_b=tb, out_dtype=out_dtype, schedule=tiny()))
    out = tracea.compile(fn, threads=threads)(a, b)
    ref.assert_close(out, ref.gemm(a, b, ta, tb), out_dtype, k)


@pytest.mark.parametrize("runtime", ["openmp", "async"])
@pytest.mark.parametrize("m", [7, 61])  # few M blocks (threads share column chunks too), many
def test_parallel_runtimes(runtime, m, monkeypatch):
    if runtime == "openmp" and openmp_library() is None:
        pytest.skip("LLVM's OpenMP runtime (pip package cmeel-libomp) is not installed")
    monkeypatch.setenv("TRACEA_PARALLEL_RUNTIME", runtime)
    rng = np.random.default_rng(m)
    n, k = 5 * LANES + 3, 2 * LANES + 1
    a, b = ref.random(rng, (m, k)), ref.random(rng, (n, k))
    fn = td.function(td.tensor(a.shape), td.tensor(b.shape))(
        lambda x, y: td.gemm(x, y, transpose_b=True, schedule=tiny(nc_vectors=3, kc=2 * LANES)))
    kernel = tracea.compile(fn, threads=2, keep_stages=True)
    assert ("omp.parallel" in kernel.stages["llvm"]) == (runtime == "openmp")
    assert ("mlirAsyncRuntime" in kernel.stages["llvm"]) == (runtime == "async")
    ref.assert_close(kernel(a, b), ref.gemm(a, b, False, True), "f32", k)


_ACTIVATIONS = {"relu": (td.relu, ("relu", None)), "silu": (td.silu, ("silu", None)),
                "gelu_tanh": (lambda: td.gelu("tanh"), ("gelu", "tanh")), "scale": (lambda: td.scale(0.5), ("scale", 0.5))}


@given(batch=st.lists(st.integers(1, 3), min_size=1, max_size=2), m=st.integers(1, 20), n=st.integers(1, 2 * LANES + 3),
       k=st.integers(1, 12), shared_b=st.booleans(), acts=st.lists(st.sampled_from(list(_ACTIVATIONS)), max_size=2),
       use_bias=st.booleans(), use_residual=st.booleans())
def test_blocked_fused_gemm_batched(batch, m, n, k, shared_b, acts, use_bias, use_residual):
    """Batched fused GEMMs (a batched or a shared B, bias, activations, residual) against numpy,
    not against the reference strategy, whose epilogue code is the same."""
    rng = np.random.default_rng(m + n + k)
    a = ref.random(rng, (*batch, m, k))
    b = ref.random(rng, (k, n) if shared_b else (*batch, k, n))
    bias, residual = ref.random(rng, (n,)), ref.random(rng, (*batch, m, n))
    steps = ([("bias_add", None)] if use_bias else []) + [_ACTIVATIONS[name][1] for name in acts] + \
        ([("residual_add", None)] if use_residual else [])

    def body(x, y, bias_v, res_v):
        ops = ([td.bias_add(bias_v)] if use_bias else []) + [_ACTIVATIONS[name][0]() for name in acts] + \
              ([td.residual_add(res_v)] if use_residual else [])
        return td.fused_gemm(x, y, ops, schedule=tiny())

    fn = td.function(*[td.tensor(t.shape) for t in (a, b, bias, residual)])(body)
    tiled = tracea.compile(fn, threads=2)(a, b, bias, residual)
    ref.assert_close(tiled, ref.epilogue(ref.gemm(a, b), steps, bias, residual), "f32", k)


@pytest.mark.parametrize("shape", [(1, 1, 1), (1, 300, 70), (300, 1, 70), (129, 67, 301), (256, 256, 256)])
def test_default_schedule_shapes(shape, rng):
    m, n, k = shape
    a, b, bias = ref.random(rng, (m, k)), ref.random(rng, (k, n)), ref.random(rng, (n,))
    fn = td.function(td.tensor((m, k)), td.tensor((k, n)), td.tensor(n))(
        lambda x, y, z: td.fused_gemm(x, y, [td.bias_add(z), td.gelu()]))
    kernel = tracea.compile(fn, keep_stages=True)
    assert "vector.fma" in kernel.stages["linalg"]  # the fast kernel, not the reference loops
    ref.assert_close(kernel(a, b, bias), ref.epilogue(ref.gemm(a, b), [("bias_add", None), ("gelu", "erf")], bias),
                     "f32", k)


@pytest.mark.parametrize("m, n, k", [(1024, 1024, 1024), (64, 2048, 2048), (128, 256, 1024), (1000, 3000, 500)])
def test_default_schedule_follows_the_host(m, n, k):
    host = host_cpu()
    s = default_gemm_schedule(m, n, k, host, threads=2)
    mc, nc, kc = s.tile
    mr, nr, _ = s.warp_tile
    assert s.lane_map == td.LaneMap("simd", (host.f32_lanes,))
    assert nr == 2 * host.f32_lanes and mr * nr // host.f32_lanes + 3 <= host.vector_registers
    # the B micro-panel streams from L2 through L1; few rows may take K in one block instead (a pass
    # over C and a fork / join fewer) while their A block fits L2
    assert kc * nr * 4 <= 2 * host.l1d_bytes or (m <= FEW_ROWS and kc == k <= FEW_ROWS_KC)
    assert mc * kc * 4 <= host.l2_bytes  # the A block fits L2
    assert mc % mr == 0 and nc % nr == 0
    # enough equal work items for both threads: M blocks x column chunks of the NC panel
    items = -(-m // mc) * -(-min(nc, n) // column_chunk(m, n, mc, nc, nr, 2))
    assert items >= 8 and items % 2 == 0
    if m <= mc:  # one M block: the register tile's height wastes less than one row per strip
        assert -(-m // mr) * mr - m < -(-m // mr)


def _busiest_work(m: int, n: int, mc: int, nc: int, tile: tuple[int, int], threads: int) -> int:
    """The most register tiles one thread computes in an NC panel, its work items (M block,
    column chunk) shared out by OpenMP's static schedule, the last block and chunk short."""
    mr, nr = tile
    chunk = column_chunk(m, n, mc, nc, nr, threads)
    rows = [-(-min(mc, m - i) // mr) for i in range(0, m, mc)]
    columns = [-(-min(chunk, min(nc, n) - j) // nr) for j in range(0, min(nc, n), chunk)]
    return busiest_thread([r * c for r in rows for c in columns], threads)


@pytest.mark.parametrize("m, n, tile, blocks, threads", [
    (1568, 256, (6, 16), 15, 2), (392, 512, (6, 16), 4, 2), (6272, 128, (6, 16), 62, 2), (1024, 1024, (6, 16), 9, 2),
    (1000, 3000, (8, 32), 5, 2), (784, 128, (8, 32), 7, 2), (25088, 64, (4, 64), 112, 2), (777, 200, (6, 16), 6, 4)])
def test_m_blocks_share_the_work_evenly(m, n, tile, blocks, threads):
    """M blocks in a count that leaves no thread more work than it must: never more than the rule
    before (a count the threads divide, from 4 blocks a thread; fewer left as they were), and
    ResNet's 3x3 C256 conv on 14x14 x 8 images (262 strips of 6 rows, 2 threads) as 22 blocks of
    72 rows (132 and 130 strips; 16 blocks of 102 rows had given one thread 136 for the other's 126)."""
    mr = tile[0]
    nc = -(-n // tile[1]) * tile[1]

    def rows(count: int) -> int:
        return -(-(-(-m // count)) // mr) * mr
    chosen = balanced_m_blocks(m, n, tile, nc, blocks, threads)
    before = blocks if blocks < 4 * threads else -(-blocks // threads) * threads
    assert blocks <= chosen <= 2 * blocks
    assert _busiest_work(m, n, rows(chosen), nc, tile, threads) <= _busiest_work(m, n, rows(before), nc, tile, threads)
    if (m, blocks) == (1568, 15):
        assert (chosen, rows(chosen), _busiest_work(m, n, rows(chosen), nc, tile, threads)) == (22, 72, 132 * 16)
        # the GEMM's default blocking takes that count (the conv's implicit GEMM, with AVX2 code)
        avx2 = CPU_PROFILES["zen3-avx2"]
        assert default_gemm_schedule(m, n, 2304, avx2, threads, shaped_tile=False).tile[0] == 72


@pytest.mark.parametrize("m, n, tile", [(128, 1024, (4, 24)), (64, 768, (4, 24)), (44, 70, (4, 24)),
                                         (512, 512, (6, 16)), (1000, 3000, (6, 16)), (96, 64, (6, 16))])
def test_avx2_register_tile_pads_the_gemm_least(monkeypatch, m, n, tile, rng):
    """On 16 registers the GEMM takes 4 x 24 (as many accumulators as 6 x 16) where 6 x 16 pads
    M x N by over 1 % more (128 rows: 22 strips of 6 are 132 rows), else 6 x 16. The 4 x 24 tile
    with row and masked column edges, on AVX2 machine code and 2 threads, against numpy."""
    monkeypatch.setenv("TRACEA_CPU", "zen3-avx2")
    k = 300
    assert default_gemm_schedule(m, n, k, host_cpu(), threads=2).warp_tile[:2] == tile
    if m == 44:
        a, b, bias = ref.random(rng, (m, k), scale=20.0), ref.random(rng, (k, n)), ref.random(rng, (n,))
        fn = td.function(td.tensor((m, k)), td.tensor((k, n)), td.tensor(n))(
            lambda x, y, z: td.fused_gemm(x, y, [td.bias_add(z), td.relu()]))
        out = tracea.compile(fn, threads=2)(a, b, bias)
        ref.assert_close(out, ref.epilogue(ref.gemm(a, b), [("bias_add", None), ("relu", None)], bias), "f32", k)


@pytest.mark.parametrize("profile", ["host", "skylake-avx512", "zen3-avx2"])
@pytest.mark.parametrize("m, n, k", [(1030, 64, 300), (1100, 40, 70), (1024, 33, 17), (1500, 48, 520)])
def test_a_narrow_n_is_one_register_tile(monkeypatch, profile, m, n, k, rng):
    """N of 3-4 vectors (33-64 columns on AVX-512) and enough rows: one register tile as wide as
    N, 6-8 rows in the vector registers, the last vector partly masked where N is not a multiple;
    not on AVX2's 16 registers (2 rows would be left). Checked against numpy on a fused GEMM."""
    if profile != "host":
        monkeypatch.setenv("TRACEA_CPU", profile)
    host = host_cpu()
    s = default_gemm_schedule(m, n, k, host, threads=2)
    (mr, nr, _), kc = s.warp_tile, s.tile[2]
    vectors = -(-n // host.f32_lanes)
    if host.vector_registers >= 32 and 3 <= vectors <= 4:
        assert nr == vectors * host.f32_lanes and mr >= 6, (mr, nr)
        assert mr * vectors + vectors + 1 <= host.vector_registers
        assert kc == default_gemm_schedule(m, n, k, host, threads=2, shaped_tile=False).tile[2]
    else:
        assert nr == 2 * host.f32_lanes
    a, b, bias = ref.random(rng, (m, k), scale=20.0), ref.random(rng, (k, n)), ref.random(rng, (n,))
    fn = td.function(td.tensor((m, k)), td.tensor((k, n)), td.tensor(n))(
        lambda x, y, z: td.fused_gemm(x, y, [td.bias_add(z), td.relu()]))
    out = tracea.compile(fn, threads=2)(a, b, bias)
    ref.assert_close(out, ref.epilogue(ref.gemm(a, b), [("bias_add", None), ("relu", None)], bias), "f32", k)


@pytest.mark.parametrize("m, n, mc, nc", [(256, 784, 256, 800), (128, 784, 128, 800), (64, 3136, 64, 3136),
                                         (512, 392, 256, 416), (100, 1000, 104, 1024), (64, 2048, 64, 2048)])
@pytest.mark.parametrize("threads", [2, 3, 4])
def test_column_chunks_balance_the_threads(m, n, mc, nc, threads):
    """The work items (M blocks x column chunks) go to the threads in contiguous runs (OpenMP's
    static schedule): the busiest thread runs at most one strip more than an even share where
    the M blocks allow (25 strips of one block in chunks of 4 had given 16 and 9)."""
    nr = 32
    chunk = column_chunk(m, n, mc, nc, nr, threads) // nr
    strips = -(-min(n, nc) // nr)
    items = [min(chunk, strips - j) for j in range(0, strips, chunk)] * -(-m // mc)
    share, extra = divmod(len(items), threads)
    sizes = [share + (t < extra) for t in range(threads)]
    loads = [sum(items[sum(sizes[:t]):sum(sizes[:t + 1])]) for t in range(threads)]
    assert max(loads) <= -(-strips * -(-m // mc) // threads) + 1, loads


def test_schedule_is_visible_in_the_ir():
    fn = td.function(td.tensor((64, 64)), td.tensor((64, 64)))(td.gemm)
    text = tracea.compile(fn, keep_stages=True).stages["linalg"]
    assert "scf.parallel" in text and "vector.fma" in text


@given(batch=st.lists(st.integers(1, 2), max_size=1), m=st.integers(1, 9), n=st.integers(1, 11),
       k=st.integers(1, 3 * LANES + 2), dtype=st.sampled_from(["f32", "bf16", "f16"]),
       use_bias=st.booleans(), use_residual=st.booleans(), threads=st.sampled_from([1, 2]),
       stages=st.sampled_from([1, 2]))
def test_inner_product_gemm(batch, m, n, k, dtype, use_bias, use_residual, threads, stages):
    """x @ W^T on the inner-product kernel: row and column edges (clamped loads), K blocks with a
    masked remainder, batches, the epilogue, narrow inputs and results; B's rows asked for ahead
    or not (stages 2 or 1), a cache line's steps at a time and the rest one by one."""
    rng = np.random.default_rng(m * 131 + n * 17 + k)
    a, b = ref.random(rng, (*batch, m, k), dtype), ref.random(rng, (n, k), dtype)
    bias, residual = ref.random(rng, (n,), dtype), ref.random(rng, (*batch, m, n), dtype)
    schedule = td.Schedule(tile=(6, 3 * n, 2 * LANES), warp_tile=(3, 1, LANES), stages=stages,
                           lane_map=td.LaneMap("simd", (LANES,)))

    def body(x, y, bias_v, res_v):
        steps = ([td.bias_add(bias_v)] if use_bias else []) + [td.relu()] + \
                ([td.residual_add(res_v)] if use_residual else [])
        return td.fused_gemm(x, y, steps, transpose_b=True, schedule=schedule)

    fn = td.function(*[td.tensor(t.shape, dtype) for t in (a, b, bias, residual)])(body)
    kernel = tracea.compile(fn, threads=threads, keep_stages=True)
    assert "vector.reduction" in kernel.stages["linalg"]  # the inner-product kernel ran
    expected = ref.epilogue(ref.gemm(a, b, False, True), [("bias_add", None)] * use_bias + [("relu", None)]
                            + [("residual_add", None)] * use_residual, bias, residual)
    ref.assert_close(kernel(a, b, bias, residual), expected, dtype, k)


def test_default_schedules_choose_the_inner_product_kernel_for_few_rows():
    def text(m):
        fn = td.function(td.tensor((m, 1024)), td.tensor((256, 1024)))(lambda x, w: td.gemm(x, w, transpose_b=True))
        return tracea.compile(fn, keep_stages=True).stages["linalg"]
    assert "vector.reduction" in text(16) and "vector.reduction" not in text(200)


@pytest.mark.parametrize("profile", ["host", "zen3-avx2"])
def test_few_rows_ask_for_weights_ahead_where_they_stay_in_cache(monkeypatch, profile):
    """A decoding step's x @ W^T asks for W's rows ahead of use (stages 2, 4 rows of W at a time)
    where W's share per thread fits half of L3 and stays there between calls (1.07-1.23x on Zen
    5), and leaves W streaming from memory to the hardware prefetchers (8 rows at a time); it
    reads W's rows whole."""
    if profile != "host":
        monkeypatch.setenv("TRACEA_CPU", profile)
    for (m, n, k), threads, ahead in [((1, 2304, 768), 1, True), ((1, 3072, 2048), 2, True),
                                      ((1, 8192, 4096), 1, False), ((1, 8192, 8192), 2, False)]:
        fn = td.function(td.tensor((m, k)), td.tensor((n, k)))(lambda x, w: td.gemm(x, w, transpose_b=True))
        kernel = tracea.compile(fn, threads=threads, keep_stages=True)
        assert "vector.reduction" in kernel.stages["linalg"]  # the inner-product kernel
        assert ("prefetcht0" in ref.machine_code(kernel)) == ahead, (m, n, k, threads)
        schedule = dot_gemm_schedule(m, n, k, host_cpu(), threads)
        assert (schedule.stages, schedule.warp_tile[1]) == ((2, 4) if ahead else (1, 8))
        assert schedule.tile[2] == k  # one row: whole rows of W, not pieces of 1024
    # more rows than a register tile's: each block of W is read by every group of rows, from L1
    assert dot_gemm_schedule(16, 2048, 2048, host_cpu(), 1).tile[2] == 1024


def test_inner_product_tile_needs_transposed_b():
    fn = td.function(td.tensor((8, 8)), td.tensor((8, 8)))(
        lambda a, b: td.gemm(a, b, schedule=td.Schedule(tile=(4, 8, LANES), warp_tile=(4, 4, LANES),
                                                          lane_map=td.LaneMap("simd", (LANES,)))))
    with pytest.raises(tracea.CompileError, match="inner products along K.* needs transpose_b"):
        tracea.compile(fn)


@given(batch=st.lists(st.integers(1, 2), max_size=1), m=st.integers(1, 8), n=st.integers(1, 3 * LANES + 5),
       k=st.integers(1, 13), dtype=st.sampled_from(["f32", "bf16", "f16"]), shared_b=st.booleans(),
       use_bias=st.booleans(), use_residual=st.booleans(), chunk=st.sampled_from([1, 2]),
       threads=st.sampled_from([1, 2]))
def test_streaming_gemm(batch, m, n, k, dtype, shared_b, use_bias, use_residual, chunk, threads):
    """x @ W on the streaming kernel (W's rows into a buffer of sums per column chunk): several
    chunks and a masked last vector, K not a multiple of its rows per pass, batches with a shared
    or a batched W, the epilogue, narrow inputs and results."""
    rng = np.random.default_rng(m * 131 + n * 17 + k)
    a = ref.random(rng, (*batch, m, k), dtype, scale=30.0)
    b = ref.random(rng, (k, n) if shared_b else (*batch, k, n), dtype)
    bias, residual = ref.random(rng, (n,), dtype), ref.random(rng, (*batch, m, n), dtype)
    schedule = td.Schedule(tile=(chunk * LANES,), lane_map=td.LaneMap("simd", (LANES,)))

    def body(x, y, bias_v, res_v):
        steps = ([td.bias_add(bias_v)] if use_bias else []) + [td.gelu("tanh")] + \
                ([td.residual_add(res_v)] if use_residual else [])
        return td.fused_gemm(x, y, steps, schedule=schedule)

    fn = td.function(*[td.tensor(t.shape, dtype) for t in (a, b, bias, residual)])(body)
    kernel = tracea.compile(fn, threads=threads)
    assert "on cpu.gemm.rows" in kernel.plan
    expected = ref.epilogue(ref.gemm(a, b), [("bias_add", None)] * use_bias + [("gelu", "tanh")]
                            + [("residual_add", None)] * use_residual, bias, residual)
    ref.assert_close(kernel(a, b, bias, residual), expected, dtype, k)


@pytest.mark.parametrize("profile", ["host", "zen3-avx2"])
@pytest.mark.parametrize("m, n, k, variant", [(1, 3072, 768, "rows"), (8, 771, 333, "rows"), (3, 5, 2, "rows"),
                                              (9, 64, 64, "packed"), (1, 300, 700, "inner_product")])
def test_few_rows_of_x_at_w_stream_w(monkeypatch, profile, m, n, k, variant, rng):
    """By default x @ W (W as it lies) with at most 8 rows streams W (packing it to use each strip
    once had run 0.23-0.42x torch with one row); 9 rows take the packed kernel, x @ W^T the inner
    products. On the host's ISA and held to AVX2, against numpy, A at scale 1000."""
    if profile != "host":
        monkeypatch.setenv("TRACEA_CPU", profile)
    transpose_b = variant == "inner_product"
    a, b, bias = ref.random(rng, (m, k), scale=1000.0), ref.random(rng, (n, k) if transpose_b else (k, n)), \
        ref.random(rng, (n,))
    fn = td.function(td.tensor(a.shape), td.tensor(b.shape), td.tensor(n))(
        lambda x, y, z: td.fused_gemm(x, y, [td.bias_add(z), td.relu()], transpose_b=transpose_b))
    kernel = tracea.compile(fn, threads=2)
    assert f"on cpu.gemm.{variant}" in kernel.plan
    expected = ref.epilogue(ref.gemm(a, b, False, transpose_b), [("bias_add", None), ("relu", None)], bias)
    ref.assert_close(kernel(a, b, bias), expected, "f32", k)


@pytest.mark.parametrize("profile", ["skylake-avx512", "zen3-avx2"])
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("m, n", [(1, 3072), (4, 3072), (4, 2304), (3, 2304), (8, 771), (2, 40), (1, 8)])
def test_streaming_chunks_share_the_columns_evenly(profile, threads, m, n):
    """The streaming kernel's column chunks keep their sums in ROWS_SUMS_BYTES, and the busiest
    thread streams no more columns than an even share rounded to whole vectors (4 x 3072 once had
    3 chunks of 1024 on 2 threads: one thread streamed 2048 columns)."""
    host = CPU_PROFILES[profile]
    lanes = host.f32_lanes
    (nb,) = rows_gemm_schedule(m, n, 768, host, threads).tile
    assert nb % lanes == 0 and (nb * m * 4 <= ROWS_SUMS_BYTES or nb == lanes)
    widths = [min(nb, n - j) for j in range(0, n, nb)]
    # an even share, and at most a vector of rounding per chunk (a chunk is at least a vector)
    assert busiest_thread(widths, threads) <= max(lanes, -(-n // threads) + len(widths) // threads * lanes), widths


def test_streaming_schedule_needs_w_as_it_lies():
    fn = td.function(td.tensor((2, 8)), td.tensor((8, 8)))(
        lambda a, b: td.gemm(a, b, transpose_b=True, schedule=td.Schedule(
            tile=(LANES,), lane_map=td.LaneMap("simd", (LANES,)))))
    with pytest.raises(tracea.CompileError, match="streaming GEMM computes x @ W with neither operand transposed"):
        tracea.compile(fn)
    fn = td.function(td.tensor((64, 8)), td.tensor((8, 8)))(
        lambda a, b: td.gemm(a, b, schedule=td.Schedule(tile=(LANES,), lane_map=td.LaneMap("simd", (LANES,)))))
    with pytest.raises(tracea.CompileError, match="streaming GEMM takes at most 16 rows .this one has 64"):
        tracea.compile(fn)


def test_register_tile_too_large_is_an_error():
    fn = td.function(td.tensor((8, 8)), td.tensor((8, 8)))(
        lambda a, b: td.gemm(a, b, schedule=td.Schedule(tile=(32, 8 * LANES, 8), warp_tile=(32, 8 * LANES, 1),
                                                          lane_map=td.LaneMap("simd", (LANES,)))))
    with pytest.raises(tracea.CompileError, match="needs .* vector registers; this CPU has"):
        tracea.compile(fn)


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_conv_runs_on_a_vector_kernel(layout, rng):
    x = ref.random(rng, (2, 5, 11, 9) if layout == "nchw" else (2, 11, 9, 5))
    w = ref.random(rng, (7, 5, 3, 2) if layout == "nchw" else (3, 2, 5, 7))
    b = ref.random(rng, (7,))
    fn = td.function(td.tensor(x.shape), td.tensor(w.shape), td.tensor(b.shape))(
        lambda a, f, c: td.conv2d(a, f, c, stride=(2, 1), padding=(1, 0, 2, 1), dilation=(1, 2), layout=layout))
    kernel = tracea.compile(fn, keep_stages=True)
    assert "vector.fma" in kernel.stages["linalg"]
    # NCHW runs directly (phase planes); NHWC on the GEMM kernel, with no transposes either
    assert "linalg.transpose" not in kernel.stages["linalg"] and "vector.shuffle" not in kernel.stages["linalg"]
    expected = ref.conv2d(x, w, b, (2, 1), (1, 0, 2, 1), (1, 2), 1, layout)
    ref.assert_close(kernel(x, w, b), expected, "f32", 30)


@given(batch=st.lists(st.integers(1, 3), max_size=2), sq=st.integers(1, 40), skv=st.integers(1, 70),
       d_vectors=st.integers(1, 2), dv_vectors=st.integers(1, 2), causal=st.booleans(),
       dtype=st.sampled_from(["f32", "f16", "bf16"]), threads=st.sampled_from([1, 2]))
def test_flash_attention(batch, sq, skv, d_vectors, dv_vectors, causal, dtype, threads):
    d, dv = d_vectors * LANES, dv_vectors * LANES
    rng = np.random.default_rng(sq * 131 + skv)
    q, k, v = ref.random(rng, (*batch, sq, d), dtype), ref.random(rng, (*batch, skv, d), dtype), \
        ref.random(rng, (*batch, skv, dv), dtype)
    fn = td.function(td.tensor(q.shape, dtype), td.tensor(k.shape, dtype), td.tensor(v.shape, dtype))(
        lambda a, b, c: td.attention(a, b, c, causal=causal))
    kernel = tracea.compile(fn, threads=threads, keep_stages=True)
    assert KERNEL_MARK in kernel.stages["linalg"]  # the fused kernel ran
    ref.assert_close(kernel(q, k, v), ref.attention(q, k, v, None, causal), dtype, max(d, skv))


@pytest.mark.parametrize("d, dv", [(64, 64), (128, 128), (8 * LANES, 5 * LANES)],
                         ids=["d64", "d128", "dv-in-odd-strips"])
@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_at_model_head_dims(d, dv, causal):
    """Head dims of real models: K^T and V are packed in strips (of QK tile keys, of P V tile
    columns) and P V runs in several column groups; a value head dim of 5 vectors splits into
    strips of one."""
    rng = np.random.default_rng(d + dv)
    q, k, v = ref.random(rng, (2, 29, d)), ref.random(rng, (2, 75, d)), ref.random(rng, (2, 75, dv))
    fn = td.function(td.tensor(q.shape), td.tensor(k.shape), td.tensor(v.shape))(
        lambda a, b, c: td.attention(a, b, c, causal=causal))
    kernel = tracea.compile(fn, threads=2, keep_stages=True)
    assert KERNEL_MARK in kernel.stages["linalg"]
    ref.assert_close(kernel(q, k, v), ref.attention(q, k, v, None, causal), "f32", max(d, 75))


@pytest.mark.parametrize("tile", [(3, LANES), (16, 3 * LANES), (5, 8 * LANES)],
                         ids=["one-key-vector", "odd-key-vectors", "wide-key-block"])
@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_block_shapes(tile, causal):
    """Register tiles of every shape the schedule's block allows: one or two key vectors per QK
    tile, query rows that do not divide into 8; key blocks wider than the sequence's tail."""
    rng = np.random.default_rng(7)
    q, k, v = ref.random(rng, (2, 37, 2 * LANES)), ref.random(rng, (2, 45, 2 * LANES)), ref.random(rng, (2, 45, LANES))
    schedule = td.Schedule(tile=tile, lane_map=td.LaneMap("simd", (LANES,)))
    fn = td.function(td.tensor(q.shape), td.tensor(k.shape), td.tensor(v.shape))(
        lambda a, b, c: td.attention(a, b, c, causal=causal, schedule=schedule))
    ref.assert_close(tracea.compile(fn, threads=2)(q, k, v), ref.attention(q, k, v, None, causal), "f32", 45)


@pytest.mark.parametrize("sq, skv, d", [(1, 1031, 64), (3, 700, 128), (8, 257, 64), (1, 1, 2 * LANES), (9, 300, 64)],
                         ids=["one-query", "three-queries-d128", "eight-queries", "one-key", "nine-queries-packed"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_decoding_step_attention_reads_the_kv_cache_in_place(sq, skv, d, causal, dtype):
    """A few queries over a long KV cache (a decoding step): K and V are read where they lie,
    without the copies (one parallel loop, not two), across several key blocks and a ragged last
    one; a sharp softmax (scale 20) whose dominant key comes late. 9 queries take the packed path."""
    rng = np.random.default_rng(sq * 1000 + skv)
    q, k, v = (ref.random(rng, (2, 3, n, d), dtype) for n in (sq, skv, skv))
    k[:, :, skv - 2] = q.mean(axis=2)  # aligned with every query: the late, dominant key
    fn = td.function(*(td.tensor(a.shape, dtype) for a in (q, k, v)))(
        lambda a, b, c: td.attention(a, b, c, scale=20.0 / d, causal=causal))
    kernel = tracea.compile(fn, threads=2, keep_stages=True)
    assert kernel.stages["linalg"].count("scf.parallel") == (1 if sq <= 8 else 2)
    ref.assert_close(kernel(q, k, v), ref.attention(q, k, v, 20.0 / d, causal), dtype, skv)


@pytest.mark.parametrize("sq, d", [(1, 64), (3, 128), (12, 64), (2, 40)],
                         ids=["one-query", "three-queries-d128", "twelve-queries-packed", "head-dim-40-reference"])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_over_a_key_length_known_at_run_time(sq, d, causal):
    """K and V of any length (`tensor((B, H, None, D))`: a KV cache that grows call by call), one
    kernel for all: read in place (a few queries), packed into K^T and V strips sized at run time
    (more), or the reference loops (a head dim off the lanes); lengths below, across and past a
    key block, a late dominant key in a sharp softmax."""
    fn = td.function(td.tensor((2, 3, sq, d)), td.tensor((2, 3, None, d)), td.tensor((2, 3, None, d)))(
        lambda a, b, c: td.attention(a, b, c, scale=20.0 / d, causal=causal))
    kernel = tracea.compile(fn, threads=2)
    assert kernel.signature.inputs[1].shape == (2, 3, None, d)
    for skv in (1, 7, 257, 1031):
        rng = np.random.default_rng(skv)
        q, k, v = (ref.random(rng, (2, 3, n, d)) for n in (sq, skv, skv))
        k[:, :, skv - 1] = q.mean(axis=2)  # aligned with every query: the last key dominates
        ref.assert_close(kernel(q, k, v), ref.attention(q, k, v, 20.0 / d, causal), "f32", skv)


@pytest.mark.parametrize("sq, d", [(1, 64), (3, 40), (12, 64)], ids=["one-query", "reference", "packed"])
@pytest.mark.parametrize("per_batch, per_query", [(False, False), (True, False), (False, True), (True, True)],
                         ids=["shared", "per-batch", "per-query", "per-batch-and-query"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "run-time-keys"])
def test_attention_adds_its_mask_operand_to_the_scores(sq, d, per_batch, per_query, causal, dynamic):
    """The mask operand ([B or 1, Sq or 1, Skv], f32) is added to the scaled scores before the
    softmax, -inf masking: a 30 % random -inf mask (a row of the per-query masks wholly -inf:
    its output 0) with finite values beside, one shared or one per (flattened) batch entry and
    per query; with the causal mask; K, V and mask of a run-time length too."""
    batch = 6
    for skv in (5, 257):
        rng = np.random.default_rng(sq * 7 + skv)
        q, k, v = (ref.random(rng, (2, 3, n, d)) for n in (sq, skv, skv))
        shape = (batch if per_batch else 1, sq if per_query else 1, skv)
        mask = np.where(rng.random(shape) < 0.3, -np.inf, rng.standard_normal(shape)).astype(np.float32)
        mask[..., 0] = 0.0
        if per_query:
            mask[:, -1] = -np.inf  # the last query sees no key
        keys = None if dynamic else skv
        fn = td.function(td.tensor(q.shape), td.tensor((2, 3, keys, d)), td.tensor((2, 3, keys, d)),
                         td.tensor(shape[:-1] + (keys,)))(
            lambda a, b, c, m: td.attention(a, b, c, scale=3.0 / d, causal=causal, mask=m))
        scores = ref.f64(q) @ np.swapaxes(ref.f64(k), -1, -2) * (3.0 / d) \
            + mask.reshape(((2, 3) if per_batch else (1, 1)) + shape[1:])
        if causal:
            scores = np.where(np.tril(np.ones((sq, skv), bool)), scores, -np.inf)
        with np.errstate(invalid="ignore"):
            want = np.nan_to_num(ref.softmax(scores)) @ ref.f64(v)  # (a row of -inf: 0, torch's safe softmax)
        ref.assert_close(tracea.compile(fn, threads=2)(q, k, v, mask), want, "f32", skv)


def test_attention_mask_operand_errors_name_the_shape_wanted():
    with pytest.raises(tracea.OpError, match=r"operand 'mask' must be f32 \[6 or 1, 4 or 1, 9\] .*got tensor<6x4x8xf32>"):
        td.function(td.tensor((2, 3, 4, 16)), td.tensor((2, 3, 9, 16)), td.tensor((2, 3, 9, 16)), td.tensor((6, 4, 8)))(
            lambda a, b, c, m: td.attention(a, b, c, mask=m))
    with pytest.raises(tracea.OpError, match=r"operand 'mask' must be f32 .*got tensor<1x1x9xf16>"):
        td.function(td.tensor((3, 4, 16)), td.tensor((3, 9, 16)), td.tensor((3, 9, 16)), td.tensor((1, 1, 9), "f16"))(
            lambda a, b, c, m: td.attention(a, b, c, mask=m))


def test_only_the_key_length_of_attention_may_be_dynamic():
    """A query of run-time length, or K and V of different lengths, are named errors."""
    with pytest.raises(tracea.OpError, match=r"operand 'query' has a dynamic shape .*tracea ops need static shapes"):
        td.function(td.tensor((3, None, 16)), td.tensor((3, None, 16)), td.tensor((3, None, 16)))(td.attention)
    with pytest.raises(tracea.OpError, match=r"'value' has 9 positions but key has \?"):
        td.function(td.tensor((3, 2, 16)), td.tensor((3, None, 16)), td.tensor((3, 9, 16)))(td.attention)
    with pytest.raises(tracea.OpError, match=r"only dims \[-2\] of 'key' may be dynamic"):
        td.function(td.tensor((3, 2, 16)), td.tensor((3, 5, None)), td.tensor((3, 5, 16)))(td.attention)


@pytest.mark.parametrize("heads", [1, 3])
@pytest.mark.parametrize("sq", [37, 33])  # 10 and 9 query blocks of 4 rows
def test_causal_attention_blocks_in_pairs_when_the_threads_split_a_head(heads, sq):
    """Heads the threads do not divide: the causal query blocks run in the order 0, n-1, 1, n-2,
    ... (every block computed once, an odd count's middle block too)."""
    rng = np.random.default_rng(heads * 100 + sq)
    q, k, v = (ref.random(rng, (heads, sq, 2 * LANES)) for _ in range(3))
    schedule = td.Schedule(tile=(4, 2 * LANES), lane_map=td.LaneMap("simd", (LANES,)))
    fn = td.function(*[td.tensor(q.shape)] * 3)(lambda a, b, c: td.attention(a, b, c, causal=True, schedule=schedule))
    ref.assert_close(tracea.compile(fn, threads=2)(q, k, v), ref.attention(q, k, v, None, True), "f32", sq)


@pytest.mark.parametrize("scale", [10.0, 50.0])
@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_at_large_score_scales_with_a_late_dominant_key(scale, causal):
    """Scores of tens (a sharp softmax, where exp overflows without the running max) and, in
    each row, a key far larger than the earlier ones that comes in a later key block: the
    running max and the rescaling of what was summed before are both needed."""
    rng = np.random.default_rng(11)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((2, 37, 2 * LANES), (2, 45, 2 * LANES), (2, 45, LANES)))
    k[:, 40] = q[:, :, :].mean(axis=1) * 3  # aligned with every query: the late, dominant key
    schedule = td.Schedule(tile=(3, LANES), lane_map=td.LaneMap("simd", (LANES,)))  # many key blocks
    fn = td.function(td.tensor(q.shape), td.tensor(k.shape), td.tensor(v.shape))(
        lambda a, b, c: td.attention(a, b, c, scale=scale, causal=causal, schedule=schedule))
    out = tracea.compile(fn, threads=2)(q, k, v)
    assert np.isfinite(out).all()
    ref.assert_close(out, ref.attention(q, k, v, scale, causal), "f32", 45)


@pytest.mark.parametrize("strategy", ["tiled", "reference"])
def test_attention_rows_of_minus_infinity_give_zero(strategy):
    """A query whose scores are all -inf gets 0, as torch's safe softmax gives (not 0/0)."""
    rng = np.random.default_rng(3)
    q, k, v = np.zeros((5, LANES), np.float32), rng.random((7, LANES)).astype(np.float32) + 0.5, \
        rng.standard_normal((7, LANES)).astype(np.float32)
    q[1:] = rng.standard_normal((4, LANES))
    q[0, 0] = -np.inf  # row 0: -inf * (positive key) + 0 = -inf for every key
    fn = td.function(*(td.tensor(a.shape) for a in (q, k, v)))(lambda a, b, c: td.attention(a, b, c))
    out = tracea.compile(fn, strategy=strategy)(q, k, v)
    np.testing.assert_array_equal(out[0], 0)
    ref.assert_close(out[1:], ref.attention(q[1:], k, v), "f32", LANES)


def test_attention_with_odd_head_dim_uses_the_reference():
    fn = td.function(*[td.tensor((2, 9, 5))] * 3)(lambda a, b, c: td.attention(a, b, c))
    assert KERNEL_MARK not in tracea.compile(fn, keep_stages=True).stages["linalg"]


@given(shape=st.lists(st.integers(1, 40), min_size=1, max_size=3), dtype=st.sampled_from(["f32", "f16", "bf16"]),
       threads=st.sampled_from([1, 2]), scale=st.sampled_from([1.0, 30.0]))
def test_vectorized_softmax(shape, dtype, threads, scale):
    x = ref.random(np.random.default_rng(sum(shape)), shape, dtype, scale=scale)
    fn = td.function(td.tensor(x.shape, dtype))(lambda a: td.softmax(a))
    kernel = tracea.compile(fn, threads=threads, keep_stages=True)
    assert KERNEL_MARK in kernel.stages["linalg"]
    ref.assert_close(kernel(x), ref.softmax(x), dtype)


@pytest.mark.parametrize("n", [ROW_IN_CACHE - 3, ROW_IN_CACHE + 5])
def test_softmax_rows_in_and_beyond_the_cache(n):
    """Both row plans (three passes in cache, the running max beyond): sharp rows (scores of
    tens) whose largest value comes last, -inf entries, a ragged tail."""
    x = ref.random(np.random.default_rng(n), (3, n), "f32", scale=30.0)
    x[:, -1] = x.max() + 5  # the max in the masked tail
    x[1, ::7] = -np.inf
    out = tracea.compile(td.function(td.tensor(x.shape))(td.softmax), threads=2)(x)
    ref.assert_close(out, ref.softmax(x), "f32")


def test_softmax_of_infinities():
    x = np.array([[0.0, -np.inf, 1.0] * 7, [-np.inf] * 20 + [5.0]], np.float32)
    out = tracea.compile(td.function(td.tensor(x.shape))(td.softmax))(x)
    ref.assert_close(out, ref.softmax(x), "f32")


@pytest.mark.parametrize("step,kind,param", [(td.relu, "relu", None), (td.sigmoid, "sigmoid", None),
                                             (td.silu, "silu", None), (lambda: td.gelu("erf"), "gelu", "erf"),
                                             (lambda: td.gelu("tanh"), "gelu", "tanh"),
                                             (td.hardswish, "hardswish", None), (td.hardsigmoid, "hardsigmoid", None)])
def test_vector_epilogues_over_a_wide_range(step, kind, param):
    """Full register tiles run the epilogue on vectors (polynomial exp / tanh / erf)."""
    n = 4 * LANES
    x = np.linspace(-10, 10, 28 * n, dtype=np.float32).reshape(28, n)
    eye = np.eye(n, dtype=np.float32)
    fn = td.function(td.tensor(x.shape), td.tensor(eye.shape))(lambda a, b: td.fused_gemm(a, b, [step()]))
    kernel = tracea.compile(fn, keep_stages=True)
    assert "math.erf" not in kernel.stages["llvm"] and "@expf" not in kernel.stages["llvm"]
    ref.assert_close(kernel(x, eye), ref.epilogue(ref.f64(x), [(kind, param)]), "f32")


@pytest.mark.parametrize("c,k,layout", [(40, 3, "nchw"), (300, 1, "nhwc"), (257, 2, "nhwc"), (3, 7, "nchw")],
                         ids=["runs-per-block", "run-split-by-divisor", "prime-channels", "stem"])
def test_implicit_gemm_conv_k_blocks(c, k, layout, rng):
    """Implicit GEMM packs whole channel runs per K block: several runs, a run split evenly,
    and a channel count with no divisor near the block size."""
    x = ref.random(rng, (1, c, 9, 8) if layout == "nchw" else (1, 9, 8, c))
    w = ref.random(rng, (6, c, k, k) if layout == "nchw" else (k, k, c, 6), scale=0.1)
    fn = td.function(td.tensor(x.shape), td.tensor(w.shape))(
        lambda a, f: td.conv2d(a, f, padding=1, stride=2 if k == 7 else 1, layout=layout))
    out = tracea.compile(fn)(x, w)
    ref.assert_close(out, ref.conv2d(x, w, None, (2, 2) if k == 7 else (1, 1), (1, 1), layout=layout), "f32",
                     c * k * k)


DIRECT_READ = "memref<?xf32, strided<[1], offset: ?>>"  # the micro-kernel's A: the image, or the packed strip


@given(n=st.integers(1, 2), c=st.sampled_from([2, 3, 5, LANES, 2 * LANES, 3 * LANES, 40]), k=st.integers(1, 20),
       hw=st.tuples(st.integers(16, 26), st.integers(16, 30)), kernel=st.sampled_from([(3, 3), (1, 3), (3, 1), (5, 5)]),
       stride=st.sampled_from([(1, 1), (2, 2), (1, 2)]), dy=st.integers(1, 2), pads=st.tuples(*[st.integers(0, 2)] * 4),
       blocks=st.sampled_from(["default", "rows", "part of a row", "whole K"]), bias=st.booleans(),
       threads=st.sampled_from([1, 2]))
def test_implicit_gemm_conv_reads_the_image_directly(n, c, k, hw, kernel, stride, dy, pads, blocks, bias, threads):
    """Strips of pixels whose taps lie inside the image are read by the micro-kernel from the
    image itself, the others packed (zeros for the padding): strips crossing rows and images,
    M blocks, K blocks of several kernel rows, of part of one and of the whole K, asymmetric
    padding, strides, a y dilation, fewer channels than a vector (a stem's C = 3); large values
    so that a read off by one pixel shows."""
    (kh, kw), (h, w) = kernel, hw
    rng = np.random.default_rng(n + c * 10 + k * 1000 + h * 7 + w)
    x, f, b = 100 * ref.random(rng, (n, h, w, c)), ref.random(rng, (kh, kw, c, k)), ref.random(rng, (k,))
    row = kw * c
    kc = {"default": None, "rows": 2 * row, "part of a row": c, "whole K": kh * row}[blocks]
    s = None if kc is None else td.Schedule(tile=(24, 32, kc), warp_tile=(6, 2 * LANES if LANES == 8 else LANES, 1),
                                            lane_map=td.LaneMap("simd", (LANES,)))
    opts = dict(stride=stride, padding=pads, dilation=(dy, 1), layout="nhwc", schedule=s)
    args = [td.tensor(x.shape), td.tensor(f.shape)] + ([td.tensor(b.shape)] if bias else [])
    compiled = tracea.compile(td.function(*args)(lambda *a: td.conv2d(*a, **opts)), threads=threads, keep_stages=True)
    out = compiled(x, f, *([b] if bias else []))
    ref.assert_close(out, ref.conv2d(x, f, b if bias else None, stride, pads, (dy, 1), 1, "nhwc"), "f32", c * kh * kw)
    oh, ow = out.shape[1:3]
    gather = ConvGather(TensorSpec(x.shape, "f32"), kernel, (oh, ow), stride, (dy, 1), (pads[0], pads[2]))
    padded_first = stride == (1, 1) and any(pads)  # kernels.pads_first: a zero-padded copy, read in place
    assert ("tensor.pad" in compiled.stages["linalg"]) == padded_first
    if (padded_first or gather.interior_share() >= DIRECT_MIN_INTERIOR) and kh * kw > 1:
        assert DIRECT_READ in compiled.stages["linalg"], "this conv should read its inner pixels from the image"


def _conv_view(fn):
    """The OpView of the first conv2d of a Tracea function (what the kernel planners read)."""
    import mlir.ir as ir
    from tracea.dialects.context import shared_context
    from tracea.dialects.ops import view
    with shared_context("host"):
        module = ir.Module.parse(str(fn))
        func = module.body.operations[0]
        return view(next(op.operation for op in func.regions[0].blocks[0].operations
                         if op.operation.name == "tracea.conv2d"))


@pytest.mark.parametrize("profile", ["zen3-avx2", "skylake-avx512"])
def test_convs_read_in_place_take_register_tiles_of_few_rows(profile):
    """A base pointer per row of the tile: on 32 registers the default in-place conv keeps at most
    4 rows (6-8 spilled, at 0.5-0.8x), and then as many columns as the registers hold (of the 64
    filters); on 16 (AVX2) and when packed (a strided conv on a small image: most of its pixels
    near the border) it keeps the GEMM's height."""
    from tracea.doctor.capabilities import CPU_PROFILES
    from tracea.targets.cpu.kernels import DIRECT_MAX_MR, conv_gemm_schedule
    cpu = CPU_PROFILES[profile]
    for hw, stride, in_place in [(56, 1, True), (7, 1, True), (14, 2, False)]:
        fn = td.function(td.tensor((1, hw, hw, 64)), td.tensor((3, 3, 64, 64)))(
            lambda a, f: td.conv2d(a, f, stride=stride, padding=1, layout="nhwc"))
        s = conv_gemm_schedule(_conv_view(fn), cpu, 2)
        mr, nr = s.warp_tile[:2]
        few_rows = in_place and cpu.vector_registers > 16
        assert (mr <= DIRECT_MAX_MR == 4) if few_rows else (mr > DIRECT_MAX_MR), (hw, s)
        assert s.tile[0] % mr == 0 and s.tile[1] % nr == 0
        if few_rows:  # fewer rows, wider: the accumulators the registers hold (4 x 2 vectors: 0.86x torch)
            nv = nr // cpu.f32_lanes
            assert mr * nv + nv + 1 <= cpu.vector_registers < mr * (2 * nv) + 2 * nv + 1 or nr == 64, (profile, s)


@pytest.mark.parametrize("profile", ["zen3-avx2", "skylake-avx512", "sapphire-rapids-avx512"])
def test_padded_convs_of_stride_1_read_a_padded_copy_in_place_in_blocks_of_kernel_rows(profile):
    """A padded stride-1 f32 conv zero-pads its image first, so every strip is read in place
    (ResNet's 3x3 convs, 8 images, 2 threads, AVX-512: 1.03-1.13x, 7x7 1.0x), in K blocks of whole kernel
    rows, as many as keep B's micro-panel in L2 and the same in each block: ResNet-50's 3x3 convs
    in one K block, but C512 (B's panel of the whole K 1.2 MB: 0.89x torch) a row at a time on
    1 MiB of L2; 1x1 convs, read in place too, take their whole C. Strided, x-dilated, unpadded
    and f16 convs read the image as it is."""
    from tracea.doctor.capabilities import CPU_PROFILES
    from tracea.targets.cpu.kernels import conv_gemm_schedule, cpu_implicit_gemm, pads_first
    cpu = CPU_PROFILES[profile]
    lanes = cpu.f32_lanes
    for hw, c in [(56, 64), (28, 128), (14, 256), (7, 512)]:
        fn = td.function(td.tensor((8, hw, hw, c)), td.tensor((3, 3, c, c)))(
            lambda a, f: td.conv2d(a, f, padding=1, layout="nhwc"))
        v = _conv_view(fn)
        assert pads_first(v) == (1, 1, 1, 1)
        _, _, k, gather = cpu_implicit_gemm(v)
        assert gather.image.shape == (8, hw + 2, hw + 2, c) and gather.interior_share() == 1.0
        s = conv_gemm_schedule(v, cpu, 2)
        kc, nr = s.tile[2], s.warp_tile[1]
        row = 3 * c
        assert gather.direct_segment(kc, lanes) == row and k % kc == 0, (hw, s)
        assert kc * nr * 4 <= cpu.l2_bytes and (kc == k or (kc + row) * nr * 4 > cpu.l2_bytes
                                                 or k % (kc + row)), (hw, s)
    for c in (512, 1024):  # a 1x1 conv's row is its C: whole (4 K blocks of 256 ran 0.94x)
        fn = td.function(td.tensor((8, 14, 14, c)), td.tensor((1, 1, c, 256)))(lambda a, f: td.conv2d(a, f, layout="nhwc"))
        assert conv_gemm_schedule(_conv_view(fn), cpu, 2).tile[2] == c
    for opts, shape in [(dict(stride=2, padding=1), (8, 56, 56, 128)), (dict(padding=2, dilation=(1, 2)), (1, 14, 14, 64)),
                        (dict(padding=0), (1, 14, 14, 64))]:
        fn = td.function(td.tensor(shape), td.tensor((3, 3, shape[3], 64)))(
            lambda a, f: td.conv2d(a, f, layout="nhwc", **opts))
        assert pads_first(_conv_view(fn)) is None, opts
    fn = td.function(td.tensor((1, 14, 14, 64), "f16"), td.tensor((3, 3, 64, 64), "f16"))(
        lambda a, f: td.conv2d(a, f, padding=1, layout="nhwc"))
    assert pads_first(_conv_view(fn)) is None


@pytest.mark.parametrize("profile", ["host", "zen3-avx2"])
@pytest.mark.parametrize("threads", [1, 2])
def test_default_in_place_conv_keeps_its_register_tile_in_registers(monkeypatch, profile, threads):
    """The default NHWC 3x3 conv read in place spills no vector register: 6 rows of 4 vectors on
    AVX-512 spilled 170 times, 6 x 2 on AVX2 64 times before the k loop lost its remainder."""
    if profile != "host":
        monkeypatch.setenv("TRACEA_CPU", profile)
    fn = td.function(td.tensor((1, 56, 56, 64)), td.tensor((3, 3, 64, 64)))(
        lambda a, f: td.conv2d(a, f, padding=1, layout="nhwc"))
    assert _vector_spills(tracea.compile(fn, threads=threads)) == 0


@pytest.mark.parametrize("profile", ["zen3-avx2", "skylake-avx512"])
@pytest.mark.parametrize("shape,filters,kernel,stride", [
    ((1, 64, 56, 56), 64, 3, 1), ((1, 3, 224, 224), 64, 7, 2), ((8, 64, 56, 56), 64, 3, 1),
    ((1, 128, 28, 28), 128, 3, 1), ((1, 256, 14, 14), 256, 3, 1), ((1, 96, 30, 30), 40, 5, 2)])
@pytest.mark.parametrize("threads", [2, 3, 4])
def test_direct_conv_tasks_balance_the_threads(profile, shape, filters, kernel, stride, threads):
    """The direct NCHW conv's tasks (image x filter block x run of position segments, as
    conv_nchw_kernel_text numbers them) go to the threads in equal contiguous shares (OpenMP's
    static schedule): the busiest thread runs at most 10 % (or one run) more segments than an
    even share. Runs of 33 segments and a last of 4 had given 2 threads 1,320 and 856 (3x3 C64
    56x56 on AVX2: 0.84x torch)."""
    from tracea.targets.cpu.conv import direct_nchw_schedule
    cpu = CPU_PROFILES[profile]
    fn = td.function(td.tensor(shape), td.tensor((filters, shape[1], kernel, kernel)))(
        lambda a, f: td.conv2d(a, f, padding=kernel // 2, stride=stride))
    v = _conv_view(fn)
    s = direct_nchw_schedule(v, cpu.f32_lanes, cpu.vector_registers * 3 // 4, threads, cpu.l2_bytes)
    mr, seg = s.warp_tile
    oh, pad = v.result.shape[2], kernel // 2
    q_segs = -(-oh * -(-(shape[3] + 2 * pad) // stride) // seg)  # the kernel's positions: rows x pitch
    per_task = min(s.tile[1] // seg, q_segs)
    runs = [min(per_task, q_segs - r) for r in range(0, q_segs, per_task)]
    tasks = [run for run in runs for _ in range(-(-filters // mr))] * shape[0]  # filter block fastest
    share, extra = divmod(len(tasks), threads)
    sizes = [share + (t < extra) for t in range(threads)]
    loads = [sum(tasks[sum(sizes[:t]):sum(sizes[:t + 1])]) for t in range(threads)]
    assert max(loads) <= max(1.1 * sum(tasks) / threads, sum(tasks) / threads + per_task), (loads, s)


@pytest.mark.parametrize("shape,filters,kernel,one_block", [
    ((8, 512, 4, 4), 512, 3, True),  # 4 strips of 32 positions: 2 a thread
    ((8, 256, 8, 8), 256, 3, True),  # 16 strips, the 256 x 576 A block in L2
    ((8, 2048, 4, 4), 512, 1, True),
    ((8, 512, 7, 7), 512, 3, False),  # 13 strips of a 1 MiB A block
    ((8, 256, 14, 14), 256, 3, False),  # 49 strips
    ((1, 512, 4, 4), 512, 3, False),  # 1 strip: the threads split the rows
])
def test_im2col_keeps_the_filters_in_one_block_for_few_strips(shape, filters, kernel, one_block):
    """im2col_nchw's GEMM takes every filter in one M block (each work item packs its own B
    strips) only where A is read again for few strips (im2col_schedule, 2 threads, Zen 4)."""
    from tracea.targets.cpu.kernels import im2col_schedule
    fn = td.function(td.tensor(shape), td.tensor((filters, shape[1], kernel, kernel)))(
        lambda a, f: td.conv2d(a, f, padding=kernel // 2))
    s = im2col_schedule(_conv_view(fn), CPU_PROFILES["skylake-avx512"], 2)
    assert (s.tile[0] >= filters) == one_block, s


def test_small_images_keep_packing():
    """Where few pixels have all their taps inside and the image is not padded first (a strided
    conv from 14x14: 73 %), every strip is packed."""
    fn = td.function(td.tensor((1, 14, 14, 64)), td.tensor((3, 3, 64, 64)))(
        lambda a, f: td.conv2d(a, f, stride=2, padding=1, layout="nhwc"))
    assert DIRECT_READ not in tracea.compile(fn, keep_stages=True).stages["linalg"]


@pytest.mark.parametrize("kc", [32, 128, 192, 48])
def test_implicit_gemm_conv_explicit_k_blocks(kc, rng):
    """A schedule's K block must hold whole channel runs or divide one: those run (against
    numpy), one that does not is refused with the nearest that fits (it read past the runs and
    returned garbage, silently)."""
    x, w = ref.random(rng, (1, 9, 8, 64)), ref.random(rng, (3, 3, 64, 16), scale=0.1)
    s = td.Schedule(tile=(12, 16, kc), warp_tile=(6, 2 * LANES if LANES == 8 else LANES, 1),
                    lane_map=td.LaneMap("simd", (LANES,)))
    fn = td.function(td.tensor(x.shape), td.tensor(w.shape))(
        lambda a, f: td.conv2d(a, f, padding=1, layout="nhwc", schedule=s))
    if kc == 48:
        with pytest.raises(tracea.CompileError, match=r"K block \(tile\[2\] = 48\).*multiple of 64.*nearest that fits is 32"):
            tracea.compile(fn)
        return
    ref.assert_close(tracea.compile(fn)(x, w), ref.conv2d(x, w, None, (1, 1), (1, 1), layout="nhwc"), "f32", 576)


def test_attention_schedule_is_checked():
    def compile_with(schedule):
        return tracea.compile(td.function(*[td.tensor((4, LANES))] * 3)(
            lambda a, b, c: td.attention(a, b, c, schedule=schedule)))
    with pytest.raises(tracea.CompileError, match="keys a multiple of the .* SIMD lanes"):
        compile_with(td.Schedule(tile=(8, LANES + 1), lane_map=td.LaneMap("simd", (LANES,))))
    with pytest.raises(tracea.CompileError, match="attention register tile 32x.* needs 67 vector registers"):
        compile_with(td.Schedule(tile=(32, 4 * LANES), warp_tile=(32, 2 * LANES), lane_map=td.LaneMap("simd", (LANES,))))


@pytest.mark.parametrize("profile", list(CPU_PROFILES))
def test_attention_register_tiles_fit_the_vector_registers(profile):
    """Both register tiles of the default attention schedule (QK^T, and P V at head dims 64 and
    128) hold their accumulators, the vectors they load and a broadcast in the profile's vector
    registers (16 on AVX2: 16 accumulators there spilled in the innermost loops, 0.46x SDPA)."""
    cpu = CPU_PROFILES[profile]
    for d in (64, 128):
        s = plan(Problem("attention", "f32", head_dim=d, value_head_dim=d), PROFILES[profile]).schedule
        rows, keys = s.warp_tile
        qv = keys // cpu.f32_lanes
        assert rows * qv + qv + 1 <= cpu.vector_registers and rows * qv >= cpu.vector_registers // 2
        pr, pg = pv_tile(s.tile[0], d // cpu.f32_lanes, rows * qv + qv + 1)
        assert pr * pg + pg + 1 <= cpu.vector_registers and pr * pg >= cpu.vector_registers // 2


def _vector_spills(kernel) -> int:
    """Stores of vector registers to the stack in the kernel's machine code, in the functions that
    do its arithmetic (FMAs): the others store vectors only to pass a parallel loop its arguments."""
    functions = re.split(r"\n(?=[0-9a-f]+ <)", ref.machine_code(kernel))
    return sum(len(re.findall(r"vmov\w*\s+%[xyz]mm\d+,[^\n]*\(%r[sb]p\)", f)) for f in functions if "vfmadd" in f)


@pytest.mark.parametrize("profile", ["host", "zen3-avx2"])
@pytest.mark.parametrize("shape, explicit", [((1024, 1024, 1024), True), ((2048, 5000, 1000), False),
                                             ((2048, 5000, 1002), False), ((2048, 5000, 1001), False),
                                             ((2048, 5000, 1009), False)])
def test_gemm_of_several_panels_and_k_blocks_keeps_its_tile_in_registers(monkeypatch, profile, shape, explicit):
    """2 threads, B in several panels of several K blocks (two panels of 512 and K blocks of 512;
    the default's panels of 2528 columns, 2 on AVX-512, and K blocks of 500, not 504): the
    micro-kernel spills no vector register. With the panel's width and the K block's length both
    computed per iteration (min(N - jc, NC)), the registers they took made LLVM spill broadcasts
    of A in the micro-kernel (18 spills on AVX-512, 44 on AVX2): 2048^3 at 0.67x of its one-panel
    speed, 2048x5000x1000 at 0.63x numpy. K blocks that left the k loop's 4-step unroll a
    remainder loop (K = 1002 in blocks of 501, 1001 in 504 + 497, 1009 in 512 + 497) spilled as
    much, even where it never ran: 0.70x numpy on AVX-512, 0.42x on AVX2 (see k_unroll)."""
    if profile != "host":
        monkeypatch.setenv("TRACEA_CPU", profile)
    m, n, k = shape
    lanes, mr = host_cpu().f32_lanes, min(MAX_MR, (host_cpu().vector_registers - 3) // 2)
    s = td.Schedule(tile=(32 * mr, 512, 512), warp_tile=(mr, 2 * lanes, 1),
                    lane_map=td.LaneMap("simd", (lanes,))) if explicit else None
    fn = td.function(td.tensor((m, k)), td.tensor((k, n)))(lambda a, b: td.gemm(a, b, schedule=s))
    assert _vector_spills(tracea.compile(fn, threads=2)) <= 2


@pytest.mark.parametrize("k, kc, unroll", [(16, 8, 4), (40, 16, 4), (21, 7, 7), (18, 9, 3), (30, 12, 6),
                                            (13, 8, 1), (10, 16, 5), (3, 512, 3), (1, 512, 1)])
@pytest.mark.parametrize("threads", [1, 2])
def test_gemm_k_loop_steps_divide_every_k_block(k, kc, unroll, threads):
    """The micro-kernel's k loop runs a count of steps per iteration that divides every K block
    (kc and the last, k % kc), with no remainder loop: results against numpy in several M blocks,
    panels and K blocks, A in place and transposed. A step count that did not divide a block
    would drop or repeat k's."""
    assert k_unroll(k, kc) == unroll
    rng = np.random.default_rng(k * 100 + kc)
    m, n = 3 * MAX_MR + 5, 3 * LANES + 3
    for transpose_a in (False, True):
        a = ref.random(rng, (k, m) if transpose_a else (m, k))
        b = ref.random(rng, (k, n))
        s = td.Schedule(tile=(2 * MAX_MR, 2 * LANES, kc), warp_tile=(MAX_MR, LANES, 1), lane_map=td.LaneMap("simd", (LANES,)))
        fn = td.function(td.tensor(a.shape), td.tensor(b.shape))(
            lambda x, y: td.gemm(x, y, transpose_a=transpose_a, schedule=s))
        expected = (a.T if transpose_a else a).astype(np.float64) @ b
        ref.assert_close(tracea.compile(fn, threads=threads)(a, b), expected, "f32", k)


@pytest.mark.parametrize("causal", [False, True])
def test_default_attention_keeps_its_tiles_in_registers(causal):
    """On this host, the default attention kernel's machine code spills no vector register in its
    loops (one store of a constant vector at entry is allowed)."""
    fn = td.function(*[td.tensor((1, 2, 128, 64))] * 3)(lambda a, b, c: td.attention(a, b, c, causal=causal))
    assert _vector_spills(tracea.compile(fn, threads=1)) <= 2


@pytest.mark.parametrize("threads", [1, 2])
def test_default_gemm_keeps_its_register_tile_in_registers(threads):
    """On this host, the default GEMM's machine code spills no vector register: a 14 x 32 tile on
    AVX-512 (28 accumulators of 32 registers) spilled 66 times in the unrolled k loop and ran
    the 2-thread GEMM at half speed."""
    fn = td.function(td.tensor((1024, 1024)), td.tensor((1024, 1024)))(td.gemm)
    assert _vector_spills(tracea.compile(fn, threads=threads)) == 0


@given(c=st.integers(1, LANES - 1), k=st.integers(1, 5), hw=st.integers(1, 12), stride=st.integers(1, 3),
       pad=st.integers(0, 3), dy=st.integers(1, 2), layout=st.sampled_from(["nchw", "nhwc"]))
def test_small_channel_conv_copies_kernel_rows(c, k, hw, stride, pad, dy, layout):
    """C below the vector width: whole kernel rows are copied, pixel by pixel at the borders."""
    if hw + 2 * pad < dy * (k - 1) + 1:
        return
    rng = np.random.default_rng(c * 100 + k * 10 + hw)
    x = ref.random(rng, (2, c, hw, hw + 1) if layout == "nchw" else (2, hw, hw + 1, c))
    w = ref.random(rng, (5, c, k, k) if layout == "nchw" else (k, k, c, 5))
    opts = dict(stride=stride, padding=pad, dilation=(dy, 1), layout=layout)
    fn = td.function(td.tensor(x.shape), td.tensor(w.shape))(lambda a, f: td.conv2d(a, f, **opts))
    expected = ref.conv2d(x, w, None, (stride, stride), (pad, pad), (dy, 1), 1, layout)
    ref.assert_close(tracea.compile(fn, threads=2)(x, w), expected, "f32", c * k * k)


def check_nchw_conv(variant_id, n, c, k, kh, kw, hw, stride, dilation, pads, bias, threads):
    """A groups = 1 NCHW f32 conv run on `variant_id` (its default schedule) against numpy."""
    h, w = hw
    if h + pads[0] + pads[1] < dilation[0] * (kh - 1) + 1 or w + pads[2] + pads[3] < dilation[1] * (kw - 1) + 1:
        return
    rng = np.random.default_rng(n + c * 10 + k * 1000 + h * 7 + w)
    x, f, b = ref.random(rng, (n, c, h, w)), ref.random(rng, (k, c, kh, kw)), ref.random(rng, (k,))
    opts = dict(stride=stride, padding=pads, dilation=dilation)
    args = [td.tensor(x.shape), td.tensor(f.shape)] + ([td.tensor(b.shape)] if bias else [])
    fn = td.function(*args)(lambda *a: td.conv2d(*a, **opts))
    out = tracea.compile(on_variant(fn, variant_id), threads=threads)(x, f, *([b] if bias else []))
    ref.assert_close(out, ref.conv2d(x, f, b if bias else None, stride, pads, dilation, 1, "nchw"), "f32", c * kh * kw)


def on_variant(fn, variant_id: str) -> str:
    """The function's IR with its one conv2d told to run on `variant_id` (no schedule: the
    variant's default)."""
    text = str(fn)
    forced = re.sub(r'("tracea.conv2d"\([^)]*\)) <?\{', rf'\1 {{"tracea.variant" = "{variant_id}", ', text, count=1)
    assert forced != text
    return forced


NCHW_CONVS = dict(c=st.integers(1, 40), k=st.integers(1, 20), kh=st.integers(1, 4), kw=st.integers(1, 4),
                  stride=st.tuples(st.integers(1, 3), st.integers(1, 3)),
                  dilation=st.tuples(st.integers(1, 2), st.integers(1, 2)), pads=st.tuples(*[st.integers(0, 2)] * 4),
                  bias=st.booleans(), threads=st.sampled_from([1, 2]))


@given(n=st.integers(1, 2), hw=st.tuples(st.integers(1, 20), st.integers(1, 40)), **NCHW_CONVS)
def test_direct_nchw_conv(n, c, k, kh, kw, hw, stride, dilation, pads, bias, threads):
    """NCHW f32 conv through phase planes: every stride, dilation, asymmetric padding, filter
    counts off the register tile, rows shorter and longer than a vector."""
    check_nchw_conv("cpu.conv2d.direct_nchw", n, c, k, kh, kw, hw, stride, dilation, pads, bias, threads)


@given(n=st.integers(1, 3), hw=st.tuples(st.integers(1, 12), st.integers(1, 20)), **NCHW_CONVS)
def test_im2col_nchw_conv(n, c, k, kh, kw, hw, stride, dilation, pads, bias, threads):
    """NCHW f32 conv as one GEMM for the batch over a channel-major im2col: every stride,
    dilation, asymmetric padding, filter and position counts off the register tile."""
    check_nchw_conv("cpu.conv2d.im2col_nchw", n, c, k, kh, kw, hw, stride, dilation, pads, bias, threads)


@pytest.mark.parametrize("profile", ["", "zen3-avx2"])
@pytest.mark.parametrize("n,c,k,hw,filt,stride,dilation,pads", [
    (8, 80, 20, (8, 8), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),  # 720 taps: more than one K block
    (3, 5, 7, (4, 4), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),  # runs of 4; 48 positions: a partial last strip
    (5, 6, 9, (2, 2), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),  # runs of 2
    (2, 3, 5, (3, 64), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),  # output rows longer than a strip
    (2, 6, 5, (11, 7), (3, 2), (2, 1), (2, 2), (1, 2, 0, 3)),  # a y stride, dilations, asymmetric padding
    (8, 16, 12, (8, 8), (1, 1), (1, 1), (1, 1), (0, 0, 0, 0)),  # 1x1: its im2col is the batch transposed
    (2, 4, 6, (8, 16), (3, 3), (1, 2), (1, 1), (1, 1, 1, 1)),  # an x stride: phase planes
    (3, 5, 4, (9, 26), (3, 4), (2, 3), (1, 2), (1, 0, 2, 1)),  # ... of 3, taps on all planes, 8-wide rows
    (4, 8, 9, (16, 16), (1, 1), (2, 2), (1, 1), (0, 0, 0, 0)),  # a strided 1x1 (ResNet's downsampling)
    (3, 4, 6, (7, 7), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),  # rows of 7 pixels: runs moving strip to strip
    (2, 5, 3, (14, 14), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)),  # ... of 7, strided
    (2, 3, 5, (5, 56), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),  # ... of 56: each strip crosses a row at most once
    (2, 3, 4, (6, 3), (3, 3), (1, 1), (2, 1), (2, 2, 0, 0)),  # ... of 1: on AVX-512 32 a strip, im2col written out
])
def test_im2col_nchw_packs_its_columns_from_the_image(monkeypatch, profile, n, c, k, hw, filt, stride, dilation,
                                                      pads):
    """im2col_nchw's GEMM packs B's strips straight from the padded image (its rows as phase
    planes for an x stride), run by run (ColumnGather); with more runs a strip than it unrolls it
    writes the im2col out. On this host's vectors and AVX2's (strips of 16 columns: other runs)."""
    monkeypatch.setenv("TRACEA_CPU", profile)
    rng = np.random.default_rng(c + k)
    x, f, b = ref.random(rng, (n, c) + hw, scale=30.0), ref.random(rng, (k, c) + filt), ref.random(rng, (k,))
    expected = ref.conv2d(x, f, b, stride, pads, dilation, 1, "nchw")
    fn = td.function(td.tensor(x.shape), td.tensor(f.shape), td.tensor(b.shape))(
        lambda a, w, bias: td.conv2d(a, w, bias, stride=stride, padding=pads, dilation=dilation))
    kernel = tracea.compile(on_variant(fn, "cpu.conv2d.im2col_nchw"), threads=2, keep_stages=True)
    oh, ow = expected.shape[2:]
    cols = f"tensor<{c * filt[0] * filt[1]}x{n * oh * ow}xf32>"  # the im2col, written out
    assert (cols in kernel.stages["linalg"]) == (ow == 1 and host_cpu().f32_lanes == 16)
    ref.assert_close(kernel(x, f, b), expected, "f32", c * filt[0] * filt[1])


@pytest.mark.parametrize("shape,filt,stride,padding,expected", [
    ((8, 512, 4, 4), (512, 512, 3, 3), 1, 1, "cpu.conv2d.im2col_nchw"),  # ResNet-50's last stage at 128x128
    ((8, 256, 8, 8), (512, 256, 3, 3), 2, 1, "cpu.conv2d.im2col_nchw"),
    ((1, 512, 7, 7), (512, 512, 3, 3), 1, 1, "cpu.conv2d.im2col_nchw"),  # ... at 224x224
    ((8, 1024, 14, 14), (2048, 1024, 1, 1), 2, 0, "cpu.conv2d.im2col_nchw"),  # a strided 1x1 to 7x7
    ((8, 512, 7, 7), (2048, 512, 1, 1), 1, 0, "cpu.conv2d.im2col_nchw"),  # its im2col: the batch transposed
    ((8, 2048, 4, 4), (512, 2048, 1, 1), 1, 0, "cpu.conv2d.im2col_nchw"),  # too few pixels for a GEMM per image
    ((8, 256, 16, 16), (64, 256, 1, 1), 1, 0, "cpu.conv2d.pointwise_nchw"),  # a GEMM per image of 256 columns
    ((8, 576, 1, 1), (144, 576, 1, 1), 1, 0, "cpu.conv2d.pointwise_nchw"),  # 1-pixel images: already one GEMM
    ((8, 128, 16, 16), (128, 128, 3, 3), 1, 1, "cpu.conv2d.direct_nchw"),  # 256 pixels an image
    ((256, 512, 7, 7), (512, 512, 3, 3), 1, 1, "cpu.conv2d.direct_nchw"),  # an im2col of 231 MB
])
def test_small_nchw_images_run_as_one_gemm_for_the_batch(shape, filt, stride, padding, expected):
    fn = td.function(td.tensor(shape), td.tensor(filt))(lambda a, f: td.conv2d(a, f, stride=stride, padding=padding))
    assert re.search(rf"1 x conv2d on {expected}$", str(tracea.compile(fn).plan), re.M)


def test_a_variant_written_on_an_op_must_fit_it():
    fn = td.function(td.tensor((2, 8, 9, 9)), td.tensor((4, 8, 3, 3)))(lambda a, f: td.conv2d(a, f, padding=1))
    with pytest.raises(tracea.CompileError, match="cpu.conv2d.pointwise_nchw, cannot compute conv2d .* remove "
                                                  "tracea.variant to let the Doctor choose"):
        tracea.compile(on_variant(fn, "cpu.conv2d.pointwise_nchw"))
    with pytest.raises(tracea.CompileError, match="unknown kernel variant 'cpu.conv2d.fastest'; known: "):
        tracea.compile(on_variant(fn, "cpu.conv2d.fastest"))


@given(n=st.integers(1, 2), c=st.integers(1, 20), kh=st.integers(1, 7), kw=st.integers(1, 7),
       hw=st.tuples(st.integers(1, 20), st.integers(1, 40)), stride=st.tuples(st.integers(1, 3), st.integers(1, 3)),
       dilation=st.tuples(st.integers(1, 2), st.integers(1, 2)), pads=st.tuples(*[st.integers(0, 3)] * 4),
       bias=st.booleans(), threads=st.sampled_from([1, 2]), layout=st.sampled_from(["nchw", "nhwc"]))
def test_depthwise_conv(n, c, kh, kw, hw, stride, dilation, pads, bias, threads, layout):
    """One filter per channel (groups = C) on its own kernel, NCHW and NHWC: every stride,
    dilation, asymmetric padding, filters up to 7x7, rows and channels shorter and longer than a
    vector (a register tile's columns past the row dropped, masked channel tails), output pixels
    whose taps all fall in the padding."""
    h, w = hw
    if h + pads[0] + pads[1] < dilation[0] * (kh - 1) + 1 or w + pads[2] + pads[3] < dilation[1] * (kw - 1) + 1:
        return
    rng = np.random.default_rng(n + c * 10 + kh * 1000 + h * 7 + w)
    x, f, b = ref.random(rng, (n, c, h, w)), ref.random(rng, (c, 1, kh, kw)), ref.random(rng, (c,))
    if layout == "nhwc":
        x, f = x.transpose(0, 2, 3, 1).copy(), f.transpose(2, 3, 1, 0).copy()
    opts = dict(stride=stride, padding=pads, dilation=dilation, groups=c, layout=layout)
    args = [td.tensor(x.shape), td.tensor(f.shape)] + ([td.tensor(b.shape)] if bias else [])
    kernel = tracea.compile(td.function(*args)(lambda *a: td.conv2d(*a, **opts)), threads=threads, keep_stages=True)
    # the depthwise kernel (for one channel, maybe a groups = 1 kernel), not the reference loops
    assert re.search(r"1 x conv2d on cpu.conv2d.(depthwise|im2col|pointwise|direct)", str(kernel.plan))
    out = kernel(x, f, *([b] if bias else []))
    ref.assert_close(out, ref.conv2d(x, f, b if bias else None, stride, pads, dilation, c, layout), "f32", kh * kw)


@pytest.mark.parametrize("arch,threads,keys,tile", [
    ("skylake-avx512", 1, 512, "8, 256"), ("skylake-avx512", 1, 128, "8, 128"), ("skylake-avx512", 2, 512, "16, 256"),
    ("skylake-avx512", 2, 128, "16, 128"), ("skylake-avx512", 2, 40, "16, 64"), ("zen3-avx2", 2, 512, "12, 64"),
    ("zen3-avx2", 1, 512, "12, 64")])
def test_default_attention_blocks_follow_the_host(arch, threads, keys, tile):
    """AVX-512: one register tile of 8 queries against up to 256 keys (the recorded Zen 4 space's
    best), two tiles on several threads; AVX2: two tiles against 64 keys."""
    from tracea.passes.pipeline import parse_pipeline, run_pipeline
    fn = td.function(td.tensor((1, 2, 16, 64)), td.tensor((1, 2, keys, 64)), td.tensor((1, 2, keys, 64)))(
        lambda q, k, v: td.attention(q, k, v))
    result = run_pipeline(str(fn), parse_pipeline(f"tracea-select-variant{{arch={arch} threads={threads}}}"))
    assert f"tile = array<i64: {tile}>" in result.text


@pytest.mark.parametrize("arch,lanes", [("skylake-avx512", 8), ("zen3-avx2", 8), ("x86-64-sse", 4)])
def test_depthwise_nchw_runs_on_vectors_of_at_most_8_lanes(arch, lanes):
    """On AVX-512 too (16-lane loads into phase planes split cache lines twice as often; 7- and
    14-column rows waste less): 8 lanes, up to the host's width."""
    from tracea.passes.pipeline import parse_pipeline, run_pipeline
    fn = td.function(td.tensor((8, 576, 7, 7)), td.tensor((576, 1, 5, 5)))(lambda a, f: td.conv2d(a, f, padding=2,
                                                                                                  groups=576))
    result = run_pipeline(str(fn), parse_pipeline(f"tracea-select-variant{{arch={arch} threads=2}}"))
    assert 'tracea.variant = "cpu.conv2d.depthwise_nchw"' in result.text
    assert f'lane_map = {{kind = "simd", shape = array<i64: {lanes}>}}' in result.text


@pytest.mark.parametrize("n,c,hw,k,bias", [(1, 256, (28, 28), 128, True), (3, 5, (9, 9), 7, True),
                                           (2, 16, (8, 9), 24, False), (2, 16, (7, 9), 24, True),
                                           (2, 16, (7, 7), 24, True), (2, 16, (5, 6), 24, True),
                                           (8, 576, (1, 1), 144, True), (3, 600, (1, 1), 21, False),
                                           (40, 33, (1, 1), 70, True)])
@pytest.mark.parametrize("stride", [1, 2, (3, 2)])
def test_pointwise_nchw_conv_is_a_gemm(n, c, hw, k, bias, stride):
    """1x1 NCHW convs over at least 32 (output) pixels run as one GEMM per image on the packed
    kernel, the filter shared by the images, strided ones on the pixels they read; over one
    pixel as one GEMM for the batch (x @ W^T, on the inner-product kernel for few images and
    long rows); those to at most 64 pixels (of more than one), strided or not, as one GEMM for
    the batch over their im2col."""
    rng = np.random.default_rng(c + k)
    x, f, b = ref.random(rng, (n, c) + hw), ref.random(rng, (k, c, 1, 1)), ref.random(rng, (k,))
    args = [td.tensor(x.shape), td.tensor(f.shape)] + ([td.tensor(b.shape)] if bias else [])
    kernel = tracea.compile(td.function(*args)(lambda *a: td.conv2d(*a, stride=stride)), threads=2,
                            keep_stages=True)
    sy, sx = stride if isinstance(stride, tuple) else (stride, stride)
    pixels = -(-hw[0] // sy) * -(-hw[1] // sx)
    im2col = hw != (1, 1) and pixels <= 64
    expected = "im2col" if im2col else "pointwise"
    assert re.search(rf"1 x conv2d on cpu.conv2d.{expected}_nchw$", str(kernel.plan), re.M)
    assert ("vector.reduction" in kernel.stages["linalg"]) == (pixels == 1 and n <= 32 and c >= 512)
    out = kernel(x, f, *([b] if bias else []))
    ref.assert_close(out, ref.conv2d(x, f, b if bias else None, (sy, sx), (0,) * 4, (1, 1), 1, "nchw"), "f32", c)


@pytest.mark.parametrize("n,c,hw,k,patch,bias", [(2, 3, (64, 64), 20, (8, 8), True), (1, 5, (24, 31), 9, (4, 2), False),
                                                 (3, 3, (16, 16), 7, (16, 16), True)])
def test_patch_conv_is_a_gemm_per_image(n, c, hw, k, patch, bias):
    """A conv whose filter is its stride (a ViT's patch embedding; pixels past the last whole
    patch dropped) runs as one GEMM per image over the patches laid out as rows."""
    rng = np.random.default_rng(c + k)
    x, f, b = ref.random(rng, (n, c) + hw), ref.random(rng, (k, c) + patch), ref.random(rng, (k,))
    args = [td.tensor(x.shape), td.tensor(f.shape)] + ([td.tensor(b.shape)] if bias else [])
    kernel = tracea.compile(td.function(*args)(lambda *a: td.conv2d(*a, stride=patch)), keep_stages=True)
    pixels = (hw[0] // patch[0]) * (hw[1] // patch[1])
    assert ("__tracea_conv_gemm" in kernel.stages["linalg"]) == (pixels >= 32 or pixels == 1)
    out = kernel(x, f, *([b] if bias else []))
    ref.assert_close(out, ref.conv2d(x, f, b if bias else None, patch, (0,) * 4, (1, 1), 1, "nchw"), "f32",
                     c * patch[0] * patch[1])


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_depthwise_conv_with_unequal_strides_dilations_and_pads(layout):
    x, f = ref.random(np.random.default_rng(0), (2, 11, 9, 13)), ref.random(np.random.default_rng(1), (11, 1, 3, 5))
    opts = dict(stride=(2, 1), dilation=(1, 2), padding=(2, 1, 3, 0))
    expected = ref.conv2d(x, f, None, opts["stride"], opts["padding"], opts["dilation"], 11, "nchw")
    if layout == "nhwc":
        x, f, expected = x.transpose(0, 2, 3, 1).copy(), f.transpose(2, 3, 1, 0).copy(), expected.transpose(0, 2, 3, 1)
    fn = td.function(td.tensor(x.shape), td.tensor(f.shape))(lambda a, b: td.conv2d(a, b, groups=11, layout=layout,
                                                                                    **opts))
    ref.assert_close(tracea.compile(fn, threads=2)(x, f), expected, "f32", 15)


@pytest.mark.parametrize("w,k,stride", [(113, 3, 1), (250, 5, 2), (8 * LANES * 3, 7, 1)])
def test_depthwise_nchw_conv_rows_of_several_register_tiles(w, k, stride):
    x = ref.random(np.random.default_rng(w), (1, 3, 5, w))
    f = ref.random(np.random.default_rng(k), (3, 1, k, k))
    fn = td.function(td.tensor(x.shape), td.tensor(f.shape))(
        lambda a, b: td.conv2d(a, b, stride=stride, padding=k // 2, groups=3))
    out = tracea.compile(fn, threads=2)(x, f)
    ref.assert_close(out, ref.conv2d(x, f, None, (stride, stride), (k // 2,) * 4, (1, 1), 3, "nchw"), "f32", k * k)


@pytest.mark.parametrize("hw,k,stride", [((7, 7), 5, 1), ((14, 14), 5, 1), ((13, 14), 3, 1), ((14, 14), 5, 2),
                                         ((29, 15), 3, 2), ((3, 9), 3, 1), ((6, 3), 3, 1), ((9, 2), 1, 1),
                                         ((28, 28), 3, 1), ((57, 34), 5, 2)])
def test_depthwise_nchw_conv_tiles_of_several_rows(hw, k, stride):
    """Rows take register tiles of several output rows (MobileNetV3's 7x7 and 14x14 images, and
    longer rows: 28 columns of 4 vectors), the rows left over by whole tiles one smaller tile at
    the end; a row's last vector spills into the next row only when that row's stores rewrite all
    it spilled (rows of 2-3 pixels: the next channel's, another thread's, would be overwritten)."""
    from tracea.targets.cpu.conv import depthwise_rows, depthwise_tile
    from tracea.targets.cpu.kernels import DEPTHWISE_MAX_LANES
    oh, ow = -(-hw[0] // stride), -(-hw[1] // stride)
    vectors, _ = depthwise_tile(ow, min(LANES, DEPTHWISE_MAX_LANES), 12)
    assert depthwise_rows(oh, vectors, 12) > 1
    c = 64  # several channels per work item, each thread's first written before the other's last
    x = ref.random(np.random.default_rng(hw[0]), (2, c) + hw) * 30.0
    f = ref.random(np.random.default_rng(k), (c, 1, k, k))
    b = ref.random(np.random.default_rng(1), (c,))
    fn = td.function(td.tensor(x.shape), td.tensor(f.shape), td.tensor(b.shape))(
        lambda a, w, bias: td.conv2d(a, w, bias, stride=stride, padding=k // 2, groups=c))
    out = tracea.compile(fn, threads=2)(x, f, b)
    ref.assert_close(out, ref.conv2d(x, f, b, (stride, stride), (k // 2,) * 4, (1, 1), c, "nchw"), "f32", k * k)


@pytest.mark.parametrize("w", [7, 8, 9, 14, 15, 17, 28, 33])
@pytest.mark.parametrize("left", [0, 1, 2])
@pytest.mark.parametrize("groups", [1, 6])
def test_stride_2_rows_split_into_column_planes(w, left, groups):
    """A stride-2 NCHW conv copies each row's even and odd columns into two planes as vector
    pairs: 4-lane pairs for rows of 8-15 pixels, the last 2V columns once more, overlapping (an
    odd start swaps the planes), rows of 7 one by one. Values far apart per column, so a column
    in the wrong plane or place shows."""
    x = ref.random(np.random.default_rng(w), (2, 6, 5, w)) + np.arange(w, dtype=np.float32) * 10.0
    f = ref.random(np.random.default_rng(left), (6, 6 // groups, 3, 5))
    pads = (1, 1, left, 2)
    fn = td.function(td.tensor(x.shape), td.tensor(f.shape))(
        lambda a, b: td.conv2d(a, b, stride=2, padding=pads, groups=groups))
    out = tracea.compile(on_variant(fn, "cpu.conv2d.depthwise_nchw" if groups > 1 else "cpu.conv2d.direct_nchw"))(x, f)
    ref.assert_close(out, ref.conv2d(x, f, None, (2, 2), pads, (1, 1), groups, "nchw"), "f32", 15 * 6 // groups)


@pytest.mark.parametrize("profile", ["zen3-avx2", "skylake-avx512"])
@pytest.mark.parametrize("hw,c,kernel,stride,dilation,pads", [
    ((9, 29), 128, 3, 1, 1, (1, 1, 1, 1)),  # runs of 4 pixels and edges; 8 (AVX2: 16) channel vectors
    ((6, 23), 20, 3, 2, 1, (1, 0, 0, 2)),  # stride 2 (a run's pixels share every other column), a masked vector
    ((7, 30), 200, 7, 1, 1, (3, 3, 3, 3)),  # ConvNeXt's 7x7: blocks of channel vectors and a remainder
    ((5, 26), 40, 3, 1, 2, (2, 2, 2, 2)),  # dilation: columns 2 apart
    ((4, 5), 24, 3, 1, 1, (1, 1, 1, 1)),  # too narrow for a run: every pixel alone
    ((3, 17), 48, 5, 2, 1, (0, 2, 2, 0))])
def test_depthwise_nhwc_runs_of_pixels(profile, monkeypatch, hw, c, kernel, stride, dilation, pads):
    """The depthwise NHWC kernel loads each input column once for the run of pixels that read it
    and keeps the filter row in registers: every column tap of a run's pixels (strides and
    dilations that make pixels share columns, or not), the edge pixels alone, channel blocks
    sized to each ISA's registers with a masked last vector, the bias and an activation; against
    the reference at f32 precision, inputs of scale 3 through relu's bend."""
    monkeypatch.setenv("TRACEA_CPU", profile)
    rng = np.random.default_rng(c + kernel)
    x, f, b = ref.random(rng, (2, *hw, c), scale=3.0), ref.random(rng, (kernel, kernel, 1, c)), ref.random(rng, (c,))
    fn = td.function(td.tensor(x.shape), td.tensor(f.shape), td.tensor(b.shape))(
        lambda a, w, bias: td.conv2d(a, w, bias, stride=stride, padding=pads, dilation=dilation, groups=c,
                                     layout="nhwc", epilogue=[td.relu()]))
    got = tracea.compile(on_variant(fn, "cpu.conv2d.depthwise_nhwc"), threads=2)(x, f, b)
    expected = ref.epilogue(ref.conv2d(x, f, b, (stride, stride), pads, (dilation, dilation), c, "nhwc"),
                            [("relu", None)])
    ref.assert_close(got, expected, "f32", kernel * kernel)


@pytest.mark.parametrize("variant,x_shape,f_shape,padding,groups,layout", [
    ("cpu.conv2d.direct_nchw", (2, 5, 11, 13), (6, 5, 3, 3), 1, 1, "nchw"),
    ("cpu.conv2d.depthwise_nchw", (2, 6, 11, 13), (6, 1, 5, 5), 2, 6, "nchw"),
    ("cpu.conv2d.pointwise_nchw", (2, 5, 9, 9), (7, 5, 1, 1), 0, 1, "nchw"),
    ("cpu.conv2d.pointwise_nchw", (3, 40, 1, 1), (9, 40, 1, 1), 0, 1, "nchw"),  # squeeze-excitation: 1 pixel
    ("cpu.conv2d.pointwise_nchw", (2, 7, 40, 40), (21, 7, 1, 1), 0, 1, "nchw"),  # whole register tiles
    ("cpu.conv2d.im2col_nchw", (3, 5, 6, 6), (7, 5, 3, 3), 1, 1, "nchw"),
    ("cpu.conv2d.implicit_gemm", (2, 5, 9, 9), (7, 5, 3, 3), 1, 1, "nchw"),
    ("cpu.conv2d.implicit_gemm", (2, 9, 9, 5), (3, 3, 5, 7), 1, 1, "nhwc"),
    ("cpu.conv2d.depthwise_nhwc", (2, 9, 9, 20), (3, 3, 1, 20), 1, 20, "nhwc"),
    ("cpu.reference", (1, 3, 5, 5), (2, 3, 3, 3), 1, 1, "nchw")])
@pytest.mark.parametrize("steps", [[("hardswish", None)], [("relu", None), ("scale", -0.5)], [("gelu", "tanh")],
                                   [("sigmoid", None)]])
def test_conv_epilogue_runs_on_every_cpu_kernel(variant, x_shape, f_shape, padding, groups, layout, steps):
    """A conv2d's epilogue (the activation after it) is applied to each value after the bias,
    before the store, by every CPU conv kernel: inputs of scale 3 reach both sides of each
    activation's bends."""
    rng = np.random.default_rng(len(steps))
    x, f = ref.random(rng, x_shape, scale=3.0), ref.random(rng, f_shape)
    b = ref.random(rng, (f_shape[0] if layout == "nchw" else f_shape[3],))
    build = {"hardswish": td.hardswish, "relu": td.relu, "sigmoid": td.sigmoid, "scale": lambda: td.scale(-0.5),
             "gelu": lambda: td.gelu("tanh")}
    fn = td.function(td.tensor(x.shape), td.tensor(f.shape), td.tensor(b.shape))(
        lambda a, w, bias: td.conv2d(a, w, bias, padding=padding, groups=groups, layout=layout,
                                     epilogue=[build[kind]() for kind, _ in steps]))
    kernel = tracea.compile(on_variant(fn, variant))
    expected = ref.epilogue(ref.conv2d(x, f, b, (1, 1), (padding,) * 4, (1, 1), groups, layout), steps)
    ref.assert_close(kernel(x, f, b), expected, "f32", math.prod(f_shape[1:]) if layout == "nchw" else math.prod(f_shape[:3]))


LEFTOVER_LINALG = """
#id = affine_map<(d0, d1) -> (d0, d1)>
#row = affine_map<(d0, d1) -> (d1)>
#sum = affine_map<(d0, d1) -> (d0)>
func.func @leftover(%x: tensor<{m}x{n}xf32>, %b: tensor<{n}xf32>) -> (tensor<{m}x{n}xf32>, tensor<{m}xf32>,
                                                                  tensor<{n}x{m}xf32>, tensor<{mp}x{np}xf32>) {{
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<{m}x{n}xf32>
  %relu = linalg.generic {{indexing_maps = [#id, #row, #id], iterator_types = ["parallel", "parallel"]}}
      ins(%x, %b : tensor<{m}x{n}xf32>, tensor<{n}xf32>) outs(%e : tensor<{m}x{n}xf32>) {{
  ^bb0(%a: f32, %c: f32, %o: f32):
    %s = arith.addf %a, %c : f32
    %r = arith.maximumf %s, %zero : f32
    linalg.yield %r : f32
  }} -> tensor<{m}x{n}xf32>
  %e1 = tensor.empty() : tensor<{m}xf32>
  %init = linalg.fill ins(%zero : f32) outs(%e1 : tensor<{m}xf32>) -> tensor<{m}xf32>
  %sums = linalg.generic {{indexing_maps = [#id, #sum], iterator_types = ["parallel", "reduction"]}}
      ins(%x : tensor<{m}x{n}xf32>) outs(%init : tensor<{m}xf32>) {{
  ^bb0(%a: f32, %o: f32):
    %s = arith.addf %a, %o : f32
    linalg.yield %s : f32
  }} -> tensor<{m}xf32>
  %et = tensor.empty() : tensor<{n}x{m}xf32>
  %t = linalg.transpose ins(%x : tensor<{m}x{n}xf32>) outs(%et : tensor<{n}x{m}xf32>) permutation = [1, 0]
  %p = tensor.pad %x low[1, 2] high[0, 3] {{
  ^bb0(%i: index, %j: index):
    tensor.yield %zero : f32
  }} : tensor<{m}x{n}xf32> to tensor<{mp}x{np}xf32>
  return %relu, %sums, %t, %p : tensor<{m}x{n}xf32>, tensor<{m}xf32>, tensor<{n}x{m}xf32>, tensor<{mp}x{np}xf32>
}}
"""


@given(m=st.integers(1, 70), n=st.integers(1, 70), threads=st.sampled_from([1, 2]))
def test_leftover_linalg_split_and_vectorized(m, n, threads):
    """Linalg ops no kernel takes (elementwise with a broadcast, a row reduction, a transpose,
    a pad) are split among the threads and vectorized, with remainders, and stay exact."""
    text = LEFTOVER_LINALG.format(m=m, n=n, mp=m + 1, np=n + 5)
    kernel = tracea.compile(text, threads=threads, keep_stages=True)
    x = np.random.default_rng(m * 71 + n).standard_normal((m, n)).astype(np.float32)
    b = np.linspace(-1, 1, n, dtype=np.float32)
    relu, sums, t, p = kernel(x, b)
    np.testing.assert_array_equal(relu, np.maximum(x + b, 0))
    np.testing.assert_allclose(sums, x.sum(axis=1, dtype=np.float64), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(t, x.T)
    np.testing.assert_array_equal(p, np.pad(x, ((1, 0), (2, 3))))
    linalg, llvm = kernel.stages["linalg"], kernel.stages["llvm"]
    if n > 1:
        assert "vector.transfer_read" in linalg  # the elementwise body, at least
    if threads > 1 and m * n >= 16384:
        assert "scf.forall" in linalg
    assert "memrefCopy" not in llvm  # the pad's strided copy is a loop of its own


@pytest.mark.parametrize("m,threads", [(5, 1), (300, 2)])
def test_row_reductions_accumulate_vectors_of_partial_sums(m, threads):
    """A reduction along rows of at least 4 vectors carries vectors of partial sums (4 independent
    chains of adds) through its loop in registers (one reduction across lanes per row), and sums
    within f32 precision of float64."""
    n = 8 * LANES
    kernel = tracea.compile(LEFTOVER_LINALG.format(m=m, n=n, mp=m + 1, np=n + 5), threads=threads, keep_stages=True)
    x = np.random.default_rng(m).standard_normal((m, n)).astype(np.float32) + 100  # a large mean: order matters
    sums = kernel(x, np.zeros(n, np.float32))[1]
    np.testing.assert_allclose(sums, x.sum(axis=1, dtype=np.float64), rtol=2e-6)
    assert re.search(rf"iter_args\(.*\) -> \(.*vector<{4 * LANES}xf32>\)", kernel.stages["linalg"])


LAYER_NORM = """
#id = affine_map<(d0, d1) -> (d0, d1)>
#row = affine_map<(d0, d1) -> (d0)>
#col = affine_map<(d0, d1) -> (d1)>
func.func @layer_norm(%x: tensor<{m}x{n}xf32>, %w: tensor<{n}xf32>, %b: tensor<{n}xf32>) -> tensor<{m}x{n}xf32> {{
  %zero = arith.constant 0.0 : f32
  %count = arith.constant {n}.0 : f32
  %eps = arith.constant 1.0e-5 : f32
  %e1 = tensor.empty() : tensor<{m}xf32>
  %init = linalg.fill ins(%zero : f32) outs(%e1 : tensor<{m}xf32>) -> tensor<{m}xf32>
  %sum = linalg.generic {{indexing_maps = [#id, #row], iterator_types = ["parallel", "reduction"]}}
      ins(%x : tensor<{m}x{n}xf32>) outs(%init : tensor<{m}xf32>) {{
  ^bb0(%a: f32, %o: f32):
    %s = arith.addf %a, %o : f32
    linalg.yield %s : f32
  }} -> tensor<{m}xf32>
  %e = tensor.empty() : tensor<{m}x{n}xf32>
  %centered = linalg.generic {{indexing_maps = [#id, #row, #id], iterator_types = ["parallel", "parallel"]}}
      ins(%x, %sum : tensor<{m}x{n}xf32>, tensor<{m}xf32>) outs(%e : tensor<{m}x{n}xf32>) {{
  ^bb0(%a: f32, %s: f32, %o: f32):
    %mean = arith.divf %s, %count : f32
    %d = arith.subf %a, %mean : f32
    linalg.yield %d : f32
  }} -> tensor<{m}x{n}xf32>
  %var = linalg.generic {{indexing_maps = [#id, #row], iterator_types = ["parallel", "reduction"]}}
      ins(%centered : tensor<{m}x{n}xf32>) outs(%init : tensor<{m}xf32>) {{
  ^bb0(%a: f32, %o: f32):
    %sq = arith.mulf %a, %a : f32
    %s = arith.addf %sq, %o : f32
    linalg.yield %s : f32
  }} -> tensor<{m}xf32>
  %y = linalg.generic {{indexing_maps = [#id, #row, #col, #col, #id], iterator_types = ["parallel", "parallel"]}}
      ins(%centered, %var, %w, %b : tensor<{m}x{n}xf32>, tensor<{m}xf32>, tensor<{n}xf32>, tensor<{n}xf32>)
      outs(%e : tensor<{m}x{n}xf32>) {{
  ^bb0(%d: f32, %v: f32, %g: f32, %c: f32, %o: f32):
    %mv = arith.divf %v, %count : f32
    %ve = arith.addf %mv, %eps : f32
    %r = math.rsqrt %ve : f32
    %n0 = arith.mulf %d, %r : f32
    %n1 = arith.mulf %n0, %g : f32
    %n2 = arith.addf %n1, %c : f32
    linalg.yield %n2 : f32
  }} -> tensor<{m}x{n}xf32>
  return %y : tensor<{m}x{n}xf32>
}}
"""


@pytest.mark.parametrize("m,n,threads", [(300, 8 * LANES, 2), (7, 8 * LANES, 1), (5, 100, 2), (1, 3, 2)])
def test_row_reductions_fuse_with_their_consumers(m, n, threads):
    """A layer norm (torch-mlir's form: sum, x - mean, sum of squares, normalize) runs as one loop
    over rows: the reductions and the centered row are computed row by row inside it (no
    tensor of the input's size besides the result), on every thread, and match float64."""
    kernel = tracea.compile(LAYER_NORM.format(m=m, n=n), threads=threads, keep_stages=True)
    rng = np.random.default_rng(m + n)
    x = (rng.standard_normal((m, n)) * 3 + 50).astype(np.float32)  # a large mean: two passes needed
    x[0] = 2.0  # a constant row: variance 0, rsqrt(eps)
    w, b = np.linspace(-2, 2, n, dtype=np.float32), np.linspace(1, 0, n, dtype=np.float32)
    x64 = x.astype(np.float64)
    centered = x64 - x64.mean(axis=1, keepdims=True)
    expected = centered / np.sqrt((centered ** 2).mean(axis=1, keepdims=True) + 1e-5) * w + b
    got = kernel(x, w, b)
    assert np.abs(got - expected).max() <= 2e-5 * np.abs(expected).max(), np.abs(got - expected).max()
    linalg, bufferized = kernel.stages["linalg"], kernel.stages["bufferized"]
    assert linalg.count("scf.forall (") == (1 if threads > 1 and m >= threads else 0)
    allocs = re.findall(r"memref.alloc\(\)(?: \{[^}]*\})? : memref<(\d+)x", bufferized)
    copies = re.findall(r"memref.copy [^\n]* to (memref<[^>]*>)", bufferized)
    assert all(rows == "1" for rows in allocs) and set(copies) <= {"memref<1xf32>"}, (allocs, copies)


def test_large_leftover_linalg_runs_on_every_thread():
    kernel = tracea.compile(LEFTOVER_LINALG.format(m=300, n=200, mp=301, np=205), threads=2, keep_stages=True)
    assert kernel.stages["linalg"].count("scf.forall") >= 2  # elementwise, reduction
    assert "vector.shuffle" in kernel.stages["linalg"]  # the transpose, in register blocks
    assert "omp.parallel" in kernel.stages["llvm"] or "mlirAsyncRuntime" in kernel.stages["llvm"]
    x = np.random.default_rng(1).standard_normal((300, 200)).astype(np.float32)
    b = np.ones(200, np.float32)
    relu, sums, t, p = kernel(x, b)
    np.testing.assert_array_equal(relu, np.maximum(x + 1, 0))
    np.testing.assert_array_equal(p[1:, 2:-3], x)


TRANSPOSE = """
func.func @transpose(%x: tensor<{src}xf32>) -> tensor<{dst}xf32> {{
  %e = tensor.empty() : tensor<{dst}xf32>
  %t = linalg.transpose ins(%x : tensor<{src}xf32>) outs(%e : tensor<{dst}xf32>) permutation = {perm}
  return %t : tensor<{dst}xf32>
}}
"""


@given(shape=st.lists(st.integers(1, 40), min_size=2, max_size=4), data=st.data(),
       threads=st.sampled_from([1, 2]))
def test_transposes_move_register_blocks(shape, data, threads):
    """A transposing copy runs as L x L blocks transposed in registers (masked at the edges)
    exactly when, unit dims not counting, the input's innermost dim is not the output's and both
    are at least 4 long; either way it is exact."""
    perm = data.draw(st.permutations(range(len(shape))))
    dst = [shape[p] for p in perm]
    fmt = lambda dims: "x".join(map(str, dims))  # noqa: E731
    text = TRANSPOSE.format(src=fmt(shape), dst=fmt(dst), perm=list(perm))
    kernel = tracea.compile(text, threads=threads, keep_stages=True)
    x = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
    np.testing.assert_array_equal(kernel(x), x.transpose(perm))
    # the innermost dims that are not 1 (the pipeline drops and re-adds unit dims anywhere)
    src_inner = max((d for d in range(len(shape)) if shape[d] != 1), default=None)
    dst_inner = max((d for d in range(len(dst)) if dst[d] != 1), default=None)
    blocks = src_inner is not None and perm[dst_inner] != src_inner and shape[src_inner] >= 4 and dst[dst_inner] >= 4
    assert ("vector.shuffle" in kernel.stages["linalg"]) == blocks


EXP_PROGRAM = """
#id = affine_map<(d0) -> (d0)>
func.func @exp(%x: tensor<{n}xf32>) -> tensor<{n}xf32> {{
  %e = tensor.empty() : tensor<{n}xf32>
  %y = linalg.generic {{indexing_maps = [#id, #id], iterator_types = ["parallel"]}}
      ins(%x : tensor<{n}xf32>) outs(%e : tensor<{n}xf32>) {{
  ^bb0(%a: f32, %b: f32):
    %r = math.exp %a : f32
    linalg.yield %r : f32
  }} -> tensor<{n}xf32>
  return %y : tensor<{n}xf32>
}}
"""


def test_exp_in_leftover_linalg_is_a_vector_polynomial_with_ieee_edges():
    """exp in a loop nest no kernel took (a sigmoid, a SiLU): vectorized without libm, within 2 ulps
    of float64 over its range, +inf past 88.72, NaN for NaN, 0 for -inf (and a remainder vector)."""
    x = np.concatenate([np.linspace(-87, 88.7, 3001, dtype=np.float32),
                        np.array([np.inf, -np.inf, np.nan, 88.8, 100.0, -1e-30, 0.0], np.float32)])
    kernel = tracea.compile(EXP_PROGRAM.format(n=x.size), threads=2, keep_stages=True)
    assert "@expf" not in kernel.stages["llvm"] and "llvm.intr.exp" not in kernel.stages["llvm"]
    got, want = kernel(x), np.exp(x.astype(np.float64))
    finite = np.isfinite(want) & (np.abs(want) < 3.4e38)
    ulps = np.abs(got[finite] - want[finite]) / np.spacing(np.abs(want[finite]).astype(np.float32))
    assert ulps.max() <= 2
    np.testing.assert_array_equal(got[-7:-2], [np.inf, 0.0, np.nan, np.inf, np.inf])
    assert got[-2] == 1.0 and got[-1] == 1.0


def test_tanh_in_leftover_linalg_is_a_vector_polynomial_accurate_near_zero():
    """tanh outside the kernels (a GELU written out, as Hugging Face's GPT-2): vectorized without
    libm, within 2 ulps of float64 from subnormals to saturation (relative precision near 0,
    both sides of the 0.625 switch), tanh(-0) = -0, +-1 at +-inf, NaN for NaN."""
    tiny = np.logspace(-38, 1, 1500).astype(np.float32)
    x = np.concatenate([np.linspace(-20, 20, 4001, dtype=np.float32), tiny, -tiny,
                        np.float32([0.625, np.nextafter(np.float32(0.625), 0), 44, 1e30, np.inf, -np.inf, np.nan,
                                    -0.0])])
    kernel = tracea.compile(EXP_PROGRAM.replace("math.exp", "math.tanh").format(n=x.size), keep_stages=True)
    assert "tanh" not in kernel.stages["llvm"]
    got, want = kernel(x), np.tanh(x.astype(np.float64))
    finite = ~np.isnan(x)
    ulps = np.abs(got[finite] - want[finite]) / np.spacing(np.abs(want[finite]).astype(np.float32))
    assert ulps.max() <= 2, x[finite][ulps.argmax()]
    np.testing.assert_array_equal(got[-5:-1], [1.0, 1.0, -1.0, np.nan])
    assert got[-1] == 0 and np.signbit(got[-1])


def test_erf_in_leftover_linalg_is_a_vector_polynomial():
    """erf (the exact GELU of ViT and BERT): vectorized without libm, within 3 ulps of float64
    from subnormals to saturation, on both sides of the switches at 1 and 4; erf(-0) = -0, +-1 at
    +-inf, NaN for NaN."""
    tiny = np.logspace(-38, 0, 1500).astype(np.float32)
    edges = [1.0, np.nextafter(np.float32(1.0), 0), 4.0, np.nextafter(np.float32(4.0), 0), 1e30]
    x = np.concatenate([np.linspace(-6, 6, 6001, dtype=np.float32), tiny, -tiny, np.float32(edges),
                        -np.float32(edges), np.float32([np.inf, -np.inf, np.nan, -0.0])])
    kernel = tracea.compile(EXP_PROGRAM.replace("math.exp", "math.erf").format(n=x.size), keep_stages=True)
    assert "erff" not in kernel.stages["llvm"] and "math.erf" not in kernel.stages["llvm"]
    got, want = kernel(x), scipy.special.erf(x.astype(np.float64))
    finite = ~np.isnan(x)
    ulps = np.abs(got[finite] - want[finite]) / np.spacing(np.abs(want[finite]).astype(np.float32))
    assert ulps.max() <= 3, x[finite][ulps.argmax()]
    np.testing.assert_array_equal(got[-4:-1], [1.0, -1.0, np.nan])
    assert got[-1] == 0 and np.signbit(got[-1])


MASKED_SELECT = """
#id = affine_map<(d0, d1) -> (d0, d1)>
func.func @masked(%x: tensor<6x197xf32>, %m: tensor<6x197xi1>) -> tensor<6x197xf32> {
  %e = tensor.empty() : tensor<6x197xf32>
  %ninf = arith.constant 0xFF800000 : f32
  %y = linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%x, %m : tensor<6x197xf32>, tensor<6x197xi1>) outs(%e : tensor<6x197xf32>) {
  ^bb0(%a: f32, %b: i1, %c: f32):
    %s = arith.select %b, %a, %ninf : f32
    linalg.yield %s : f32
  } -> tensor<6x197xf32>
  return %y : tensor<6x197xf32>
}
"""


def test_leftover_rows_of_partial_vectors_peel_the_last_one():
    """A 197-wide elementwise op (a ViT's attention mask) runs whole vectors unmasked and peels
    the last, partial one (masked bytes were a branch per lane: 12 % of a ViT's time)."""
    kernel = tracea.compile(MASKED_SELECT, keep_stages=True)
    stage = kernel.stages["bufferized"]
    assert "to %c192 step" in stage and "vector.create_mask" not in stage
    rng = np.random.default_rng(7)
    x, m = rng.standard_normal((6, 197)).astype(np.float32), rng.random((6, 197)) < 0.5
    np.testing.assert_array_equal(kernel(x, m), np.where(m, x, -np.inf).astype(np.float32))


def _nchw_conv_with(schedule, x, f, b, **opts):
    args = [td.tensor(x.shape), td.tensor(f.shape)] + ([td.tensor(b.shape)] if b is not None else [])
    fn = td.function(*args)(lambda *a: td.conv2d(*a, schedule=schedule, **opts))
    return tracea.compile(fn, threads=2)(x, f, *([b] if b is not None else []))


@pytest.mark.parametrize("mr,nv,run", [(1, 1, 1), (5, 2, 3), (3, 4, 1), (12, 1, 7), (2, 6, 100)])
def test_direct_nchw_conv_runs_any_register_tile_and_run(mr, nv, run):
    """The direct kernel's schedule (the tuner's knobs): MR filters (7 filters: a partial block
    unless MR is 1) x NV position vectors, runs of whole register tiles of positions (past the
    image's: one run); stride 2 so the phase planes are read at offsets."""
    rng = np.random.default_rng(mr * 10 + nv)
    x, f, b = ref.random(rng, (2, 3, 13, 11)) * 10.0, ref.random(rng, (7, 3, 3, 3)), ref.random(rng, (7,))
    s = td.Schedule(tile=(mr, run * nv * LANES), warp_tile=(mr, nv * LANES), lane_map=td.LaneMap("simd", (LANES,)))
    out = _nchw_conv_with(s, x, f, b, stride=2, padding=1)
    ref.assert_close(out, ref.conv2d(x, f, b, (2, 2), (1,) * 4, (1, 1), 1, "nchw"), "f32", 27)


@pytest.mark.parametrize("rows,nv,hw", [(1, 1, (9, 20)), (4, 1, (9, 20)), (3, 2, (7, 7)), (7, 1, (7, 7)), (2, 3, (5, 30))])
def test_depthwise_nchw_conv_runs_any_register_tile(rows, nv, hw):
    """The depthwise kernel's schedule: R output rows (a partial last group when R does not
    divide them) x NV column vectors (several tiles a row, or one wider than the row)."""
    c = 6
    rng = np.random.default_rng(rows * 10 + nv)
    x, f = ref.random(rng, (2, c) + hw) * 10.0, ref.random(rng, (c, 1, 3, 3))
    s = td.Schedule(warp_tile=(rows, nv * LANES), lane_map=td.LaneMap("simd", (LANES,)))
    out = _nchw_conv_with(s, x, f, None, padding=1, groups=c)
    ref.assert_close(out, ref.conv2d(x, f, None, (1, 1), (1,) * 4, (1, 1), c, "nchw"), "f32", 9)


@pytest.mark.parametrize("schedule,groups,message", [
    (td.Schedule(tile=(4, 8), warp_tile=(2, 8)), 1, "tile = [MR"),
    (td.Schedule(tile=(4, 12), warp_tile=(4, 12)), 1, "NV * lanes positions"),
    (td.Schedule(tile=(12, 3 * LANES), warp_tile=(12, 3 * LANES)), 1, "vector registers"),
    (td.Schedule(warp_tile=(2, 3)), 4, "NV * lanes columns"),
    (td.Schedule(warp_tile=(8, 4 * LANES)), 4, "vector registers")])
def test_nchw_conv_schedules_the_kernels_cannot_run_are_named(schedule, groups, message):
    from dataclasses import replace
    x, f = np.ones((1, 4, 8, 8), np.float32), np.ones((4, 4 // groups, 3, 3), np.float32)
    with pytest.raises(tracea.CompileError, match=re.escape(message)):
        _nchw_conv_with(replace(schedule, lane_map=td.LaneMap("simd", (LANES,))), x, f, None, groups=groups)


def _serial_cases():
    rng = np.random.default_rng(3)
    import torch
    t = torch.from_numpy
    a, b, wt = ref.random(rng, (70, 40)), ref.random(rng, (40, 90)), ref.random(rng, (20, 600))
    x, f = ref.random(rng, (2, 8, 40, 40)), ref.random(rng, (8, 8, 3, 3))  # (a single work item is not parallel)
    dw = ref.random(rng, (8, 1, 3, 3))
    q = ref.random(rng, (1, 2, 40, 2 * LANES))
    yield "packed gemm", [a, b], lambda s: (lambda x_, y_: td.gemm(x_, y_, schedule=s)), a @ b, 40
    yield "inner-product gemm", [wt[:5], wt], lambda s: (lambda x_, y_: td.gemm(x_, y_, transpose_b=True, schedule=s)), \
        wt[:5] @ wt.T, 600
    yield "direct conv", [x, f], lambda s: (lambda x_, f_: td.conv2d(x_, f_, padding=1, schedule=s)), \
        torch.nn.functional.conv2d(t(x), t(f), padding=1).numpy(), 72
    yield "depthwise nchw", [x, dw], lambda s: (lambda x_, f_: td.conv2d(x_, f_, padding=1, groups=8, schedule=s)), \
        torch.nn.functional.conv2d(t(x), t(dw), padding=1, groups=8).numpy(), 9
    xh, fh, dh = x.transpose(0, 2, 3, 1).copy(), f.transpose(2, 3, 1, 0).copy(), dw.transpose(2, 3, 1, 0).copy()
    yield "implicit gemm (nhwc)", [xh, fh], lambda s: (lambda x_, f_: td.conv2d(x_, f_, padding=1, layout="nhwc", schedule=s)), \
        torch.nn.functional.conv2d(t(x), t(f), padding=1).numpy().transpose(0, 2, 3, 1), 72
    yield "depthwise nhwc", [xh, dh], lambda s: (lambda x_, f_: td.conv2d(x_, f_, padding=1, groups=8, layout="nhwc",
                                                                          schedule=s)), \
        torch.nn.functional.conv2d(t(x), t(dw), padding=1, groups=8).numpy().transpose(0, 2, 3, 1), 9
    yield "attention", [q, q, q], lambda s: (lambda x_, y_, z_: td.attention(x_, y_, z_, causal=True, schedule=s)), \
        torch.nn.functional.scaled_dot_product_attention(t(q), t(q), t(q), is_causal=True).numpy(), 40
    yield "softmax", [a], lambda s: (lambda x_: td.softmax(x_, schedule=s)), scipy.special.softmax(a, axis=-1), 40


@pytest.mark.parametrize("case", list(_serial_cases()), ids=lambda c: c[0])
def test_a_kernel_scheduled_on_one_thread_runs_serially_in_a_threaded_program(case):
    """Schedule(threads=1) (the tuner's threads knob; alone, the rest is the default's): the
    kernel's loops run on the calling thread (no parallel loop is left to OpenMP) while the
    program has two threads; with the default schedule the same kernel is parallel."""
    _, args, build, expected, terms = case
    for schedule, parallel in ((td.Schedule(threads=1), False), (None, True)):
        fn = td.function(*[td.tensor(x.shape) for x in args])(build(schedule))
        kernel = tracea.compile(fn, threads=2, keep_stages=True)
        assert ("scf.parallel" in kernel.stages["linalg"]) == parallel
        ref.assert_close(kernel(*args), expected, "f32", terms)
