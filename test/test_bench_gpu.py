"""bench/gpu.py's reporting, which runs only on the GPU machine and so must be right the first
time: the per-problem summary, the markdown table, the choice of kernels to profile, and the
watchdog that stops a deadlocked run with its results saved."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from reference import bench_module

bench_gpu = bench_module("gpu")


def _gemm(variant, tflops, torch_tflops, ok=True, size=4096):
    return {"name": f"gemm_{size}_{variant}", "chip": "sm_90a", "dtype": "bf16", "transpose_b": False, "size": size,
            "variant": variant, "ok": ok, "max_rel_error": 1e-3 if ok else 0.5, "loaded_from": "cubin",
            "tracea_tflops": tflops, "torch_tflops": torch_tflops}


def _attention(variant, tflops, torch_tflops, triton_tflops):
    return {"name": f"attention_{variant}", "chip": "sm_90a", "dtype": "bf16", "attention": [2, 16, 8192, 128, True],
            "variant": variant, "ok": True, "max_rel_error": 2e-3, "loaded_from": "cubin", "tracea_tflops": tflops,
            "torch_tflops": torch_tflops, "triton_tflops": triton_tflops}


ROWS = [_gemm("default", 600, 700), _gemm("group 1", 650, 700), _gemm("fast but wrong", 900, 700, ok=False),
        _gemm("default", 300, 600, size=1024),
        _attention("default", 400, 500, 380), _attention("no ping-pong", 350, 500, 380)]


def test_summary_gives_each_problem_its_default_and_best_correct_variant():
    lines = bench_gpu.summary(ROWS).splitlines()
    assert len(lines) == 3
    big = next(line for line in lines if "4096^3" in line)
    assert "default 600 TFLOP/s 0.86x torch" in big
    assert "best group 1 650 (0.93x)" in big  # the wrong, faster variant is not the best
    assert "best" not in next(line for line in lines if "1024^3" in line)
    attention = next(line for line in lines if "attention" in line)
    assert "0.80x torch 1.05x Triton" in attention and "best" not in attention


def test_markdown_table_has_a_row_per_case_and_marks_the_wrong_one():
    table = bench_gpu.markdown_table(ROWS).splitlines()
    assert len(table) == 2 + len(ROWS)
    assert all(line.count("|") == 10 for line in table)
    wrong = next(line for line in table if "fast but wrong" in line)
    assert "| NO (5.0e-01) |" in wrong
    assert "| 400.0 | 500.0 | **0.80x** | 380.0 | 1.05x |" in next(line for line in table if "attention" in line)
    assert "| - | - |" in table[2]  # no Triton peer for a GEMM


def test_profile_chooses_the_best_and_worst_correct_default_kernels():
    chosen = {(which, r["name"]) for which, r in bench_gpu.profile_choices(ROWS)}
    assert chosen == {("worst", "gemm_1024_default"), ("best", "gemm_4096_default"),
                      ("worst", "attention_default"), ("best", "attention_default")}


def test_watchdog_stops_a_hung_case_after_saving(tmp_path):
    script = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import time\n"
              "from reference import bench_module\n"
              "dog = bench_module('gpu').Watchdog(0.5, lambda: print('saved', flush=True))\n"
              "with dog.case('quick'):\n    pass\n"
              "with dog.case('stuck'):\n    time.sleep(30)\n"
              "print('not reached')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).parent.parent)
    assert done.returncode == 3
    assert "HANG: stuck did not finish in 0.5 s; stopping\nsaved" in done.stdout
    assert "quick" not in done.stdout and "not reached" not in done.stdout


def test_the_timed_problems_and_their_peers_agree_with_the_references():
    """What `run` times, on the CPU at small sizes: inputs, the f32 reference and torch's call."""
    torch = __import__("pytest").importorskip("torch")
    cases = [{"dtype": "f16", "transpose_b": transpose_b, "size": 64} for transpose_b in (False, True)]
    cases += [{"dtype": "f16", "conv": [2, 9, 8, 16, 3, 2, 1]},
              {"dtype": "bf16", "attention": [1, 2, 40, 16, True]}]
    for case in cases:
        inputs, expected, peers, flops = bench_gpu.problem(torch, case, device="cpu")
        assert set(peers) == {"torch"} and flops > 0
        assert bench_gpu._relative_error(peers["torch"](), expected) < 1e-2, case
    assert inputs[0].shape == (1, 2, 40, 16) and inputs[0].dtype == torch.bfloat16
