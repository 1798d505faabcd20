"""The tracea dialect: ops (L2), schedule attributes (L4) and their Python builders."""
from .builder import (EpilogueStep, Function, attention, bias_add, conv2d, function, fused_gemm, gelu, gemm,
                      hardsigmoid, hardswish, relu, residual_add, scale, sigmoid, silu, softmax, tensor)
from .context import load_tracea_dialect, make_context
from .ops import OP_DEFS, Epilogue, TensorSpec
from .schedule import LaneMap, Schedule, Swizzle

__all__ = ["OP_DEFS", "Epilogue", "EpilogueStep", "Function", "LaneMap", "Schedule", "Swizzle", "TensorSpec",
           "attention", "bias_add", "conv2d", "function", "fused_gemm", "gelu", "gemm", "hardsigmoid", "hardswish",
           "load_tracea_dialect",
           "make_context", "relu", "residual_add", "scale", "sigmoid", "silu", "softmax", "tensor"]
