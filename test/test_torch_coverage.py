"""A sample of what torch-mlir's e2e suite exercises (scripts/torch_mlir_e2e.py runs all of it
against a checkout), written here so that CI runs it: one module per kind of construct that once
failed, each compared with eager PyTorch. Ops torch-mlir leaves outside linalg must run through
the partial fallback, everything else compiles; nothing may crash."""
import warnings

import pytest

import tracea  # before torch_mlir (see tracea/__init__.py)

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'tracea[torch]')")
pytest.importorskip("torch_mlir.fx", reason="torch-mlir is not installed (pip install 'tracea[torch]')")

g = torch.Generator().manual_seed(0)


def rand(*shape, dtype=torch.float32):
    return torch.randn(shape, generator=g).to(dtype)


from model_zoo import Fn  # noqa: E402


# name -> (function, inputs, ops expected in PyTorch: None = whatever the fallback picks)
CASES = {
    # torch-mlir lowers these to TMTensor ops: they run in PyTorch, the rest compiles
    "index_put": (lambda x, i, v: torch.relu(x.index_put((i,), v)) * 2,
                  (rand(6, 4), torch.tensor([4, 1, 1]), rand(3, 4)), {"aten.index_put.default"}),
    "scatter_reduce": (lambda x, i, s: x.scatter_reduce(0, i, s, "amax") + 1,
                       (rand(4, 5), torch.tensor([[0, 1, 2, 0, 3]]), rand(1, 5)), None),
    "sort_topk": (lambda x: torch.sort(x, 1).values[:, :2] + torch.topk(x, 2).values,
                  (rand(5, 7),), None),
    "fallback_with_outputs": (lambda x: (torch.sort(x, 1).values * 2, x.sum(0), x.amax(1)),  # each in its place
                              (rand(5, 7),), {"aten.sort.default"}),
    "cumsum": (lambda x: torch.cumsum(x * 3, 1).tanh(), (rand(4, 9),), set()),
    "complex": (lambda x: torch.view_as_real(torch.fft.rfft(x)).sum(-1) * 2, (rand(4, 16),), None),
    # these compile
    "broadcast_0d": (lambda a, b: a + b, (rand(3, 4), rand()), set()),
    "bool_result": (lambda x: (x > 0).all(), (rand(3, 4),), set()),
    "uint8": (lambda x: x // 3 + x, ((rand(4, 6) * 40).abs().to(torch.uint8),), None),
    "bf16": (lambda x: torch.nn.functional.gelu(x) * x, (rand(4, 8, dtype=torch.bfloat16),), set()),
    "f64_softmax": (lambda x: torch.softmax(x, -1), (rand(3, 7, dtype=torch.float64),), set()),
    "int_fmod": (lambda a, b: torch.fmod(a, b) + a // b, (torch.tensor([7, -7, 9, 0]), torch.tensor([2, 3, -4, 5])),
                 set()),
    "gemm_k0": (lambda a, b: a @ b + 1, (rand(3, 0), rand(0, 4)), set()),
    "adaptive_pool": (lambda x: torch.nn.functional.adaptive_avg_pool2d(x, (3, 5)), (rand(1, 2, 7, 11),), None),
    "conv_transpose": (lambda x, w: torch.nn.functional.conv_transpose2d(x, w, stride=2, padding=1),
                       (rand(1, 3, 5, 6), rand(3, 2, 3, 3)), set()),
    "determinant": (lambda x: torch.linalg.det(x), (rand(2, 3, 3),), None),
    "bucketize": (lambda x, b: torch.bucketize(x, b), (rand(10), torch.tensor([-1.0, 0.0, 0.5, 2.0])), set()),
    "data_dependent": (lambda x: x * 2 if x.sum().item() > 0 else x - 1, (rand(4),), None),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_construct_compiles_or_falls_back_and_matches_eager(name):
    fn, inputs, expected_eager = CASES[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        compiled = tracea.compile(Fn(fn), inputs)
    got, want = compiled(*inputs), fn(*inputs)
    got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
    for have, expected in zip(got, want):
        assert have.dtype == expected.dtype and have.shape == expected.shape
        if expected.dtype.is_floating_point:
            tolerance = {torch.bfloat16: 1e-2, torch.float16: 2e-3}.get(expected.dtype, 1e-5)
            torch.testing.assert_close(have, expected, rtol=tolerance, atol=tolerance)
        else:
            assert torch.equal(have, expected)
    if expected_eager is not None:
        assert set(compiled.placement.eager) == expected_eager, compiled.explain()
    assert compiled.placement.compiled or compiled.placement.eager
