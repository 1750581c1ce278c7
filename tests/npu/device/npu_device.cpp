// A test device for the `npu` out-of-tree backend path (see README.md beside this file).
//
// torch_npu reaches PyTorch through the PrivateUse1 dispatch key; this extension uses the
// very same key, with host memory standing in for device memory, so code written against
// `torch.device("npu")` (amp's, the tests') runs through the real dispatcher paths an
// Ascend build takes: a foreign allocator and device guard, `_copy_from` for every
// host<->device copy, an AutogradPrivateUse1/AutocastPrivateUse1 layer, and a backend that
// implements almost nothing itself (every other op goes through a boxed CPU fallback).
//
// What is implemented here, and why each one cannot go through the fallback:
//   allocator / empty / empty_strided: the fallback needs them to make device outputs.
//   _copy_from / _copy_from_and_resize: copy_ redispatches here for an unknown device
//     (and the fallback moves its results back to the device with them).
//   view / as_strided / _reshape_alias / unfold: views must alias device storage; a
//     fallback result would be a copy.
//   resize_ / set_: they change a tensor's own metadata and storage.
//   convolution(_backward)_overrideable: torch's defaults for an unknown backend raise.
// Everything runs synchronously on the calling thread: streams, events and
// synchronize() have nothing to wait for.

// No <torch/extension.h> and no pybind11: parsing them alone costs most of a minute on
// CI's two cores. The few entry points Python needs are custom ops (torch.ops.ampforge_npu).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/EmptyTensor.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/autocast_mode.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/Allocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/library.h>
#include <torch/version.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

constexpr c10::DeviceType kNpu = c10::DeviceType::PrivateUse1;
// Two devices, so device indices, the guard and npu:0 <-> npu:1 copies are exercised.
constexpr c10::DeviceIndex kDeviceCount = 2;

// The current device is per thread, as for CUDA/Ascend (autograd's device threads set
// it through the guard below).
thread_local c10::DeviceIndex current_device = 0;

// Live bytes and op counters, read by the tests to prove that a path was really taken.
std::atomic<int64_t> live_bytes{0};
std::atomic<int64_t> fallback_calls{0};

// Saturation mode, as on Ascend hardware whose float arithmetic saturates (torch_npu's
// is_support_inf_nan() is False there): off by default. When on, every floating-point result
// an op writes on the device that is not finite is replaced -- +-inf by the largest finite
// value of its sign (+-65504 in fp16), NaN by 0 -- and the device's overflow flag is raised;
// only clearing it lowers it. One flag for the whole process (both devices): the tests read
// it from one thread after the backward pass, as torch_npu's get_npu_overflow_flag() does.
std::atomic<bool> saturation_mode{false};
std::atomic<bool> overflow_flag{false};

void check_index(c10::DeviceIndex index) {
  TORCH_CHECK(index >= 0 && index < kDeviceCount, "npu: invalid device index ", int(index),
              " (this test device has ", int(kDeviceCount), " devices)");
}

// ---------------------------------------------------------------- device guard
struct NpuGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType static_type = kNpu;

  c10::DeviceType type() const override { return kNpu; }

  c10::Device exchangeDevice(c10::Device device) const override {
    c10::Device old = getDevice();
    setDevice(device);
    return old;
  }
  c10::Device getDevice() const override { return {kNpu, current_device}; }
  void setDevice(c10::Device device) const override {
    TORCH_CHECK(device.type() == kNpu, "npu guard asked to set device ", device);
    if (device.index() < 0) {  // "npu" without an index means the current one
      return;
    }
    check_index(device.index());
    current_device = device.index();
  }
  void uncheckedSetDevice(c10::Device device) const noexcept override {
    if (device.index() >= 0 && device.index() < kDeviceCount) {
      current_device = device.index();
    }
  }
  // One default stream per device; all work is synchronous, so events are no-ops that are
  // always complete (autograd records and blocks on them when streams differ).
  // noexcept: torch <= 2.6 declares these two noexcept (an override may not be looser), later
  // lines do not (an override may be stricter); so the one signature fits every torch line.
  c10::Stream getStream(c10::Device device) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, device);
  }
  c10::Stream exchangeStream(c10::Stream stream) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, stream.device());
  }
  c10::DeviceIndex deviceCount() const noexcept override { return kDeviceCount; }
  void record(void** /*event*/, const c10::Stream& /*stream*/, const c10::DeviceIndex /*index*/,
              const c10::EventFlag /*flag*/) const override {}
  void block(void* /*event*/, const c10::Stream& /*stream*/) const override {}
  bool queryEvent(void* /*event*/) const override { return true; }
  void destroyEvent(void* /*event*/, const c10::DeviceIndex /*index*/) const noexcept override {}
  bool queryStream(const c10::Stream& /*stream*/) const override { return true; }
  void synchronizeStream(const c10::Stream& /*stream*/) const override {}
  // No `override`: torch 2.1 has no synchronizeDevice (an ordinary member there).
  void synchronizeDevice(const c10::DeviceIndex /*index*/) const {}
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, NpuGuardImpl);

// ---------------------------------------------------------------- allocator
void npu_free(void* ctx) {
  if (ctx == nullptr) {
    return;
  }
  // The size travels in a header in front of the block so that live_bytes stays exact.
  auto* base = static_cast<char*>(ctx) - 64;
  int64_t nbytes = 0;
  std::memcpy(&nbytes, base, sizeof(nbytes));
  live_bytes -= nbytes;
  c10::free_cpu(base);
}

// No `override` on these: torch 2.1's Allocator::allocate is const (later: not const) and it
// has no copy_data; both overloads are here, each overriding where torch declares it.
struct NpuAllocator final : public c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) const { return allocate_block(nbytes); }
  c10::DataPtr allocate(size_t nbytes) { return allocate_block(nbytes); }
  c10::DataPtr allocate_block(size_t nbytes) const {
    c10::Device device(kNpu, current_device);
    if (nbytes == 0) {
      return {nullptr, nullptr, &npu_free, device};
    }
    // 64 bytes of header keep the block 64-byte aligned, as the CPU allocator's are.
    auto* base = static_cast<char*>(c10::alloc_cpu(nbytes + 64));
    int64_t size = static_cast<int64_t>(nbytes);
    std::memcpy(base, &size, sizeof(size));
    live_bytes += size;
    void* data = base + 64;
    return {data, data, &npu_free, device};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &npu_free; }
  void copy_data(void* dest, const void* src, std::size_t count) const {
    std::memcpy(dest, src, count);  // host memory: what torch's default_copy_data does
  }
};

NpuAllocator npu_allocator;
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &npu_allocator);

// ---------------------------------------------------------------- hooks
// Registered so that torch's generic accelerator code (torch.accelerator, autograd's
// device bookkeeping, UntypedStorage.resize_) can ask about the device. torch 2.1's
// PrivateUse1HooksInterface declares none of these (only getDefaultGenerator and
// getDeviceFromPtr): there they are ordinary members, and `override` is checked from torch
// 2.6 on (the oldest line after 2.1 the device is compiled against; 2.2-2.5 have some).
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 6)
#define NPU_HOOK_OVERRIDE override
#else
#define NPU_HOOK_OVERRIDE
#endif
struct NpuHooks final : public at::PrivateUse1HooksInterface {
  // No `override`: torch <= 2.6's PrivateUse1 hooks have no isBuilt/isAvailable.
  bool isBuilt() const { return true; }
  bool isAvailable() const { return true; }
  bool hasPrimaryContext(c10::DeviceIndex /*index*/) const NPU_HOOK_OVERRIDE { return true; }
  c10::DeviceIndex deviceCount() const NPU_HOOK_OVERRIDE { return kDeviceCount; }
  void setCurrentDevice(c10::DeviceIndex index) const NPU_HOOK_OVERRIDE {
    check_index(index);
    current_device = index;
  }
  c10::DeviceIndex getCurrentDevice() const NPU_HOOK_OVERRIDE { return current_device; }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex index) const NPU_HOOK_OVERRIDE {
    c10::DeviceIndex old = current_device;
    setCurrentDevice(index);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex index) const NPU_HOOK_OVERRIDE {
    return exchangeDevice(index);
  }
  // Said plainly instead of torch's generic "implement the hook" message.
  c10::Allocator* getPinnedMemoryAllocator() const NPU_HOOK_OVERRIDE {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "the npu test device has no pinned host memory");
  }
  at::Generator getNewGenerator(c10::DeviceIndex /*index*/) const NPU_HOOK_OVERRIDE {
    TORCH_CHECK_NOT_IMPLEMENTED(false,
                                "the npu test device has no generator of its own: random ops "
                                "draw from the CPU generator");
  }
  void resizePrivateUse1Bytes(const c10::Storage& storage,
                              size_t newsize) const NPU_HOOK_OVERRIDE {
    // Device memory is host memory here: the CPU resize (allocate through the storage's
    // own allocator, copy, swap) is exactly right.
    at::native::resize_bytes_cpu(storage.unsafeGetStorageImpl(), newsize);
  }
};
#undef NPU_HOOK_OVERRIDE

// ---------------------------------------------------------------- factory ops
c10::DeviceGuard guard_for(c10::optional<c10::Device> device) {
  c10::Device d = device.value_or(c10::Device(kNpu, current_device));
  TORCH_CHECK(d.type() == kNpu, "npu kernel called for device ", d);
  if (d.index() < 0) {
    d = c10::Device(kNpu, current_device);
  }
  return c10::DeviceGuard(d);
}

at::Tensor npu_empty(c10::IntArrayRef size, c10::optional<c10::ScalarType> dtype,
                     c10::optional<c10::Layout> layout, c10::optional<c10::Device> device,
                     c10::optional<bool> pin_memory,
                     c10::optional<c10::MemoryFormat> memory_format) {
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided,
              "npu: only strided tensors");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "npu: device memory cannot be pinned");
  auto guard = guard_for(device);
  return at::detail::empty_generic(size, &npu_allocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor npu_empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                             c10::optional<c10::ScalarType> dtype,
                             c10::optional<c10::Layout> layout,
                             c10::optional<c10::Device> device, c10::optional<bool> pin_memory) {
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided,
              "npu: only strided tensors");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "npu: device memory cannot be pinned");
  auto guard = guard_for(device);
  return at::detail::empty_strided_generic(size, stride, &npu_allocator,
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

// ---------------------------------------------------------------- copies
// A CPU tensor over the same host bytes as `t` (no copy), so that the CPU copy kernel
// does the work: dtype conversion, strides, broadcasting, overlap checks.
at::Tensor host_alias(const at::Tensor& t) {
  if (t.device().type() != kNpu) {
    return t;
  }
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(),
                       t.options().device(c10::kCPU));
}

// ---------------------------------------------------------------- saturation
// Saturates a device tensor the device has just written (see saturation_mode above). The
// work is done on a host alias, by CPU kernels: nothing here re-enters the npu dispatcher.
void saturate(const at::Tensor& t) {
  if (!t.defined() || t.device().type() != kNpu || t.numel() == 0) {
    return;
  }
  const auto dtype = t.scalar_type();
  if (dtype != at::kHalf && dtype != at::kBFloat16 && dtype != at::kFloat &&
      dtype != at::kDouble) {
    return;
  }
  at::Tensor host = host_alias(t);
  if (host.isfinite().all().item<bool>()) {
    return;
  }
  overflow_flag = true;
  if (at::has_internal_overlap(host) == at::MemOverlap::Yes) {
    return;  // an expanded tensor: its elements cannot be written one by one
  }
  double top = 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "npu_saturate", [&] {
    top = static_cast<double>(std::numeric_limits<scalar_t>::max());
  });
  host.nan_to_num_(0.0, top, -top);
}

void collect_tensors(const c10::IValue& value, std::vector<at::Tensor>& out) {
  if (value.isTensor()) {
    out.push_back(value.toTensor());
  } else if (value.isTensorList()) {
    for (const at::Tensor& t : value.toTensorList()) {
      out.push_back(t);
    }
  }
}

at::Tensor npu_copy_from(const at::Tensor& self, const at::Tensor& dst, bool /*non_blocking*/) {
  // `self` is the source (the schema's naming): copy_ calls _copy_from(src, dst).
  TORCH_CHECK(self.device().type() == kNpu || self.is_cpu(), "npu: cannot copy from ",
              self.device());
  TORCH_CHECK(dst.device().type() == kNpu || dst.is_cpu(), "npu: cannot copy to ", dst.device());
  if (dst.numel() == 0) {
    return dst;
  }
  host_alias(dst).copy_(host_alias(self));
  // A conversion can overflow (an fp32 value beyond fp16's range); a plain copy cannot.
  if (saturation_mode && self.scalar_type() != dst.scalar_type()) {
    saturate(dst);
  }
  return dst;
}

at::Tensor npu_copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  // The fallback's way back for out= arguments: dst takes self's shape, then its values.
  if (dst.sizes() != self.sizes()) {
    dst.resize_(self.sizes());
  }
  return npu_copy_from(self, dst, false);
}

// ---------------------------------------------------------------- metadata ops
const at::Tensor& npu_resize_(const at::Tensor& self, c10::IntArrayRef size,
                              c10::optional<c10::MemoryFormat> memory_format) {
  // The CPU resize grows the storage through the storage's own allocator (ours).
  return at::native::resize_(self, size, memory_format);
}

at::Tensor& npu_set_storage_offset(at::Tensor& self, c10::Storage source, int64_t offset,
                                   c10::IntArrayRef size, c10::IntArrayRef stride) {
  TORCH_CHECK(source.device().type() == kNpu, "npu: set_ to a storage on ", source.device());
  return at::native::set_storage_cpu_(self, std::move(source), offset, size, stride);
}

at::Tensor& npu_set_storage(at::Tensor& self, c10::Storage source) {
  const int64_t numel = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return self.set_(std::move(source), 0, {numel}, {});
}

at::Tensor& npu_set_tensor(at::Tensor& self, const at::Tensor& source) {
  return at::native::set_tensor_(self, source);
}

at::Tensor& npu_set_empty(at::Tensor& self) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, &npu_allocator, /*resizable=*/true);
  return self.set_(std::move(storage), 0, {0}, {});
}

// ---------------------------------------------------------------- float16 the CPU lacks
// torch 2.1's CPU has no float16 kernel for matrix products, convolutions, softmax, the norms,
// pooling, bernoulli, cumsum, ... (each raises "... not implemented for 'Half'"), and no
// bfloat16 one for a few (mse_loss). An NPU computes those with float32 arithmetic and writes
// the half type (its cube unit accumulates matrix products in fp32 and rounds the result
// once; its vector kernels work in fp32 too), and so does the device where the CPU refuses:
// the half-type arguments are widened to float32, the CPU kernel runs on them, and what the op
// writes is rounded to the half type once. Where the CPU has the kernel (torch >= 2.2 has all
// of these, and its float16 matrix products accumulate in fp32 too) that kernel runs, as
// before: nothing changes on those torches. Which operators refuse which type is learnt per
// operator, on its first refusal (the failed try has touched no device tensor: the fallback
// works on host copies and copies back only after the kernel returned).
std::mutex refused_mutex;
std::unordered_map<c10::OperatorName, unsigned> refused;  // bit 1 << dtype; refused_mutex
std::atomic<int64_t> half_in_fp32_calls{0};               // ops computed so (read by tests)

bool is_half_type(c10::ScalarType t) { return t == at::kHalf || t == at::kBFloat16; }

// The half type a CPU kernel's error says it has no kernel for; Undefined for other errors.
c10::ScalarType refused_type(const c10::Error& e) {
  const std::string message = e.what_without_backtrace();
  if (message.find("not implemented for 'Half'") != std::string::npos) {
    return at::kHalf;
  }
  if (message.find("not implemented for 'BFloat16'") != std::string::npos) {
    return at::kBFloat16;
  }
  return c10::ScalarType::Undefined;
}

bool is_type(const at::Tensor& t, c10::ScalarType type) {
  return t.defined() && t.scalar_type() == type;
}

bool has_argument_of(const torch::jit::Stack& stack, size_t first_arg, c10::ScalarType type) {
  for (size_t i = first_arg; i < stack.size(); ++i) {
    const auto& v = stack[i];
    if (v.isTensor() && is_type(v.toTensor(), type)) {
      return true;
    }
    if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) {
        if (is_type(t, type)) {
          return true;
        }
      }
    }
  }
  return false;
}

// native_batch_norm updates running_mean and running_var (arguments 3 and 4) in place, but its
// schema does not mark them as written (`Tensor?`), so the fallback, which copies back only
// what the schema says an op writes, would leave the device's statistics as they were. They
// go to the CPU kernel as host aliases of the device tensors instead: it updates the device's
// memory itself.
bool writes_unmarked(const c10::OperatorHandle& op, size_t index) {
  return (index == 3 || index == 4) && op.schema().name() == "aten::native_batch_norm";
}

void alias_unmarked_writes(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                           size_t first_arg) {
  for (size_t i = first_arg; i < stack->size(); ++i) {
    c10::IValue& v = (*stack)[i];
    if (writes_unmarked(op, i - first_arg) && v.isTensor() && v.toTensor().defined()) {
      v = host_alias(v.toTensor());
    }
  }
}

// Whether an argument is a ScalarType (or an optional one): it travels as an int.
bool names_type(const c10::Argument& argument) {
  c10::TypePtr type = argument.real_type();
  if (auto optional = type->cast<c10::OptionalType>()) {
    type = optional->getElementType();
  }
  return type->kind() == c10::TypeKind::ScalarTypeType;
}

// The op with its `low`-typed arguments (and dtype arguments naming `low`) widened to
// float32; then what it wrote rounded to `low`: the `low` arguments it mutates (in-place and
// out= ops), and its float32 results. A float32 result is rounded unless the op also took
// other floating-point inputs (float16 activations with float32 batch-norm parameters, say);
// then only the results shaped as its first `low` input are (the activations, not the float32
// statistics).
void run_in_fp32(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::ScalarType low) {
  ++half_in_fp32_calls;
  const auto& schema = op.schema();
  const auto& arguments = schema.arguments();
  const size_t first_arg = stack->size() - arguments.size();
  std::vector<std::pair<at::Tensor, at::Tensor>> written;  // (`low` argument, its stand-in)
  bool mixed = false;
  c10::optional<std::vector<int64_t>> low_shape;
  auto widen = [&](const at::Tensor& t, bool write) -> at::Tensor {
    if (!is_type(t, low)) {
      if (!write && t.defined() && t.is_floating_point()) {
        mixed = true;
      }
      return t;
    }
    at::Tensor wide = t.to(at::kFloat);
    if (write) {
      written.emplace_back(t, wide);
    } else if (!low_shape) {
      low_shape = t.sizes().vec();
    }
    return wide;
  };
  for (size_t i = 0; i < arguments.size(); ++i) {
    const auto* alias = arguments[i].alias_info();
    const bool write = (alias != nullptr && alias->isWrite()) || writes_unmarked(op, i);
    c10::IValue& v = (*stack)[first_arg + i];
    if (names_type(arguments[i]) && v.isInt() && v.toInt() == static_cast<int64_t>(low)) {
      // A dtype argument naming `low` (_log_softmax_backward_data's input_dtype, say): the
      // computation is float32's now.
      v = static_cast<int64_t>(at::kFloat);
    } else if (v.isTensor()) {
      v = widen(v.toTensor(), write);
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> wide;
      for (const at::Tensor& t : v.toTensorList()) {
        wide.push_back(widen(t, write));
      }
      v = wide;
    }
  }
  at::native::cpu_fallback(op, stack);
  for (auto& [original, wide] : written) {
    original.copy_(wide);  // rounded once (and saturated, in saturation mode: _copy_from)
  }
  auto narrow = [&](const at::Tensor& t) -> at::Tensor {
    if (!t.defined()) {
      return t;
    }
    for (const auto& [original, wide] : written) {
      if (wide.is_same(t)) {
        return original;  // an in-place or out= op returns its argument
      }
    }
    if (t.scalar_type() != at::kFloat ||
        (mixed && !(low_shape && t.sizes().equals(*low_shape)))) {
      return t;
    }
    return t.to(low);
  };
  const size_t returns = schema.returns().size();
  for (size_t i = stack->size() - returns; i < stack->size(); ++i) {
    c10::IValue& r = (*stack)[i];
    if (r.isTensor()) {
      r = narrow(r.toTensor());
    } else if (r.isTensorList()) {
      c10::List<at::Tensor> narrowed;
      for (const at::Tensor& t : r.toTensorList()) {
        narrowed.push_back(narrow(t));
      }
      r = narrowed;
    }
  }
}

// torch 2.1's cpu_fallback moves Tensor and Tensor[] arguments to the CPU but not Tensor?[]
// ones (index's indices), which the CPU kernel then refuses as being on another device:
// they are moved here (later torches move them themselves; a CPU index is left as it is).
void move_optional_tensor_lists_to_cpu(torch::jit::Stack* stack, size_t first_arg) {
  for (size_t i = first_arg; i < stack->size(); ++i) {
    c10::IValue& v = (*stack)[i];
    if (!v.isOptionalTensorList()) {
      continue;
    }
    c10::List<c10::optional<at::Tensor>> moved;
    for (const c10::optional<at::Tensor>& t : v.toOptionalTensorList()) {
      if (t.has_value() && t->defined() && t->device().type() == kNpu) {
        moved.push_back(t->cpu());
      } else {
        moved.push_back(t);
      }
    }
    v = moved;
  }
}

// The CPU fallback, or the float32 computation above for a half type the CPU has no kernel for.
void run_on_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t n = op.schema().arguments().size();
  const size_t first_arg = stack->size() - n;
  move_optional_tensor_lists_to_cpu(stack, first_arg);
  alias_unmarked_writes(op, stack, first_arg);
  const bool has_half = has_argument_of(*stack, first_arg, at::kHalf);
  const bool has_bf16 = has_argument_of(*stack, first_arg, at::kBFloat16);
  if (!has_half && !has_bf16) {
    at::native::cpu_fallback(op, stack);
    return;
  }
  unsigned known = 0;
  {
    std::lock_guard<std::mutex> lock(refused_mutex);
    auto it = refused.find(op.operator_name());
    if (it != refused.end()) {
      known = it->second;
    }
  }
  for (c10::ScalarType low : {at::kHalf, at::kBFloat16}) {
    if ((known & (1u << static_cast<int>(low))) != 0 && has_argument_of(*stack, first_arg, low)) {
      run_in_fp32(op, stack, low);
      return;
    }
  }
  const std::vector<c10::IValue> args(stack->begin() + static_cast<std::ptrdiff_t>(first_arg),
                                      stack->end());
  c10::ScalarType low = c10::ScalarType::Undefined;
  try {
    at::native::cpu_fallback(op, stack);
    return;
  } catch (const c10::Error& e) {
    low = refused_type(e);
    // Only a refusal of a half type the op was given: anything else is the op's own error.
    if (low == c10::ScalarType::Undefined || !(low == at::kHalf ? has_half : has_bf16)) {
      throw;
    }
  }
  {
    std::lock_guard<std::mutex> lock(refused_mutex);
    refused[op.operator_name()] |= 1u << static_cast<int>(low);
  }
  stack->resize(first_arg);  // what the failed try left of its arguments
  stack->insert(stack->end(), args.begin(), args.end());
  run_in_fp32(op, stack, low);
}

// ---------------------------------------------------------------- convolution
// at::convolution sends an unknown backend to convolution(_backward)_overrideable, whose
// default kernels only raise (a real backend provides them, as torch_npu does). Here: the
// CPU convolution on host copies of the arguments.
// The CPU convolutions' refusals (torch 2.1 has no float16 ones), bit 1 << dtype: then, as
// above, float32 arithmetic on widened arguments and a result in the half type.
std::atomic<unsigned> conv_refused{0};

// The half type all of `ts` (the defined ones) have; Undefined when they have none or differ.
c10::ScalarType common_half_type(std::initializer_list<const at::Tensor*> ts) {
  c10::ScalarType type = c10::ScalarType::Undefined;
  for (const at::Tensor* t : ts) {
    if (!t->defined()) {
      continue;
    }
    if (!is_half_type(t->scalar_type()) ||
        (type != c10::ScalarType::Undefined && t->scalar_type() != type)) {
      return c10::ScalarType::Undefined;
    }
    type = t->scalar_type();
  }
  return type;
}

// Runs `run(wide)` (wide: on float32 copies of the arguments) the way run_on_cpu does.
template <typename Run>
auto run_conv(c10::ScalarType low, Run run) -> decltype(run(false)) {
  const unsigned bit = low == c10::ScalarType::Undefined ? 0u : 1u << static_cast<int>(low);
  if (bit != 0 && (conv_refused & bit) != 0) {
    ++half_in_fp32_calls;
    return run(true);
  }
  try {
    return run(false);
  } catch (const c10::Error& e) {
    if (bit == 0 || refused_type(e) != low) {
      throw;
    }
  }
  conv_refused |= bit;
  ++half_in_fp32_calls;
  return run(true);
}

at::Tensor npu_convolution(const at::Tensor& input, const at::Tensor& weight,
                           const c10::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                           c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                           c10::IntArrayRef output_padding, int64_t groups) {
  const at::Tensor no_bias;
  const at::Tensor& b = bias.has_value() ? *bias : no_bias;
  const c10::ScalarType low = common_half_type({&input, &weight, &b});
  auto out = run_conv(low, [&](bool wide) {
    auto host = [&](const at::Tensor& t) { return wide ? t.cpu().to(at::kFloat) : t.cpu(); };
    c10::optional<at::Tensor> cpu_bias;
    if (b.defined()) {
      cpu_bias = host(b);
    }
    auto result = at::convolution(host(input), host(weight), cpu_bias, stride, padding,
                                  dilation, transposed, output_padding, groups);
    return wide ? result.to(low) : result;
  });
  out = out.to(input.device());
  if (saturation_mode) {
    saturate(out);
  }
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> npu_convolution_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
    c10::IntArrayRef output_padding, int64_t groups, std::array<bool, 3> output_mask) {
  const int64_t out_channels = transposed ? weight.size(1) * groups : weight.size(0);
  const c10::ScalarType low = common_half_type({&grad_output, &input, &weight});
  auto grads = run_conv(low, [&](bool wide) {
    auto host = [&](const at::Tensor& t) { return wide ? t.cpu().to(at::kFloat) : t.cpu(); };
    auto result = at::convolution_backward(host(grad_output), host(input), host(weight),
                                           c10::IntArrayRef{out_channels}, stride, padding,
                                           dilation, transposed, output_padding, groups,
                                           output_mask);
    if (wide) {
      auto narrow = [&](const at::Tensor& t) { return t.defined() ? t.to(low) : t; };
      return std::make_tuple(narrow(std::get<0>(result)), narrow(std::get<1>(result)),
                             narrow(std::get<2>(result)));
    }
    return result;
  });
  auto back = [&](const at::Tensor& t) {
    if (!t.defined()) {
      return t;
    }
    auto moved = t.to(input.device());
    if (saturation_mode) {
      saturate(moved);
    }
    return moved;
  };
  return {back(std::get<0>(grads)), back(std::get<1>(grads)), back(std::get<2>(grads))};
}

// ---------------------------------------------------------------- GradScaler's kernels
// torch_npu has its own kernels for GradScaler's two ops; the device delegates them to the CPU
// ones, which torch has from 2.3 on. Where the CPU has none (torch 2.1, 2.2) the device has
// them itself (registered by init(), then only), with the arithmetic of torch's CUDA and CPU
// kernels: each gradient is checked for non-finite values, then multiplied by inv_scale in
// float32 (left alone when inv_scale is 1) and rounded once to its own type.
void npu_amp_unscale_(at::TensorList grads, at::Tensor& found_inf, const at::Tensor& inv_scale) {
  TORCH_CHECK(inv_scale.numel() == 1 && inv_scale.scalar_type() == at::kFloat,
              "npu: inv_scale must be a 1-element float tensor");
  TORCH_CHECK(found_inf.numel() == 1 && found_inf.scalar_type() == at::kFloat,
              "npu: found_inf must be a 1-element float tensor");
  const float inv = host_alias(inv_scale).item<float>();
  bool non_finite = false;
  for (const at::Tensor& g : grads) {
    TORCH_CHECK(g.device().type() == kNpu, "npu: a gradient on ", g.device());
    TORCH_CHECK(g.is_floating_point(), "npu: a gradient of type ", g.scalar_type());
    if (g.numel() == 0) {
      continue;
    }
    at::Tensor host = host_alias(g);
    if (!host.isfinite().all().item<bool>()) {
      non_finite = true;
    }
    if (inv != 1.0f) {
      at::Tensor wide = host.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
      host.copy_(wide.mul_(inv));
    }
    if (saturation_mode) {
      saturate(g);
    }
  }
  if (non_finite) {
    host_alias(found_inf).fill_(1.0);
  }
}

at::Tensor& npu_amp_update_scale_(at::Tensor& scale, at::Tensor& growth_tracker,
                                  const at::Tensor& found_inf, double growth_factor,
                                  double backoff_factor, int64_t growth_interval) {
  TORCH_CHECK(scale.numel() == 1 && scale.scalar_type() == at::kFloat,
              "npu: the scale must be a 1-element float tensor");
  TORCH_CHECK(growth_tracker.numel() == 1 && growth_tracker.scalar_type() == at::kInt,
              "npu: growth_tracker must be a 1-element int tensor");
  TORCH_CHECK(found_inf.numel() == 1 && found_inf.scalar_type() == at::kFloat,
              "npu: found_inf must be a 1-element float tensor");
  float* current = host_alias(scale).data_ptr<float>();
  int* tracker = host_alias(growth_tracker).data_ptr<int>();
  if (host_alias(found_inf).item<float>() != 0.0f) {
    *current = static_cast<float>(*current * backoff_factor);
    *tracker = 0;
  } else {
    const int successful = *tracker + 1;
    if (successful == growth_interval) {
      const auto grown = static_cast<float>(*current * growth_factor);
      if (std::isfinite(grown)) {
        *current = grown;
      }
      *tracker = 0;
    } else {
      *tracker = successful;
    }
  }
  return scale;
}

// Registers the two above where the CPU has no kernel for them (once, from init()).
void register_grad_scaler_kernels_the_cpu_lacks() {
  static std::unique_ptr<torch::Library> lib;
  if (lib) {
    return;
  }
  lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten",
                                         c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  auto cpu_lacks = [](const char* name) {
    auto op = c10::Dispatcher::singleton().findOp({name, ""});
    return op && !op->hasKernelForDispatchKey(c10::DispatchKey::CPU);
  };
  if (cpu_lacks("aten::_amp_foreach_non_finite_check_and_unscale_")) {
    lib->impl("_amp_foreach_non_finite_check_and_unscale_", TORCH_FN(npu_amp_unscale_));
  }
  if (cpu_lacks("aten::_amp_update_scale_")) {
    lib->impl("_amp_update_scale_", TORCH_FN(npu_amp_update_scale_));
  }
}

// ---------------------------------------------------------------- fallback
void npu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  ++fallback_calls;
  if (!saturation_mode) {
    run_on_cpu(op, stack);
    return;
  }
  // What the op writes: its mutable arguments (in-place and out= ops, _foreach_*_ lists),
  // taken before the fallback consumes the arguments, and its results.
  const auto& schema = op.schema();
  const auto& arguments = schema.arguments();
  std::vector<at::Tensor> written;
  const size_t first_arg = stack->size() - arguments.size();
  for (size_t i = 0; i < arguments.size(); ++i) {
    const auto* alias = arguments[i].alias_info();
    if (alias != nullptr && alias->isWrite()) {
      collect_tensors((*stack)[first_arg + i], written);
    }
  }
  run_on_cpu(op, stack);
  const size_t returns = schema.returns().size();
  for (size_t i = stack->size() - returns; i < stack->size(); ++i) {
    collect_tensors((*stack)[i], written);
  }
  for (const auto& t : written) {
    saturate(t);
  }
}

// Ops that CPU implements directly but that also have a generic "structured" kernel
// (CompositeExplicitAutogradNonFunctional: allocate the output from shape inference, then
// call the op's out= variant). Left alone, a backend without its own kernel gets the
// generic one, and the fallback then runs the CPU out= kernel against an output whose
// shape was inferred for the functional op: results are right, but e.g. mse_loss warns
// that it resized its output. CUDA and torch_npu register their own kernels for these
// ops; here each one goes straight to the fallback, so the CPU kernel runs as it would on
// CPU. Done at install time (not in a static initializer) so that every aten operator
// is already known.
void route_cpu_kernels_to_fallback() {
  static std::unique_ptr<torch::Library> lib;
  if (lib) {
    return;
  }
  lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten",
                                         c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const auto& name : dispatcher.getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) {
      continue;
    }
    auto op = dispatcher.findOp(name);
    if (!op || !op->hasKernelForDispatchKey(c10::DispatchKey::CPU) ||
        !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional) ||
        op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) {
      continue;
    }
    lib->impl(c10::toString(name).c_str(),
              torch::CppFunction::makeFromBoxedFunction<&npu_fallback>());
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", &npu_empty);
  m.impl("empty_strided", &npu_empty_strided);
  m.impl("_copy_from", &npu_copy_from);
  m.impl("_copy_from_and_resize", &npu_copy_from_and_resize);
  m.impl("resize_", &npu_resize_);
  m.impl("set_.source_Storage_storage_offset", &npu_set_storage_offset);
  m.impl("set_.source_Storage", &npu_set_storage);
  m.impl("set_.source_Tensor", &npu_set_tensor);
  m.impl("set_", &npu_set_empty);
  // The generic TensorImpl view kernels are device-independent: they share the storage.
  m.impl("view", &at::native::view);
  m.impl("as_strided", &at::native::as_strided_tensorimpl);
  m.impl("_reshape_alias", &at::native::_reshape_alias);
  m.impl("unfold", &at::native::unfold);
  m.impl("convolution_overrideable", &npu_convolution);
  m.impl("convolution_backward_overrideable", &npu_convolution_backward);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&npu_fallback>());
}

// ---------------------------------------------------------------- autocast
// Autocast for the device: the op lists and cast policies torch itself applies to CUDA
// (ATen/autocast_mode.h): matmul-like ops and convolutions to the autocast dtype, the
// numerically sensitive ones (softmax, norms, losses) to fp32, the mixed-input ones to the
// widest type. Ops not listed pass through untouched.
namespace {
at::Tensor npu_binary_cross_entropy_banned(const at::Tensor&, const at::Tensor&,
                                           const c10::optional<at::Tensor>&, int64_t) {
  // Same refusal as CUDA's autocast: the op is unsafe in half precision.
  TORCH_CHECK(false,
              "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to "
              "autocast on npu; use binary_cross_entropy_with_logits / BCEWithLogitsLoss.");
}
}  // namespace

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

// torch >= 2.4 names its op lists (AT_FORALL_*, the ones CUDA's autocast registers); torch 2.1
// has none, so the same lists are spelled out below, minus what 2.1 does not have (rms_norm).
#ifdef AT_FORALL_LOWER_PRECISION_FP
TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  // The op lists name their types unqualified (they are written for ATen's own namespace).
  using namespace at;
#define NPU_LOWER_PRECISION_FP(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define NPU_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define NPU_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define NPU_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_LOWER_PRECISION_FP(NPU_LOWER_PRECISION_FP)
  AT_FORALL_FP32(NPU_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(NPU_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(NPU_PROMOTE)
#undef NPU_LOWER_PRECISION_FP
#undef NPU_FP32
#undef NPU_FP32_SET_OPT_DTYPE
#undef NPU_PROMOTE
  m.impl(TORCH_SELECTIVE_NAME("aten::binary_cross_entropy"),
         TORCH_FN((&npu_binary_cross_entropy_banned)));
}
#else
TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  using namespace at;
#define NPU_K(OP, POLICY) KERNEL_PRIVATEUSEONE(OP, POLICY)
#define NPU_K2(OP, OVERLOAD, POLICY) KERNEL_PRIVATEUSEONE2(OP, OVERLOAD, POLICY)
  // lower_precision_fp
  NPU_K2(_convolution, deprecated, lower_precision_fp)
  NPU_K(_convolution, lower_precision_fp)
  NPU_K(conv1d, lower_precision_fp)
  NPU_K(conv2d, lower_precision_fp)
  NPU_K(conv3d, lower_precision_fp)
  NPU_K(conv_tbc, lower_precision_fp)
  NPU_K(conv_transpose1d, lower_precision_fp)
  NPU_K2(conv_transpose2d, input, lower_precision_fp)
  NPU_K2(conv_transpose3d, input, lower_precision_fp)
  NPU_K(convolution, lower_precision_fp)
  NPU_K(prelu, lower_precision_fp)
  NPU_K(addmm, lower_precision_fp)
  NPU_K(addmv, lower_precision_fp)
  NPU_K(addr, lower_precision_fp)
  NPU_K(matmul, lower_precision_fp)
  NPU_K(einsum, lower_precision_fp)
  NPU_K(mm, lower_precision_fp)
  NPU_K(mv, lower_precision_fp)
  NPU_K(linalg_vecdot, lower_precision_fp)
  NPU_K(linear, lower_precision_fp)
  NPU_K(addbmm, lower_precision_fp)
  NPU_K(baddbmm, lower_precision_fp)
  NPU_K(bmm, lower_precision_fp)
  NPU_K(chain_matmul, lower_precision_fp)
  NPU_K(linalg_multi_dot, lower_precision_fp)
  NPU_K(_thnn_fused_lstm_cell, lower_precision_fp)
  NPU_K(_thnn_fused_gru_cell, lower_precision_fp)
  NPU_K(lstm_cell, lower_precision_fp)
  NPU_K(gru_cell, lower_precision_fp)
  NPU_K(rnn_tanh_cell, lower_precision_fp)
  NPU_K(rnn_relu_cell, lower_precision_fp)
  NPU_K(_scaled_dot_product_flash_attention, lower_precision_fp)
  NPU_K(scaled_dot_product_attention, lower_precision_fp)
  // fp32
  NPU_K(acos, fp32)
  NPU_K(asin, fp32)
  NPU_K(cosh, fp32)
  NPU_K(erfinv, fp32)
  NPU_K(exp, fp32)
  NPU_K(expm1, fp32)
  NPU_K(log, fp32)
  NPU_K(log10, fp32)
  NPU_K(log2, fp32)
  NPU_K(log1p, fp32)
  NPU_K(reciprocal, fp32)
  NPU_K(rsqrt, fp32)
  NPU_K(sinh, fp32)
  NPU_K(tan, fp32)
  NPU_K2(pow, Tensor_Scalar, fp32)
  NPU_K2(pow, Tensor_Tensor, fp32)
  NPU_K2(pow, Scalar, fp32)
  NPU_K(softplus, fp32)
  NPU_K(layer_norm, fp32)
  NPU_K(native_layer_norm, fp32)
  NPU_K(group_norm, fp32)
  NPU_K2(frobenius_norm, dim, fp32)
  NPU_K(nuclear_norm, fp32)
  NPU_K2(nuclear_norm, dim, fp32)
  NPU_K(cosine_similarity, fp32)
  NPU_K(poisson_nll_loss, fp32)
  NPU_K(cosine_embedding_loss, fp32)
  NPU_K(nll_loss, fp32)
  NPU_K(nll_loss2d, fp32)
  NPU_K(hinge_embedding_loss, fp32)
  NPU_K(kl_div, fp32)
  NPU_K(l1_loss, fp32)
  NPU_K(smooth_l1_loss, fp32)
  NPU_K(huber_loss, fp32)
  NPU_K(mse_loss, fp32)
  NPU_K(margin_ranking_loss, fp32)
  NPU_K(multilabel_margin_loss, fp32)
  NPU_K(soft_margin_loss, fp32)
  NPU_K(triplet_margin_loss, fp32)
  NPU_K(multi_margin_loss, fp32)
  NPU_K(binary_cross_entropy_with_logits, fp32)
  NPU_K(dist, fp32)
  NPU_K(pdist, fp32)
  NPU_K(cdist, fp32)
  NPU_K(renorm, fp32)
  NPU_K(logsumexp, fp32)
  NPU_K(upsample_nearest1d, fp32)
  NPU_K(_upsample_nearest_exact1d, fp32)
  NPU_K(upsample_nearest2d, fp32)
  NPU_K(_upsample_nearest_exact2d, fp32)
  NPU_K(upsample_nearest3d, fp32)
  NPU_K(_upsample_nearest_exact3d, fp32)
  NPU_K(upsample_linear1d, fp32)
  NPU_K(upsample_bilinear2d, fp32)
  NPU_K(_upsample_bilinear2d_aa, fp32)
  NPU_K(upsample_trilinear3d, fp32)
  NPU_K(upsample_bicubic2d, fp32)
  NPU_K(_upsample_bicubic2d_aa, fp32)
  // fp32_set_opt_dtype
  NPU_K(prod, fp32_set_opt_dtype)
  NPU_K2(prod, dim_int, fp32_set_opt_dtype)
  NPU_K2(softmax, int, fp32_set_opt_dtype)
  NPU_K2(log_softmax, int, fp32_set_opt_dtype)
  NPU_K(cumprod, fp32_set_opt_dtype)
  NPU_K(cumsum, fp32_set_opt_dtype)
  NPU_K(linalg_vector_norm, fp32_set_opt_dtype)
  NPU_K(linalg_matrix_norm, fp32_set_opt_dtype)
  NPU_K2(linalg_matrix_norm, str_ord, fp32_set_opt_dtype)
  NPU_K(sum, fp32_set_opt_dtype)
  NPU_K2(sum, dim_IntList, fp32_set_opt_dtype)
  // fp32_append_dtype
  KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE(
      ADD_NS(norm), "norm.Scalar", Tensor(const Tensor&, const Scalar&),
      Tensor(const Tensor&, const c10::optional<Scalar>&, ScalarType), fp32_append_dtype)
  KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE(
      ADD_NS(norm), "norm.ScalarOpt_dim",
      Tensor(const Tensor&, const c10::optional<Scalar>&, IntArrayRef, bool),
      Tensor(const Tensor&, const c10::optional<Scalar>&, IntArrayRef, bool, ScalarType),
      fp32_append_dtype)
  // promote
  NPU_K(addcdiv, promote)
  NPU_K(addcmul, promote)
  NPU_K(atan2, promote)
  NPU_K(bilinear, promote)
  NPU_K(cross, promote)
  NPU_K(dot, promote)
  NPU_K(vdot, promote)
  NPU_K(grid_sampler, promote)
  NPU_K(index_put, promote)
  NPU_K(tensordot, promote)
  NPU_K(scatter_add, promote)
#undef NPU_K
#undef NPU_K2
  m.impl(TORCH_SELECTIVE_NAME("aten::binary_cross_entropy"),
         TORCH_FN((&npu_binary_cross_entropy_banned)));
}
#endif

// ---------------------------------------------------------------- Python entry points
// Plain custom ops (no tensors, so a catch-all kernel), called as torch.ops.ampforge_npu.*.
namespace {
void init() {
  route_cpu_kernels_to_fallback();
  register_grad_scaler_kernels_the_cpu_lacks();
  // Once per process; torch keeps the hooks object for the life of the process.
  static NpuHooks* hooks = [] {
    auto* h = new NpuHooks();
    at::RegisterPrivateUse1HooksInterface(h);
    return h;
  }();
  (void)hooks;
}

int64_t op_device_count() { return kDeviceCount; }
int64_t op_current_device() { return current_device; }
void op_set_device(int64_t index) {
  check_index(static_cast<c10::DeviceIndex>(index));
  current_device = static_cast<c10::DeviceIndex>(index);
}
int64_t op_live_bytes() { return live_bytes.load(); }
int64_t op_fallback_calls() { return fallback_calls.load(); }
void op_set_saturation_mode(bool on) { saturation_mode = on; }
bool op_saturation_mode() { return saturation_mode.load(); }
bool op_overflow_flag() { return overflow_flag.load(); }
void op_clear_overflow_flag() { overflow_flag = false; }
int64_t op_half_in_fp32_calls() { return half_in_fp32_calls.load(); }

// Autocast's state for the device, which torch.autocast reads and sets through the backend's
// module on torch < 2.4 (torch.npu.is_autocast_enabled, ... as torch_npu has them); later
// torches keep it per device type themselves (at::autocast::is_autocast_enabled(type)).
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
bool op_autocast_enabled() { return at::autocast::is_autocast_enabled(kNpu); }
void op_set_autocast_enabled(bool on) { at::autocast::set_autocast_enabled(kNpu, on); }
c10::ScalarType op_autocast_dtype() { return at::autocast::get_autocast_dtype(kNpu); }
void op_set_autocast_dtype(c10::ScalarType dtype) { at::autocast::set_autocast_dtype(kNpu, dtype); }
#else
bool op_autocast_enabled() { return at::autocast::is_privateuseone_enabled(); }
void op_set_autocast_enabled(bool on) { at::autocast::set_privateuseone_enabled(on); }
c10::ScalarType op_autocast_dtype() { return at::autocast::get_autocast_privateuseone_dtype(); }
void op_set_autocast_dtype(c10::ScalarType dtype) {
  at::autocast::set_autocast_privateuseone_dtype(dtype);
}
#endif
at::Tensor op_autocast_dtype_tensor() { return at::empty({0}, at::dtype(op_autocast_dtype())); }
}  // namespace

TORCH_LIBRARY(ampforge_npu, m) {
  // Registers the hooks and routes the CPU kernels (above); called once by install().
  m.def("init() -> ()", &init);
  m.def("device_count() -> int", &op_device_count);
  m.def("current_device() -> int", &op_current_device);
  m.def("set_device(int index) -> ()", &op_set_device);
  // Bytes held by live npu tensors, counted by the device allocator itself.
  m.def("live_bytes() -> int", &op_live_bytes);
  // How many ops have run through the CPU fallback so far.
  m.def("fallback_calls() -> int", &op_fallback_calls);
  // Saturation mode and the device's overflow flag (see saturation_mode above).
  m.def("set_saturation_mode(bool on) -> ()", &op_set_saturation_mode);
  m.def("saturation_mode() -> bool", &op_saturation_mode);
  m.def("overflow_flag() -> bool", &op_overflow_flag);
  m.def("clear_overflow_flag() -> ()", &op_clear_overflow_flag);
  // How many ops ran as float32 arithmetic with float16 results, because the CPU has no
  // float16 kernel for them (see run_half_in_fp32).
  m.def("half_in_fp32_calls() -> int", &op_half_in_fp32_calls);
  // Autocast's state for npu (see op_autocast_enabled).
  m.def("autocast_enabled() -> bool", &op_autocast_enabled);
  m.def("set_autocast_enabled(bool on) -> ()", &op_set_autocast_enabled);
  // An empty CPU tensor of the autocast dtype (a ScalarType result would reach Python as an int).
  m.def("autocast_dtype() -> Tensor", &op_autocast_dtype_tensor);
  m.def("set_autocast_dtype(ScalarType dtype) -> ()", &op_set_autocast_dtype);
}
