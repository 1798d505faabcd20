"""Launching Tracea's NVIDIA kernels through the CUDA driver API (cuda-bindings), without MLIR.

    artifact = GpuKernelArtifact.load("gemm")          # written by tracea.compile_gpu(...).save()
    kernel = CudaKernel(artifact)                      # loads the cubin on device 0
    c = kernel(a, b)                                   # torch / cupy tensors (zero-copy) or DeviceBuffers

This file and gpu_artifact.py are all a GPU machine needs (with numpy and cuda-bindings): put
tracea/runtime on sys.path and `import cuda_launcher` where Tracea's compiler is not installed.

Memory: a DeviceBuffer either owns a cuMemAlloc allocation (freed by free(), by leaving its
`with` block, or at the latest when collected) or borrows a tensor's memory through DLPack,
keeping the tensor alive while the buffer lives. Kernels check each argument's shape, dtype,
device and layout against the artifact before launching.

Binary compatibility: a cubin runs only on its own major architecture, so an sm_80 kernel on a
Hopper GPU is loaded from its PTX (the driver compiles it for the device); sm_90a code runs on
compute capability 9.0 only.
"""
from __future__ import annotations

import ctypes
import math

import numpy as np

try:
    from ..errors import ArgumentError, TraceaError
    from .gpu_artifact import GpuKernelArtifact, Param
except ImportError:  # this file beside gpu_artifact.py on a machine without Tracea's compiler
    from gpu_artifact import ArgumentError, GpuKernelArtifact, Param, TraceaError  # type: ignore


class CudaError(TraceaError):
    """The CUDA driver is missing or refused a call; the message names the call and the fix."""


_DEFAULT_DYNAMIC_SHARED = 48 * 1024  # above this a kernel must opt in (cuFuncSetAttribute)


def _driver():
    try:
        from cuda.bindings import driver
    except ImportError:
        raise CudaError("launching NVIDIA kernels needs cuda-bindings: pip install 'cuda-bindings==13.0.3'") from None
    return driver


def _check(result, call: str):
    """The values of a driver call (cuda-bindings returns (CUresult, *values)), or CudaError."""
    driver = _driver()
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(err)
        _, text = driver.cuGetErrorString(err)
        name = name.decode() if isinstance(name, bytes) else str(err)
        text = text.decode() if isinstance(text, bytes) else ""
        raise CudaError(f"{call} failed: {name}: {text}")
    return values[0] if len(values) == 1 else tuple(values)


# -- devices -------------------------------------------------------------------------------

class Device:
    """One GPU and its primary context (the one the CUDA runtime, torch and cupy use too, so
    their pointers are valid in Tracea's launches)."""

    _open: dict[int, "Device"] = {}

    def __init__(self, ordinal: int):
        driver = _driver()
        try:
            _check(driver.cuInit(0), "cuInit")
        except RuntimeError as e:  # cuda-bindings could not load libcuda
            raise CudaError(f"no CUDA driver on this machine ({e}); NVIDIA kernels need an NVIDIA GPU "
                            "and its driver") from None
        count = _check(driver.cuDeviceGetCount(), "cuDeviceGetCount")
        if not 0 <= ordinal < count:
            raise CudaError(f"there is no CUDA device {ordinal}: this machine has {count}")
        self.ordinal = ordinal
        self.handle = _check(driver.cuDeviceGet(ordinal), "cuDeviceGet")
        self.context = _check(driver.cuDevicePrimaryCtxRetain(self.handle), "cuDevicePrimaryCtxRetain")
        attr = driver.CUdevice_attribute
        self.compute_capability = (self._attribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                                   self._attribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR))
        self.multiprocessors = self._attribute(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        self.max_shared_bytes_per_block = self._attribute(attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        name = _check(driver.cuDeviceGetName(256, self.handle), "cuDeviceGetName")
        self.name = name.split(b"\0", 1)[0].decode(errors="replace")

    @classmethod
    def get(cls, ordinal: int = 0) -> "Device":
        if ordinal not in cls._open:
            cls._open[ordinal] = Device(ordinal)
        device = cls._open[ordinal]
        device.make_current()
        return device

    def _attribute(self, which) -> int:
        return _check(_driver().cuDeviceGetAttribute(which, self.handle), "cuDeviceGetAttribute")

    def make_current(self) -> None:
        _check(_driver().cuCtxSetCurrent(self.context), "cuCtxSetCurrent")

    def synchronize(self) -> None:
        self.make_current()
        _check(_driver().cuCtxSynchronize(), "cuCtxSynchronize (a kernel may have faulted)")

    @property
    def chip(self) -> str:
        """The Tracea NVIDIA target for this device: sm_90a on Hopper (wgmma, TMA), sm_80 on the
        other GPUs from Ampere on."""
        if self.compute_capability == (9, 0):
            return "sm_90a"
        if self.compute_capability >= (8, 0):
            return "sm_80"
        raise CudaError(f"{self} is older than sm_80 (Ampere); Tracea's NVIDIA kernels need sm_80 or newer")

    def runs(self, chip: str) -> str | None:
        """How this device runs code built for `chip`: "cubin", "ptx" (compiled by the driver
        for this device), or None (it cannot)."""
        major, minor = self.compute_capability
        number = chip[3:].rstrip("a")  # "sm_90a" -> "90": major 9, minor 0
        want_major, want_minor = int(number[:-1]), int(number[-1])
        if chip.endswith("a"):  # architecture-specific features: this exact chip only
            return "cubin" if (major, minor) == (want_major, want_minor) else None
        if major == want_major and minor >= want_minor:
            return "cubin"
        return "ptx" if (major, minor) > (want_major, want_minor) else None

    def __repr__(self) -> str:
        return f"Device({self.ordinal}: {self.name}, sm_{self.compute_capability[0]}{self.compute_capability[1]})"


# -- buffers -------------------------------------------------------------------------------

_ITEM_BYTES = {"f16": 2, "bf16": 2, "f32": 4, "f64": 8, "i8": 1, "i16": 2, "i32": 4, "i64": 8, "i1": 1}
# DLPack's (type code, bits) -> Tracea's element type
_DLPACK_DTYPES = {(2, 16): "f16", (4, 16): "bf16", (2, 32): "f32", (2, 64): "f64", (0, 8): "i8",
                  (0, 16): "i16", (0, 32): "i32", (0, 64): "i64", (6, 8): "i1", (1, 8): "i1"}
_DL_CPU, _DL_CUDA, _DL_CUDA_MANAGED = 1, 2, 13


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


def _numpy_dtype(dtype: str) -> np.dtype:
    if dtype == "bf16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype({"f16": np.float16, "f32": np.float32, "f64": np.float64, "i8": np.int8, "i16": np.int16,
                     "i32": np.int32, "i64": np.int64, "i1": np.bool_}[dtype])


def _dtype_of_numpy(dtype: np.dtype) -> str:
    for name in _ITEM_BYTES:
        if _numpy_dtype(name) == dtype:
            return name
    raise ArgumentError(f"numpy dtype {dtype} has no Tracea GPU equivalent; supported: {', '.join(_ITEM_BYTES)}")


class DeviceBuffer:
    """A dense, row-major tensor in GPU memory: `ptr`, `shape`, `dtype`, `device`."""

    def __init__(self, ptr: int, shape: tuple[int, ...], dtype: str, device: Device, owner=None, owned=False):
        self.ptr, self.shape, self.dtype, self.device = ptr, tuple(shape), dtype, device
        self._owner = owner  # what keeps borrowed memory alive (a DLPack capsule)
        self._owned = owned

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * _ITEM_BYTES[self.dtype]

    @classmethod
    def empty(cls, shape, dtype: str, device: int | Device = 0) -> "DeviceBuffer":
        if dtype not in _ITEM_BYTES:
            raise ArgumentError(f"unknown element type {dtype!r}; supported: {', '.join(_ITEM_BYTES)}")
        device = device if isinstance(device, Device) else Device.get(device)
        device.make_current()
        nbytes = max(1, math.prod(shape) * _ITEM_BYTES[dtype])
        ptr = int(_check(_driver().cuMemAlloc(nbytes), f"cuMemAlloc({nbytes} bytes)"))
        return cls(ptr, tuple(shape), dtype, device, owned=True)

    @classmethod
    def from_numpy(cls, array, device: int | Device = 0) -> "DeviceBuffer":
        array = np.ascontiguousarray(array)
        buffer = cls.empty(array.shape, _dtype_of_numpy(array.dtype), device)
        if array.nbytes:
            _check(_driver().cuMemcpyHtoD(buffer.ptr, array.ctypes.data, array.nbytes), "cuMemcpyHtoD")
        return buffer

    def to_numpy(self) -> np.ndarray:
        self._alive()
        out = np.empty(self.shape, _numpy_dtype(self.dtype))
        self.device.make_current()
        if out.nbytes:
            _check(_driver().cuMemcpyDtoH(out.ctypes.data, self.ptr, out.nbytes), "cuMemcpyDtoH")
        return out

    @classmethod
    def from_dlpack(cls, tensor, name: str = "tensor") -> "DeviceBuffer":
        """Borrow a CUDA tensor's memory (torch, cupy, jax: anything with __dlpack__), no copy."""
        if not hasattr(tensor, "__dlpack__"):
            raise ArgumentError(f"{name} is a {type(tensor).__name__}; pass a DeviceBuffer or a CUDA tensor "
                                "(torch, cupy: anything with __dlpack__)")
        kind, ordinal = tensor.__dlpack_device__() if hasattr(tensor, "__dlpack_device__") else (None, None)
        if kind not in (None, _DL_CUDA, _DL_CUDA_MANAGED):
            where = "in host memory" if kind == _DL_CPU else f"on DLPack device type {kind}"
            raise ArgumentError(f"{name} is {where}; NVIDIA kernels need it on the GPU (e.g. x.cuda(), "
                                "or DeviceBuffer.from_numpy(x))")
        capsule = tensor.__dlpack__()
        ctypes.pythonapi.PyCapsule_GetPointer.restype = ctypes.c_void_p
        ctypes.pythonapi.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
        address = ctypes.pythonapi.PyCapsule_GetPointer(capsule, b"dltensor")
        # DLManagedTensor starts with its DLTensor; the capsule (kept in the buffer) frees it
        dl = _DLTensor.from_address(address)
        shape = tuple(dl.shape[i] for i in range(dl.ndim))
        dtype = _DLPACK_DTYPES.get((dl.dtype.code, dl.dtype.bits)) if dl.dtype.lanes == 1 else None
        if dtype is None:
            raise ArgumentError(f"{name} has a DLPack element type (code {dl.dtype.code}, {dl.dtype.bits} bits, "
                                f"{dl.dtype.lanes} lanes) that Tracea's kernels do not take")
        if dl.strides:
            expected = [math.prod(shape[i + 1:]) for i in range(len(shape))]
            actual = [dl.strides[i] for i in range(dl.ndim)]
            if any(a != e for a, e, n in zip(actual, expected, shape) if n > 1):
                raise ArgumentError(f"{name} is not contiguous (strides {actual}, expected {expected}); "
                                    "pass x.contiguous()")
        device = Device.get(dl.device.device_id)
        return cls(dl.data + dl.byte_offset, shape, dtype, device, owner=capsule)

    def free(self) -> None:
        """Release the memory now (borrowed memory: release the tensor). Idempotent."""
        if self._owned and self.ptr:
            self.device.make_current()
            _check(_driver().cuMemFree(self.ptr), "cuMemFree")
        self.ptr, self._owner, self._owned = 0, None, False

    def _alive(self) -> None:
        if not self.ptr:
            raise ArgumentError("this DeviceBuffer was freed")

    def __enter__(self) -> "DeviceBuffer":
        return self

    def __exit__(self, *exc) -> None:
        self.free()

    def __del__(self):
        try:
            self.free()
        except Exception:  # noqa: BLE001 - at interpreter exit the driver may already be gone
            pass

    def __repr__(self) -> str:
        state = "freed" if not self.ptr else f"0x{self.ptr:x}"
        return f"DeviceBuffer({state}, shape={self.shape}, dtype={self.dtype}, device={self.device.ordinal})"


# -- kernels -------------------------------------------------------------------------------

_CTYPES = {"ptr": ctypes.c_void_p, "i64": ctypes.c_int64, "i32": ctypes.c_int32, "f32": ctypes.c_float,
           "f64": ctypes.c_double}


def pack_parameters(arguments: list[tuple[str, int | float]]):
    """cuLaunchKernel's `void **kernelParams` for (C type, value) pairs: (the array, the values
    it points to; both must live until the launch call returns)."""
    values = [_CTYPES[kind](value) for kind, value in arguments]
    array = (ctypes.c_void_p * max(1, len(values)))(*[ctypes.addressof(v) for v in values])
    return array, values


def tensor_map_arguments(ptr: int, shape: tuple[int, ...], dtype: str, spec: tuple[int, ...]) -> tuple:
    """cuTensorMapEncodeTiled's arguments for a row-major tensor at `ptr` and a Param.tensor_map
    spec (operand, box inner, box outer, swizzle bytes[, rank]): rank 2 sees the tensor as a
    matrix of its last dim's columns, rank 3 as a stack of its [rows, cols] matrices (boxes one
    matrix deep, zero-filled past its rows rather than reading the next one's)."""
    driver = _driver()
    types = driver.CUtensorMapDataType
    data_type = {"f16": types.CU_TENSOR_MAP_DATA_TYPE_FLOAT16, "bf16": types.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                 "f32": types.CU_TENSOR_MAP_DATA_TYPE_FLOAT32}[dtype]
    swizzles = driver.CUtensorMapSwizzle
    swizzle = {0: swizzles.CU_TENSOR_MAP_SWIZZLE_NONE, 32: swizzles.CU_TENSOR_MAP_SWIZZLE_32B,
               64: swizzles.CU_TENSOR_MAP_SWIZZLE_64B, 128: swizzles.CU_TENSOR_MAP_SWIZZLE_128B}[spec[3]]
    u64, u32 = driver.cuuint64_t, driver.cuuint32_t
    row_bytes = shape[-1] * _ITEM_BYTES[dtype]
    if len(spec) > 4 and spec[4] == 3:
        dims = [shape[-1], shape[-2], math.prod(shape[:-2])]
        strides, box = [row_bytes, row_bytes * shape[-2]], [spec[1], spec[2], 1]
    else:
        dims, strides, box = [shape[-1], math.prod(shape[:-1])], [row_bytes], [spec[1], spec[2]]
    return (data_type, len(dims), ptr, [u64(d) for d in dims], [u64(s) for s in strides], [u32(b) for b in box],
            [u32(1)] * len(dims), driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
            driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)  # zeros outside the tensor


class CudaKernel:
    """A GpuKernelArtifact loaded on a device, callable with tensors. Kernels that read their
    operands through TMA get each operand's descriptor encoded on the host and copied to device
    memory, once per (address, shape) of the tensor."""

    def __init__(self, artifact: GpuKernelArtifact, device: int | Device = 0):
        driver = _driver()
        self.artifact = artifact
        self.device = device if isinstance(device, Device) else Device.get(device)
        how = self.device.runs(artifact.chip)
        if how is None:
            raise CudaError(f"{artifact.name} was compiled for {artifact.chip}, which {self.device} cannot run; "
                            f"compile it with tracea.compile_gpu(..., chip='sm_80') (any GPU from sm_80) or for "
                            f"this device's chip")
        limit = self.device.max_shared_bytes_per_block
        if artifact.static_shared_bytes + artifact.dynamic_shared_bytes > limit:
            raise CudaError(f"{artifact.name} needs {(artifact.static_shared_bytes + artifact.dynamic_shared_bytes) / 1024:.0f} KB "
                            f"shared memory, {self.device.name} allows {limit // 1024} KB per block; reduce stages")
        image = artifact.cubin if how == "cubin" else artifact.ptx.encode() + b"\0"
        self.device.make_current()
        self.module = _check(driver.cuModuleLoadData(image), f"cuModuleLoadData ({how} for {artifact.chip})")
        self.function = _check(driver.cuModuleGetFunction(self.module, artifact.name.encode()),
                               f"cuModuleGetFunction({artifact.name})")
        if artifact.dynamic_shared_bytes > _DEFAULT_DYNAMIC_SHARED:
            _check(driver.cuFuncSetAttribute(
                self.function, driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                artifact.dynamic_shared_bytes), "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)")
        self.loaded_from = how
        self.stages: dict[str, str] = {}  # stage -> IR text, when compiled with keep_stages
        self._tensor_maps: dict[tuple, int] = {}  # (ptr, shape, dtype, spec) -> device address

    def _buffers(self, args, out):
        params = [p for p in self.artifact.params if p.tensor_map is None]
        inputs, outputs = [p for p in params if not p.output], [p for p in params if p.output]
        if len(args) != len(inputs):
            raise ArgumentError(f"{self.artifact.name} takes {len(inputs)} input(s) "
                                f"({', '.join(p.name for p in inputs)}), got {len(args)}")
        torch_like = any(type(a).__module__.startswith("torch") for a in args)
        buffers = [self._as_buffer(a, p) for a, p in zip(args, inputs)]
        if out is None:
            out = [self._allocate(p, torch_like) for p in outputs]
            results = out
        else:
            out = list(out) if isinstance(out, (list, tuple)) else [out]
            if len(out) != len(outputs):
                raise ArgumentError(f"{self.artifact.name} writes {len(outputs)} output(s), got {len(out)} in out=")
            results = out
        buffers += [self._as_buffer(o, p) for o, p in zip(out, outputs)]
        return buffers, results

    def _as_buffer(self, value, param: Param) -> DeviceBuffer:
        buffer = value if isinstance(value, DeviceBuffer) else DeviceBuffer.from_dlpack(value, param.name)
        buffer._alive()
        if buffer.shape != tuple(param.shape) or buffer.dtype != param.dtype:
            raise ArgumentError(f"{self.artifact.name}: {param.name} must be {param.dtype}{list(param.shape)}, "
                                f"got {buffer.dtype}{list(buffer.shape)}")
        if buffer.device.ordinal != self.device.ordinal:
            raise ArgumentError(f"{self.artifact.name}: {param.name} is on GPU {buffer.device.ordinal}, "
                                f"the kernel on GPU {self.device.ordinal}")
        return buffer

    def _allocate(self, param: Param, torch_like: bool):
        if torch_like:
            import torch
            dtypes = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32, "f64": torch.float64,
                      "i8": torch.int8, "i16": torch.int16, "i32": torch.int32, "i64": torch.int64, "i1": torch.bool}
            return torch.empty(param.shape, dtype=dtypes[param.dtype], device=f"cuda:{self.device.ordinal}")
        return DeviceBuffer.empty(param.shape, param.dtype, self.device)

    def __call__(self, *args, out=None, stream: int = 0):
        """Launch on `stream` (0: the legacy default stream, which torch's default stream is);
        returns the output(s): torch tensors when the inputs were, else DeviceBuffers."""
        buffers, results = self._buffers(args, out)
        self.launch(self._addresses(buffers), stream)
        return results[0] if len(results) == 1 else tuple(results)

    def _addresses(self, buffers: list[DeviceBuffer]) -> list[int]:
        """One value per artifact parameter: the buffers' addresses, then their TMA descriptors'."""
        addresses = [b.ptr for b in buffers]
        for param in self.artifact.params[len(buffers):]:
            if param.tensor_map is None:
                raise ArgumentError(f"{self.artifact.name}: parameter {param.name} is neither a tensor nor a "
                                    "tensor map; launch it with launch()")
            addresses.append(self._tensor_map(buffers[param.tensor_map[0]], param.tensor_map))
        return addresses

    def _tensor_map(self, buffer: DeviceBuffer, spec: tuple[int, ...]) -> int:
        key = (buffer.ptr, buffer.shape, buffer.dtype, spec)
        if key not in self._tensor_maps:
            if buffer.ptr % 16 or (buffer.shape[-1] * _ITEM_BYTES[buffer.dtype]) % 16:
                raise ArgumentError(f"{self.artifact.name} reads its operands through TMA, which needs 16-byte aligned "
                                    f"tensors with rows of a multiple of 16 bytes; got {buffer}")
            driver = _driver()
            tensor_map = _check(driver.cuTensorMapEncodeTiled(*tensor_map_arguments(
                buffer.ptr, buffer.shape, buffer.dtype, spec)), "cuTensorMapEncodeTiled")
            self.device.make_current()
            address = int(_check(driver.cuMemAlloc(128), "cuMemAlloc(tensor map)"))
            _check(driver.cuMemcpyHtoD(address, tensor_map.getPtr(), 128), "cuMemcpyHtoD(tensor map)")
            self._tensor_maps[key] = address
        return self._tensor_maps[key]

    def launch(self, addresses: list[int], stream: int = 0) -> None:
        """Launch with one device address per parameter (inputs, outputs, then tensor maps),
        unchecked beyond the artifact's own argument checks."""
        a = self.artifact
        array, _values = pack_parameters(a.launch_arguments(addresses))  # alive until the call returns
        self.device.make_current()
        _check(_driver().cuLaunchKernel(self.function, *a.grid, *a.block, a.dynamic_shared_bytes, stream,
                                        ctypes.addressof(array), 0), f"cuLaunchKernel({a.name})")

    def time(self, *args, iterations: int = 20, warmup: int = 3) -> float:
        """Median seconds per launch over `iterations`, after `warmup` launches (CUDA events)."""
        driver = _driver()
        buffers, _ = self._buffers(args, None)
        addresses = self._addresses(buffers)
        for _ in range(warmup):
            self.launch(addresses)
        start, stop = (_check(driver.cuEventCreate(0), "cuEventCreate") for _ in range(2))
        times = []
        for _ in range(iterations):
            _check(driver.cuEventRecord(start, 0), "cuEventRecord")
            self.launch(addresses)
            _check(driver.cuEventRecord(stop, 0), "cuEventRecord")
            _check(driver.cuEventSynchronize(stop), "cuEventSynchronize (the kernel may have faulted)")
            times.append(_check(driver.cuEventElapsedTime(start, stop), "cuEventElapsedTime") / 1e3)
        for event in (start, stop):
            _check(driver.cuEventDestroy(event), "cuEventDestroy")
        return sorted(times)[len(times) // 2]

    def close(self) -> None:
        """Unload the module and free the tensor maps (idempotent)."""
        if getattr(self, "module", None) is not None:
            self.device.make_current()
            for address in self._tensor_maps.values():
                _check(_driver().cuMemFree(address), "cuMemFree(tensor map)")
            self._tensor_maps.clear()
            _check(_driver().cuModuleUnload(self.module), "cuModuleUnload")
            self.module = None
