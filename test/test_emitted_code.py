"""The code Tracea emits is what test/emitted_code.json recorded: the default CPU kernels for
three CPU profiles and every GPU check kernel, hashed (scripts/emitted_code.py; `check` there
also covers every bench/gpu.py variant). A refactoring must leave them byte-identical; an
intended change records new hashes with `scripts/emitted_code.py record`."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).parent.parent / "scripts" / "emitted_code.py"


def _script():
    spec = importlib.util.spec_from_file_location("emitted_code", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_default_cpu_kernels_are_unchanged(monkeypatch):
    script = _script()
    monkeypatch.setenv("TRACEA_CPU", "")  # restored after: cpu_hashes sets and removes it
    recorded = json.loads(script.MANIFEST.read_text())
    found = script.cpu_hashes()
    assert {k: v for k, v in found.items() if recorded.get(k) != v} == {}


def test_gpu_check_kernels_are_unchanged(ptxas):
    script = _script()
    recorded = json.loads(script.MANIFEST.read_text())
    found = script.gpu_hashes(everything=False)
    assert {k: v for k, v in found.items() if recorded.get(k) != v} == {}
