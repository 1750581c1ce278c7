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

#include <atomic>
#include <cstring>
#include <limits>
#include <memory>
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
// device bookkeeping, UntypedStorage.resize_) can ask about the device.
struct NpuHooks final : public at::PrivateUse1HooksInterface {
  // No `override`: torch <= 2.6's PrivateUse1 hooks have no isBuilt/isAvailable.
  bool isBuilt() const { return true; }
  bool isAvailable() const { return true; }
  bool hasPrimaryContext(c10::DeviceIndex /*index*/) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return kDeviceCount; }
  void setCurrentDevice(c10::DeviceIndex index) const override {
    check_index(index);
    current_device = index;
  }
  c10::DeviceIndex getCurrentDevice() const override { return current_device; }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex index) const override {
    c10::DeviceIndex old = current_device;
    setCurrentDevice(index);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex index) const override {
    return exchangeDevice(index);
  }
  // Said plainly instead of torch's generic "implement the hook" message.
  c10::Allocator* getPinnedMemoryAllocator() const override {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "the npu test device has no pinned host memory");
  }
  at::Generator getNewGenerator(c10::DeviceIndex /*index*/) const override {
    TORCH_CHECK_NOT_IMPLEMENTED(false,
                                "the npu test device has no generator of its own: random ops "
                                "draw from the CPU generator");
  }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    // Device memory is host memory here: the CPU resize (allocate through the storage's
    // own allocator, copy, swap) is exactly right.
    at::native::resize_bytes_cpu(storage.unsafeGetStorageImpl(), newsize);
  }
};

// ---------------------------------------------------------------- factory ops
c10::DeviceGuard guard_for(std::optional<c10::Device> device) {
  c10::Device d = device.value_or(c10::Device(kNpu, current_device));
  TORCH_CHECK(d.type() == kNpu, "npu kernel called for device ", d);
  if (d.index() < 0) {
    d = c10::Device(kNpu, current_device);
  }
  return c10::DeviceGuard(d);
}

at::Tensor npu_empty(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                     std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                     std::optional<bool> pin_memory,
                     std::optional<c10::MemoryFormat> memory_format) {
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided,
              "npu: only strided tensors");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "npu: device memory cannot be pinned");
  auto guard = guard_for(device);
  return at::detail::empty_generic(size, &npu_allocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor npu_empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                             std::optional<c10::ScalarType> dtype,
                             std::optional<c10::Layout> layout,
                             std::optional<c10::Device> device, std::optional<bool> pin_memory) {
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
                              std::optional<c10::MemoryFormat> memory_format) {
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

// ---------------------------------------------------------------- convolution
// at::convolution sends an unknown backend to convolution(_backward)_overrideable, whose
// default kernels only raise (a real backend provides them, as torch_npu does). Here: the
// CPU convolution on host copies of the arguments.
at::Tensor npu_convolution(const at::Tensor& input, const at::Tensor& weight,
                           const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                           c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                           c10::IntArrayRef output_padding, int64_t groups) {
  std::optional<at::Tensor> cpu_bias;
  if (bias.has_value() && bias->defined()) {
    cpu_bias = bias->cpu();
  }
  auto out = at::convolution(input.cpu(), weight.cpu(), cpu_bias, stride, padding, dilation,
                             transposed, output_padding, groups)
                 .to(input.device());
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
  auto [gi, gw, gb] = at::convolution_backward(
      grad_output.cpu(), input.cpu(), weight.cpu(), c10::IntArrayRef{out_channels}, stride,
      padding, dilation, transposed, output_padding, groups, output_mask);
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
  return {back(gi), back(gw), back(gb)};
}

// ---------------------------------------------------------------- fallback
void npu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  ++fallback_calls;
  if (!saturation_mode) {
    at::native::cpu_fallback(op, stack);
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
  at::native::cpu_fallback(op, stack);
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
                                           const std::optional<at::Tensor>&, int64_t) {
  // Same refusal as CUDA's autocast: the op is unsafe in half precision.
  TORCH_CHECK(false,
              "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to "
              "autocast on npu; use binary_cross_entropy_with_logits / BCEWithLogitsLoss.");
}
}  // namespace

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

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

// ---------------------------------------------------------------- Python entry points
// Plain custom ops (no tensors, so a catch-all kernel), called as torch.ops.ampforge_npu.*.
namespace {
void init() {
  route_cpu_kernels_to_fallback();
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
}
