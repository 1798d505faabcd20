"""bf16 buffers for Vulkan devices without bf16 types: stored as their 16 bits (i16 elements
in 16-bit storage buffers), converted to and from f32 with integer ops in the kernel.

This MLIR's SPIR-V type converter maps a bf16 memref to f32 words, whose loads then disagree
with the bf16 bit casts arith-expand writes, so the SIMT kernels' text (loads of bf16 made f32 at
once, f32 results made bf16 just before their store) is rewritten before the SPIR-V conversion:
bf16 memrefs become i16 ones, `arith.extf` from bf16 a shift into the top half of an f32's bits,
`arith.truncf` to bf16 a round to nearest even on the bits (a NaN stays a quiet NaN).
"""
from __future__ import annotations

import re

from ...errors import OpError

_EXTF = re.compile(r"^(\s*)(%[\w#]+) = arith\.extf (%[\w#]+) : bf16 to f32$")
_TRUNCF = re.compile(r"^(\s*)(%[\w#]+) = arith\.truncf (%[\w#]+) : f32 to bf16$")


def _temporaries(result: str) -> str:
    """The prefix of the values that make `result` (%12 -> %bf12_, %res#3 -> %bfres_3_)."""
    return "%bf" + result.lstrip("%").replace("#", "_") + "_"


def _widen(indent: str, result: str, bits: str) -> list[str]:
    """bf16 bits (i16) to the f32 they are the top half of."""
    r = _temporaries(result)
    return [f"{indent}{r}bits32 = arith.extui {bits} : i16 to i32",
            f"{indent}{r}c16 = arith.constant 16 : i32",
            f"{indent}{r}top = arith.shli {r}bits32, {r}c16 : i32",
            f"{indent}{result} = arith.bitcast {r}top : i32 to f32"]


def _narrow(indent: str, result: str, x: str) -> list[str]:
    """An f32 to the bits of the nearest bf16 (ties to even; NaN kept quiet)."""
    v = _temporaries(result)
    return [f"{indent}{v}bits = arith.bitcast {x} : f32 to i32",
            f"{indent}{v}c16 = arith.constant 16 : i32",
            f"{indent}{v}c1 = arith.constant 1 : i32",
            f"{indent}{v}half = arith.constant 32767 : i32",
            f"{indent}{v}quiet = arith.constant 64 : i32",
            f"{indent}{v}high = arith.shrui {v}bits, {v}c16 : i32",
            f"{indent}{v}odd = arith.andi {v}high, {v}c1 : i32",
            f"{indent}{v}bias = arith.addi {v}half, {v}odd : i32",
            f"{indent}{v}rounded = arith.addi {v}bits, {v}bias : i32",
            f"{indent}{v}top = arith.shrui {v}rounded, {v}c16 : i32",
            f"{indent}{v}nan = arith.cmpf uno, {x}, {x} : f32",
            f"{indent}{v}qnan = arith.ori {v}high, {v}quiet : i32",
            f"{indent}{v}pick = arith.select {v}nan, {v}qnan, {v}top : i32",
            f"{indent}{result} = arith.trunci {v}pick : i32 to i16"]


def bf16_as_i16(text: str) -> str:
    """The kernel text with bf16 buffers as i16 ones (see the module's doc); an error if bf16
    is used any other way (the kernel cannot run on this device)."""
    lines = []
    for line in text.splitlines():
        if m := _EXTF.match(line):
            lines += _widen(*m.groups())
        elif m := _TRUNCF.match(line):
            lines += _narrow(*m.groups())
        else:
            lines.append(re.sub(r"xbf16([>,])", r"xi16\1", line))
    out = "\n".join(lines) + "\n"
    if "bf16" in out:
        used = next(line.strip() for line in out.splitlines() if "bf16" in line)
        raise OpError(f"this kernel uses bf16 beyond loads and stores ({used[:120]}); on a Vulkan device "
                      "without bf16 types only those are emulated: use f16 or f32")
    return out
