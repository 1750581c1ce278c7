// amp._C through pybind11 over ATen: the binding for torch < 2.10 (no stable C ABI there)
// and for Python 3.9 (below the abi3 floor of bindings_stable.cpp). setup.py compiles exactly
// one of the two bindings with the shared ops (ops.cpp) and kernels; apex's multi_tensor_*
// entry points are amp.kernels.apex_ops' (Python: they serve every device), installed at import.
//
// apex's amp_C family of multi-tensor kernels for CPUs: one generic driver (`run_chunks`,
// driver.h) splits every tensor of a model-sized list into fixed-size chunks and runs a small
// per-op lambda over the chunks with at::parallel_for (OpenMP: this module is compiled and
// linked with -fopenmp, so torch.set_num_threads governs it). The element-wise work lives in
// cpu_ops_impl.h, compiled per ISA and picked at import time.
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "adaptor.h"
#include "driver.h"
#include "op_table.h"

#ifndef AMP_TORCH_VERSION
#define AMP_TORCH_VERSION "unknown"
#endif

namespace py = pybind11;
using amp_driver::View;

namespace {

const at::Tensor& tensor_of(const View& v) { return *static_cast<const at::Tensor*>(v.tensor); }

int dtype_code(at::ScalarType s) {
  switch (s) {
    case at::kFloat: return amp_kernels::kF32;
    case at::kHalf: return amp_kernels::kF16;
    case at::kBFloat16: return amp_kernels::kBF16;
    default: return -1;
  }
}

void parallel(int64_t n, void (*body)(int64_t, int64_t, void*), void* ctx) {
  py::gil_scoped_release no_gil;
  at::parallel_for(0, n, 1, [&](int64_t b, int64_t e) { body(b, e, ctx); });
}

const amp_driver::Binding kBinding = {
    [](const View& v) { return std::string(c10::toString(tensor_of(v).scalar_type())); },
    [](const View& v) { return tensor_of(v).device().str(); },
    [] { return static_cast<int64_t>(at::get_num_threads()); },
    &parallel,
};

// The adaptor's binding (adaptor.h): ATen tensors; an ArgError leaves through the exception
// translator below as ValueError / TypeError.
struct Aten {
  using Tensor = at::Tensor;
  using Item = at::Tensor;
  using PerNorms = std::optional<at::Tensor>;  // None unless asked for
  using Isas = std::vector<std::string>;

  static View view_of(const at::Tensor& t) {
    View v;
    v.tensor = &t;
    v.defined = t.defined();
    if (!v.defined) return v;
    v.cpu = t.device().is_cpu();
    v.dtype = dtype_code(t.scalar_type());
    v.sparse = t.is_sparse();
    v.contiguous = !v.sparse && t.is_contiguous();
    v.numel = t.numel();
    if (v.cpu && !v.sparse && v.numel) v.ptr = t.data_ptr();
    return v;
  }
  template <class F>
  static auto call(const F& f) -> decltype(f()) {
    return f();
  }
  // A 1-d tensor of *xs* (T: float or double, *dtype* its ScalarType).
  template <class T>
  static at::Tensor filled(const std::vector<T>& xs, at::ScalarType dtype) {
    at::Tensor t = at::empty({static_cast<int64_t>(xs.size())}, dtype);
    std::copy(xs.begin(), xs.end(), t.data_ptr<T>());
    return t;
  }
  static at::Tensor floats(const std::vector<float>& xs) { return filled(xs, at::kFloat); }
  static PerNorms per_norms(const std::vector<double>& xs, bool asked) {
    if (!asked) return std::nullopt;
    return filled(xs, at::kDouble);
  }
  static Isas isas(const std::vector<std::string>& names) { return names; }
};
using Ops = amp_adaptor::Ops<Aten>;

// --- a function's keyword arguments from its schema (op_table.h) --------------------------

struct SchemaArg {
  std::string type, name, value;  // value: the default's text, empty when none
};

std::string trimmed(const std::string& s) {
  const size_t b = s.find_first_not_of(' '), e = s.find_last_not_of(' ');
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

// "name(Type a, Type b=1) -> ..." -> its arguments (the table's subset of the language).
std::vector<SchemaArg> schema_args(const std::string& schema) {
  const size_t open = schema.find('('), close = schema.find(')');
  if (open == std::string::npos || close == std::string::npos || close < open)
    throw std::logic_error("amp._C: not a schema: " + schema);
  std::vector<SchemaArg> out;
  const std::string inner = schema.substr(open + 1, close - open - 1);
  size_t at = 0;
  while (!trimmed(inner).empty() && at <= inner.size()) {
    size_t comma = inner.find(',', at);
    if (comma == std::string::npos) comma = inner.size();
    const std::string item = trimmed(inner.substr(at, comma - at));
    const size_t space = item.find(' '), eq = item.find('=');
    if (space == std::string::npos) throw std::logic_error("amp._C: schema argument " + item);
    out.push_back({item.substr(0, space),
                   trimmed(item.substr(space + 1, eq == std::string::npos ? std::string::npos
                                                                           : eq - space - 1)),
                   eq == std::string::npos ? std::string() : trimmed(item.substr(eq + 1))});
    at = comma + 1;
  }
  return out;
}

py::object default_of(const SchemaArg& a) {
  if (a.type == "int") return py::int_(std::stoll(a.value));
  if (a.type == "float") return py::float_(std::stod(a.value));
  if (a.type == "bool" && (a.value == "True" || a.value == "False"))
    return py::bool_(a.value == "True");
  throw std::logic_error("amp._C: no Python default for " + a.type + " " + a.name + "=" + a.value);
}

// How many arguments have defaults (they are the last ones, as in Python).
constexpr size_t defaults_in(const char* schema) {
  size_t n = 0;
  for (; *schema && *schema != ')'; ++schema) n += *schema == '=';
  return n;
}

template <class R, class... A, size_t... I, size_t... J>
void def_with(py::module_& m, const char* name, R (*f)(A...), const char* doc,
              const std::vector<SchemaArg>& args, std::index_sequence<I...>,
              std::index_sequence<J...>) {
  // pybind11 copies the names (and the defaults' reprs) into the function's record.
  m.def(name, f, py::arg(args[I].name.c_str())...,
        py::arg_v(args[sizeof...(I) + J].name.c_str(), default_of(args[sizeof...(I) + J]))...,
        doc);
}

// m.<name> = f, with the schema's argument names and defaults.
template <size_t Defaults, class R, class... A>
void def(py::module_& m, const char* name, R (*f)(A...), const char* schema, const char* doc) {
  static_assert(Defaults <= sizeof...(A), "more defaults than arguments");
  const std::vector<SchemaArg> args = schema_args(schema);
  if (args.size() != sizeof...(A))
    throw std::logic_error(std::string("amp._C: the schema of ") + name + " has " +
                           std::to_string(args.size()) + " arguments, its function " +
                           std::to_string(sizeof...(A)));
  def_with(m, name, f, doc, args, std::make_index_sequence<sizeof...(A) - Defaults>{},
           std::make_index_sequence<Defaults>{});
}

}  // namespace

const amp_driver::Binding& amp_driver::binding() { return kBinding; }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "amp._C: multi-tensor CPU kernels (scale, axpby, l2norm, adam, sgd, lamb, adagrad, "
            "novograd; apex's multi_tensor_* entry points from amp.kernels.apex_ops)";
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const amp_driver::ArgError& e) {
      PyErr_SetString(e.type_error ? PyExc_TypeError : PyExc_ValueError, e.what());
    }
  });
  m.attr("_isa_note") = amp_driver::init_isa();
  m.attr("__torch_version__") = AMP_TORCH_VERSION;
  m.attr("__torch_abi__") = "unstable";  // loads into the torch it was built against only
  m.attr("chunk_size") = amp_driver::kChunk;
  py::dict schemas;
#define AMP_C_DEF(name, schema, doc)                     \
  def<defaults_in(schema)>(m, #name, &Ops::name, schema, doc); \
  schemas[#name] = schema;
  AMP_C_OPS(AMP_C_DEF)
#undef AMP_C_DEF
  m.attr("_schemas") = schemas;
  // apex's multi_tensor_* entry points: amp.kernels.apex_ops, the one place their conventions live.
  py::module_::import("amp.kernels.apex_ops").attr("install")(m);
}
