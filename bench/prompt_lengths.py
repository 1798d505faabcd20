"""A chat loop: Hugging Face generate() with prompts whose length changes call by call, through
torch.compile(backend="tracea") against eager PyTorch and inductor, one process.

    .venv/bin/python bench/prompt_lengths.py                 # GPT-2, 2 threads
    .venv/bin/python bench/prompt_lengths.py --model llama --threads 1 --markdown

After two prompt lengths Dynamo traces the prompt's graph with a symbolic length, and its GEMMs
have rows known at run time only. Tracea's kernel for such a graph would run them as generic loops
(10-100x slower than eager), so it runs a new length in PyTorch and compiles for it at its second
call (frontend/dynamic.py). Timed: each implementation on prompts of lengths not seen before
(every call a new one, the implementations in turn), then one recurring length interleaved
(tracea/tools/timing.py); each call generates a few tokens. Medians, and the first three lengths'
calls in all (Dynamo's traces and the compiles: what a chat's first turns cost; Tracea's and
inductor's disk caches start empty, in a temporary directory, unless --warm-caches); every implementation's tokens
are checked equal to eager's. Models are built from configs with random weights (bench/generate.py).
"""
from __future__ import annotations

import argparse
import atexit
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "test"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["gpt2", "llama"], default="gpt2")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--new", type=int, default=6, help="prompts of new lengths timed (default 6)")
    parser.add_argument("--tokens", type=int, default=4, help="new tokens per call (default 4)")
    parser.add_argument("--rounds", type=int, default=7, help="rounds of the recurring length (default 7)")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table at the end")
    parser.add_argument("--warm-caches", action="store_true",
                        help="use the disk caches Tracea and inductor already have (default: empty ones)")
    args = parser.parse_args()
    if not args.warm_caches:  # a first run's compiles, for both
        caches = tempfile.mkdtemp(prefix="prompt-lengths-")
        atexit.register(shutil.rmtree, caches, True)
        os.environ["TRACEA_CACHE_DIR"] = os.path.join(caches, "tracea")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(caches, "inductor")
    import tracea  # noqa: F401  first: see tracea/runtime/blas_threads.py
    import torch
    from model_zoo import import_torchvision  # noqa: F401 - lets transformers import (see model_zoo)
    from generate import models
    from tracea.tools.timing import interleaved_samples, paired_speedups
    torch.set_num_threads(args.threads)
    description, build = models()[args.model]
    torch.manual_seed(0)
    eager = build().eval()
    runs = {"eager": eager}
    for backend in ("tracea", "inductor"):
        compiled = build().eval()
        compiled.load_state_dict(eager.state_dict())
        compiled.forward = torch.compile(compiled.forward, backend=backend)
        runs[backend] = compiled

    def prompt(length):
        return torch.randint(1, 1000, (1, length), generator=torch.Generator().manual_seed(length))

    def generate(model, ids):
        return model.generate(ids, max_new_tokens=args.tokens, min_new_tokens=args.tokens, do_sample=False,
                              pad_token_id=0)

    new_ms, first_s = {k: [] for k in runs}, {k: 0.0 for k in runs}
    with torch.inference_mode():
        lengths = [480 - 7 * i for i in range(args.new + 3)]
        for i, length in enumerate(lengths):  # the first three: Dynamo's static, then symbolic, traces
            ids, want = prompt(length), None
            for name, model in runs.items():
                start = time.perf_counter()
                got = generate(model, ids)
                if i >= 3:
                    new_ms[name].append((time.perf_counter() - start) * 1e3)
                else:
                    first_s[name] += time.perf_counter() - start
                want = got if want is None else want
                if not torch.equal(got, want):
                    print(f"{name}: tokens differ from eager's at prompt length {length}", file=sys.stderr)
                    return 1
        ids = prompt(400)
        samples = interleaved_samples({k: (lambda m=m: generate(m, ids)) for k, m in runs.items()}, args.rounds)
    recurring = {k: statistics.median(v) * 1e3 for k, v in samples.items()}
    ratio = paired_speedups(samples, "tracea")
    new = {k: statistics.median(v) for k, v in new_ms.items()}
    print(f"{description}, {args.threads}T, {args.tokens} tokens a call: a new prompt length: eager {new['eager']:.0f} "
          f"ms, inductor {new['inductor']:.0f}, tracea {new['tracea']:.0f}; a recurring one (400): eager "
          f"{recurring['eager']:.0f} ms, inductor {recurring['inductor']:.0f}, tracea {recurring['tracea']:.0f} "
          f"({ratio['eager']:.2f}x eager, {ratio['inductor']:.2f}x inductor); the first three lengths: eager "
          f"{first_s['eager']:.1f} s, inductor {first_s['inductor']:.1f}, tracea {first_s['tracea']:.1f}", file=sys.stderr)
    if args.markdown:
        print("| model | threads | a new prompt length: eager ms | inductor | Tracea | a recurring one: eager ms "
              "| inductor | Tracea | vs eager | vs inductor | the first three lengths: eager s | inductor | Tracea |\n"
              + "|" + " --- |" * 13)
        print(f"| {description} | {args.threads} | {new['eager']:.0f} | {new['inductor']:.0f} | {new['tracea']:.0f} | "
              f"{recurring['eager']:.0f} | {recurring['inductor']:.0f} | {recurring['tracea']:.0f} | "
              f"**{ratio['eager']:.2f}x** | **{ratio['inductor']:.2f}x** | {first_s['eager']:.1f} | "
              f"{first_s['inductor']:.1f} | {first_s['tracea']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
