"""Real models (Hugging Face transformers and torchvision, built from configs with random
weights) compiled with tracea.compile and checked against eager PyTorch at f32 precision."""
import warnings

import pytest

import tracea  # before torch_mlir (see tracea/__init__.py)

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'tracea[torch]')")
pytest.importorskip("torch_mlir.fx", reason="torch-mlir is not installed (pip install 'tracea[torch]')")
pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[test]')")

import model_zoo  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402

# ops known to run in PyTorch: torch-mlir lowers cumsum to tm_tensor.scan (HF's position ids)
EXPECTED_EAGER = {"gpt2": {"aten.cumsum.default"}, "llama": {"aten.cumsum.default"}}


@pytest.mark.parametrize("name", sorted(model_zoo.MODELS))
def test_model_compiles_and_matches_eager(name):
    model, inputs = model_zoo.build(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the per-op fallback warnings: checked below
        compiled = tracea.compile(model, inputs)
    assert set(compiled.placement.eager) <= EXPECTED_EAGER.get(name, set()), compiled.explain()
    assert sum(compiled.placement.compiled.values()) > 20
    with torch.no_grad():
        expected = model(*inputs)
    got = compiled(*inputs)
    assert type(got) is type(expected)
    pairs = list(zip(tree_leaves(expected), tree_leaves(got)))
    assert pairs and len(tree_leaves(expected)) == len(tree_leaves(got))
    for want, have in pairs:
        assert have.dtype == want.dtype and have.shape == want.shape
        scale = want.abs().max().item()
        assert scale > 1e-3, "an output that is all but zero tests nothing"
        torch.testing.assert_close(have, want, rtol=1e-4, atol=1e-4 * scale)
