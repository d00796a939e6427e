// The compiled core of the Python package `attnlab` (attnlab._core): the library's methods, comparisons, costs,
// spectra, sources and report on numpy arrays.
//
// The package's Python layer (python/attnlab/__init__.py) is the public interface: it checks every argument's type
// and value with a one-line message, turns tensors and other array-likes into numpy arrays (no copy for CPU tensors)
// and settles the dtype, so that no call reaches pybind11's own argument matching (whose TypeError prints every
// argument, arrays included). The functions here take what it passes.
//
// Arrays are (n, d) or (h, n, d), float32 or float64, and keep their dtype: a float32 call computes in float32.
// C-contiguous arrays are read in place (an Eigen::Map over numpy's buffer, no copy); others are made contiguous
// once. Inputs with NaN or infinities are refused before the work, and so is an output that is not finite after
// it. The GIL is released while C++ runs, and Ctrl-C is honoured between tiles and heads (a SIGINT handler that
// only sets attnlab's cancel flag, polled by the kernels; KeyboardInterrupt follows). attnlab::Error becomes
// ValueError with the library's message unchanged. Each call runs on the module's own OpenMP thread count
// (threads(); see ThreadsGuard), whatever other libraries in the process have set.
#include "attnlab/core/cancel.hpp"
#include "attnlab/analysis/evaluate.hpp"
#include "attnlab/analysis/cost.hpp"
#include "attnlab/core/error.hpp"
#include "attnlab/core/formats.hpp"
#include "attnlab/operators/exact.hpp"
#include "attnlab/core/registry.hpp"
#include "attnlab/core/reproducible.hpp"
#include "attnlab/io/sources.hpp"
#include "attnlab/components/spectrum.hpp"
#include "attnlab/analysis/budget_families.hpp"
#include "attnlab/methods/vq.hpp"
#include "report.hpp"
#include "common.hpp"
#include "method_binding.hpp"

#include <fmt/format.h>
#include <omp.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <csignal>
#include <limits>
#include <map>
#include <optional>
#include <thread>

namespace py = pybind11;
using namespace attnlab;
using namespace attnlab_python;  // common.hpp: threads, Ctrl-C, run_released

namespace {

// ---- arrays -------------------------------------------------------------------------------------------------

// heads_of, check_qkv, new_array and head_label: common.hpp.

AttentionOptions attention_options(bool causal, const std::optional<double>& scale) {
  AttentionOptions o;
  o.causal = causal;
  o.scale = scale ? *scale : std::numeric_limits<double>::quiet_NaN();
  return o;
}

// ---- methods() ----------------------------------------------------------------------------------------------

py::list methods_list() {
  py::list out;
  for (const auto& d : registered_methods()) {
    py::list params;
    for (const auto& p : d.params) {
      py::dict e;
      e["name"] = p.name;
      e["type"] = p.describe_type();
      e["default"] = p.default_value;
      e["help"] = p.help;
      params.append(e);
    }
    py::dict m;
    m["name"] = d.name;
    m["summary"] = d.summary;
    m["reference"] = d.reference;
    m["causal"] = d.causal;
    m["causal_note"] = d.causal_note;
    m["backward"] = d.backward;
    m["backward_note"] = d.backward_note;
    // Reduced storage (bf16, fp16): the policies it emulates and which intermediates each stores in the format.
    py::list policies;
    if (d.storage.eager) policies.append("eager");
    if (d.storage.careful) policies.append("careful");
    m["storage_policies"] = policies;
    m["storage"] = d.storage.note;
    m["storage_backward"] = d.storage.backward ? py::object(py::str(d.storage.backward_note)) : py::object(py::none());
    m["params"] = params;
    out.append(m);
  }
  return out;
}

template <typename T>
std::unique_ptr<Method<T>> causal_checked(const std::string& spec, const std::optional<std::uint64_t>& seed,
                                          bool causal) {
  auto method = make_method<T>(spec, seed);
  if (causal && !method->supports_causal())
    throw Error(fmt::format("method '{}' cannot honour a causal mask (it would leak the future); use a causal "
                            "method or causal=False", method->name()));
  return method;
}

// ---- apply() ------------------------------------------------------------------------------------------------

template <typename T>
py::object apply_t(const std::string& spec, const py::handle& qo, const py::handle& ko, const py::handle& vo,
                   bool causal, const std::optional<double>& scale, const std::optional<std::uint64_t>& seed,
                   bool matrix) {
  auto method = causal_checked<T>(spec, seed, causal);
  const Heads<T> q = heads_of<T>(qo, "q"), k = heads_of<T>(ko, "k"), v = heads_of<T>(vo, "v");
  check_qkv(q, k, &v);
  return apply_heads<T>(*method, q, k, v, attention_options(causal, scale), matrix);
}

// ---- compare() ----------------------------------------------------------------------------------------------

template <typename T>
py::object compare_t(const py::handle& qo, const py::handle& ko, const py::handle& vo,
                     const std::vector<std::string>& specs_in, bool causal, const std::optional<double>& scale,
                     std::uint64_t seed, const std::string& matrix_metrics, Index matrix_limit, bool spectral,
                     int repeats, int warmup, bool frame, const std::string& storage, const std::string& policy) {
  std::vector<std::string> specs = specs_in;
  if (specs.empty())
    for (const auto& d : registered_methods())
      if (!causal || d.causal) specs.push_back(d.name);
  std::vector<std::unique_ptr<Method<T>>> methods;
  for (const auto& s : specs) methods.push_back(make_method<T>(s, seed));
  if (matrix_metrics != "auto" && matrix_metrics != "on" && matrix_metrics != "off")
    throw Error(fmt::format("matrix_metrics: '{}' is not one of auto, on, off", matrix_metrics));
  const Heads<T> q = heads_of<T>(qo, "q"), k = heads_of<T>(ko, "k"), v = heads_of<T>(vo, "v");
  check_qkv(q, k, &v);
  CompareOptions copts;
  copts.attention = attention_options(causal, scale);
  copts.attention.storage = parse_storage(storage);
  copts.attention.policy = parse_policy(policy);
  copts.matrix_metrics =
      matrix_metrics == "on" || (matrix_metrics == "auto" && q.rows <= matrix_limit && k.rows <= matrix_limit);
  copts.spectral = spectral;
  copts.cost.repeats = repeats;
  copts.cost.warmup = warmup;
  std::vector<std::pair<Index, Evaluation>> rows;
  run_released([&] {
    for (Index h = 0; h < q.heads; ++h)
      for (auto& r : compare_methods<T>(q.head(h), k.head(h), v.head(h), methods, copts))
        rows.emplace_back(h, std::move(r));
  });
  // Wide rows: one per (head, method), the library's rows (evaluation_rows) as columns; a metric a method does not
  // have is NaN (KL of a P̃ whose rows are not distributions, a diagnostic of another method).
  std::vector<std::string> names;
  for (const auto& [h, r] : rows)
    for (const auto& [name, value] : evaluation_rows(r))
      if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  py::list records;
  for (const auto& [h, r] : rows) {
    py::dict d;
    // Not "head": a DataFrame column of that name would hide DataFrame.head() behind df.head.
    d["head_index"] = h;
    d["method"] = r.method;
    d["spec"] = r.spec;
    d["dtype"] = dtype_name(dtype_of<T>());
    if (copts.attention.storage != Storage::native) {  // the emulated format and policy (compute in float32)
      d["precision"] = storage_name(copts.attention.storage);
      d["policy"] = policy_name(copts.attention.policy);
    }
    d["n_q"] = q.rows;
    d["n_k"] = k.rows;
    for (const auto& name : names) d[py::str(name)] = std::numeric_limits<double>::quiet_NaN();
    for (const auto& [name, value] : evaluation_rows(r)) d[py::str(name)] = value;
    records.append(d);
  }
  if (frame) {
    try {
      return py::module_::import("pandas").attr("DataFrame")(records);
    } catch (const py::error_already_set& e) {
      if (!e.matches(PyExc_ImportError)) throw;
    }
  }
  return std::move(records);
}

// ---- cost() -------------------------------------------------------------------------------------------------

template <typename T>
py::dict cost_t(const py::handle& qo, const py::handle& ko, const py::handle& vo, const std::string& spec,
                bool causal, const std::optional<double>& scale, std::uint64_t seed, int repeats, int warmup,
                bool memory) {
  auto method = causal_checked<T>(spec, seed, causal);
  const Heads<T> q = heads_of<T>(qo, "q"), k = heads_of<T>(ko, "k"), v = heads_of<T>(vo, "v");
  check_qkv(q, k, &v);
  const AttentionOptions opts = attention_options(causal, scale);
  CostOptions co;
  co.repeats = repeats;
  co.warmup = warmup;
  co.memory = memory;
  Cost c;
  std::string context;
  run_released([&] {
    if (!q.batched) {
      c = measure_method<T>(*method, q.head(0), k.head(0), v.head(0), opts, co);
    } else {
      // A layer's heads, one call running each in turn, by the same harness (measure_method is one head's call).
      const auto all_heads = [&](Method<T>& m) {
        for (Index h = 0; h < q.heads; ++h) run_method_once<T>(m, q.head(h), k.head(h), v.head(h), opts);
      };
      c = measure([&] { all_heads(*method); }, co, [&] {
        auto fresh = make_method<T>(method->spec());
        all_heads(*fresh);
      });
    }
    context = cost_context();  // inside: the threads the calls ran on
  });
  if (c.refused) throw Error(c.reason);
  py::dict d;
  d["spec"] = method->spec();
  d["min_s"] = c.min_s;
  d["median_s"] = c.median_s;
  d["max_s"] = c.max_s;
  d["repeats"] = c.repeats;
  d["warmup"] = warmup;
  d["peak_bytes"] = memory ? py::object(py::int_(c.peak_bytes)) : py::object(py::none());
  d["context"] = context;
  return d;
}

// ---- spectrum() ---------------------------------------------------------------------------------------------

template <typename T>
py::array_t<double> spectrum_t(const py::handle& qo, const py::handle& ko, const std::optional<Index>& top,
                               bool causal, const std::optional<double>& scale, const std::string& solver_name,
                               double tol) {
  const Heads<T> q = heads_of<T>(qo, "q"), k = heads_of<T>(ko, "k");
  check_qkv<T>(q, k, nullptr);
  const Index nmin = std::min(q.rows, k.rows);
  if (top && (*top < 1 || *top > nmin))
    throw Error(fmt::format("top = {} is out of range: 1 ≤ top ≤ min(n_q, n_k) = {}", *top, nmin));
  TopSingularOptions so;
  so.solver = parse_spectrum_solver(solver_name);
  so.tol = tol;
  const Index count = top ? *top : nmin;
  const AttentionOptions opts = attention_options(causal, scale);
  py::array_t<double> out = q.batched ? py::array_t<double>({py::ssize_t(q.heads), py::ssize_t(count)})
                                      : py::array_t<double>({py::ssize_t(count)});
  run_released([&] {
    for (Index h = 0; h < q.heads; ++h) {
      throw_if_cancelled();
      VectorX<double> s;
      if (!top) {
        // Every value: dense (memory-guarded). P is checked first: an SVD of a matrix with NaN (scores that
        // overflow, e.g. float64 inputs of 1e300) returns neither an error nor a full spectrum.
        const MatrixR<T> p = exact_matrix<T>(q.head(h), k.head(h), opts);
        require_finite_output(p, head_label("the attention matrix P", q.batched, h));
        s = singular_values<T>(p);
      } else {
        const ExactOperator<T> op(q.head(h), k.head(h), opts);
        // The same check matrix-free: P·1 (one product, beside the solver's many) is NaN in every row of P that is.
        require_finite_output<T>(op.apply(MatrixR<T>::Ones(k.rows, 1)),
                                 head_label("the attention matrix P", q.batched, h));
        s = top_singular<T>(op, *top, so).values;
      }
      if (s.size() < count || !all_finite(s.head(count)))
        throw Error(fmt::format("{} has non-finite values: a numerical failure",
                                head_label("the spectrum", q.batched, h)));
      Eigen::Map<VectorX<double>>(out.mutable_data() + h * count, count) = s.head(count);
    }
  });
  return out;
}

// ---- vq_codebook() ------------------------------------------------------------------------------------------

/// The codebook `vq` fits with codebook=window, fitted on these keys: (n, d), or (m, n, d) whose m windows are
/// stacked as m·n rows (vq_fit_codebook: the method's own k-means++ and Lloyd iterations, seeded). (codes, d), in
/// the keys' dtype.
template <typename T>
py::array_t<T> vq_codebook_t(const py::handle& keys, Index codes, Index iters, std::uint64_t seed) {
  const Heads<T> h = heads_of<T>(keys, "keys", "keys'");
  VqOptions o;  // the method's ranges, with its messages
  o.codes = codes;
  o.iters = iters;
  o.seed = seed;
  o.params();
  const Index rows = h.heads * h.rows;  // codes ≤ rows: vq_fit_codebook's check, before its work
  const Eigen::Map<const MatrixR<T>> all(h.data, rows, h.cols);
  MatrixR<T> c;
  run_released([&] { c = vq_fit_codebook<T>(all, codes, iters, seed).centroids; });
  py::array_t<T> out({py::ssize_t(c.rows()), py::ssize_t(c.cols())});
  Eigen::Map<MatrixR<T>>(out.mutable_data(), c.rows(), c.cols()) = c;
  return out;
}

// ---- sources ------------------------------------------------------------------------------------------------

template <typename T>
py::tuple generate_t(const SourceOptions& so, Index n, Index nk, Index d, Index dv, std::uint64_t seed) {
  Qkv<T> g;
  run_released([&] { g = generate_problem<T>(so, n, nk, d, dv, seed); });
  const auto to_np = [](const MatrixR<T>& m) {
    py::array_t<T> a({py::ssize_t(m.rows()), py::ssize_t(m.cols())});
    Eigen::Map<MatrixR<T>>(a.mutable_data(), m.rows(), m.cols()) = m;
    return a;
  };
  return py::make_tuple(to_np(g.q), to_np(g.k), to_np(g.v));
}

}  // namespace

// The docstrings users read are the Python layer's; these name what each function takes.
PYBIND11_MODULE(_core, m) {
  m.doc() = "attnlab's compiled core; use the package attnlab (its functions check their arguments).";
  m.attr("__version__") = code_version();
  module_threads();  // read the process's OpenMP default now, at import

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Interrupted&) {
      PyErr_SetNone(PyExc_KeyboardInterrupt);
    } catch (const Error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });

  m.def("methods", &methods_list);
  bind_method(m);  // method_binding.cpp: the Method class (fit once, apply to many V)

  // The method families swept against a budget (error_vs_budget, the report, tools/dropin.py): one list.
  m.def("budget_families", [] {
    py::list out;
    for (const auto& f : budget_families()) {
      py::list specs;
      for (Index b : f.budgets) specs.append(f.spec_at(b));
      py::dict d;
      d["label"] = f.label;
      d["spec"] = f.spec;
      d["param"] = f.param();
      d["budgets"] = f.budgets;
      d["specs"] = specs;
      d["deployable"] = f.deployable;
      d["causal"] = find_method(f.spec.substr(0, f.spec.find(':'))).causal;
      out.append(d);
    }
    return out;
  });

  // The canonical form of a spec (every parameter, defaults filled in): parses and validates it without running it.
  m.def(
      "canonical",
      [](const std::string& spec, bool causal) {
        return causal_checked<double>(spec, std::nullopt, causal)->spec();
      },
      py::arg("spec"), py::arg("causal"));

  m.def(
      "apply",
      [](const std::string& spec, const py::handle& q, const py::handle& k, const py::handle& v, bool causal,
         std::optional<double> scale, std::optional<std::uint64_t> seed, bool matrix) -> py::object {
        return is_f32(q) ? apply_t<float>(spec, q, k, v, causal, scale, seed, matrix)
                         : apply_t<double>(spec, q, k, v, causal, scale, seed, matrix);
      },
      py::arg("spec"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("causal"), py::arg("scale"),
      py::arg("seed"), py::arg("matrix"));

  m.def(
      "compare",
      [](const py::handle& q, const py::handle& k, const py::handle& v, const std::vector<std::string>& specs,
         bool causal, std::optional<double> scale, std::uint64_t seed, const std::string& matrix_metrics,
         Index matrix_limit, bool spectral, int repeats, int warmup, bool frame, const std::string& storage,
         const std::string& policy) -> py::object {
        return is_f32(q) ? compare_t<float>(q, k, v, specs, causal, scale, seed, matrix_metrics, matrix_limit,
                                            spectral, repeats, warmup, frame, storage, policy)
                         : compare_t<double>(q, k, v, specs, causal, scale, seed, matrix_metrics, matrix_limit,
                                             spectral, repeats, warmup, frame, storage, policy);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("specs"), py::arg("causal"), py::arg("scale"),
      py::arg("seed"), py::arg("matrix_metrics"), py::arg("matrix_limit"), py::arg("spectral"), py::arg("repeats"),
      py::arg("warmup"), py::arg("frame"), py::arg("storage") = "native", py::arg("policy") = "eager");

  m.def(
      "cost",
      [](const py::handle& q, const py::handle& k, const py::handle& v, const std::string& spec, bool causal,
         std::optional<double> scale, std::uint64_t seed, int repeats, int warmup, bool memory) {
        return is_f32(q) ? cost_t<float>(q, k, v, spec, causal, scale, seed, repeats, warmup, memory)
                         : cost_t<double>(q, k, v, spec, causal, scale, seed, repeats, warmup, memory);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("spec"), py::arg("causal"), py::arg("scale"),
      py::arg("seed"), py::arg("repeats"), py::arg("warmup"), py::arg("memory"));

  m.def(
      "spectrum",
      [](const py::handle& q, const py::handle& k, std::optional<Index> top, bool causal, std::optional<double> scale,
         const std::string& solver, double tol) {
        return is_f32(q) ? spectrum_t<float>(q, k, top, causal, scale, solver, tol)
                         : spectrum_t<double>(q, k, top, causal, scale, solver, tol);
      },
      py::arg("q"), py::arg("k"), py::arg("top"), py::arg("causal"), py::arg("scale"), py::arg("solver"),
      py::arg("tol"));

  m.def(
      "vq_codebook",
      [](const py::handle& keys, Index codes, Index iters, std::uint64_t seed) -> py::object {
        const py::array a = as_array(keys, "keys");
        if (a.dtype().is(py::dtype::of<float>())) return vq_codebook_t<float>(keys, codes, iters, seed);
        return vq_codebook_t<double>(keys, codes, iters, seed);
      },
      py::arg("keys"), py::arg("codes"), py::arg("iters"), py::arg("seed"));

  m.def("sources", [] { return std::string(source_kinds()); });
  m.def(
      "generate",
      [](const std::string& source, Index n, Index d, std::optional<Index> n_k, std::optional<Index> d_v,
         std::uint64_t seed, const std::string& dtype, double temperature, Index centres, double spread, Index rank) {
        SourceOptions so;
        so.kind = source;
        so.temperature = temperature;
        so.centres = centres;
        so.spread = spread;
        so.rank = rank;
        const Index nk = n_k ? *n_k : n, dv = d_v ? *d_v : d;
        if (dtype == "float32") return generate_t<float>(so, n, nk, d, dv, seed);
        if (dtype == "float64") return generate_t<double>(so, n, nk, d, dv, seed);
        throw Error(fmt::format("dtype: '{}' is not float32 or float64", dtype));
      },
      py::arg("source"), py::arg("n"), py::arg("d"), py::arg("n_k"), py::arg("d_v"), py::arg("seed"),
      py::arg("dtype"), py::arg("temperature"), py::arg("centres"), py::arg("spread"), py::arg("rank"));

  m.def(
      "report",
      [](const py::handle& q, const py::handle& k, const py::handle& v, const std::string& model_dir,
         const std::string& out, double target, const std::vector<std::string>& families, const std::string& layers,
         Index seq, Index repeats, bool causal, bool quiet, int threads, const std::string& storage,
         const std::string& policy, const std::string& costs, const std::string& costs_dtype,
         const std::string& exact_peer) {
        report::Options o;
        o.costs = costs;
        o.exact_peer = exact_peer;
        o.costs_dtype = costs_dtype;
        o.storage = parse_storage(storage);
        o.policy = parse_policy(policy);
        o.out = out;
        o.target = target;
        o.families = families;
        o.repeats = repeats;
        o.causal = causal;
        o.progress = !quiet;
        o.threads = threads;
        std::vector<report::Layer> input;
        if (!model_dir.empty()) {
          if (!q.is_none() || !k.is_none() || !v.is_none())
            throw Error("report: give q, k, v or model_dir, not both");
          input = report::load_model_export(model_dir, layers, seq, causal);
        } else {
          const bool f32 = is_f32(q);
          // The report computes in float64 (its errors) and times in float32, like the experiments.
          const auto load = [&](auto tag) {
            using T = decltype(tag);
            const Heads<T> hq = heads_of<T>(q, "q"), hk = heads_of<T>(k, "k"), hv = heads_of<T>(v, "v");
            check_qkv(hq, hk, &hv);
            report::Layer layer;
            layer.name = "input";
            for (Index h = 0; h < hq.heads; ++h)
              layer.heads.push_back({hq.head(h).template cast<double>(), hk.head(h).template cast<double>(),
                                     hv.head(h).template cast<double>()});
            input.push_back(std::move(layer));
          };
          if (f32) load(float{});
          else load(double{});
        }
        report::Summary s;
        run_released([&] { s = report::write_report(input, o); });
        return s.index_html;
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("model_dir"), py::arg("out"), py::arg("target"),
      py::arg("families"), py::arg("layers"), py::arg("seq"), py::arg("repeats"), py::arg("causal"), py::arg("quiet"),
      py::arg("threads"), py::arg("storage"), py::arg("policy"), py::arg("costs"), py::arg("costs_dtype"),
      py::arg("exact_peer"));

  m.def("threads", [] { return module_threads(); });
  m.def(
      "set_threads",
      [](int n) {
        if (n < 1) throw Error(fmt::format("set_threads: n must be ≥ 1, got {}", n));
        module_threads() = n;
      },
      py::arg("n"));

  // For the tests: the address the C++ side reads an array at (equal to the array's own when it is not copied).
  m.def(
      "_data_address",
      [](const py::handle& a) -> std::uintptr_t {
        return is_f32(a) ? std::uintptr_t(heads_of<float>(a, "q", "q's", false).data)
                         : std::uintptr_t(heads_of<double>(a, "q", "q's", false).data);
      },
      py::arg("a"));
  // For the tests: the OpenMP setting of the calling thread (PyTorch's, when it has set one), which calls leave as
  // they found it.
  m.def("_omp_max_threads", [] { return omp_get_max_threads(); });
  // For the tests: the cache sizes Eigen's products assume in this module (pinned when it loads, by the library's
  // initializer: core/reproducible.hpp), the pinned ones, and a stand-in for a CPU with other caches.
  const auto sizes = [](const attnlab::CacheSizes& c) { return py::make_tuple(c.l1, c.l2, c.l3); };
  m.def("_eigen_cache_sizes", [sizes] { return sizes(attnlab::eigen_cache_sizes()); });
  m.def("_pinned_cache_sizes", [sizes] { return sizes(attnlab::pinned_cache_sizes()); });
  m.def(
      "_set_eigen_cache_sizes",
      [](std::ptrdiff_t l1, std::ptrdiff_t l2, std::ptrdiff_t l3) { attnlab::set_eigen_cache_sizes({l1, l2, l3}); },
      py::arg("l1"), py::arg("l2"), py::arg("l3"));
  m.def("_pin_eigen_blocking", [] { attnlab::pin_eigen_blocking(); });
  // Storage formats (core/formats.hpp), for the bit-exact tests against numpy's float16 and a bfloat16 reference.
  m.def("_round_to", [](py::array_t<double, py::array::c_style | py::array::forcecast> x, const std::string& f) {
    const attnlab::Format fmt = attnlab::parse_format(f);
    py::array_t<double> out(x.request().shape);
    const double* src = x.data();
    double* dst = out.mutable_data();
    for (py::ssize_t i = 0; i < x.size(); ++i) dst[i] = attnlab::round_to(fmt, src[i]);
    return out;
  });
  m.def("_half_bits", [](py::array_t<double, py::array::c_style | py::array::forcecast> x, const std::string& f) {
    const attnlab::Format fmt = attnlab::parse_format(f);
    py::array_t<std::uint16_t> out(x.request().shape);
    for (py::ssize_t i = 0; i < x.size(); ++i) out.mutable_data()[i] = attnlab::half_bits(fmt, x.data()[i]);
    return out;
  });
  m.def("_from_half_bits", [](py::array_t<std::uint16_t, py::array::c_style | py::array::forcecast> b,
                              const std::string& f) {
    const attnlab::Format fmt = attnlab::parse_format(f);
    py::array_t<double> out(b.request().shape);
    for (py::ssize_t i = 0; i < b.size(); ++i) out.mutable_data()[i] = attnlab::from_half_bits(fmt, b.data()[i]);
    return out;
  });
}
