"""A PyTorch model's convolutions computed channels-last (passes/channels_last.py): its imported
linalg rewritten once per model, and the filters it then takes as HWCF laid out from the module's
FCHW weights, once, and again only when a weight changes in place (its version counter moves),
so a compiled model still sees what the module holds, as the NCHW one did."""
from __future__ import annotations

import re

from .. import knobs
from ..errors import InternalCompilerError
from ..passes.channels_last import WEIGHT_LAYOUTS
from ..passes.pipeline import parse_pipeline, run_pipeline
from ..runtime import disk_cache
from .torch_import import first_line, warn_once

REVISION = "1"  # of the rewrite, in its disk-cache key


class WeightLayouts:
    """{weight number: the permutation of its dims the kernel takes it in}; called with the
    module's weights, gives the kernel's."""

    def __init__(self, permutations: dict[int, tuple[int, ...]] | None = None):
        self.permutations = permutations or {}
        self._laid_out: dict[int, tuple] = {}  # weight number -> (what it was made from, the copy)

    def __call__(self, weights: list) -> list:
        for i, perm in self.permutations.items():
            w = weights[i]
            source = (w.data_ptr(), w._version, tuple(w.shape), w.dtype)
            made = self._laid_out.get(i)
            if made is None or made[0] != source:
                made = self._laid_out[i] = (source, w.detach().permute(perm).contiguous())
            weights[i] = made[1]
        return weights


def read_layouts(text: str) -> WeightLayouts:
    """The tracea.weight_layouts attribute of a module's text (none: no weight changes layout)."""
    found = re.search(re.escape(WEIGHT_LAYOUTS) + r" = \{([^}]*)\}", text)
    if found is None:
        return WeightLayouts()
    return WeightLayouts({int(i): tuple(int(d) for d in dims.split(","))
                          for i, dims in re.findall(r'"(\d+)" = array<i64: ([\d, ]+)>', found.group(1))})


def channels_last(text: str, weights: int, import_key: str) -> tuple[str, WeightLayouts]:
    """`text` (a model's linalg, its first `weights` arguments the module's weights) with its
    convolutions NHWC where tracea-channels-last takes them, and the layouts of its weights. A
    failure of the rewrite (a bug) leaves the model NCHW, with a warning."""
    if not knobs.channels_last() or not weights or "linalg.conv_2d_nchw_fchw" not in text:
        return text, WeightLayouts()
    key = disk_cache.entry_key(["channels-last", REVISION, import_key, str(weights)])
    rewritten = disk_cache.lookup_text(key)
    if rewritten is None:
        pipeline = parse_pipeline(f"tracea-channels-last{{weights={weights}}}")
        try:
            result = run_pipeline(text, pipeline, source_name="the model's linalg")
            why = None if result.ok else "; ".join(str(d) for d in result.diagnostics)[:300]
        except InternalCompilerError as e:
            why = first_line(e)
        if why is not None:
            warn_once("channels-last", f"the model's convolutions stay NCHW: tracea-channels-last failed "
                      f"({why}); a bug in Tracea, please report it")
            return text, WeightLayouts()
        rewritten = result.text
        disk_cache.store_text(key, rewritten)
    return rewritten, read_layouts(rewritten)

