// The same kernels compiled for AVX2 + FMA + F16C (chosen at run time by
// bindings.cpp when the CPU has them). The target pragma replaces per-file
// compiler flags, which setuptools cannot express.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "cpu_ops.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define AMP_FMA(a, b, c) __builtin_fmaf((a), (b), (c))  // vec::fmadd under AVX2
#define AMP_HAVE_F16C 1
#define AMP_HAVE_STREAM 1
#define AMP_HAVE_AVX2 1
#define AMP_ISA_NAME "avx2"

namespace amp_kernels {
namespace avx2_isa {
#include "cpu_ops_impl.h"
}  // namespace avx2_isa

const OpsTable& ops_avx2() { return avx2_isa::kTable; }
}  // namespace amp_kernels
#pragma GCC pop_options

#else  // Not x86: the dispatcher never asks for this table; alias the baseline.
namespace amp_kernels {
const OpsTable& ops_avx2() { return ops_generic(); }
}  // namespace amp_kernels
#endif
