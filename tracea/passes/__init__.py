"""Tracea's target-neutral passes and pipelines (each backend's own are under tracea/targets/).
Importing this package registers these passes; importing tracea.targets registers the rest."""
from . import (channels_last, check_indices, exact_windows, fpowi, int_division, lower_to_linalg, outline_loops, raise_linalg,  # noqa: F401
               select_variant, widen_i1)  # (importing registers the passes)
from .pipeline import Pipeline, PipelineResult, parse_pipeline, run_pipeline
from .registry import PASSES, PIPELINES, TraceaPass, describe, register

__all__ = ["PASSES", "PIPELINES", "Pipeline", "PipelineResult", "TraceaPass", "describe",
           "parse_pipeline", "register", "run_pipeline"]
