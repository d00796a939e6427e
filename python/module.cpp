// The Python module `attnlab`: the library's methods, comparisons, spectra, sources and report on numpy arrays.
//
// Arrays are (n, d) or (h, n, d), float32 or float64, and keep their dtype: a float32 call computes in float32.
// C-contiguous arrays are read in place (an Eigen::Map over numpy's buffer, no copy); others are made contiguous
// once. The GIL is released while C++ runs, and Ctrl-C is honoured between tiles and heads (a SIGINT handler that
// only sets attnlab's cancel flag, polled by the kernels; KeyboardInterrupt follows). attnlab::Error becomes
// ValueError with the library's message. PyTorch tensors: pass t.detach().cpu().numpy() (no copy for a CPU
// tensor).
#include "attnlab/cancel.hpp"
#include "attnlab/compare.hpp"
#include "attnlab/error.hpp"
#include "attnlab/exact.hpp"
#include "attnlab/registry.hpp"
#include "attnlab/sources.hpp"
#include "attnlab/spectrum.hpp"
#include "report.hpp"

#include <fmt/format.h>
#include <omp.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <csignal>
#include <cmath>
#include <limits>
#include <map>
#include <optional>

namespace py = pybind11;
using namespace attnlab;

namespace {

// ---- arrays -------------------------------------------------------------------------------------------------

/// A (n, d) or (h, n, d) float array seen as h row-major matrices, read in place when C-contiguous.
template <typename T>
struct Heads {
  py::array_t<T> array;  // keeps the buffer alive (the caller's array, or its contiguous copy)
  Index heads = 1, rows = 0, cols = 0;
  bool batched = false;
  const T* data = nullptr;
  Eigen::Map<const MatrixR<T>> head(Index h) const { return {data + h * rows * cols, rows, cols}; }
};

std::string dtype_str(const py::array& a) { return py::str(a.dtype()).cast<std::string>(); }

py::array as_array(const py::handle& obj, const char* name) {
  if (obj.is_none()) throw Error(fmt::format("{}: an array is required, got None", name));
  if (py::hasattr(obj, "detach") && py::hasattr(obj, "numpy") && !py::isinstance<py::array>(obj))
    throw Error(fmt::format("{}: a PyTorch tensor; pass {}.detach().cpu().numpy()", name, name));
  return py::array::ensure(obj);
}

/// The dtype a call computes in: Q's, which must be float32 or float64.
bool is_f32(const py::handle& q) {
  const py::array a = as_array(q, "q");
  if (!a) throw Error("q: not convertible to a numpy array");
  if (a.dtype().is(py::dtype::of<float>())) return true;
  if (a.dtype().is(py::dtype::of<double>())) return false;
  throw Error(fmt::format("q: dtype {} is not supported; give float32 or float64 arrays", dtype_str(a)));
}

template <typename T>
Heads<T> heads_of(const py::handle& obj, const char* name, bool check_finite = true) {
  py::array a = as_array(obj, name);
  if (!a) throw Error(fmt::format("{}: not convertible to a numpy array", name));
  if (!a.dtype().is(py::dtype::of<T>()))
    throw Error(fmt::format("{}: dtype {} differs from q's {}; give Q, K, V one dtype (float32 or float64)", name,
                            dtype_str(a), dtype_name(dtype_of<T>())));
  if (a.ndim() != 2 && a.ndim() != 3)
    throw Error(fmt::format("{}: expected (n, d) or (heads, n, d), got {} dimensions", name, a.ndim()));
  Heads<T> h;
  // array_t<T, c_style> would copy silently; the contiguity is decided here, and a copy happens only when needed.
  if (a.flags() & py::array::c_style) h.array = py::reinterpret_borrow<py::array_t<T>>(a);
  else h.array = py::array_t<T, py::array::c_style>::ensure(a);
  h.batched = a.ndim() == 3;
  h.heads = h.batched ? Index(a.shape(0)) : 1;
  h.rows = Index(a.shape(a.ndim() - 2));
  h.cols = Index(a.shape(a.ndim() - 1));
  h.data = h.array.data();
  if (h.rows < 1 || h.cols < 1 || h.heads < 1)
    throw Error(fmt::format("{}: empty array (shape {})", name, py::str(a.attr("shape")).cast<std::string>()));
  if (check_finite) {
    const Eigen::Map<const VectorX<T>> all(h.data, h.heads * h.rows * h.cols);
    if (!all_finite(all)) throw Error(fmt::format("{}: has NaN or infinite values", name));
  }
  return h;
}

template <typename T>
void check_qkv(const Heads<T>& q, const Heads<T>& k, const Heads<T>* v) {
  if (q.batched != k.batched || q.heads != k.heads || (v && (v->batched != q.batched || v->heads != q.heads)))
    throw Error("q, k, v: give all three as (n, d) or all as (heads, n, d) with the same number of heads");
  if (q.cols != k.cols) throw Error(fmt::format("q, k: head dimensions differ (q has d = {}, k has {})", q.cols, k.cols));
  if (v && v->rows != k.rows)
    throw Error(fmt::format("k, v: different lengths (k has {} rows, v has {})", k.rows, v->rows));
}

/// A new (h, rows, cols) or (rows, cols) array.
template <typename T>
py::array_t<T> new_array(bool batched, Index heads, Index rows, Index cols) {
  if (batched) return py::array_t<T>({py::ssize_t(heads), py::ssize_t(rows), py::ssize_t(cols)});
  return py::array_t<T>({py::ssize_t(rows), py::ssize_t(cols)});
}

template <typename T>
Eigen::Map<MatrixR<T>> head_of(py::array_t<T>& a, Index h, Index rows, Index cols) {
  return {a.mutable_data() + h * rows * cols, rows, cols};
}

AttentionOptions attention_options(bool causal, const std::optional<double>& scale) {
  AttentionOptions o;
  o.causal = causal;
  o.scale = scale ? *scale : std::numeric_limits<double>::quiet_NaN();
  return o;
}

// ---- Ctrl-C -------------------------------------------------------------------------------------------------

/// While C++ runs with the GIL released, Python's own SIGINT handler cannot run: this one sets the library's
/// cancel flag instead (and nothing else: it must be async-signal-safe), and the previous handler comes back after.
class SigintGuard {
 public:
  SigintGuard() {
    clear_cancel();
    const py::object threading = py::module_::import("threading");
    installed_ = threading.attr("current_thread")().is(threading.attr("main_thread")());
    if (!installed_) return;
    struct sigaction sa {};
    sa.sa_handler = [](int) { request_cancel(); };
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_);
  }
  ~SigintGuard() {
    if (installed_) sigaction(SIGINT, &old_, nullptr);
    clear_cancel();
  }
  SigintGuard(const SigintGuard&) = delete;
  SigintGuard& operator=(const SigintGuard&) = delete;

 private:
  bool installed_ = false;
  struct sigaction old_ {};
};

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
    m["params"] = params;
    out.append(m);
  }
  return out;
}

// ---- apply() ------------------------------------------------------------------------------------------------

template <typename T>
py::object apply_t(const std::string& spec, const py::handle& qo, const py::handle& ko, const py::handle& vo,
                   bool causal, const std::optional<double>& scale, const std::optional<std::uint64_t>& seed,
                   bool matrix) {
  auto method = make_method<T>(spec, seed);
  if (causal && !method->supports_causal())
    throw Error(fmt::format("method '{}' cannot honour a causal mask (it would leak the future); use a causal "
                            "method or causal=False", method->name()));
  const Heads<T> q = heads_of<T>(qo, "q"), k = heads_of<T>(ko, "k"), v = heads_of<T>(vo, "v");
  check_qkv(q, k, &v);
  const AttentionOptions opts = attention_options(causal, scale);
  py::array_t<T> out = new_array<T>(q.batched, q.heads, q.rows, v.cols);
  py::array_t<T> p;
  if (matrix) p = new_array<T>(q.batched, q.heads, q.rows, k.rows);
  {
    SigintGuard guard;
    py::gil_scoped_release release;
    for (Index h = 0; h < q.heads; ++h) {
      throw_if_cancelled();
      method->compute(q.head(h), k.head(h), opts);
      head_of(out, h, q.rows, v.cols) = method->output(v.head(h));
      if (matrix) head_of(p, h, q.rows, k.rows) = method->matrix();
    }
  }
  if (matrix) return py::make_tuple(out, p);
  return std::move(out);
}

// ---- compare() ----------------------------------------------------------------------------------------------

template <typename T>
py::object compare_t(const py::handle& qo, const py::handle& ko, const py::handle& vo,
                     const std::vector<std::string>& specs_in, bool causal, const std::optional<double>& scale,
                     std::uint64_t seed, const std::string& matrix_metrics, Index matrix_limit, bool spectral,
                     bool frame) {
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
  copts.matrix_metrics =
      matrix_metrics == "on" || (matrix_metrics == "auto" && q.rows <= matrix_limit && k.rows <= matrix_limit);
  copts.spectral = spectral;
  std::vector<std::pair<Index, CompareRow>> rows;
  {
    SigintGuard guard;
    py::gil_scoped_release release;
    for (Index h = 0; h < q.heads; ++h)
      for (auto& r : compare_methods<T>(q.head(h), k.head(h), v.head(h), methods, copts)) rows.emplace_back(h, std::move(r));
  }
  // Wide rows: one per (head, method); a metric a method does not have is NaN (KL of a P̃ whose rows are not
  // distributions, a diagnostic of another method).
  std::vector<std::string> names;
  for (const auto& [h, r] : rows)
    for (const auto& [name, value] : r.metrics)
      if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  py::list records;
  for (const auto& [h, r] : rows) {
    py::dict d;
    d["head"] = h;
    d["method"] = r.method;
    d["spec"] = r.spec;
    d["dtype"] = dtype_name(dtype_of<T>());
    d["n_q"] = q.rows;
    d["n_k"] = k.rows;
    d["time_s"] = r.time_s();
    d["exact_time_s"] = r.exact_time_s();
    for (const auto& name : names) d[py::str(name)] = std::numeric_limits<double>::quiet_NaN();
    for (const auto& [name, value] : r.metrics) d[py::str(name)] = value;
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
  {
    SigintGuard guard;
    py::gil_scoped_release release;
    for (Index h = 0; h < q.heads; ++h) {
      throw_if_cancelled();
      VectorX<double> s;
      if (!top) {
        s = singular_values<T>(exact_matrix<T>(q.head(h), k.head(h), opts));  // every value: dense (memory-guarded)
      } else {
        const ExactOperator<T> op(q.head(h), k.head(h), opts);
        s = top_singular<T>(op, *top, so).values;
      }
      Eigen::Map<VectorX<double>>(out.mutable_data() + h * count, count) = s.head(count);
    }
  }
  return out;
}

// ---- sources ------------------------------------------------------------------------------------------------

template <typename T>
py::tuple generate_t(const SourceOptions& so, Index n, Index nk, Index d, Index dv, std::uint64_t seed) {
  Qkv<T> g;
  {
    py::gil_scoped_release release;
    g = generate_problem<T>(so, n, nk, d, dv, seed);
  }
  const auto to_np = [](const MatrixR<T>& m) {
    py::array_t<T> a({py::ssize_t(m.rows()), py::ssize_t(m.cols())});
    Eigen::Map<MatrixR<T>>(a.mutable_data(), m.rows(), m.cols()) = m;
    return a;
  };
  return py::make_tuple(to_np(g.q), to_np(g.k), to_np(g.v));
}

}  // namespace

PYBIND11_MODULE(attnlab, m) {
  m.doc() =
      "attnlab: exact softmax attention, its efficient approximations, and their error, spectra and cost.\n"
      "Arrays are numpy (n, d) or (heads, n, d), float32 or float64 (kept as given; C-contiguous arrays are not\n"
      "copied). PyTorch tensors: pass t.detach().cpu().numpy(). Bad specs, shapes, dtypes or NaN raise ValueError.";
  m.attr("__version__") = code_version();

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Interrupted&) {
      PyErr_SetNone(PyExc_KeyboardInterrupt);
    } catch (const Error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });

  m.def("methods", &methods_list,
        "Every registered method: name, summary, reference (the equation it implements), causal support, and its "
        "parameters (name, type, default, help).");

  m.def(
      "apply",
      [](const std::string& spec, const py::handle& q, const py::handle& k, const py::handle& v, bool causal,
         std::optional<double> scale, std::optional<std::uint64_t> seed, bool matrix) -> py::object {
        return is_f32(q) ? apply_t<float>(spec, q, k, v, causal, scale, seed, matrix)
                         : apply_t<double>(spec, q, k, v, causal, scale, seed, matrix);
      },
      py::arg("spec"), py::arg("q"), py::arg("k"), py::arg("v"), py::kw_only(), py::arg("causal") = false,
      py::arg("scale") = py::none(), py::arg("seed") = py::none(), py::arg("matrix") = false,
      "The output of method `spec` (e.g. 'nystrom:landmarks=32') on Q, K, V: softmax-attention's approximation "
      "P̃·V, shaped like Q with V's last dimension. matrix=True also returns P̃ (memory-guarded): (output, P̃). "
      "seed fills the spec's seed when it gives none; scale defaults to 1/sqrt(d).");

  m.def(
      "compare",
      [](const py::handle& q, const py::handle& k, const py::handle& v, std::optional<std::vector<std::string>> methods,
         bool causal, std::optional<double> scale, std::uint64_t seed, const std::string& matrix_metrics,
         Index matrix_limit, bool spectral, bool frame) -> py::object {
        const std::vector<std::string> specs = methods ? *methods : std::vector<std::string>{};
        if (methods && methods->empty()) throw Error("methods: an empty list; give specs or None for every method");
        return is_f32(q) ? compare_t<float>(q, k, v, specs, causal, scale, seed, matrix_metrics, matrix_limit,
                                            spectral, frame)
                         : compare_t<double>(q, k, v, specs, causal, scale, seed, matrix_metrics, matrix_limit,
                                             spectral, frame);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("methods") = py::none(), py::kw_only(),
      py::arg("causal") = false, py::arg("scale") = py::none(), py::arg("seed") = 0,
      py::arg("matrix_metrics") = "auto", py::arg("matrix_limit") = 4096, py::arg("spectral") = true,
      py::arg("frame") = true,
      "Every method in `methods` (specs; None: every registered method, the causal ones when causal=True) "
      "against exact attention, per head: output errors (out_rel_fro, out_max_abs, cosines), time, diagnostics "
      "and, for n ≤ matrix_limit (matrix_metrics='auto'), the errors of P̃ (P_rel_fro, P_rel_spectral, P_mean_kl, "
      "P_mean_tv). A pandas DataFrame when pandas is installed and frame=True, else a list of dicts.");

  m.def(
      "spectrum",
      [](const py::handle& q, const py::handle& k, std::optional<Index> top, bool causal, std::optional<double> scale,
         const std::string& solver, double tol) {
        return is_f32(q) ? spectrum_t<float>(q, k, top, causal, scale, solver, tol)
                         : spectrum_t<double>(q, k, top, causal, scale, solver, tol);
      },
      py::arg("q"), py::arg("k"), py::kw_only(), py::arg("top") = py::none(), py::arg("causal") = false,
      py::arg("scale") = py::none(), py::arg("solver") = "auto", py::arg("tol") = 1e-9,
      "Singular values of the exact attention matrix P = softmax(scale·QKᵀ), descending, in float64: all of them "
      "(dense SVD, P materialized; memory-guarded) or the top `top`, matrix-free (block Krylov; solver 'block', "
      "'lanczos', 'dense' or 'auto'; tol relative to σ₁). Shape (top,) or (heads, top).");

  m.def("sources", [] { return std::string(source_kinds()); }, "The generated sources' names.");
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
      py::arg("source") = "gaussian", py::arg("n") = 1024, py::arg("d") = 64, py::kw_only(),
      py::arg("n_k") = py::none(), py::arg("d_v") = py::none(), py::arg("seed") = 0, py::arg("dtype") = "float64",
      py::arg("temperature") = 1.0, py::arg("centres") = 32, py::arg("spread") = 0.3, py::arg("rank") = 8,
      "A generated problem (the experiments' sources), seeded: returns (q, k, v), each (n, d) (v: (n_k, d_v)). "
      "gaussian: iid N(0,1), logits divided by temperature; clustered: around `centres` shared centres with "
      "`spread`; lowrank: Q, K in a random rank-`rank` subspace.");

  m.def(
      "report",
      [](const py::handle& q, const py::handle& k, const py::handle& v, const std::string& model_dir,
         const std::string& out, double target, std::optional<std::vector<std::string>> families,
         const std::string& layers, Index seq, Index repeats, bool causal, bool quiet, int threads) {
        report::Options o;
        o.out = out;
        o.target = target;
        if (families) o.families = *families;
        o.repeats = repeats;
        o.causal = causal;
        o.progress = !quiet;
        o.threads = threads;
        std::vector<report::Layer> input;
        if (!model_dir.empty()) {
          if (!q.is_none() || !k.is_none() || !v.is_none())
            throw Error("report: give q, k, v or model_dir, not both");
          input = report::load_model_export(model_dir, layers, seq);
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
        {
          SigintGuard guard;
          py::gil_scoped_release release;
          s = report::write_report(input, o);
        }
        return s.index_html;
      },
      py::arg("q") = py::none(), py::arg("k") = py::none(), py::arg("v") = py::none(), py::kw_only(),
      py::arg("model_dir") = "", py::arg("out") = "attnlab_report", py::arg("target") = 0.05,
      py::arg("families") = py::none(), py::arg("layers") = "all", py::arg("seq") = 0, py::arg("repeats") = 3,
      py::arg("causal") = false, py::arg("quiet") = false, py::arg("threads") = 0,
      "Writes a report directory (index.html, report.csv, summary.md) answering 'which approximation for my "
      "model?': per head the entropy, spectrum, every method's error against its measured cost at several budgets, "
      "the Pareto frontier and the cheapest method under `target` output error; per layer × head the "
      "recommendation and its speed-up. Input: q, k, v ((heads, n, d), one layer) or model_dir (an export such "
      "as data/attention/trained, several layers). Returns the path of index.html.");

  m.def("threads", [] { return omp_get_max_threads(); }, "OpenMP threads the library uses.");
  m.def(
      "set_threads",
      [](int n) {
        if (n < 1) throw Error(fmt::format("set_threads: n must be ≥ 1, got {}", n));
        omp_set_num_threads(n);
      },
      py::arg("n"), "Sets the OpenMP threads the library uses (for calls from this thread).");

  // For the tests: the address the C++ side reads an array at (equal to the array's own when it is not copied).
  m.def(
      "_data_address",
      [](const py::handle& a) -> std::uintptr_t {
        return is_f32(a) ? std::uintptr_t(heads_of<float>(a, "q", false).data)
                         : std::uintptr_t(heads_of<double>(a, "q", false).data);
      },
      py::arg("a"));
}
