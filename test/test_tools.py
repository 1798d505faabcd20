"""The command-line tools as a user runs them: exit codes, messages, help."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from test_pipeline import CRASHING_INPUT

BIN = os.path.dirname(sys.executable)


def run(tool, *args, stdin=None, env=None):
    return subprocess.run([os.path.join(BIN, tool), *args], input=stdin, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=120)


def test_opt_exit_status_2_on_internal_compiler_error(tmp_path):
    src = tmp_path / "crash.mlir"
    src.write_text(CRASHING_INPUT)
    result = run("tracea-opt", str(src), "--pass-pipeline=builtin.module(finalize-memref-to-llvm)",
                 env={"TRACEA_CRASH_DIR": str(tmp_path / "crashes")})
    assert result.returncode == 2
    assert "internal compiler error" in result.stderr
    assert "Traceback" not in result.stderr
    assert len(list((tmp_path / "crashes").iterdir())) == 1


def test_opt_exit_status_1_on_bad_input():
    result = run("tracea-opt", stdin="func.func @f( {")
    assert result.returncode == 1
    assert result.stderr.startswith("<stdin>:1:")
    assert "Traceback" not in result.stderr


def test_opt_round_trips_stdin_to_stdout():
    text = 'func.func @f(%x: tensor<3xf32>) -> tensor<3xf32> {\n  %y = "tracea.softmax"(%x) : (tensor<3xf32>) -> tensor<3xf32>\n  return %y : tensor<3xf32>\n}\n'
    result = run("tracea-opt", stdin=text)
    assert result.returncode == 0, result.stderr
    assert '"tracea.softmax"(%arg0) : (tensor<3xf32>) -> tensor<3xf32>' in result.stdout


def test_opt_verify_diagnostics_reports_mismatches(tmp_path):
    src = tmp_path / "t.mlir"
    src.write_text("""func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{a message that will not come}}
  %y = "tracea.softmax"(%x) {axis = 1 : i64} : (tensor<4xf32>) -> tensor<4xf32>
  return %y : tensor<4xf32>
}
""")
    result = run("tracea-opt", str(src), "--verify-diagnostics")
    assert result.returncode == 1
    assert f"{src}:3:8: error: unexpected error: 'tracea.softmax' op axis 1 is out of range" in result.stderr
    assert f"{src}:3: error: expected error \"a message that will not come\" was not produced" in result.stderr


@pytest.mark.parametrize("tool", ["tracea-opt", "tracea"])
def test_help_and_version(tool):
    assert run(tool, "--help").returncode == 0
    version = run(tool, "--version")
    assert version.returncode == 0 and "0.1.0" in version.stdout


def test_demo_runs_and_checks(tmp_path):
    """Both programs compiled, checked and timed (inductor left out: 15 s of compiling), and the table."""
    result = run("tracea", "demo", "--batch", "1", "--seq", "16", "--dim", "16", "--hidden", "32", "--vocab", "8",
                 "--model-seq", "16", "--repeat", "2", "--no-inductor")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("-> OK") == 2 and "GFLOP/s" in result.stdout
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ")]
    assert len(rows) == 4 and "GPT-2-style decoder" in rows[3] and "| eager |" in rows[3]


@pytest.mark.parametrize("n", [2, 3, 4, 6])
def test_interleaved_rounds_vary_what_runs_before_each_call(n):
    """Timing as users call: each implementation follows every other about equally often (a
    rotated fixed order put the same peer before Tracea's kernel in every round: torch's, whose
    spinning threads cost a small 2-thread kernel 20 %)."""
    from collections import Counter
    from tracea.tools.timing import interleaved_samples, round_orders
    names = [f"impl{i}" for i in range(n)]
    orders = round_orders(names)
    assert all(sorted(o) == names for o in orders)
    inside = Counter((a, b) for o in orders for a, b in zip(o, o[1:]))
    assert set(inside) == {(a, b) for a in names for b in names if a != b}
    assert len(set(inside.values())) == 1  # every ordered pair equally often
    log = []
    samples = interleaved_samples({name: (lambda name=name: log.append(name)) for name in names}, rounds=len(orders),
                                  seconds=0)
    assert all(len(s) == len(orders) for s in samples.values())
    before = Counter(zip(log[n:], log[n + 1:]))  # after the warm-up
    assert all(before[(a, b)] > 0 for a in names for b in names if a != b)


def test_paired_speedups_cancel_a_slow_spell():
    """The interleaved benchmark's ratio: per round, so a spell of the VM that slows every call it
    covers (2x) cancels. Here it covers rounds 0-9 and, in round 10, Tracea's call but not the
    peer's: 11 of Tracea's 21 calls are slow and 10 of the peer's, so the medians are one slow and
    one fast, and their ratio says Tracea is 1.8x slower where it is 1.1x faster."""
    from tracea.tools.timing import _medians, paired_speedups
    slow = [2.0 if r < 10 else 1.0 for r in range(21)]
    tracea = [s * 1.0 for s in slow]
    tracea[10] = 2.0
    samples = {"tracea": tracea, "peer": [s * 1.1 for s in slow], "other": [s * 0.5 for s in slow]}
    assert paired_speedups(samples, "tracea") == pytest.approx({"peer": 1.1, "other": 0.5})
    assert paired_speedups(samples, "peer")["tracea"] == pytest.approx(1 / 1.1)
    medians = _medians(samples)
    assert medians["peer"] / medians["tracea"] == pytest.approx(0.55)  # what the medians would have said


def test_times_after_times_the_target_right_after_each_predecessor():
    """bench/cpu.py --after: each sample of the target is the call right after its predecessor's,
    every predecessor (the target itself too) equally often; a sleep in one predecessor's call
    must show in the target's time after it and in no other."""
    import time
    from collections import Counter
    from tracea.tools.timing import times_after
    log = []

    def target():
        log.append("target")
        if log[-2:-1] == ["slow"]:
            time.sleep(0.002)  # what a spinning pool left behind costs the next call
    before = {"target": target, "fast": lambda: log.append("fast"), "slow": lambda: log.append("slow")}
    times = times_after(target, before, rounds=6, seconds=0)
    assert times["slow"] > 0.0015 > max(times["fast"], times["target"])
    pairs = list(zip(log[4:], log[5:]))[::2]  # after the warm-up: (predecessor, target) pairs
    assert {b for _, b in pairs} == {"target"} and Counter(a for a, _ in pairs) == {"target": 6, "fast": 6, "slow": 6}
