// The multi-tensor driver shared by both bindings of amp._C (bindings.cpp: pybind11 over
// ATen, for torch < 2.10 and Python 3.9; bindings_stable.cpp: torch's stable C ABI, one abi3
// binary for torch >= 2.10): list validation (`check_list`), chunking (`make_chunks`), the
// parallel loop (`run_chunks`) and the kernel table chosen at import. It includes no torch
// header: a binding turns its tensors into `View`s and supplies the parallel backend
// (`binding()`), so the ops (ops.cpp) are compiled once, the same for both.
// Ops add a per-chunk lambda, never a new driver.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

#include "cpu_ops.h"

namespace amp_driver {

using amp_kernels::NormPart;
using amp_kernels::OpsTable;
using amp_kernels::Ref;

// Bad arguments. Each binding turns it into Python's ValueError or TypeError (`type_error`).
struct ArgError : std::runtime_error {
  bool type_error;
  ArgError(const std::string& msg, bool is_type_error)
      : std::runtime_error(msg), type_error(is_type_error) {}
};
[[noreturn]] inline void value_error(const std::string& msg) { throw ArgError(msg, false); }
[[noreturn]] inline void type_error(const std::string& msg) { throw ArgError(msg, true); }

// What the driver needs of one tensor, read by the binding from its own tensor type.
struct View {
  const void* tensor = nullptr;  // the binding's tensor, for the names in an error message
  void* ptr = nullptr;           // element 0; nullptr when empty, not on the CPU, or sparse
  int64_t numel = 0;
  int dtype = -1;  // amp_kernels::kF32 / kF16 / kBF16, or -1 for any other dtype
  bool defined = false, cpu = false, contiguous = false, sparse = false;
};
using ViewList = std::vector<View>;

// A binding's tensor list as Views (`view_of`: the binding's one-tensor conversion).
template <class List, class ViewOf>
inline ViewList views_of(const List& ts, ViewOf view_of) {
  ViewList out;
  out.reserve(ts.size());
  for (const auto& t : ts) out.push_back(view_of(t));
  return out;
}

// An optional list's views, kept alive while the op runs: get() is nullptr for None.
struct OptionalViews {
  ViewList list;
  bool present = false;
  template <class OptionalList, class ViewOf>
  OptionalViews(const OptionalList& ts, ViewOf view_of)
      : list(ts ? views_of(*ts, view_of) : ViewList{}), present(ts.has_value()) {}
  const ViewList* get() const { return present ? &list : nullptr; }
};

// What only the binding can do: name a tensor's dtype and device (errors only) and run a
// parallel loop on torch's thread pool.
struct Binding {
  std::string (*dtype_name)(const View&);
  std::string (*device_name)(const View&);
  int64_t (*num_threads)();
  // body(begin, end, ctx) over [0, n), one call per thread's range (grain 1).
  void (*parallel)(int64_t n, void (*body)(int64_t, int64_t, void*), void* ctx);
};
const Binding& binding();  // defined by the binding the module is linked with

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
    if (!cpu_has_avx2()) value_error("amp._C: this CPU lacks AVX2/FMA/F16C");
    g_ops = &amp_kernels::ops_avx2();
  } else if (name == "avx512") {
    if (!cpu_has_avx512()) value_error("amp._C: this CPU (or its OS) lacks AVX-512 F/BW/VL/DQ");
    g_ops = &amp_kernels::ops_avx512();
  } else if (name == "auto") {
    g_ops = cpu_has_avx512() ? &amp_kernels::ops_avx512()
            : cpu_has_avx2() ? &amp_kernels::ops_avx2()
                             : &amp_kernels::ops_generic();
  } else {
    value_error("amp._C: unknown ISA '" + name + "' (expected auto, generic, avx2 or avx512)");
  }
}

// The ISA chosen at import: AMP_KERNEL_ISA forces a build (tests, benchmarks); one this CPU
// cannot run, or a misspelt name, must not make the import fail: auto is used, and the
// reason is returned (amp._ext warns with it, from the module's _isa_note).
inline std::string init_isa() {
  const char* forced = std::getenv("AMP_KERNEL_ISA");
  try {
    set_isa(forced && *forced ? forced : "auto");
  } catch (const std::exception& e) {
    set_isa("auto");
    return e.what();
  }
  return "";
}

// The ISAs this CPU can run, best last (for amp._ext and the benchmark's machine line).
inline std::vector<std::string> supported_isas() {
  std::vector<std::string> out = {"generic"};
  if (cpu_has_avx2()) out.push_back("avx2");
  if (cpu_has_avx512()) out.push_back("avx512");
  return out;
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
inline Checked check_list(const ViewList& ts, const char* name, const Checked* like,
                          const std::vector<int>* allowed = nullptr) {
  if (ts.empty()) value_error(std::string("amp._C: ") + name + " is an empty list");
  if (like && ts.size() != like->numels.size())
    value_error(std::string("amp._C: ") + name + " has " + std::to_string(ts.size()) +
                " tensors; expected " + std::to_string(like->numels.size()) +
                " (one per tensor of the first list)");
  Checked c;
  c.ptrs.reserve(ts.size());
  c.numels.reserve(ts.size());
  for (size_t i = 0; i < ts.size(); ++i) {
    const View& t = ts[i];
    // Built only on error: this loop runs for every tensor of a model on every step.
    auto where = [&] { return std::string("amp._C: ") + name + "[" + std::to_string(i) + "]"; };
    if (!t.defined) value_error(where() + " is an undefined tensor");
    if (!t.cpu)
      value_error(where() + " is on " + binding().device_name(t) +
                  "; the compiled kernels take CPU tensors only");
    if (t.dtype < 0)
      type_error(std::string("amp._C: ") + name + "[" + std::to_string(i) + "] has dtype " +
                 binding().dtype_name(t) + "; expected float32, float16 or bfloat16");
    if (c.dtype < 0) c.dtype = t.dtype;
    if (t.dtype != c.dtype)
      type_error(where() + " has dtype " + binding().dtype_name(t) + " but " + name +
                 "[0] has another; one list must share one dtype");
    if (allowed && std::find(allowed->begin(), allowed->end(), t.dtype) == allowed->end())
      type_error(where() + " has dtype " + binding().dtype_name(t) +
                 ", which is not allowed here");
    if (t.sparse) value_error(where() + " is sparse; expected a dense tensor");
    if (!t.contiguous) value_error(where() + " is not contiguous");
    if (like && t.numel != like->numels[i])
      value_error(where() + " has " + std::to_string(t.numel) + " elements; expected " +
                  std::to_string(like->numels[i]) + " to match the first list");
    c.ptrs.push_back(t.numel ? t.ptr : nullptr);
    c.numels.push_back(t.numel);
  }
  return c;
}

// An optional list (nullptr: absent), e.g. the half model copy.
inline Checked check_optional(const ViewList* ts, const char* name, const Checked& like) {
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

// f(begin, end) over [0, n) on torch's thread pool, through the binding (the call costs one
// indirect call per thread, not per element or chunk).
template <class F>
inline void parallel_for(int64_t n, const F& f) {
  binding().parallel(
      n, [](int64_t b, int64_t e, void* ctx) { (*static_cast<const F*>(ctx))(b, e); },
      const_cast<void*>(static_cast<const void*>(&f)));
}

inline int64_t num_threads() { return binding().num_threads(); }

// The multi-tensor driver: f(chunk_index, chunk) for every chunk of cs[lo, hi) (`total`: their
// elements), in parallel when there is enough work. Results that need reducing go into
// per-chunk slots and are summed in chunk order, so they do not depend on thread count.
//
// One parallel region per call, and each thread gets ONE contiguous run of chunks holding
// about total / threads elements. (at::parallel_for over the chunk indices splits by chunk
// COUNT: with a model's uneven tensor sizes one thread could get most of the elements and
// the other wait for it.) The chunk size itself only sets the granularity of that split and
// of the reductions, which keeps it out of the results' rounding being any different from
// before: chunks are still kChunk elements of one tensor.
template <class F>
inline void run_chunk_range(const std::vector<Chunk>& cs, size_t lo, size_t hi, int64_t total,
                            const F& f) {
  if (total < kSerialBelow || hi - lo < 2) {
    for (size_t i = lo; i < hi; ++i) f(i, cs[i]);
    store_fence();
    return;
  }
  const int64_t nt = std::min<int64_t>(num_threads(), static_cast<int64_t>(hi - lo));
  // first[t]: the first chunk of thread t (the first one that starts at or after t's share).
  std::vector<size_t> first(nt + 1, hi);
  first[0] = lo;
  int64_t seen = 0;
  int64_t t = 1;
  for (size_t i = lo; i < hi && t < nt; ++i) {
    while (t < nt && seen >= total * t / nt) first[t++] = i;
    seen += cs[i].n;
  }
  parallel_for(nt, [&](int64_t b, int64_t e) {
    for (int64_t w = b; w < e; ++w)
      for (size_t i = first[w]; i < first[w + 1]; ++i) f(i, cs[i]);
    store_fence();
  });
}

template <class F>
inline void run_chunks(const std::vector<Chunk>& cs, int64_t total, const F& f) {
  run_chunk_range(cs, 0, cs.size(), total, f);
}

// The last-level cache of the CPU, as the kernel describes it in sysfs (what lscpu prints):
// the size of cpu0's highest-level data or unified cache; 0 where sysfs has none. glibc's
// sysconf reads CPUID itself and can be far off in a virtual machine (an AMD EPYC VM with a
// 32 MiB L3 answered 320 MiB, so steps of up to 320 MB were not streamed), so it is only
// the fallback.
inline int64_t sysfs_cache_bytes() {
  int best_level = 0;
  int64_t best = 0;
  for (int i = 0; i < 16; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream level_f(dir + "level"), type_f(dir + "type"), size_f(dir + "size");
    int level = 0;
    std::string type, size;
    if (!(level_f >> level) || !(type_f >> type) || !(size_f >> size)) break;
    if (type == "Instruction" || level < best_level) continue;
    char* end = nullptr;
    const long long n = std::strtoll(size.c_str(), &end, 10);
    const int64_t unit = *end == 'K' ? 1024 : *end == 'M' ? 1 << 20 : *end == 'G' ? 1 << 30 : 1;
    if (n <= 0) continue;
    best_level = level;
    best = static_cast<int64_t>(n) * unit;
  }
  return best;
}

inline int64_t last_level_cache_bytes() {
  static const int64_t llc = [] {
    if (const int64_t from_sysfs = sysfs_cache_bytes(); from_sysfs > 0) return from_sysfs;
    long v = -1;
#ifdef _SC_LEVEL3_CACHE_SIZE
    v = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (v <= 0) v = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
    return v > 0 ? static_cast<int64_t>(v) : int64_t(32) << 20;  // unknown: assume 32 MiB
  }();
  return llc;
}

// The budget of cache_groups in bytes: half the last-level cache. AMP_CACHE_BLOCK (tests,
// benchmarks) sets it in bytes; 0 turns the grouping off (cache_groups then gives one group
// that does not fit, whatever its size).
inline int64_t cache_block_bytes() {
  if (const char* e = std::getenv("AMP_CACHE_BLOCK")) {
    char* end = nullptr;
    const long long v = std::strtoll(e, &end, 10);
    if (end != e && *end == '\0' && v >= 0) return static_cast<int64_t>(v);
  }
  return last_level_cache_bytes() / 2;
}

// Consecutive whole tensors in groups whose bytes (`bytes_per_element` of everything two
// passes over them touch) fit the cache budget: f(first_chunk, end_chunk, elements, fits) per
// group, in order. A tensor over the budget is a group of its own that does not fit. For ops
// with a per-tensor result between two passes (LAMB's trust ratio): a group's second pass
// finds in the cache what its first pass just touched.
template <class F>
inline void cache_groups(const std::vector<Chunk>& cs, int64_t bytes_per_element, const F& f) {
  const int64_t budget = cache_block_bytes();
  if (budget == 0) {
    int64_t total = 0;
    for (const Chunk& c : cs) total += c.n;
    if (!cs.empty()) f(size_t{0}, cs.size(), total, false);
    return;
  }
  size_t lo = 0;
  while (lo < cs.size()) {
    size_t hi = lo;
    int64_t elems = 0;
    while (hi < cs.size()) {  // add the next whole tensor while the group stays in budget
      size_t end = hi;
      int64_t n = 0;
      while (end < cs.size() && cs[end].tensor == cs[hi].tensor) n += cs[end++].n;
      if (hi > lo && (elems + n) * bytes_per_element > budget) break;
      elems += n;
      hi = end;
    }
    f(lo, hi, elems, elems * bytes_per_element <= budget);
    lo = hi;
  }
}

// Whether a step's half model copy should be written with non-temporal stores: when the
// arrays the step streams (`bytes`) exceed the last-level cache, the copy would be evicted
// before anything reads it again, so loading its lines first (write-allocate) is wasted.
// Below that, ordinary stores keep the copy in cache for the forward pass that follows.
inline bool stream_half(int64_t bytes) {
  if (const char* e = std::getenv("AMP_STREAM_HALF")) {  // benchmarks: force 0 or 1
    if (*e == '0') return false;
    if (*e == '1') return true;
  }
  return bytes > last_level_cache_bytes();
}

inline const std::vector<int> kF32Only = {amp_kernels::kF32};

}  // namespace amp_driver

// The ops of amp._C (ops.cpp), over Views: each binding converts its arguments and results.
// An optional list is a pointer (nullptr: None).
namespace amp_ops {
using amp_driver::View;
using amp_driver::ViewList;

struct L2Norm {
  double norm;              // of all tensors * scale
  std::vector<double> per;  // per-tensor norms (only when asked for)
  bool nonfinite;
};
struct NormFlag {
  double norm;
  bool nonfinite;
};

bool scale(const ViewList& in, const ViewList& out, double s);
bool axpby(const ViewList& xs, const ViewList& ys, const ViewList& out, double a, double b,
           int arg_to_check);
L2Norm l2norm(const ViewList& xs, double s, bool per_tensor);
void adam(const ViewList& grads, const ViewList& params, const ViewList& exp_avgs,
          const ViewList& exp_avg_sqs, const ViewList* model_params, double lr, double beta1,
          double beta2, double eps, int64_t step, bool adam_w_mode, bool bias_correction,
          double weight_decay, double grad_scale);
void sgd(const ViewList& grads, const ViewList& params, const ViewList* momentum_buffers,
         const ViewList* model_params, double lr, double momentum, double dampening,
         double weight_decay, bool nesterov, bool wd_after_momentum, bool first_run,
         double grad_scale);
// Returns the per-tensor trust ratios applied (float32 values).
std::vector<float> lamb(const ViewList& grads, const ViewList& params, const ViewList& exp_avgs,
                        const ViewList& exp_avg_sqs, const ViewList* model_params, double lr,
                        double beta1, double beta2, double eps, int64_t step,
                        bool bias_correction, double weight_decay, bool grad_averaging,
                        bool adam_w_mode, bool use_nvlamb, double grad_scale);
NormFlag scale_l2norm(const ViewList& in, const ViewList& out, double s);
void adagrad(const ViewList& grads, const ViewList& params, const ViewList& sums,
             const ViewList* model_params, double lr, double eps, double weight_decay,
             bool w_mode, double grad_scale);
void novograd(const ViewList& grads, const ViewList& params, const ViewList& exp_avgs,
              const ViewList* model_params, const View& grad_norms, double lr, double beta1,
              double beta2, double eps, int64_t step, bool bias_correction,
              double weight_decay, bool grad_averaging, int64_t moment_mode, int64_t norm_type,
              bool init_norms, double grad_scale);
double limit_probe(const ViewList& grads, const ViewList& params, const ViewList& exp_avgs,
                   const ViewList* exp_avg_sqs, const ViewList* model_params, int64_t passes);
int64_t parallel_threads_seen();
}  // namespace amp_ops
