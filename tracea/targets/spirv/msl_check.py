"""A syntax and type check of the Metal Shading Language Tracea writes, where no Metal compiler
exists (everywhere but macOS).

MSL is C++14 with address spaces (`device`, `threadgroup`, `thread`, `constant`) on pointers,
references and member functions. Clang's "C++ for OpenCL" mode has the same construct with
OpenCL's names (`__global`, `__local`, `__private`, `__constant`), so the MSL is parsed by
libclang (PyPI `libclang`) in that mode against METAL_SHIM below: the address spaces as macros,
the vector types, and declarations of the Metal library functions Tracea's kernels call; a
floating literal is a float, as in MSL (which has no double). Clang's
front end then reports what the Metal compiler would at the same stage: syntax errors, undeclared
names, type mismatches (a vector where a scalar goes), and a threadgroup pointer assigned to a
device one. It does not check Metal's own limits (threadgroup memory, the GPU family's types) or
generate code. A Metal library function the shim lacks is reported as an undeclared identifier:
declare it here."""
from __future__ import annotations

from ...errors import CompileError

METAL_SHIM = r"""
#define device __global
#define threadgroup __local
#define thread __private
#define constant __constant
typedef __SIZE_TYPE__ size_t;
typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned char uchar;
typedef unsigned long ulong;
#define TRACEA_VECTORS(T) typedef T T##2 __attribute__((ext_vector_type(2))); \
    typedef T T##3 __attribute__((ext_vector_type(3))); typedef T T##4 __attribute__((ext_vector_type(4)));
TRACEA_VECTORS(float) TRACEA_VECTORS(half) TRACEA_VECTORS(int) TRACEA_VECTORS(uint)
TRACEA_VECTORS(short) TRACEA_VECTORS(ushort) TRACEA_VECTORS(char) TRACEA_VECTORS(uchar) TRACEA_VECTORS(ulong)
namespace metal {
enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
void threadgroup_barrier(mem_flags flags);
template <typename T, typename U> T as_type(U value);
template <typename T> bool isnan(T x);
template <typename T> bool isinf(T x);
template <typename T> bool isunordered(T x, T y);
template <typename T> T fma(T a, T b, T c);
template <typename T> T abs(T x);
template <typename T> T min(T x, T y);
template <typename T> T max(T x, T y);
template <typename T> T fmin(T x, T y);
template <typename T> T fmax(T x, T y);
template <typename T> T exp(T x);
template <typename T> T exp2(T x);
template <typename T> T log(T x);
template <typename T> T sqrt(T x);
template <typename T> T rsqrt(T x);
template <typename T> T tanh(T x);
template <typename T> T erf(T x);
template <typename T> T select(T a, T b, bool c);
}
"""

# <metal_simdgroup_matrix>: an opaque 8 x 8 matrix per simdgroup, loaded from device or
# threadgroup memory (elements_per_row apart, optionally transposed), multiplied and accumulated
# with mixed element types (half products into float, as Apple GPUs do)
SIMDGROUP_SHIM = r"""
namespace metal {
template <typename T, int Cols, int Rows> struct simdgroup_matrix { typedef T storage_type __attribute__((ext_vector_type(2))); storage_type elements; };
typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;
typedef simdgroup_matrix<half, 8, 8> simdgroup_half8x8;
template <typename T, int C, int R> void simdgroup_load(thread simdgroup_matrix<T, C, R> &d, const device T *src,
    ulong elements_per_row = C, ulong2 matrix_origin = 0, bool transpose_matrix = false);
template <typename T, int C, int R> void simdgroup_load(thread simdgroup_matrix<T, C, R> &d, const threadgroup T *src,
    ulong elements_per_row = C, ulong2 matrix_origin = 0, bool transpose_matrix = false);
template <typename T, int C, int R> void simdgroup_store(simdgroup_matrix<T, C, R> a, device T *dst,
    ulong elements_per_row = C, ulong2 matrix_origin = 0, bool transpose_matrix = false);
template <typename T, typename U, typename V, int C, int R, int K> void simdgroup_multiply_accumulate(
    thread simdgroup_matrix<T, C, R> &d, simdgroup_matrix<U, K, R> a, simdgroup_matrix<V, C, K> b,
    simdgroup_matrix<T, C, R> c);
}
"""

_ARGS = ["-x", "cl", "-cl-std=clc++2021", "-cl-no-stdinc", "-cl-single-precision-constant", "-fsyntax-only",
         "-Wno-unknown-attributes", "-I/tracea-metal-shim"]


def msl_errors(msl: str, name: str = "kernel.metal") -> list[str]:
    """Clang's errors for `msl` (an empty list: it parses and type-checks), each as
    "line:column: message"."""
    try:
        import clang.cindex as cindex
    except ImportError:
        raise CompileError("checking MSL needs libclang (pip install libclang==18.1.1)") from None
    shim = [("/tracea-metal-shim/metal_stdlib", METAL_SHIM), ("/tracea-metal-shim/simd/simd.h", ""),
            ("/tracea-metal-shim/metal_simdgroup_matrix", SIMDGROUP_SHIM)]
    unit = cindex.Index.create().parse(name, args=_ARGS, unsaved_files=[(name, msl), *shim])
    return [f"{d.location.line}:{d.location.column}: {d.spelling}" for d in unit.diagnostics
            if d.severity >= cindex.Diagnostic.Error]
