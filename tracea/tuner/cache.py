"""The persistent tuning cache: $TRACEA_TUNING_DIR/tuning_cache.json (default ~/.tracea/).

An entry is one op on one machine: its key hashes the op (name, operand and result types,
attributes: shapes, dtypes, layouts), the variant, the backend and the device's capabilities
(ISA, lanes, registers, caches, cores; a GPU's architecture), and the thread count. It stores
every configuration's measured time (or why it failed), so a wider space re-uses what was
measured, and the best configuration's schedule, which `lookup` returns. It also stores its
`problem` (the op and variant without the machine): entries of the same problem from other
machines (a campaign's, or a copied cache) are hints where a search starts (`others`).

The environment (Tracea's, MLIR's and LLVM's versions, a GPU driver) is stored beside, not in
the key: an entry measured under another environment is stale. A stale entry is not used for
compiling, but its results are not thrown away: tuning it again re-times its few best
configurations first (`AutoTuner`).

Writes take a lock (filelock) and replace the file atomically (a temp file and a rename), so
processes tuning at once merge their entries and a reader never sees half a file. A file that
is not a tuning cache (corrupt, or another program's) is moved aside with a warning and a new
one started. Reads are kept in memory while the file's size and mtime stay the same: a hit is
a stat and a dictionary lookup.
"""
from __future__ import annotations

import datetime
import functools
import hashlib
import json
import os
import tempfile
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

FORMAT = "tracea-tuning-cache"
VERSION = 1


def cache_path() -> Path:
    from .. import knobs
    return knobs.tuning_dir() / "tuning_cache.json"


@functools.lru_cache(maxsize=None)
def _environment(caps) -> tuple:
    from importlib import metadata
    from .. import __version__
    env = {"tracea": __version__}
    for package in ("xtc-mlir-python-bindings", "llvmlite"):
        try:
            env[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            env[package] = "none"
    if caps.gpu is not None:
        env["driver"] = caps.gpu.driver_version or "none"
        env["toolkit"] = caps.gpu.toolkit_version or "none"
    return tuple(env.items())


def environment(caps) -> dict:
    """What the measurements depend on besides the machine: versions of Tracea and its compilers."""
    return dict(_environment(caps))


def op_facts(op) -> tuple:
    """What identifies a kernel op (an ir.Operation) in the cache: its name, operand and result
    types and attributes (shapes, dtypes, layouts, epilogues), without its schedule and variant."""
    named = (op.attributes[i] for i in range(len(op.attributes)))
    attrs = tuple(sorted((n.name, str(n.attr)) for n in named if n.name not in ("schedule", "tracea.variant")))
    return op.name, tuple(str(x.type) for x in op.operands), tuple(str(r.type) for r in op.results), attrs


def entry_key(facts: tuple, variant_id: str, caps, threads: int | None) -> str:
    device = caps.cpu if caps.backend == "cpu" else caps.gpu
    threads = threads or (caps.cpu.cores if caps.cpu else 1)
    text = repr((facts, variant_id, caps.backend, repr(device), threads))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def problem_key(facts: tuple, variant_id: str) -> str:
    """The op and variant alone: the same problem on any machine."""
    return hashlib.sha256(repr((facts, variant_id)).encode()).hexdigest()[:32]


@dataclass
class Entry:
    key: str
    data: dict  # label, variant, device, threads, environment, space, configs, schedule, seconds, tuned

    def fresh(self, env: dict) -> bool:
        return self.data.get("environment") == env

    def ranked(self) -> list[dict]:
        """The stored configurations that ran, fastest first."""
        ran = [c for c in self.data["configs"].values() if c.get("seconds") is not None]
        return sorted(ran, key=lambda c: c["seconds"])


class TuningCache:
    """The tuning cache file at `path` (default: cache_path())."""

    _memory: dict[Path, tuple[tuple[int, int], dict]] = {}
    _memory_lock = threading.Lock()

    def __init__(self, path: Path | str | None = None):
        self.path = Path(path) if path is not None else cache_path()

    # --- reading --------------------------------------------------------------------------
    def entries(self) -> dict[str, dict]:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return {}
        except OSError as e:
            warnings.warn(f"tracea: cannot read the tuning cache {self.path}: {e.strerror}; tuned schedules unused",
                          stacklevel=2)
            return {}
        stamp = (stat.st_size, stat.st_mtime_ns)
        with self._memory_lock:
            held = self._memory.get(self.path)
            if held is not None and held[0] == stamp:
                return held[1]
        entries = self._read()
        with self._memory_lock:
            self._memory[self.path] = (stamp, entries)
        return entries

    def _read(self) -> dict[str, dict]:
        """The file's entries; a file that is not a tuning cache is set aside."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError) as e:
            return self._set_aside(f"unreadable ({e})")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            return self._set_aside(f"not JSON (line {e.lineno}: {e.msg})")
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            return self._set_aside("not a Tracea tuning cache")
        if data.get("version") != VERSION:
            return self._set_aside(f"format version {data.get('version')!r}, this Tracea reads {VERSION}")
        entries = data.get("entries")
        if not isinstance(entries, dict) or not all(_valid(e) for e in entries.values()):
            return self._set_aside("entries of the wrong shape")
        return entries

    def _set_aside(self, why: str) -> dict:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        aside = self.path.with_name(f"{self.path.name}.bad-{stamp}-{os.getpid()}")
        try:
            os.replace(self.path, aside)
            where = f"moved to {aside}"
        except OSError as e:
            where = f"could not move it aside ({e.strerror}); it is left as it is"
        warnings.warn(f"tracea: the tuning cache {self.path} is {why}: {where}; starting an empty one", stacklevel=3)
        return {}

    def get(self, key: str) -> Entry | None:
        data = self.entries().get(key)
        return Entry(key, data) if data is not None else None

    def others(self, problem: str, device: str) -> list[Entry]:
        """Entries of `problem` measured on other devices than `device` (caps.describe()), stale
        or not: their ranking of configurations is a hint, not a result."""
        return [Entry(k, d) for k, d in sorted(self.entries().items())
                if d.get("problem") == problem and d.get("device") != device]

    def lookup(self, key: str, env: dict) -> dict | None:
        """The tuned schedule (Schedule.as_dict form) of a fresh entry, or None."""
        entry = self.get(key)
        if entry is None or not entry.fresh(env) or entry.data.get("schedule") is None:
            return None
        return entry.data["schedule"]

    # --- writing --------------------------------------------------------------------------
    def update(self, key: str, change) -> dict:
        """Apply `change(entry data or None) -> new data or None (delete)` under the lock, and
        write the file atomically; returns the new data."""
        from filelock import FileLock
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.path) + ".lock", timeout=60):
            entries = dict(self._read())  # the file as it is now: other processes may have written
            new = change(entries.get(key))
            if new is None:
                entries.pop(key, None)
            else:
                entries[key] = new
            self._write(entries)
        return new

    def clear(self) -> int:
        """Remove every entry; returns how many there were."""
        from filelock import FileLock
        if not self.path.exists():
            return 0
        with FileLock(str(self.path) + ".lock", timeout=60):
            count = len(self._read())
            self._write({})
        return count

    def _write(self, entries: dict) -> None:
        text = json.dumps({"format": FORMAT, "version": VERSION, "entries": entries}, indent=1, sort_keys=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name + ".", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def tuned_schedule(problem, variant_id: str, caps, threads: int | None):
    """The tuned Schedule of the op `problem` was planned from (its view), if the cache at
    cache_path() has a fresh one; else None. A stat when the file is absent or unchanged."""
    from .. import knobs
    from ..dialects.schedule import Schedule
    from ..errors import OpError
    if problem.view is None or not knobs.use_tuned():
        return None
    cache = TuningCache()
    if not cache.entries():
        return None
    values = cache.lookup(entry_key(op_facts(problem.view.op), variant_id, caps, threads), environment(caps))
    if values is None:
        return None
    try:
        return Schedule.from_dict(values)
    except (OpError, KeyError, TypeError) as e:
        warnings.warn(f"tracea: a tuned schedule in {cache.path} is not valid ({e}); using the default", stacklevel=2)
        return None


def stamp() -> str:
    """Changes whenever the tuning cache file does: compiled kernels are keyed with it, so a
    kernel compiled before a tuning run is not reused after it."""
    from .. import knobs
    if not knobs.use_tuned():
        return "tuning cache unused"
    try:
        s = cache_path().stat()
    except OSError:
        return "no tuning cache"
    return f"{s.st_size}:{s.st_mtime_ns}"


def _valid(entry) -> bool:
    return (isinstance(entry, dict) and isinstance(entry.get("configs"), dict)
            and all(isinstance(c, dict) and "config" in c for c in entry["configs"].values()))


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
