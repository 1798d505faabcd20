"""The interface every backend implements, and the registry `compile()` reads.

A compile is the same path for every backend (tracea/compiler.py):

    options = target.options(strategy=..., threads=..., chip=...)   # frozen, hashable
    stages = target.stages(options)         # ordered {name: pipeline}; each result can be dumped
    code = target.codegen(final module)     # in the compiler process, like the passes
    build = Build(signature, target.package(code, signature, options), stages' IR, seconds)
    kernel = target.load(build, device)     # compile() only; compile_gpu stops at build.artifact

and every cache key holds `target.hash(options)`: the backend, its options and the versions of
the tools that make its code.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable

from ..passes.pipeline import Pipeline

TARGETS: dict[str, "Target"] = {}


@dataclass
class Build:
    """What a compile made before anything is loaded."""
    signature: Any  # runtime.kernel.Signature of the entry function
    artifact: Any  # the backend's code: CPU object code, an NVIDIA GpuKernelArtifact
    stages: dict[str, str] = field(default_factory=dict)  # stage -> IR text, when kept
    seconds: float = 0.0
    plan: str = ""  # what the passes decided (passes/plan.py): what explain() reports


@functools.cache  # read once: every compile call, cache hits included, hashes the toolchain
def package_version(distribution: str) -> str:
    try:
        return f"{distribution} {importlib.metadata.version(distribution)}"
    except importlib.metadata.PackageNotFoundError:
        return f"{distribution} missing"


class Target(ABC):
    name: str = ""
    persistent: bool = False  # whether its kernels are kept in the disk cache (runtime/disk_cache.py)

    @abstractmethod
    def options(self, *, strategy: str = "tiled", threads: int | None = None, chip: str | None = None):
        """`compile`'s options for this backend, checked and with defaults filled in: a frozen,
        hashable value. Raises ValueError naming an option the backend does not take."""

    @abstractmethod
    def stages(self, options) -> dict[str, Pipeline]:
        """Ordered stage name -> pipeline, from tracea ops to the module `codegen` reads."""

    def toolchain(self, options) -> tuple[str, ...]:
        """The tools (and their versions) whose output the code is: part of `hash`."""
        return (package_version("xtc-mlir-python-bindings"),)

    def hash(self, options) -> str:
        """Names the code this target makes with these options and these tools: every cache key
        holds it."""
        return hashlib.sha256("\0".join([self.name, repr(options), *self.toolchain(options)]).encode()).hexdigest()

    def prepare(self, options) -> None:
        """Set up, once per process, what every compile of this target would otherwise redo."""

    def device(self, options) -> Any:
        """The device `load` runs kernels on, checked before compiling (a clear error where there
        is none); None for the host."""
        return None

    @abstractmethod
    def codegen(self, module, options) -> bytes:
        """The final module (an MLIR operation) as code. Runs where the passes ran (the compiler's
        child process), so an abort in the code generator is reported like one in a pass."""

    def package(self, code: bytes, signature, options) -> Any:
        """The artifact of `codegen`'s bytes (checked, assembled, described), in this process."""
        return code

    @abstractmethod
    def load(self, build: Build, options, device) -> Any:
        """The callable kernel of a build, on `device`."""

    def from_cache(self, kernel, object_code: Callable[[], bytes | None], options) -> Any:
        """A kernel the disk cache loaded, or one linked anew from its object code (`object_code()`,
        None when the entry has none) where this process needs it linked differently."""
        return kernel


def register_target(cls: type[Target]) -> type[Target]:
    TARGETS[cls.name] = cls()
    return cls


def get_target(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise ValueError(f"unknown target '{name}'; available: {', '.join(sorted(TARGETS))}") from None
