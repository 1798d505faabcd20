"""Transposing copies (a linalg.generic that only moves elements, its innermost output loop not
the input's innermost): L x L blocks read as vectors along the input's contiguous dim, transposed
in registers, written as vectors along the output's. Element-wise, each element costs a strided
scalar access (LLVM turns the inner loop into gathers or scatters, no faster); in blocks, two
vector accesses per L elements. Edge blocks use masked loads and stores, so every block takes
the vector path.

Unit dims do not count: linalg-fold-unit-extent-dims drops them, but the reshapes it leaves are
then propagated back through the copy by linalg-fuse-elementwise-ops, which expands it again,
with unit dims in new places (a [4, 1, 4] transposed to [4, 1, 4] arrives as a 4x1x4x1 copy whose
innermost dims are units). The block kernel works on views of both buffers with their unit dims
collapsed away, so that its vectors run along each buffer's innermost dim.
"""
from __future__ import annotations

import math

import mlir.ir as ir

from ...dialects.ops import TensorSpec
from ...codegen.loop_text import LoopText, memref_text
from .gemm import transpose_in_registers

ELEMENT_TYPES = ("f32", "i32")  # 32-bit elements: as many per vector as the host has f32 lanes


def _without_units(shape) -> tuple[list[int], list[list[int]]]:
    """The dims of `shape` that are not 1, and the reassociation that collapses the others away
    (each unit dim joins the group of the dim before it, leading ones that of the first)."""
    kept, groups, leading = [], [], []
    for d, n in enumerate(shape):
        if n != 1:
            kept.append(d)
            groups.append(leading + [d])
            leading = []
        elif groups:
            groups[-1].append(d)
        else:
            leading.append(d)
    return kept, groups


def transposed_dims(op: ir.Operation) -> tuple[list[int], int] | None:
    """For a transposing copy, counting only the dims that are not 1: (the input map's dims, the
    output dim that is the input's innermost), both numbered among those dims; None for any other
    op, and for copies that move no dim across the innermost one once the unit dims are dropped."""
    if op.name != "linalg.generic" or len(op.operands) != 2 or len(op.results) != 1:
        return None
    maps = [ir.AffineMapAttr(a).value for a in ir.ArrayAttr(op.attributes["indexing_maps"])]
    if not all(m.is_permutation for m in maps) or not all("parallel" in str(a)
                                                        for a in ir.ArrayAttr(op.attributes["iterator_types"])):
        return None
    body = list(op.regions[0].blocks[0].operations)
    if len(body) != 1 or body[0].operands[0] != op.regions[0].blocks[0].arguments[0]:
        return None  # not a plain copy
    types = [v.type if isinstance(v.type, ir.RankedTensorType) else None for v in op.operands]
    if None in types or not all(t.has_static_shape for t in types) or types[0].element_type != types[1].element_type:
        return None
    in_dims, out_dims = ([e.position for e in m.results] for m in maps)
    if out_dims != list(range(len(out_dims))) or str(types[0].element_type) not in ELEMENT_TYPES:
        return None
    kept, _ = _without_units(types[1].shape)  # the output's map is the identity: its dims are the loops'
    in_dims = [kept.index(d) for d in in_dims if d in kept]
    shape = [types[1].shape[d] for d in kept]
    if len(shape) < 2:
        return None
    inner = in_dims[-1]
    if inner == len(shape) - 1 or shape[inner] < 4 or shape[-1] < 4:
        return None  # no transpose, or too thin for blocks
    return in_dims, inner


def transpose_kernel_text(name: str, op: ir.Operation, dims: tuple[list[int], int], lanes: int, parallel: bool,
                          location: str) -> str:
    """The kernel function (on tensors) for a transposing copy whose `transposed_dims` are `dims`;
    `parallel`: its blocks are split among the threads."""
    in_dims, inner = dims
    src, dst = (TensorSpec.from_type(v.type, "transpose operand") for v in op.operands)
    dtype, L = dst.dtype, lanes
    (_, src_groups), (kept, dst_groups) = _without_units(src.shape), _without_units(dst.shape)
    shape = [dst.shape[d] for d in kept]
    last = len(shape) - 1
    others = [d for d in range(len(shape)) if d not in (inner, last)]
    n_blocks = -(-shape[inner] // L)
    vt = f"vector<{L}x{dtype}>"
    t = LoopText()
    src_t, dst_t = memref_text([n for n in src.shape if n != 1], dtype), memref_text(shape, dtype)
    source = t.to_buffer("%arg0", src)
    result = out = t.op(f"memref.alloc() {{alignment = 64 : i64}} : {memref_text(dst.shape, dtype)}", "m")
    # the blocks move between views without the unit dims, whose innermost dims are contiguous
    if len(src_groups) < src.rank:
        source = t.op(f"memref.collapse_shape {source} {src_groups} : {memref_text(src.shape, dtype)} into {src_t}", "m")
    if len(dst_groups) < dst.rank:
        out = t.op(f"memref.collapse_shape {out} {dst_groups} : {memref_text(dst.shape, dtype)} into {dst_t}", "m")
    zero = t.op(f"arith.constant dense<0{'.0' if dtype.startswith('f') else ''}> : {vt}", "z")
    # one parallel loop over (the other dims, blocks of the input's innermost dim)
    (t.parallel if parallel else t.for_)("%task", t.c(0), t.c(math.prod(shape[d] for d in others) * n_blocks), t.c(1))
    rest = t.op(f"arith.divui %task, {t.c(n_blocks)} : index", "i")
    a0 = t.mul(t.op(f"arith.remui %task, {t.c(n_blocks)} : index", "i"), t.c(L))
    index = {}
    for d in reversed(others):
        index[d] = t.op(f"arith.remui {rest}, {t.c(shape[d])} : index", "i")
        rest = t.op(f"arith.divui {rest}, {t.c(shape[d])} : index", "i")
    inner_tail, last_tail = shape[inner] % L, shape[last] % L

    def row(base: str, r: int, size: int, tail: int) -> str:
        """base + r, clamped into the dim: only the last block has rows past its end, and only
        rows at or after the dim's tail."""
        return t.add(base, t.c(r)) if not tail or r < tail else t.min_(t.add(base, t.c(r)), t.c(size - 1))

    # masks only for dims that are not whole blocks
    na = t.min_(t.op(f"arith.subi {t.c(shape[inner])}, {a0} : index", "i"), t.c(L)) if inner_tail else None
    mask_a = t.op(f"vector.create_mask {na} : vector<{L}xi1>", "p") if inner_tail else None
    t.for_("%j0", t.c(0), t.c(shape[last]), t.c(L))
    mask_j = None
    if last_tail:
        nj = t.min_(t.op(f"arith.subi {t.c(shape[last])}, %j0 : index", "i"), t.c(L))
        mask_j = t.op(f"vector.create_mask {nj} : vector<{L}xi1>", "p")
    rows = []
    for i in range(L):  # rows past the edge repeat the last one; their lanes are not stored
        index[last] = row("%j0", i, shape[last], last_tail)
        index[inner] = a0
        at = f"{source}[{', '.join(index[d] for d in in_dims)}]"
        rows.append(t.op(f"vector.maskedload {at}, {mask_a}, {zero} : {src_t}, vector<{L}xi1>, {vt} into {vt}"
                         if mask_a else f"vector.load {at} : {src_t}, {vt}", "v"))
    for r, value in enumerate(transpose_in_registers(t, rows, dtype)):
        index[inner] = row(a0, r, shape[inner], inner_tail)
        index[last] = "%j0"
        mask = mask_j
        if inner_tail and r >= inner_tail:  # row r exists when r < na
            inside = t.op(f"vector.broadcast {t.cmp('ult', t.c(r), na)} : i1 to vector<{L}xi1>", "p")
            mask = t.op(f"arith.andi {mask_j}, {inside} : vector<{L}xi1>", "p") if mask_j else inside
        at = f"{out}[{', '.join(index[d] for d in range(len(shape)))}]"
        t.line(f"vector.maskedstore {at}, {mask}, {value} : {dst_t}, vector<{L}xi1>, {vt}"
               if mask else f"vector.store {value}, {at} : {dst_t}, {vt}")
    t.close()
    t.close_parallel() if parallel else t.close()
    return t.function_text(name, f"%arg0: {src}", result, dst, location)
