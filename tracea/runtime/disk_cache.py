"""The persistent kernel cache: compiled CPU kernels kept as shared libraries (runtime/aot.py),
so compiling the same program in a later process is a load of about a millisecond.

An entry's key covers the program text and compile options, the host CPU as detected, and a
digest of Tracea's own sources: a new Tracea or another machine never reuses a stale kernel.
Entries are written under a temporary name and renamed, so concurrent processes and interrupted
writes leave either a whole entry or none. An entry is checked before it is used (Kernel.load: the
checksums of its library and its description, and the key it was stored under); a damaged,
edited or foreign one is moved into `damaged/` with one warning and compiled again.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from functools import lru_cache
from pathlib import Path

from .. import __version__, knobs
from ..errors import TraceaError, warn
from .aot import export
from .kernel import Kernel

# the description last: it marks the entry complete; the object code is linked anew where the
# library's OpenMP runtime is not the one to run on (targets/cpu/target.py: from_cache)
_SUFFIXES = (".so", ".so.h", ".o", ".so.json")


@lru_cache(maxsize=1)
def _source_digest() -> str:
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256(__version__.encode())
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def entry_key(parts: list[str]) -> str:
    from ..doctor.capabilities import host_cpu
    return hashlib.sha256("\0".join([_source_digest(), host_cpu().describe(), *parts]).encode()).hexdigest()


def lookup(key: str, target: str) -> Kernel | None:
    directory = knobs.cache_dir()
    if directory is None or not (directory / f"{key}.so.json").exists():
        return None
    try:
        kernel = Kernel.load(directory / f"{key}.so", expect={"cache_key": key})
    except (TraceaError, OSError, ValueError, KeyError, TypeError) as e:
        _set_aside(directory, key, e)
        return None
    kernel.target, kernel.origin = target, "disk cache"
    return kernel


def object_code(key: str) -> bytes | None:
    """The object code of an entry lookup found, or None (an entry without one, or one whose bytes
    do not match the digest in its description)."""
    directory = knobs.cache_dir()
    try:
        meta = json.loads((directory / f"{key}.so.json").read_text())
        code = (directory / f"{key}.o").read_bytes()
    except (OSError, ValueError, TypeError):
        return None
    return code if hashlib.sha256(code).hexdigest() == meta.get("object_sha256") else None


def _set_aside(directory: Path, key: str, why: Exception) -> None:
    """Move a damaged entry's files out of the way (kept for a look), with a warning."""
    aside = directory / "damaged"
    try:
        aside.mkdir(exist_ok=True)
        for suffix in _SUFFIXES:
            if (directory / f"{key}{suffix}").exists():
                os.replace(directory / f"{key}{suffix}", aside / f"{key}{suffix}")
    except OSError:
        pass
    warn(f"Tracea's kernel cache entry {key[:16]}... in {directory} is unusable ({why}); it was moved to {aside} "
         "and the kernel is compiled again")


def store(key: str, kernel: Kernel) -> None:
    """Best effort: without a linker, or on a read-only disk, the cache is simply not written."""
    directory = knobs.cache_dir()
    if directory is None:
        return
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=directory) as tmp:
            extra = {"cache_key": key}
            if kernel.object_code is not None:
                (Path(tmp) / "kernel.o").write_bytes(kernel.object_code)
                extra["object_sha256"] = hashlib.sha256(kernel.object_code).hexdigest()
            export(kernel, Path(tmp) / "kernel.so", extra=extra)
            for suffix in _SUFFIXES:
                if (Path(tmp) / f"kernel{suffix}").exists():
                    os.replace(Path(tmp) / f"kernel{suffix}", directory / f"{key}{suffix}")
    except (TraceaError, OSError):
        return


def lookup_text(key: str) -> str | None:
    """A stored intermediate text (a PyTorch model's linalg import), or None; a damaged entry
    (its checksum does not match) is ignored and rewritten by the next store."""
    directory = knobs.cache_dir()
    path = directory / f"{key}.text" if directory is not None else None
    if path is None or not path.exists():
        return None
    try:
        digest, text = path.read_text().split("\n", 1)
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return text if hashlib.sha256(text.encode()).hexdigest() == digest else None


def store_text(key: str, text: str) -> None:
    """Best effort, written whole or not at all (a temporary file renamed)."""
    directory = knobs.cache_dir()
    if directory is None:
        return
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=directory, suffix=".tmp", delete=False) as f:
            f.write(hashlib.sha256(text.encode()).hexdigest() + "\n" + text)
        os.replace(f.name, directory / f"{key}.text")
    except OSError:
        pass
