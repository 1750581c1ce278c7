// The same kernels compiled for AVX-512 (F, BW, VL, DQ, with FMA and F16C), chosen at run
// time by driver.h's set_isa when the CPU and the OS support them (__builtin_cpu_supports
// checks the XCR0 state bits too, so a hypervisor that hides the ZMM state hides the ISA).
// The target pragma is this translation unit's own compiler flags (setuptools cannot give
// one source file its own flags); nothing else in the module is built for AVX-512, so the
// wheel still loads on any x86-64 CPU.
//
// Results are bitwise those of the AVX2 build: both fuse exactly the multiply-adds that
// AMP_FMA names (-ffp-contract=off keeps the compiler from fusing others), sqrt and divide
// are correctly rounded at any width, and the sum-of-squares accumulators are explicit
// 8-lane vectors (cpu_ops_impl.h) whatever the register width. The one exception is a
// float `omp simd reduction` (LAMB stage 1's per-block partial norms): its lane count is
// the vector width, so its rounding differs between ISAs exactly as generic and AVX2 differ
// today (tests compare LAMB with a tolerance for that reason).
//
// bf16 narrowing stays the integer round-to-nearest-even of cpu_ops_impl.h (vectorised
// 16 lanes wide here) rather than AVX512_BF16's VCVTNEPS2BF16: that instruction flushes
// denormal inputs to zero, where c10::BFloat16 (and so torch and the other builds) keeps
// them, so it would change results.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "cpu_ops.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,prefer-vector-width=512")
#define AMP_FMA(a, b, c) __builtin_fmaf((a), (b), (c))  // as the AVX2 build
#define AMP_HAVE_F16C 1
#define AMP_HAVE_STREAM 1
#define AMP_HAVE_AVX2 1
#define AMP_ISA_NAME "avx512"

namespace amp_kernels {
namespace avx512_isa {
#include "cpu_ops_impl.h"
}  // namespace avx512_isa

const OpsTable& ops_avx512() { return avx512_isa::kTable; }
}  // namespace amp_kernels
#pragma GCC pop_options

#else  // Not x86: the dispatcher never asks for this table; alias the baseline.
namespace amp_kernels {
const OpsTable& ops_avx512() { return ops_generic(); }
}  // namespace amp_kernels
#endif
