// Element-wise kernels over one chunk of one tensor, and (at the end) the table of them all for
// one instruction set. Included once per instruction set by ops_<isa>.cpp inside
// `namespace AMP_ISA_NS`; these files include no torch header so each compiles in seconds.
//
// Shape of every kernel: walk the chunk in blocks of kBlock elements; a block
// of a half-precision tensor is widened into an L1-resident float buffer
// (fp32 tensors are used in place), the math runs on floats in a loop the
// compiler vectorizes (`omp simd`), and written blocks are narrowed back.
// Mixed dtypes therefore need no per-combination template instances.
//
// Requires: <cstdint> <cstring> <cmath> <algorithm>, cpu_ops.h, and
// AMP_HAVE_F16C (0/1) and AMP_FMA(a, b, c) (a*b+c, fused where torch's kernels for
// the same ISA fuse it) defined by the including file. The build passes
// -ffp-contract=off so every other operation rounds exactly where torch's do.

static constexpr int kBlock = 512;

static inline uint32_t f2u(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
static inline float u2f(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

#ifndef AMP_HAVE_STREAM
#define AMP_HAVE_STREAM 0
#endif
#ifndef AMP_HAVE_AVX2
#define AMP_HAVE_AVX2 0
#endif

// IEEE half <-> float, branch-free so loops over them vectorize without F16C.
static inline float h2f(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7FFFu;
  // Normals and subnormals: reinterpret with the exponent re-biased by 2^112.
  const uint32_t finite = f2u(u2f(em << 13) * 0x1p112f);
  const uint32_t infnan = (em << 13) | 0x7F800000u;
  return u2f((em >= 0x7C00u ? infnan : finite) | sign);
}

static inline uint16_t f2h(float f) {  // round to nearest even, like c10::Half
  uint32_t u = f2u(f);
  const uint32_t sign = u & 0x80000000u;
  u ^= sign;
  const uint32_t big = u > 0x7F800000u ? 0x7E00u : 0x7C00u;  // NaN : overflow/inf
  const float denorm_magic = u2f(((127u - 15u) + (23u - 10u) + 1u) << 23);
  const uint32_t sub = f2u(u2f(u) + denorm_magic) - f2u(denorm_magic);
  const uint32_t odd = (u >> 13) & 1u;
  const uint32_t norm = (u + 0xC8000000u /* (15-127)<<23 */ + 0xFFFu + odd) >> 13;
  const uint32_t o = u >= ((127u + 16u) << 23) ? big : (u < (113u << 23) ? sub : norm);
  return static_cast<uint16_t>(o | (sign >> 16));
}

static inline void widen_f16(const uint16_t* s, float* d, int n) {
  int i = 0;
#if AMP_HAVE_F16C
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
#endif
#pragma omp simd
  for (int j = i; j < n; ++j) d[j] = h2f(s[j]);
}

static inline void narrow_f16(const float* s, uint16_t* d, int n) {
  int i = 0;
#if AMP_HAVE_F16C
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
#endif
#pragma omp simd
  for (int j = i; j < n; ++j) d[j] = f2h(s[j]);
}

static inline void widen_bf16(const uint16_t* s, float* d, int n) {
  int i = 0;
#if AMP_HAVE_AVX2
  // One zero-extending load per 8 values: the vectoriser's own widening takes two 128-bit
  // halves and an insert per 8 (the values are the same: a bf16 is a float's top half).
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i),
                        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(
                                              reinterpret_cast<const __m128i*>(s + i))),
                                          16));
#endif
#pragma omp simd
  for (int j = i; j < n; ++j) d[j] = u2f(static_cast<uint32_t>(s[j]) << 16);
}

static inline void narrow_bf16(const float* s, uint16_t* d, int n) {  // like c10::BFloat16
#pragma omp simd
  for (int i = 0; i < n; ++i) {
    const uint32_t u = f2u(s[i]);
    const uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    d[i] = (u & 0x7FFFFFFFu) > 0x7F800000u ? static_cast<uint16_t>(0x7FC0u)
                                           : static_cast<uint16_t>(r);
  }
}

// Float view of a block: the tensor's own memory when fp32, else `tmp`.
static inline float* acquire(Ref r, int64_t off, int n, float* tmp) {
  if (r.dtype == kF32) return static_cast<float*>(r.ptr) + off;
  const uint16_t* s = static_cast<const uint16_t*>(r.ptr) + off;
  if (r.dtype == kBF16) widen_bf16(s, tmp, n);
  else widen_f16(s, tmp, n);
  return tmp;
}

// Float buffer to write a block of `r` into (no widening: contents undefined).
static inline float* out_buffer(Ref r, int64_t off, float* tmp) {
  return r.dtype == kF32 ? static_cast<float*>(r.ptr) + off : tmp;
}

// Copies `bytes` (a multiple of 2) from an L1-resident buffer to `d` with non-temporal
// stores where the ISA has them (SSE2 on every x86-64; 16 bytes a store is enough, the
// write-combining buffer assembles whole lines). The driver fences after each thread's
// share (driver.h), so the data is visible to whoever reads it after the call.
static inline void stream_copy(void* dst, const void* src, int64_t bytes) {
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
#if AMP_HAVE_STREAM
  int64_t i = 0;
  const int64_t head = (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15;
  if (head >= bytes) {
    std::memcpy(d, s, bytes);
    return;
  }
  std::memcpy(d, s, head);
  for (i = head; i + 16 <= bytes; i += 16)
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i),
                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
  std::memcpy(d + i, s + i, bytes - i);
#else
  std::memcpy(d, s, bytes);
#endif
}

// Writes a float block into `r` (a no-op when `src` already is r's memory). The rounding
// is the same with or without `r.stream`; only the kind of store differs.
static inline void release(Ref r, int64_t off, int n, const float* src) {
  if (r.dtype == kF32) {
    float* d = static_cast<float*>(r.ptr) + off;
    if (d == src) return;
    if (r.stream) stream_copy(d, src, sizeof(float) * n);
    else std::memcpy(d, src, sizeof(float) * n);
    return;
  }
  uint16_t* d = static_cast<uint16_t*>(r.ptr) + off;
  alignas(64) uint16_t narrowed[kBlock];
  uint16_t* to = r.stream ? narrowed : d;  // n <= kBlock: every caller works in blocks
  if (r.dtype == kBF16) narrow_bf16(src, to, n);
  else narrow_f16(src, to, n);
  if (r.stream) stream_copy(d, narrowed, sizeof(uint16_t) * n);
}

static inline uint32_t nonfinite_bits(float y) {
  return (f2u(y) & 0x7F800000u) == 0x7F800000u ? 1u : 0u;
}

static bool k_scale(Ref in, Ref out, int64_t off, int64_t n, float s) {
  alignas(64) float tin[kBlock];
  alignas(64) float tout[kBlock];
  uint32_t bad = 0;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int k = static_cast<int>(std::min<int64_t>(kBlock, n - b));
    const float* x = acquire(in, off + b, k, tin);
    float* y = out_buffer(out, off + b, tout);
#pragma omp simd reduction(| : bad)
    for (int i = 0; i < k; ++i) {
      const float v = x[i] * s;
      bad |= nonfinite_bits(v);
      y[i] = v;
    }
    release(out, off + b, k, y);
  }
  return bad == 0;
}

static bool k_axpby(Ref xr, Ref yr, Ref outr, int64_t off, int64_t n, float a, float b,
                    int arg_to_check) {
  alignas(64) float tx[kBlock];
  alignas(64) float ty[kBlock];
  alignas(64) float to[kBlock];
  uint32_t bad = 0;
  const bool cx = arg_to_check != 1, cy = arg_to_check != 0;
  for (int64_t s = 0; s < n; s += kBlock) {
    const int k = static_cast<int>(std::min<int64_t>(kBlock, n - s));
    const float* x = acquire(xr, off + s, k, tx);
    const float* y = acquire(yr, off + s, k, ty);
    float* o = out_buffer(outr, off + s, to);
#pragma omp simd reduction(| : bad)
    for (int i = 0; i < k; ++i) {
      const float xi = x[i], yi = y[i];
      bad |= (cx ? nonfinite_bits(xi) : 0u) | (cy ? nonfinite_bits(yi) : 0u);
      o[i] = a * xi + b * yi;
    }
    release(outr, off + s, k, o);
  }
  return bad == 0;
}

// Sum of squares, the read-only pass that also detects non-finite gradients. The hot
// loop only accumulates, into four independent 8-float vectors (GCC vector extensions,
// so it is the same code on every ISA); an inf or NaN always makes the block's sum
// non-finite, and only then is the block rescanned to tell a real inf/NaN from a sum
// that overflowed (keeping the flag exact without a per-element test).
// (Static inline helpers only: the -Wpsabi note about AVX-sized vectors without AVX
// concerns calls across object files, which never happen here.)
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float f8 __attribute__((vector_size(32)));

static inline f8 load8(const float* p) {
  f8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

typedef uint16_t u16x8 __attribute__((vector_size(16)));
typedef uint32_t u32x8 __attribute__((vector_size(32)));

static inline f8 load8_bf16(const uint16_t* p) {
#if AMP_HAVE_AVX2
  const __m256 w = _mm256_castsi256_ps(_mm256_slli_epi32(
      _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
  f8 v;
  std::memcpy(&v, &w, sizeof(v));
  return v;
#else
  u16x8 h;
  std::memcpy(&h, p, sizeof(h));
  const u32x8 w = __builtin_convertvector(h, u32x8) << 16;
  f8 v;
  std::memcpy(&v, &w, sizeof(v));
  return v;
#endif
}

static inline float hsum(f8 v) {
  float s = 0.f;
  for (int j = 0; j < 8; ++j) s += v[j];
  return s;
}

// Sum of squares of one block of x*s (float accumulation, as above); *finite is cleared
// when an element itself is non-finite. Shared by k_sumsq and k_scale_sumsq. kBf16: x is
// bf16, widened in registers (the same floats as widen_bf16 makes, summed in the same
// order, so the result is the same bits as widening the block first).
template <bool kBf16>
static inline float block_sumsq_t(const void* xv, int k, float s, bool* finite) {
  const float* xf = static_cast<const float*>(xv);
  const uint16_t* xh = static_cast<const uint16_t*>(xv);
  auto at8 = [&](int i) { return kBf16 ? load8_bf16(xh + i) : load8(xf + i); };
  auto at = [&](int i) { return kBf16 ? u2f(static_cast<uint32_t>(xh[i]) << 16) : xf[i]; };
  f8 a0 = {}, a1 = {}, a2 = {}, a3 = {};
  int i = 0;
  for (; i + 32 <= k; i += 32) {
    const f8 x0 = at8(i) * s, x1 = at8(i + 8) * s;
    const f8 x2 = at8(i + 16) * s, x3 = at8(i + 24) * s;
    a0 += x0 * x0;
    a1 += x1 * x1;
    a2 += x2 * x2;
    a3 += x3 * x3;
  }
  float blk = hsum(a0 + a1 + a2 + a3);
  for (; i < k; ++i) {
    const float v = at(i) * s;
    blk += v * v;
  }
  if (!std::isfinite(blk)) {  // rare: find out whether an element itself is non-finite
    uint32_t bad = 0;
    for (int j = 0; j < k; ++j) bad |= nonfinite_bits(at(j) * s);
    if (bad) *finite = false;
  }
  return blk;
}

static inline float block_sumsq(const float* x, int k, float s, bool* finite) {
  return block_sumsq_t<false>(x, k, s, finite);
}

static NormPart k_sumsq(Ref xr, int64_t off, int64_t n, float s) {
  alignas(64) float tx[kBlock];
  double total = 0.0;
  bool finite = true;
  for (int64_t b = 0; b < n; b += kBlock) {  // same blocks, same sums, either way
    const int k = static_cast<int>(std::min<int64_t>(kBlock, n - b));
    if (xr.dtype == kBF16)
      total += block_sumsq_t<true>(static_cast<const uint16_t*>(xr.ptr) + off + b, k, s, &finite);
    else
      total += block_sumsq(acquire(xr, off + b, k, tx), k, s, &finite);
  }
  return NormPart{total, finite};
}

// Formulas follow torch.optim.Adam/AdamW (single-tensor path) term by term so
// results agree to rounding: lerp for the first moment, addcmul for the second.
template <bool kDecoupled>
static inline void adam_block(const float* g, float* p, float* m, float* v, int k,
                              const AdamArgs& a) {
  const float decay = a.decay;
  const float gs = a.grad_scale, omb1 = a.one_minus_beta1, b2 = a.beta2;
  const float omb2 = a.one_minus_beta2;
  const float eps = a.eps, nss = -a.step_size, inv_bc2s = a.inv_bc2_sqrt;
  const float wd = a.weight_decay;
#pragma omp simd
  for (int i = 0; i < k; ++i) {
    float gi = g[i] * gs;
    float pi = p[i];
    if (kDecoupled) pi = pi * decay;         // param.mul_(1 - lr*wd)
    else gi = AMP_FMA(pi, wd, gi);           // grad.add(param, alpha=wd)
    const float mi = AMP_FMA(omb1, gi - m[i], m[i]);  // exp_avg.lerp_(grad, 1-beta1)
    const float vi = v[i] * b2 + omb2 * gi * gi;      // mul_(beta2).addcmul_(g, g, 1-beta2)
    // torch divides by sqrt(bias_correction2); a multiply by its reciprocal (rounded once
    // on the host) saves one of three long-latency sqrt/div ops per element, which is what
    // bounds this loop when the tensors are cache-resident; results move by <= 1 ulp.
    const float denom = std::sqrt(vi) * inv_bc2s + eps;
    p[i] = pi + nss * mi / denom;            // addcdiv_(exp_avg, denom, -step_size)
    m[i] = mi;
    v[i] = vi;
  }
}

static void k_adam(Ref g, Ref p, Ref m, Ref v, Ref half, int64_t off, int64_t n,
                   const AdamArgs& a) {
  alignas(64) float tg[kBlock], tp[kBlock], tm[kBlock], tv[kBlock];
  for (int64_t s = 0; s < n; s += kBlock) {
    const int k = static_cast<int>(std::min<int64_t>(kBlock, n - s));
    const float* G = acquire(g, off + s, k, tg);
    float* P = acquire(p, off + s, k, tp);
    float* M = acquire(m, off + s, k, tm);
    float* V = acquire(v, off + s, k, tv);
    if (a.adam_w_mode) adam_block<true>(G, P, M, V, k, a);
    else adam_block<false>(G, P, M, V, k, a);
    release(p, off + s, k, P);
    release(m, off + s, k, M);
    release(v, off + s, k, V);
    if (half.ptr) release(half, off + s, k, P);
  }
}

// torch.optim.SGD term by term; apex's wd_after_momentum adds decay after the
// momentum update instead of before it.
static void k_sgd(Ref g, Ref p, Ref buf, Ref half, int64_t off, int64_t n, const SgdArgs& a) {
  alignas(64) float tg[kBlock], tp[kBlock], tb[kBlock];
  const float gs = a.grad_scale, nlr = -a.lr, mom = a.momentum, omd = a.one_minus_dampening;
  const float wd = a.weight_decay;
  const bool has_mom = buf.ptr != nullptr;
  const bool wd_before = wd != 0.f && !a.wd_after_momentum;
  const bool wd_after = wd != 0.f && a.wd_after_momentum;
  const bool first = a.first_run != 0, nesterov = a.nesterov != 0;
  for (int64_t s = 0; s < n; s += kBlock) {
    const int k = static_cast<int>(std::min<int64_t>(kBlock, n - s));
    const float* G = acquire(g, off + s, k, tg);
    float* P = acquire(p, off + s, k, tp);
    float* B = has_mom ? (first ? out_buffer(buf, off + s, tb) : acquire(buf, off + s, k, tb))
                       : nullptr;
#pragma omp simd
    for (int i = 0; i < k; ++i) {
      float d = G[i] * gs;
      if (wd_before) d = AMP_FMA(P[i], wd, d);  // grad.add(param, alpha=wd)
      if (has_mom) {  // buf.mul_(momentum).add_(grad, alpha=1-dampening)
        const float bi = first ? d : AMP_FMA(d, omd, B[i] * mom);
        B[i] = bi;
        d = nesterov ? AMP_FMA(bi, mom, d) : bi;
      }
      if (wd_after) d = AMP_FMA(P[i], wd, d);
      P[i] = AMP_FMA(d, nlr, P[i]);  // param.add_(grad, alpha=-lr)
    }
    release(p, off + s, k, P);
    if (has_mom) release(buf, off + s, k, B);
    if (half.ptr) release(half, off + s, k, P);
  }
}

// LAMB (You et al. 2019, apex's multi_tensor_lamb): stage 1 updates the
// moments and measures ||update|| and ||param|| per tensor; stage 2 recomputes
// the update from the stored moments (so gradients are read once and never
// rewritten) and applies the per-tensor trust ratio.
template <bool kDecoupled>
static inline float lamb_update(float mi, float vi, float pi, const LambArgs& a) {
  const float u = (mi / a.bc1) / (std::sqrt(vi / a.bc2) + a.eps);
  return kDecoupled ? AMP_FMA(pi, a.weight_decay, u) : u;
}

// One block of stage 1: the moments, and the update each element would get (into u), in
// one loop the compiler vectorizes -- the decay mode is a template argument and the sums are
// taken afterwards, since a float reduction inside the loop kept it scalar (4x slower than
// Adam's loop). The sums use block_sumsq's fixed order, so every ISA gets the same bits.
template <bool kDecoupled>
static inline void lamb_stage1_block(const float* G, const float* P, float* M, float* V,
                                     float* U, int k, const LambArgs& a) {
  const float gs = a.grad_scale, b1 = a.beta1, b3 = a.beta3, b2 = a.beta2, omb2 = a.one_minus_beta2;
  const float wd = a.weight_decay;
#pragma omp simd
  for (int i = 0; i < k; ++i) {
    float gi = G[i] * gs;
    const float pi = P[i];
    if (!kDecoupled) gi = AMP_FMA(pi, wd, gi);
    const float mi = AMP_FMA(gi, b3, M[i] * b1);
    const float vi = V[i] * b2 + omb2 * gi * gi;
    M[i] = mi;
    V[i] = vi;
    U[i] = lamb_update<kDecoupled>(mi, vi, pi, a);
  }
}

// `keep` (nullable): where each element's update goes for lamb_apply (elements 0..n-1 of this
// range), instead of a block's scratch.
static void k_lamb_stage1(Ref g, Ref p, Ref m, Ref v, int64_t off, int64_t n, const LambArgs& a,
                          double* update_sumsq, double* param_sumsq, float* keep) {
  alignas(64) float tg[kBlock], tp[kBlock], tm[kBlock], tv[kBlock], tb[kBlock];
  const bool w = a.adam_w_mode != 0;
  double usum = 0.0, psum = 0.0;
  bool finite = true;  // not asked for here: the trust ratio reads the sums as they are
  for (int64_t s = 0; s < n; s += kBlock) {
    const int k = static_cast<int>(std::min<int64_t>(kBlock, n - s));
    const float* G = acquire(g, off + s, k, tg);
    const float* P = acquire(p, off + s, k, tp);
    float* M = acquire(m, off + s, k, tm);
    float* V = acquire(v, off + s, k, tv);
    float* U = keep ? keep + s : tb;
    if (w) lamb_stage1_block<true>(G, P, M, V, U, k, a);
    else lamb_stage1_block<false>(G, P, M, V, U, k, a);
    usum += block_sumsq(U, k, 1.f, &finite);
    psum += block_sumsq(P, k, 1.f, &finite);
    release(m, off + s, k, M);
    release(v, off + s, k, V);
  }
  *update_sumsq = usum;
  *param_sumsq = psum;
}

// One block of stage 2, the decay mode a template argument as in stage 1: a run-time choice
// between the two updates inside the loop had the vectorized loop compute both.
template <bool kDecoupled>
static inline void lamb_stage2_block(float* P, const float* M, const float* V, int k,
                                     const LambArgs& a, float ratio) {
#pragma omp simd
  for (int i = 0; i < k; ++i) P[i] = P[i] - ratio * lamb_update<kDecoupled>(M[i], V[i], P[i], a);
}

static void k_lamb_stage2(Ref p, Ref m, Ref v, Ref half, int64_t off, int64_t n,
                          const LambArgs& a, float ratio) {
  alignas(64) float tp[kBlock], tm[kBlock], tv[kBlock];
  const bool w = a.adam_w_mode != 0;
  for (int64_t s = 0; s < n; s += kBlock) {
    const int k = static_cast<int>(std::min<int64_t>(kBlock, n - s));
    float* P = acquire(p, off + s, k, tp);
    const float* M = acquire(m, off + s, k, tm);
    const float* V = acquire(v, off + s, k, tv);
    if (w) lamb_stage2_block<true>(P, M, V, k, a, ratio);
    else lamb_stage2_block<false>(P, M, V, k, a, ratio);
    release(p, off + s, k, P);
    if (half.ptr) release(half, off + s, k, P);
  }
}

// Stage 2 from the updates stage 1 kept (`u`: elements 0..n-1 of this range): the same
// values as recomputing them from the moments (the same float inputs, the same operations),
// without three divisions and a square root per element.
static void k_lamb_apply(Ref p, const float* u, Ref half, int64_t off, int64_t n, float ratio) {
  alignas(64) float tp[kBlock];
  for (int64_t s = 0; s < n; s += kBlock) {
    const int k = static_cast<int>(std::min<int64_t>(kBlock, n - s));
    float* P = acquire(p, off + s, k, tp);
    const float* U = u + s;
#pragma omp simd
    for (int i = 0; i < k; ++i) P[i] = P[i] - ratio * U[i];
    release(p, off + s, k, P);
    if (half.ptr) release(half, off + s, k, P);
  }
}

// --- Unscale with its norm, NovoGrad's infinity norm, Adagrad, NovoGrad; the limit probe;
// --- and this ISA's table of every kernel --------------------------------------------------

// out = in * s, returning the sum of squares of what was written and whether it was all
// finite: amp's unscale pass, which leaves unscaled gradients in memory (apex's behaviour)
// and measures their norm in the same read, so clipping needs no second pass.
static NormPart k_scale_sumsq(Ref in, Ref out, int64_t off, int64_t n, float s) {
  alignas(64) float tin[kBlock];
  alignas(64) float tout[kBlock];
  double total = 0.0;
  bool finite = true;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int k = static_cast<int>(std::min<int64_t>(kBlock, n - b));
    const float* x = acquire(in, off + b, k, tin);
    float* y = out_buffer(out, off + b, tout);
#pragma omp simd
    for (int i = 0; i < k; ++i) y[i] = x[i] * s;
    total += block_sumsq(y, k, 1.f, &finite);
    release(out, off + b, k, y);
  }
  return NormPart{total, finite};
}

// max |x * s| over a range (NovoGrad's infinity norm); NaN when any value is non-finite.
static float k_absmax(Ref xr, int64_t off, int64_t n, float s) {
  alignas(64) float tx[kBlock];
  float best = 0.f;
  uint32_t bad = 0;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int k = static_cast<int>(std::min<int64_t>(kBlock, n - b));
    const float* x = acquire(xr, off + b, k, tx);
#pragma omp simd reduction(max : best) reduction(| : bad)
    for (int i = 0; i < k; ++i) {
      const float v = std::fabs(x[i] * s);
      bad |= nonfinite_bits(v);
      best = v > best ? v : best;
    }
  }
  return bad ? std::nanf("") : best;
}

// Adagrad. L2 mode is torch.optim.Adagrad term by term (lr_decay 0, accumulator starting
// at 0): grad += wd * param; sum += grad * grad; param -= lr * grad / (sqrt(sum) + eps).
// Decoupled mode (apex's adagrad_w_mode): the decay joins the update instead.
static void k_adagrad(Ref g, Ref p, Ref h, Ref half, int64_t off, int64_t n,
                      const AdagradArgs& a) {
  alignas(64) float tg[kBlock], tp[kBlock], th[kBlock];
  const float gs = a.grad_scale, nlr = -a.lr, eps = a.eps, wd = a.weight_decay;
  const bool decoupled = a.w_mode != 0;
  for (int64_t s = 0; s < n; s += kBlock) {
    const int k = static_cast<int>(std::min<int64_t>(kBlock, n - s));
    const float* G = acquire(g, off + s, k, tg);
    float* P = acquire(p, off + s, k, tp);
    float* H = acquire(h, off + s, k, th);
#pragma omp simd
    for (int i = 0; i < k; ++i) {
      float gi = G[i] * gs;
      const float pi = P[i];
      if (!decoupled) gi = AMP_FMA(pi, wd, gi);  // grad.add(param, alpha=wd)
      const float hi = H[i] + gi * gi;            // state_sum.addcmul_(grad, grad)
      const float denom = std::sqrt(hi) + eps;
      P[i] = decoupled ? pi + nlr * (gi / denom + wd * pi)
                       : pi + nlr * gi / denom;   // addcdiv_(grad, std, -lr)
      H[i] = hi;
    }
    release(p, off + s, k, P);
    release(h, off + s, k, H);
    if (half.ptr) release(half, off + s, k, P);
  }
}

// NovoGrad (apex's multi_tensor_novograd): `denom` is this tensor's blended gradient norm
// / bias correction 2 + eps, computed by the driver from a first read pass.
// moment_mode 0 regularises inside the moment, 1 decouples the decay into the update.
static void k_novograd(Ref g, Ref p, Ref m, Ref half, int64_t off, int64_t n,
                       const NovoGradArgs& a, float denom) {
  alignas(64) float tg[kBlock], tp[kBlock], tm[kBlock];
  const float gs = a.grad_scale, b1 = a.beta1, b3 = a.beta3, bc1 = a.bc1;
  const float lr = a.lr, wd = a.weight_decay;
  const bool inside = a.moment_mode == 0;
  for (int64_t s = 0; s < n; s += kBlock) {
    const int k = static_cast<int>(std::min<int64_t>(kBlock, n - s));
    const float* G = acquire(g, off + s, k, tg);
    float* P = acquire(p, off + s, k, tp);
    float* M = acquire(m, off + s, k, tm);
#pragma omp simd
    for (int i = 0; i < k; ++i) {
      float gi = G[i] * gs;
      const float pi = P[i];
      float mi;
      if (inside) {
        gi = gi / denom + wd * pi;
        mi = b1 * M[i] + b3 * gi;
        P[i] = pi - lr * (mi / bc1);
      } else {
        mi = b1 * M[i] + b3 * gi;
        P[i] = pi - lr * ((mi / bc1) / denom + wd * pi);
      }
      M[i] = mi;
    }
    release(p, off + s, k, P);
    release(m, off + s, k, M);
    if (half.ptr) release(half, off + s, k, P);
  }
}

// --- The limit probe (benchmark only; see OpsTable) ---------------------------------------
// The same bytes as the ideal two-pass step with the least arithmetic that still touches
// every byte: the read pass keeps four independent vector accumulators (one would bound it
// by add latency, not memory), the update pass is one add per array. bf16 gradients are
// widened in registers; fp16 ones through the usual block buffer (no benchmark case uses
// them). p, m and v are float32 (the driver checks); v is absent for one-state optimizers.
template <bool kBf16>
static inline double probe_read_range(const void* base, int64_t n) {
  const float* xf = static_cast<const float*>(base);
  const uint16_t* xh = static_cast<const uint16_t*>(base);
  f8 a0 = {}, a1 = {}, a2 = {}, a3 = {};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const f8 x0 = kBf16 ? load8_bf16(xh + i) : load8(xf + i);
    const f8 x1 = kBf16 ? load8_bf16(xh + i + 8) : load8(xf + i + 8);
    const f8 x2 = kBf16 ? load8_bf16(xh + i + 16) : load8(xf + i + 16);
    const f8 x3 = kBf16 ? load8_bf16(xh + i + 24) : load8(xf + i + 24);
    a0 += x0 * x0;
    a1 += x1 * x1;
    a2 += x2 * x2;
    a3 += x3 * x3;
  }
  double total = hsum(a0 + a1 + a2 + a3);
  for (; i < n; ++i) {
    const float v = kBf16 ? u2f(static_cast<uint32_t>(xh[i]) << 16) : xf[i];
    total += v * v;
  }
  return total;
}

static double k_probe_read(Ref g, int64_t off, int64_t n) {
  if (g.dtype == kF32) return probe_read_range<false>(static_cast<const float*>(g.ptr) + off, n);
  if (g.dtype == kBF16)
    return probe_read_range<true>(static_cast<const uint16_t*>(g.ptr) + off, n);
  alignas(64) float tx[kBlock];
  double total = 0.0;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int k = static_cast<int>(std::min<int64_t>(kBlock, n - b));
    total += probe_read_range<false>(acquire(g, off + b, k, tx), k);
  }
  return total;
}

template <int kG>  // gradient dtype; v may be null (one state array: Adagrad, NovoGrad)
static inline void probe_update_block(const void* gb, float* p, float* m, float* v, int k) {
  const float* gf = static_cast<const float*>(gb);
  const uint16_t* gh = static_cast<const uint16_t*>(gb);
  if (v) {
#pragma omp simd
    for (int i = 0; i < k; ++i) {
      const float gi = kG == kF32 ? gf[i] : u2f(static_cast<uint32_t>(gh[i]) << 16);
      m[i] += gi;
      v[i] += gi;
      p[i] -= gi;
    }
  } else {
#pragma omp simd
    for (int i = 0; i < k; ++i) {
      const float gi = kG == kF32 ? gf[i] : u2f(static_cast<uint32_t>(gh[i]) << 16);
      m[i] += gi;
      p[i] -= gi;
    }
  }
}

static void k_probe_update(Ref g, Ref p, Ref m, Ref v, Ref half, int64_t off, int64_t n) {
  alignas(64) float tg[kBlock];
  float* P = static_cast<float*>(p.ptr) + off;
  float* M = static_cast<float*>(m.ptr) + off;
  float* V = v.ptr ? static_cast<float*>(v.ptr) + off : nullptr;
  for (int64_t s = 0; s < n; s += kBlock) {
    const int k = static_cast<int>(std::min<int64_t>(kBlock, n - s));
    float* Vs = V ? V + s : nullptr;
    if (g.dtype == kF32)
      probe_update_block<kF32>(static_cast<const float*>(g.ptr) + off + s, P + s, M + s, Vs, k);
    else if (g.dtype == kBF16)
      probe_update_block<kBF16>(static_cast<const uint16_t*>(g.ptr) + off + s, P + s, M + s,
                                Vs, k);
    else
      probe_update_block<kF32>(acquire(g, off + s, k, tg), P + s, M + s, Vs, k);
    if (half.ptr) release(half, off + s, k, P + s);
  }
}

static const OpsTable kTable = {
    AMP_ISA_NAME, k_scale, k_axpby, k_sumsq, k_adam, k_sgd, k_lamb_stage1, k_lamb_stage2,
    k_lamb_apply, k_scale_sumsq, k_absmax, k_adagrad, k_novograd, k_probe_read, k_probe_update,
};
