"""The small interface every target implements, and the registry `compile()` reads."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from ..passes.pipeline import Pipeline

TARGETS: dict[str, "Target"] = {}


class Target(ABC):
    name: str = ""

    @abstractmethod
    def stages(self, strategy: str, threads: int) -> list[tuple[str, Pipeline]]:
        """Ordered (stage name, pipeline) pairs from tracea ops to the target's final IR."""

    @abstractmethod
    def load(self, final_ir: str, entry: str) -> tuple[int, Any]:
        """Make the final IR callable: (address of the packed entry point, owner to keep alive)."""


def register_target(cls: type[Target]) -> type[Target]:
    TARGETS[cls.name] = cls()
    return cls


def get_target(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise ValueError(f"unknown target '{name}'; available: {', '.join(sorted(TARGETS))}") from None
