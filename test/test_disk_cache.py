"""The persistent kernel cache: a later process loads what an earlier one compiled."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tracea
from tracea import dialects as td

SCRIPT = textwrap.dedent("""
    import sys, numpy as np, tracea
    from tracea import dialects as td
    n = int(sys.argv[1])
    fn = td.function(td.tensor((37, n)), td.tensor((n, 45)), name="mm")(td.gemm)
    k = tracea.compile(fn)
    a, b = np.ones((37, n), np.float32), np.full((n, 45), 2, np.float32)
    assert (k(a, b) == 2 * n).all()
    print(k.origin)
""")


def run(env, n=29, stderr=None):
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(n)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})
    assert done.returncode == 0, done.stderr
    if stderr is not None:
        stderr.append(done.stderr)
    return done.stdout.strip()


def test_a_later_process_loads_the_kernel(tmp_path):
    env = {"TRACEA_CACHE_DIR": str(tmp_path)}
    assert run(env) == "compiled"
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".h", ".json", ".o", ".so"]
    assert run(env) == "disk cache"


TORCH_FIRST = textwrap.dedent("""
    import sys
    import torch  # first: threaded kernels run on its GNU OpenMP threads (runtime/gnu_openmp.py)
    import numpy as np, tracea
    from tracea import dialects as td
    fn = td.function(td.tensor((300, 64)), td.tensor((64, 45)), name="mm")(td.gemm)
    k = tracea.compile(fn, threads=2)
    a, b = np.ones((300, 64), np.float32), np.full((64, 45), 2, np.float32)
    assert (k(a, b) == 128).all()
    print(k.origin, k.openmp)
""")


def test_a_cached_kernel_runs_on_the_openmp_runtime_of_the_process_loading_it(tmp_path):
    """Compiled where Tracea came first (libomp); loaded where torch did: its object code is linked
    onto GNU OpenMP's threads. A damaged object falls back to the library (libomp), still right."""
    pytest.importorskip("torch")
    env = {"TRACEA_CACHE_DIR": str(tmp_path), "GOMP_SPINCOUNT": "", "OMP_WAIT_POLICY": ""}
    assert run(env) == "compiled"
    done = [subprocess.run([sys.executable, "-c", TORCH_FIRST], capture_output=True, text=True, timeout=120,
                           env={**os.environ, **env}) for _ in range(2)]
    assert [d.stdout.split() for d in done] == [["compiled", "gnu"], ["disk", "cache", "gnu"]], done[0].stderr
    for obj in tmp_path.glob("*.o"):
        obj.write_bytes(obj.read_bytes()[:-8] + b"damaged!")
    again = subprocess.run([sys.executable, "-c", TORCH_FIRST], capture_output=True, text=True, timeout=120,
                           env={**os.environ, **env})
    assert again.stdout.split() == ["disk", "cache", "llvm"], again.stderr


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


def _flip(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes(b ^ 0x5A for b in data[middle:middle + 64]) + data[middle + 64:]


def _edit_json(edit):
    def corrupt(text: bytes) -> bytes:
        meta = json.loads(text)
        edit(meta)
        return json.dumps(meta).encode()
    return corrupt


CORRUPTIONS = {  # file suffix -> what is done to it (None: deleted); "foreign": another entry's file
    "truncated library": (".so", lambda data: data[:len(data) // 2]),
    "bit flips in the library": (".so", _flip),
    "zeroed code": (".so", lambda data: data[:len(data) // 3] + bytes(4096) + data[len(data) // 3 + 4096:]),
    "library deleted": (".so", None),
    "another entry's library": (".so", "foreign"),
    "another entry's files": ("*", "foreign"),
    "description is null": (".so.json", lambda data: b"null"),
    "description is a list": (".so.json", lambda data: b"[1, 2, 3]"),
    "edited shapes": (".so.json", _edit_json(lambda m: m["inputs"][0][0].reverse())),
    "edited symbol": (".so.json", _edit_json(lambda m: m.update(packed_symbol="_mlir_tracea_other"))),
}


@pytest.mark.parametrize("damage", list(CORRUPTIONS))
def test_a_damaged_entry_is_set_aside_with_a_warning_and_compiled_again(tmp_path, damage):
    """Each damage, in a fresh process: no crash, a correct result, one warning, then the entry
    works again."""
    cache, other = tmp_path / "cache", tmp_path / "other"
    env = {"TRACEA_CACHE_DIR": str(cache)}
    run(env)
    run({"TRACEA_CACHE_DIR": str(other)}, n=30)
    (key,) = {p.name.split(".")[0] for p in cache.iterdir() if p.is_file()}
    (other_key,) = {p.name.split(".")[0] for p in other.iterdir()}
    suffix, corrupt = CORRUPTIONS[damage]
    for each in ([".so", ".so.h", ".so.json"] if suffix == "*" else [suffix]):
        path = cache / f"{key}{each}"
        if corrupt is None:
            path.unlink()
        elif corrupt == "foreign":
            path.write_bytes((other / f"{other_key}{each}").read_bytes())
        else:
            path.write_bytes(corrupt(path.read_bytes()))
    stderr = []
    assert run(env, stderr=stderr) == "compiled"
    assert stderr[0].count("is unusable") == 1, stderr[0]
    assert run(env) == "disk cache"
