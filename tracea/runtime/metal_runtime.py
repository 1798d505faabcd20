"""Metal compute through PyObjC (macOS only): the MSL of a MetalKernelArtifact compiled by the
system's Metal compiler, its pipeline built once, buffers in shared storage (Apple GPUs share
memory with the CPU), one dispatch per call. Elsewhere every entry point raises MetalError
naming the reason; tracea.compile_gpu(fn, chip="metal-apple") still writes the MSL anywhere."""
from __future__ import annotations

import sys
import time

import numpy as np

from ..errors import TraceaError
from .dtypes import to_numpy
from .gpu_artifact import checked_inputs


class MetalError(TraceaError, RuntimeError):
    """No Metal here, or Metal refused the kernel."""


def _metal():
    if sys.platform != "darwin":
        raise MetalError(f"Metal runs on macOS only (this is {sys.platform}); tracea.compile_gpu(fn, "
                         "chip='metal-apple') writes the kernel's MSL on any machine")
    try:
        import Metal
    except ImportError:
        raise MetalError("the Metal runtime needs PyObjC's Metal framework (pip install "
                         "pyobjc-framework-Metal==12.2.2)") from None
    return Metal


class MetalDevice:
    _default = None

    def __init__(self, device):
        self.device, self.queue, self.name = device, device.newCommandQueue(), str(device.name())

    @classmethod
    def get(cls) -> "MetalDevice":
        if cls._default is None:
            device = _metal().MTLCreateSystemDefaultDevice()
            if device is None:
                raise MetalError("this Mac has no Metal device")
            cls._default = cls(device)
        return cls._default


class MetalKernel:
    """A MetalKernelArtifact on a MetalDevice: `kernel(*arrays)` runs it on numpy arrays and
    returns the result; `kernel.seconds` is the last command buffer's time."""

    def __init__(self, artifact, device: MetalDevice):
        metal = _metal()
        self.artifact, self.device = artifact, device
        library, error = device.device.newLibraryWithSource_options_error_(artifact.msl, None, None)
        if library is None:
            raise MetalError(f"the Metal compiler rejected {artifact.name}: {error}")
        function = library.newFunctionWithName_(artifact.name)
        self.pipeline, error = device.device.newComputePipelineStateWithFunction_error_(function, None)
        if self.pipeline is None:
            raise MetalError(f"Metal could not build the pipeline of {artifact.name}: {error}")
        threads = artifact.block[0] * artifact.block[1] * artifact.block[2]
        if threads > self.pipeline.maxTotalThreadsPerThreadgroup():
            raise MetalError(f"{artifact.name} needs {threads} threads per threadgroup; {device.name} runs it with "
                             f"at most {self.pipeline.maxTotalThreadsPerThreadgroup()}")
        self.size = metal.MTLSizeMake
        self.shared = metal.MTLResourceStorageModeShared
        self.seconds = 0.0
        self.stages: dict[str, str] = {}

    def __call__(self, *arrays):
        a, device = self.artifact, self.device.device
        buffers = [device.newBufferWithBytes_length_options_(x.tobytes(), max(x.nbytes, 4), self.shared)
                   for x in checked_inputs(a.name, a.params, arrays)]
        outs = []
        for param in (p for p in a.params if p.output):
            dtype = to_numpy(param.dtype)
            nbytes = int(np.prod(param.shape)) * dtype.itemsize
            buffers.append(device.newBufferWithLength_options_(max(nbytes, 4), self.shared))
            outs.append((buffers[-1], param, dtype, nbytes))
        commands = self.device.queue.commandBuffer()
        encoder = commands.computeCommandEncoder()
        encoder.setComputePipelineState_(self.pipeline)
        for index, buffer in enumerate(buffers):
            encoder.setBuffer_offset_atIndex_(buffer, 0, index)
        encoder.dispatchThreadgroups_threadsPerThreadgroup_(self.size(*a.grid), self.size(*a.block))
        encoder.endEncoding()
        start = time.perf_counter()
        commands.commit()
        commands.waitUntilCompleted()
        self.seconds = time.perf_counter() - start
        if commands.error() is not None:
            raise MetalError(f"{a.name} failed on {self.device.name}: {commands.error()}")
        results = [np.frombuffer(bytes(buffer.contents().as_buffer(nbytes)), dtype=dtype).reshape(param.shape).copy()
                   for buffer, param, dtype, nbytes in outs]
        return results[0] if len(results) == 1 else tuple(results)
