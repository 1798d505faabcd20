"""Plausible one-line bugs, each applied to the sources in turn: does the test suite catch it?

    .venv/bin/python scripts/mutations.py            # every mutation, with the tests that should catch it
    .venv/bin/python scripts/mutations.py --only attention-running-max

A mutation is an exact text replacement in one file (it must match once) and the tests to run
against it; the file is restored afterwards, also when interrupted. "caught" means those tests
failed. A mutation the suite misses is a hole in the tests: the report lists them, and the exit
status is 1 if there is one.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# name -> (file, original text, mutated text, tests that must fail)
MUTATIONS = {
    "attention-running-max": (
        "tracea/targets/cpu/attention.py",
        'm_new = t.op(f"arith.maxnumf {m_old}, {row_max} {NNAN} : f32", "r")', "m_new = row_max",
        ["test/test_cpu_kernels.py", "-k", "attention"]),
    "gpu-attention-running-max": (  # the same bug in the GPU kernels' online softmax (mma.sync and wgmma)
        "tracea/targets/nvvm/attention.py", "    row_max = list(m)\n", "    row_max = [neg, neg]\n",
        ["test/test_ptx_emulator.py", "-k", "attention"]),
    "gelu-tanh-for-erf": (
        "tracea/codegen/kernel_text.py",
        'if ep.kind == "gelu" and ep.approximate == "tanh":', 'if ep.kind == "gelu":',
        ["test/test_cpu_kernels.py", "test/test_numerics.py", "test/test_gpu_mma.py", "-k", "gelu or epilogue"]),
    "gelu-tanh-for-erf-on-the-gpu": (  # the same bug, against the emulated GPU kernels alone
        "tracea/codegen/kernel_text.py",
        'if ep.kind == "gelu" and ep.approximate == "tanh":', 'if ep.kind == "gelu":',
        ["test/test_ptx_emulator.py", "-k", "gelu"]),
    "narrowed-swizzle-mask": (
        "tracea/targets/nvvm/mma.py",
        "mask = ((1 << s.bits) - 1) << (s.base + s.shift)", "mask = ((1 << (s.bits - 1)) - 1) << (s.base + s.shift)",
        ["test/test_ptx_emulator.py", "-k", "matches_torch"]),  # bank conflicts measured on the kernels' addresses
    "silu-without-its-x": (  # the epilogue every CPU strategy shares: caught only against numpy
        "tracea/codegen/kernel_text.py", "return b.mul(x, _sigmoid(b, x))", "return _sigmoid(b, x)",
        ["test/test_cpu_kernels.py", "-k", "batched"]),
    "unclamped-gather-index": (
        "tracea/passes/check_indices.py",
        "extract.operands[1 + k] = arith.select(ok, index, arith.constant(ir.IndexType.get(), 0))",
        "arith.select(ok, index, arith.constant(ir.IndexType.get(), 0))",
        ["test/test_indexing.py"]),
    "unchecked-cached-library": (
        "tracea/runtime/aot.py",
        'if hashlib.sha256(code).hexdigest() != meta["library_sha256"]:', "if False:",
        ["test/test_disk_cache.py", "-k", "damaged"]),
    "division-by-zero-not-reported": (
        "tracea/runtime/faults.py",
        "if status & (1 << bit):", "if status & (1 << bit) and bit != 0:",
        ["test/test_compiler_robustness.py", "test/test_torch_coverage.py"]),
    "layer-key-without-types": (
        "tracea/frontend/layers.py",
        "description += [f\"{tuple(n.meta['val'].shape)}:{n.meta['val'].dtype}\" for n in inputs]", "pass",
        ["test/test_layers.py"]),
    "failing-window-one-op-short": (  # the bisection keeps a run that does not fail
        "tracea/frontend/partition.py", "    return ops[start:end]\n", "    return ops[start + 1:end]\n",
        ["test/test_torch.py", "-k", "fail_only_together"]),
    "spirv-version-not-restored": (  # SIMT modules for a cooperative-matrix device at SPIR-V 1.0
        "tracea/targets/spirv/target.py", "vce = vce.replace(lowered, self.version, 1)", "pass",
        ["test/test_vulkan.py", "-k", "simt_kernels_for_a_cooperative"]),
    "cooperative-b-transposed-stride": (  # caught on Mesa 26's lavapipe, which runs the kernel
        "tracea/targets/spirv/cooperative.py", "{{leadDimension = {k} : index, transpose}}",
        "{{leadDimension = {k + tile} : index, transpose}}",
        ["test/test_vulkan.py", "-k", "lavapipe_with_cooperative"]),
    "tanh-large-unsigned": (
        "tracea/targets/cpu/vector_math.py",
        'large = _signed_as_x(t, vt, bt, t.op(f"arith.subf {one}, {two_over} : {vt}", "y"))',
        'large = t.op(f"arith.subf {one}, {two_over} : {vt}", "y")',
        ["test/test_cpu_kernels.py", "test/test_vulkan.py", "-k", "tanh"]),
    "avx2-tile-never-fitted": (
        "tracea/targets/cpu/kernels.py", "if padded(4, 3 * lanes) < 0.99 * padded(mr, nr)", "if False",
        ["test/test_cpu_kernels.py", "-k", "pads_the_gemm"]),
    "streaming-gemm-one-row-of-w": (  # every pass of the streaming GEMM reads the same row of W
        "tracea/targets/cpu/gemm.py", 'bv = [b_vector(t.add(k0, t.c(u)), t.add("%jb", col), mask)',
        'bv = [b_vector(t.add(k0, t.c(0)), t.add("%jb", col), mask)',
        ["test/test_cpu_kernels.py", "-k", "streaming or few_rows_of_x"]),
    "streaming-gemm-no-tail": (  # the last chunk's partial vector of columns left out
        "tracea/targets/cpu/gemm.py", "        if n % L:  # the last chunk ends in a partial vector\n",
        "        if False:\n", ["test/test_cpu_kernels.py", "-k", "streaming or few_rows_of_x"]),
    "item-not-converted-back": (  # a number computed from a tensor returned as a 0-d tensor
        "tracea/frontend/torch_import.py", 'c[1](next(it).item()) if c[0] == "number"', 'next(it) if c[0] == "number"',
        ["test/test_torch.py", "-k", "numbers_computed"]),
    "data-checks-dropped": (  # checks of numbers read from tensors dropped with the input-shape ones
        "tracea/frontend/torch_import.py", "            continue  # a check of values read from tensors",
        "            pass  # a check of values read from tensors", ["test/test_torch.py", "-k", "numbers_computed"]),
    "dynamo-graphs-not-by-layers": (
        "tracea/frontend/dynamo.py", "    _layer_calls(gm)  # once per graph", "    # once per graph",
        ["test/test_layers.py", "-k", "torch_compile"]),
    "depthwise-run-ignores-stride": (  # a run's pixels read columns as if the stride were 1
        "tracea/targets/cpu/conv.py", "if q * sw + kw * dw == d]", "if q + kw * dw == d]",
        ["test/test_cpu_kernels.py", "-k", "depthwise_nhwc_runs"]),
    "conv-runs-unbalanced": (  # the direct conv's runs as long as fit, a last short one left as it falls
        "tracea/targets/cpu/conv.py", "    per_task = -(-q_segs // min(", "    per_task = per_task or -(-q_segs // min(",
        ["test/test_cpu_kernels.py", "-k", "direct_conv_tasks"]),
    "in-place-rows-six": (  # 6 in-place rows on 32 registers too (0.90x of 4 on 14x14 C256)
        "tracea/targets/cpu/kernels.py", "DIRECT_MAX_MR = 4", "DIRECT_MAX_MR = 6",
        ["test/test_cpu_kernels.py", "-k", "in_place_conv_keeps or in_place_take"]),
    "in-place-rows-avx2-four": (  # AVX2's in-place tile cut to 4 x 2 vectors (0.85x of 6 x 2)
        "tracea/targets/cpu/kernels.py", "mr > DIRECT_MAX_MR and host.vector_registers > 16:",
        "mr > DIRECT_MAX_MR:", ["test/test_cpu_kernels.py", "-k", "in_place_take"]),
    "conv-space-packed-k-blocks": (  # the conv's space fits K blocks to runs of channels only
        "tracea/targets/cpu/kernels.py", "            kc = conv_k_block_of(gather, k, kc, lanes)",
        "            kc = conv_k_block(gather.unit(lanes), k, kc)",
        ["test/test_tuner.py", "-k", "starts_from_the_default"]),
    "ei-without-margin": (  # expected improvement from the best itself: evaluations spent on ties
        "tracea/tuner/search.py", "yz.min() - math.log1p(tolerance) / scale)", "yz.min())",
        ["test/test_tuner.py", "-k", "spend_evaluations_on_ties"]),
    "results-unaligned": (
        "tracea/runtime/kernel.py", "outputs = [aligned_empty(shape, d)", "outputs = [np.empty(shape, d)",
        ["test/test_runtime.py", "-k", "cache_line"]),
    "array-entry-stale-aligned": (  # the entry taking arrays sets only the descriptors' allocated pointer
        "tracea/targets/cpu/native.py", 'f"  store ptr %data{i}, ptr %aligned{i}"]', "]",
        ["test/test_runtime.py", "-k", "reads_the_arrays"]),
    "weight-views-never-renewed": (  # a compiled model keeps a weight's first numpy view for ever
        "tracea/frontend/bridge.py", "if made is not None and made[0] == storage:", "if made is not None:",
        ["test/test_torch.py", "-k", "sees_its_weights"]),
    "dot-prefetch-ignored": (  # the inner-product kernel never asks for B's rows ahead
        "tracea/targets/cpu/gemm.py", 'ahead_of_use = v.attrs["schedule"].stages >= 2', "ahead_of_use = False",
        ["test/test_cpu_kernels.py", "-k", "weights_ahead"]),
    "dot-line-steps-same-k": (  # a cache line's steps of the inner-product kernel all read its first k's
        "tracea/targets/cpu/gemm.py", "accs = products(accs, t.add(k, t.c(u * L)) if u else k, None,",
        "accs = products(accs, k, None,", ["test/test_cpu_kernels.py", "-k", "inner_product_gemm"]),
    "small-c-packed": (  # convs with fewer channels than a vector (the stem) packed again
        "tracea/codegen/conv_gather.py", 'if self.image.dtype != "f32" or self.dilation[1] != 1 or kc % segment',
        'if self.image.dtype != "f32" or self.dilation[1] != 1 or self.wide(lanes) or kc % segment',
        ["test/test_cpu_kernels.py", "-k", "reads_the_image_directly"]),
    "padded-copy-left-for-right": (  # the conv's zero-padded copy shifted where its padding is uneven
        "tracea/targets/cpu/kernels.py", "image = w.pad(image, [0, top, left, 0], [0, bottom, right, 0])",
        "image = w.pad(image, [0, top, right, 0], [0, bottom, left, 0])",
        ["test/test_cpu_kernels.py", "-k", "reads_the_image_directly"]),
    "padded-copy-never-made": (  # padded convs pack their border strips again
        "tracea/targets/cpu/kernels.py", "    if not any(pads) or v.operands", "    if True or v.operands",
        ["test/test_cpu_kernels.py", "-k", "padded_convs_of_stride_1 or reads_the_image_directly"]),
    "in-place-k-block-past-l2": (  # K blocks of as many kernel rows as the conv has, B's panel past L2
        "tracea/targets/cpu/kernels.py", "if rows % d == 0 and d <= fit), default=0)", "if rows % d == 0), default=0)",
        ["test/test_cpu_kernels.py", "-k", "padded_convs_of_stride_1"]),
    "unpadded-convs-l1-k-blocks": (  # 1x1 convs read in place keep K blocks sized for L1 (0.92-0.96x)
        "tracea/targets/cpu/kernels.py", "    if gather.interior_share() == 1 and gather.direct_segment(kc, lanes)",
        "    if pads_first(v) and gather.direct_segment(kc, lanes)",
        ["test/test_cpu_kernels.py", "-k", "padded_convs_of_stride_1"]),
    "m-blocks-unbalanced": (  # the block count as L2 gives it (one thread 4 % more work)
        "tracea/targets/cpu/kernels.py", "        blocks = balanced_m_blocks(m, n, (mr, nr), nc, blocks, threads)",
        "        blocks = blocks",
        ["test/test_cpu_kernels.py", "-k", "m_blocks_share"]),
    "attention-one-query-tile-threaded": (  # AVX-512 blocks of 8 query rows on 2 threads too (0.96-1.0x)
        "tracea/targets/cpu/kernels.py", "AVX512_QUERY_TILES_THREADED = 2", "AVX512_QUERY_TILES_THREADED = 1",
        ["test/test_cpu_kernels.py", "-k", "default_attention_blocks"]),
    "depthwise-long-rows-one-row": (  # rows of more than 2 vectors back to one row a tile (0.87-0.99x)
        "tracea/targets/cpu/conv.py", "    most = max(1, min(oh, accumulators // vectors))",
        "    most = 1 if vectors > 2 else max(1, min(oh, accumulators // vectors))",
        ["test/test_cpu_kernels.py", "-k", "depthwise_nchw_conv_tiles_of_several_rows"]),
    "rows-chunks-unbalanced": (  # column chunks as wide as the sums allow (4 x 2304 x 768, 2 threads: 0.65x)
        "tracea/targets/cpu/kernels.py", "    chunks = _round_up(-(-n // widest), threads)",
        "    chunks = -(-n // widest)",
        ["test/test_cpu_kernels.py", "-k", "chunks_share"]),
    "causal-pairs-off-by-one": (  # the paired order's costly end one block short: the last block never computed
        "tracea/targets/cpu/attention.py", "{t.c(n_qblocks - 1)}, {half}", "{t.c(n_qblocks - 2)}, {half}",
        ["test/test_cpu_kernels.py", "-k", "pairs_when"]),
    "decode-scores-one-key-late": (  # the in-place scores of a decoding step: each key's score one column off
        "tracea/targets/cpu/attention.py", "{P}[{t.c(r)}, {t.add('%c', t.c(u))}]",
        "{P}[{t.c(r)}, {t.add('%c', t.c((u + 1) % U))}]",
        ["test/test_cpu_kernels.py", "-k", "kv_cache_in_place"]),
    "input-updates-taken-for-outputs": (  # the new values of updated inputs read as the model's outputs
        "tracea/frontend/torch_model.py", "self.exported.outputs.rebuild(results[len(updated):])",
        "self.exported.outputs.rebuild(results)", ["test/test_torch.py", "-k", "in_place"]),
    "symbolic-copies-left-to-memrefcopy": (  # copies of symbolic sizes back on MLIR's element-wise memrefCopy
        "tracea/targets/cpu/linalg.py", '            if op.name == "memref.copy":\n',
        '            if op.name == "memref.copy" and all(ir.ShapedType(v.type).has_static_shape for v in op.operands):\n',
        ["test/test_torch.py", "-k", "copy_of_symbolic"]),
    "dynamic-attention-scale-dropped": (  # SDPA over a symbolic key length raised without its scale
        "tracea/passes/raise_linalg.py", "scale=scale * key_scale * query_scale", "scale=key_scale * query_scale",
        ["test/test_torch.py", "-k", "symbolic_length_runs"]),
    "run-time-key-groups-short": (  # K^T packed for a run-time key length: the last partial group of keys left out
        "tracea/targets/cpu/attention.py", 'n_groups = t.op(f"arith.divui {keys_pad}, {t.c(L)} : index", "i")',
        'n_groups = t.op(f"arith.divui {keys_n}, {t.c(L)} : index", "i")',
        ["test/test_cpu_kernels.py", "-k", "known_at_run_time"]),
    "mask-row-of-the-first-query": (  # a per-query attention mask read at the first query's row for every query
        "tracea/targets/cpu/attention.py", "t.c(0) if mask.shape[1] == 1 else mask_row", "t.c(0)",
        ["test/test_cpu_kernels.py", "-k", "adds_its_mask"]),
    "grouped-mask-rows-interleaved": (  # a per-query mask's rows, stacked for grouped heads, in the wrong order
        "tracea/frontend/torch_import.py", "mask.repeat(*[1] * (mask.dim() - 2), g, 1)",
        "mask.repeat_interleave(g, dim=-2)", ["test/test_torch.py", "-k", "grouped_query"]),
    "run-time-length-mask-dropped": (  # a padded batch's decoding step raised to attention without its mask
        "tracea/passes/raise_linalg.py", "scale=scale * key_scale * query_scale, mask=mask)",
        "scale=scale * key_scale * query_scale)", ["test/test_torch.py", "-k", "masked_sdpa_over"]),
    "run-time-products-of-the-static-kernel": (  # the static kernel's plan read: the slow symbolic kernel used
        "tracea/frontend/dynamic.py", "RUN_TIME_PRODUCTS in self.general.explain()",
        "RUN_TIME_PRODUCTS in self.static.explain()", ["test/test_torch.py", "-k", "slow_products"]),
    "run-time-products-uncounted": (  # a contraction of run-time size not counted by the CPU lowering
        "tracea/targets/cpu/linalg.py", "            products += _run_time_product(op)\n", "",
        ["test/test_torch.py", "-k", "slow_products"]),
    "symbolic-products-unseen": (  # the exported graph's linears of symbolic rows not seen before the compile
        "tracea/frontend/dynamic.py", "if sum(symbolic) >= 1 if target in _WEIGHT_PRODUCTS else sum(symbolic) == 1:",
        "if sum(symbolic) > 1 if target in _WEIGHT_PRODUCTS else sum(symbolic) == 1:",
        ["test/test_torch.py", "-k", "slow_products or slow_symbolic"]),
    "symbolic-matmuls-all-counted": (  # q @ k^T (both operands symbolic) predicted slow: attention of a KV cache too
        "tracea/frontend/dynamic.py", "if sum(symbolic) >= 1 if target in _WEIGHT_PRODUCTS else sum(symbolic) == 1:",
        "if sum(symbolic) >= 1:", ["test/test_torch.py", "-k", "slow_products"]),
    "dynamo-example-kernel-compiled": (  # a symbolic Dynamo graph compiled for the shape it met first too
        "tracea/frontend/dynamo.py", "                             example_kernel=False)", "                             example_kernel=True)",
        ["test/test_torch.py", "-k", "dynamo_dynamic_shapes_compile_once or slow_symbolic"]),
    "dynamo-shape-compile-error-raised": (  # a symbolic graph's failed compile for a shape reaches the user
        "tracea/frontend/dynamo.py", "            except CompileError as e:\n", "            except ArithmeticError as e:\n",
        ["test/test_torch.py", "-k", "cannot_be_compiled_for"]),
    "row-groups-fused-in-the-whole-function": (  # each fusion then costs the whole function's size
        "tracea/targets/cpu/linalg.py",
        "        outlined.append(_outlined(module, op, ordered, len(outlined)))\n", "",
        ["test/test_torch.py", "-k", "each_row_group"]),
    "expanded-output-without-run-time-sizes": (  # a reshape undone onto the caller's buffer without its ? sizes
        "tracea/targets/cpu/target.py", "for collapsed, others in _expanded_sizes(view):",
        "for collapsed, others in []:", ["test/test_torch.py", "-k", "reshaped_from_run_time"]),
    "torch-libgomp-not-found": (  # torch's GNU OpenMP looked for in one of its wheels' two folders only
        "tracea/runtime/blas_threads.py", 'for folder in (root / "lib", root.parent / "torch.libs"):',
        'for folder in (root.parent / "torch.libs",):', ["test/test_blas_threads.py", "-k", "torchs_threads"]),
}


def run(name: str, timeout: float) -> tuple[bool, float]:
    path, original, mutated, tests = MUTATIONS[name]
    source = ROOT / path
    text = source.read_text()
    if text.count(original) != 1:
        raise SystemExit(f"{name}: the text to mutate occurs {text.count(original)} times in {path}; update the list")
    start = time.perf_counter()
    try:
        source.write_text(text.replace(original, mutated))
        done = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:logging", "-p", "no:cacheprovider",
                               *tests], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                              env={"TRACEA_DISK_CACHE": "0", **__import__("os").environ})
        caught = done.returncode != 0
    except subprocess.TimeoutExpired:
        caught = True  # hung: noticed
    finally:
        source.write_text(text)
    return caught, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", choices=list(MUTATIONS), help="mutations to try (default: all)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per mutation's tests (default 900)")
    args = parser.parse_args()
    missed = []
    for name in args.only or list(MUTATIONS):
        caught, seconds = run(name, args.timeout)
        print(f"{'caught' if caught else 'MISSED'}  {name}  ({MUTATIONS[name][0]}, {seconds:.0f} s)", flush=True)
        if not caught:
            missed.append(name)
    print(f"{len(missed)} of {len(args.only or MUTATIONS)} mutation(s) missed" + (f": {', '.join(missed)}" if missed else ""))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
