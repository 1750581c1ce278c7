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

static const OpsTable kTable = {
    AMP_ISA_NAME, k_scale, k_axpby, k_sumsq, k_adam, k_sgd, k_lamb_stage1, k_lamb_stage2,
    k_scale_sumsq, k_absmax, k_adagrad, k_novograd,
};
