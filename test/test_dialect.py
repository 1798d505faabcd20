"""The Python builder API and the dialect's verification, as a user meets them."""
from __future__ import annotations

import mlir.ir as ir
import pytest

import tracea
from tracea import dialects as td
from tracea.dialects.ops import OP_DEFS, TensorSpec, view
from tracea.dialects.verify import tracea_ops
from tracea.errors import OpError


def build(*specs):
    return lambda body: td.function(*specs)(body)


def test_dialect_loads_in_every_context():
    ctx = td.make_context()
    for name in OP_DEFS:
        assert ctx.is_registered_operation(name)


def test_builders_infer_result_types():
    @td.function(td.tensor((2, 8, 16), "bf16"), td.tensor((32, 16), "bf16"))
    def f(x, w):
        y = td.gemm(x, w, transpose_b=True, out_dtype="f32")
        assert str(y.type) == "tensor<2x8x32xf32>"
        z = td.gemm(x, w, transpose_b=True)
        assert str(z.type) == "tensor<2x8x32xbf16>"
        return y

    assert f.outputs == [TensorSpec((2, 8, 32), "f32")]


def test_conv2d_builder_accepts_ints_and_pairs():
    @td.function(td.tensor((1, 4, 10, 10)), td.tensor((8, 2, 3, 3)))
    def f(x, w):
        y = td.conv2d(x, w, stride=(2, 1), padding=1, dilation=1, groups=2)
        assert str(y.type) == "tensor<1x8x5x10xf32>"
        return y


@pytest.mark.parametrize("body,message", [
    (lambda a, b: td.gemm(a, a), "tracea.gemm: contraction sizes differ: 'a' tensor<4x8xf32> has K=8 but 'b' tensor<4x8xf32> has K=4"),
    (lambda a, b: td.gemm(a, b, out_dtype="f16"), "result element type f16 is not allowed here; expected f32"),
    (lambda a, b: td.softmax(a, axis=5), "tracea.softmax: axis 5 is out of range for rank 2"),
    (lambda a, b: td.fused_gemm(a, b, [td.relu(), "gelu"]), "epilogue #1 must be built with bias_add(), relu(), gelu()"),
    (lambda a, b: td.fused_gemm(a, b, [td.gelu("fast")]), "epilogue #0: epilogue 'gelu' approximate must be 'erf' or 'tanh', got 'fast'"),
    (lambda a, b: td.fused_gemm(a, b, [td.bias_add(a)]), "operand 'bias' has shape [4, 8]; expected [3]"),
    (lambda a, b: td.fused_gemm(a, b, [td.bias_add(a), td.bias_add(a)]), "the epilogue may have one bias_add"),
    (lambda a, b: td.gemm(a, 3.0), "operand 'b' must be a value built in a tracea function"),
    (lambda a, b: td.attention(a, a, b), "operand 'value' has 8 positions but key has 4"),
    (lambda a, b: td.gemm(a, b, schedule=td.Schedule(stages=0)), "schedule stages must be >= 1, got 0"),
    (lambda a, b: td.gemm(a, b, schedule=td.Schedule(lane_map=td.LaneMap("wgmma", (64, 12, 16)))),
     "wgmma lane_map shape must be [64, N, K] with N a multiple of 8"),
    (lambda a, b: [a, "x"], "@f: result #1 must be a value built in the function, got str"),
])
def test_builder_errors_name_the_problem(body, message):
    with pytest.raises(OpError) as e:
        td.function(td.tensor((4, 8)), td.tensor((8, 3)), name="f")(body)
    assert message in str(e.value)


def test_a_conv_epilogue_takes_no_operands():
    x, f = td.tensor((1, 3, 8, 8)), td.tensor((4, 3, 3, 3))
    with pytest.raises(OpError, match="epilogue #0 is residual_add: a conv2d's epilogue steps take no operands"):
        td.function(x, f, td.tensor((1, 4, 6, 6)))(lambda a, w, r: td.conv2d(a, w, epilogue=[td.residual_add(r)]))
    with pytest.raises(OpError, match="epilogue steps are built with relu"):
        td.function(x, f)(lambda a, w: td.conv2d(a, w, epilogue=["relu"]))
    text = str(td.function(x, f)(lambda a, w: td.conv2d(a, w, epilogue=[td.relu(), td.hardswish()])))
    assert 'epilogue = [{kind = "relu"}, {kind = "hardswish"}]' in text
    bad = text.replace('{kind = "relu"}', '{kind = "bias_add"}')
    with pytest.raises(tracea.CompileError, match="a conv2d's epilogue steps take no operands"):
        tracea.compile(bad)


def test_function_input_types_are_checked():
    with pytest.raises(OpError, match="input #1 of @function must be tracea.dialects.tensor"):
        td.function(td.tensor((4, 8)), (8, 3))
    with pytest.raises(OpError, match="must have positive sizes"):
        td.tensor((4, 0))


def test_schedule_round_trips_through_attributes():
    schedule = td.Schedule(tile=(128, 256, 64), warp_tile=(64, 64, 64), stages=4, swizzle=td.Swizzle.xor(3, 4, 3),
                           lane_map=td.LaneMap("wgmma", (64, 256, 16)), barrier="producer_consumer",
                           persistent=132, group_m=16, cluster=2, store="tma", threads=1)
    with td.make_context():
        attr = schedule.to_attr()
        assert td.Schedule.from_attr(ir.Attribute.parse(str(attr))) == schedule
        assert td.Schedule.from_attr(ir.Attribute.parse("{}")) == td.Schedule()


def test_swizzle_is_a_permutation():
    swizzle = td.Swizzle.xor(3, 3, 3)
    offsets = range(8 * 64)
    assert sorted(swizzle.apply(o) for o in offsets) == list(offsets)
    assert td.Swizzle().apply(77) == 77


def test_view_decodes_parsed_ops():
    text = """
    func.func @f(%a: tensor<4x8xf16>, %b: tensor<8x3xf16>, %bias: tensor<3xf16>) -> tensor<4x3xf32> {
      %c = "tracea.fused_gemm"(%a, %b, %bias) {epilogue = [{kind = "bias_add"}, {kind = "gelu"}],
          operandSegmentSizes = array<i32: 1, 1, 1, 0>} : (tensor<4x8xf16>, tensor<8x3xf16>, tensor<3xf16>) -> tensor<4x3xf32>
      return %c : tensor<4x3xf32>
    }"""
    with td.make_context():
        module = ir.Module.parse(text)
        (op,) = tracea_ops(module.operation)
        v = view(op)
    assert list(v.operands) == ["a", "b", "bias"]
    assert v.result == TensorSpec((4, 3), "f32")
    assert [e.kind for e in v.attrs["epilogue"]] == ["bias_add", "gelu"]
    assert v.attrs["epilogue"][1].approximate == "erf"  # the default
    assert v.attrs["transpose_a"] is False


def test_compile_reports_invalid_ir_with_locations():
    text = """func.func @f(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %y = "tracea.softmax"(%x) {axis = 3 : i64} : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return %y : tensor<4x8xf32>
}"""
    with pytest.raises(tracea.CompileError) as e:
        tracea.compile(text)
    assert "<string>:2:8: error: 'tracea.softmax' op axis 3 is out of range for rank 2" in str(e.value)
    assert e.value.diagnostics[0].line == 2


def test_compile_reports_parse_errors():
    with pytest.raises(tracea.CompileError, match=r"<string>:1:\d+: error: "):
        tracea.compile("func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> { return %y : tensor<4xf32> }")


def test_every_input_of_a_variadic_body_is_named():
    """A `*rest` body used to name only its first variadic input, so compile_gpu's artifact and
    the AOT library dropped the others (a 4-input linear kernel took 3)."""
    specs = [td.tensor((4, 8), "f32"), td.tensor((6, 8), "f32"), td.tensor((6,), "f32"), td.tensor((4, 6), "f32")]

    def body(x, w, *rest):
        return td.fused_gemm(x, w, [td.bias_add(rest[0]), td.residual_add(rest[1])], transpose_b=True)

    assert td.function(*specs, name="linear")(body).arg_names == ["x", "w", "rest0", "rest1"]
    assert td.function(*specs[:2], name="mm")(lambda *xs: td.gemm(xs[0], xs[1], transpose_b=True)).arg_names == ["xs0", "xs1"]
