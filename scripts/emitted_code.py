"""Hashes of the code Tracea emits, to show a refactoring changed nothing: every default CPU
kernel of a set of ops for several CPU profiles (the IR after lowering and the LLVM dialect),
every GPU check of bench/gpu.py and every kernel and schedule variant `bench/gpu.py build`
writes (PTX and launch description), compared with test/emitted_code.json.

    .venv/bin/python scripts/emitted_code.py check           # all of them (several minutes)
    .venv/bin/python scripts/emitted_code.py check --sample  # the CPU kernels and GPU checks (the test's)
    .venv/bin/python scripts/emitted_code.py record          # after an intended change: new hashes

`check` lists every case whose code changed, is new or is gone, and exits 1 if there is one.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "test" / "emitted_code.json"
CPU_PROFILES = ("zen3-avx2", "skylake-avx512", "graviton3-neon")


def _digest(*texts: str) -> str:
    return hashlib.sha256("\0".join(texts).encode()).hexdigest()


def _cpu_functions(td):
    """(name, function) of each op's default kernels, at shapes that reach their edge cases."""
    t = td.tensor
    yield "gemm_256", td.function(t((256, 256)), t((256, 256)), name="k")(td.gemm)
    yield "fused_gemm_129x67x301", td.function(t((129, 301)), t((301, 67)), t(67), name="k")(
        lambda a, b, c: td.fused_gemm(a, b, [td.bias_add(c), td.gelu()]))
    yield "linear_bf16_9x11x50", td.function(t((9, 50), "bf16"), t((11, 50), "bf16"), name="k")(
        lambda a, b: td.gemm(a, b, transpose_b=True))
    yield "bmm_shared_b", td.function(t((3, 20, 16)), t((16, 24)), name="k")(td.gemm)
    yield "softmax_f16", td.function(t((7, 100), "f16"), name="k")(td.softmax)
    yield "softmax_axis0", td.function(t((32, 48)), name="k")(lambda a: td.softmax(a, axis=0))
    yield "attention_causal", td.function(t((2, 37, 64)), t((2, 45, 64)), t((2, 45, 32)), name="k")(
        lambda q, k, v: td.attention(q, k, v, causal=True))
    yield "conv_nchw", td.function(t((1, 3, 32, 32)), t((16, 3, 3, 3)), t(16), name="k")(
        lambda x, w, b: td.conv2d(x, w, b, stride=2, padding=1))
    yield "conv_nhwc", td.function(t((1, 16, 16, 8)), t((3, 3, 8, 16)), name="k")(
        lambda x, w: td.conv2d(x, w, padding=1, layout="nhwc"))


def cpu_hashes() -> dict[str, str]:
    import tracea
    from tracea import dialects as td
    out = {}
    for profile in CPU_PROFILES:
        os.environ["TRACEA_CPU"] = profile
        for name, fn in _cpu_functions(td):
            stages = tracea.compile(fn, threads=2, keep_stages=True).stages
            out[f"cpu/{profile}/{name}"] = _digest(stages["linalg"], stages["llvm"])
    os.environ.pop("TRACEA_CPU")
    return out


def _gpu_digest(artifact) -> str:
    launch = json.dumps([artifact.grid, artifact.block, artifact.dynamic_shared_bytes, repr(artifact.params)])
    return _digest(artifact.ptx, launch)


def gpu_hashes(everything: bool) -> dict[str, str]:
    sys.path.insert(0, str(ROOT / "bench"))
    import gpu as bench
    import tracea
    from tracea import dialects as td
    out = {}
    for name, chip, inputs, kind, params in bench.CHECKS:
        out[f"gpu/check/{name}"] = _gpu_digest(tracea.compile_gpu(bench.check_function(td, inputs, kind, params),
                                                                  chip=chip))
    if everything:  # what `bench/gpu.py build` writes, hashed instead of saved
        from tracea.runtime.gpu_artifact import GpuKernelArtifact

        def record(artifact, path):
            out[f"gpu/bench/{os.path.basename(str(path))}"] = _gpu_digest(artifact)
        saved, GpuKernelArtifact.save = GpuKernelArtifact.save, record
        try:
            with tempfile.TemporaryDirectory() as directory, contextlib.redirect_stdout(sys.stderr):
                bench.build(directory, ["sm_80", "sm_90a"])  # its progress lines on stderr
        finally:
            GpuKernelArtifact.save = saved
        for name in [k for k in out if k.startswith("gpu/bench/") and k[len("gpu/bench/"):] in
                     {c[0] for c in bench.CHECKS}]:
            del out[name]  # build saves the checks too: hashed above
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["check", "record"])
    parser.add_argument("--sample", action="store_true", help="only the CPU kernels and the GPU checks (fast)")
    args = parser.parse_args()
    os.environ.setdefault("TRACEA_DISK_CACHE", "0")
    found = {**cpu_hashes(), **gpu_hashes(not args.sample)}
    known = json.loads(MANIFEST.read_text()) if MANIFEST.exists() else {}
    if args.action == "record":
        if args.sample:
            found = {**{k: v for k, v in known.items() if k.startswith("gpu/bench/")}, **found}
        MANIFEST.write_text(json.dumps(dict(sorted(found.items())), indent=1) + "\n")
        print(f"recorded {len(found)} hashes in {MANIFEST.relative_to(ROOT)}")
        return 0
    compared = {k: v for k, v in known.items() if not (args.sample and k.startswith("gpu/bench/"))}
    changed = sorted(k for k in compared if k in found and found[k] != compared[k])
    new, gone = sorted(set(found) - set(compared)), sorted(set(compared) - set(found))
    for label, names in (("changed", changed), ("new", new), ("gone", gone)):
        for name in names:
            print(f"{label}: {name}")
    print(f"{len(found)} kernels hashed: {len(changed)} changed, {len(new)} new, {len(gone)} gone")
    return 1 if changed or new or gone else 0


if __name__ == "__main__":
    sys.exit(main())
