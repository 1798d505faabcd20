"""A conv2d as an implicit GEMM: the im2col matrix A read straight from the NHWC image by a
gather, never materialized. The CPU GEMM packs A through it; the NVIDIA conv loads its tiles
through it."""
from __future__ import annotations

from dataclasses import dataclass

from ..dialects.ops import Conv2dDef, OpView, TensorSpec


@dataclass(frozen=True)
class ConvGather:
    """A is the im2col of an NHWC image, never materialized: row (n, oy, ox), column
    (ky, kx, c) reads image[n, oy*sy + ky*dy - top, ox*sx + kx*dx - left, c] (0 outside).
    `run` channels at a time are copied, so K blocks must hold whole runs."""

    image: TensorSpec  # [N, H, W, C]
    kernel: tuple[int, int]
    out_hw: tuple[int, int]
    stride: tuple[int, int]
    dilation: tuple[int, int]
    top_left: tuple[int, int]

    def wide(self, lanes: int) -> bool:
        """Copy whole kernel rows (KW pixels x C, contiguous when the x dilation is 1): worth it
        when a pixel's C channels are shorter than a vector."""
        return self.dilation[1] == 1 and self.image.shape[3] < lanes

    def unit(self, lanes: int) -> int:
        """The contiguous run the packing copies: C channels, or a whole kernel row."""
        c = self.image.shape[3]
        return self.kernel[1] * c if self.wide(lanes) else c

    def run(self, kc: int, lanes: int) -> int:
        unit = self.unit(lanes)
        return unit if kc % unit == 0 else kc  # kc divides the unit otherwise (see conv_k_block)


def implicit_gemm(v: OpView) -> tuple[int, int, int, ConvGather]:
    """The implicit GEMM of a conv2d (NCHW or NHWC): (M, N, K) and the gather packing A from the
    NHWC image."""
    x, f = v.operands["input"], v.operands["filter"]
    top, _, left, _ = Conv2dDef.pads(v.attrs)
    if v.attrs["layout"] == "nchw":
        (n, c, h, wd), (nf, _, kh, kw), (_, _, oh, ow) = x.shape, f.shape, v.result.shape
    else:
        (n, h, wd, c), (kh, kw, _, nf), (_, oh, ow, _) = x.shape, f.shape, v.result.shape
    gather = ConvGather(TensorSpec((n, h, wd, c), x.dtype), (kh, kw), (oh, ow), tuple(v.attrs["stride"]),
                        tuple(v.attrs["dilation"]), (top, left))
    return n * oh * ow, nf, kh * kw * c, gather
