"""The tuner (L6): search spaces (space.py), the Gaussian-process search (search.py), what it
measures (measure.py), the persistent tuning cache (cache.py) and the AutoTuner that ties them
to the Doctor's variants (autotuner.py)."""
from .space import SearchSpace, SpaceError, config_key

TIMED_BACKENDS = ("cpu", "vulkan")  # where the AutoTuner can time kernels (runtimes it launches them on)

__all__ = ["TIMED_BACKENDS", "AutoTuner", "SearchSpace", "SpaceError", "TuningCache", "config_key"]


def __getattr__(name):  # the rest imports the compiler, which imports the kernels, which import space.py
    if name == "AutoTuner":
        from .autotuner import AutoTuner
        return AutoTuner
    if name == "TuningCache":
        from .cache import TuningCache
        return TuningCache
    raise AttributeError(name)
