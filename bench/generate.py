"""Text generation with torch.compile(backend="tracea") against eager PyTorch and inductor, one run.

    .venv/bin/python bench/generate.py                      # GPT-2 and Llama, 1 and 2 threads
    .venv/bin/python bench/generate.py --only gpt2 --threads 2 --markdown

What a user of Hugging Face transformers does: `model.forward = torch.compile(model.forward,
backend=...)`, then `model.generate(...)` (greedy, the KV cache on). The first call traces and
compiles the prompt's graph and the decoding step's graphs: Dynamo makes the cache's length
symbolic after it has grown twice, so the steps after run one kernel of symbolic sizes. Models are
built from configs with random weights (nothing is downloaded): a GPT-2 of 4 layers d768 with
its 50,257-token vocabulary, and a Llama of 4 layers d512 (grouped queries 8/2, RoPE, SwiGLU,
32,000 tokens). Each thread count runs in its own process, caches off (Tracea's disk cache,
inductor's FX graph cache): the first call is a cold compile. Then whole generate() calls of the
three are timed in turn, no pauses (tracea/tools/timing.py), and reported per new token: medians,
and Tracea's speed over each peer as the median of the per-round ratios. Every implementation's
tokens are checked equal to eager's.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "test"))


def models() -> dict:
    """name -> (description, build() -> model)."""
    import transformers as T
    return {
        "gpt2": ("HF GPT-2 (4 layers, d768, vocab 50257)", lambda: T.GPT2LMHeadModel(T.GPT2Config(
            n_layer=4, n_embd=768, n_head=12, n_positions=1024, bos_token_id=0, eos_token_id=0))),
        "llama": ("HF Llama (4 layers, d512, GQA 8/2, vocab 32000)", lambda: T.LlamaForCausalLM(T.LlamaConfig(
            hidden_size=512, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
            intermediate_size=1408, vocab_size=32000, max_position_embeddings=1024, bos_token_id=0,
            eos_token_id=0))),
    }


def worker(threads: int, names: list[str], prompt: int, tokens: int, rounds: int) -> list[dict]:
    import tracea  # first: see tracea/runtime/blas_threads.py
    import torch
    from model_zoo import import_torchvision  # noqa: F401 - lets transformers import (see model_zoo)
    from tracea.tools.timing import interleaved_samples, paired_speedups
    torch.set_num_threads(threads)
    rows = []
    for name in names:
        description, build = models()[name]
        torch.manual_seed(0)
        model = build().eval()
        ids = torch.randint(1, model.config.vocab_size, (1, prompt), generator=torch.Generator().manual_seed(1))

        def generate(m):
            return m.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, pad_token_id=0)
        runs = {"eager": model}
        row = {"model": description, "threads": threads, "prompt": prompt, "tokens": tokens, "first_s": {}, "equal": {}}
        with torch.inference_mode():
            expected = generate(model)
            for backend in ("tracea", "inductor"):
                torch.manual_seed(0)
                compiled = build().eval()
                compiled.load_state_dict(model.state_dict())
                compiled.forward = torch.compile(compiled.forward, backend=backend)
                start = time.perf_counter()
                got = generate(compiled)
                row["first_s"][backend] = time.perf_counter() - start
                row["equal"][backend] = bool(torch.equal(got, expected))
                runs[backend] = compiled
            samples = interleaved_samples({k: (lambda m=m: generate(m)) for k, m in runs.items()}, rounds)
        row["ms_per_token"] = {k: sorted(v)[len(v) // 2] / tokens * 1e3 for k, v in samples.items()}
        row["speedup"] = paired_speedups(samples, "tracea")
        rows.append(row)
        print(_line(row), file=sys.stderr, flush=True)
        torch._dynamo.reset()
    return rows


def _line(row: dict) -> str:
    ms = row["ms_per_token"]
    return (f"{row['model']}, {row['threads']}T: eager {ms['eager']:.1f} ms/token, inductor {ms['inductor']:.1f}, "
            f"tracea {ms['tracea']:.1f} -> {row['speedup']['eager']:.2f}x eager, {row['speedup']['inductor']:.2f}x "
            f"inductor; first call tracea {row['first_s']['tracea']:.1f} s, inductor {row['first_s']['inductor']:.1f} s;"
            f" tokens equal to eager's: {row['equal']}")


def markdown(rows: list[dict]) -> str:
    lines = ["| model | threads | eager ms/token | inductor | Tracea | vs eager | vs inductor | first call Tracea "
             "| first call inductor | tokens as eager's |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        ms, first = r["ms_per_token"], r["first_s"]
        lines.append(f"| {r['model']} | {r['threads']} | {ms['eager']:.1f} | {ms['inductor']:.1f} | {ms['tracea']:.1f} | "
                     f"**{r['speedup']['eager']:.2f}x** | **{r['speedup']['inductor']:.2f}x** | {first['tracea']:.1f} s | "
                     f"{first['inductor']:.1f} s | {'yes' if all(r['equal'].values()) else r['equal']} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="comma-separated models (default: all): gpt2, llama")
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    parser.add_argument("--prompt", type=int, default=32, help="prompt length in tokens (default 32)")
    parser.add_argument("--tokens", type=int, default=32, help="new tokens per generate() call (default 32)")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds at least (median reported)")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table at the end")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    names = args.only.split(",") if args.only else ["gpt2", "llama"]
    if args.worker:
        print(json.dumps(worker(args.worker, names, args.prompt, args.tokens, args.rounds)))
        return 0
    from torch_models import per_thread_workers
    with tempfile.TemporaryDirectory() as inductor_cache:  # inductor compiles cold too
        rows = per_thread_workers(__file__, args.threads, ["--only", ",".join(names), "--prompt", str(args.prompt),
                                                           "--tokens", str(args.tokens), "--rounds", str(args.rounds)],
                                  {"TORCHINDUCTOR_CACHE_DIR": inductor_cache, "TORCHINDUCTOR_FX_GRAPH_CACHE": "0"})
    if rows is None:
        return 1
    if args.markdown:
        print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
