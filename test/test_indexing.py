"""Indices read from tensors (embedding, x[idx], index_select, gather): in range, the compiled
model matches eager; out of range, it raises IndexError as eager does, never reads out of bounds
or aborts the process (tracea/passes/check_indices.py)."""
import pytest

import tracea  # before torch_mlir (see tracea/__init__.py)

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'tracea[torch]')")
pytest.importorskip("torch_mlir.fx", reason="torch-mlir is not installed (pip install 'tracea[torch]')")
nn = torch.nn

from model_zoo import Fn  # noqa: E402


class Embedding(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(100, 8)

    def forward(self, ids):
        return self.table(ids) * 2


CASES = {  # name -> (model, example inputs, good indices, bad indices), indices being the last input
    "embedding": (Embedding(), (torch.tensor([[1, 2, 3]]),), [[[0, 99, 50]]],
                  [[[100, 1, 2]], [[-1, 0, 0]], [[-101, 0, 0]]]),
    "x[idx]": (Fn(lambda x, i: x[i] + 1), (torch.randn(10, 4), torch.tensor([1, 2])),
               [[-1, -10], [9, 0]], [[10, 0], [-11, 0], [100_000_000, 0]]),
    "index_select": (Fn(lambda x, i: torch.index_select(x, 1, i)), (torch.randn(3, 6), torch.tensor([0, 5, 2])),
                     [[5, 5, 0]], [[6, 0, 0], [0, 0, -7]]),
    "gather": (Fn(lambda x, i: torch.gather(x, 1, i)), (torch.randn(4, 5), torch.zeros(4, 2, dtype=torch.long)),
               [[[4, 0], [1, 2], [3, 3], [0, 4]]], [[[0, 5], [1, 2], [3, 3], [0, 4]], [[0, 0], [0, 0], [0, 0], [-1, 0]]]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_indices_in_range_match_eager_and_out_of_range_raise_index_error(name):
    model, example, good, bad = CASES[name]
    model = model.eval()
    compiled = tracea.compile(model, example)
    fixed = example[:-1]
    for indices in good:
        i = torch.tensor(indices)
        torch.testing.assert_close(compiled(*fixed, i), model(*fixed, i), rtol=0, atol=0)
    for indices in bad:
        i = torch.tensor(indices)
        with pytest.raises((IndexError, RuntimeError)) as eager:
            model(*fixed, i)
        with pytest.raises(eager.type, match="index out of range"):  # caught as eager's error is
            compiled(*fixed, i)
    i = torch.tensor(good[0])  # a fault belongs to its call: the next one is clean
    torch.testing.assert_close(compiled(*fixed, i), model(*fixed, i), rtol=0, atol=0)


def test_one_bad_index_among_many_is_found():
    model = Embedding().eval()
    ids = torch.randint(0, 100, (64, 128), generator=torch.Generator().manual_seed(0))
    compiled = tracea.compile(model, (ids,))
    torch.testing.assert_close(compiled(ids), model(ids), rtol=0, atol=0)
    ids[63, 127] = 100
    with pytest.raises(IndexError):
        compiled(ids)


@pytest.mark.parametrize("model, shape", [
    (nn.AdaptiveAvgPool3d((3, 2, 4)), (2, 5, 7, 9)),  # windows read at computed indices, reduced
    (nn.MaxPool2d(3, stride=2, ceil_mode=True, return_indices=True), (1, 2, 9, 8)),
], ids=["adaptive_avg_pool3d", "max_pool2d_with_indices"])
def test_computed_indices_in_reductions_compile_whole(model, shape):
    """Their checks need every operand of the op to size the loops (the check once lost the
    reduction loops, an MLIR assertion that sent these ops to PyTorch)."""
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    compiled = tracea.compile(model.eval(), (x,))
    assert not compiled.placement.eager, compiled.explain()
    expected, got = model(x), compiled(x)
    for e, g in zip(expected if isinstance(expected, tuple) else (expected,), got if isinstance(got, tuple) else (got,)):
        torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-6)
