"""The `tracea` command."""
from __future__ import annotations

import argparse
import sys

from .. import __version__
from ..errors import TraceaError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tracea", description="Tracea, an MLIR-based kernel compiler.")
    parser.add_argument("--version", action="version", version=f"tracea {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser("demo", help="compile a transformer block (Tracea's API) and a GPT-2-style decoder "
                          "(PyTorch) for the CPU, check them, time them against numpy, eager and inductor",
                          description="Compiles and checks both programs, then prints a table of Tracea vs "
                                      "numpy / eager PyTorch / torch.compile (inductor), timed call by call in "
                                      "turn in this process (medians), with compile times.")
    demo.add_argument("--batch", type=int, default=2, help="the API program's batch (default 2)")
    demo.add_argument("--seq", type=int, default=128, help="the API program's sequence length (default 128)")
    demo.add_argument("--dim", type=int, default=128, help="the API program's model width (default 128)")
    demo.add_argument("--hidden", type=int, default=512, help="the API program's MLP width (default 512)")
    demo.add_argument("--vocab", type=int, default=256, help="the API program's output size (default 256)")
    demo.add_argument("--model-batch", type=int, default=1, help="the decoder's batch (default 1)")
    demo.add_argument("--model-seq", type=int, default=128, help="the decoder's sequence length (default 128)")
    demo.add_argument("--repeat", type=int, default=21, help="timed rounds at least (median reported; default 21)")
    demo.add_argument("--no-model", action="store_true", help="only the Tracea-API program")
    demo.add_argument("--no-inductor", action="store_true", help="leave torch.compile out (it takes ~15 s)")
    from ..doctor.capabilities import GPU_PROFILES, METAL_PROFILES, ROCM_PROFILES, VULKAN_PROFILES
    gpu = sub.add_parser("compile-gpu", help="compile a function of MLIR text (one gemm / fused_gemm / NHWC conv2d / "
                         "attention / softmax) into a GPU kernel artifact for a machine with that GPU: NVIDIA "
                         "PATH.cubin, AMD PATH.hsaco, Vulkan PATH.spv or Metal PATH.metal, each with PATH.json",
                         description="Writes the code and its launch description (OUTPUT.json) and prints the launch "
                                     "configuration and the resources the assembler reports. Example: "
                                     "tracea compile-gpu linear.mlir --chip sm_90a -o build/linear")
    gpu.add_argument("input", help="MLIR file with tracea ops in generic form")
    gpu.add_argument("--chip", default="sm_80", choices=[*GPU_PROFILES, *ROCM_PROFILES, *VULKAN_PROFILES, *METAL_PROFILES],
                     help="sm_80: Ampere and later (mma.sync, cp.async); sm_90a: Hopper (TMA, wgmma); gfx90a / gfx942 "
                          "/ gfx1100: AMD CDNA2 / CDNA3 / RDNA3; vulkan-*: SPIR-V for a Vulkan device; metal-apple: MSL")
    gpu.add_argument("--entry", help="the function to compile (default: the only public one)")
    gpu.add_argument("-o", "--output", required=True, help="artifact path without extension")
    doctor = sub.add_parser("doctor", help="profile this machine (CPU, NVIDIA GPUs, toolchains) and show which "
                            "kernel variant each op would run on each device, and why",
                            description="Prints the devices found, the tools each backend needs (with the fix for a "
                                        "missing one) and, per op and precision, the kernel variant the Doctor "
                                        "chooses, the others that fit, and the conditions on shapes it assumes. "
                                        "Example: tracea doctor --target sm_90a")
    doctor.add_argument("--target", action="append", metavar="DEVICE",
                        help="plan for a named profile instead of this machine's devices (repeatable): sm_80, "
                             "sm_90a, zen3-avx2, skylake-avx512, sapphire-rapids-avx512, x86-64-sse, graviton3-neon, "
                             "apple-m2-neon; or cpu")
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    tune = sub.add_parser("tune", help="tune the kernel ops of an .mlir file or a PyTorch model on this CPU (or a "
                          "Vulkan device) and store "
                          "the schedules in the tuning cache, which later compiles use",
                          description="A Gaussian-process search per kernel op (gemm, fused_gemm, conv2d, attention): "
                                      "each candidate schedule compiled, checked against the reference lowering and "
                                      "timed, one progress line per evaluation. Ops the cache already has are not "
                                      "tuned again (--retune does). Examples: tracea tune model.mlir --budget 30; "
                                      "tracea tune models.py:build (build() returns a torch.nn.Module and a tuple of "
                                      "example inputs)")
    tune.add_argument("input", help="an MLIR file, or FILE.py:FUNCTION returning (torch module, example inputs)")
    tune.add_argument("--budget", type=int, default=40, help="evaluations per op (default 40)")
    tune.add_argument("--seconds", type=float, help="a time limit per op")
    tune.add_argument("--device", default="cpu", help="where the kernels run and are timed: cpu (default) or a "
                                                       "Vulkan device of this machine, vulkan:N (.mlir input)")
    tune.add_argument("--threads", type=int, help="threads the kernels run on (default: $TRACEA_NUM_THREADS or the cores)")
    tune.add_argument("--workers", type=int, help="compile worker processes (default: the cores)")
    tune.add_argument("--retune", action="store_true", help="search again even where the cache has a schedule")
    tune.add_argument("--seed", type=int, default=0, help="the search's seed (default 0)")
    tune.add_argument("--quiet", action="store_true", help="no progress lines")
    cache = sub.add_parser("cache", help="list, show or clear the tuning cache ($TRACEA_TUNING_DIR/tuning_cache.json)",
                           description="list: one line per tuned op and machine; show KEY: an entry with every "
                                       "configuration measured (KEY: a prefix of the key list prints); clear: "
                                       "remove every entry")
    cache.add_argument("action", choices=["list", "show", "clear"])
    cache.add_argument("key", nargs="?", help="show: the entry's key, or a prefix of it")
    cache.add_argument("--json", action="store_true", help="list / show as JSON")
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        if args.command == "demo":
            from .demo import run
            ok = run(args.batch, args.seq, args.dim, args.hidden, args.vocab, args.repeat, model=not args.no_model,
                     inductor=not args.no_inductor, model_batch=args.model_batch, model_seq=args.model_seq)
            return 0 if ok else 1
        if args.command == "doctor":
            import json

            from ..doctor.engine import Context
            from ..doctor.report import format_report, report
            try:
                targets = None if not args.target else [Context(t).capabilities for t in args.target]
            except ValueError as e:
                print(f"tracea doctor: error: {e}", file=sys.stderr)
                return 2
            data = report(targets)
            print(json.dumps(data, indent=1) if args.json else format_report(data))
            return 0
        if args.command == "tune":
            from .tune import run_tune
            return run_tune(args)
        if args.command == "cache":
            from .tune import run_cache
            return run_cache(args)
        if args.command == "compile-gpu":
            from pathlib import Path

            from ..compiler import compile_gpu
            source = Path(args.input)
            if not source.is_file():
                print(f"tracea: error: no such file: {source}", file=sys.stderr)
                return 1
            try:  # the output's place first: a compile is not wasted on a path that cannot be written
                Path(args.output).parent.mkdir(parents=True, exist_ok=True)
                artifact = compile_gpu(source, chip=args.chip, entry=args.entry)
                artifact.save(args.output)
            except OSError as e:
                print(f"tracea: error: cannot write {args.output}.*: {e.strerror}: {e.filename}", file=sys.stderr)
                return 1
            print(f"{artifact.describe()}; wrote {args.output}{artifact.CODE_SUFFIX} and {args.output}.json")
    except TraceaError as e:
        print(f"tracea: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
