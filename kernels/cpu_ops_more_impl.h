// More element-wise kernels, included right after cpu_ops_impl.h (same namespace, same
// helpers, same block shape), plus the per-ISA table of every kernel.

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
    k_scale_sumsq, k_absmax, k_adagrad, k_novograd, k_probe_read, k_probe_update,
};
