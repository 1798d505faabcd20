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
        self._weight_arrays: dict[int, tuple] = {}  # weight number -> (its storage, its numpy view)
        import torch
        self._parameter = torch.nn.Parameter

    def _weight_array(self, i: int, weight):
        """Weight i as a numpy array: the view made on an earlier call while the weight keeps its
        storage, shape, strides and dtype (an update in place shows through it). Converting every
        weight anew cost ~1.5 us each per call (a 12-layer GPT-2 takes ~150)."""
        storage = (weight.data_ptr(), weight.shape, weight.stride(), weight.dtype)
        made = self._weight_arrays.get(i)
        if made is not None and made[0] == storage:
            return made[1]
        array = _to_numpy(weight, self.in_dtypes[i])
        if weight.is_contiguous():  # else a copy, made again each call
            self._weight_arrays[i] = (storage, array)
        return array

    def __call__(self, tensors, weights: int = 0) -> list:
        """The first `weights` tensors are the model's weights, the same from call to call, as
        are the parameters among the others (a graph Dynamo captured takes them as inputs)."""
        from ..runtime.kernel import aligned_empty
        parameter = self._parameter
        arrays = [self._weight_array(i, t) if i < weights or isinstance(t, parameter) else _to_numpy(t, d)
                  for i, (t, d) in enumerate(zip(tensors, self.in_dtypes))]
        out = None
        if self.shapes is not None:
            env = self.shapes.bind([a.shape for a in arrays])
            out = [aligned_empty(shape, d) for shape, d in zip(self.shapes.output_shapes(env), self.np_out_dtypes)]
        outputs = self.kernel(*arrays, out=out)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        return [_to_torch(o, d) for o, d in zip(outputs, self.out_dtypes)]
