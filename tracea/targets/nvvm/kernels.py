"""tracea-gpu-kernels: each function computing one GEMM, NHWC conv2d or attention becomes an
NVIDIA kernel.

The function's gemm / fused_gemm is tiled onto thread blocks and warps: f16 / bf16 inputs onto
Tensor Cores — on sm_90a the Hopper kernel (targets/nvvm/wgmma.py: TMA + mbarrier pipeline, wgmma from
swizzled shared memory), on sm_80 targets/nvvm/mma.py (cp.async pipeline, swizzled shared memory,
ldmatrix + mma.sync m16n8k16), both with the fused epilogue — and f32 onto the SIMT kernel
(targets/nvvm/simt.py). An NHWC conv2d (f16 / bf16, groups 1) is an implicit GEMM on the mma.sync kernel,
its A tiles gathered from the image; attention is a flash-attention kernel (online softmax,
S x S never stored): on sm_90a targets/nvvm/wgmma_attention.py (producer warp, TMA, wgmma for Q K^T and,
with P from registers, P V), else targets/nvvm/attention.py on mma.sync. The result is a `gpu.module @kernels` holding one `gpu.func` per function, named
after it, whose parameters are the op's operands then the result buffer (then, for the Hopper
kernel, a pointer to each TMA descriptor); its launch configuration is the attribute
`tracea.launch = {grid, block, dynamic_shared_bytes[, tensor_maps]}`. The host function is
removed: kernels are launched by Tracea's runtime from that attribute (see runtime/gpu_artifact.py).

Tiles come from the op's schedule when it has one (tile = [BM, BN, BK], warp_tile = [WM, WN, ...],
stages), else from the defaults of the chosen kernel.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import mlir.ir as ir

from ...dialects.ops import OpView
from ...dialects.schedule import Schedule
from ...doctor.capabilities import Capabilities, named
from ...codegen.variants import (ArchIs, BackendIs, DtypeIn, Problem, Rule, SharedMemoryAtLeast, SmAtLeast, Variant,
                               WarpSizeIs, register_variant)
from ...errors import OpError
from ...tuner.space import SearchSpace
from ...codegen.conv_gather import conv_epilogue, implicit_gemm
from .attention import HEAD_DIMS, AttentionTiles, MmaAttention, attention_module_text
from .attention import grid as attention_grid
from .simt import SimtTiles, simt_gemm_module_text
from .simt import grid as simt_grid
from .mma import GROUP_M, MMA_DTYPES, MmaGemm, MmaTiles, mma_gemm_module_text
from .mma import grid as mma_grid
from .wgmma import TensorMap, WgmmaTiles, tensor_maps, wgmma_gemm_module_text
from .wgmma import default_tiles as default_wgmma_tiles
from .wgmma import grid as wgmma_grid
from . import wgmma_attention
from .wgmma_attention import WgmmaAttentionTiles
from ...codegen.gpu_kernels import functions_to_kernels
from ...passes.registry import TraceaPass, option, register

CHIPS = ("sm_80", "sm_90a")


@dataclass(frozen=True)
class Launch:
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_shared_bytes: int
    tensor_maps: tuple[TensorMap, ...] = ()  # one trailing !llvm.ptr kernel parameter each

    def to_attr(self) -> ir.Attribute:
        i64 = ir.IntegerType.get_signless(64)
        fields = {"grid": ir.DenseI64ArrayAttr.get(list(self.grid)),
                  "block": ir.DenseI64ArrayAttr.get(list(self.block)),
                  "dynamic_shared_bytes": ir.IntegerAttr.get(i64, self.dynamic_shared_bytes)}
        if self.tensor_maps:
            fields["tensor_maps"] = ir.ArrayAttr.get([ir.DenseI64ArrayAttr.get([m.operand, *m.box, m.swizzle_bytes, m.rank])
                                                      for m in self.tensor_maps])
        return ir.DictAttr.get(fields)

    @staticmethod
    def of(code: dict, kernel: str) -> "Launch":
        """Kernel `kernel`'s launch from a target's code (its "launches": kernel -> attribute text)."""
        from ...dialects.context import shared_context
        with shared_context("host"):
            return Launch.from_attr(ir.Attribute.parse(code["launches"][kernel]))

    @staticmethod
    def from_attr(attr: ir.Attribute) -> "Launch":
        d = ir.DictAttr(attr)
        maps = ()
        if "tensor_maps" in d:
            maps = tuple(TensorMap(v[0], (v[1], v[2]), v[3], v[4])
                         for v in (list(ir.DenseI64ArrayAttr(a)) for a in ir.ArrayAttr(d["tensor_maps"])))
        return Launch(tuple(ir.DenseI64ArrayAttr(d["grid"])), tuple(ir.DenseI64ArrayAttr(d["block"])),
                      ir.IntegerAttr(d["dynamic_shared_bytes"]).value, maps)


def _refuse_pingpong(s: Schedule, kernel: str) -> None:
    if s.barrier == "pingpong":
        raise OpError(f"schedule barrier 'pingpong' (MMA warpgroups taking turns) is for the sm_90a attention "
                      f"kernel; {kernel} takes 'none' or 'producer_consumer'")


def _schedule(v: OpView) -> Schedule:
    """The op's schedule, which tracea-select-variant completed: the emitters read their tiles
    from it and choose nothing."""
    s = v.attrs.get("schedule")
    if s is None or s.tile is None:
        raise OpError("the kernel's schedule has no tile: run tracea-select-variant first")
    return s


def _gemm_tile(s: Schedule) -> tuple[int, int, int]:
    if len(s.tile) != 3:
        raise OpError(f"an NVIDIA GEMM schedule needs tile = [BM, BN, BK], got {list(s.tile)}")
    return s.tile


def mma_tiles(s: Schedule) -> MmaTiles:
    _refuse_pingpong(s, "the GEMM")
    hopper_only = [key for key, asked in (("cluster", s.cluster > 1), ("persistent", s.persistent > 0),
                                          ("store 'tma'", s.store == "tma")) if asked]
    if hopper_only:
        raise OpError(f"schedule {' and '.join(hopper_only)}: only the sm_90a GEMM of plain matrices (TMA, wgmma) "
                      "takes it; this op runs the mma.sync kernel (sm_80, convs, a batched B or a transposed A), "
                      "which launches a block per output tile and stores from registers")
    bm, bn, bk = _gemm_tile(s)
    wm, wn = (s.warp_tile[:2] if s.warp_tile else (min(bm, 64), min(bn, 64)))
    return MmaTiles(bm, bn, bk, wm, wn, s.stages, s.group_m or GROUP_M)


def wgmma_tiles(s: Schedule) -> WgmmaTiles:
    """On sm_90a warp_tile is a warpgroup's share of the block tile ([BM / warpgroups, BN, BK]);
    barrier = "producer_consumer" (implied by several warpgroups, persistent or a cluster) gives the
    copies to a producer warp; persistent = n: n blocks loop over the output tiles; cluster = 2:
    pairs of blocks share their B tiles; store = "tma": the epilogue goes out through shared memory
    and TMA stores."""
    _refuse_pingpong(s, "the GEMM")
    bm, bn, bk = _gemm_tile(s)
    warpgroups = bm // s.warp_tile[0] if s.warp_tile else 1
    producer = s.persistent > 0 or s.cluster > 1
    return WgmmaTiles(bm, bn, s.stages, bk, warpgroups, s.barrier == "producer_consumer" or warpgroups > 1 or producer,
                      persistent=s.persistent, group_m=s.group_m or GROUP_M, cluster=max(s.cluster, 1),
                      tma_store=s.store == "tma")


def _attention_schedule(s: Schedule) -> Schedule:
    if s.persistent or s.group_m or s.cluster > 1 or s.store != "registers":
        raise OpError("schedule persistent, group_m, cluster and store are for the NVIDIA GEMMs; attention launches "
                      "a block per query tile of each batch-head and stores from registers")
    return s


def wgmma_attention_tiles(s: Schedule) -> WgmmaAttentionTiles:
    """The MMA warpgroups take turns at the Tensor Cores unless the barrier is "producer_consumer"."""
    s = _attention_schedule(s)
    return WgmmaAttentionTiles(*s.tile[:2], s.stages, pingpong=s.barrier != "producer_consumer")


def attention_tiles(s: Schedule) -> AttentionTiles:
    _refuse_pingpong(_attention_schedule(s), "the mma.sync attention kernel")
    return AttentionTiles(*s.tile[:2], s.stages)


def mma_gemm(v: OpView) -> MmaGemm:
    """The matrix product a gemm / fused_gemm computes: a batched A times a shared B is one GEMM
    over all its rows; with a batched B or a batched A^T block z does matrix z."""
    a, b = v.operands["a"], v.operands["b"]
    transpose_a = v.attrs["transpose_a"]
    lead, (rows, k) = a.shape[:-2], a.shape[-2:]
    if transpose_a:
        k, rows = rows, k
    batched_b = b.rank > 2
    m = rows if batched_b or transpose_a else math.prod(lead) * rows
    n = b.shape[-2] if v.attrs["transpose_b"] else b.shape[-1]
    return MmaGemm(m, n, k, a.dtype, v.result.dtype, v.attrs["transpose_b"], tuple(v.attrs.get("epilogue", ())),
                   v.operands["bias"].dtype if "bias" in v.operands else None,
                   v.operands["residual"].dtype if "residual" in v.operands else None, lead=lead,
                   batched_b=batched_b, transpose_a=transpose_a)


def emit_wgmma_gemm(v: OpView, name: str, caps: Capabilities | None = None) -> tuple[str, Launch]:
    g, tiles = mma_gemm(v), wgmma_tiles(_schedule(v))
    return wgmma_gemm_module_text(g, tiles, name), Launch(
        wgmma_grid(g, tiles), (tiles.threads, 1, 1), tiles.shared_bytes(), tensor_maps(g, tiles))


def emit_mma_gemm(v: OpView, name: str, caps: Capabilities | None = None) -> tuple[str, Launch]:
    g, tiles = mma_gemm(v), mma_tiles(_schedule(v))
    return mma_gemm_module_text(g, tiles, name), Launch(mma_grid(g, tiles), (tiles.threads, 1, 1),
                                                        tiles.shared_bytes())


def simt_gemm(v: OpView, name: str, spirv: bool = False, tiles: SimtTiles = SimtTiles()) -> tuple[str, Launch]:
    """A gemm / fused_gemm on the SIMT kernel (`spirv`: written for MLIR's SPIR-V conversion).
    NVIDIA's fallback keeps the default tiles; the Vulkan and Metal targets pass their schedule's."""
    return _simt(mma_gemm(v), name, spirv, tiles)


def simt_conv(v: OpView, name: str, spirv: bool = False, tiles: SimtTiles = SimtTiles()) -> tuple[str, Launch]:
    """An NHWC conv2d as an implicit GEMM on the SIMT kernel, its A tiles gathered from the image."""
    return _simt(conv_gemm(v), name, spirv, tiles)


def conv_gemm(v: OpView) -> MmaGemm:
    """The implicit GEMM of an NHWC conv2d: A gathered from the image, the HWCF filter as B, the
    bias and the conv's epilogue as the GEMM's."""
    m, n, k, gather = implicit_gemm(v)
    bias = v.operands.get("bias")
    return MmaGemm(m, n, k, gather.image.dtype, v.result.dtype, False, conv_epilogue(v),
                   bias.dtype if bias else None, None, gather)


def _simt(g: MmaGemm, name: str, spirv: bool, tiles: SimtTiles) -> tuple[str, Launch]:
    x, y = tiles.threads
    return simt_gemm_module_text(g, tiles, name, spirv=spirv), Launch(
        simt_grid(g.m, g.n, tiles, math.prod(g.lead) if g.batch_grid else 1), (x, y, 1), 0)


def emit_simt_gemm(v: OpView, name: str, caps: Capabilities | None = None) -> tuple[str, Launch]:
    return simt_gemm(v, name)


def emit_conv(v: OpView, name: str, caps: Capabilities | None = None) -> tuple[str, Launch]:
    """An NHWC conv2d as an implicit GEMM on the mma.sync kernel (on sm_90a too: its A tiles are
    gathers, which TMA's tiled mode does not do)."""
    g = conv_gemm(v)
    tiles = mma_tiles(_schedule(v))
    return mma_gemm_module_text(g, tiles, name), Launch(mma_grid(g, tiles), (tiles.threads, 1, 1), tiles.shared_bytes())


def mma_attention(v: OpView) -> MmaAttention:
    q, k = v.operands["query"], v.operands["key"]
    scale = v.attrs.get("scale")
    return MmaAttention(q.shape[:-2], q.shape[-2], k.shape[-2], q.shape[-1], q.dtype, v.result.dtype,
                        q.shape[-1] ** -0.5 if scale is None else scale, v.attrs["causal"])


def emit_wgmma_attention(v: OpView, name: str, caps: Capabilities | None = None) -> tuple[str, Launch]:
    a, tiles = mma_attention(v), wgmma_attention_tiles(_schedule(v))
    return wgmma_attention.wgmma_attention_module_text(a, tiles, name), Launch(
        attention_grid(a, tiles), (tiles.threads, 1, 1), tiles.shared_bytes(a.head_dim),
        wgmma_attention.tensor_maps(a, tiles))


def emit_mma_attention(v: OpView, name: str, caps: Capabilities | None = None) -> tuple[str, Launch]:
    a, tiles = mma_attention(v), attention_tiles(_schedule(v))
    return attention_module_text(a, tiles, name), Launch(attention_grid(a, tiles), (tiles.threads, 1, 1),
                                                         tiles.shared_bytes(a.head_dim))


# -- NVIDIA's kernel variants -----------------------------------------------------------------

def _complete(p: Problem, fields: dict) -> Schedule:
    """The default tiles, or the op's own schedule given them where it has no tile (its other
    fields kept)."""
    s = p.schedule
    if s is None:
        return Schedule(**fields)
    if s.tile is not None:
        return s
    if s.barrier != "none":  # the op's own barrier is kept (and checked)
        fields = {k: value for k, value in fields.items() if k != "barrier"}
    return replace(s, **fields)


def _mma_default(p: Problem, caps: Capabilities, threads: int | None) -> Schedule:
    t = MmaTiles()
    return _complete(p, dict(tile=(t.block_m, t.block_n, t.block_k), warp_tile=(t.warp_m, t.warp_n, t.block_k),
                             stages=t.stages))


def _wgmma_default(p: Problem, caps: Capabilities, threads: int | None) -> Schedule | None:
    if p.schedule is not None and p.schedule.tile is not None:
        return p.schedule
    if p.view is None:
        return None  # the tiles follow the shapes (a full wave of blocks): chosen when compiling
    t = default_wgmma_tiles(mma_gemm(p.view))
    return _complete(p, dict(tile=(t.block_m, t.block_n, t.block_k), stages=t.stages,
                             warp_tile=(t.block_m // t.warpgroups, t.block_n, t.block_k),
                             barrier="producer_consumer" if t.specialized else "none"))


def _attention_default(p: Problem, caps: Capabilities, threads: int | None) -> Schedule:
    t = AttentionTiles()
    return _complete(p, dict(tile=(t.block_m, t.block_n), stages=t.stages))


def _wgmma_attention_default(p: Problem, caps: Capabilities, threads: int | None) -> Schedule | None:
    if p.head_dim is None:
        return None
    t = wgmma_attention.default_tiles(MmaAttention((), 1, 1, p.head_dim, p.dtype, p.dtype, 1.0, False))
    return _complete(p, dict(tile=(t.block_m, t.block_n), stages=t.stages, barrier="pingpong"))


def _gemm_space(p: Problem, caps: Capabilities) -> SearchSpace:
    """Schedules bench/gpu.py times beside the defaults."""
    if caps.gpu.arch == "sm_90a":
        return (SearchSpace().knob("tile", [(128, 256, 64), (256, 128, 64), (128, 128, 64), (64, 128, 64)])
                .stages([2, 3, 4, 6]).barrier_modes(["none", "producer_consumer"])
                .knob("persistent", [0, caps.gpu.multiprocessors]).knob("cluster", [0, 2])
                .knob("group_m", [1, 8, 16]).knob("store", ["registers", "tma"]))
    return (SearchSpace().knob("tile", [(128, 256, 32), (256, 128, 32), (128, 128, 32), (128, 128, 64), (64, 64, 32)])
            .stages([2, 3, 4]).knob("group_m", [1, 8, 16]))


def _attention_space(p: Problem, caps: Capabilities) -> SearchSpace:
    if caps.gpu.arch == "sm_90a":
        return (SearchSpace().knob("tile", [(128, 128), (192, 64), (128, 64)]).stages([2, 3, 4])
                .barrier_modes(["pingpong", "producer_consumer"]))
    return SearchSpace().knob("tile", [(64, 64), (128, 64)]).stages([2, 3])


def _check_mma(p: Problem, caps: Capabilities, s: Schedule) -> None:
    mma_tiles(s).validate()


def _check_wgmma(p: Problem, caps: Capabilities, s: Schedule) -> None:
    wgmma_tiles(s).validate(bool(p.transpose_b))


def _check_attention(p: Problem, caps: Capabilities, s: Schedule) -> None:
    attention_tiles(s).validate(p.head_dim)


def _check_wgmma_attention(p: Problem, caps: Capabilities, s: Schedule) -> None:
    wgmma_attention_tiles(s).validate(p.head_dim)


def _holds(*facts):
    """A rule's check: None while any fact is unknown, else the predicate's answer."""
    def wrap(predicate):
        return lambda p, caps: None if any(getattr(p, f) is None for f in facts) else predicate(p)
    return wrap


ON_CUDA, TENSOR_CORE_DTYPES = BackendIs("cuda"), DtypeIn(MMA_DTYPES)
WARPS = WarpSizeIs(32)  # lane mappings of 32-thread warps throughout
ROWS_IN_CHUNKS = Rule("K and N multiples of 8 (rows of whole 16-byte chunks for the Tensor Cores' copies)",
                      _holds("k", "n")(lambda p: p.k % 8 == 0 and p.n % 8 == 0))
TRANSPOSED_ROWS = Rule("M a multiple of 8 when A is transposed",
                       _holds("transpose_a", "m")(lambda p: not p.transpose_a or p.m % 8 == 0))
VALUE_HEAD_DIM = Rule("value's head dim equal to the query's",
                      _holds("head_dim", "value_head_dim")(lambda p: p.head_dim == p.value_head_dim))
GEMMS = ("gemm", "fused_gemm")
TENSOR_CORES = frozenset({"matrix_units", "async_copy", "pipelined"})
EMITTERS = {}
for _variant, _emitter in (
    (Variant("cuda.gemm.wgmma", "cuda", GEMMS, (ON_CUDA, WARPS, ArchIs("sm_90a"), SharedMemoryAtLeast(
        192 * 1024), TENSOR_CORE_DTYPES, ROWS_IN_CHUNKS, Rule(
        "a plain A (not transposed) times one B (not batched)",
        lambda p, caps: False if p.transpose_a or p.batched_b else None if None in (p.transpose_a, p.batched_b)
        else True)), 30,
        "Hopper: TMA copies paced by mbarriers, wgmma from swizzled shared memory, a producer warp, fused epilogue",
        TENSOR_CORES, _wgmma_default, _gemm_space, _check_wgmma), emit_wgmma_gemm),
    (Variant("cuda.gemm.mma_sync", "cuda", GEMMS, (ON_CUDA, WARPS, SmAtLeast(80), SharedMemoryAtLeast(48 * 1024),
                                                  TENSOR_CORE_DTYPES, ROWS_IN_CHUNKS, TRANSPOSED_ROWS), 20,
             "cp.async pipeline, XOR-swizzled shared memory, ldmatrix + mma.sync m16n8k16, fused epilogue",
             TENSOR_CORES, _mma_default, _gemm_space, _check_mma), emit_mma_gemm),
    (Variant("cuda.gemm.simt", "cuda", GEMMS, (ON_CUDA, WARPS), 10,
             "CUDA cores, fixed tiles: f32, and 16-bit matrices whose rows are not whole 16-byte chunks",
             frozenset({"simd"})), emit_simt_gemm),
    (Variant("cuda.conv2d.implicit_gemm", "cuda", ("conv2d",), (ON_CUDA, WARPS, SmAtLeast(80), TENSOR_CORE_DTYPES, Rule(
        "layout='nhwc' (filter HWCF; transpose an NCHW input to NHWC first)",
        _holds("layout")(lambda p: p.layout == "nhwc")), Rule("groups=1", _holds("groups")(lambda p: p.groups == 1))),
        20, "the mma.sync GEMM with its A tiles gathered from the NHWC image", TENSOR_CORES, _mma_default,
        _gemm_space, _check_mma), emit_conv),
    (Variant("cuda.attention.wgmma", "cuda", ("attention",), (ON_CUDA, WARPS, ArchIs("sm_90a"), TENSOR_CORE_DTYPES, Rule(
        "a head dim of 64, 128, 192 or 256", _holds("head_dim")(lambda p: p.head_dim % 64 == 0 and p.head_dim <= 256)),
        VALUE_HEAD_DIM), 30,
        "flash attention: a producer warp, TMA, wgmma for Q K^T and (P from registers) P V, MMA warpgroups "
        "taking turns", TENSOR_CORES, _wgmma_attention_default, _attention_space, _check_wgmma_attention),
     emit_wgmma_attention),
    (Variant("cuda.attention.mma_sync", "cuda", ("attention",), (ON_CUDA, WARPS, SmAtLeast(80), TENSOR_CORE_DTYPES, Rule(
        f"a head dim of {', '.join(map(str, HEAD_DIMS))} (pad Q, K and V's last dim with zeros to the next one)",
        _holds("head_dim")(lambda p: p.head_dim in HEAD_DIMS)), VALUE_HEAD_DIM), 20,
        "flash attention: cp.async K/V pipeline, ldmatrix + mma.sync, online softmax in registers",
        TENSOR_CORES, _attention_default, _attention_space, _check_attention), emit_mma_attention),
):
    register_variant(_variant)
    EMITTERS[_variant.id] = _emitter


KERNEL_OPS = ("tracea.gemm", "tracea.fused_gemm", "tracea.conv2d", "tracea.attention")


@register
@dataclass(frozen=True)
class GpuKernelsPass(TraceaPass):
    NAME = "tracea-gpu-kernels"
    SUMMARY = ("tile each function's gemm / fused_gemm / NHWC conv2d / attention onto NVIDIA thread blocks and warps: a "
               "gpu.module kernel (f16/bf16 GEMMs on sm_90a: TMA + mbarrier pipeline, wgmma; on sm_80, and convs "
               "as implicit GEMMs: cp.async pipeline, swizzled shared memory, ldmatrix + mma.sync; attention: flash "
               "attention on wgmma (sm_90a) or mma.sync; f32: SIMT) with its launch configuration")
    chip: str = option("sm_80", "the NVIDIA architecture the kernels are for", CHIPS)

    def run(self, module: ir.Operation) -> None:
        functions_to_kernels(module, named(self.chip), KERNEL_OPS, "NVIDIA", EMITTERS, self.NAME)


@register
@dataclass(frozen=True)
class ExternDynamicSharedPass(TraceaPass):
    """MLIR lowers `gpu.dynamic_shared_memory` to an internal zero-sized shared global, which the
    NVPTX back end demotes to a 1-byte *static* variable; ptxas then lays it out with the other
    static shared variables (the Hopper kernel's mbarriers) and the kernel's tiles, addressed
    from it, overlap them. External linkage makes it `.extern .shared .b8 __dynamic_shmem__0[]`,
    which ptxas places after every static variable: the dynamic shared memory proper."""
    NAME = "tracea-extern-dynamic-shared"
    SUMMARY = "give the dynamic shared memory symbol external linkage (an .extern .shared array after the static ones)"

    def run(self, module: ir.Operation) -> None:
        external = ir.Attribute.parse("#llvm.linkage<external>")

        def visit(op):
            op = op.operation
            if op.name == "llvm.mlir.global" and \
                    ir.StringAttr(op.attributes["sym_name"]).value.startswith("__dynamic_shmem__"):
                op.attributes["linkage"] = external
            return ir.WalkResult.ADVANCE

        module.walk(visit)
