import os
import sys
import tempfile

import pytest
from hypothesis import settings

sys.path.insert(0, os.path.dirname(__file__))  # `import reference`

# Each test process gets its own persistent kernel cache (subprocesses of tests inherit it).
os.environ["TRACEA_CACHE_DIR"] = tempfile.mkdtemp(prefix="tracea-test-cache-")
# ... and an empty tuning cache: a user's tuned schedules must not change what the tests compile
os.environ["TRACEA_TUNING_DIR"] = tempfile.mkdtemp(prefix="tracea-test-tuning-")

# Every example compiles a kernel (~0.3 s); keep property tests to a few dozen shapes each.
# Property tests explore: every run draws new examples (12 a test, within the suite's time) and
# a failure prints the example and the seed that reproduces it (pytest --hypothesis-seed=N).
# HYPOTHESIS_PROFILE=explore runs 200 a test; =fixed the same 12 every time.
settings.register_profile("tracea", max_examples=12, deadline=None, print_blob=True, database=None)
settings.register_profile("explore", max_examples=200, deadline=None, print_blob=True, database=None)
settings.register_profile("fixed", max_examples=12, deadline=None, derandomize=True, database=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "tracea"))


@pytest.fixture
def rng():
    import numpy as np
    return np.random.default_rng(1234)


@pytest.fixture(autouse=True)
def crash_dir(tmp_path, monkeypatch):
    """Reproducers of internal compiler errors go to the test's own directory."""
    monkeypatch.setenv("TRACEA_CRASH_DIR", str(tmp_path / "crashes"))
    return tmp_path / "crashes"


@pytest.fixture
def ptxas():
    """For tests that assemble PTX: skips where NVIDIA's ptxas is not installed."""
    from tracea.errors import CompileError
    from tracea.targets.nvvm import target as nvvm
    try:
        return nvvm.ptxas_path()
    except CompileError:
        pytest.skip("ptxas not found (pip install nvidia-cuda-nvcc==13.0.88)")


@pytest.fixture
def sass(ptxas):
    """sass(cubin) -> its machine code; skips where cuobjdump / nvdisasm are not installed."""
    from tracea.errors import CompileError
    from tracea.targets.nvvm import target as nvvm

    def disassemble(cubin) -> str:
        try:
            return nvvm.sass(cubin)
        except CompileError as e:
            pytest.skip(f"no SASS disassembler: {e}")
    return disassemble
