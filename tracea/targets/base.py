"""The small interface every target implements, and the registry `compile()` reads."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from ..passes.pipeline import Pipeline

TARGETS: dict[str, "Target"] = {}


@dataclass
class LoadedCode:
    address: int  # the packed entry point (one void** argument array)
    owner: Any  # keeps the code alive (a JIT library, a shared library)
    entry_symbol: str  # the C-ABI entry point's symbol
    runtime_libraries: list[str] = field(default_factory=list)
    object_code: bytes | None = None  # what Kernel.export links, when the target keeps it


class Target(ABC):
    name: str = ""

    @abstractmethod
    def stages(self, strategy: str, threads: int) -> list[tuple[str, Pipeline]]:
        """Ordered (stage name, pipeline) pairs from tracea ops to the target's final IR."""

    def prepare(self) -> None:
        """Set up, once per process, what every compile of this target would otherwise redo."""

    @abstractmethod
    def codegen(self, module) -> bytes:
        """The final module (an MLIR operation) as code. Runs where the passes ran (the compiler's
        child process), so an abort in the code generator is reported like one in a pass."""

    @abstractmethod
    def load(self, code: bytes, entry: str) -> LoadedCode:
        """Make the generated code callable."""


def register_target(cls: type[Target]) -> type[Target]:
    TARGETS[cls.name] = cls()
    return cls


def get_target(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise ValueError(f"unknown target '{name}'; available: {', '.join(sorted(TARGETS))}") from None
