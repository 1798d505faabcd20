"""The NVIDIA backend: its Target (target.py: gpu kernels -> NVVM -> PTX -> cubin through ptxas),
its kernels (mma.py and wgmma.py Tensor Core GEMMs and convs, simt.py, attention.py,
wgmma_attention.py), their variant declarations (kernels.py) and the pipeline model they are
checked against (phase_cycle.py)."""
from . import kernels, target  # noqa: F401  (importing registers the target and its passes)
