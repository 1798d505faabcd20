"""A compiled CPU kernel: a callable on numpy arrays, backed by JIT-compiled code.

The calling convention is MLIR's C interface: every tensor argument and result is a ranked
memref descriptor {allocated, aligned, offset, sizes[rank], strides[rank]}; results are written
into caller-allocated arrays (destination passing), so no memory crosses the boundary.
"""
from __future__ import annotations

import ctypes
import math
import os
import platform
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .. import knobs
from ..dialects.ops import TensorSpec
from ..errors import ArgumentError
from . import aot, blas_threads, faults, placement
from .dtypes import to_numpy
from .libraries import loaded_library

_DESCRIPTOR_TYPES: dict[int, type] = {}
_malloc_tuned = False


def tune_malloc() -> None:
    """Keep freed kernel buffers in the process (see tracea.knobs.tune_malloc); glibc only."""
    global _malloc_tuned
    if _malloc_tuned or not knobs.tune_malloc():
        return
    _malloc_tuned = True
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except AttributeError:  # not glibc
        return
    M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
    mallopt(M_TRIM_THRESHOLD, 128 << 20)
    mallopt(M_MMAP_THRESHOLD, 32 << 20)
    # Freed heap is trimmed back to the top pad (128 KiB by default): a model whose call needs
    # more anew touched fresh pages each call (2 threads, batch 8: Llama 4 layers 39 % of its
    # time in the kernel's page-fault path, 173 -> 111 ms with 256 MiB of pad, eager 116;
    # ResNet-50 at 128x128 445 -> 224 ms with 1 GiB, eager 205). What a call touched, up to the
    # pad, stays resident: at most 1 GiB and an eighth of the machine's memory.
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 8 << 30
    mallopt(M_TOP_PAD, min(1 << 30, physical // 8))


def descriptor_type(rank: int) -> type:
    if rank not in _DESCRIPTOR_TYPES:
        fields = [("allocated", ctypes.c_void_p), ("aligned", ctypes.c_void_p), ("offset", ctypes.c_int64)]
        if rank:
            fields += [("sizes", ctypes.c_int64 * rank), ("strides", ctypes.c_int64 * rank)]
        _DESCRIPTOR_TYPES[rank] = type(f"MemRef{rank}D", (ctypes.Structure,), {"_fields_": fields})
    return _DESCRIPTOR_TYPES[rank]


def _array_data_offset() -> int | None:
    """Where a numpy array object keeps its data pointer, in bytes from the object's start (16 on
    CPython: after the reference count and the type; numpy's PyArray_DATA reads it there), found
    on probe arrays; None if no offset holds it for all of them (then nothing relies on it), or
    off CPython, where id() is not an object's address."""
    if platform.python_implementation() != "CPython":
        return None
    probes = [np.empty(n, np.float32) for n in (3, 5)] + [np.arange(4.0)[1:]]
    for offset in range(8, 64, 8):
        if all(ctypes.c_void_p.from_address(id(a) + offset).value == a.ctypes.data for a in probes):
            return offset
    return None


DATA_OFFSET = _array_data_offset()
_pointer_at = ctypes.c_void_p.from_address


def data_address(array: np.ndarray) -> int:
    """The address of an array's first element (read from the array object: 5x cheaper than
    numpy's .ctypes)."""
    if DATA_OFFSET is None:
        return array.ctypes.data
    return _pointer_at(id(array) + DATA_OFFSET).value or 0


def _fits(shape: tuple, spec_shape: tuple) -> bool:
    """Whether an array shape matches a signature's (None: any size there)."""
    return len(shape) == len(spec_shape) and all(w is None or w == d for d, w in zip(shape, spec_shape))


def _contiguous_strides(shape) -> list[int]:
    """Element strides of a C-contiguous array of `shape`."""
    strides, stride = [], 1
    for size in reversed(shape):
        strides.append(stride)
        stride *= size
    return strides[::-1]


class CallFrame:
    """The C-interface arguments of one call: a memref descriptor per tensor (sizes and strides
    fixed by the signature) and the packed array of pointers to them. Made once per kernel and
    thread; a call only writes the data addresses, which keeps small kernels cheap to call."""

    def __init__(self, specs: Sequence[TensorSpec]):
        self.descriptors = []
        self.dynamic = [i for i, spec in enumerate(specs) if None in spec.shape]  # sizes set per call
        for spec in specs:
            desc = descriptor_type(spec.rank)()
            if spec.rank and None not in spec.shape:
                desc.sizes[:] = spec.shape
                desc.strides[:] = _contiguous_strides(spec.shape)
            self.descriptors.append(desc)
        self._pointers = [ctypes.c_void_p(ctypes.addressof(d)) for d in self.descriptors]
        self.packed = (ctypes.c_void_p * len(specs))(*[ctypes.addressof(p) for p in self._pointers])

    def bind(self, arrays: Sequence[np.ndarray]):
        """Point the descriptors at C-contiguous arrays of the signature's shapes."""
        for desc, array in zip(self.descriptors, arrays):
            desc.allocated = desc.aligned = data_address(array)
        return self.bind_sizes(arrays)

    def bind_sizes(self, arrays: Sequence[np.ndarray]):
        """The sizes of the dynamic dimensions (the entry taking arrays sets the addresses)."""
        for i in self.dynamic:
            desc, shape = self.descriptors[i], arrays[i].shape
            desc.sizes[:] = shape
            desc.strides[:] = _contiguous_strides(shape)
        return self.packed


RESULT_ALIGNMENT = 64  # bytes: a cache line, an AVX-512 vector


def aligned_empty(shape, dtype) -> np.ndarray:
    """An uninitialized C-contiguous array whose data starts on a cache line. numpy's own start
    where malloc puts them (16 bytes in): a kernel reading a result of the last one then loads
    vectors that straddle two lines (a depthwise conv on inputs 16 bytes off a line: 1.85x
    slower on Zen 5, AVX-512)."""
    dtype = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
    size = math.prod(shape) * dtype.itemsize  # math.prod and data_address: ~3 us less a call than np.prod and .ctypes
    raw = np.empty(size + RESULT_ALIGNMENT, np.uint8)
    return np.ndarray(shape, dtype, raw, -data_address(raw) % RESULT_ALIGNMENT)


@dataclass
class Signature:
    name: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    arg_names: list[str] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)  # the messages of its run-time checks (cf.assert)

    def describe(self) -> str:
        args = ", ".join(f"{n}: {s}" for n, s in zip(self.arg_names or [f"arg{i}" for i in range(len(self.inputs))],
                                                    self.inputs))
        return f"{self.name}({args}) -> {', '.join(map(str, self.outputs))}"


class Kernel:
    """Call with numpy arrays; returns one array or a tuple (one per function result)."""

    def __init__(self, signature: Signature, entry_address: int, keep_alive: Any, target: str,
                 stages: dict[str, str] | None = None, compile_seconds: float = 0.0, entry_symbol: str = "",
                 runtime_libraries: Sequence[str] = (), object_code: bytes | None = None, threads: int = 1,
                 openmp: str | None = None, objects_address: int | None = None):
        self.signature = signature
        self.target = target
        self.entry_symbol = entry_symbol  # the C-ABI function (pointers to memref descriptors)
        self.origin = "compiled"  # or "disk cache", "shared library": where the code came from
        self.runtime_libraries = list(runtime_libraries)  # shared libraries the code calls into
        self.stages = stages or {}  # stage name -> IR text, when compiled with keep_stages
        self.plan = ""  # what the passes decided (passes/plan.py), kept always: explain() reports it
        self.compile_seconds = compile_seconds
        self.object_code = object_code  # the compiled code, when kept (what export links)
        self.threads = threads  # the size of its parallel regions' thread teams
        # whose threads run its parallel regions: "llvm" (libomp), "gnu" (runtime/gnu_openmp.py), None
        self.openmp = openmp
        self._keep_alive = keep_alive  # what owns the code: a JIT library, a shared library
        # returns the faults of the call, bit by bit (runtime/faults.py, targets/cpu/native.py: packed_entry)
        self._entry = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p)(entry_address)
        # the same, given the arrays themselves (targets/cpu/native.py: objects_entry)
        arrays = len(signature.inputs) + len(signature.outputs)
        self._entry_on_arrays = None if objects_address is None or DATA_OFFSET is None else ctypes.CFUNCTYPE(
            ctypes.c_int32, ctypes.c_void_p, ctypes.c_int64, *[ctypes.py_object] * arrays)(objects_address)
        self._in_dtypes = [to_numpy(s.dtype) for s in signature.inputs]
        self._out_dtypes = [to_numpy(s.dtype) for s in signature.outputs]
        self._dynamic_outputs = [i for i, s in enumerate(signature.outputs) if None in s.shape]
        self._input_specs = [(i, s, d) for i, (s, d) in enumerate(zip(signature.inputs, self._in_dtypes))]
        self._output_specs = [(s.shape, d) for s, d in zip(signature.outputs, self._out_dtypes)]
        self._frames = threading.local()  # one CallFrame per calling thread
        libomp = [path for path in self.runtime_libraries if Path(path).name == "libomp.so"]
        # libomp's team is placed (runtime/placement.py); GNU OpenMP's threads are torch's own
        self._libomp = loaded_library(libomp[0]) if threads > 1 and libomp and openmp != "gnu" else None
        if self._libomp is not None or (threads > 1 and openmp == "gnu"):
            blas_threads.share_with_openblas(self._libomp)
        tune_malloc()

    def export(self, path) -> "Path":
        """Write this kernel as a shared library with a C entry point (plus .h and .json beside
        it; runtime/aot.py); `Kernel.load(path)` runs it in another process without compiling."""
        return aot.export(self, path)

    @classmethod
    def load(cls, path, expect: dict | None = None) -> "Kernel":
        """A kernel exported with `Kernel.export` (ctypes: nothing is compiled). Raises TraceaError
        naming the problem when the description or the library is missing, damaged or edited, or
        when a field differs from `expect`."""
        library = aot.read(path, expect)
        meta = library.meta
        signature = Signature(meta["name"], [TensorSpec(tuple(s), d) for s, d in meta["inputs"]],
                              [TensorSpec(tuple(s), d) for s, d in meta["outputs"]], meta["arg_names"],
                              meta.get("checks", []))
        kernel = cls(signature, library.address, library.handle, "cpu (shared library)", entry_symbol=meta["symbol"],
                     runtime_libraries=meta["runtime_libraries"], threads=meta.get("threads", 1),
                     openmp="llvm" if any(Path(p).name == "libomp.so" for p in meta["runtime_libraries"]) else None,
                     objects_address=library.objects_address)
        kernel.origin = "shared library"
        kernel.library_path = library.path
        kernel.plan = meta.get("plan", "")
        return kernel

    def __repr__(self) -> str:
        return f"<tracea.Kernel {self.signature.describe()} on {self.target}>"

    def _check(self, i: int, array, spec: TensorSpec, dtype: np.dtype, role: str) -> np.ndarray:
        if (type(array) is np.ndarray and array.shape == spec.shape and array.dtype == dtype
                and array.flags.c_contiguous and (role == "argument" or array.flags.writeable)):
            return array  # the common case, checked first: calls of small kernels are dominated by this
        name = self.signature.arg_names[i] if role == "argument" and self.signature.arg_names else f"#{i}"
        if not isinstance(array, np.ndarray):
            if hasattr(array, "__array__") or isinstance(array, (list, tuple, float, int)):
                array = np.asarray(array)
            else:
                raise ArgumentError(f"{self.signature.name}: {role} {name} must be a numpy array, "
                                    f"got {type(array).__name__}")
        if not _fits(array.shape, spec.shape) or array.dtype != dtype:
            shape = "(" + ", ".join("?" if d is None else str(d) for d in spec.shape) + ")"
            raise ArgumentError(f"{self.signature.name}: {role} {name} must be a {dtype} array of shape "
                                f"{shape}, got {array.dtype} {array.shape}")
        if role == "output" and not (array.flags.c_contiguous and array.flags.writeable):
            raise ArgumentError(f"{self.signature.name}: output {name} must be a writeable C-contiguous array")
        return np.ascontiguousarray(array)  # a copy only for non-contiguous inputs

    def __call__(self, *args, out: Sequence[np.ndarray] | np.ndarray | None = None):
        sig = self.signature
        if len(args) != len(sig.inputs):
            raise ArgumentError(f"{sig.name} takes {len(sig.inputs)} argument(s) ({sig.describe()}), "
                                f"got {len(args)}")
        check = self._check
        inputs = [check(i, a, s, d, "argument") for (i, s, d), a in zip(self._input_specs, args)]
        if out is None:
            if dynamic := self._dynamic_outputs:
                raise ArgumentError(f"{sig.name}: result #{dynamic[0]} has a dynamic shape ({sig.outputs[dynamic[0]]}); "
                                    "pass arrays of the result shapes with out=")
            outputs = [aligned_empty(shape, d) for shape, d in self._output_specs]
        else:
            given = [out] if isinstance(out, np.ndarray) else list(out)
            if len(given) != len(sig.outputs):
                raise ArgumentError(f"{sig.name} has {len(sig.outputs)} result(s), got {len(given)} out array(s)")
            outputs = [self._check(i, a, s, d, "output")
                       for i, (a, s, d) in enumerate(zip(given, sig.outputs, self._out_dtypes))]
            # Kernels write results in place while reading inputs: outputs may alias nothing.
            for i, o in enumerate(outputs):
                if any(np.may_share_memory(o, x) for x in inputs + outputs[:i]):
                    raise ArgumentError(f"{sig.name}: output #{i} overlaps an input or another output; "
                                        "pass a separate array")
        frame = getattr(self._frames, "frame", None)
        if frame is None:
            frame = self._frames.frame = CallFrame(sig.inputs + sig.outputs)
            frame.team = placement.team_of_this_thread(self._libomp, self.threads) if self._libomp else None
        team = frame.team
        if team is not None and (cpu := placement.current_cpu()) != team.cpu:
            team.place(cpu)  # keep the OpenMP workers off the caller's CPU (see runtime/placement.py)
        if self._entry_on_arrays is not None:
            status = self._entry_on_arrays(frame.bind_sizes(inputs + outputs) if frame.dynamic else frame.packed,
                                           DATA_OFFSET, *inputs, *outputs)
        else:
            status = self._entry(frame.bind(inputs + outputs))
        if status:
            faults.raise_for(status, sig.name, sig.checks)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)
