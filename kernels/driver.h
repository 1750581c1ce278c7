// The multi-tensor driver shared by every translation unit that binds kernels: list
// validation (`check_list`), chunking (`make_chunks`) and the parallel loop (`run_chunks`),
// plus the kernel table chosen at import. Ops add a per-chunk lambda, never a new driver.
#pragma once

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include <unistd.h>

#include "cpu_ops.h"

namespace amp_driver {

namespace py = pybind11;
using amp_kernels::NormPart;
using amp_kernels::OpsTable;
using amp_kernels::Ref;
using TensorList = std::vector<at::Tensor>;


inline constexpr int64_t kChunk = 32 * 1024;        // elements per unit of parallel work
inline constexpr int64_t kSerialBelow = 64 * 1024;  // below this many elements, no threads

inline const OpsTable* g_ops = nullptr;  // set once at import (set_isa)

inline bool cpu_has_avx2() {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

// libgcc answers from CPUID and XCR0 together, so this is false where the OS (or a
// hypervisor) does not save the ZMM registers, even on a CPU that has the instructions.
inline bool cpu_has_avx512() {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  return cpu_has_avx2() && __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512dq");
#else
  return false;
#endif
}

inline void set_isa(const std::string& name) {
  if (name == "generic") {
    g_ops = &amp_kernels::ops_generic();
  } else if (name == "avx2") {
    if (!cpu_has_avx2()) throw py::value_error("amp._C: this CPU lacks AVX2/FMA/F16C");
    g_ops = &amp_kernels::ops_avx2();
  } else if (name == "avx512") {
    if (!cpu_has_avx512())
      throw py::value_error("amp._C: this CPU (or its OS) lacks AVX-512 F/BW/VL/DQ");
    g_ops = &amp_kernels::ops_avx512();
  } else if (name == "auto") {
    g_ops = cpu_has_avx512() ? &amp_kernels::ops_avx512()
            : cpu_has_avx2() ? &amp_kernels::ops_avx2()
                             : &amp_kernels::ops_generic();
  } else {
    throw py::value_error("amp._C: unknown ISA '" + name +
                          "' (expected auto, generic, avx2 or avx512)");
  }
}

// The ISAs this CPU can run, best last (for amp._ext and the benchmark's machine line).
inline std::vector<std::string> supported_isas() {
  std::vector<std::string> out = {"generic"};
  if (cpu_has_avx2()) out.push_back("avx2");
  if (cpu_has_avx512()) out.push_back("avx512");
  return out;
}

inline int dtype_code(const at::Tensor& t, const char* list, size_t i) {
  switch (t.scalar_type()) {
    case at::kFloat: return amp_kernels::kF32;
    case at::kHalf: return amp_kernels::kF16;
    case at::kBFloat16: return amp_kernels::kBF16;
    default:
      throw py::type_error(std::string("amp._C: ") + list + "[" + std::to_string(i) +
                           "] has dtype " + std::string(c10::toString(t.scalar_type())) +
                           "; expected float32, float16 or bfloat16");
  }
}

// A validated tensor list: element type, data pointers and sizes.
struct Checked {
  int dtype = -1;
  std::vector<void*> ptrs;
  std::vector<int64_t> numels;
  Ref ref(size_t i) const { return Ref{ptrs[i], dtype}; }
};

// Every list must be non-empty, on the CPU, contiguous, of one float dtype,
// and (for lists after the first) pair element-wise with `like` in size.
inline Checked check_list(const TensorList& ts, const char* name, const Checked* like,
                   const std::vector<int>* allowed = nullptr) {
  if (ts.empty()) throw py::value_error(std::string("amp._C: ") + name + " is an empty list");
  if (like && ts.size() != like->numels.size())
    throw py::value_error(std::string("amp._C: ") + name + " has " + std::to_string(ts.size()) +
                          " tensors; expected " + std::to_string(like->numels.size()) +
                          " (one per tensor of the first list)");
  Checked c;
  c.ptrs.reserve(ts.size());
  c.numels.reserve(ts.size());
  for (size_t i = 0; i < ts.size(); ++i) {
    const at::Tensor& t = ts[i];
    // Built only on error: this loop runs for every tensor of a model on every step.
    auto where = [&] { return std::string("amp._C: ") + name + "[" + std::to_string(i) + "]"; };
    if (!t.defined()) throw py::value_error(where() + " is an undefined tensor");
    if (!t.device().is_cpu())
      throw py::value_error(where() + " is on " + t.device().str() +
                            "; the compiled kernels take CPU tensors only");
    const int code = dtype_code(t, name, i);
    if (c.dtype < 0) c.dtype = code;
    if (code != c.dtype)
      throw py::type_error(where() + " has dtype " + std::string(c10::toString(t.scalar_type())) +
                           " but " + name + "[0] has another; one list must share one dtype");
    if (allowed && std::find(allowed->begin(), allowed->end(), code) == allowed->end())
      throw py::type_error(where() + " has dtype " + std::string(c10::toString(t.scalar_type())) +
                           ", which is not allowed here");
    if (t.is_sparse()) throw py::value_error(where() + " is sparse; expected a dense tensor");
    if (!t.is_contiguous()) throw py::value_error(where() + " is not contiguous");
    if (like && t.numel() != like->numels[i])
      throw py::value_error(where() + " has " + std::to_string(t.numel()) + " elements; expected " +
                            std::to_string(like->numels[i]) + " to match the first list");
    c.ptrs.push_back(t.numel() ? t.data_ptr() : nullptr);
    c.numels.push_back(t.numel());
  }
  return c;
}

inline Checked check_optional(const std::optional<TensorList>& ts, const char* name,
                       const Checked& like) {
  if (!ts) return Checked{};
  static const std::vector<int> halves = {amp_kernels::kF16, amp_kernels::kBF16,
                                          amp_kernels::kF32};
  return check_list(*ts, name, &like, &halves);
}

inline Ref ref_or_null(const Checked& c, size_t i) {
  return c.ptrs.empty() ? Ref{nullptr, 0} : c.ref(i);
}

inline int64_t elem_bytes(int dtype) { return dtype == amp_kernels::kF32 ? 4 : 2; }

// The half model copy's Ref for tensor i: streamed when the whole step (`step_bytes`,
// everything it reads and writes) exceeds the last-level cache.
inline Ref half_ref(const Checked& c, size_t i, bool stream) {
  Ref r = ref_or_null(c, i);
  r.stream = stream && r.ptr ? 1 : 0;
  return r;
}

// Bytes of a step over these lists (each read, those written counted again).
inline int64_t step_bytes(int64_t total, std::initializer_list<const Checked*> read,
                          std::initializer_list<const Checked*> written) {
  int64_t per = 0;
  for (const Checked* c : read)
    if (!c->ptrs.empty()) per += elem_bytes(c->dtype);
  for (const Checked* c : written)
    if (!c->ptrs.empty()) per += elem_bytes(c->dtype);
  return per * total;
}

struct Chunk {
  int32_t tensor;
  int64_t off;
  int64_t n;
};

inline std::vector<Chunk> make_chunks(const std::vector<int64_t>& numels, int64_t* total) {
  std::vector<Chunk> cs;
  int64_t sum = 0;
  for (size_t t = 0; t < numels.size(); ++t) {
    for (int64_t off = 0; off < numels[t]; off += kChunk)
      cs.push_back(Chunk{static_cast<int32_t>(t), off, std::min(kChunk, numels[t] - off)});
    sum += numels[t];
  }
  *total = sum;
  return cs;
}

// Makes this thread's non-temporal stores (the streamed half copy) visible before the
// parallel region ends, as for ordinary stores.
inline void store_fence() {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_ia32_sfence();
#endif
}

// The multi-tensor driver: f(chunk_index, chunk) for every chunk, in parallel
// when there is enough work. Results that need reducing go into per-chunk
// slots and are summed in chunk order, so they do not depend on thread count.
//
// One parallel region per call, and each thread gets ONE contiguous run of chunks holding
// about total / threads elements. (at::parallel_for over the chunk indices splits by chunk
// COUNT: with a model's uneven tensor sizes one thread could get most of the elements and
// the other wait for it.) The chunk size itself only sets the granularity of that split and
// of the reductions, which keeps it out of the results' rounding being any different from
// before: chunks are still kChunk elements of one tensor.
template <class F>
inline void run_chunks(const std::vector<Chunk>& cs, int64_t total, const F& f) {
  if (total < kSerialBelow || cs.size() < 2) {
    for (size_t i = 0; i < cs.size(); ++i) f(i, cs[i]);
    store_fence();
    return;
  }
  const int64_t nt = std::min<int64_t>(at::get_num_threads(), static_cast<int64_t>(cs.size()));
  // first[t]: the first chunk of thread t (the first one that starts at or after t's share).
  std::vector<size_t> first(nt + 1, cs.size());
  first[0] = 0;
  int64_t seen = 0;
  int64_t t = 1;
  for (size_t i = 0; i < cs.size() && t < nt; ++i) {
    while (t < nt && seen >= total * t / nt) first[t++] = i;
    seen += cs[i].n;
  }
  py::gil_scoped_release no_gil;
  at::parallel_for(0, nt, 1, [&](int64_t b, int64_t e) {
    for (int64_t w = b; w < e; ++w)
      for (size_t i = first[w]; i < first[w + 1]; ++i) f(i, cs[i]);
    store_fence();
  });
}

// Whether a step's half model copy should be written with non-temporal stores: when the
// arrays the step streams (`bytes`) exceed the last-level cache, the copy would be evicted
// before anything reads it again, so loading its lines first (write-allocate) is wasted.
// Below that, ordinary stores keep the copy in cache for the forward pass that follows.
inline int64_t last_level_cache_bytes() {
  static const int64_t llc = [] {
    long v = -1;
#ifdef _SC_LEVEL3_CACHE_SIZE
    v = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (v <= 0) v = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
    return v > 0 ? static_cast<int64_t>(v) : int64_t(32) << 20;  // unknown: assume 32 MiB
  }();
  return llc;
}

inline bool stream_half(int64_t bytes) {
  if (const char* e = std::getenv("AMP_STREAM_HALF")) {  // benchmarks: force 0 or 1
    if (*e == '0') return false;
    if (*e == '1') return true;
  }
  return bytes > last_level_cache_bytes();
}

inline const std::vector<int> kF32Only = {amp_kernels::kF32};

}  // namespace amp_driver

// The ops of amp._C (bindings.cpp, ops_more.cpp), callable from every translation unit.
namespace amp_ops {
using amp_driver::TensorList;
bool scale(const TensorList& in, const TensorList& out, double s);
bool axpby(const TensorList& xs, const TensorList& ys, const TensorList& out, double a, double b,
           int arg_to_check);
pybind11::tuple l2norm(const TensorList& xs, double s, bool per_tensor);
void adam(const TensorList& grads, const TensorList& params, const TensorList& exp_avgs,
          const TensorList& exp_avg_sqs, const std::optional<TensorList>& model_params,
          double lr, double beta1, double beta2, double eps, int64_t step, bool adam_w_mode,
          bool bias_correction, double weight_decay, double grad_scale);
void sgd(const TensorList& grads, const TensorList& params,
         const std::optional<TensorList>& momentum_buffers,
         const std::optional<TensorList>& model_params, double lr, double momentum,
         double dampening, double weight_decay, bool nesterov, bool wd_after_momentum,
         bool first_run, double grad_scale);
at::Tensor lamb(const TensorList& grads, const TensorList& params, const TensorList& exp_avgs,
                const TensorList& exp_avg_sqs, const std::optional<TensorList>& model_params,
                double lr, double beta1, double beta2, double eps, int64_t step,
                bool bias_correction, double weight_decay, bool grad_averaging,
                bool adam_w_mode, bool use_nvlamb, double grad_scale);
pybind11::tuple scale_l2norm(const TensorList& in, const TensorList& out, double s);
void adagrad(const TensorList& grads, const TensorList& params, const TensorList& sums,
             const std::optional<TensorList>& model_params, double lr, double eps,
             double weight_decay, bool w_mode, double grad_scale);
void novograd(const TensorList& grads, const TensorList& params, const TensorList& exp_avgs,
              const std::optional<TensorList>& model_params, const at::Tensor& grad_norms,
              double lr, double beta1, double beta2, double eps, int64_t step,
              bool bias_correction, double weight_decay, bool grad_averaging, int moment_mode,
              int norm_type, bool init_norms, double grad_scale);
}  // namespace amp_ops

namespace amp_driver {
// Registration of the ops defined in other translation units (called by PYBIND11_MODULE).
void register_more_ops(py::module& m);
void register_apex_api(py::module& m);

}  // namespace amp_driver
