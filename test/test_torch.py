"""PyTorch front end: tracea.compile(model), torch.compile(backend="tracea"), tracea.ops.conv2d."""
import math
import re
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import tracea  # before torch_mlir (see tracea/__init__.py)

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'tracea[torch]')")
pytest.importorskip("torch_mlir.fx", reason="torch-mlir is not installed (pip install 'tracea[torch]')")
nn = torch.nn
F = torch.nn.functional

from tracea import ops  # noqa: E402
from tracea.frontend import dynamo  # noqa: E402
from tracea.frontend.torch_import import import_module  # noqa: E402
from tracea.targets.cpu.linalg import RUN_TIME_PRODUCTS  # noqa: E402


class ResidualBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.c2, self.b2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x):
        return torch.relu(self.b2(self.c2(torch.relu(self.b1(self.c1(x))))) + x)


def mlp():
    return nn.Sequential(nn.Linear(64, 96), nn.ReLU(), nn.Linear(96, 48), nn.GELU(), nn.Linear(48, 10))


def cnn():
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                         ResidualBlock(16), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))


def encoder():
    return nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, activation="gelu", batch_first=True)


def _randomize_batch_norms(model):
    """Non-trivial running statistics, so that folding them is tested."""
    g = torch.Generator().manual_seed(1)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
    return model


def mobile():
    """A MobileNet inverted residual: expand 1x1, depthwise 3x3 (stride 2) and 5x5, project 1x1."""
    return nn.Sequential(nn.Conv2d(16, 48, 1), nn.BatchNorm2d(48), nn.Hardswish(),
                         nn.Conv2d(48, 48, 3, stride=2, padding=1, groups=48), nn.BatchNorm2d(48), nn.ReLU(),
                         nn.Conv2d(48, 48, 5, padding=2, groups=48, bias=False), nn.Conv2d(48, 24, 1))


MODELS = {"mlp": (mlp, (8, 64)), "cnn": (cnn, (2, 3, 32, 32)), "encoder": (encoder, (2, 16, 64)),
          "mobile": (mobile, (2, 16, 20, 20))}


@pytest.mark.parametrize("name", MODELS)
def test_compile_matches_eager(name):
    torch.manual_seed(0)
    build, shape = MODELS[name]
    model = _randomize_batch_norms(build()).eval()
    x = torch.randn(*shape)
    compiled = tracea.compile(model, (x,))
    with torch.no_grad():
        expected = model(x)
    got = compiled(x)
    assert isinstance(got, torch.Tensor) and got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    y = torch.randn(*shape)  # a second call with other data of the same shape
    with torch.no_grad():
        torch.testing.assert_close(compiled(y), model(y), rtol=1e-4, atol=1e-4)


def _raised_ops(model, *inputs) -> str:
    from tracea.passes.pipeline import parse_pipeline, run_pipeline
    graph = import_module(model.eval(), inputs)
    result = run_pipeline(graph.text, parse_pipeline("tracea-widen-i1, tracea-raise-linalg, canonicalize"))
    assert result.ok, result.diagnostics
    return result.text


def test_patterns_are_raised_into_tracea_ops():
    torch.manual_seed(0)
    text = _raised_ops(mlp(), torch.randn(8, 64))
    assert text.count('"tracea.fused_gemm"') == 3 and "linalg.matmul" not in text
    assert 'kind = "relu"' in text and 'kind = "gelu"' in text and text.count('kind = "bias_add"') == 3
    text = _raised_ops(cnn(), torch.randn(1, 3, 32, 32))
    assert text.count('"tracea.conv2d"') == 3 and "linalg.conv_2d" not in text
    depthwise = nn.Sequential(nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8), nn.ReLU(), nn.Conv2d(8, 8, 5, groups=8))
    text = _raised_ops(depthwise, torch.randn(1, 8, 16, 16))
    assert text.count('"tracea.conv2d"') == 2 and text.count("groups = 8") == 2 and "depthwise" not in text
    text = _raised_ops(encoder(), torch.randn(2, 16, 64))
    # the attention's Q K^T, safe softmax and P V are one fused op; its four linear layers fused GEMMs
    assert '"tracea.attention"' in text and '"tracea.softmax"' not in text and '"tracea.gemm"' not in text
    assert text.count('"tracea.fused_gemm"') >= 4
    assert "i1>" not in text  # boolean masks stored as bytes
    # GELU's tanh form as torch-mlir writes it (x^3 as math.fpowi, behind a reshape) joins its GEMM
    text = _raised_ops(nn.Sequential(nn.Linear(64, 96), nn.GELU("tanh")), torch.randn(2, 8, 64))
    assert text.count('"tracea.fused_gemm"') == 1 and 'approximate = "tanh"' in text and "math.tanh" not in text


class NewGELU(nn.Module):
    """GPT-2's GELU (transformers' NewGELUActivation), written out: x is read three times."""

    def __init__(self, leak=False):
        super().__init__()
        self.leak = leak

    def forward(self, x):
        half = 0.5 * x
        y = half * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
        return (y, half) if self.leak else y


@pytest.mark.parametrize("leak", [False, True])
def test_a_gelu_written_out_joins_its_gemm(leak):
    """Elementwise ops that together compute one function of a GEMM's result (x used several
    times) become one epilogue step; not when another value of theirs is also a result."""
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(64, 96), NewGELU(leak)).eval(), torch.randn(2, 8, 64) * 3.0
    text = _raised_ops(model, x)
    assert ('approximate = "tanh", kind = "gelu"' in text) == (not leak) and '"tracea.fused_gemm"' in text
    compiled = tracea.compile(model, (x,))
    assert ("(bias_add + gelu tanh; transpose_b) on cpu.gemm" in compiled.explain()) == (not leak)
    for got, expected in zip(*(o if leak else (o,) for o in (compiled(x), model(x)))):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


class Attention(nn.Module):
    def __init__(self, scale=None):
        super().__init__()
        self.scale = scale

    def forward(self, q, k, v):
        return nn.functional.scaled_dot_product_attention(q, k, v, scale=self.scale)


@pytest.mark.parametrize("scale", [None, 0.3])
def test_scaled_dot_product_attention_is_raised_and_exact(scale):
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 20, 32), torch.randn(2, 3, 24, 32), torch.randn(2, 3, 24, 16)
    from tracea.passes.pipeline import parse_pipeline, run_pipeline
    graph = import_module(Attention(scale).eval(), (q, k, v))
    raised = run_pipeline(graph.text, parse_pipeline("tracea-widen-i1, tracea-raise-linalg, canonicalize"))
    assert raised.text.count('"tracea.attention"') == 1 and '"tracea.softmax"' not in raised.text
    compiled = tracea.compile(Attention(scale).eval(), (q, k, v))
    torch.testing.assert_close(compiled(q, k, v), Attention(scale)(q, k, v), rtol=1e-4, atol=1e-4)


class CausalAttention(nn.Module):
    def forward(self, q, k, v):
        return nn.functional.scaled_dot_product_attention(q * 4.0, k * 4.0, v, is_causal=True)


@pytest.mark.parametrize("queries,keys", [(20, 20), (20, 24), (24, 20)])
def test_causal_attention_is_raised_and_exact(queries, keys):
    """torch-mlir lowers is_causal to a bias built from index arithmetic; the raise evaluates it
    and puts the whole attention on the flash kernel's causal path (top-left aligned as torch's)."""
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, queries, 32), torch.randn(2, 3, keys, 32), torch.randn(2, 3, keys, 16)
    text = _raised_ops(CausalAttention(), q, k, v)
    assert text.count('"tracea.attention"') == 1 and "causal = true" in text and '"tracea.softmax"' not in text
    compiled = tracea.compile(CausalAttention(), (q, k, v))
    torch.testing.assert_close(compiled(q, k, v), CausalAttention()(q, k, v), rtol=1e-4, atol=1e-5)


class SelfAttention(nn.Module):
    """Heads split as Hugging Face models split them: a linear's [B, S, H * D] viewed as
    [B, S, H, D] and transposed (torch-mlir folds K's two transposes into one permutation)."""

    def __init__(self, width=64, heads=4):
        super().__init__()
        self.heads, self.qkv = heads, nn.Linear(width, 3 * width)

    def forward(self, x):
        split = [t.view(*x.shape[:2], self.heads, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1)]
        return nn.functional.scaled_dot_product_attention(*split, is_causal=True).transpose(1, 2).flatten(2)


def test_attention_on_heads_split_from_a_linear_is_raised():
    torch.manual_seed(0)
    model, x = SelfAttention().eval(), torch.randn(2, 24, 64) * 3.0
    text = _raised_ops(model, x)
    assert text.count('"tracea.attention"') == 1 and "causal = true" in text and '"tracea.gemm"' not in text
    compiled = tracea.compile(model, (x,))
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)


class IndexMaskedAttention(nn.Module):
    """SDPA given a mask built from index arithmetic, as Hugging Face models build theirs."""

    def __init__(self, kind):
        super().__init__()
        self.kind = kind

    def forward(self, q, k, v):
        rows, cols = torch.arange(q.shape[-2]).unsqueeze(1), torch.arange(k.shape[-2]).unsqueeze(0)
        mask = {"all": lambda: (cols >= 0)[None, None],
                "causal": lambda: (cols <= rows).expand(q.shape[0], 1, -1, -1),
                "causal-additive": lambda: torch.zeros(rows.shape[0], cols.shape[1]).masked_fill(
                    cols > rows, torch.finfo(torch.float32).min),
                "window": lambda: (cols <= rows) & (cols > rows - 3),
                "bottom-right": lambda: cols <= rows + (k.shape[-2] - q.shape[-2]),
                "from-input": lambda: (k[..., 0] > -1.0)[:, :, None, :]}[self.kind]()
        return nn.functional.scaled_dot_product_attention(q * 4.0, k * 4.0, v, attn_mask=mask)


@pytest.mark.parametrize("kind,raised", [("all", "plain"), ("causal", "causal"), ("causal-additive", "causal"),
                                         ("window", "masked"), ("bottom-right", "masked"), ("from-input", "masked")])
def test_masks_from_index_arithmetic_are_settled_at_import(kind, raised):
    """A mask that reads no input is evaluated at import: masking nothing it is dropped, torch's
    causal triangle becomes is_causal (both then take the flash kernel without a mask); any other
    mask (a sliding window, a bottom-right triangle, one of the inputs) is the mask operand."""
    torch.manual_seed(0)
    queries = 16 if kind == "bottom-right" else 24
    q, k, v = torch.randn(2, 3, queries, 32), torch.randn(2, 3, 24, 32), torch.randn(2, 3, 24, 16)
    model = IndexMaskedAttention(kind)
    text = _raised_ops(model, q, k, v)
    attention = [line for line in text.splitlines() if '"tracea.attention"' in line]
    assert len(attention) == 1 and attention[0].count("tensor<") == 4 + (raised == "masked"), attention
    assert ("causal = true" in text) == (raised == "causal")
    compiled = tracea.compile(model, (q, k, v))
    torch.testing.assert_close(compiled(q, k, v), model(q, k, v), rtol=1e-4, atol=1e-5)


class SharpMaskedAttention(nn.Module):
    """Attention written out as users write it: scores at a large scale, a boolean mask filled
    with -inf (a row masked whole gives NaN, as in eager), softmax, P V."""

    def forward(self, q, k, v, mask):
        scores = (q @ k.transpose(-1, -2) * 50.0).masked_fill(~mask, float("-inf"))
        return torch.softmax(scores, dim=-1) @ v, torch.softmax(q * 40.0, dim=-1)


def test_sharp_softmaxes_and_minus_infinity_masks_match_eager():
    """Softmaxes on the torch path at score scales of 40-50, a dominant key late in each row,
    -inf masks with a row masked whole, large magnitudes: at f32 precision against eager."""
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 9, 16), torch.randn(2, 37, 16), 100 * torch.randn(2, 37, 8)
    k[:, 33] = q.mean(dim=1) * 3  # a late key aligned with every query
    mask = torch.rand(2, 9, 37) > 0.3
    mask[0, 4] = False
    compiled = tracea.compile(SharpMaskedAttention().eval(), (q, k, v, mask))
    for got, expected in zip(compiled(q, k, v, mask), SharpMaskedAttention()(q, k, v, mask)):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5 * expected.nan_to_num().abs().max(),
                                   equal_nan=True)


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_gelu_matches_float64_to_a_few_ulps(approximate):
    """GELU across its range against float64 torch, in ulps where |y| > 0.01: torch-mlir writes
    sqrt(2/pi) as 0.79772 in the tanh form (17,000 ulps off near x = -2.5) and Tracea corrects it."""
    x = torch.linspace(-8, 8, 8192).reshape(4, 2048)
    got = tracea.compile(nn.GELU(approximate).eval(), (x,))(x).double()
    expected = nn.GELU(approximate).double()(x.double())
    big = expected.abs() > 0.01
    ulps = (got - expected).abs()[big] / torch.from_numpy(np.spacing(expected.float().abs().numpy()))[big]
    assert ulps.max() <= 256  # eager torch itself is up to 170 ulps off here (1 - tanh cancels)


class Norms(nn.Module):
    """nn.LayerNorm, and an RMS norm written out as Llama writes it."""

    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.w = nn.Parameter(torch.linspace(0.5, 2.0, d))
        with torch.no_grad():
            self.ln.weight.copy_(torch.linspace(-2.0, 2.0, d))
            self.ln.bias.copy_(torch.linspace(1.0, 0.0, d))

    def forward(self, x):
        return self.ln(x), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w


@pytest.mark.parametrize("shape", [(64, 768), (2, 9, 100), (3, 1, 37), (1, 4096)])
def test_layer_and_rms_norms_are_as_accurate_as_eager(shape):
    """Row norms (fused row by row into one loop, in f32) on rows with a large mean, a constant
    row (variance 0), an outlier; against float64, no further off than eager float32 is (plus f32
    rounding of the output)."""
    torch.manual_seed(0)
    x = torch.randn(shape) * 3 + 40
    rows = x.view(-1, shape[-1])
    rows[0] = 2.0
    rows[-1, -1] = 1e4
    model = Norms(shape[-1]).eval()
    compiled = tracea.compile(model, (x,), keep_stages=True)
    assert "xf64>" not in compiled.kernel.stages["linalg"]  # in f32 as eager (torch-mlir's var_mean: f64)
    with torch.no_grad():
        eager = model(x)
        exact = Norms(shape[-1]).double()(x.double())
        for got, ours, expected in zip(compiled(x), eager, exact):
            scale = expected.abs().max()
            error = (got.double() - expected).abs().max()
            assert error <= 2 * (ours.double() - expected).abs().max() + 4e-7 * scale, (error, scale)



def test_each_row_group_is_fused_in_a_function_of_its_own_and_put_back(monkeypatch):
    """MLIR's fusion prints the ops it fuses (a diagnostic made whatever the outcome), and printing
    numbers the whole function around them: fused in one function, a model's row groups cost its
    size each (MaxViT: 59 s of a 105 s compile). Each group is fused in a private function of its
    own, then put back: 8 layer norms of distinct widths (no repeated layer to cut out), each group
    alone in its function when the fusion runs, none left after, and the numbers right."""
    from tracea.targets.cpu import linalg as cpu_linalg
    seen = []
    real = cpu_linalg._apply

    def recording(module, body, what):
        if what.startswith("fusing row"):
            functions = [f.operation for f in module.regions[0].blocks[0].operations if f.operation.name == "func.func"]
            seen.extend(sum(op.operation.name == "linalg.generic" for op in f.regions[0].blocks[0].operations)
                        for f in functions if "__tracea_row_group_" in str(f.attributes["sym_name"]))
        return real(module, body, what)

    monkeypatch.setattr(cpu_linalg, "_apply", recording)
    monkeypatch.setenv("TRACEA_DISK_CACHE", "0")
    monkeypatch.setenv("TRACEA_ISOLATE", "0")  # (the passes in this process, where `seen` is)

    class Widths(nn.Module):
        def __init__(self):
            super().__init__()
            self.norms = nn.ModuleList(nn.LayerNorm(40 + 8 * i) for i in range(8))
            self.linears = nn.ModuleList(nn.Linear(40 + 8 * i, 48 + 8 * i) for i in range(8))

        def forward(self, x):
            for norm, linear in zip(self.norms, self.linears):
                x = torch.relu(linear(norm(x * 3 + 40)))
            return x

    torch.manual_seed(0)
    model, x = Widths().eval(), torch.randn(16, 40)
    compiled = tracea.compile(model, (x,), keep_stages=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    assert seen == [5] * 8, seen  # a group per norm (its 5 row-local ops), each alone
    assert "__tracea_row_group_" not in compiled.kernel.stages["linalg"]

class TwoBranches(nn.Module):
    """A ResNet bottleneck's shape: one input read by two convolutions, a ReLU between the first
    and the next one (which bufferization may write over a buffer no longer read as a tensor)."""

    def __init__(self, c=16, out=32):
        super().__init__()
        self.main = nn.Sequential(nn.Conv2d(c, c, 1), nn.ReLU(), nn.Conv2d(c, out, 1))
        self.shortcut = nn.Conv2d(c, out, 1)

    def forward(self, x):
        x = torch.relu(x)
        return self.main(x) + self.shortcut(x)


@pytest.mark.parametrize("batch", [1, 2])
def test_an_input_read_by_two_kernels_is_not_overwritten_between_them(batch):
    torch.manual_seed(0)
    model, x = TwoBranches().eval(), torch.randn(batch, 16, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(tracea.compile(model, (x,))(x), model(x), rtol=1e-5, atol=1e-5)


class Scans(nn.Module):
    """cumsum as Hugging Face's masks take it (of a comparison, int64) and of floats, on either
    axis; one too long to rewrite (it runs in PyTorch)."""

    def forward(self, x, ids, long):
        return (ids != 1).cumsum(-1), torch.cumsum(x, dim=0), x.cumsum(1) * 2, long.cumsum(-1)


def test_short_cumsums_compile_with_the_model_and_long_ones_run_in_pytorch():
    from tracea.frontend import torch_import
    torch_import._warned.clear()
    torch.manual_seed(0)
    x, ids, long = torch.randn(5, 33), torch.randint(0, 3, (2, 40)), torch.randn(2, 1 << 21)
    with pytest.warns(RuntimeWarning, match=r"aten.cumsum.default runs in PyTorch") as warned:
        compiled = tracea.compile(Scans().eval(), (x, ids, long))
    assert len([w for w in warned if "cumsum" in str(w.message)]) == 1
    for got, expected in zip(compiled(x, ids, long), Scans()(x, ids, long)):
        assert got.dtype == expected.dtype
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())


class Unsupported(nn.Module):
    def forward(self, x):
        return torch.sort(x, dim=1).values


class Mixed(nn.Module):
    """Supported linear layers around an op torch-mlir cannot lower (sort)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x):
        h = torch.relu(self.a(x))
        h = torch.sort(h, dim=1).values
        return self.b(h)


def test_unsupported_op_runs_in_pytorch_and_is_named():
    from tracea.frontend import torch_import
    torch_import._warned.clear()
    torch.manual_seed(0)
    model = Mixed().eval()
    x = torch.randn(4, 16)
    with pytest.warns(RuntimeWarning, match=r"aten.sort.default runs in PyTorch: .*tm_tensor.sort"):
        compiled = tracea.compile(model, (x,))
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    placement = compiled.placement
    assert placement.eager == {"aten.sort.default": 1} and placement.regions == 2  # before and after the sort
    assert placement.compiled["aten.mm.default"] == 2  # the linear layers, decomposed as torch-mlir does
    assert "eager    aten.sort.default x1" in compiled.explain()
    only_sort = tracea.compile(Unsupported(), (x,))  # nothing to compile: all of it in PyTorch
    torch.testing.assert_close(only_sort(x), Unsupported()(x))
    assert only_sort.placement.regions == 0 and only_sort.kernel is None


class _Chain(nn.Module):
    def forward(self, x):
        return -(torch.tanh(torch.sqrt(x.abs()) * 3) + 1)


def test_a_model_torch_cannot_decompose_gets_a_compile_error():
    """prims.squeeze returns a view, which torch's functionalization refuses: a CompileError that
    names it (it was a RuntimeError from inside torch's decompositions, when the graph was split)."""
    class Squeeze(nn.Module):
        def forward(self, x):
            return torch.ops.prims.squeeze(x, dimensions=[0, 2])
    with pytest.raises(tracea.CompileError, match="prims::squeeze"):
        tracea.compile(Squeeze(), (torch.randn(1, 7, 1, 3),))


def test_ops_that_fail_only_together_are_the_ones_left_to_pytorch(monkeypatch):
    """A compile that fails only on sqrt and tanh in one kernel (each compiles alone): the
    bisection leaves the shortest failing run (sqrt, mul, tanh) to PyTorch, naming them, and
    abs, add and neg still compile; the result matches eager."""
    from tracea.frontend import torch_import, torch_model
    torch_import._warned.clear()
    real = torch_model.compile_program
    tried = []

    def compile_program(text, **options):
        tried.append(text)
        if "math.sqrt" in text and "math.tanh" in text:
            raise tracea.CompileError("loc(x): error: sqrt and tanh in one kernel")
        return real(text, **options)

    monkeypatch.setattr(torch_model, "compile_program", compile_program)
    x = torch.randn(4, 40)
    with pytest.warns(RuntimeWarning, match=r"compiles alone but not in one kernel with aten.sqrt.default, "
                                           r"aten.mul.Tensor, aten.tanh.default: .*sqrt and tanh in one kernel"):
        compiled = tracea.compile(_Chain(), (x,))
    torch.testing.assert_close(compiled(x), _Chain()(x), rtol=1e-6, atol=1e-6)
    placement = compiled.placement
    assert placement.eager == {"aten.sqrt.default": 1, "aten.mul.Tensor": 1, "aten.tanh.default": 1}
    assert placement.compiled == {"aten.abs.default": 1, "aten.add.Tensor": 1, "aten.neg.default": 1}
    assert placement.regions == 2 and len(tried) < 16


def test_explain_reports_placement_and_the_kernel_plan():
    torch.manual_seed(0)
    x = torch.randn(8, 64)
    text = tracea.compile(mlp().eval(), (x,)).explain()
    assert "in 1 Tracea kernel(s), 0 op(s) in eager PyTorch" in text
    plan = text.split("kernel plan (in program order):")[1]
    assert "3 x fused_gemm on cpu.gemm." in plan
    # the GEMMs in order, with their shapes and fused epilogues (the weights are [N, K])
    steps = [line.split(". ", 1)[1] for line in plan.splitlines() if re.match(r"\s+\d+\. ", line)]
    assert [s.split(" on ")[0] for s in steps] == [
        "fused_gemm 8x64, 96x64, 96 -> 8x96 (bias_add + relu; transpose_b)",
        "fused_gemm 8x96, 48x96, 48 -> 8x48 (bias_add + gelu; transpose_b)",
        "fused_gemm 8x48, 10x48, 10 -> 8x10 (bias_add; transpose_b)"]


class _ConvActivations(torch.nn.Module):
    """MobileNetV3's patterns: a hardswish (x times a clamp of x + 3, its x also read by the
    next conv's residual), a depthwise conv and relu, a squeeze-excitation style gate
    (sigmoid(conv) times its input), a residual add before the relu (not fused)."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.depthwise = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.gate = torch.nn.Conv2d(8, 8, 1)
        self.project = torch.nn.Conv2d(8, 8, 1)
        self.linear = torch.nn.Linear(8, 5)

    def forward(self, x):
        f = torch.nn.functional
        y = f.hardswish(self.stem(x))
        z = f.relu(self.depthwise(y))
        z = torch.sigmoid(self.gate(z)) * z
        out = f.relu(self.project(z) + y)
        return torch.sigmoid(self.linear(out.mean((2, 3))))


def test_activations_after_convs_and_linears_are_fused_into_their_kernels():
    torch.manual_seed(0)
    model, x = _ConvActivations().eval(), torch.randn(2, 3, 12, 12) * 3
    compiled = tracea.compile(model, (x,))
    with torch.no_grad():
        np.testing.assert_allclose(compiled(x).numpy(), model(x).numpy(), rtol=1e-5, atol=1e-5)
    plan = compiled.explain().split("kernel plan (in program order):")[1]
    steps = [line.split(". ", 1)[1].split(" on ")[0] for line in plan.splitlines() if re.match(r"\s+\d+\. ", line)]
    assert steps == ["conv2d 2x3x12x12, 8x3x3x3, 8 -> 2x8x12x12 (hardswish; padding [1, 1, 1, 1])",
                     "conv2d 2x8x12x12, 8x1x3x3, 8 -> 2x8x12x12 (relu; groups 8; padding [1, 1, 1, 1])",
                     "conv2d 2x8x12x12, 8x8x1x1, 8 -> 2x8x12x12 (sigmoid; padding [0, 0, 0, 0])",
                     "conv2d 2x8x12x12, 8x8x1x1, 8 -> 2x8x12x12 (padding [0, 0, 0, 0])",
                     "fused_gemm 2x8, 5x8, 5 -> 2x5 (bias_add + sigmoid; transpose_b)"]


def test_explain_gives_the_plan_of_a_model_of_repeated_layers_also_from_the_disk_cache(tmp_path, monkeypatch):
    """A model's repeated layers are one function called once per layer: the plan lists its
    kernels once, with the number of calls; a kernel loaded from the disk cache reports the same."""
    monkeypatch.setenv("TRACEA_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    model = nn.Sequential(*[encoder() for _ in range(3)]).eval()
    x = torch.randn(2, 16, 64)
    first = tracea.compile(model, (x,)).explain()
    from tracea.compiler import clear_cache
    clear_cache()
    again = tracea.compile(model, (x,))
    assert again.kernel.origin == "disk cache" and again.explain() == first
    assert re.search(r"@\w+, called 3x:\n(\s+\d+\. .*\n)*\s+\d+\. attention 8x16x16, 8x16x16, 8x16x16 -> "
                     r"8x16x16 \(scale [\d.]+\) on cpu.attention.flash", first), first


def test_compiled_model_checks_its_inputs():
    model = mlp().eval()
    compiled = tracea.compile(model, (torch.randn(8, 64),))
    with pytest.raises(tracea.ArgumentError, match="compiled for"):
        compiled(torch.randn(4, 64))
    with pytest.raises(tracea.ArgumentError, match="takes 1 input"):
        compiled()
    with pytest.raises(tracea.CompileError, match="example_inputs"):
        tracea.compile(model)


class AddsOne(nn.Module):  # updates its input, then reads it
    def forward(self, x):
        x.add_(1)
        return x * 2


class CacheWriter(nn.Module):
    """A KV cache's update: the new rows written at `position` in place (index_copy_, or an
    assignment to a slice), then read by what follows."""

    def __init__(self, slice_assignment: bool):
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.slice_assignment = slice_assignment

    def forward(self, cache, x, position):
        new = self.proj(x)
        if self.slice_assignment:
            cache[:, 3:4] = new
        else:
            cache.index_copy_(1, position, new)
        return cache.softmax(-1).sum(1)


@pytest.mark.parametrize("make", [AddsOne, lambda: CacheWriter(False), lambda: CacheWriter(True)],
                         ids=["add_", "index_copy_", "slice-assignment"])
def test_a_model_that_updates_its_inputs_in_place_matches_eager(make):
    """The updated inputs hold what eager leaves in them, and the outputs are eager's: the kernel
    returns the new values ahead of the outputs (taken for the output, x.add_(1); x * 2 gave
    x + 1, and the update was lost). Called twice: the second call reads the first's update."""
    torch.manual_seed(0)
    model = make().eval()
    inputs = (torch.randn(2, 8, 16),) + ((torch.randn(2, 1, 16), torch.tensor([3])) if make is not AddsOne else ())
    compiled = tracea.compile(model, tuple(i.clone() for i in inputs))
    mine, theirs = [i.clone() for i in inputs], [i.clone() for i in inputs]
    for _ in range(2):
        with torch.no_grad():
            expected = model(*theirs)
        torch.testing.assert_close(compiled(*mine), expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(mine[0], theirs[0], rtol=1e-5, atol=1e-5)


def test_a_buffer_the_model_updates_in_place_is_updated_as_in_eager():
    """A module's buffer is one of the arguments Tracea passes ahead of the inputs: a step
    counter's add_ reaches the module's own buffer, call after call (and compiling runs none)."""
    class Counter(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("count", torch.zeros(3))

        def forward(self, x):
            self.count.add_(1)
            return x * self.count

    mine, theirs = Counter(), Counter()
    compiled = tracea.compile(mine, (torch.ones(3),))
    assert mine.count.sum() == 0
    for _ in range(3):
        x = torch.randn(3)
        torch.testing.assert_close(compiled(x), theirs(x))
    torch.testing.assert_close(mine.count, theirs.count)


def test_dynamo_graphs_that_update_a_cache_in_place_leave_it_as_eager_does():
    """What torch.compile(backend="tracea") gives a static KV cache: the graph takes the cache as
    an input and writes it in place, step after step."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = CacheWriter(False).eval()
    compiled = torch.compile(model, backend="tracea", dynamic=False)
    mine, theirs = torch.zeros(2, 8, 16), torch.zeros(2, 8, 16)
    with torch.no_grad():
        for step in range(4):
            x, position = torch.randn(2, 1, 16), torch.tensor([step])
            torch.testing.assert_close(compiled(mine, x, position), model(theirs, x, position), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)


def test_dynamo_backend_compiles_and_recompiles_per_shape():
    torch.manual_seed(0)
    model = mlp().eval()
    compiled = torch.compile(model, backend="tracea", dynamic=False)
    with torch.no_grad():
        for rows in (8, 8, 3):
            x = torch.randn(rows, 64)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)


def test_dynamo_backend_follows_dynamic_shapes():
    """With torch.compile's defaults a shape change makes Dynamo retrace with symbolic sizes; the
    backend compiles that graph per concrete shape instead of falling back."""
    dynamo.fallbacks.clear()
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = mlp().eval()
    compiled = torch.compile(model, backend="tracea")
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for rows in (8, 3, 5, 3):
            x = torch.randn(rows, 64)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    assert not dynamo.fallbacks and not [w for w in caught if "tracea:" in str(w.message)], [str(w.message) for w in caught]


def test_a_copy_of_symbolic_size_is_a_loop_of_the_kernel():
    """A KV cache's concatenation with a symbolic length copies into part of a buffer: split
    among the threads and vectorized like the other copies, not MLIR's memrefCopy (element by
    element: a GPT-2 decoding step after 1,024 tokens took 41 ms for 22)."""
    class Cat(nn.Module):
        def forward(self, cache, new):
            return torch.cat([cache, new], dim=1) * 2

    compiled = tracea.compile(Cat(), (torch.randn(2, 5, 16), torch.randn(2, 1, 16)), dynamic_dims={0: 1},
                              keep_stages=True)
    for length in (7, 300):
        cache, new = torch.randn(2, length, 16), torch.randn(2, 1, 16)
        torch.testing.assert_close(compiled(cache, new), torch.cat([cache, new], 1) * 2)
    assert compiled.compiles == 2 and "memrefCopy" not in compiled.general.kernel.stages["llvm"]


def test_a_result_reshaped_from_run_time_sizes_is_computed_in_the_callers_buffer():
    """HF Llama's repeat_kv with a run-time length ([B, 2, ?, D] -> [B, 2, 2, ?, D] -> [B, 4, ?, D]):
    the result is computed in the caller's buffer seen through the reshape undone, whose run-time
    size is read from that buffer (the expand_shape without it was invalid: Llama's kernel for a
    prompt of symbolic length failed to compile, and every new length was compiled for)."""
    class RepeatKV(nn.Module):
        def forward(self, k):
            b, h, n, d = k.shape
            return (k[:, :, None, :, :].expand(b, h, 2, n, d) * 2).reshape(b, h * 2, n, d)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no failed compile
        compiled = tracea.compile(RepeatKV(), (torch.randn(1, 2, 9, 16),), dynamic_dims={0: 2})
        for length in (5, 300, 7):
            k = torch.randn(1, 2, length, 16)
            torch.testing.assert_close(compiled(k), RepeatKV()(k))
    assert compiled.compiles == 2 and compiled.general is not None and not compiled.eager_shapes


@pytest.mark.parametrize("heads, kv_heads, queries", [(4, 4, 1), (4, 2, 1), (6, 2, 2)],
                         ids=["heads", "grouped-heads", "grouped-heads-two-queries"])
def test_sdpa_over_a_kv_cache_of_symbolic_length_runs_the_attention_kernel(heads, kv_heads, queries):
    """A decoding step's SDPA over a cache whose length is symbolic (the growing cache of HF's
    generate under torch.compile) is tracea.attention, not generic loops (1 query over 1,024 keys:
    2,872 us where torch's SDPA takes 128); grouped heads (Llama) too, a key head's query heads
    stacked as its rows (K and V not repeated). Scores up to ~16, the last key weighing most (not
    all: a scale dropped must show), at lengths across the key blocks."""
    class Step(nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, scale=0.5, enable_gqa=heads != kv_heads)

    def inputs(length):
        g = torch.Generator().manual_seed(length)
        q, k, v = torch.randn(2, heads, queries, 32, generator=g), *torch.randn(2, 2, kv_heads, length, 32, generator=g)
        k[:, :, -1] = q[:, ::heads // kv_heads, 0]  # scores up to ~16: the last key weighs most
        return q, k, v

    compiled = tracea.compile(Step(), inputs(300), dynamic_dims={1: 2, 2: 2})
    for length in (300, 5, 257, 1031):
        torch.testing.assert_close(compiled(*inputs(length)), Step()(*inputs(length)), rtol=2e-5, atol=2e-5)
    plan = compiled.general.explain()
    assert compiled.compiles == 2 and "generic loop" not in plan and not compiled.eager_shapes, plan
    # grouped: one attention over the key heads, their query heads as rows
    assert f"attention {2 * kv_heads}x{heads // kv_heads * queries}x32, {2 * kv_heads}x?x32" in plan, plan


@pytest.mark.parametrize("kind", ["bool-padding", "float-shared", "bool-per-query", "float-per-head", "grouped-heads"])
def test_masked_sdpa_over_a_kv_cache_of_symbolic_length_runs_the_attention_kernel(kind):
    """A decoding step of a padded batch (HF's generate with an attention mask, the cache growing)
    is SDPA with a mask over a symbolic length: tracea.attention with the mask operand, not
    generic loops (4 sequences x 12 heads, 1 query over 1,024 keys: 12.4 ms where torch's SDPA
    takes 0.9). Masks of the batch entries (one of them masking every key: 0, as eager's safe
    softmax), shared, per query (a query that sees no key), per head, and grouped heads (Llama's);
    scores up to ~16 on the last key, lengths across the key blocks."""
    heads, kv_heads = (6, 2) if kind == "grouped-heads" else (3, 3)
    queries = 3 if kind == "bool-per-query" else 1

    class Step(nn.Module):
        def forward(self, q, k, v, mask):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=heads != kv_heads)

    def inputs(length):
        g = torch.Generator().manual_seed(length)
        q, k, v = torch.randn(2, heads, queries, 32, generator=g), *torch.randn(2, 2, kv_heads, length, 32, generator=g)
        k[:, :, -1] = q[:, ::heads // kv_heads, 0]
        shape = {"bool-padding": (2, 1, 1), "float-shared": (1, 1, 1), "bool-per-query": (2, 1, queries),
                 "float-per-head": (1, heads, 1), "grouped-heads": (2, 1, 1)}[kind] + (length,)
        keep = torch.rand(shape, generator=g) > 0.3
        keep[..., -1] = True
        if kind in ("bool-padding", "grouped-heads"):
            keep[1] = False  # a sequence of padding only
        elif kind == "bool-per-query":
            keep[0, 0, 1] = False  # a query that sees no key
        mask = keep if kind.startswith(("bool", "grouped")) else torch.where(keep, 2 * torch.rand(shape, generator=g),
                                                                               -torch.inf)
        return q, k, v, mask

    compiled = tracea.compile(Step(), inputs(300), dynamic_dims={1: 2, 2: 2, 3: 3})
    for length in (300, 5, 257, 1031):
        torch.testing.assert_close(compiled(*inputs(length)), Step()(*inputs(length)), rtol=2e-5, atol=2e-5)
    plan = compiled.general.explain()
    assert compiled.compiles == 2 and "attention" in plan and "?x32" in plan and not compiled.eager_shapes, plan


def test_sdpa_of_symbolic_length_that_the_kernel_cannot_take_stays_right():
    """A causal mask or a query of symbolic length, or a mask with an f64 query: torch's
    decomposition (generic loops), still eager's numbers."""
    class Masked(nn.Module):
        def forward(self, q, k, v, mask):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    class Causal(nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def inputs(queries, length, dtype=torch.float32):
        g = torch.Generator().manual_seed(length)
        return [x.to(dtype) for x in (torch.randn(1, 2, queries, 16, generator=g),
                                      *torch.randn(2, 1, 2, length, 16, generator=g))]

    mask = lambda length: (torch.arange(length) % 3 != 1)[None]  # noqa: E731
    masked = tracea.compile(Masked(), (*inputs(1, 9, torch.float64), mask(9)), dynamic_dims={1: 2, 2: 2, 3: 1})
    causal = tracea.compile(Causal(), inputs(6, 6), dynamic_dims={0: 2, 1: 2, 2: 2})
    for length in (9, 4, 70):
        torch.testing.assert_close(masked(*inputs(1, length, torch.float64), mask(length)),
                                   Masked()(*inputs(1, length, torch.float64), mask(length)))
        torch.testing.assert_close(causal(*inputs(length, length)), Causal()(*inputs(length, length)))


@pytest.mark.parametrize("kind", ["bool-shared", "float-per-batch", "bool-per-query", "float-whole"])
def test_sdpa_with_a_mask_of_the_inputs_is_attention_with_a_mask_operand(kind):
    """SDPA whose mask the model is given (a padding mask, a static KV cache's filled positions)
    is tracea.attention with the mask operand, not generic loops: a boolean mask shared by every
    batch entry and head, a float mask per batch entry (broadcast over the heads), a boolean one
    per query and batch entry; -inf'd keys and a query that sees none."""
    class Masked(nn.Module):
        def forward(self, q, k, v, mask):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(2, 2, 5, 32, generator=g), *torch.randn(2, 2, 2, 40, 32, generator=g)
    shape = {"bool-shared": (1, 1, 1, 40), "float-per-batch": (2, 1, 1, 40), "bool-per-query": (2, 1, 5, 40),
             "float-whole": (2, 2, 5, 40)}[kind]  # (whole: the gemm raise takes it for a residual add)
    keep = torch.rand(shape, generator=g) > 0.3
    keep[..., 0] = True
    if kind == "bool-per-query":
        keep[0, 0, 2] = False  # a query that sees no key: 0, as eager's SDPA
    mask = keep if kind.startswith("bool") else torch.where(keep, torch.randn(shape, generator=g), -torch.inf)
    compiled = tracea.compile(Masked(), (q, k, v, mask))
    torch.testing.assert_close(compiled(q, k, v, mask), Masked()(q, k, v, mask), rtol=2e-5, atol=2e-5)
    plan = compiled.explain()  # (the mask made f32: one loop nest)
    assert "on cpu.attention.flash" in plan and "softmax" not in plan and "gemm" not in plan, plan


@pytest.mark.parametrize("queries", [1, 3])
@pytest.mark.parametrize("mask_shape", [None, (1, 1, 1, 40), (2, 1, "q", 40), (2, 6, "q", 40), (2, 6, 1, 40)],
                         ids=["none", "shared", "per-query", "per-head-and-query", "per-head"])
def test_grouped_query_sdpa_reads_each_key_head_once(queries, mask_shape):
    """SDPA with grouped heads (6 query heads over 2 key heads, enable_gqa) without a causal mask:
    one attention over the key heads, each key head's 3 query heads stacked as its rows (K and V
    not repeated per query head), the mask's rows stacked alike, whatever it varies along."""
    class Grouped(nn.Module):
        def forward(self, q, k, v, *mask):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[0] if mask else None, enable_gqa=True)

    g = torch.Generator().manual_seed(queries)
    q, k, v = torch.randn(2, 6, queries, 32, generator=g), *torch.randn(2, 2, 2, 40, 32, generator=g)
    mask = () if mask_shape is None else \
        (torch.rand([queries if d == "q" else d for d in mask_shape], generator=g) > 0.3,)
    if mask:
        mask[0][..., 0] = True
    compiled = tracea.compile(Grouped(), (q, k, v, *mask))
    torch.testing.assert_close(compiled(q, k, v, *mask), Grouped()(q, k, v, *mask), rtol=2e-5, atol=2e-5)
    plan = compiled.explain()
    assert f"attention 4x{3 * queries}x32, 4x40x32, 4x40x32" in plan, plan


def test_hugging_face_bert_with_a_padding_mask_runs_the_attention_kernel():
    """BERT called as a tokenizer's output is given (input ids and an attention mask with padding):
    its attention takes the mask operand, the padded positions ignored as eager ignores them."""
    import transformers as T
    sys.path.insert(0, str(Path(__file__).parent))
    from model_zoo import import_torchvision  # noqa: F401 - lets transformers import
    torch.manual_seed(0)
    model = T.BertModel(T.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=128, vocab_size=500)).eval()
    ids, padding = torch.randint(1, 500, (2, 24)), torch.ones(2, 24, dtype=torch.long)
    padding[0, 15:] = 0
    compiled = tracea.compile(model, (ids, padding))
    with torch.no_grad():
        want = model(ids, attention_mask=padding).last_hidden_state
    torch.testing.assert_close(compiled(ids, padding).last_hidden_state, want, rtol=1e-4, atol=1e-4)
    assert compiled.explain().count("on cpu.attention.flash") >= 2, compiled.explain()


def test_dynamo_backend_splits_graphs_and_warns_once_per_op_kind():
    from tracea.frontend import torch_import
    dynamo.fallbacks.clear()
    torch_import._warned.clear()
    torch._dynamo.reset()
    model = Mixed().eval()
    compiled = torch.compile(model, backend="tracea", dynamic=False)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for _ in range(3):
            x = torch.randn(4, 16)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    messages = [str(w.message) for w in caught if "tracea:" in str(w.message)]
    assert len(messages) == 1 and "tm_tensor.sort" in messages[0]
    assert not dynamo.fallbacks  # the graph was split, not given up


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_hugging_face_generate_under_torch_compile_matches_eager(cache):
    """What transformers users do: model.forward compiled, then generate() with its KV cache. The
    prompt's graph and the first decoding steps compile per shape; once Dynamo makes the cache's
    length symbolic, the steps run one symbolic kernel. A static cache (one length, written in
    place by each step: its update was lost, and the third token on went wrong) compiles once.
    Every token as eager's, nothing left to PyTorch but the static cache's index_put."""
    import sys
    sys.path.insert(0, str(Path(__file__).parent))
    import transformers as T
    from model_zoo import import_torchvision  # noqa: F401 - lets transformers import
    dynamo.fallbacks.clear()
    torch._dynamo.reset()
    torch.manual_seed(0)
    config = T.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=300, n_positions=64, bos_token_id=0,
                          eos_token_id=0)
    model, compiled = T.GPT2LMHeadModel(config).eval(), T.GPT2LMHeadModel(config).eval()
    compiled.load_state_dict(model.state_dict())
    compiled.forward = torch.compile(compiled.forward, backend="tracea")
    ids = torch.randint(1, 300, (2, 7), generator=torch.Generator().manual_seed(1))
    options = dict(do_sample=False, pad_token_id=0, **({"cache_implementation": "static"} if cache == "static" else {}))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # (the static cache's index_put runs in PyTorch)
        for new in (12, 5):  # the second call reuses the kernels, also for a shorter generation
            want = model.generate(ids, max_new_tokens=new, min_new_tokens=new, **options)
            got = compiled.generate(ids, max_new_tokens=new, min_new_tokens=new, **options)
            assert got.shape == (2, 7 + new) and torch.equal(got, want)
    assert not dynamo.fallbacks


def test_dynamo_backend_falls_back_for_autograd():
    from tracea.frontend import torch_import
    torch_import._warned.clear()
    torch._dynamo.reset()
    model = nn.Linear(8, 4)
    compiled = torch.compile(model, backend="tracea")
    x = torch.randn(2, 8)
    with pytest.warns(RuntimeWarning, match="gradients"):
        y = compiled(x)
    y.sum().backward()  # eager PyTorch ran it: gradients flow
    assert model.weight.grad is not None


def test_ops_conv2d_and_its_fallbacks():
    torch.manual_seed(0)
    ops.reset_fallback_counts()
    x, w, b = torch.randn(2, 8, 12, 12), torch.randn(16, 8, 3, 3), torch.randn(16)
    ref = torch.nn.functional.conv2d(x, w, b, stride=(2, 1), padding=(1, 0))
    torch.testing.assert_close(ops.conv2d(x, w, b, stride=(2, 1), padding=(1, 0)), ref, rtol=1e-4, atol=1e-4)
    assert not ops.fallback_counts
    cases = {
        "groups != 1": lambda: ops.conv2d(x, torch.randn(8, 1, 3, 3), None, padding=1, groups=8),
        "dilation != 1": lambda: ops.conv2d(x, w, b, padding=2, dilation=2),
        "dtype is not float32": lambda: ops.conv2d(x.double(), w.double(), b.double()),
        "tensor is not contiguous": lambda: ops.conv2d(x.transpose(2, 3), w, b),
    }
    for reason, call in cases.items():
        call()
        assert ops.fallback_counts[reason] == 1, (reason, dict(ops.fallback_counts))


def test_patch_conv2d_and_tracea_conv2d():
    torch.manual_seed(0)
    ops.reset_fallback_counts()
    conv = nn.Conv2d(4, 6, 3, padding=1)
    x = torch.randn(1, 4, 9, 9)
    with torch.no_grad():
        expected = conv(x)
        original = nn.Conv2d.forward
        tracea.patch_conv2d()
        try:
            assert nn.Conv2d.forward is not original
            torch.testing.assert_close(conv(x), expected, rtol=1e-4, atol=1e-4)
        finally:
            tracea.unpatch_conv2d()
        assert nn.Conv2d.forward is original
        layer = tracea.TraceaConv2d(4, 6, 3, padding=1)
        layer.load_state_dict(conv.state_dict())
        assert isinstance(layer, nn.Conv2d)
        torch.testing.assert_close(layer(x), expected, rtol=1e-4, atol=1e-4)
    assert not ops.fallback_counts


UINT8_MODEL = """
import torch, tracea
class Affine(torch.nn.Module):
    def forward(self, x):
        return x * 3 + 1  # uint8 arithmetic: torch-mlir's lowering segfaults on it
x = torch.arange(0, 240, 3, dtype=torch.uint8).reshape(8, 10)
compiled = tracea.compile(Affine(), (x,))
assert torch.equal(compiled(x), Affine()(x)), (compiled(x), Affine()(x))
print(compiled.explain().splitlines()[0])
"""


def test_a_torch_mlir_crash_is_an_eager_fallback_not_a_dead_process():
    import subprocess
    import sys
    run = subprocess.run([sys.executable, "-c", UINT8_MODEL], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "torch-mlir crashed (signal 11)" in run.stderr


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16,
                                   torch.bfloat16, torch.float64])
def test_dtypes_cross_the_boundary_with_torch_semantics(dtype):
    class Select(nn.Module):  # in and out in `dtype`, plus a bool mask out
        def forward(self, x, y):
            return torch.where(x > y, x, y), x == y
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(6, 5, generator=g) * 50).to(dtype)
    y = (torch.randn(6, 5, generator=g) * 50).to(dtype)
    compiled = tracea.compile(Select(), (x, y))
    got, want = compiled(x, y), Select()(x, y)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and torch.equal(a, b)


class ReturnsStructure(nn.Module):
    def forward(self, x):
        return {"sum": x.sum(), "pair": (x * 2, None), "n": 3, "any": (x > 0).any()}


def test_outputs_keep_the_models_structure_and_scalars():
    x = torch.randn(4, 3)
    compiled = tracea.compile(ReturnsStructure(), (x,))
    got, want = compiled(x), ReturnsStructure()(x)
    assert got.keys() == want.keys() and got["n"] == 3 and got["pair"][1] is None
    torch.testing.assert_close(got["sum"], want["sum"])
    assert got["any"].dtype == torch.bool and got["any"].shape == () and bool(got["any"]) == bool(want["any"])


class ReturnsNumbers(nn.Module):
    """Python numbers computed from tensor data and sizes, with the run-time checks torch.export
    records for them (torch-mlir's e2e AtenSymConstrainRange and Aten_AssertScalar)."""

    def forward(self, x, ids):
        count = ids.sum().item()
        torch.ops.aten.sym_constrain_range(count, max=50)
        torch.ops.aten._assert_scalar(count > 3, "count > 3")
        return {"count": count, "rows": x.shape[0] * 2, "mean": x.mean().item(), "any": (x > 1).any().item(),
                "y": x + count}


class ChecksItsNumber(nn.Module):
    def forward(self, ids):
        count = ids.sum().item()
        torch.ops.aten._assert_scalar(count > 3, "count > 3")
        return count, ids * count


def test_numbers_computed_from_tensors_are_returned_and_their_checks_run():
    """They were refused ("return a tensor instead"); they are 0-d tensors until the call returns.
    The checks fail as in eager, in a compiled kernel (naming the check torch-mlir put in it) and
    where the ops around them run in PyTorch (a bool read from a tensor: sym_ite), whose checks
    had been dropped with those of the input shapes."""
    ids = torch.tensor([4, 6])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # compiled whole
        compiled = tracea.compile(ChecksItsNumber(), (ids,))
    count, y = compiled(torch.tensor([1, 3]))
    assert type(count) is int and count == 4 and torch.equal(y, torch.tensor([4, 12]))
    with pytest.raises(RuntimeError, match="run-time check of the program failed.*u0 >= 4"):
        compiled(torch.tensor([1, 2]))

    x = torch.randn(5, 3)
    with pytest.warns(RuntimeWarning, match="runs in PyTorch"):
        compiled = tracea.compile(ReturnsNumbers(), (x, ids), dynamic_dims={0: 0})
    # (its kernel for symbolic sizes fails to compile: a new shape runs in PyTorch, its second call
    # compiles for it)
    for rows, values in ((5, [4, 6]), (9, [20, 30]), (9, [20, 30]), (2, [2, 2])):
        x, ids = torch.randn(rows, 3) * 2, torch.tensor(values)
        got, want = compiled(x, ids), ReturnsNumbers()(x, ids)
        assert [type(got[k]) for k in want] == [type(want[k]) for k in want] == [int, int, float, bool, torch.Tensor]
        assert (got["count"], got["rows"], got["any"]) == (want["count"], want["rows"], want["any"])
        # (a mean near 0 of unseeded data: to f32's precision of the terms, not of the mean)
        assert got["mean"] == pytest.approx(want["mean"], abs=1e-6 * float(x.abs().mean()))
        torch.testing.assert_close(got["y"], want["y"])
    assert compiled.general_failed and list(compiled.special) == [((9, 3), (2,))] and len(compiled.eager_shapes) == 2
    assert "a new shape runs in PyTorch" in compiled.explain()
    for values, fails in (([50, 1], "u0 <= 50"), ([1, 1], "u0 >= 4")):  # eager raises here too
        with pytest.raises(RuntimeError, match=f"assertion failed .*{fails}"):
            compiled(x, torch.tensor(values))


class DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x):
        h = self.linear(x)
        if h.sum().item() > 0:  # Python control flow on a value: torch.export cannot trace it
            return torch.relu(h) * 2
        return h - 1


def test_an_untraceable_model_runs_through_dynamo_with_its_graphs_compiled():
    from tracea.frontend.dynamo import DynamoModel
    torch.manual_seed(0)
    model = DataDependent().eval()
    x = torch.randn(4, 8)
    with pytest.warns(RuntimeWarning, match="torch.export could not trace the model"):
        compiled = tracea.compile(model, (x,))
    assert isinstance(compiled, DynamoModel)
    for sign in (1, -1):  # both branches
        with torch.no_grad():
            torch.testing.assert_close(compiled(x * sign), model(x * sign), rtol=1e-5, atol=1e-5)
    assert compiled.placement.compiled and not compiled.placement.eager
    assert "TorchDynamo captured" in compiled.explain()


def test_weights_are_read_at_call_time():
    model = nn.Sequential(nn.Linear(6, 4)).eval()
    x = torch.randn(3, 6)
    compiled = tracea.compile(model, (x,))
    with torch.no_grad():
        model[0].weight.mul_(-2)
        model[0].bias.add_(1)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)


def test_symbolic_sizes_evaluate_as_sympy_does():
    """Result sizes of a symbolic kernel come from torch.export's size expressions at each call's
    sizes (by xreplace, not sympy's 15-25x slower subs): equal to subs on sums, products and
    torch's own floor, ceiling and modular divisions, at sizes 1 and up."""
    import sympy
    from torch.utils._sympy.functions import CeilDiv, FloorDiv, ModularIndexing
    from tracea.frontend.dynamic import _size_at
    s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
    for expr in [s0 + 1, 2 * s0 + 32, s0 * s1, FloorDiv(s0 + 7, 8), CeilDiv(s0, 3), ModularIndexing(s0 * s1, 2, 5),
                 sympy.Max(s0 - 4, 1), s0 ** 2 - s1]:
        for env in ({s0: 1, s1: 1}, {s0: 33, s1: 4}, {s0: 1000, s1: 7}):
            assert _size_at(env)(expr) == int(expr.subs(env)), (expr, env)
            assert type(_size_at(env)(expr)) is int


def test_binding_symbolic_sizes_checks_every_call():
    """Each call of a symbolic kernel binds its sizes (worked out once per kernel, then plain
    Python): a symbol's sizes must agree, a derived size must be what it derives from, fixed dims
    and torch.export's ranges hold; a repeated call's shapes bind from the last."""
    from tracea.frontend.dynamic import program_shapes

    class Twice(nn.Module):
        def forward(self, x, y):
            return x.repeat(2, 1) + y, x * 2

    s = torch.export.Dim("s", min=2, max=10)
    program = torch.export.export(Twice(), (torch.randn(3, 4), torch.randn(6, 4)),
                                  dynamic_shapes=({0: s}, {0: 2 * s}))
    shapes = program_shapes(program)
    env = shapes.bind([(5, 4), (10, 4)])
    assert list(env.values()) == [5] and shapes.output_shapes(env) == [(10, 4), (5, 4)]
    assert shapes.bind([(5, 4), (10, 4)]) is env and list(shapes.bind([(7, 4), (14, 4)]).values()) == [7]
    for bad, message in [([(5, 4), (11, 4)], "size 11 in dim 0; the model needs 10"),
                         ([(5, 3), (10, 4)], "size 3 in dim 1, where the model was compiled for 4 only"),
                         ([(11, 4), (22, 4)], "a dynamic size of 11 is outside the range 2..10"),
                         ([(5, 4, 1), (10, 4)], "input #0 has 3 dimensions, the model was compiled for 2")]:
        with pytest.raises(tracea.ArgumentError, match=re.escape(message)):
            shapes.bind(bad)

    class Sum(nn.Module):
        def forward(self, x, y):
            return x + y

    shared = program_shapes(torch.export.export(Sum(), (torch.randn(3, 4), torch.randn(3, 4)),
                                                dynamic_shapes=({0: s}, {0: s})))
    with pytest.raises(tracea.ArgumentError, match="input #1 has size 6 in dim 0, but another input's size there is 5"):
        shared.bind([(5, 4), (6, 4)])


def test_dynamic_dims_compile_once_for_every_size(monkeypatch):
    """The example shapes get their own kernel; the first other size compiles one kernel with
    symbolic sizes, which serves every later size (batch 1 included: traced from a doubled one);
    here even with its GEMMs of run-time rows as generic loops (TRACEA_SYMBOLIC_KERNEL=always)."""
    monkeypatch.setenv("TRACEA_SYMBOLIC_KERNEL", "always")
    torch.manual_seed(0)
    model = mlp().eval()
    compiled = tracea.compile(model, (torch.randn(8, 64),), dynamic_dims={0: 0})
    with torch.no_grad():
        for rows in (8, 3, 1, 17, 64, 5):
            x = torch.randn(rows, 64)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    assert compiled.compiles == 2 and not compiled.special and not compiled.eager_shapes
    assert None in compiled.general.kernel.signature.inputs[-1].shape  # a '?' size in the kernel
    with pytest.raises(tracea.ArgumentError, match="compiled for 64 only"):
        compiled(torch.randn(3, 65))  # a dim not named in dynamic_dims


def test_a_symbolic_kernel_of_slow_products_runs_new_shapes_in_pytorch_then_compiles_them():
    """A kernel for symbolic sizes whose GEMMs have run-time rows runs them as generic loops
    (10-100x slower than eager; a transformer prefill of symbolic length 40-300x): by default it
    is not used, and the traced graph's linears of symbolic rows say so before it is compiled.
    A new shape runs in PyTorch, its second call compiles a kernel for it, its third runs that
    kernel; explain() says so. A symbolic kernel without such products is used (the KV-cache
    tests)."""
    torch.manual_seed(0)
    model = mlp().eval()
    compiled = tracea.compile(model, (torch.randn(8, 64),), dynamic_dims={0: 0})
    with torch.no_grad():
        for rows, compiles, shapes in ((5, 1, 1), (5, 2, 1), (5, 2, 1), (9, 2, 2), (9, 3, 2)):
            x = torch.randn(rows, 64)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
            assert (compiled.compiles, len(compiled.eager_shapes)) == (compiles, shapes), rows
    assert compiled.general_slow and compiled.general is None  # never compiled
    assert list(compiled.special) == [((5, 64),), ((9, 64),)]
    assert "not compiled: the graph's products of symbolic size (aten.linear.default x3)" in compiled.explain()
    assert "a new shape runs in PyTorch, and is compiled for at its second call (2 shape(s)" in compiled.explain()


def test_slow_products_the_graph_does_not_show_are_read_from_the_compiled_kernels_plan():
    """x @ x.T of run-time rows (both operands of symbolic size, as attention's q @ k^T, which the
    attention kernel may take) is left to the compile: its plan counts the generic loops, and the
    kernel is set aside."""
    import model_zoo
    from tracea.frontend.dynamic import products_of_run_time_size
    from tracea.frontend.torch_import import export_model
    model = model_zoo.Fn(lambda x: torch.relu(x @ x.T))
    assert products_of_run_time_size(export_model(model, (torch.randn(8, 16),), dynamic_dims={0: 0}).program) == []
    compiled = tracea.compile(model, (torch.randn(8, 16),), dynamic_dims={0: 0})
    with torch.no_grad():
        for rows in (5, 5, 5):
            x = torch.randn(rows, 16)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    assert compiled.general_slow and RUN_TIME_PRODUCTS in compiled.general.explain()
    assert "not used: its products" in compiled.explain() and list(compiled.special) == [((5, 16),)]


def test_dynamic_sequence_length_of_a_transformer(monkeypatch):
    monkeypatch.setenv("TRACEA_SYMBOLIC_KERNEL", "always")  # the symbolic kernel itself, right
    import model_zoo
    from torch.utils._pytree import tree_leaves
    model, (ids,) = model_zoo.build("bert")
    compiled = tracea.compile(model, (ids,), dynamic_dims={0: 1})
    for seq in (32, 9, 64, 17):
        x = torch.randint(0, 1000, (2, seq))
        with torch.no_grad():
            expected = model(x)
        for want, have in zip(tree_leaves(expected), tree_leaves(compiled(x))):
            torch.testing.assert_close(have, want, rtol=1e-4, atol=1e-4)
    assert compiled.compiles == 2, compiled.explain()


def _mlp_under_dynamo_dynamic():
    """(an MLP, it under torch.compile(dynamic=True) with Tracea's backend, the backend's runners)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model, runners = mlp().eval(), []

    def backend(gm, example_inputs):
        runners.append(dynamo.tracea_backend(gm, example_inputs))
        return runners[-1]
    return model, torch.compile(model, backend=backend, dynamic=True), runners


def test_dynamo_dynamic_shapes_compile_once(monkeypatch):
    monkeypatch.setenv("TRACEA_SYMBOLIC_KERNEL", "always")  # (an MLP's: products of run-time rows)
    model, compiled, runners = _mlp_under_dynamo_dynamic()
    with torch.no_grad():
        for rows in (4, 6, 9, 13, 30):
            x = torch.randn(rows, 64)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    assert len(runners) == 1 and isinstance(runners[0], dynamo._Symbolic)  # one Dynamo graph
    # and one Tracea compile: for symbolic sizes (none for the shape Dynamo met first)
    assert runners[0].model.compiles == 1 and not runners[0].model.special and runners[0].model.static is None
    assert not runners[0].model.eager_shapes


def test_a_dynamo_graph_of_slow_symbolic_products_compiles_nothing_for_a_shape_met_once():
    """A graph Dynamo traced with symbolic rows (an MLP's linears: products of run-time size) gets
    no kernel for symbolic sizes and none for the shape Dynamo met first: every shape runs in
    PyTorch at its first call and is compiled for at its second (a chat loop's prompt graph:
    compiles of 1-2 s each for prompts that never recur)."""
    model, compiled, runners = _mlp_under_dynamo_dynamic()
    with torch.no_grad():
        for rows, compiles, eager in ((4, 0, 1), (6, 0, 2), (4, 1, 2), (4, 1, 2), (9, 1, 3)):
            x = torch.randn(rows, 64)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
            assert (runners[0].model.compiles, len(runners[0].model.eager_shapes)) == (compiles, eager), rows
    assert len(runners) == 1 and runners[0].model.general is None and len(runners[0].model.special) == 1
    assert "not compiled: the graph's products of symbolic size" in runners[0].model.explain()



def test_a_dynamo_graph_whose_shape_cannot_be_compiled_for_runs_in_pytorch(monkeypatch):
    """A symbolic graph's kernel for one shape failing to compile is no error for the user: the
    graph is compiled per shape from then on, and falls back to PyTorch with a warning."""
    import tracea.frontend.torch_model as torch_model
    real = torch_model._compile

    def failing(model, inputs, options, export_fallback, dynamic_dims):
        if dynamic_dims is None:
            raise tracea.CompileError("no kernel for this shape (injected)")
        return real(model, inputs, options, export_fallback, dynamic_dims)

    monkeypatch.setattr(torch_model, "_compile", failing)
    dynamo.fallbacks.clear()
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = mlp().eval()
    compiled = torch.compile(model, backend="tracea", dynamic=True)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for rows in (4, 4, 4):  # in PyTorch once, then its compile fails
            x = torch.randn(rows, 64)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    assert len(dynamo.fallbacks) == 1 and "(injected)" in next(iter(dynamo.fallbacks)), dynamo.fallbacks
    assert any("injected" in str(w.message) for w in caught)

CACHED_MODEL = """
import sys, torch, tracea
from tracea.frontend import torch_import
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32)).eval()
x = torch.randn(4, 16)
calls = []
import tracea.frontend.torch_model as tm
real = tm.to_linalg
tm.to_linalg = lambda program: calls.append(1) or real(program)
compiled = tracea.compile(model, (x,))
with torch.no_grad():
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
print(f"{compiled.kernel.origin}|{len(calls)}")
"""


def test_a_whole_model_compile_is_a_disk_cache_hit_in_a_new_process(tmp_path):
    """The linalg import and the kernel are both cached: a later process only traces the model.
    A damaged import entry is ignored (and rewritten)."""
    import os
    import subprocess
    import sys
    env = dict(os.environ, TRACEA_CACHE_DIR=str(tmp_path))

    def run():
        done = subprocess.run([sys.executable, "-c", CACHED_MODEL], env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout.strip().splitlines()[-1].split("|")

    assert run() == ["compiled", "1"]
    assert run() == ["disk cache", "0"]  # no decomposition, no torch-mlir import, no compile
    for entry in tmp_path.glob("*.text"):
        entry.write_text(entry.read_text().replace("linalg", "linalx", 1))  # damaged, checksum stale
    assert run()[1] == "1"  # imported again, and still correct


class Bottleneck(nn.Module):
    """ResNet's bottleneck (1x1 reduce, 3x3 (here dilated), 1x1 expand, residual add, ReLU) with a
    strided 1x1 downsample on the skip path."""

    def __init__(self, c, mid, out, stride):
        super().__init__()
        self.reduce = nn.Conv2d(c, mid, 1)
        self.spatial = nn.Conv2d(mid, mid, 3, stride=stride, padding=2, dilation=2, bias=False)
        self.expand = nn.Conv2d(mid, out, 1)
        self.down = nn.Conv2d(c, out, 1, stride=stride)

    def forward(self, x):
        y = torch.relu(self.spatial(torch.relu(self.reduce(x))))
        return torch.relu(self.expand(y) + self.down(x))


def resnet_like():
    return nn.Sequential(nn.Conv2d(3, 16, 5, stride=2, padding=2), nn.ReLU(), nn.MaxPool2d(3, 2, padding=1),
                         Bottleneck(16, 8, 32, 1), nn.MaxPool2d(2, 1, dilation=2, ceil_mode=True),
                         Bottleneck(32, 16, 48, 2), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(48, 10))


def test_a_compiled_model_sees_its_weights_change():
    """The weights' numpy views are made once and kept while each weight keeps its storage: an
    update in place shows through them, a weight given new storage (`.data =`, a copy that
    changes its layout) is read anew, and a weight that is not contiguous is copied each call;
    under torch.compile too, where the parameters are the graph's inputs."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.GELU(), torch.nn.Linear(40, 8)).eval()
    x = torch.randn(5, 24)
    compiled = tracea.compile(model, (x,))
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
        views = dict(compiled._run._weight_arrays)
        assert len(views) == 4
        compiled(x)
        assert all(compiled._run._weight_arrays[i][1] is views[i][1] for i in views)  # reused
        model[0].weight.mul_(-2.0)
        model[2].bias.add_(1.0)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
        model[2].weight.data = torch.randn(40, 8).T  # new storage, and not contiguous
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
        model[2].weight.data.mul_(3.0)  # the copy made of a non-contiguous weight is made each call
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
        model[0].weight.data = model[0].weight.data.clone() * 0.5
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
        square = torch.nn.Linear(6, 6, bias=False).eval()
        y = torch.randn(3, 6)
        compiled_square = tracea.compile(square, (y,))
        compiled_square(y)
        square.weight.data = square.weight.data.t()  # the same storage and shape, other strides
        torch.testing.assert_close(compiled_square(y), square(y), rtol=1e-5, atol=1e-5)

    # under torch.compile the parameters are the graph's inputs: their views are kept the same way
    torch._dynamo.reset()
    dynamic = torch.compile(model, backend="tracea")
    with torch.no_grad():
        torch.testing.assert_close(dynamic(x), model(x), rtol=1e-5, atol=1e-5)
        model[0].weight.mul_(0.5)
        model[2].bias.sub_(2.0)
        torch.testing.assert_close(dynamic(x), model(x), rtol=1e-5, atol=1e-5)
        model[0].weight.data = model[0].weight.data.clone() + 1.0
        torch.testing.assert_close(dynamic(x), model(x), rtol=1e-5, atol=1e-5)


def test_cnn_runs_channels_last_and_sees_weight_updates(monkeypatch):
    """A ResNet-style model runs NHWC (tracea-channels-last): every conv is NHWC or a GEMM, the
    residual adds are GEMM epilogues, only the image and the pooled features are transposed. The
    HWCF filters are laid out once and again after an in-place update of the module's weight."""
    from tracea.passes import parse_pipeline, run_pipeline
    torch.manual_seed(0)
    model = resnet_like().eval()
    x = torch.randn(2, 3, 37, 45) * 4  # odd sizes: padded, strided and pooled rows of every length
    compiled = tracea.compile(model, (x,))
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    plan = compiled.explain()
    assert "layout nhwc" in plan and "on cpu.conv2d.direct_nchw" not in plan and "nchw" not in plan, plan
    assert plan.count("residual_add") == 2, plan
    assert set(compiled.weight_layouts.permutations.values()) == {(2, 3, 1, 0)}
    filters = dict(compiled.weight_layouts._laid_out)
    with torch.no_grad():
        compiled(x)
        assert all(compiled.weight_layouts._laid_out[i][1] is filters[i][1] for i in filters)  # not laid out again
        model[5].spatial.weight.mul_(-0.5)
        model[0].weight.add_(0.25)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)

    graph = import_module(model, (x,))
    weights = len(graph.exported.weights)
    result = run_pipeline(graph.text, parse_pipeline(f"tracea-channels-last{{weights={weights}}}"))
    assert result.ok and result.text.count("linalg.transpose ") == 3  # the image, the features, the linear's weight
    assert result.text.count("linalg.conv_2d_nhwc_hwcf") == 4 and "nchw" not in result.text
    unchanged = run_pipeline(graph.text, parse_pipeline("tracea-channels-last")).text  # weights=0
    assert unchanged.count("linalg.conv_2d_nchw_fchw") == 9 and "nhwc" not in unchanged

    monkeypatch.setenv("TRACEA_CHANNELS_LAST", "0")
    nchw = tracea.compile(model, (x,))
    assert "layout nhwc" not in nchw.explain() and not nchw.weight_layouts.permutations
    with torch.no_grad():
        torch.testing.assert_close(nchw(x), model(x), rtol=1e-4, atol=1e-4)


def test_cnn_with_a_depthwise_conv_stays_nchw():
    """All or nothing: the depthwise NCHW kernels are tuned for NCHW, so a model that has one keeps
    every conv NCHW rather than transposing around it."""
    torch.manual_seed(0)
    model = nn.Sequential(mobile(), nn.ReLU(), nn.Conv2d(24, 8, 3, padding=1)).eval()
    x = torch.randn(2, 16, 20, 20)
    compiled = tracea.compile(model, (x,))
    assert "layout nhwc" not in compiled.explain() and not compiled.weight_layouts.permutations
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)


class _ConvCat(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Conv2d(4, 6, 3, padding=1), nn.Conv2d(4, 5, 1), nn.Conv2d(11, 3, 3, stride=2)

    def forward(self, x):  # a channel concat: the NHWC results meet NCHW ops
        return self.c(torch.cat([torch.relu(self.a(x)), self.b(x)], 1))


class _ConvTwoOutputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 8, 3), nn.Conv2d(8, 8, 1)

    def forward(self, x):  # a conv's result read by a gate, a reduction and returned NCHW
        y = self.a(x)
        return self.b(y) * torch.sigmoid(y), y.mean((2, 3))


class _ConvShared(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(6, 6, 3, padding=1)

    def forward(self, x):  # one filter read by two convs; the input subtracted from the result
        return self.a(torch.relu(self.a(x))) - x


class _ConvUpsamplePermute(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.head = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 2, stride=2), nn.Linear(8, 5)

    def forward(self, x):  # nearest upsampling and a constant between convs, then permutes of the result
        y = self.b(nn.functional.interpolate(torch.relu(self.a(x)), scale_factor=2) + 1.5)
        return self.head(y.permute(0, 2, 3, 1)), y.transpose(2, 3)


@pytest.mark.parametrize("make, shape", [(_ConvCat, (2, 4, 9, 11)), (_ConvTwoOutputs, (1, 3, 10, 7)),
                                         (_ConvShared, (1, 6, 8, 8)), (_ConvUpsamplePermute, (2, 3, 5, 6))])
def test_channels_last_keeps_what_surrounds_the_convs_exact(make, shape):
    """Ops the transposes are not sunk through (concat, reductions, resampling, permutes, a
    shared filter, several outputs) see NCHW values exactly as eager computes them."""
    torch.manual_seed(0)
    model, x = make().eval(), torch.randn(shape) * 3
    compiled = tracea.compile(model, (x,))
    assert compiled.weight_layouts.permutations  # the model did run channels-last
    with torch.no_grad():
        got, want = compiled(x), model(x)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


class _Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


@pytest.mark.parametrize("fn, shape", [
    (lambda x: torch.nn.functional.max_pool2d(x, 3, 2), (1, 2, 4, 4)),
    (lambda x: torch.nn.functional.max_pool2d(x, 2, 2), (1, 2, 3, 3)),
    (lambda x: torch.nn.functional.avg_pool2d(x, 3, 2), (1, 2, 4, 4)),
    (lambda x: torch.nn.functional.max_pool2d(x, 3, 2), (1, 2, 4, 7)),
    (lambda x: torch.nn.functional.max_pool2d(torch.relu(x), 3, 2), (2, 3, 4, 4)),
    (lambda x: torch.nn.functional.max_pool2d(x, 3, 2, padding=1, dilation=2), (1, 2, 5, 5)),
    (nn.Conv2d(2, 3, 3, stride=2), (1, 2, 4, 4)),
], ids=["max-3/2-4x4", "max-2/2-3x3", "avg-3/2-4x4", "max-3/2-4x7", "relu-max-batch2", "max-dilated", "conv-3/2-4x4"])
def test_windows_whose_stride_skips_the_last_rows_match_eager(fn, shape):
    """A pool or conv whose windows never reach the input's last rows, with an output extent of 1
    (max_pool2d 3/2 on 4 x 4: rows 0-2): folding the unit dim made the op claim all 4 rows, and the
    max ran over the whole map (inception_v3 at 96 px: 4 % off), or, for a 1 x 3 output, the pool
    fell back to PyTorch. tracea-exact-windows cuts the input to what the windows reach."""
    torch.manual_seed(6)
    model, x = (fn if isinstance(fn, nn.Module) else _Fn(fn)).eval(), torch.randn(*shape) * 10
    compiled = tracea.compile(model, (x,))
    assert compiled.placement.regions == 1 and not compiled.placement.eager
    with torch.no_grad():
        np.testing.assert_allclose(compiled(x).numpy(), model(x).numpy(), rtol=1e-5, atol=1e-5)


class _Box:
    def __init__(self, value):
        self.value = value


class _ReturnsObjects(nn.Module):
    def __init__(self, holds_tensor):
        super().__init__()
        self.holds_tensor = holds_tensor

    def forward(self, x):
        return x * 2, _Box({"next": [x + 1]} if self.holds_tensor else "a label")


def test_an_output_object_holding_tensors_is_refused_not_returned_stale():
    """An output that is neither a tensor nor a pytree node was returned as the object the trace
    made: one holding tensors (transformers' DynamicCache with use_cache=True) then handed out
    the trace's FakeTensors on every call, silently. Now the compile names it and the ways out;
    an object holding no tensor is still returned as is."""
    x = torch.ones(2)
    with pytest.raises(tracea.CompileError, match="returns a _Box holding tensors.*use_cache=False"):
        tracea.compile(_ReturnsObjects(True), (x,))
    y, box = tracea.compile(_ReturnsObjects(False), (x,))(torch.full((2,), 5.0))
    assert torch.equal(y, torch.full((2,), 10.0)) and box.value == "a label"
