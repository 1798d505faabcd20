"""Real PyTorch models through Tracea against eager PyTorch and torch.compile (inductor), one run.

    .venv/bin/python bench/torch_models.py                       # the zoo, batch 1 and 8, 1 and 2 threads
    .venv/bin/python bench/torch_models.py --only bert,resnet50 --batch 1 --threads 2 --markdown
    .venv/bin/python bench/torch_models.py --blocks              # each implementation alone (flattering)
    .venv/bin/python bench/torch_models.py --only resnet50 --image-size 224   # ImageNet-sized images

The models are Hugging Face transformers and torchvision models built from configs with random
weights (nothing is downloaded), at sizes a CPU serves: BERT-mini-like (4 layers, d256), a GPT-2
of 4 layers d256, ViT-tiny-like (4 layers, d192, 224x224 images), a Llama of 4 layers d256 (grouped
queries, RoPE, SwiGLU), ResNet-50 and ConvNeXt-tiny on 128x128 images, ResNet-50 again and
MobileNetV3-small on 224x224. Each (thread count) runs in its own process with torch's threads
set to it before anything runs; Tracea is imported first. Per model and batch: tracea.compile(model, inputs) and
torch.compile(model) are checked against eager, then timed call by call in turn, no pauses
(tracea/tools/timing.py; --blocks: in blocks after a pause, bench/cpu.py's median_times), medians.
Ratios are eager (or inductor) time / Tracea time: > 1, Tracea is faster; interleaved, the median
of that ratio within each round (paired_speedups: a slow spell of the VM cancels). Compile times are first
compiles in the process (Tracea's disk cache off: real compiles).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "test"))


def _tokens(batch: int, seq: int = 128, vocab: int = 8000):
    import torch
    return (torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(1)),)


def _images(batch: int, size: int):
    import torch
    return (torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(1)),)


def zoo(image_size: int | None = None) -> dict:
    """name -> (description, build(batch) -> (model, inputs)); `image_size` replaces the
    torchvision models' own (128 for ResNet-50 and ConvNeXt-tiny, 224 for resnet50_224 and
    MobileNetV3-small)."""
    import transformers as T
    from model_zoo import import_torchvision

    def hf(model_cls, config, inputs):
        def build(batch):
            return model_cls(config).eval(), inputs(batch)
        return build

    def tv(name, label, size, **kwargs):
        size = image_size or size

        def build(batch):
            return getattr(import_torchvision().models, name)(**kwargs).eval(), _images(batch, size)
        return f"torchvision {label}, {size}x{size}", build

    small = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
                 vocab_size=8000)
    return {
        "bert": ("HF BERT (4 layers, d256), seq 128",
                 hf(T.BertModel, T.BertConfig(**small, max_position_embeddings=512), _tokens)),
        "gpt2": ("HF GPT-2 (4 layers, d256), seq 128",
                 hf(T.GPT2LMHeadModel, T.GPT2Config(n_embd=256, n_layer=4, n_head=4, vocab_size=8000,
                                                    n_positions=512, use_cache=False, bos_token_id=0,
                                                    eos_token_id=0), _tokens)),
        "vit": ("HF ViT (4 layers, d192), 224x224",
                hf(T.ViTModel, T.ViTConfig(hidden_size=192, num_hidden_layers=4, num_attention_heads=3,
                                           intermediate_size=768), lambda b: _images(b, 224))),
        "llama": ("HF Llama (4 layers, d256, GQA 4/2), seq 128",
                  hf(T.LlamaForCausalLM, T.LlamaConfig(**small, num_key_value_heads=2, max_position_embeddings=512,
                                                       use_cache=False), _tokens)),
        "resnet50": tv("resnet50", "ResNet-50", 128),
        "resnet50_224": tv("resnet50", "ResNet-50", 224),  # ImageNet's size: where inductor is closest
        "mobilenet_v3": tv("mobilenet_v3_small", "MobileNetV3-small", 224),
        "convnext": tv("convnext_tiny", "ConvNeXt-tiny", 128),
    }


def _outputs(value):
    """The tensors of a model's output (a tensor, a tuple, a transformers ModelOutput)."""
    import torch
    if isinstance(value, torch.Tensor):
        return [value]
    if hasattr(value, "to_tuple"):
        value = value.to_tuple()
    return [t for v in value for t in _outputs(v)] if isinstance(value, (tuple, list)) else []


def _error(got, expected) -> float:
    return max(float((g - e).abs().max() / max(1.0, float(e.abs().max())))
               for g, e in zip(_outputs(got), _outputs(expected)))


def worker(threads: int, names: list[str], batches: list[int], rounds: int, blocks: bool,
           image_size: int | None = None) -> list[dict]:
    import tracea  # first: see tracea/runtime/blas_threads.py
    import torch
    from tracea.tools.timing import interleaved_samples, paired_speedups
    torch.set_num_threads(threads)
    models = zoo(image_size)
    rows = []
    for name in names:
        description, build = models[name]
        for batch in batches:
            torch.manual_seed(0)
            model, inputs = build(batch)
            row = {"model": description, "batch": batch, "threads": threads}
            start = time.perf_counter()
            try:
                ours = tracea.compile(model, inputs, threads=threads)
            except Exception as e:  # report it, go on with the others
                print(f"{name} batch {batch}: tracea failed: {type(e).__name__}: {str(e)[:300]}", file=sys.stderr)
                continue
            row["compile_tracea"] = time.perf_counter() - start
            with torch.inference_mode():
                expected = model(*inputs)
                inductor = torch.compile(model)
                start = time.perf_counter()
                inductor(*inputs)
                row["compile_inductor"] = time.perf_counter() - start
                row["error_tracea"] = _error(ours(*inputs), expected)
                row["error_inductor"] = _error(inductor(*inputs), expected)
                calls = {"eager": lambda: model(*inputs), "inductor": lambda: inductor(*inputs),
                         "tracea": lambda: ours(*inputs)}
                if blocks:
                    from cpu import median_times
                    times = median_times(calls, rounds)
                else:
                    samples = interleaved_samples(calls, rounds)
                    times = {k: sorted(v)[len(v) // 2] for k, v in samples.items()}
                    row["speedup"] = paired_speedups(samples, "tracea")  # per round: a slow spell cancels
            row["ms"] = {k: v * 1e3 for k, v in times.items()}
            row["placement"] = ours.explain().splitlines()[0]
            rows.append(row)
            print(_line(row), file=sys.stderr, flush=True)
            torch._dynamo.reset()
    return rows


def _speedup(row: dict, peer: str) -> float:
    """Tracea's speed over `peer`'s: the per-round ratio's median where interleaved, else the medians'."""
    return row["speedup"][peer] if "speedup" in row else row["ms"][peer] / row["ms"]["tracea"]


def _line(row: dict) -> str:
    ms = row["ms"]
    return (f"{row['model']}, batch {row['batch']}, {row['threads']}T: eager {ms['eager']:.2f} ms, inductor "
            f"{ms['inductor']:.2f}, tracea {ms['tracea']:.2f} -> {_speedup(row, 'eager'):.2f}x eager, "
            f"{_speedup(row, 'inductor'):.2f}x inductor; compile tracea {row['compile_tracea']:.1f} s, inductor "
            f"{row['compile_inductor']:.1f} s; error {row['error_tracea']:.1e} ({row['placement']})")


def markdown(rows: list[dict]) -> str:
    lines = ["| model | batch | threads | eager ms | inductor ms | Tracea ms | vs eager | vs inductor "
             "| compile Tracea | compile inductor | rel. error |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        ms = r["ms"]
        lines.append(f"| {r['model']} | {r['batch']} | {r['threads']} | {ms['eager']:.2f} | {ms['inductor']:.2f} | "
                     f"{ms['tracea']:.2f} | **{_speedup(r, 'eager'):.2f}x** | "
                     f"**{_speedup(r, 'inductor'):.2f}x** | {r['compile_tracea']:.1f} s | "
                     f"{r['compile_inductor']:.1f} s | {r['error_tracea']:.0e} |")
    return "\n".join(lines)


def per_thread_workers(script: str, threads: str, args: list[str], env: dict | None = None) -> list[dict] | None:
    """Run `script --worker T args` once per thread count T of "1,2" (each in its own process,
    every library's thread pool set to T, Tracea's disk cache off) and join the rows their JSON
    gives; None when a worker fails."""
    rows = []
    for count in [int(t) for t in threads.split(",")]:
        variables = {**os.environ, "OMP_NUM_THREADS": str(count), "OPENBLAS_NUM_THREADS": str(count),
                     "TRACEA_NUM_THREADS": str(count), "TRACEA_DISK_CACHE": "0", **(env or {})}
        done = subprocess.run([sys.executable, os.path.abspath(script), "--worker", str(count), *args],
                              env=variables, stdout=subprocess.PIPE, text=True)
        if done.returncode:
            return None
        rows += json.loads(done.stdout)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="comma-separated models (default: all): bert, gpt2, vit, llama, resnet50, "
                                       "resnet50_224, mobilenet_v3, convnext")
    parser.add_argument("--batch", default="1,8", help="comma-separated batch sizes (default 1,8)")
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    parser.add_argument("--rounds", type=int, default=11, help="timed rounds at least (median reported)")
    parser.add_argument("--image-size", type=int, help="the torchvision models' image size (default: 128 for "
                                                       "ResNet-50 and ConvNeXt-tiny, 224 for MobileNetV3-small)")
    parser.add_argument("--blocks", action="store_true", help="time each implementation alone in blocks after "
                                                                "a pause (the flattering mode)")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table at the end")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    names = args.only.split(",") if args.only else list(zoo())
    batches = [int(b) for b in args.batch.split(",")]
    if args.worker:
        print(json.dumps(worker(args.worker, names, batches, args.rounds, args.blocks, args.image_size)))
        return 0
    rows = per_thread_workers(__file__, args.threads, ["--only", ",".join(names), "--batch", args.batch, "--rounds",
                                                       str(args.rounds)] + (["--blocks"] if args.blocks else [])
                              + (["--image-size", str(args.image_size)] if args.image_size else []))
    if rows is None:
        return 1
    if args.markdown:
        print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
