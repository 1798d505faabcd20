"""Whole-model compile time: tracea.compile of full-size models, cold and from the disk cache,
beside torch.compile (inductor) of the same model in the same run.

    .venv/bin/python bench/compile_time.py                 # ViT-base, BERT-base, GPT-2, ResNet-50
    .venv/bin/python bench/compile_time.py --only vit-base --markdown

Every measurement runs in a new Python process, as a user's script would: "cold" with an empty
kernel cache (TRACEA_CACHE_DIR in a fresh directory), "cached" in another new process with the
cache the cold one left. Inductor runs in a new process with a fresh inductor cache. The time is
that to the first result (`compile(model, ...)` and its first call; inductor compiles in that
call) less one later call's: the compile alone, with packages imported beforehand. Tracea's
split (torch.export and the linalg import, then the kernel compile) is its own report. Each
compiled model is checked against eager PyTorch.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def build(name):
    """(model in eval mode, example inputs) of a full-size model with random weights."""
    import torch
    sys.path.insert(0, os.path.join(HERE, "..", "test"))
    from model_zoo import import_torchvision
    torchvision = import_torchvision()
    import transformers as T
    torch.manual_seed(0)
    tokens = (torch.randint(0, 30000, (1, 128)),)
    image = (torch.randn(1, 3, 224, 224),)
    if name == "vit-base":
        return T.ViTModel(T.ViTConfig()).eval(), image
    if name == "bert-base":
        return T.BertModel(T.BertConfig()).eval(), tokens
    if name == "gpt2":
        return T.GPT2Model(T.GPT2Config()).eval(), tokens
    if name == "resnet50":
        return torchvision.models.resnet50().eval(), image
    raise SystemExit(f"unknown model {name!r}; known: {', '.join(MODELS)}")


MODELS = {"vit-base": "HF ViT-base (12 layers, d768), 1x3x224x224", "bert-base": "HF BERT-base (12 layers, d768), 1x128",
          "gpt2": "HF GPT-2 small (12 layers, d768), 1x128", "resnet50": "torchvision ResNet-50, 1x3x224x224"}


def measure(name: str, how: str) -> dict:
    """In this (new) process: compile `name` with Tracea or inductor, first call, check."""
    import time

    import torch
    import torch._inductor.compile_fx  # noqa: F401  (imports are not compile time)

    import tracea
    model, inputs = build(name)
    with torch.no_grad():
        expected = model(*inputs)
    start = time.perf_counter()
    compiled = torch.compile(model) if how == "inductor" else tracea.compile(model, inputs)
    with torch.no_grad():
        got = compiled(*inputs)
        first = time.perf_counter() - start
        start = time.perf_counter()
        compiled(*inputs)
        result = {"seconds": first - (time.perf_counter() - start)}
    if how == "tracea":
        result.update({"import": compiled.import_seconds, "kernel": compiled.compile_seconds})
    main = lambda out: out[0] if isinstance(out, (tuple, list)) else getattr(out, "last_hidden_state", out)  # noqa: E731
    result["error"] = float((main(got) - main(expected)).abs().max())
    return result


def run(name: str, how: str, env: dict) -> dict:
    out = subprocess.run([sys.executable, __file__, "--measure", name, how], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{name} ({how}) failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=list(MODELS), action="append", help="models to time (default: all)")
    parser.add_argument("--no-inductor", action="store_true", help="skip torch.compile (inductor)")
    parser.add_argument("--markdown", action="store_true", help="print a markdown table")
    parser.add_argument("--measure", nargs=2, help=argparse.SUPPRESS)  # (internal) one measurement
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(*args.measure)))
        return 0
    rows = []
    for name in args.only or list(MODELS):
        with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as inductor_cache:
            env = dict(os.environ, TRACEA_CACHE_DIR=cache, TRACEA_DISK_CACHE="1", TORCHINDUCTOR_CACHE_DIR=inductor_cache)
            cold = run(name, "tracea", env)
            cached = run(name, "tracea", env)
            inductor = None if args.no_inductor else run(name, "inductor", env)
        rows.append((name, cold, cached, inductor))
        line = (f"{MODELS[name]}: tracea cold {cold['seconds']:.1f} s (trace + import {cold['import']:.1f} s, kernel "
                f"{cold['kernel']:.1f} s), cached {cached['seconds']:.2f} s; "
                + (f"inductor {inductor['seconds']:.1f} s; " if inductor else "")
                + f"max error vs eager {cold['error']:.1e}")
        print(line, flush=True)
    if args.markdown:
        print("\n| model | Tracea cold | of which trace + import / kernel | Tracea cached (new process) | inductor cold | max abs error |")
        print("| --- | --- | --- | --- | --- | --- |")
        for name, cold, cached, inductor in rows:
            inductor_cell = f"{inductor['seconds']:.1f} s" if inductor else "n/a"
            print(f"| {MODELS[name]} | {cold['seconds']:.1f} s | {cold['import']:.1f} / {cold['kernel']:.1f} s | "
                  f"{cached['seconds']:.2f} s | {inductor_cell} | {cold['error']:.1e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
