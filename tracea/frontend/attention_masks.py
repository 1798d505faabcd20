"""Attention masks that do not depend on the model's inputs, settled at import.

Hugging Face models (transformers 5) build the mask they pass to scaled_dot_product_attention
from index arithmetic in the graph (arange, comparisons, cumsum): all true for an encoder called
without a padding mask (BERT, ViT), lower-triangular for a decoder (GPT-2, Llama). torch-mlir
lowers SDPA with any mask to the scores plus a bias, which the raise would make the flash
kernel's mask operand (a tensor read per score). Evaluated once here, an all-true (or all-zero
additive) mask is dropped and a causal one becomes `is_causal=True`, neither then read; any
other mask is left as it is (and becomes the mask operand)."""
from __future__ import annotations

import functools
import operator

# Masks are evaluated in full: bigger constant subgraphs are left alone (1 << 22 elements is
# 16 MB of f32, a 2048 x 2048 mask).
MAX_ELEMENTS = 1 << 22
# An additive mask's "masked" entries: -inf, or HF's torch.finfo(float32).min (exp(min - max)
# is 0 in f32 whenever a row keeps one finite score, which a causal row always does).
MASKED_AT_MOST = -3.0e38


def settle_constant_masks(graph_module) -> int:
    """Rewrite, in place, the SDPA calls of an ATen graph whose mask is input-independent and all
    true / all zero (mask dropped) or causal (is_causal=True). Returns how many were rewritten."""
    import torch
    sdpa = torch.ops.aten.scaled_dot_product_attention.default
    values: dict = {}  # node -> its value, or None when it depends on an input
    rewritten = 0
    for node in graph_module.graph.nodes:
        if node.op != "call_function" or node.target is not sdpa:
            continue
        arguments = dict(zip(("query", "key", "value", "attn_mask", "dropout_p", "is_causal"), node.args))
        arguments.update(node.kwargs)
        mask = arguments.get("attn_mask")
        if not isinstance(mask, torch.fx.Node) or arguments.get("dropout_p", 0.0) != 0.0 \
                or arguments.get("is_causal", False):
            continue
        kind = _mask_kind(_value(mask, values), _length(arguments["query"]), _length(arguments["key"]))
        if kind is None:
            continue
        kept = {k: v for k, v in arguments.items() if k not in ("query", "key", "value", "attn_mask", "is_causal")}
        node.args = (arguments["query"], arguments["key"], arguments["value"])
        node.kwargs = {**kept, **({"is_causal": True} if kind == "causal" else {})}
        rewritten += 1
    if rewritten:
        graph_module.graph.eliminate_dead_code()
        graph_module.recompile()
    return rewritten


def _length(node) -> int | None:
    value = node.meta.get("val") if hasattr(node, "meta") else None
    size = value.shape[-2] if value is not None and value.dim() >= 2 else None
    return size if isinstance(size, int) else None  # (a symbolic length: not settled)


def _mask_kind(mask, queries: int | None, keys: int | None) -> str | None:
    """"none" for a mask that masks nothing, "causal" for torch's top-left lower triangle (key j
    kept for query i iff j <= i) in every batch and head, else None."""
    import torch
    if mask is None or queries is None or keys is None or mask.dim() < 2:
        return None
    try:
        mask = torch.broadcast_to(mask, mask.shape[:-2] + (queries, keys))
    except RuntimeError:
        return None
    keep = torch.ones(queries, keys, dtype=torch.bool).tril()
    if mask.dtype == torch.bool:
        if bool(mask.all()):
            return "none"
        return "causal" if bool((mask == keep).all()) else None
    if not mask.is_floating_point():
        return None
    if bool((mask == 0).all()):
        return "none"
    causal = (mask == 0) & keep | (mask <= MASKED_AT_MOST) & ~keep
    return "causal" if bool(causal.all()) else None


@functools.cache
def _shape_only_ops():
    """Ops that read only their argument's shape, dtype and device, never its values."""
    import torch
    aten = torch.ops.aten
    return {aten.new_ones.default, aten.new_zeros.default, aten.new_full.default, aten.new_empty.default,
            aten.ones_like.default, aten.zeros_like.default, aten.full_like.default, aten.empty_like.default}


class _InputDependent(Exception):
    pass


def _value(node, values: dict):
    """The value of `node` computed from constants alone (it reads no input, weight or buffer, and
    draws no random numbers), or None."""
    import torch
    if node in values:
        return values[node]
    values[node] = None  # (until computed)
    traced = node.meta.get("val")
    if node.op != "call_function" or (isinstance(traced, torch.Tensor) and traced.numel() > MAX_ELEMENTS) \
            or torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ()) \
            or not (node.target is operator.getitem or isinstance(node.target, torch._ops.OpOverload)):
        return None
    shape_only = node.target in _shape_only_ops()

    def argument(a, first: bool):
        if shape_only and first:  # only its metadata is read: any tensor like it will do
            example = a.meta.get("val")
            if not isinstance(example, torch.Tensor):
                raise _InputDependent
            return torch.empty(example.shape, dtype=example.dtype)
        value = _value(a, values)
        if value is None:
            raise _InputDependent
        return value

    try:
        args = [torch.fx.node.map_arg(a, lambda n, first=i == 0: argument(n, first)) for i, a in enumerate(node.args)]
        kwargs = {k: torch.fx.node.map_arg(v, lambda n: argument(n, False)) for k, v in node.kwargs.items()}
        with torch.no_grad():
            result = node.target(*args, **kwargs)
    except Exception:  # noqa: BLE001 - input-dependent, or anything this cannot evaluate: left as it is
        return None
    if isinstance(result, torch.Tensor) and result.numel() > MAX_ELEMENTS:
        return None
    values[node] = result
    return result
