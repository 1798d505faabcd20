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
    spvUnsafeArray<float, 512> _m0;
};

struct _14
{
    float _m0[1280];
};

struct _49
{
    spvUnsafeArray<float, 16> _m0;
};

kernel void attention_causal(device _14& attention_causal_arg_0 [[buffer(0)]], device _14& attention_causal_arg_1 [[buffer(1)]], device _14& attention_causal_arg_2 [[buffer(2)]], device _14& attention_causal_arg_3 [[buffer(3)]], uint3 gl_LocalInvocationID [[thread_position_in_threadgroup]], uint3 gl_WorkGroupID [[threadgroup_position_in_grid]])
{
    threadgroup _7 _workgroup_mem_1;
    threadgroup _7 _workgroup_mem_0;
    uint _59 = gl_WorkGroupID.x * 64u;
    uint _60 = _59 + gl_LocalInvocationID.x;
    bool _62 = _60 < 40u;
    uint _64 = (_60 < 39u) ? _60 : 39u;
    _49 _51;
    for (uint _68 = 0u; int(_68) < int(16u); )
    {
        uint _71 = uint(int(gl_WorkGroupID.y) / int(2u));
        uint _81 = uint(abs(int(gl_WorkGroupID.y)));
        uint _84 = _81 % uint(abs(int(2u)));
        uint _87 = (gl_WorkGroupID.y == _81) ? _84 : (-_84);
        _51._m0[_68] = attention_causal_arg_0._m0[_68 + ((_64 * 16u) + ((((int(_87) < int(0u)) ? (_87 + 2u) : _87) * 640u) + ((((gl_WorkGroupID.y != (_71 * 2u)) && ((int(gl_WorkGroupID.y) < int(0u)) != false)) ? (_71 + 4294967295u) : _71) * 1280u)))] * 0.25;
        _68++;
        continue;
    }
    _49 _52;
    for (uint _108 = 0u; int(_108) < int(16u); )
    {
        _52._m0[_108] = 0.0;
        _108++;
        continue;
    }
    uint _112 = _59 + 64u;
    uint _114 = (_112 < 40u) ? _112 : 40u;
    uint _120;
    float _122;
    float _123;
    _120 = 0u;
    _122 = as_type<float>(0xff800000u /* -inf */);
    _123 = 0.0;
    float _115;
    float _116;
    uint _128;
    float _135;
    float _180;
    float _215;
    float _216;
    float _229;
    float _230;
    float _234;
    for (;;)
    {
        if (int(_120) < int(_114))
        {
            _128 = gl_LocalInvocationID.x;
            uint _131;
            uint _132;
            uint _133;
            bool _134;
            for (;;)
            {
                if (int(_128) < int(512u))
                {
                    _131 = _128 / 16u;
                    _132 = _128 % 16u;
                    _133 = _120 + _131;
                    _134 = _133 < 40u;
                    if (_134)
                    {
                        uint _139 = uint(int(gl_WorkGroupID.y) / int(2u));
                        uint _147 = uint(abs(int(gl_WorkGroupID.y)));
                        uint _149 = _147 % uint(abs(int(2u)));
                        uint _152 = (gl_WorkGroupID.y == _147) ? _149 : (-_149);
                        _135 = attention_causal_arg_1._m0[_132 + ((_133 * 16u) + ((((int(_152) < int(0u)) ? (_152 + 2u) : _152) * 640u) + ((((gl_WorkGroupID.y != (_139 * 2u)) && ((int(gl_WorkGroupID.y) < int(0u)) != false)) ? (_139 + 4294967295u) : _139) * 1280u)))];
                    }
                    else
                    {
                        _135 = 0.0;
                    }
                    _workgroup_mem_0._m0[_132 + (_131 * 16u)] = _135;
                    _128 += 64u;
                    continue;
                }
                else
                {
                    break;
                }
            }
            uint _176;
            uint _177;
            uint _178;
            bool _179;
            uint _173 = gl_LocalInvocationID.x;
            for (;;)
            {
                if (int(_173) < int(512u))
                {
                    _176 = _173 / 16u;
                    _177 = _173 % 16u;
                    _178 = _120 + _176;
                    _179 = _178 < 40u;
                    if (_179)
                    {
                        uint _184 = uint(int(gl_WorkGroupID.y) / int(2u));
                        uint _192 = uint(abs(int(gl_WorkGroupID.y)));
                        uint _194 = _192 % uint(abs(int(2u)));
                        uint _197 = (gl_WorkGroupID.y == _192) ? _194 : (-_194);
                        _180 = attention_causal_arg_2._m0[_177 + ((_178 * 16u) + ((((int(_197) < int(0u)) ? (_197 + 2u) : _197) * 640u) + ((((gl_WorkGroupID.y != (_184 * 2u)) && ((int(gl_WorkGroupID.y) < int(0u)) != false)) ? (_184 + 4294967295u) : _184) * 1280u)))];
                    }
                    else
                    {
                        _180 = 0.0;
                    }
                    _workgroup_mem_1._m0[_177 + (_176 * 16u)] = _180;
                    _173 += 64u;
                    continue;
                }
                else
                {
                    break;
                }
            }
            threadgroup_barrier(mem_flags::mem_threadgroup);
            uint _219;
            float _221;
            float _222;
            _219 = 0u;
            _221 = _122;
            _222 = _123;
            bool _228;
            for (;;)
            {
                if (int(_219) < int(32u))
                {
                    uint _224 = _120 + _219;
                    _228 = (_62 && (_224 < 40u)) && (_224 <= _60);
                    if (_228)
                    {
                        uint _238 = 0u;
                        float _239 = 0.0;
                        for (; int(_238) < int(16u); )
                        {
                            uint _244 = _238 + (_219 * 16u);
                            float _247 = fma(_51._m0[_238], _workgroup_mem_0._m0[_244], _239);
                            _234 = _247;
                            _238++;
                            _239 = _247;
                            continue;
                        }
                        float _255 = (isnan(_234) || isnan(_234)) ? _234 : ((isunordered(_221, _234) || _221 > _234) ? _221 : _234);
                        float _256 = _221 - _255;
                        float _259 = false ? (-88.0) : ((isunordered(_256, (-88.0)) || _256 > (-88.0)) ? _256 : (-88.0));
                        float _260 = fma(_259, 1.44269502162933349609375, 0.5);
                        float _262 = float(int(uint(int(_260))));
                        float _265 = _262 - float(_260 < _262);
                        float _267 = fma(_265, 0.00021219444170128554105758666992188, fma(_265, -0.693359375, _259));
                        float _280 = (fma(fma(fma(fma(fma(fma(0.00019875691214110702276229858398438, _267, 0.00139819993637502193450927734375), _267, 0.008333452045917510986328125), _267, 0.0416657961905002593994140625), _267, 0.1666666567325592041015625), _267, 0.5), _267 * _267, _267) + 1.0) * as_type<float>((uint(int(_265)) + 127u) << 23u);
                        float _281 = _234 - _255;
                        float _284 = false ? (-88.0) : ((isunordered(_281, (-88.0)) || _281 > (-88.0)) ? _281 : (-88.0));
                        float _285 = fma(_284, 1.44269502162933349609375, 0.5);
                        float _287 = float(int(uint(int(_285))));
                        float _290 = _287 - float(_285 < _287);
                        float _292 = fma(_290, 0.00021219444170128554105758666992188, fma(_290, -0.693359375, _284));
                        float _305 = (fma(fma(fma(fma(fma(fma(0.00019875691214110702276229858398438, _292, 0.00139819993637502193450927734375), _292, 0.008333452045917510986328125), _292, 0.0416657961905002593994140625), _292, 0.1666666567325592041015625), _292, 0.5), _292 * _292, _292) + 1.0) * as_type<float>((uint(int(_290)) + 127u) << 23u);
                        for (uint _309 = 0u; int(_309) < int(16u); )
                        {
                            _52._m0[_309] = fma(_305, _workgroup_mem_1._m0[_309 + (_219 * 16u)], _52._m0[_309] * _280);
                            _309++;
                            continue;
                        }
                        _229 = _255;
                        _230 = fma(_222, _280, _305);
                    }
                    else
                    {
                        _229 = _221;
                        _230 = _222;
                    }
                    _215 = _229;
                    _216 = _230;
                    _219++;
                    _221 = _229;
                    _222 = _230;
                    continue;
                }
                else
                {
                    break;
                }
            }
            float _325 = _216;
            float _326 = _215;
            threadgroup_barrier(mem_flags::mem_threadgroup);
            _115 = _326;
            _116 = _325;
            _120 += 32u;
            _122 = _326;
            _123 = _325;
            continue;
        }
        else
        {
            break;
        }
    }
    if (_62)
    {
        float _335 = (_116 > 0.0) ? (1.0 / _116) : 0.0;
        for (uint _339 = 0u; int(_339) < int(16u); )
        {
            uint _344 = uint(int(gl_WorkGroupID.y) / int(2u));
            uint _352 = uint(abs(int(gl_WorkGroupID.y)));
            uint _354 = _352 % uint(abs(int(2u)));
            uint _357 = (gl_WorkGroupID.y == _352) ? _354 : (-_354);
            attention_causal_arg_3._m0[_339 + ((_60 * 16u) + ((((int(_357) < int(0u)) ? (_357 + 2u) : _357) * 640u) + ((((gl_WorkGroupID.y != (_344 * 2u)) && ((int(gl_WorkGroupID.y) < int(0u)) != false)) ? (_344 + 4294967295u) : _344) * 1280u)))] = _52._m0[_339] * _335;
            _339++;
            continue;
        }
    }
}

