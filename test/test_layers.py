"""Repeated layers imported and compiled once (tracea/frontend/layers.py): the split into pieces,
the stitched linalg module against torch-mlir's whole import, and the compiled model against
eager PyTorch."""
import re

import numpy as np
import pytest

import tracea  # before torch_mlir (see tracea/__init__.py)

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'tracea[torch]')")
pytest.importorskip("torch_mlir.fx", reason="torch-mlir is not installed (pip install 'tracea[torch]')")
nn = torch.nn

from tracea.errors import CompileError  # noqa: E402
from tracea.frontend import layers  # noqa: E402
from tracea.frontend.torch_import import export_model, to_linalg  # noqa: E402


class Block(nn.Module):
    """What crosses a layer's edges here: an f32 activation, a bool mask made once outside the
    layers, and a second result (a running sum); inside, a constant torch lifts out of the code."""

    def __init__(self, width):
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x, mask, total):
        h = torch.nn.functional.gelu(self.linear(self.norm(x)))
        h = torch.where(mask, h, torch.tensor(-0.5))
        return x + h, total + h.sum(-1, keepdim=True)


class Stack(nn.Module):
    def __init__(self, widths=(16,) * 5, shared_repeats=0, halve_at=None):
        super().__init__()
        self.halve_at = halve_at  # the block before which the sequence is halved
        self.blocks = nn.ModuleList(Block(w) for w in widths)
        self.widen = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths, widths[1:]) if a != b)
        self.shared = Block(widths[-1])
        self.shared_repeats = shared_repeats
        self.head = nn.Linear(widths[-1], 3)

    def forward(self, x):
        mask = x[..., :1] > -0.5
        total = torch.zeros(x.shape[:-1] + (1,))
        widen = iter(self.widen)
        for i, block in enumerate(self.blocks):
            if i == self.halve_at:
                x, mask, total = x[:, ::2], mask[:, ::2], total[:, ::2]
            if x.shape[-1] != block.linear.in_features:
                x = next(widen)(x)
                mask = x[..., :1] > -0.5
            x, total = block(x, mask, total)
        for _ in range(self.shared_repeats):
            x, total = self.shared(x, mask, total)  # not in a ModuleList: one piece, not layers
        return self.head(x), total


def _exported(model, x):
    return export_model(model.eval(), (x,))


def _signature(text):
    """The public function's argument and result types."""
    match = re.search(r'function_type = \(([^)]*)\) -> (\([^)]*\)|[^,}]*), sym_name = "main"', text)
    return match.group(1), match.group(2)


def test_repeated_layers_are_imported_once_and_match_the_whole_import():
    torch.manual_seed(0)
    model, x = Stack(), torch.randn(2, 7, 16)
    exported = _exported(model, x)
    pieces = layers.plan(exported.program)
    assert pieces is not None
    keys = [p.key for p in pieces]
    assert len(pieces) == 7 and len(set(keys)) == 3  # before, 5 x the block, after
    assert len(set(keys[1:6])) == 1
    text = layers.import_pieces(exported.program, pieces, "the stack")
    assert len(re.findall(r'sym_name = "tracea_piece_', text)) == 3
    assert text.count('"func.call"') == 7
    assert _signature(text) == _signature(to_linalg(exported.program))


def test_torch_compile_imports_repeated_layers_once(monkeypatch):
    """Dynamo's graphs carry no hooks' tags: their layers are read from its nn_module_stack
    (dynamo._layer_calls), so a model under torch.compile imports and compiles each distinct
    layer once too (a 4-layer GPT-2's decoding graphs: 23 s -> 10 s of compiles, cold)."""
    from tracea.frontend import torch_model
    seen = []
    real = layers.import_pieces

    def spy(program, pieces, what):
        seen.append([p.key for p in pieces])
        return real(program, pieces, what)
    monkeypatch.setattr(layers, "import_pieces", spy)
    monkeypatch.setattr(torch_model.disk_cache, "lookup_text", lambda key: None)
    torch.manual_seed(2)
    model, x = Stack(shared_repeats=2).eval(), torch.randn(3, 5, 16) * 3
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="tracea", dynamic=False)
    with torch.no_grad():
        got, expected = compiled(x), model(x)
    for e, g in zip(expected, got):
        np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-5, atol=1e-5)
    assert len(seen) == 1
    keys = seen[0]  # before, 5 x the block, the shared block's two calls and the head (not layers)
    assert len(set(keys[1:6])) == 1 and len(set(keys)) == 3 and len(keys) == 7


def _check_against_eager(model, x):
    compiled = tracea.compile(model, (x,))
    with torch.no_grad():
        expected = model(x)
    got = compiled(x)
    for e, g in zip(expected, got):
        np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-5, atol=1e-5)
    return compiled


def test_compiled_stack_matches_eager_with_masked_values():
    torch.manual_seed(1)
    x = torch.randn(2, 7, 16) * 3  # about a third of the rows masked
    compiled = _check_against_eager(Stack().eval(), x)
    assert compiled.kernel is not None  # one kernel: the layers are calls inside it


def test_layers_of_other_widths_are_other_pieces():
    torch.manual_seed(2)
    model, x = Stack(widths=(8, 8, 8, 16, 16, 16)).eval(), torch.randn(1, 5, 8)
    pieces = layers.plan(_exported(model, x).program)
    assert pieces is not None
    blocks = {p.key for p in pieces if any("blocks." in c for n in p.nodes for c in layers._layer_prefixes(n))}
    assert len(blocks) == 2  # the blocks of width 8, those of width 16
    _check_against_eager(model, x)


def test_layers_on_shorter_sequences_are_other_pieces():
    torch.manual_seed(5)
    model, x = Stack(widths=(16,) * 6, halve_at=3).eval(), torch.randn(1, 8, 16)
    pieces = layers.plan(_exported(model, x).program)
    assert pieces is not None
    blocks = {p.key for p in pieces if any("blocks." in c for n in p.nodes for c in layers._layer_prefixes(n))}
    assert len(blocks) == 2  # the same ops on 8 rows, then on 4
    _check_against_eager(model, x)


def test_a_shared_layer_applied_many_times_is_not_mistaken_for_one():
    torch.manual_seed(3)
    model, x = Stack(widths=(16,), shared_repeats=4).eval(), torch.randn(2, 3, 16)
    # the shared block has no index in its path: the model has too few layers to split
    assert layers.plan(_exported(model, x).program) is None
    _check_against_eager(model, x)


def test_a_failed_split_imports_the_model_whole(monkeypatch):
    def refuse(*args):
        raise CompileError("a piece did not export alone")
    monkeypatch.setattr(layers, "import_pieces", refuse)
    torch.manual_seed(4)
    _check_against_eager(Stack().eval(), torch.randn(1, 4, 16))


def test_models_without_repeats_are_imported_whole():
    model, x = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).eval(), torch.randn(3, 4)
    assert layers.plan(_exported(model, x).program) is None


def test_a_layers_sequential_children_stay_in_the_layer():
    """Blocks whose MLP is an nn.Sequential (its children are indexed, like layers): the split
    keeps each block whole, so a GEMM and its GELU land in one piece and fuse."""
    from tracea.tools.demo import gpt_decoder
    model = gpt_decoder(layers=4, dim=64, heads=2, vocab=100, context=16)
    ids = torch.randint(0, 100, (1, 16))
    pieces = layers.plan(_exported(model, ids).program)
    assert pieces is not None
    kinds = [{str(n.target) for n in p.nodes} for p in pieces]
    assert not any(k <= {"aten.gelu.default"} for k in kinds)  # no piece is a GELU alone
    assert sum("aten.gelu.default" in k for k in kinds) == 4


class InPlaceBlock(nn.Module):
    """A layer whose first op changes its input in place: torch.export gives its piece the new
    value of that input as an extra first result."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        return self.conv(torch.nn.functional.relu(x, inplace=True))


class ResidualInPlace(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.blocks = nn.ModuleList(InPlaceBlock() for _ in range(4))

    def forward(self, x):
        x = self.stem(x)
        for block in self.blocks:
            x = block(x) + x
        return x


@pytest.mark.parametrize("model", [
    lambda: nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), *[InPlaceBlock() for _ in range(4)]),
    # the changed input used after the layer: `block(x) + x` adds relu(x), as in eager
    lambda: ResidualInPlace(),
], ids=["relu_-then-conv", "changed-input-used-after"])
def test_layers_that_change_their_input_in_place_match_eager(model):
    """The results of such a piece are matched to what they are (the changed input, then its
    outputs), not by position: shifted by one, every later layer took the wrong tensor (error
    1.95 on a scale of 0.18). The model compiles whole, in one region, and matches eager."""
    torch.manual_seed(5)
    model = model().eval()
    x = torch.randn(1, 3, 12, 12)
    pieces = layers.plan(_exported(model, x).program)
    assert pieces is not None and any("aten.relu_.default" in {str(n.target) for n in p.nodes} for p in pieces)
    compiled = tracea.compile(model, (x,))
    assert compiled.placement.regions == 1 and not compiled.placement.eager
    with torch.no_grad():
        expected = model(x.clone())
    np.testing.assert_allclose(compiled(x).numpy(), expected.numpy(), rtol=1e-5, atol=1e-5)
