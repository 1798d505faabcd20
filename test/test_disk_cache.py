"""The persistent kernel cache: a later process loads what an earlier one compiled."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tracea
from tracea import dialects as td

SCRIPT = textwrap.dedent("""
    import numpy as np, tracea
    from tracea import dialects as td
    fn = td.function(td.tensor((37, 29)), td.tensor((29, 45)), name="mm")(td.gemm)
    k = tracea.compile(fn)
    a, b = np.ones((37, 29), np.float32), np.full((29, 45), 2, np.float32)
    assert (k(a, b) == 58).all()
    print(k.origin)
""")


def run(env):
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_later_process_loads_the_kernel(tmp_path):
    env = {"TRACEA_CACHE_DIR": str(tmp_path)}
    assert run(env) == "compiled"
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".h", ".json", ".so"]
    assert run(env) == "disk cache"


def test_a_damaged_entry_is_recompiled_and_replaced(tmp_path):
    env = {"TRACEA_CACHE_DIR": str(tmp_path)}
    run(env)
    for path in tmp_path.iterdir():
        path.write_bytes(b"garbage")
    assert run(env) == "compiled"
    assert run(env) == "disk cache"


def test_the_cache_can_be_turned_off(tmp_path):
    assert run({"TRACEA_CACHE_DIR": str(tmp_path), "TRACEA_DISK_CACHE": "0"}) == "compiled"
    assert list(tmp_path.iterdir()) == []


def test_kept_stages_always_compile(monkeypatch, tmp_path):
    monkeypatch.setenv("TRACEA_CACHE_DIR", str(tmp_path))
    fn = td.function(td.tensor((3, 3)), name="sm")(td.softmax)
    tracea.compile(fn, threads=1)
    tracea.clear_cache()
    assert tracea.compile(fn, threads=1).origin == "disk cache"
    kept = tracea.compile(fn, threads=1, keep_stages=True)
    assert kept.origin == "compiled" and kept.stages
    x = np.arange(9, dtype=np.float32).reshape(3, 3)
    np.testing.assert_allclose(kept(x), tracea.compile(fn, threads=1)(x))
