"""Text generation with torch.compile(backend="tracea") against eager PyTorch and inductor, one run.

    .venv/bin/python bench/generate.py                      # GPT-2 and Llama, 1 and 2 threads, prompts of 32 and 512
    .venv/bin/python bench/generate.py --only gpt2 --threads 2 --markdown
    .venv/bin/python bench/generate.py --cache static       # HF's static cache: one length, a mask
    .venv/bin/python bench/generate.py --batch 4            # 4 prompts, left-padded to one length

What a user of Hugging Face transformers does: `model.forward = torch.compile(model.forward,
backend=...)`, then `model.generate(...)` (greedy, the KV cache on). The first call traces and
compiles the prompt's graph and the decoding step's graphs: Dynamo makes the cache's length
symbolic after it has grown twice, so the steps after run one kernel of symbolic sizes. With
`--cache static` (`generate(cache_implementation="static")`) the cache has one length, its
unfilled positions masked, and every step runs the same static kernel. With `--batch N`, N prompts
of which all but the first are left-padded (by up to half the prompt, as a tokenizer pads prompts
of different lengths for a decoder), their attention mask given: every step's attention is masked. A long prompt is where the
decoding steps' attention over the cache weighs; a short one (32) mostly times the GEMMs. Models are
built from configs with random weights (nothing is downloaded): a GPT-2 of 4 layers d768 with
its 50,257-token vocabulary, and a Llama of 4 layers d512 (grouped queries 8/2, RoPE, SwiGLU,
32,000 tokens). Each thread count runs in its own process, caches off (Tracea's disk cache,
inductor's FX graph cache): the first call is a cold compile. Then whole generate() calls of the
three are timed in turn, no pauses (tracea/tools/timing.py), each beside a generate() of one
token in the same rounds: reported per new token (the whole call over its tokens), for the prompt
(the one-token call) and for each later token (their difference over the tokens after the first):
medians, and Tracea's speed over each peer as the median of the per-round ratios. Every implementation's
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


def worker(threads: int, names: list[str], prompts: list[int], tokens: int, rounds: int, cache: str,
           batch: int = 1) -> list[dict]:
    import tracea  # first: see tracea/runtime/blas_threads.py
    import torch
    from model_zoo import import_torchvision  # noqa: F401 - lets transformers import (see model_zoo)
    from tracea.tools.timing import interleaved_samples, paired_speedups
    torch.set_num_threads(threads)
    rows = []
    options = {"cache_implementation": "static"} if cache == "static" else {}
    for name, prompt in [(n, p) for n in names for p in prompts]:
        description, build = models()[name]
        torch.manual_seed(0)
        model = build().eval()
        ids = torch.randint(1, model.config.vocab_size, (batch, prompt), generator=torch.Generator().manual_seed(1))
        mask = torch.ones_like(ids)
        for i in range(1, batch):  # left padding (pad token 0), by up to half the prompt
            mask[i, :i * prompt // (2 * batch)] = 0
        ids = ids * mask

        def generate(m, count=tokens):
            return m.generate(ids, attention_mask=mask, max_new_tokens=count, min_new_tokens=count, do_sample=False,
                              pad_token_id=0, **options)
        runs = {"eager": model}
        row = {"model": description, "threads": threads, "prompt": prompt, "batch": batch, "cache": cache,
               "tokens": tokens, "first_s": {}, "equal": {}}
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
            # a whole generate() and one of a single token, in the same rounds: their difference is
            # the decoding steps', the single token's time the prompt's
            samples = interleaved_samples({f"{k} {part}": (lambda m=m, n=n: generate(m, n)) for k, m in runs.items()
                                           for part, n in (("whole", tokens), ("prompt", 1))}, rounds)
        whole = {k: samples[f"{k} whole"] for k in runs}
        prompt_only = {k: samples[f"{k} prompt"] for k in runs}
        steps = {k: [(w - p) / (tokens - 1) for w, p in zip(whole[k], prompt_only[k])] for k in runs}
        row["ms_per_token"] = {k: _median(v) / tokens * 1e3 for k, v in whole.items()}
        row["prompt_ms"] = {k: _median(v) * 1e3 for k, v in prompt_only.items()}
        row["step_ms"] = {k: _median(v) * 1e3 for k, v in steps.items()}
        row["speedup"] = paired_speedups(whole, "tracea")
        row["prompt_speedup"] = paired_speedups(prompt_only, "tracea")
        row["step_speedup"] = paired_speedups(steps, "tracea")
        rows.append(row)
        print(_line(row), file=sys.stderr, flush=True)
        torch._dynamo.reset()
    return rows


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def _line(row: dict) -> str:
    parts = []
    for title, ms, ratio in (("whole", "ms_per_token", "speedup"), ("prompt", "prompt_ms", "prompt_speedup"),
                             ("each later token", "step_ms", "step_speedup")):
        t, x = row[ms], row[ratio]
        parts.append(f"{title}: eager {t['eager']:.1f} ms, inductor {t['inductor']:.1f}, tracea {t['tracea']:.1f} "
                     f"({x['eager']:.2f}x eager, {x['inductor']:.2f}x inductor)")
    return (f"{row['model']}, prompt {row['prompt']} x {row.get('batch', 1)}, {row['cache']} cache, {row['threads']}T: " + "; ".join(parts)
            + f"; first call tracea {row['first_s']['tracea']:.1f} s, inductor {row['first_s']['inductor']:.1f} s;"
            f" tokens equal to eager's: {row['equal']}")


def markdown(rows: list[dict]) -> str:
    lines = ["| model | prompt | batch | cache | threads | ms/token: eager | inductor | Tracea | vs eager | vs inductor "
             "| the prompt: Tracea ms | vs eager | vs inductor | each later token: Tracea ms | vs eager | vs inductor "
             "| first call Tracea | first call inductor | tokens as eager's |",
             "|" + " --- |" * 19]
    for r in rows:
        ms, first, p, st = r["ms_per_token"], r["first_s"], r["prompt_speedup"], r["step_speedup"]
        lines.append(f"| {r['model']} | {r['prompt']} | {r.get('batch', 1)} | {r['cache']} | {r['threads']} | {ms['eager']:.1f} | "
                     f"{ms['inductor']:.1f} | {ms['tracea']:.1f} | **{r['speedup']['eager']:.2f}x** | "
                     f"**{r['speedup']['inductor']:.2f}x** | {r['prompt_ms']['tracea']:.1f} | {p['eager']:.2f}x | "
                     f"{p['inductor']:.2f}x | {r['step_ms']['tracea']:.2f} | **{st['eager']:.2f}x** | "
                     f"**{st['inductor']:.2f}x** | {first['tracea']:.1f} s | {first['inductor']:.1f} s | "
                     f"{'yes' if all(r['equal'].values()) else r['equal']} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="comma-separated models (default: all): gpt2, llama")
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    parser.add_argument("--prompt", default="32,512", help="comma-separated prompt lengths in tokens (default 32,512)")
    parser.add_argument("--cache", choices=["dynamic", "static"], default="dynamic",
                        help="the KV cache: HF's default, growing (dynamic), or of one length (static)")
    parser.add_argument("--batch", type=int, default=1,
                        help="prompts per call, all but the first left-padded, with their attention mask (default 1)")
    parser.add_argument("--tokens", type=int, default=32, help="new tokens per generate() call (default 32)")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds at least (median reported)")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table at the end")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    names = args.only.split(",") if args.only else ["gpt2", "llama"]
    if args.worker:
        print(json.dumps(worker(args.worker, names, [int(p) for p in args.prompt.split(",")], args.tokens,
                                args.rounds, args.cache, args.batch)))
        return 0
    from torch_models import per_thread_workers
    with tempfile.TemporaryDirectory() as inductor_cache:  # inductor compiles cold too
        rows = per_thread_workers(__file__, args.threads, ["--only", ",".join(names), "--prompt", args.prompt, "--cache",
                                                           args.cache, "--batch", str(args.batch),
                                                           "--tokens", str(args.tokens),
                                                           "--rounds", str(args.rounds)],
                                  {"TORCHINDUCTOR_CACHE_DIR": inductor_cache, "TORCHINDUCTOR_FX_GRAPH_CACHE": "0"})
    if rows is None:
        return 1
    if args.markdown:
        print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
