"""The Doctor: what each device can do (capabilities.py), the kernel variants Tracea can emit
with their constraints and priorities (codegen/variants.py), the decision engine that picks one
(engine.py: `Context().plan_kernel(...)`), and the report `tracea doctor` prints (report.py)."""
from .capabilities import CPU, GPU, PROFILES, Capabilities, host, named
from .engine import Context, Decision, PlanError, devices, plan
from ..codegen.variants import Problem, Variant, variants

__all__ = ["CPU", "GPU", "PROFILES", "Capabilities", "Context", "Decision", "PlanError", "Problem", "Variant",
           "devices", "host", "named", "plan", "variants"]
