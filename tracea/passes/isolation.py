"""Running compiler work in another process, so that an assertion in the MLIR or LLVM build
kills only that process and the caller gets an error instead.

`call_isolated(fn, args)` runs `fn(*args)` in the compiler process: a child forked once and
reused for compile after compile. A fresh fork per compile cost ~40 ms (the fork and the
copy-on-write faults of a child that then touches its parent's MLIR and LLVM state); the
long-lived child pays that once. It is replaced when it dies (the caller gets ChildDied with its
exit status and what it printed), after RESTART_AFTER calls (MLIR contexts never free what they
intern), when a Tracea pass was registered after it was forked, and in a forked copy of the
caller. A call that it cannot take (the lock is held by another thread, the arguments do not
pickle, or name a class it does not have) runs in a child forked for that call alone.

The child sees the caller's environment of the moment (sent with each call), not its later
Python state: monkeypatched code is not seen there (TRACEA_ISOLATE=0 runs in-process).
"""
from __future__ import annotations

import atexit
import faulthandler
import os
import pickle
import signal
import stat
import struct
import sys
import tempfile
import threading
import traceback

from ..dialects.context import pipeline_lock
from . import registry

RESTART_AFTER = 200


class ChildDied(Exception):
    def __init__(self, wait_status: int, log: str):
        super().__init__(f"compiler process ended with wait status {wait_status}")
        self.wait_status, self.log = wait_status, log


class _CannotRun:
    """The compiler process's answer to a call it could not unpickle (stale Python state)."""


# The descriptors of calls in flight (pipes, logs). Every forked process closes those it does
# not use: a copy held open elsewhere (in the long-lived compiler process, say) would keep the
# end-of-file that reports a crashed child from ever arriving.
_open_fds: set[int] = set()
_keep_in_child: frozenset[int] = frozenset()


def _open(*fds: int) -> None:
    _open_fds.update(fds)


def _close(*fds: int) -> None:
    for fd in fds:
        _open_fds.discard(fd)
        os.close(fd)


def _fork_child(child_body, keep: tuple[int, ...]) -> int:
    """Fork; the child keeps only the descriptors in `keep` of this module's, runs child_body()
    and never returns."""
    global _keep_in_child
    sys.stdout.flush()
    sys.stderr.flush()
    # No other thread may be using the shared pipeline context (it has no locks of its own)
    # while the child takes its copy; released in both processes.
    with pipeline_lock:
        _keep_in_child = frozenset(keep)
        pid = os.fork()
        _keep_in_child = frozenset()
    if pid:
        return pid
    status = 0
    try:
        _close_inherited_pipes(keep)
        faulthandler.disable()  # a crash here is expected and reported by the parent
        child_body()
    except BaseException:  # noqa: BLE001 - the child must never return into the caller
        status = 1
        traceback.print_exc()
    finally:
        sys.stderr.flush()
        os._exit(status)


def _close_inherited_pipes(keep: tuple[int, ...]) -> None:
    """Close the pipes and sockets this child inherited, but its own and stdin/out/err. Another
    thread of the caller may have been starting a subprocess at the fork: Popen waits for the end
    of file on a pipe that only the exec of its child closes, and a copy of that pipe held by a
    long-lived compiler process would make it wait for ever."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:  # no /proc: the descriptors a process usually has
        fds = list(range(3, 1024))
    for fd in fds:
        if fd < 3 or fd in keep:
            continue
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            continue
        if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
            os.close(fd)


# Raw descriptors only, no Python file objects: a thread of the caller may be blocked reading one
# when another thread forks, and the child could then never close a buffered file (its lock
# stays held in the copy).
def _send(fd: int, payload: bytes) -> None:
    view = memoryview(struct.pack("<Q", len(payload)) + payload)
    while view:
        view = view[os.write(fd, view):]


def _receive(fd: int) -> bytes:
    """One framed message; EOFError when the other end closed first."""
    def exactly(n: int) -> bytes:
        chunks = []
        while n:
            chunk = os.read(fd, min(n, 1 << 20))
            if not chunk:
                raise EOFError
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)
    return exactly(struct.unpack("<Q", exactly(8))[0])


def _log_file() -> int:
    """A file for a compiler child's stderr: in memory where the OS can (a full or unwritable
    temporary directory then costs no compile: the fuzzer's disk filled up), else in /tmp."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("tracea-compiler-log")
    else:
        fd, path = tempfile.mkstemp(prefix="tracea-compiler-", suffix=".log")
        os.unlink(path)
    _open(fd)
    return fd


def _pipe() -> tuple[int, int]:
    read_fd, write_fd = os.pipe()
    _open(read_fd, write_fd)
    return read_fd, write_fd


def _read_log(fd: int) -> str:
    size = os.fstat(fd).st_size
    return os.pread(fd, size, 0).decode(errors="replace") if size else ""


class _CompilerProcess:
    def __init__(self):
        self.generation = registry.generation()
        self.calls = 0
        self.log = _log_file()
        request_read, self.requests = _pipe()
        self.results, result_write = _pipe()

        def serve():
            os.dup2(self.log, 2)
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # the caller decides what an interrupt ends
            while True:
                try:
                    payload = _receive(request_read)
                except EOFError:
                    return  # the caller closed the pipe: it exited or replaced this process
                os.ftruncate(2, 0)
                os.lseek(2, 0, os.SEEK_SET)
                try:
                    environ, fn, args = pickle.loads(payload)
                except (AttributeError, ImportError, pickle.UnpicklingError):
                    result = _CannotRun()
                else:
                    os.environ.clear()
                    os.environ.update(environ)
                    result = fn(*args)
                sys.stderr.flush()
                _send(result_write, pickle.dumps(result))

        self.pid = _fork_child(serve, keep=(request_read, result_write, self.log))
        _close(request_read, result_write)

    def usable(self) -> bool:
        return self.generation == registry.generation() and self.calls < RESTART_AFTER

    def call(self, payload: bytes):
        """fn(*args) from the pickled payload (or _CannotRun), and what it printed; raises ChildDied."""
        self.calls += 1
        try:
            _send(self.requests, payload)
            return pickle.loads(_receive(self.results)), _read_log(self.log)
        except (EOFError, BrokenPipeError):
            _, wait_status = os.waitpid(self.pid, 0)
            log = _read_log(self.log)
            self.close(kill=False)
            raise ChildDied(wait_status, log) from None
        except BaseException:  # interrupted while it works: its answer would come to the next call
            self.close()
            raise

    def close(self, kill: bool = True) -> None:
        if kill:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        _close(self.requests, self.results, self.log)


_process: _CompilerProcess | None = None
_process_lock = threading.Lock()


def call_isolated(fn, args: tuple):
    """fn(*args) in a compiler process -> (result, what it printed on stderr); raises ChildDied."""
    global _process
    if not _process_lock.acquire(blocking=False):
        return _call_in_new_child(fn, args)
    try:
        try:
            payload = pickle.dumps((dict(os.environ), fn, args))
        except (pickle.PicklingError, AttributeError, TypeError):
            return _call_in_new_child(fn, args)
        if _process is not None and not _process.usable():
            _process.close()
            _process = None
        if _process is None:
            _process = _CompilerProcess()
        try:
            result, log = _process.call(payload)
        except BaseException:
            _process = None
            raise
        if isinstance(result, _CannotRun):
            _process.close()
            _process = None
            return _call_in_new_child(fn, args)
        return result, log
    finally:
        _process_lock.release()


def call_in_fork(fn, args: tuple):
    """fn(*args) in a child forked for this call alone (so `args` need not pickle, only the
    result) -> (result, what it printed on stderr); raises ChildDied."""
    return _call_in_new_child(fn, args)


def _call_in_new_child(fn, args: tuple):
    return start_in_fork(fn, args)()


def start_in_fork(fn, args: tuple):
    """fn(*args) in a child forked now, running while this process goes on; returns a function
    that waits for it -> (result, what it printed on stderr), or raises ChildDied."""
    read_fd, write_fd = _pipe()
    log = _log_file()

    def work():
        os.dup2(log, 2)
        _send(write_fd, pickle.dumps(fn(*args)))

    pid = _fork_child(work, keep=(write_fd, log))
    _close(write_fd)

    def wait():
        try:
            payload = _receive(read_fd)
        except EOFError:
            payload = None
        _close(read_fd)
        _, wait_status = os.waitpid(pid, 0)
        text = _read_log(log)
        _close(log)
        if payload is not None and os.WIFEXITED(wait_status) and os.WEXITSTATUS(wait_status) == 0:
            return pickle.loads(payload), text
        raise ChildDied(wait_status, text)
    return wait


def compiler_process_id() -> int | None:
    """The pid of the long-lived compiler process, if one is running (for tests and debugging)."""
    return _process.pid if _process is not None else None


def _forget_in_child() -> None:
    global _process, _process_lock
    _process_lock = threading.Lock()
    _process = None  # the caller's: never used, closed or killed from a forked copy
    for fd in _open_fds - _keep_in_child:
        os.close(fd)
    _open_fds.intersection_update(_keep_in_child)


def _shutdown() -> None:
    if _process is not None:
        _process.close()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
atexit.register(_shutdown)
