"""Tracea kernels called with torch tensors: the conversions between torch tensors and the numpy
arrays kernels take (bf16, unsigned bytes), shared by whole-model and per-region kernels."""
from __future__ import annotations


def _to_numpy(x, dtype):
    """A torch tensor as the numpy array a kernel takes for element type `dtype` (a numpy dtype):
    bf16 through ml_dtypes, unsigned bytes as the signless bytes torch-mlir makes of them."""
    import torch
    x = x.detach().contiguous()
    if x.dtype == torch.bfloat16:
        return x.view(torch.int16).numpy().view(dtype)
    array = x.numpy()
    return array.view(dtype) if array.dtype != dtype and array.dtype.itemsize == dtype.itemsize else array


def _to_torch(array, dtype):
    """A kernel's result as a torch tensor of the dtype the model returns there."""
    import numpy as np
    import torch
    if dtype == torch.bfloat16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    if dtype == torch.uint8:
        return torch.from_numpy(array.view(np.uint8))
    return torch.from_numpy(array)


class TensorBridge:
    """Calls a Kernel with torch tensors and returns torch tensors (of `out_dtypes` when given);
    with `shapes` (dynamic.SymbolicShapes) the result shapes of a dynamic kernel come from the
    sizes of each call."""

    def __init__(self, kernel, out_dtypes=None, shapes=None):
        from ..runtime.dtypes import to_numpy
        self.kernel = kernel
        self.in_dtypes = [to_numpy(s.dtype) for s in kernel.signature.inputs]
        self.np_out_dtypes = [to_numpy(s.dtype) for s in kernel.signature.outputs]
        self.out_dtypes = out_dtypes or [None] * len(kernel.signature.outputs)
        self.shapes = shapes if shapes is not None and shapes.dynamic else None

    def __call__(self, tensors) -> list:
        from ..runtime.kernel import aligned_empty
        arrays = [_to_numpy(t, d) for t, d in zip(tensors, self.in_dtypes)]
        out = None
        if self.shapes is not None:
            env = self.shapes.bind([a.shape for a in arrays])
            out = [aligned_empty(shape, d) for shape, d in zip(self.shapes.output_shapes(env), self.np_out_dtypes)]
        outputs = self.kernel(*arrays, out=out)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        return [_to_torch(o, d) for o, d in zip(outputs, self.out_dtypes)]
