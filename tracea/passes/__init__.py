"""Tracea's passes and pipelines. Importing this package registers every pass."""
from . import (check_indices, cpu_kernels, cpu_linalg, fpowi, gpu_kernels, int_division, lower_to_linalg,  # noqa: F401
               outline_loops, raise_linalg, select_variant, widen_i1)  # (importing registers the passes)
from .pipeline import Pipeline, PipelineResult, parse_pipeline, run_pipeline
from .registry import PASSES, PIPELINES, TraceaPass, describe, register

__all__ = ["PASSES", "PIPELINES", "Pipeline", "PipelineResult", "TraceaPass", "describe",
           "parse_pipeline", "register", "run_pipeline"]
