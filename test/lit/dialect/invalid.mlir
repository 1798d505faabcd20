// Invalid tracea ops are rejected with a message naming the operand or attribute at fault.
// RUN: tracea-opt %s --split-input-file --verify-diagnostics

func.func @k_mismatch(%a: tensor<4x8xf32>, %b: tensor<7x3xf32>) -> tensor<4x3xf32> {
  // expected-error @+1 {{contraction sizes differ: 'a' tensor<4x8xf32> has K=8 but 'b' tensor<7x3xf32> has K=7}}
  %c = "tracea.gemm"(%a, %b) : (tensor<4x8xf32>, tensor<7x3xf32>) -> tensor<4x3xf32>
  return %c : tensor<4x3xf32>
}

// -----
func.func @wrong_result(%a: tensor<4x8xf32>, %b: tensor<8x3xf32>) -> tensor<4x4xf32> {
  // expected-error @+1 {{result type tensor<4x4xf32> does not match the inferred type tensor<4x3xf32>}}
  %c = "tracea.gemm"(%a, %b) : (tensor<4x8xf32>, tensor<8x3xf32>) -> tensor<4x4xf32>
  return %c : tensor<4x4xf32>
}

// -----
func.func @int_operand(%a: tensor<4x8xi32>, %b: tensor<8x3xi32>) -> tensor<4x3xi32> {
  // expected-error @+1 {{operand 'a' has element type i32; expected one of f32, f16, bf16}}
  %c = "tracea.gemm"(%a, %b) : (tensor<4x8xi32>, tensor<8x3xi32>) -> tensor<4x3xi32>
  return %c : tensor<4x3xi32>
}

// -----
func.func @mixed_dtypes(%a: tensor<4x8xf16>, %b: tensor<8x3xf32>) -> tensor<4x3xf32> {
  // expected-error @+1 {{operand 'b' has element type f32 but 'a' has f16; they must match}}
  %c = "tracea.gemm"(%a, %b) : (tensor<4x8xf16>, tensor<8x3xf32>) -> tensor<4x3xf32>
  return %c : tensor<4x3xf32>
}

// -----
func.func @dynamic(%a: tensor<?x8xf32>, %b: tensor<8x3xf32>) -> tensor<?x3xf32> {
  // expected-error @+1 {{operand 'a' has a dynamic shape (tensor<?x8xf32>); tracea ops need static shapes}}
  %c = "tracea.gemm"(%a, %b) : (tensor<?x8xf32>, tensor<8x3xf32>) -> tensor<?x3xf32>
  return %c : tensor<?x3xf32>
}

// -----
func.func @rank1(%a: tensor<8xf32>, %b: tensor<8x3xf32>) -> tensor<3xf32> {
  // expected-error @+1 {{operand 'a' must have rank >= 2 ([..., M, K])}}
  %c = "tracea.gemm"(%a, %b) : (tensor<8xf32>, tensor<8x3xf32>) -> tensor<3xf32>
  return %c : tensor<3xf32>
}

// -----
func.func @not_a_tensor(%a: memref<4x8xf32>, %b: tensor<8x3xf32>) -> tensor<4x3xf32> {
  // expected-error @+1 {{expected base type 'builtin.tensor' but got 'builtin.memref'}}
  %c = "tracea.gemm"(%a, %b) : (memref<4x8xf32>, tensor<8x3xf32>) -> tensor<4x3xf32>
  return %c : tensor<4x3xf32>
}

// -----
func.func @typo_attribute(%a: tensor<4x8xf32>, %b: tensor<8x3xf32>) -> tensor<4x3xf32> {
  // expected-error @+1 {{unknown attribute 'tranpose_a'; tracea.gemm takes schedule, transpose_a, transpose_b}}
  %c = "tracea.gemm"(%a, %b) {tranpose_a = true} : (tensor<4x8xf32>, tensor<8x3xf32>) -> tensor<4x3xf32>
  return %c : tensor<4x3xf32>
}

// -----
func.func @bad_bool(%a: tensor<4x8xf32>, %b: tensor<8x3xf32>) -> tensor<4x3xf32> {
  // expected-error @+1 {{attribute 'transpose_a' must be true or false, got 1 : i64}}
  %c = "tracea.gemm"(%a, %b) {transpose_a = 1} : (tensor<4x8xf32>, tensor<8x3xf32>) -> tensor<4x3xf32>
  return %c : tensor<4x3xf32>
}

// -----
func.func @schedule_key(%a: tensor<4x8xf32>, %b: tensor<8x3xf32>) -> tensor<4x3xf32> {
  // expected-error @+1 {{schedule has unknown key 'tiles'}}
  %c = "tracea.gemm"(%a, %b) {schedule = {tiles = array<i64: 64, 64>}} : (tensor<4x8xf32>, tensor<8x3xf32>) -> tensor<4x3xf32>
  return %c : tensor<4x3xf32>
}

// -----
func.func @schedule_warp_tile(%a: tensor<4x8xf32>, %b: tensor<8x3xf32>) -> tensor<4x3xf32> {
  // expected-error @+1 {{schedule warp_tile [48, 64, 32] must divide tile [128, 128, 32] entry by entry}}
  %c = "tracea.gemm"(%a, %b) {schedule = {tile = array<i64: 128, 128, 32>, warp_tile = array<i64: 48, 64, 32>}} : (tensor<4x8xf32>, tensor<8x3xf32>) -> tensor<4x3xf32>
  return %c : tensor<4x3xf32>
}

// -----
func.func @schedule_stages(%a: tensor<4x8xf32>, %b: tensor<8x3xf32>) -> tensor<4x3xf32> {
  // expected-error @below {{schedule stages must be >= 1, got 0}}
  %c = "tracea.gemm"(%a, %b) {schedule = {stages = 0 : i64}} : (tensor<4x8xf32>, tensor<8x3xf32>) -> tensor<4x3xf32>
  return %c : tensor<4x3xf32>
}

// -----
func.func @schedule_barrier(%a: tensor<4x8xf32>, %b: tensor<8x3xf32>) -> tensor<4x3xf32> {
  // expected-error @+1 {{schedule barrier 'producer_consumer' needs stages >= 2}}
  %c = "tracea.gemm"(%a, %b) {schedule = {barrier = "producer_consumer"}} : (tensor<4x8xf32>, tensor<8x3xf32>) -> tensor<4x3xf32>
  return %c : tensor<4x3xf32>
}

// -----
func.func @schedule_swizzle(%a: tensor<4x8xf32>, %b: tensor<8x3xf32>) -> tensor<4x3xf32> {
  // expected-error @+1 {{xor swizzle needs bits >= 1, base >= 0 and shift >= bits}}
  %c = "tracea.gemm"(%a, %b) {schedule = {swizzle = {kind = "xor", bits = 3 : i64, base = 3 : i64, shift = 2 : i64}}} : (tensor<4x8xf32>, tensor<8x3xf32>) -> tensor<4x3xf32>
  return %c : tensor<4x3xf32>
}

// -----
func.func @schedule_lane_map(%a: tensor<4x8xf32>, %b: tensor<8x3xf32>) -> tensor<4x3xf32> {
  // expected-error @+1 {{mma_sync lane_map shape must be one of m16n8k16, m16n8k8; got [16, 16, 16]}}
  %c = "tracea.gemm"(%a, %b) {schedule = {lane_map = {kind = "mma_sync", shape = array<i64: 16, 16, 16>}}} : (tensor<4x8xf32>, tensor<8x3xf32>) -> tensor<4x3xf32>
  return %c : tensor<4x3xf32>
}

// -----
func.func @epilogue_missing_bias(%a: tensor<4x8xf32>, %b: tensor<8x3xf32>) -> tensor<4x3xf32> {
  // expected-error @+1 {{epilogue #0 is bias_add but the op has no 'bias' operand}}
  %c = "tracea.fused_gemm"(%a, %b) {epilogue = [{kind = "bias_add"}], operandSegmentSizes = array<i32: 1, 1, 0, 0>} : (tensor<4x8xf32>, tensor<8x3xf32>) -> tensor<4x3xf32>
  return %c : tensor<4x3xf32>
}

// -----
func.func @epilogue_bias_shape(%a: tensor<4x8xf32>, %b: tensor<8x3xf32>, %bias: tensor<4xf32>) -> tensor<4x3xf32> {
  // expected-error @+1 {{operand 'bias' has shape [4]; expected [3]}}
  %c = "tracea.fused_gemm"(%a, %b, %bias) {epilogue = [{kind = "bias_add"}], operandSegmentSizes = array<i32: 1, 1, 1, 0>} : (tensor<4x8xf32>, tensor<8x3xf32>, tensor<4xf32>) -> tensor<4x3xf32>
  return %c : tensor<4x3xf32>
}

// -----
func.func @epilogue_unknown(%a: tensor<4x8xf32>, %b: tensor<8x3xf32>) -> tensor<4x3xf32> {
  // expected-error @+1 {{epilogue #1: unknown epilogue 'tanh'}}
  %c = "tracea.fused_gemm"(%a, %b) {epilogue = [{kind = "relu"}, {kind = "tanh"}], operandSegmentSizes = array<i32: 1, 1, 0, 0>} : (tensor<4x8xf32>, tensor<8x3xf32>) -> tensor<4x3xf32>
  return %c : tensor<4x3xf32>
}

// -----
func.func @epilogue_scale(%a: tensor<4x8xf32>, %b: tensor<8x3xf32>) -> tensor<4x3xf32> {
  // expected-error @+1 {{epilogue #0: epilogue 'scale' needs a finite 'value'}}
  %c = "tracea.fused_gemm"(%a, %b) {epilogue = [{kind = "scale"}], operandSegmentSizes = array<i32: 1, 1, 0, 0>} : (tensor<4x8xf32>, tensor<8x3xf32>) -> tensor<4x3xf32>
  return %c : tensor<4x3xf32>
}

// -----
func.func @epilogue_missing(%a: tensor<4x8xf32>, %b: tensor<8x3xf32>) -> tensor<4x3xf32> {
  // expected-error @+1 {{missing required attribute 'epilogue'}}
  %c = "tracea.fused_gemm"(%a, %b) {operandSegmentSizes = array<i32: 1, 1, 0, 0>} : (tensor<4x8xf32>, tensor<8x3xf32>) -> tensor<4x3xf32>
  return %c : tensor<4x3xf32>
}

// -----
func.func @softmax_axis(%x: tensor<4x10xf32>) -> tensor<4x10xf32> {
  // expected-error @+1 {{axis 2 is out of range for rank 2 (expected -2..1)}}
  %y = "tracea.softmax"(%x) {axis = 2 : i64} : (tensor<4x10xf32>) -> tensor<4x10xf32>
  return %y : tensor<4x10xf32>
}

// -----
func.func @conv_channels(%x: tensor<1x4x9x9xf32>, %w: tensor<6x3x3x3xf32>) -> tensor<1x6x7x7xf32> {
  // expected-error @+1 {{operand 'filter' tensor<6x3x3x3xf32> has 3 input channels per group; the input has 4 channels in 1 group(s), so expected 4}}
  %y = "tracea.conv2d"(%x, %w) : (tensor<1x4x9x9xf32>, tensor<6x3x3x3xf32>) -> tensor<1x6x7x7xf32>
  return %y : tensor<1x6x7x7xf32>
}

// -----
func.func @conv_groups(%x: tensor<1x4x9x9xf32>, %w: tensor<6x4x3x3xf32>) -> tensor<1x6x7x7xf32> {
  // expected-error @+1 {{groups=3 must be >= 1 and divide both the input channels (4) and the filter count (6)}}
  %y = "tracea.conv2d"(%x, %w) {groups = 3 : i64} : (tensor<1x4x9x9xf32>, tensor<6x4x3x3xf32>) -> tensor<1x6x7x7xf32>
  return %y : tensor<1x6x7x7xf32>
}

// -----
func.func @conv_too_small(%x: tensor<1x4x2x2xf32>, %w: tensor<6x4x3x3xf32>) -> tensor<1x6x1x1xf32> {
  // expected-error @+1 {{the 3x3 filter (dilation 1x1) does not fit the padded 2x2 input}}
  %y = "tracea.conv2d"(%x, %w) : (tensor<1x4x2x2xf32>, tensor<6x4x3x3xf32>) -> tensor<1x6x1x1xf32>
  return %y : tensor<1x6x1x1xf32>
}

// -----
func.func @conv_layout(%x: tensor<1x4x9x9xf32>, %w: tensor<6x4x3x3xf32>) -> tensor<1x6x7x7xf32> {
  // expected-error @+1 {{attribute 'layout' must be 'nchw' or 'nhwc', got 'chwn'}}
  %y = "tracea.conv2d"(%x, %w) {layout = "chwn"} : (tensor<1x4x9x9xf32>, tensor<6x4x3x3xf32>) -> tensor<1x6x7x7xf32>
  return %y : tensor<1x6x7x7xf32>
}

// -----
func.func @conv_stride(%x: tensor<1x4x9x9xf32>, %w: tensor<6x4x3x3xf32>) -> tensor<1x6x7x7xf32> {
  // expected-error @+1 {{attribute 'stride' must be 2 positive integers, got [0, 1]}}
  %y = "tracea.conv2d"(%x, %w) {stride = array<i64: 0, 1>} : (tensor<1x4x9x9xf32>, tensor<6x4x3x3xf32>) -> tensor<1x6x7x7xf32>
  return %y : tensor<1x6x7x7xf32>
}

// -----
func.func @attention_head_dim(%q: tensor<2x16x64xf32>, %k: tensor<2x16x32xf32>, %v: tensor<2x16x64xf32>) -> tensor<2x16x64xf32> {
  // expected-error @+1 {{operand 'key' head dim 32 differs from query's 64}}
  %o = "tracea.attention"(%q, %k, %v) : (tensor<2x16x64xf32>, tensor<2x16x32xf32>, tensor<2x16x64xf32>) -> tensor<2x16x64xf32>
  return %o : tensor<2x16x64xf32>
}

// -----
func.func @attention_batch(%q: tensor<2x16x64xf32>, %k: tensor<3x16x64xf32>, %v: tensor<3x16x64xf32>) -> tensor<2x16x64xf32> {
  // expected-error @+1 {{batch dims differ: query [2], key [3], value [3]}}
  %o = "tracea.attention"(%q, %k, %v) : (tensor<2x16x64xf32>, tensor<3x16x64xf32>, tensor<3x16x64xf32>) -> tensor<2x16x64xf32>
  return %o : tensor<2x16x64xf32>
}

// -----
func.func @attention_values(%q: tensor<2x16x64xf32>, %k: tensor<2x16x64xf32>, %v: tensor<2x8x64xf32>) -> tensor<2x16x64xf32> {
  // expected-error @+1 {{operand 'value' has 8 positions but key has 16}}
  %o = "tracea.attention"(%q, %k, %v) : (tensor<2x16x64xf32>, tensor<2x16x64xf32>, tensor<2x8x64xf32>) -> tensor<2x16x64xf32>
  return %o : tensor<2x16x64xf32>
}

// -----
func.func @wrong_operand_count(%a: tensor<4x8xf32>) -> tensor<4x8xf32> {
  // expected-error @+1 {{op expects exactly 1 operands, but got 2}}
  %y = "tracea.softmax"(%a, %a) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  return %y : tensor<4x8xf32>
}

// -----

// An array of unsigned ints aborts MLIR's Python bindings when read: refused from the op's text.
func.func @unsigned_tile(%a: tensor<4x8xf32>, %b: tensor<8x4xf32>) -> tensor<4x4xf32> {
  // expected-error @+1 {{attribute arrays must be of signless integers (array<i64: ...>), got array<ui8}}
  %0 = "tracea.gemm"(%a, %b) {schedule = {tile = array<ui8: 4, 4, 4>}} : (tensor<4x8xf32>, tensor<8x4xf32>) -> tensor<4x4xf32>
  return %0 : tensor<4x4xf32>
}
