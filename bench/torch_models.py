"""PyTorch models through Tracea against eager PyTorch and torch.compile (inductor), one run.

    .venv/bin/python bench/torch_models.py             # MLP, ResNet-style CNN, transformer encoder block
    .venv/bin/python bench/torch_models.py --markdown

Each model is compiled with tracea.compile(model, example_inputs) and with torch.compile
(inductor), checked against eager, then timed as bench/cpu.py times kernels: calls cycle through
the three implementations in blocks, each after a pause and an untimed warm-up call (the first
call after idling pays for waking threads and vCPUs); per-call medians are reported. Ratio = eager (or inductor) time / Tracea time
(> 1: Tracea is faster). Compile times are first compiles (Tracea's kernel cache is disabled).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TRACEA_DISK_CACHE", "0")  # time real compiles
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "test"))
from cpu import median_times  # noqa: E402  (bench/cpu.py: blocks after a pause and a warm-up call)


def models():
    import torch
    from test_torch import ResidualBlock
    nn = torch.nn
    mlp = nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.GELU(), nn.Linear(2048, 512))
    cnn = nn.Sequential(nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                        nn.MaxPool2d(3, stride=2, padding=1), ResidualBlock(64), ResidualBlock(64),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 1000))
    encoder = nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, activation="gelu", batch_first=True)
    return {
        "MLP 512-2048-2048-512, batch 64": (mlp, (64, 512)),
        "ResNet-style CNN (7x7 stem, 2 residual blocks), 1x3x112x112": (cnn, (1, 3, 112, 112)),
        "Transformer encoder block d256 h4 ff1024, 1x128": (encoder, (1, 128, 256)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15, help="timed calls per implementation (median reported)")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    import torch

    import tracea
    torch.manual_seed(0)
    rows = []
    for name, (model, shape) in models().items():
        model.eval()
        x = torch.randn(*shape)
        start = time.perf_counter()
        ours = tracea.compile(model, (x,))
        t_tracea = time.perf_counter() - start
        inductor = torch.compile(model)
        with torch.no_grad():
            start = time.perf_counter()
            inductor(x)
            t_inductor = time.perf_counter() - start
            expected = model(x)
            for label, got in (("tracea", ours(x)), ("inductor", inductor(x))):
                err = (got - expected).abs().max().item()
                if err > 1e-3 * max(1.0, expected.abs().max().item()):
                    print(f"{name}: {label} differs from eager by {err}", file=sys.stderr)
                    return 1
            fns = {"eager": lambda: model(x), "inductor": lambda: inductor(x), "tracea": lambda: ours(x)}
            for fn in fns.values():
                fn()
            t = median_times(fns, args.rounds)
        rows.append((name, t, t_tracea, t_inductor))
        print(f"{name}: eager {t['eager'] * 1e3:.2f} ms, inductor {t['inductor'] * 1e3:.2f} ms, "
              f"tracea {t['tracea'] * 1e3:.2f} ms -> {t['eager'] / t['tracea']:.2f}x eager, "
              f"{t['inductor'] / t['tracea']:.2f}x inductor; compile tracea {t_tracea:.1f} s "
              f"(import {ours.import_seconds:.1f} s), inductor {t_inductor:.1f} s", flush=True)
    if args.markdown:
        print(f"\nthreads: torch {torch.get_num_threads()}, tracea {os.cpu_count()}\n")
        print("| model | eager ms | inductor ms | Tracea ms | vs eager | vs inductor | compile Tracea s | compile inductor s |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for name, t, ct, ci in rows:
            print(f"| {name} | {t['eager'] * 1e3:.2f} | {t['inductor'] * 1e3:.2f} | {t['tracea'] * 1e3:.2f} | "
                  f"{t['eager'] / t['tracea']:.2f}x | {t['inductor'] / t['tracea']:.2f}x | {ct:.1f} | {ci:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
