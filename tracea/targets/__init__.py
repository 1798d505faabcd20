"""Code generation targets; importing this package registers them."""
from . import cpu  # noqa: F401  (registers the target and its passes)
from .base import TARGETS, Target, get_target

__all__ = ["TARGETS", "Target", "get_target"]
