"""Element types shared by MLIR and numpy (bf16 through ml_dtypes)."""
from __future__ import annotations

import ml_dtypes
import numpy as np

_NUMPY = {
    "f32": np.dtype(np.float32), "f64": np.dtype(np.float64), "f16": np.dtype(np.float16),
    "bf16": np.dtype(ml_dtypes.bfloat16), "i64": np.dtype(np.int64), "i32": np.dtype(np.int32),
    "i16": np.dtype(np.int16), "i8": np.dtype(np.int8), "i1": np.dtype(np.bool_),
}
_MLIR = {v: k for k, v in _NUMPY.items()}
ELEMENT_TYPES = tuple(_NUMPY)  # what compiled kernels take and give


def to_numpy(dtype: str) -> np.dtype:
    try:
        return _NUMPY[dtype]
    except KeyError:
        raise TypeError(f"element type {dtype} has no numpy equivalent; supported: {', '.join(_NUMPY)}") from None


def from_numpy(dtype) -> str:
    dtype = np.dtype(dtype)
    try:
        return _MLIR[dtype]
    except KeyError:
        raise TypeError(f"numpy dtype {dtype} has no tracea equivalent; supported: "
                        f"{', '.join(str(d) for d in _MLIR)}") from None
