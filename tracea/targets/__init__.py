"""Code generation targets, one folder a backend; importing this package registers each one's
Target, passes and kernel variants."""
from . import cpu, nvvm, rocdl, spirv  # noqa: F401
from .base import TARGETS, Target, get_target

__all__ = ["TARGETS", "Target", "get_target"]
