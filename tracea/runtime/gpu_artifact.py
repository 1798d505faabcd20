"""A compiled GPU kernel as an artifact: its code (cubin, and the PTX it came from) plus what a
launch needs (grid, block, dynamic shared memory, the argument layout). Saved as `<path>.cubin`
and `<path>.json`, loaded with the standard library only: this file can be copied alone to a GPU
machine that has no MLIR (the tests load it that way).

Argument layout: MLIR's NVVM kernels take each memref argument expanded into its descriptor
fields, `allocated ptr, aligned ptr, offset, sizes[rank], strides[rank]` (pointers and int64s),
and each scalar as itself. `launch_arguments` builds those values from buffer addresses.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

try:
    from ..errors import ArgumentError, TraceaError
except ImportError:  # this file alone, on a GPU machine without Tracea's compiler (and MLIR)
    class TraceaError(Exception):
        pass

    class ArgumentError(TraceaError, TypeError):
        pass

FORMAT = "tracea-gpu-kernel-1"
_SCALARS = ("f32", "f64", "i32", "i64")


@dataclass(frozen=True)
class Param:
    """One kernel argument: a tensor (`shape`, `dtype`) passed as a memref, a scalar (shape
    None), or (dtype "tensormap") the device address of a TMA descriptor of tensor parameter
    `tensor_map[0]`, for boxes of tensor_map[1:3] elements (innermost first) with a
    tensor_map[3]-byte swizzle, seeing the tensor as one matrix of its last dim's columns or
    (tensor_map[4] == 3) as a stack of its [rows, cols] matrices; `output`: the kernel writes it
    (outputs follow the inputs)."""
    name: str
    dtype: str
    shape: tuple[int, ...] | None = None
    output: bool = False
    tensor_map: tuple[int, ...] | None = None

    @property
    def tensor_map_rank(self) -> int:
        return self.tensor_map[4] if len(self.tensor_map) > 4 else 2

    @property
    def fields(self) -> list[str]:
        """The C types of the values this argument expands to ("ptr", "i64", or the scalar type)."""
        if self.tensor_map is not None:
            return ["ptr"]
        if self.shape is None:
            return [self.dtype]
        return ["ptr", "ptr", "i64"] + ["i64"] * (2 * len(self.shape))


class _SavedArtifact:
    """Saving and loading a kernel artifact as <path><CODE_SUFFIX> (its code: the CODE_FIELD, bytes
    or text) beside <path>.json (the rest, with FORMAT)."""
    CODE_FIELD = CODE_SUFFIX = FORMAT = KIND = ""

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        code = getattr(self, self.CODE_FIELD)
        target = Path(str(path) + self.CODE_SUFFIX)
        target.write_text(code) if isinstance(code, str) else target.write_bytes(code)
        meta = {k: v for k, v in asdict(self).items() if k != self.CODE_FIELD}
        meta["params"] = [asdict(p) for p in self.params]
        Path(str(path) + ".json").write_text(json.dumps({"format": self.FORMAT, **meta}, indent=1))
        return path

    @classmethod
    def load(cls, path: str | Path):
        path = Path(path)
        try:
            meta = json.loads(Path(str(path) + ".json").read_text())
            source = Path(str(path) + cls.CODE_SUFFIX)
            code = source.read_text() if cls.__dataclass_fields__[cls.CODE_FIELD].type == "str" else source.read_bytes()
        except OSError as e:
            raise TraceaError(f"cannot load the {cls.KIND} kernel {path}: {e.strerror} ({e.filename})") from None
        except ValueError:
            raise TraceaError(f"{path}.json is damaged: not JSON") from None
        if not isinstance(meta, dict) or meta.pop("format", None) != cls.FORMAT:
            raise TraceaError(f"{path}.json is not a Tracea {cls.KIND} kernel description")
        params = tuple(Param(p["name"], p["dtype"], None if p["shape"] is None else tuple(p["shape"]),
                             p.get("output", False), tuple(p["tensor_map"]) if p.get("tensor_map") else None)
                       for p in meta.pop("params"))
        lists = {k: tuple(meta.pop(k)) for k in ("grid", "block", "capabilities") if k in meta}
        return cls(**{cls.CODE_FIELD: code}, params=params, **lists, **meta)


@dataclass(frozen=True)
class GpuKernelArtifact(_SavedArtifact):
    name: str
    chip: str
    cubin: bytes
    ptx: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_shared_bytes: int
    params: tuple[Param, ...]
    registers: int = 0
    static_shared_bytes: int = 0

    CODE_FIELD, CODE_SUFFIX, FORMAT, KIND = "cubin", ".cubin", FORMAT, "GPU"

    def describe(self) -> str:
        return (f"{self.name} for {self.chip}: grid {self.grid}, block {self.block}, {self.dynamic_shared_bytes} bytes "
                f"dynamic shared memory, {self.registers} registers")

    def launch_arguments(self, values: list) -> list[tuple[str, int | float]]:
        """(C type, value) for every kernel parameter, from one value per Param: a device
        address (int) with a contiguous layout for tensors, a number for scalars, a device
        address of the encoded descriptor for tensor maps."""
        if len(values) != len(self.params):
            raise ArgumentError(f"{self.name} takes {len(self.params)} argument(s) "
                                f"({', '.join(p.name for p in self.params)}), got {len(values)}")
        out: list[tuple[str, int | float]] = []
        for param, value in zip(self.params, values):
            if param.tensor_map is not None:
                if not isinstance(value, int) or value <= 0:
                    raise ArgumentError(f"{self.name}: argument {param.name} must be the device address of a "
                                        f"TMA descriptor, got {value!r}")
                out.append(("ptr", value))
                continue
            if param.shape is None:
                if param.dtype not in _SCALARS or not isinstance(value, (int, float)):
                    raise ArgumentError(f"{self.name}: argument {param.name} must be a {param.dtype} number")
                out.append((param.dtype, value))
                continue
            if not isinstance(value, int) or value <= 0:
                raise ArgumentError(f"{self.name}: argument {param.name} must be a device address "
                                    f"(a DeviceBuffer's), got {value!r}")
            strides = [math.prod(param.shape[i + 1:]) for i in range(len(param.shape))]
            out += [("ptr", value), ("ptr", value), ("i64", 0)]
            out += [("i64", s) for s in param.shape] + [("i64", s) for s in strides]
        return out


SPIRV_FORMAT = "tracea-spirv-kernel-1"


@dataclass(frozen=True)
class SpirvKernelArtifact(_SavedArtifact):
    """A Vulkan compute kernel: its SPIR-V module (entry point `name`), the Vulkan version it is
    for, the workgroups of a launch (`grid`) and their size (`block`), and the storage buffers it
    binds, in binding order (inputs, then outputs). Saved as `<path>.spv` and `<path>.json`."""
    name: str
    arch: str  # "vulkan1.3"
    spirv: bytes
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    params: tuple[Param, ...]
    capabilities: tuple[str, ...] = ()  # the SPIR-V capabilities it declares

    CODE_FIELD, CODE_SUFFIX, FORMAT, KIND = "spirv", ".spv", SPIRV_FORMAT, "Vulkan"

    def describe(self) -> str:
        return f"{self.name} for {self.arch}: {self.grid} workgroups of {self.block}"


def buffer_params(signature) -> list[Param]:
    """A kernel's tensor parameters from its function's signature: the inputs (named after the
    function's arguments when known), then the outputs."""
    names = signature.arg_names or [f"arg{i}" for i in range(len(signature.inputs))]
    params = [Param(n, s.dtype, s.shape) for n, s in zip(names, signature.inputs)]
    return params + [Param("out" if len(signature.outputs) == 1 else f"out{i}", s.dtype, s.shape, output=True)
                     for i, s in enumerate(signature.outputs)]


def checked_inputs(kernel: str, params, arrays) -> list:
    """The input arrays of a kernel taking buffers, each checked against its Param (count, shape,
    dtype) and made contiguous."""
    import numpy as np
    from .dtypes import to_numpy
    inputs = [p for p in params if not p.output]
    if len(arrays) != len(inputs):
        raise ArgumentError(f"{kernel} takes {len(inputs)} array(s) ({', '.join(p.name for p in inputs)}), "
                            f"got {len(arrays)}")
    checked = []
    for param, value in zip(inputs, arrays):
        value = np.asarray(value)
        if value.shape != tuple(param.shape) or value.dtype != to_numpy(param.dtype):
            raise ArgumentError(f"{kernel}: argument {param.name} must be a {param.dtype} array of shape "
                                f"{tuple(param.shape)}, got {value.dtype} {value.shape}")
        checked.append(np.ascontiguousarray(value))
    return checked


METAL_FORMAT = "tracea-metal-kernel-1"


@dataclass(frozen=True)
class MetalKernelArtifact(_SavedArtifact):
    """A Metal compute kernel: its MSL source (entry point `name`, buffer i at [[buffer(i)]]), the
    MSL version, the threadgroups of a launch (`grid`) and their size (`block`), and its buffers
    (inputs, then outputs). Saved as `<path>.metal` and `<path>.json`."""
    name: str
    arch: str  # "metal2.3"
    msl: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    params: tuple[Param, ...]

    CODE_FIELD, CODE_SUFFIX, FORMAT, KIND = "msl", ".metal", METAL_FORMAT, "Metal"

    def describe(self) -> str:
        return f"{self.name} for {self.arch}: {self.grid} threadgroups of {self.block}"


HSACO_FORMAT = "tracea-hsaco-kernel-1"


@dataclass(frozen=True)
class HsacoKernelArtifact(_SavedArtifact):
    """An AMD GPU kernel: its HSACO code object (linked by ld.lld), the assembly it came from, the
    launch (workgroups `grid` of `block` lanes), its parameters (memref descriptors expanded as
    GpuKernelArtifact's), and the resources read from the machine code: VGPRs per lane, LDS and
    scratch bytes per workgroup / lane. Saved as `<path>.hsaco` and `<path>.json`."""
    name: str
    chip: str
    hsaco: bytes
    asm: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    params: tuple[Param, ...]
    vgprs: int = 0
    lds_bytes: int = 0
    scratch_bytes: int = 0

    launch_arguments = GpuKernelArtifact.launch_arguments  # the same kernel argument layout

    CODE_FIELD, CODE_SUFFIX, FORMAT, KIND = "hsaco", ".hsaco", HSACO_FORMAT, "AMD"

    def describe(self) -> str:
        return (f"{self.name} for {self.chip}: grid {self.grid}, block {self.block}, {self.vgprs} VGPRs, "
                f"{self.lds_bytes} bytes LDS, {self.scratch_bytes} bytes scratch")
