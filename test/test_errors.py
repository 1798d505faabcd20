"""Bad input of every kind is an error naming the problem (and one line from the command-line
tools), never a traceback from deep inside or an internal compiler error."""
import numpy as np
import pytest

import tracea
from tracea import dialects as td
from tracea.errors import CompileError, OpError
from tracea.tools import opt


def _softmax():
    return td.function(td.tensor((4, 4)), name="s")(td.softmax)


def test_a_bad_thread_count_in_the_environment_names_the_variable(monkeypatch):
    monkeypatch.setenv("TRACEA_NUM_THREADS", "abc")
    with pytest.raises(ValueError, match="TRACEA_NUM_THREADS must be a positive number"):
        tracea.compile(_softmax())


@pytest.mark.parametrize("threads", [0, -1])
def test_a_thread_count_below_one_is_refused(threads):
    with pytest.raises(ValueError, match="threads must be a positive number"):
        tracea.compile(_softmax(), threads=threads)


def test_an_unknown_target_lists_every_target():
    with pytest.raises(ValueError, match="available: cpu, cuda"):
        tracea.compile(_softmax(), target="tpu")


def test_sizes_that_overflow_are_input_errors():
    with pytest.raises(OpError, match="too large for 64-bit sizes"):
        td.tensor((2 ** 40, 2 ** 40))
    big = ('func.func @g(%a: tensor<1099511627776x1099511627776xf32>, %b: tensor<1099511627776x8xf32>) '
           '-> tensor<1099511627776x8xf32> {\n  %c = "tracea.gemm"(%a, %b) : (tensor<1099511627776x1099511627776xf32>, '
           'tensor<1099511627776x8xf32>) -> tensor<1099511627776x8xf32>\n  return %c : tensor<1099511627776x8xf32>\n}')
    with pytest.raises(CompileError, match="too large for 64-bit sizes"):
        tracea.compile(big)


def test_inputs_mlirs_parser_aborts_on_are_errors_not_aborts(tmp_path, capsys):
    """An int64 element count that overflows inside the body (the IR fuzzer's mutant: a
    constant of 2^63 - 1 x 4 elements) made MLIR's parser abort, reported as an internal
    compiler error; it is now an error at the type's line and column."""
    from tracea.tools import opt
    text = ("func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {\n"
            "  %c = arith.constant dense<0.0> : tensor<9223372036854775807x4xf32>\n"
            "  return %x : tensor<4xf32>\n}\n")
    with pytest.raises(CompileError, match=r"<string>:2:36: error: the type tensor<9223372036854775807x4x\.\.\. "
                                           r"has 3\.69e\+19 elements: too large"):
        tracea.compile(text)
    path = tmp_path / "huge.mlir"
    path.write_text(text)
    assert opt.main([str(path)]) == 1
    err = capsys.readouterr().err
    assert "huge.mlir:2:36: error" in err and "internal compiler error" not in err
    # another mutant MLIR's parser aborts on: a dense array of index
    path.write_text("func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> attributes {a = array<index: 1>} {\n"
                    "  return %x : tensor<4xf32>\n}\n")
    assert opt.main([str(path)]) == 1
    err = capsys.readouterr().err
    assert "huge.mlir:1:66: error: array<index: ...>: MLIR has no dense arrays of index" in err


def test_tracea_opt_reports_unreadable_input_and_unwritable_output_in_one_line(tmp_path, capsys):
    binary = tmp_path / "binary.mlir"
    binary.write_bytes(b"\xff\xfe\x00 not text")
    assert opt.main([str(binary)]) == 1
    assert capsys.readouterr().err.strip() == f"tracea-opt: error: {binary} is not UTF-8 text (byte 0): is it an MLIR file?"
    source = tmp_path / "ok.mlir"
    source.write_text("func.func @f() {\n  return\n}\n")
    assert opt.main([str(source), "-o", str(tmp_path / "missing" / "out.mlir")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("tracea-opt: error: cannot write") and "\n" not in err


def test_a_binary_file_given_to_compile_is_a_compile_error(tmp_path):
    binary = tmp_path / "binary.mlir"
    binary.write_bytes(b"\xff\xfe\x00 not text")
    with pytest.raises(CompileError, match="is not UTF-8 text"):
        tracea.compile(binary)


def test_conv2d_of_an_empty_batch_returns_an_empty_result():
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'tracea[torch]')")
    from tracea import ops
    x, w, b = torch.zeros(0, 3, 8, 8), torch.randn(4, 3, 3, 3), torch.randn(4)
    y = ops.conv2d(x, w, b, padding=(1, 1))
    assert y.shape == torch.nn.functional.conv2d(x, w, b, padding=1).shape == (0, 4, 8, 8)
    np.testing.assert_array_equal(y.numpy(), np.zeros((0, 4, 8, 8), np.float32))


def test_a_model_in_training_mode_is_compiled_with_a_warning_to_call_eval():
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'tracea[torch]')")
    pytest.importorskip("torch_mlir.fx", reason="torch-mlir is not installed (pip install 'tracea[torch]')")

    class Trained(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)
            self.dropout = torch.nn.Dropout(0.0)  # computes as in eval mode: the results compare

        def forward(self, x):
            return self.dropout(self.linear(x).relu())

    model, x = Trained(), torch.randn(3, 4)
    with pytest.warns(RuntimeWarning, match=r"training mode.*call model.eval\(\)"):
        compiled = tracea.compile(model, (x,))
    torch.testing.assert_close(compiled(x), model(x))


def test_a_pass_failing_without_a_diagnostic_is_named(monkeypatch):
    """A pass that fails without saying why (a compiler bug) is named in the error, with the
    stage, instead of a bare "pass pipeline failed"."""
    from tracea.passes.pipeline import parse_pipeline, run_pipeline
    from tracea.passes.registry import PassFailed
    from tracea.passes.widen_i1 import WidenBoolTensorsPass

    def silent(self, op):
        raise PassFailed()
    monkeypatch.setattr(WidenBoolTensorsPass, "run", silent)
    stages = [("first", parse_pipeline("canonicalize")), ("second", parse_pipeline("cse, tracea-widen-i1, cse"))]
    result = run_pipeline("func.func @f() { return }", stages, isolate=False)
    assert not result.ok
    assert [str(d) for d in result.diagnostics] == [
        "error: pass 'tracea-widen-i1' failed in stage 'second' without saying why: a bug in Tracea; please report "
        "it with the input"]


@pytest.mark.parametrize("chip", ["sm_80", "gfx942", "vulkan-lavapipe"])
def test_gpu_kernels_refuse_run_time_lengths_and_masks_by_name(chip):
    """Attention's run-time key length and its mask operand are the CPU kernel's: a GPU compile
    names them (not a TypeError from inside its planning)."""
    dynamic = td.function(td.tensor((2, 1, 64), "f16"), *[td.tensor((2, None, 64), "f16")] * 2)(td.attention)
    with pytest.raises(CompileError, match=r"operand 'key' \(tensor<2x\?x64xf16>\) has a size known at run time only"):
        tracea.compile_gpu(dynamic, chip=chip)
    masked = td.function(*[td.tensor((2, 16, 64), "f16")] * 3, td.tensor((1, 1, 16)))(
        lambda q, k, v, m: td.attention(q, k, v, mask=m))
    with pytest.raises(CompileError, match="takes no attention mask"):
        tracea.compile_gpu(masked, chip=chip)
