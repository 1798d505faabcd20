"""Launching Tracea's AMD kernels (HsacoKernelArtifact) through ROCm's HIP runtime (ctypes over
libamdhip64), without MLIR: the code object loaded on device 0, numpy arrays copied in and the
result out. Where ROCm is missing, every entry point raises HipError naming what is missing;
tracea.compile_gpu(fn, chip="gfx942") still writes the code object on any machine."""
from __future__ import annotations

import ctypes
import ctypes.util
import time

import numpy as np

from ..errors import TraceaError
from .cuda_launcher import pack_parameters
from .dtypes import to_numpy
from .gpu_artifact import checked_inputs


class HipError(TraceaError, RuntimeError):
    """ROCm is missing or refused a call; the message names the call."""


_HIP = None


def _hip():
    global _HIP
    if _HIP is None:
        path = ctypes.util.find_library("amdhip64")
        for candidate in ([path] if path else []) + ["/opt/rocm/lib/libamdhip64.so"]:
            try:
                _HIP = ctypes.CDLL(candidate)
                break
            except OSError:
                continue
        else:
            raise HipError("no ROCm runtime on this machine: libamdhip64.so not found (install ROCm's HIP runtime); "
                           "tracea.compile_gpu(fn, chip='gfx942') writes the code object anywhere, and TRACEA_AMD_EMULATOR=1 "
                           "runs it on Tracea's AMD emulator")
    return _HIP


def _check(status: int, call: str) -> None:
    if status != 0:
        name = ctypes.c_char_p(_hip().hipGetErrorName(status)).value if hasattr(_hip(), "hipGetErrorName") else b""
        raise HipError(f"{call} failed: HIP error {status} {name.decode() if name else ''}")


# product names HIP reports -> the processor the code object is for
_CHIPS = {"MI300": "gfx942", "MI250": "gfx90a", "MI210": "gfx90a", "7900": "gfx1100"}


class HipDevice:
    _devices: dict[int, "HipDevice"] = {}

    def __init__(self, ordinal: int):
        import os
        hip = _hip()
        hip.hipGetErrorName.restype = ctypes.c_void_p
        _check(hip.hipInit(0), "hipInit")
        count = ctypes.c_int()
        _check(hip.hipGetDeviceCount(ctypes.byref(count)), "hipGetDeviceCount")
        if not 0 <= ordinal < count.value:
            raise HipError(f"there is no AMD GPU {ordinal}; HIP sees {count.value}")
        _check(hip.hipSetDevice(ordinal), "hipSetDevice")
        name = ctypes.create_string_buffer(256)
        _check(hip.hipDeviceGetName(name, 256, ordinal), "hipDeviceGetName")
        self.ordinal, self.name = ordinal, name.value.decode()
        # (hipDeviceProp_t's gcnArchName sits at an offset that changes between ROCm releases)
        self.chip = os.environ.get("TRACEA_AMD_CHIP") or next(
            (chip for key, chip in _CHIPS.items() if key in self.name), None)
        if self.chip is None:
            raise HipError(f"cannot tell which processor {self.name} is: set TRACEA_AMD_CHIP (gfx90a, gfx942, gfx1100)")

    @classmethod
    def get(cls, ordinal: int = 0) -> "HipDevice":
        if ordinal not in cls._devices:
            cls._devices[ordinal] = cls(ordinal)
        return cls._devices[ordinal]


class HipKernel:
    """A HsacoKernelArtifact on a HipDevice: kernel(*arrays) -> the result as a numpy array."""

    def __init__(self, artifact, device: HipDevice):
        hip = _hip()
        self.artifact, self.device = artifact, device
        self.module, self.function = ctypes.c_void_p(), ctypes.c_void_p()
        _check(hip.hipModuleLoadData(ctypes.byref(self.module), ctypes.c_char_p(artifact.hsaco)), "hipModuleLoadData")
        _check(hip.hipModuleGetFunction(ctypes.byref(self.function), self.module, artifact.name.encode()),
               f"hipModuleGetFunction({artifact.name})")
        self.seconds = 0.0
        self.stages: dict[str, str] = {}

    def __call__(self, *arrays):
        hip, a = _hip(), self.artifact
        inputs = checked_inputs(a.name, a.params, arrays)
        outputs = [p for p in a.params if p.output]
        pointers, sizes = [], []
        try:
            for data in inputs:
                pointer = ctypes.c_void_p()
                _check(hip.hipMalloc(ctypes.byref(pointer), ctypes.c_size_t(max(data.nbytes, 4))), "hipMalloc")
                pointers.append(pointer)
                _check(hip.hipMemcpyHtoD(pointer, data.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(data.nbytes)),
                       "hipMemcpyHtoD")
            for param in outputs:
                nbytes = int(np.prod(param.shape)) * to_numpy(param.dtype).itemsize
                pointer = ctypes.c_void_p()
                _check(hip.hipMalloc(ctypes.byref(pointer), ctypes.c_size_t(max(nbytes, 4))), "hipMalloc")
                pointers.append(pointer)
                sizes.append(nbytes)
            array, _values = pack_parameters(a.launch_arguments([p.value for p in pointers]))
            start = time.perf_counter()
            _check(hip.hipModuleLaunchKernel(self.function, *a.grid, *a.block, 0, None, array, None),
                   f"hipModuleLaunchKernel({a.name})")
            _check(hip.hipDeviceSynchronize(), "hipDeviceSynchronize")
            self.seconds = time.perf_counter() - start
            results = []
            for param, pointer, nbytes in zip(outputs, pointers[len(inputs):], sizes):
                out = np.empty(param.shape, to_numpy(param.dtype))
                _check(hip.hipMemcpyDtoH(out.ctypes.data_as(ctypes.c_void_p), pointer, ctypes.c_size_t(nbytes)),
                       "hipMemcpyDtoH")
                results.append(out)
            return results[0] if len(results) == 1 else tuple(results)
        finally:
            for pointer in pointers:
                hip.hipFree(pointer)
