// Kernels for any x86-64 / aarch64 CPU (the baseline ISA of the wheel).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "cpu_ops.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <emmintrin.h>  // SSE2, part of x86-64 itself: non-temporal stores
#define AMP_HAVE_STREAM 1
#endif

#define AMP_FMA(a, b, c) ((a) * (b) + (c))  // torch's DEFAULT build: no FMA
#define AMP_HAVE_F16C 0
#define AMP_ISA_NAME "generic"

namespace amp_kernels {
namespace generic_isa {
#include "cpu_ops_impl.h"
}  // namespace generic_isa

const OpsTable& ops_generic() { return generic_isa::kTable; }
}  // namespace amp_kernels
