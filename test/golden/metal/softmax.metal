#pragma clang diagnostic ignored "-Wmissing-prototypes"
#pragma clang diagnostic ignored "-Wmissing-braces"

#include <metal_stdlib>
#include <simd/simd.h>

using namespace metal;

template<typename T, size_t Num>
struct spvUnsafeArray
{
    T elements[Num ? Num : 1];
    
    thread T& operator [] (size_t pos) thread
    {
        return elements[pos];
    }
    constexpr const thread T& operator [] (size_t pos) const thread
    {
        return elements[pos];
    }
    
    device T& operator [] (size_t pos) device
    {
        return elements[pos];
    }
    constexpr const device T& operator [] (size_t pos) const device
    {
        return elements[pos];
    }
    
    constexpr const constant T& operator [] (size_t pos) const constant
    {
        return elements[pos];
    }
    
    threadgroup T& operator [] (size_t pos) threadgroup
    {
        return elements[pos];
    }
    constexpr const threadgroup T& operator [] (size_t pos) const threadgroup
    {
        return elements[pos];
    }
};

struct _7
{
    spvUnsafeArray<float, 128> _m0;
};

struct _13
{
    float _m0[400];
};

kernel void softmax(device _13& softmax_arg_0 [[buffer(0)]], device _13& softmax_arg_1 [[buffer(1)]], uint3 gl_LocalInvocationID [[thread_position_in_threadgroup]], uint3 gl_WorkGroupID [[threadgroup_position_in_grid]])
{
    threadgroup _7 _workgroup_mem_0;
    float _51;
    uint _55 = gl_LocalInvocationID.x;
    float _56 = as_type<float>(0xff800000u /* -inf */);
    for (; int(_55) < int(100u); )
    {
        uint _60 = _55 + (gl_WorkGroupID.x * 100u);
        float _69 = (isnan(softmax_arg_0._m0[_60]) || isnan(softmax_arg_0._m0[_60])) ? softmax_arg_0._m0[_60] : ((isunordered(_56, softmax_arg_0._m0[_60]) || _56 > softmax_arg_0._m0[_60]) ? _56 : softmax_arg_0._m0[_60]);
        _51 = _69;
        _55 += 128u;
        _56 = _69;
        continue;
    }
    _workgroup_mem_0._m0[gl_LocalInvocationID.x] = _51;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (gl_LocalInvocationID.x < 64u)
    {
        uint _79 = gl_LocalInvocationID.x + 64u;
        _workgroup_mem_0._m0[gl_LocalInvocationID.x] = (isnan(_workgroup_mem_0._m0[_79]) || isnan(_workgroup_mem_0._m0[_79])) ? _workgroup_mem_0._m0[_79] : ((isunordered(_workgroup_mem_0._m0[gl_LocalInvocationID.x], _workgroup_mem_0._m0[_79]) || _workgroup_mem_0._m0[gl_LocalInvocationID.x] > _workgroup_mem_0._m0[_79]) ? _workgroup_mem_0._m0[gl_LocalInvocationID.x] : _workgroup_mem_0._m0[_79]);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (gl_LocalInvocationID.x < 32u)
    {
        uint _95 = gl_LocalInvocationID.x + 32u;
        _workgroup_mem_0._m0[gl_LocalInvocationID.x] = (isnan(_workgroup_mem_0._m0[_95]) || isnan(_workgroup_mem_0._m0[_95])) ? _workgroup_mem_0._m0[_95] : ((isunordered(_workgroup_mem_0._m0[gl_LocalInvocationID.x], _workgroup_mem_0._m0[_95]) || _workgroup_mem_0._m0[gl_LocalInvocationID.x] > _workgroup_mem_0._m0[_95]) ? _workgroup_mem_0._m0[gl_LocalInvocationID.x] : _workgroup_mem_0._m0[_95]);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (gl_LocalInvocationID.x < 16u)
    {
        uint _111 = gl_LocalInvocationID.x + 16u;
        _workgroup_mem_0._m0[gl_LocalInvocationID.x] = (isnan(_workgroup_mem_0._m0[_111]) || isnan(_workgroup_mem_0._m0[_111])) ? _workgroup_mem_0._m0[_111] : ((isunordered(_workgroup_mem_0._m0[gl_LocalInvocationID.x], _workgroup_mem_0._m0[_111]) || _workgroup_mem_0._m0[gl_LocalInvocationID.x] > _workgroup_mem_0._m0[_111]) ? _workgroup_mem_0._m0[gl_LocalInvocationID.x] : _workgroup_mem_0._m0[_111]);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (gl_LocalInvocationID.x < 8u)
    {
        uint _127 = gl_LocalInvocationID.x + 8u;
        _workgroup_mem_0._m0[gl_LocalInvocationID.x] = (isnan(_workgroup_mem_0._m0[_127]) || isnan(_workgroup_mem_0._m0[_127])) ? _workgroup_mem_0._m0[_127] : ((isunordered(_workgroup_mem_0._m0[gl_LocalInvocationID.x], _workgroup_mem_0._m0[_127]) || _workgroup_mem_0._m0[gl_LocalInvocationID.x] > _workgroup_mem_0._m0[_127]) ? _workgroup_mem_0._m0[gl_LocalInvocationID.x] : _workgroup_mem_0._m0[_127]);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (gl_LocalInvocationID.x < 4u)
    {
        uint _143 = gl_LocalInvocationID.x + 4u;
        _workgroup_mem_0._m0[gl_LocalInvocationID.x] = (isnan(_workgroup_mem_0._m0[_143]) || isnan(_workgroup_mem_0._m0[_143])) ? _workgroup_mem_0._m0[_143] : ((isunordered(_workgroup_mem_0._m0[gl_LocalInvocationID.x], _workgroup_mem_0._m0[_143]) || _workgroup_mem_0._m0[gl_LocalInvocationID.x] > _workgroup_mem_0._m0[_143]) ? _workgroup_mem_0._m0[gl_LocalInvocationID.x] : _workgroup_mem_0._m0[_143]);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (gl_LocalInvocationID.x < 2u)
    {
        uint _159 = gl_LocalInvocationID.x + 2u;
        _workgroup_mem_0._m0[gl_LocalInvocationID.x] = (isnan(_workgroup_mem_0._m0[_159]) || isnan(_workgroup_mem_0._m0[_159])) ? _workgroup_mem_0._m0[_159] : ((isunordered(_workgroup_mem_0._m0[gl_LocalInvocationID.x], _workgroup_mem_0._m0[_159]) || _workgroup_mem_0._m0[gl_LocalInvocationID.x] > _workgroup_mem_0._m0[_159]) ? _workgroup_mem_0._m0[gl_LocalInvocationID.x] : _workgroup_mem_0._m0[_159]);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (gl_LocalInvocationID.x < 1u)
    {
        uint _175 = gl_LocalInvocationID.x + 1u;
        _workgroup_mem_0._m0[gl_LocalInvocationID.x] = (isnan(_workgroup_mem_0._m0[_175]) || isnan(_workgroup_mem_0._m0[_175])) ? _workgroup_mem_0._m0[_175] : ((isunordered(_workgroup_mem_0._m0[gl_LocalInvocationID.x], _workgroup_mem_0._m0[_175]) || _workgroup_mem_0._m0[gl_LocalInvocationID.x] > _workgroup_mem_0._m0[_175]) ? _workgroup_mem_0._m0[gl_LocalInvocationID.x] : _workgroup_mem_0._m0[_175]);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float _188 = _workgroup_mem_0._m0[0u];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float _189;
    uint _193 = gl_LocalInvocationID.x;
    float _194 = 0.0;
    for (; int(_193) < int(100u); )
    {
        uint _197 = _193 + (gl_WorkGroupID.x * 100u);
        float _200 = softmax_arg_0._m0[_197] - _188;
        float _204 = false ? (-88.0) : ((isunordered(_200, (-88.0)) || _200 > (-88.0)) ? _200 : (-88.0));
        float _205 = fma(_204, 1.44269502162933349609375, 0.5);
        float _208 = float(int(uint(int(_205))));
        float _211 = _208 - float(_205 < _208);
        float _213 = fma(_211, 0.00021219444170128554105758666992188, fma(_211, -0.693359375, _204));
        float _227 = _194 + ((fma(fma(fma(fma(fma(fma(0.00019875691214110702276229858398438, _213, 0.00139819993637502193450927734375), _213, 0.008333452045917510986328125), _213, 0.0416657961905002593994140625), _213, 0.1666666567325592041015625), _213, 0.5), _213 * _213, _213) + 1.0) * as_type<float>((uint(int(_211)) + 127u) << 23u));
        _189 = _227;
        _193 += 128u;
        _194 = _227;
        continue;
    }
    _workgroup_mem_0._m0[gl_LocalInvocationID.x] = _189;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (gl_LocalInvocationID.x < 64u)
    {
        _workgroup_mem_0._m0[gl_LocalInvocationID.x] += _workgroup_mem_0._m0[gl_LocalInvocationID.x + 64u];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (gl_LocalInvocationID.x < 32u)
    {
        _workgroup_mem_0._m0[gl_LocalInvocationID.x] += _workgroup_mem_0._m0[gl_LocalInvocationID.x + 32u];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (gl_LocalInvocationID.x < 16u)
    {
        _workgroup_mem_0._m0[gl_LocalInvocationID.x] += _workgroup_mem_0._m0[gl_LocalInvocationID.x + 16u];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (gl_LocalInvocationID.x < 8u)
    {
        _workgroup_mem_0._m0[gl_LocalInvocationID.x] += _workgroup_mem_0._m0[gl_LocalInvocationID.x + 8u];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (gl_LocalInvocationID.x < 4u)
    {
        _workgroup_mem_0._m0[gl_LocalInvocationID.x] += _workgroup_mem_0._m0[gl_LocalInvocationID.x + 4u];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (gl_LocalInvocationID.x < 2u)
    {
        _workgroup_mem_0._m0[gl_LocalInvocationID.x] += _workgroup_mem_0._m0[gl_LocalInvocationID.x + 2u];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (gl_LocalInvocationID.x < 1u)
    {
        _workgroup_mem_0._m0[gl_LocalInvocationID.x] += _workgroup_mem_0._m0[gl_LocalInvocationID.x + 1u];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float _309 = _workgroup_mem_0._m0[0u];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint _313 = gl_LocalInvocationID.x; int(_313) < int(100u); )
    {
        float _319 = softmax_arg_0._m0[_313 + (gl_WorkGroupID.x * 100u)] - _188;
        float _322 = false ? (-88.0) : ((isunordered(_319, (-88.0)) || _319 > (-88.0)) ? _319 : (-88.0));
        float _323 = fma(_322, 1.44269502162933349609375, 0.5);
        float _325 = float(int(uint(int(_323))));
        float _328 = _325 - float(_323 < _325);
        float _330 = fma(_328, 0.00021219444170128554105758666992188, fma(_328, -0.693359375, _322));
        softmax_arg_1._m0[_313 + (gl_WorkGroupID.x * 100u)] = ((fma(fma(fma(fma(fma(fma(0.00019875691214110702276229858398438, _330, 0.00139819993637502193450927734375), _330, 0.008333452045917510986328125), _330, 0.0416657961905002593994140625), _330, 0.1666666567325592041015625), _330, 0.5), _330 * _330, _330) + 1.0) * as_type<float>((uint(int(_328)) + 127u) << 23u)) / _309;
        _313 += 128u;
        continue;
    }
}

