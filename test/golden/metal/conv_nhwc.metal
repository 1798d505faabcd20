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
    spvUnsafeArray<float, 1024> _m0;
};

struct _14
{
    float _m0[192];
};

struct _19
{
    float _m0[135];
};

struct _24
{
    float _m0[320];
};

kernel void conv_nhwc(device _14& conv_nhwc_arg_0 [[buffer(0)]], device _19& conv_nhwc_arg_1 [[buffer(1)]], device _24& conv_nhwc_arg_2 [[buffer(2)]], uint3 gl_WorkGroupID [[threadgroup_position_in_grid]], uint3 gl_LocalInvocationID [[thread_position_in_threadgroup]])
{
    threadgroup _7 _workgroup_mem_1;
    threadgroup _7 _workgroup_mem_0;
    uint _54 = (gl_LocalInvocationID.y * 16u) + gl_LocalInvocationID.x;
    uint _55 = gl_WorkGroupID.y * 64u;
    uint _56 = gl_WorkGroupID.x * 64u;
    uint _77;
    float _79;
    float _80;
    float _81;
    float _82;
    float _83;
    float _84;
    float _85;
    float _86;
    float _87;
    float _88;
    float _89;
    float _90;
    float _91;
    float _92;
    float _93;
    float _94;
    _77 = 0u;
    _79 = 0.0;
    _80 = 0.0;
    _81 = 0.0;
    _82 = 0.0;
    _83 = 0.0;
    _84 = 0.0;
    _85 = 0.0;
    _86 = 0.0;
    _87 = 0.0;
    _88 = 0.0;
    _89 = 0.0;
    _90 = 0.0;
    _91 = 0.0;
    _92 = 0.0;
    _93 = 0.0;
    _94 = 0.0;
    float _58;
    float _59;
    float _60;
    float _61;
    float _62;
    float _63;
    float _64;
    float _65;
    float _66;
    float _67;
    float _68;
    float _69;
    float _70;
    float _71;
    float _72;
    float _73;
    uint _100;
    float _126;
    float _159;
    float _209;
    float _210;
    float _211;
    float _212;
    float _213;
    float _214;
    float _215;
    float _216;
    float _217;
    float _218;
    float _219;
    float _220;
    float _221;
    float _222;
    float _223;
    float _224;
    for (;;)
    {
        if (int(_77) < int(27u))
        {
            _100 = _54;
            uint _103;
            uint _104;
            uint _107;
            uint _114;
            uint _116;
            uint _118;
            bool _125;
            for (;;)
            {
                if (int(_100) < int(1024u))
                {
                    _103 = _100 / 16u;
                    _104 = _100 % 16u;
                    uint _105 = _55 + _103;
                    uint _106 = _77 + _104;
                    _107 = _105 / 64u;
                    uint _108 = _105 % 64u;
                    uint _112 = _106 % 9u;
                    _114 = _112 % 3u;
                    _116 = ((_108 / 8u) + (_106 / 9u)) - 1u;
                    _118 = ((_108 % 8u) + (_112 / 3u)) - 1u;
                    _125 = (((_105 < 64u) && (_106 < 27u)) && (_116 < 8u)) && (_118 < 8u);
                    if (_125)
                    {
                        _126 = conv_nhwc_arg_0._m0[_114 + ((_118 * 3u) + ((_116 * 24u) + (_107 * 192u)))];
                    }
                    else
                    {
                        _126 = 0.0;
                    }
                    _workgroup_mem_0._m0[_103 + (_104 * 64u)] = _126;
                    _100 += 256u;
                    continue;
                }
                else
                {
                    break;
                }
            }
            uint _152;
            uint _153;
            uint _154;
            uint _155;
            bool _158;
            uint _149 = _54;
            for (;;)
            {
                if (int(_149) < int(1024u))
                {
                    _152 = _149 / 64u;
                    _153 = _149 % 64u;
                    _154 = _77 + _152;
                    _155 = _56 + _153;
                    _158 = (_154 < 27u) && (_155 < 5u);
                    if (_158)
                    {
                        uint _163 = uint(int(_154) / int(9u));
                        uint _173 = uint(abs(int(_154)));
                        uint _176 = _173 % uint(abs(int(9u)));
                        uint _179 = (_154 == _173) ? _176 : (-_176);
                        uint _184 = uint(abs(int(_154)));
                        uint _186 = _184 % uint(abs(int(3u)));
                        uint _189 = (_154 == _184) ? _186 : (-_186);
                        _159 = conv_nhwc_arg_1._m0[_155 + ((((int(_189) < int(0u)) ? (_189 + 3u) : _189) * 5u) + ((uint(int((int(_179) < int(0u)) ? (_179 + 9u) : _179) / int(3u)) * 15u) + ((((_154 != (_163 * 9u)) && ((int(_154) < int(0u)) != false)) ? (_163 + 4294967295u) : _163) * 45u)))];
                    }
                    else
                    {
                        _159 = 0.0;
                    }
                    _workgroup_mem_1._m0[_153 + (_152 * 64u)] = _159;
                    _149 += 256u;
                    continue;
                }
                else
                {
                    break;
                }
            }
            threadgroup_barrier(mem_flags::mem_threadgroup);
            uint _227 = 0u;
            float _228 = _79;
            float _229 = _80;
            float _230 = _81;
            float _231 = _82;
            float _232 = _83;
            float _233 = _84;
            float _234 = _85;
            float _235 = _86;
            float _236 = _87;
            float _237 = _88;
            float _238 = _89;
            float _239 = _90;
            float _240 = _91;
            float _241 = _92;
            float _242 = _93;
            float _243 = _94;
            for (; int(_227) < int(16u); )
            {
                uint _246 = _227 * 64u;
                uint _247 = (gl_LocalInvocationID.y * 4u) + _246;
                uint _252 = _227 * 64u;
                uint _253 = ((gl_LocalInvocationID.y * 4u) + 1u) + _252;
                uint _258 = _227 * 64u;
                uint _259 = ((gl_LocalInvocationID.y * 4u) + 2u) + _258;
                uint _264 = _227 * 64u;
                uint _265 = ((gl_LocalInvocationID.y * 4u) + 3u) + _264;
                uint _269 = _227 * 64u;
                uint _270 = (gl_LocalInvocationID.x * 4u) + _269;
                uint _275 = _227 * 64u;
                uint _276 = ((gl_LocalInvocationID.x * 4u) + 1u) + _275;
                uint _281 = _227 * 64u;
                uint _282 = ((gl_LocalInvocationID.x * 4u) + 2u) + _281;
                uint _287 = _227 * 64u;
                uint _288 = ((gl_LocalInvocationID.x * 4u) + 3u) + _287;
                float _291 = fma(_workgroup_mem_0._m0[_247], _workgroup_mem_1._m0[_270], _228);
                float _292 = fma(_workgroup_mem_0._m0[_247], _workgroup_mem_1._m0[_276], _229);
                float _293 = fma(_workgroup_mem_0._m0[_247], _workgroup_mem_1._m0[_282], _230);
                float _294 = fma(_workgroup_mem_0._m0[_247], _workgroup_mem_1._m0[_288], _231);
                float _295 = fma(_workgroup_mem_0._m0[_253], _workgroup_mem_1._m0[_270], _232);
                float _296 = fma(_workgroup_mem_0._m0[_253], _workgroup_mem_1._m0[_276], _233);
                float _297 = fma(_workgroup_mem_0._m0[_253], _workgroup_mem_1._m0[_282], _234);
                float _298 = fma(_workgroup_mem_0._m0[_253], _workgroup_mem_1._m0[_288], _235);
                float _299 = fma(_workgroup_mem_0._m0[_259], _workgroup_mem_1._m0[_270], _236);
                float _300 = fma(_workgroup_mem_0._m0[_259], _workgroup_mem_1._m0[_276], _237);
                float _301 = fma(_workgroup_mem_0._m0[_259], _workgroup_mem_1._m0[_282], _238);
                float _302 = fma(_workgroup_mem_0._m0[_259], _workgroup_mem_1._m0[_288], _239);
                float _303 = fma(_workgroup_mem_0._m0[_265], _workgroup_mem_1._m0[_270], _240);
                float _304 = fma(_workgroup_mem_0._m0[_265], _workgroup_mem_1._m0[_276], _241);
                float _305 = fma(_workgroup_mem_0._m0[_265], _workgroup_mem_1._m0[_282], _242);
                float _306 = fma(_workgroup_mem_0._m0[_265], _workgroup_mem_1._m0[_288], _243);
                _209 = _291;
                _210 = _292;
                _211 = _293;
                _212 = _294;
                _213 = _295;
                _214 = _296;
                _215 = _297;
                _216 = _298;
                _217 = _299;
                _218 = _300;
                _219 = _301;
                _220 = _302;
                _221 = _303;
                _222 = _304;
                _223 = _305;
                _224 = _306;
                _227++;
                _228 = _291;
                _229 = _292;
                _230 = _293;
                _231 = _294;
                _232 = _295;
                _233 = _296;
                _234 = _297;
                _235 = _298;
                _236 = _299;
                _237 = _300;
                _238 = _301;
                _239 = _302;
                _240 = _303;
                _241 = _304;
                _242 = _305;
                _243 = _306;
                continue;
            }
            float _308 = _224;
            float _309 = _223;
            float _310 = _222;
            float _311 = _221;
            float _312 = _220;
            float _313 = _219;
            float _314 = _218;
            float _315 = _217;
            float _316 = _216;
            float _317 = _215;
            float _318 = _214;
            float _319 = _213;
            float _320 = _212;
            float _321 = _211;
            float _322 = _210;
            float _323 = _209;
            threadgroup_barrier(mem_flags::mem_threadgroup);
            _58 = _323;
            _59 = _322;
            _60 = _321;
            _61 = _320;
            _62 = _319;
            _63 = _318;
            _64 = _317;
            _65 = _316;
            _66 = _315;
            _67 = _314;
            _68 = _313;
            _69 = _312;
            _70 = _311;
            _71 = _310;
            _72 = _309;
            _73 = _308;
            _77 += 16u;
            _79 = _323;
            _80 = _322;
            _81 = _321;
            _82 = _320;
            _83 = _319;
            _84 = _318;
            _85 = _317;
            _86 = _316;
            _87 = _315;
            _88 = _314;
            _89 = _313;
            _90 = _312;
            _91 = _311;
            _92 = _310;
            _93 = _309;
            _94 = _308;
            continue;
        }
        else
        {
            break;
        }
    }
    uint _342 = _55 + (gl_LocalInvocationID.y * 4u);
    uint _344 = _56 + (gl_LocalInvocationID.x * 4u);
    if ((_342 < 64u) && (_344 < 5u))
    {
        uint _351 = uint(int(_342) / int(64u));
        uint _359 = uint(abs(int(_342)));
        uint _361 = _359 % uint(abs(int(64u)));
        uint _364 = (_342 == _359) ? _361 : (-_361);
        uint _369 = uint(abs(int(_342)));
        uint _371 = _369 % uint(abs(int(8u)));
        uint _374 = (_342 == _369) ? _371 : (-_371);
        conv_nhwc_arg_2._m0[_344 + ((((int(_374) < int(0u)) ? (_374 + 8u) : _374) * 5u) + ((uint(int((int(_364) < int(0u)) ? (_364 + 64u) : _364) / int(8u)) * 40u) + ((((_342 != (_351 * 64u)) && ((int(_342) < int(0u)) != false)) ? (_351 + 4294967295u) : _351) * 320u)))] = _58;
    }
    uint _387 = _55 + (gl_LocalInvocationID.y * 4u);
    uint _390 = _56 + ((gl_LocalInvocationID.x * 4u) + 1u);
    if ((_387 < 64u) && (_390 < 5u))
    {
        uint _397 = uint(int(_387) / int(64u));
        uint _405 = uint(abs(int(_387)));
        uint _407 = _405 % uint(abs(int(64u)));
        uint _410 = (_387 == _405) ? _407 : (-_407);
        uint _415 = uint(abs(int(_387)));
        uint _417 = _415 % uint(abs(int(8u)));
        uint _420 = (_387 == _415) ? _417 : (-_417);
        conv_nhwc_arg_2._m0[_390 + ((((int(_420) < int(0u)) ? (_420 + 8u) : _420) * 5u) + ((uint(int((int(_410) < int(0u)) ? (_410 + 64u) : _410) / int(8u)) * 40u) + ((((_387 != (_397 * 64u)) && ((int(_387) < int(0u)) != false)) ? (_397 + 4294967295u) : _397) * 320u)))] = _59;
    }
    uint _432 = _55 + (gl_LocalInvocationID.y * 4u);
    uint _435 = _56 + ((gl_LocalInvocationID.x * 4u) + 2u);
    if ((_432 < 64u) && (_435 < 5u))
    {
        uint _442 = uint(int(_432) / int(64u));
        uint _450 = uint(abs(int(_432)));
        uint _452 = _450 % uint(abs(int(64u)));
        uint _455 = (_432 == _450) ? _452 : (-_452);
        uint _460 = uint(abs(int(_432)));
        uint _462 = _460 % uint(abs(int(8u)));
        uint _465 = (_432 == _460) ? _462 : (-_462);
        conv_nhwc_arg_2._m0[_435 + ((((int(_465) < int(0u)) ? (_465 + 8u) : _465) * 5u) + ((uint(int((int(_455) < int(0u)) ? (_455 + 64u) : _455) / int(8u)) * 40u) + ((((_432 != (_442 * 64u)) && ((int(_432) < int(0u)) != false)) ? (_442 + 4294967295u) : _442) * 320u)))] = _60;
    }
    uint _477 = _55 + (gl_LocalInvocationID.y * 4u);
    uint _480 = _56 + ((gl_LocalInvocationID.x * 4u) + 3u);
    if ((_477 < 64u) && (_480 < 5u))
    {
        uint _487 = uint(int(_477) / int(64u));
        uint _495 = uint(abs(int(_477)));
        uint _497 = _495 % uint(abs(int(64u)));
        uint _500 = (_477 == _495) ? _497 : (-_497);
        uint _505 = uint(abs(int(_477)));
        uint _507 = _505 % uint(abs(int(8u)));
        uint _510 = (_477 == _505) ? _507 : (-_507);
        conv_nhwc_arg_2._m0[_480 + ((((int(_510) < int(0u)) ? (_510 + 8u) : _510) * 5u) + ((uint(int((int(_500) < int(0u)) ? (_500 + 64u) : _500) / int(8u)) * 40u) + ((((_477 != (_487 * 64u)) && ((int(_477) < int(0u)) != false)) ? (_487 + 4294967295u) : _487) * 320u)))] = _61;
    }
    uint _523 = _55 + ((gl_LocalInvocationID.y * 4u) + 1u);
    uint _525 = _56 + (gl_LocalInvocationID.x * 4u);
    if ((_523 < 64u) && (_525 < 5u))
    {
        uint _532 = uint(int(_523) / int(64u));
        uint _540 = uint(abs(int(_523)));
        uint _542 = _540 % uint(abs(int(64u)));
        uint _545 = (_523 == _540) ? _542 : (-_542);
        uint _550 = uint(abs(int(_523)));
        uint _552 = _550 % uint(abs(int(8u)));
        uint _555 = (_523 == _550) ? _552 : (-_552);
        conv_nhwc_arg_2._m0[_525 + ((((int(_555) < int(0u)) ? (_555 + 8u) : _555) * 5u) + ((uint(int((int(_545) < int(0u)) ? (_545 + 64u) : _545) / int(8u)) * 40u) + ((((_523 != (_532 * 64u)) && ((int(_523) < int(0u)) != false)) ? (_532 + 4294967295u) : _532) * 320u)))] = _62;
    }
    uint _568 = _55 + ((gl_LocalInvocationID.y * 4u) + 1u);
    uint _571 = _56 + ((gl_LocalInvocationID.x * 4u) + 1u);
    if ((_568 < 64u) && (_571 < 5u))
    {
        uint _578 = uint(int(_568) / int(64u));
        uint _586 = uint(abs(int(_568)));
        uint _588 = _586 % uint(abs(int(64u)));
        uint _591 = (_568 == _586) ? _588 : (-_588);
        uint _596 = uint(abs(int(_568)));
        uint _598 = _596 % uint(abs(int(8u)));
        uint _601 = (_568 == _596) ? _598 : (-_598);
        conv_nhwc_arg_2._m0[_571 + ((((int(_601) < int(0u)) ? (_601 + 8u) : _601) * 5u) + ((uint(int((int(_591) < int(0u)) ? (_591 + 64u) : _591) / int(8u)) * 40u) + ((((_568 != (_578 * 64u)) && ((int(_568) < int(0u)) != false)) ? (_578 + 4294967295u) : _578) * 320u)))] = _63;
    }
    uint _614 = _55 + ((gl_LocalInvocationID.y * 4u) + 1u);
    uint _617 = _56 + ((gl_LocalInvocationID.x * 4u) + 2u);
    if ((_614 < 64u) && (_617 < 5u))
    {
        uint _624 = uint(int(_614) / int(64u));
        uint _632 = uint(abs(int(_614)));
        uint _634 = _632 % uint(abs(int(64u)));
        uint _637 = (_614 == _632) ? _634 : (-_634);
        uint _642 = uint(abs(int(_614)));
        uint _644 = _642 % uint(abs(int(8u)));
        uint _647 = (_614 == _642) ? _644 : (-_644);
        conv_nhwc_arg_2._m0[_617 + ((((int(_647) < int(0u)) ? (_647 + 8u) : _647) * 5u) + ((uint(int((int(_637) < int(0u)) ? (_637 + 64u) : _637) / int(8u)) * 40u) + ((((_614 != (_624 * 64u)) && ((int(_614) < int(0u)) != false)) ? (_624 + 4294967295u) : _624) * 320u)))] = _64;
    }
    uint _660 = _55 + ((gl_LocalInvocationID.y * 4u) + 1u);
    uint _663 = _56 + ((gl_LocalInvocationID.x * 4u) + 3u);
    if ((_660 < 64u) && (_663 < 5u))
    {
        uint _670 = uint(int(_660) / int(64u));
        uint _678 = uint(abs(int(_660)));
        uint _680 = _678 % uint(abs(int(64u)));
        uint _683 = (_660 == _678) ? _680 : (-_680);
        uint _688 = uint(abs(int(_660)));
        uint _690 = _688 % uint(abs(int(8u)));
        uint _693 = (_660 == _688) ? _690 : (-_690);
        conv_nhwc_arg_2._m0[_663 + ((((int(_693) < int(0u)) ? (_693 + 8u) : _693) * 5u) + ((uint(int((int(_683) < int(0u)) ? (_683 + 64u) : _683) / int(8u)) * 40u) + ((((_660 != (_670 * 64u)) && ((int(_660) < int(0u)) != false)) ? (_670 + 4294967295u) : _670) * 320u)))] = _65;
    }
    uint _706 = _55 + ((gl_LocalInvocationID.y * 4u) + 2u);
    uint _708 = _56 + (gl_LocalInvocationID.x * 4u);
    if ((_706 < 64u) && (_708 < 5u))
    {
        uint _715 = uint(int(_706) / int(64u));
        uint _723 = uint(abs(int(_706)));
        uint _725 = _723 % uint(abs(int(64u)));
        uint _728 = (_706 == _723) ? _725 : (-_725);
        uint _733 = uint(abs(int(_706)));
        uint _735 = _733 % uint(abs(int(8u)));
        uint _738 = (_706 == _733) ? _735 : (-_735);
        conv_nhwc_arg_2._m0[_708 + ((((int(_738) < int(0u)) ? (_738 + 8u) : _738) * 5u) + ((uint(int((int(_728) < int(0u)) ? (_728 + 64u) : _728) / int(8u)) * 40u) + ((((_706 != (_715 * 64u)) && ((int(_706) < int(0u)) != false)) ? (_715 + 4294967295u) : _715) * 320u)))] = _66;
    }
    uint _751 = _55 + ((gl_LocalInvocationID.y * 4u) + 2u);
    uint _754 = _56 + ((gl_LocalInvocationID.x * 4u) + 1u);
    if ((_751 < 64u) && (_754 < 5u))
    {
        uint _761 = uint(int(_751) / int(64u));
        uint _769 = uint(abs(int(_751)));
        uint _771 = _769 % uint(abs(int(64u)));
        uint _774 = (_751 == _769) ? _771 : (-_771);
        uint _779 = uint(abs(int(_751)));
        uint _781 = _779 % uint(abs(int(8u)));
        uint _784 = (_751 == _779) ? _781 : (-_781);
        conv_nhwc_arg_2._m0[_754 + ((((int(_784) < int(0u)) ? (_784 + 8u) : _784) * 5u) + ((uint(int((int(_774) < int(0u)) ? (_774 + 64u) : _774) / int(8u)) * 40u) + ((((_751 != (_761 * 64u)) && ((int(_751) < int(0u)) != false)) ? (_761 + 4294967295u) : _761) * 320u)))] = _67;
    }
    uint _797 = _55 + ((gl_LocalInvocationID.y * 4u) + 2u);
    uint _800 = _56 + ((gl_LocalInvocationID.x * 4u) + 2u);
    if ((_797 < 64u) && (_800 < 5u))
    {
        uint _807 = uint(int(_797) / int(64u));
        uint _815 = uint(abs(int(_797)));
        uint _817 = _815 % uint(abs(int(64u)));
        uint _820 = (_797 == _815) ? _817 : (-_817);
        uint _825 = uint(abs(int(_797)));
        uint _827 = _825 % uint(abs(int(8u)));
        uint _830 = (_797 == _825) ? _827 : (-_827);
        conv_nhwc_arg_2._m0[_800 + ((((int(_830) < int(0u)) ? (_830 + 8u) : _830) * 5u) + ((uint(int((int(_820) < int(0u)) ? (_820 + 64u) : _820) / int(8u)) * 40u) + ((((_797 != (_807 * 64u)) && ((int(_797) < int(0u)) != false)) ? (_807 + 4294967295u) : _807) * 320u)))] = _68;
    }
    uint _843 = _55 + ((gl_LocalInvocationID.y * 4u) + 2u);
    uint _846 = _56 + ((gl_LocalInvocationID.x * 4u) + 3u);
    if ((_843 < 64u) && (_846 < 5u))
    {
        uint _853 = uint(int(_843) / int(64u));
        uint _861 = uint(abs(int(_843)));
        uint _863 = _861 % uint(abs(int(64u)));
        uint _866 = (_843 == _861) ? _863 : (-_863);
        uint _871 = uint(abs(int(_843)));
        uint _873 = _871 % uint(abs(int(8u)));
        uint _876 = (_843 == _871) ? _873 : (-_873);
        conv_nhwc_arg_2._m0[_846 + ((((int(_876) < int(0u)) ? (_876 + 8u) : _876) * 5u) + ((uint(int((int(_866) < int(0u)) ? (_866 + 64u) : _866) / int(8u)) * 40u) + ((((_843 != (_853 * 64u)) && ((int(_843) < int(0u)) != false)) ? (_853 + 4294967295u) : _853) * 320u)))] = _69;
    }
    uint _889 = _55 + ((gl_LocalInvocationID.y * 4u) + 3u);
    uint _891 = _56 + (gl_LocalInvocationID.x * 4u);
    if ((_889 < 64u) && (_891 < 5u))
    {
        uint _898 = uint(int(_889) / int(64u));
        uint _906 = uint(abs(int(_889)));
        uint _908 = _906 % uint(abs(int(64u)));
        uint _911 = (_889 == _906) ? _908 : (-_908);
        uint _916 = uint(abs(int(_889)));
        uint _918 = _916 % uint(abs(int(8u)));
        uint _921 = (_889 == _916) ? _918 : (-_918);
        conv_nhwc_arg_2._m0[_891 + ((((int(_921) < int(0u)) ? (_921 + 8u) : _921) * 5u) + ((uint(int((int(_911) < int(0u)) ? (_911 + 64u) : _911) / int(8u)) * 40u) + ((((_889 != (_898 * 64u)) && ((int(_889) < int(0u)) != false)) ? (_898 + 4294967295u) : _898) * 320u)))] = _70;
    }
    uint _934 = _55 + ((gl_LocalInvocationID.y * 4u) + 3u);
    uint _937 = _56 + ((gl_LocalInvocationID.x * 4u) + 1u);
    if ((_934 < 64u) && (_937 < 5u))
    {
        uint _944 = uint(int(_934) / int(64u));
        uint _952 = uint(abs(int(_934)));
        uint _954 = _952 % uint(abs(int(64u)));
        uint _957 = (_934 == _952) ? _954 : (-_954);
        uint _962 = uint(abs(int(_934)));
        uint _964 = _962 % uint(abs(int(8u)));
        uint _967 = (_934 == _962) ? _964 : (-_964);
        conv_nhwc_arg_2._m0[_937 + ((((int(_967) < int(0u)) ? (_967 + 8u) : _967) * 5u) + ((uint(int((int(_957) < int(0u)) ? (_957 + 64u) : _957) / int(8u)) * 40u) + ((((_934 != (_944 * 64u)) && ((int(_934) < int(0u)) != false)) ? (_944 + 4294967295u) : _944) * 320u)))] = _71;
    }
    uint _980 = _55 + ((gl_LocalInvocationID.y * 4u) + 3u);
    uint _983 = _56 + ((gl_LocalInvocationID.x * 4u) + 2u);
    if ((_980 < 64u) && (_983 < 5u))
    {
        uint _990 = uint(int(_980) / int(64u));
        uint _998 = uint(abs(int(_980)));
        uint _1000 = _998 % uint(abs(int(64u)));
        uint _1003 = (_980 == _998) ? _1000 : (-_1000);
        uint _1008 = uint(abs(int(_980)));
        uint _1010 = _1008 % uint(abs(int(8u)));
        uint _1013 = (_980 == _1008) ? _1010 : (-_1010);
        conv_nhwc_arg_2._m0[_983 + ((((int(_1013) < int(0u)) ? (_1013 + 8u) : _1013) * 5u) + ((uint(int((int(_1003) < int(0u)) ? (_1003 + 64u) : _1003) / int(8u)) * 40u) + ((((_980 != (_990 * 64u)) && ((int(_980) < int(0u)) != false)) ? (_990 + 4294967295u) : _990) * 320u)))] = _72;
    }
    uint _1026 = _55 + ((gl_LocalInvocationID.y * 4u) + 3u);
    uint _1029 = _56 + ((gl_LocalInvocationID.x * 4u) + 3u);
    if ((_1026 < 64u) && (_1029 < 5u))
    {
        uint _1036 = uint(int(_1026) / int(64u));
        uint _1044 = uint(abs(int(_1026)));
        uint _1046 = _1044 % uint(abs(int(64u)));
        uint _1049 = (_1026 == _1044) ? _1046 : (-_1046);
        uint _1054 = uint(abs(int(_1026)));
        uint _1056 = _1054 % uint(abs(int(8u)));
        uint _1059 = (_1026 == _1054) ? _1056 : (-_1056);
        conv_nhwc_arg_2._m0[_1029 + ((((int(_1059) < int(0u)) ? (_1059 + 8u) : _1059) * 5u) + ((uint(int((int(_1049) < int(0u)) ? (_1049 + 64u) : _1049) / int(8u)) * 40u) + ((((_1026 != (_1036 * 64u)) && ((int(_1026) < int(0u)) != false)) ? (_1036 + 4294967295u) : _1036) * 320u)))] = _73;
    }
}

