"""A conv2d as an implicit GEMM: the im2col matrix A read straight from the NHWC image by a
gather, never materialized. The CPU GEMM packs A through it; the NVIDIA conv loads its tiles
through it."""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..dialects.ops import Conv2dDef, Epilogue, OpView, TensorSpec


# Read strips from the image (direct_segment) only where most pixels are inside it: the other
# strips are still packed, after a per-strip check. 3x3 convs, Zen 3, in-process A/B against
# packing all: 56x56 (93 % inside) +16 % on 1 thread, +28 % on 2; 28x28 (86 %) +4-12 %;
# 14x14 (73 %) -7 % to +4 %; 7x7 (51 %) -2 to -7 %.
DIRECT_MIN_INTERIOR = 0.8


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

    def padded(self, pads: tuple[int, int, int, int]) -> "ConvGather":
        """The gather of the image zero-padded first by `pads` (top, bottom, left, right): every
        tap then lies inside it."""
        n, h, w, c = self.image.shape
        top, bottom, left, right = pads
        return replace(self, image=TensorSpec((n, h + top + bottom, w + left + right, c), self.image.dtype),
                       top_left=(0, 0))

    def unit(self, lanes: int) -> int:
        """The contiguous run the packing copies: C channels, or a whole kernel row."""
        c = self.image.shape[3]
        return self.kernel[1] * c if self.wide(lanes) else c

    def direct_segment(self, kc: int, lanes: int) -> int | None:
        """The length of the segments in which a K block of `kc` columns can be read straight
        from the image, or None. For a fixed ky the columns (kx, c) of a row of A are one
        contiguous run of the image (an x dilation of 1), KW x C long: a K block made of whole
        runs, or lying inside one, is read run by run, a row's base pointer into the image
        standing in for its packed copy. f32 images, small C too: ResNet's 7x7/s2 stem on C = 3
        (runs of 21 floats) ran 1.17-1.38x faster read in place than packed with AVX-512 and
        1.07-1.16x with AVX2 code (Zen 5, 1 and 8 images, 1 and 2 threads; 3x3 on C = 3 and 8,
        5x5/s2 on C = 4: 1.0-1.36x; 3x3 on C = 12 with AVX-512: 0.96x, within its noise), the
        packing of its short runs having cost more than the products."""
        row = self.kernel[1] * self.image.shape[3]
        segment = min(kc, row)
        if self.image.dtype != "f32" or self.dilation[1] != 1 or kc % segment or row % segment \
                or self.interior_share() < DIRECT_MIN_INTERIOR:
            return None
        return segment

    def interior_share(self) -> float:
        """The share of output pixels whose taps all lie inside the image (no padding read)."""
        def inside(out: int, size: int, stride: int, taps: int, dilation: int, before: int) -> int:
            return sum(0 <= o * stride - before and o * stride - before + (taps - 1) * dilation < size
                       for o in range(out))
        (kh, kw), (oh, ow), (_, h, w, _) = self.kernel, self.out_hw, self.image.shape
        return (inside(oh, h, self.stride[0], kh, self.dilation[0], self.top_left[0])
                * inside(ow, w, self.stride[1], kw, self.dilation[1], self.top_left[1]) / (oh * ow))

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


@dataclass(frozen=True)
class ColumnGather:
    """B is the im2col of a zero-padded NCHW image, never materialized: row (c, ky, kx), column
    (n, oy, ox) reads padded[n, c, oy*sy + ky*dy, ox*sx + kx*dx]. The image holds each padded row
    as its sx phase planes side by side, plane p = columns p, p + sx, ... (Wq of them; one
    plane for sx = 1), so a tap reads plane (kx*dx) % sx from column ox + (kx*dx) // sx: with
    any x stride, an output row's pixels are contiguous. A strip of NR columns is copied run by
    run, a run being an output row's pixels in the strip: a vector load or a few each."""

    image: TensorSpec  # [N, C, Hp, sx * Wq]: the padded image's rows as phase planes
    kernel: tuple[int, int]
    out_hw: tuple[int, int]
    stride: tuple[int, int]
    dilation: tuple[int, int]

    MAX_RUNS = 16  # runs per strip, unrolled: output rows of 2 pixels on 32-column strips

    def aligned(self, nr: int) -> bool:
        """Every strip of `nr` columns starts at an output row (or inside one, at a multiple of
        `nr`): its runs lie at the same places in every strip, whole."""
        ow = self.out_hw[1]
        return nr % ow == 0 if ow <= nr else ow % nr == 0

    def runs(self, nr: int) -> int:
        """The most runs a strip of `nr` columns holds."""
        ow = self.out_hw[1]
        return nr // min(ow, nr) if self.aligned(nr) else -(-(ow - 1 + nr) // ow)

    def fits(self, nr: int) -> bool:
        return self.runs(nr) <= self.MAX_RUNS


def conv_epilogue(v: OpView) -> tuple[Epilogue, ...]:
    """A conv2d's bias (if any), then its own epilogue steps: what is applied to each output value
    before it is stored (the bias as a GEMM's bias_add when the filters are the GEMM's columns)."""
    return ((Epilogue("bias_add"),) if "bias" in v.operands else ()) + tuple(v.attrs["epilogue"])
