// attnlab._core.Method: a method built once from its spec, fitted on (Q, K) — one library Method<T> per head, T
// the dtype of Q at fit time — and then applied to many V, its operator P̃ applied to any X (or Pᵀ̃ to X), P̃
// materialized, its diagnostics and the top singular values of P̃ (block Krylov on the operator, never forming it).
//
// The Python layer (python/attnlab/__init__.py: attnlab.Method) checks the arguments' types, turns tensors and
// array-likes into numpy arrays and carries the docstrings; this class takes what it passes. Arrays as in
// module.cpp: (n, d) or (heads, n, d), float32 or float64, read in place when C-contiguous, refused with NaN or
// infinities; outputs checked finite. The GIL is released while C++ runs (run_released: Ctrl-C honoured, the
// module's threads).
//
// Threads: the fitted state is immutable once built and shared (std::shared_ptr) by every call that uses it; fit()
// builds a new one and swaps it in, so a call running on another Python thread keeps the state it started with. The
// methods' own lazy state (operators built on first use, workspaces) is not safe for concurrent use, so the calls
// on one fitted state take its mutex — always with the GIL released, so that no thread holds one while waiting for
// the other.
#include "method_binding.hpp"

#include "common.hpp"

#include "attnlab/analysis/evaluate.hpp"
#include "attnlab/components/spectrum.hpp"
#include "attnlab/core/error.hpp"
#include "attnlab/core/memory.hpp"
#include "attnlab/core/registry.hpp"
#include "attnlab/core/spec.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace py = pybind11;
using namespace attnlab;
using namespace attnlab_python;  // common.hpp: run_released, the array readers

namespace {

// ---- arrays (common.hpp: heads_of, check_qkv, new_array, head_label) ------------------------------------------

std::string shape_str(bool batched, Index heads, Index rows, Index cols) {
  return batched ? fmt::format("({}, {}, {})", heads, rows, cols) : fmt::format("({}, {})", rows, cols);
}

// ---- the fitted state ---------------------------------------------------------------------------------------

/// One fit: a library method per head, fitted on that head's Q and K; immutable once built.
template <typename T>
struct Fitted {
  using Scalar = T;
  std::vector<std::unique_ptr<Method<T>>> heads;
  bool batched = false;
  Index n_q = 0, n_k = 0, d = 0;
  std::mutex mutex;  // the methods' lazy state (operators built on first use, workspaces)
};

template <typename T>
using FittedPtr = std::shared_ptr<Fitted<T>>;

// ---- the class ----------------------------------------------------------------------------------------------

class PyMethod {
 public:
  /// `spec` with `options` (keyword parameters, values as a spec writes them) added: a parameter given both ways
  /// is refused. `seed` fills the spec's seed when it gives none (randomized methods; ignored by the others);
  /// strict: a seed given both in the spec and as `seed` is refused too (attnlab.Method), else the spec's wins
  /// (attnlab.apply, as it always has).
  PyMethod(const std::string& spec, const std::vector<std::pair<std::string, std::string>>& options, bool causal,
           std::optional<double> scale, std::optional<std::uint64_t> seed, bool strict, const std::string& precision,
           const std::string& policy)
      : text_(spec), seed_(seed), causal_(causal), scale_(scale) {
    opts_.storage = parse_storage(precision);
    opts_.policy = parse_policy(policy);
    Spec parsed = parse_spec(spec);
    const MethodDescriptor& d = find_method(parsed.name);  // an unknown name first: "did you mean"
    const auto given = [&](const std::string& key) {
      return std::find_if(parsed.values.begin(), parsed.values.end(), [&](const auto& kv) { return kv.first == key; });
    };
    if (strict && seed) {
      const auto s = given("seed");
      if (s != parsed.values.end())
        throw Error(fmt::format("{}: the seed is given twice, in the spec (seed={}) and as seed={}; give it once",
                                d.name, s->second, *seed));
    }
    if (!options.empty()) {
      for (const auto& [key, value] : options) {
        const auto s = given(key);
        if (s != parsed.values.end())
          throw Error(fmt::format("{}: parameter '{}' is given twice, in the spec ({}={}) and as a keyword ({}={}); "
                                  "give it once", d.name, key, key, s->second, key, value));
        if (value.empty() || value.find_first_of(",=: \t\n") != std::string::npos)
          throw Error(fmt::format("{}: {}='{}' is not a value a spec can hold (no ',', '=', ':' or spaces)", d.name,
                                  key, value));
      }
      for (const auto& kv : options) parsed.values.push_back(kv);
      text_ = parsed.name;
      char sep = ':';
      for (const auto& [key, value] : parsed.values) {
        text_ += sep + key + "=" + value;
        sep = ',';
      }
    }
    const auto proto = make_method<double>(text_, seed_);  // unknown parameters, bad values: the library's messages
    if (causal && !proto->supports_causal())
      throw Error(fmt::format("method '{}' cannot honour a causal mask (it would leak the future); use a causal "
                              "method or causal=False", proto->name()));
    if (scale && !(std::isfinite(*scale) && *scale > 0))
      throw Error(fmt::format("scale must be finite and positive, got {}", *scale));
    canonical_ = proto->spec();
    name_ = proto->name();
    short_ = short_spec(d, proto->params());
    lookahead_ = proto->lookahead();
    supports_causal_ = proto->supports_causal();
    opts_.causal = causal;
    opts_.scale = scale ? *scale : std::numeric_limits<double>::quiet_NaN();
    // A reduced storage the method does not emulate under this policy: refused here, before any data.
    proto->check_storage_support(opts_.storage, opts_.policy);
  }

  const std::string& spec() const { return canonical_; }
  const std::string& short_form() const { return short_; }
  const std::string& name() const { return name_; }
  const std::string& lookahead() const { return lookahead_; }
  bool causal() const { return causal_; }
  bool supports_causal() const { return supports_causal_; }
  std::optional<double> scale() const { return scale_; }
  bool fitted() const { return !std::holds_alternative<std::monostate>(state_); }

  py::object dtype() const {
    if (std::holds_alternative<FittedPtr<float>>(state_)) return py::str("float32");
    if (std::holds_alternative<FittedPtr<double>>(state_)) return py::str("float64");
    return py::none();
  }
  /// (heads or None, n_q, n_k, d, resolved scale) of the fit, or None.
  py::object fit_shape() const {
    if (!fitted()) return py::none();
    return visit("", [](const auto& f) -> py::object {
      const auto& m = *f->heads.front();
      return py::make_tuple(f->batched ? py::object(py::int_(f->heads.size())) : py::object(py::none()), f->n_q,
                            f->n_k, f->d, m.options().scale);
    });
  }

  // ---- fit --------------------------------------------------------------------------------------------------

  void fit(const py::handle& qo, const py::handle& ko) {
    unfit_on_error([&] {
      if (is_f32(qo)) fit_t<float>(qo, ko);
      else fit_t<double>(qo, ko);
    });
  }

  /// Fit on (Q, K), then the output for V, every check on the three first. keep: the fit stays (Method.__call__);
  /// otherwise (attnlab.apply) one method object runs the heads in turn, so that memory holds one head's work, and
  /// this object stays as it was. matrix: also P̃ (output, P̃).
  py::object call(const py::handle& qo, const py::handle& ko, const py::handle& vo, bool matrix, bool keep) {
    const auto run = [&] {
      return is_f32(qo) ? call_t<float>(qo, ko, vo, matrix, keep) : call_t<double>(qo, ko, vo, matrix, keep);
    };
    if (!keep) return run();
    py::object out;
    unfit_on_error([&] { out = run(); });
    return out;
  }

  // ---- the fitted method ------------------------------------------------------------------------------------

  py::object output(const py::handle& vo) const {
    return visit("output(v)", [&](const auto& f) -> py::object {
      using T = typename std::decay_t<decltype(*f)>::Scalar;
      const Heads<T> v = operand<T>(*f, vo, "v", f->n_k, "n_k", "output(v)");
      return output_heads<T>(*f, v);
    });
  }

  /// The backward pass of output(v) for the upstream gradient dO: (dQ, dK, dV), shaped as the fit's Q and K and as V.
  py::object backward(const py::handle& vo, const py::handle& d_out_o) const {
    return visit("backward(v, do)", [&](const auto& f) -> py::object {
      using T = typename std::decay_t<decltype(*f)>::Scalar;
      const Heads<T> v = operand<T>(*f, vo, "v", f->n_k, "n_k", "backward(v, do)");
      const Heads<T> d_out = operand<T>(*f, d_out_o, "do", f->n_q, "n_q", "backward(v, do)");
      if (d_out.cols != v.cols)
        throw Error(fmt::format("backward(v, do): do has {} columns, v has {}: do is the gradient of the output, "
                                "(n_q, d_v)", d_out.cols, v.cols));
      const Index heads = Index(f->heads.size());
      py::array_t<T> dq = new_array<T>(f->batched, heads, f->n_q, f->d);
      py::array_t<T> dk = new_array<T>(f->batched, heads, f->n_k, f->d);
      py::array_t<T> dv = new_array<T>(f->batched, heads, f->n_k, v.cols);
      T *pq = dq.mutable_data(), *pk = dk.mutable_data(), *pv = dv.mutable_data();
      const std::string label = fmt::format("the gradients of {}", canonical_);
      run_released([&] {
        std::lock_guard<std::mutex> lock(f->mutex);
        for (Index h = 0; h < heads; ++h) {
          throw_if_cancelled();
          const Gradients<T> g = f->heads[std::size_t(h)]->backward(v.head(h), d_out.head(h));
          // As output(): under a reduced storage a non-finite gradient is the finding (returned, counted in
          // diagnostics' gradient_nonfinite and warned by the Python layer); natively an error.
          if (opts_.storage == Storage::native)
            for (const MatrixR<T>* x : {&g.dq, &g.dk, &g.dv})
              require_finite_output(*x, head_label(label, f->batched, h));
          Eigen::Map<MatrixR<T>>(pq + h * f->n_q * f->d, f->n_q, f->d) = g.dq;
          Eigen::Map<MatrixR<T>>(pk + h * f->n_k * f->d, f->n_k, f->d) = g.dk;
          Eigen::Map<MatrixR<T>>(pv + h * f->n_k * v.cols, f->n_k, v.cols) = g.dv;
        }
      });
      return py::make_tuple(std::move(dq), std::move(dk), std::move(dv));
    });
  }

  /// P̃·X (transpose: P̃ᵀ·X).
  py::object apply(const py::handle& xo, bool transpose) const {
    const char* what = transpose ? "apply_transpose(x)" : "apply(x)";
    return visit(what, [&](const auto& f) -> py::object {
      using T = typename std::decay_t<decltype(*f)>::Scalar;
      const Index rows = transpose ? f->n_q : f->n_k, out_rows = transpose ? f->n_k : f->n_q;
      const Heads<T> x = operand<T>(*f, xo, "x", rows, transpose ? "n_q" : "n_k", what);
      py::array_t<T> out = new_array<T>(f->batched, Index(f->heads.size()), out_rows, x.cols);
      T* dst = out.mutable_data();
      const std::string label = fmt::format("{} of {}", transpose ? "P̃ᵀ·X" : "P̃·X", canonical_);
      run_released([&] {
        std::lock_guard<std::mutex> lock(f->mutex);
        for (std::size_t h = 0; h < f->heads.size(); ++h) {
          throw_if_cancelled();
          const AttentionOperator<T>& op = f->heads[h]->op();
          const MatrixR<T> y = transpose ? op.apply_transpose(x.head(Index(h))) : op.apply(x.head(Index(h)));
          require_finite_output(y, head_label(label, f->batched, Index(h)));
          Eigen::Map<MatrixR<T>>(dst + Index(h) * out_rows * x.cols, out_rows, x.cols) = y;
        }
      });
      return std::move(out);
    });
  }

  py::object matrix() const {
    return visit("matrix()", [&](const auto& f) -> py::object { return matrix_of(f); });
  }

  /// P̃ of one fit (the one a call started with, even if another thread refits meanwhile).
  template <typename T>
  py::object matrix_of(const FittedPtr<T>& f) const {
    const Index heads = Index(f->heads.size());
    check_memory(matrix_bytes(std::uint64_t(heads * f->n_q), std::uint64_t(f->n_k), sizeof(T)),
                 "matrix(): P̃ of {}, {} × {}{} ({})", canonical_, f->n_q, f->n_k,
                 f->batched ? fmt::format(" on each of {} heads", heads) : "",
                 dtype_name(dtype_of<T>()));
    py::array_t<T> out = new_array<T>(f->batched, heads, f->n_q, f->n_k);
    T* dst = out.mutable_data();
    run_released([&] {
      std::lock_guard<std::mutex> lock(f->mutex);
      for (Index h = 0; h < heads; ++h) {
        throw_if_cancelled();
        const MatrixR<T> p = f->heads[h]->matrix();
        require_finite_output(p, head_label(fmt::format("the matrix of {}", canonical_), f->batched, h));
        Eigen::Map<MatrixR<T>>(dst + h * f->n_q * f->n_k, f->n_q, f->n_k) = p;
      }
    });
    return std::move(out);
  }

  /// Singular values of P̃, descending, float64: every one (top None: dense SVD of P̃, memory-guarded) or the top
  /// `top` of the operator, matrix-free (top_singular: solver, tol).
  py::object spectrum(const std::optional<Index>& top, const std::string& solver_name, double tol) const {
    return visit("spectrum()", [&](const auto& f) -> py::object {
      using T = typename std::decay_t<decltype(*f)>::Scalar;
      const Index nmin = std::min(f->n_q, f->n_k), heads = Index(f->heads.size());
      if (top && (*top < 1 || *top > nmin))
        throw Error(fmt::format("top = {} is out of range: 1 ≤ top ≤ min(n_q, n_k) = {}", *top, nmin));
      if (!(std::isfinite(tol) && tol > 0)) throw Error(fmt::format("tol must be finite and positive, got {}", tol));
      TopSingularOptions so;
      so.solver = parse_spectrum_solver(solver_name);
      so.tol = tol;
      const Index count = top ? *top : nmin;
      py::array_t<double> out = f->batched ? py::array_t<double>({py::ssize_t(heads), py::ssize_t(count)})
                                           : py::array_t<double>({py::ssize_t(count)});
      double* dst = out.mutable_data();
      const std::string label = fmt::format("P̃ of {}", canonical_);
      run_released([&] {
        std::lock_guard<std::mutex> lock(f->mutex);
        for (Index h = 0; h < heads; ++h) {
          throw_if_cancelled();
          const Method<T>& m = *f->heads[h];
          VectorX<double> s;
          if (!top) {
            // Every value: dense. P̃ is checked first: an SVD of a matrix with NaN returns neither an error nor a
            // full spectrum.
            const MatrixR<T> p = m.matrix();
            require_finite_output(p, head_label(label, f->batched, h));
            s = singular_values<T>(p);
          } else {
            const AttentionOperator<T>& op = m.op();
            // The same check matrix-free: P̃·1 is NaN in every row of P̃ that is.
            require_finite_output<T>(op.apply(MatrixR<T>::Ones(f->n_k, 1)), head_label(label, f->batched, h));
            s = top_singular<T>(op, *top, so).values;
          }
          if (s.size() < count || !all_finite(s.head(count)))
            throw Error(fmt::format("{} has non-finite values: a numerical failure",
                                    head_label(fmt::format("the spectrum of {}", canonical_), f->batched, h)));
          Eigen::Map<VectorX<double>>(dst + h * count, count) = s.head(count);
        }
      });
      return std::move(out);
    });
  }

  /// The method's diagnostics, name → value: a dict, or one per head (a list) after a batched fit.
  py::object diagnostics() const {
    return visit("diagnostics", [&](const auto& f) -> py::object {
      std::vector<std::vector<std::pair<std::string, double>>> all;
      run_released([&] {
        std::lock_guard<std::mutex> lock(f->mutex);
        for (const auto& m : f->heads) all.push_back(m->diagnostics());
      });
      // Under a reduced storage: what rounding did per intermediate, and the output's check (core/method.hpp).
      if (opts_.storage != Storage::native) {
        std::size_t h = 0;
        for (const auto& m : f->heads) {
          for (const auto& row : reduced_storage_diagnostics(*m)) all[h].push_back(row);
          const auto g = m->gradient_check();  // the last backward()'s dQ, dK, dV (0 before any)
          all[h].emplace_back("gradient_nonfinite", double(g.nonfinite));
          ++h;
        }
      }
      py::list heads;
      for (const auto& one : all) {
        py::dict d;
        for (const auto& [name, value] : one) d[py::str(name)] = value;
        heads.append(d);
      }
      if (!f->batched) return heads[0];
      return std::move(heads);
    });
  }

  /// An upper bound on rank(P̃) (the largest over heads), or None when the method is not rank-limited.
  py::object rank_bound() const {
    return visit("rank_bound", [&](const auto& f) -> py::object {
      Index r = -1;
      bool unbounded = false;
      run_released([&] {
        std::lock_guard<std::mutex> lock(f->mutex);
        for (const auto& m : f->heads) {
          const Index b = m->rank_bound();
          if (b < 0) unbounded = true;
          r = std::max(r, b);
        }
      });
      if (unbounded || r < 0) return py::none();
      return py::int_(r);
    });
  }

  /// "success", or each status that is not, with its heads ("no convergence (heads 0, 2)").
  py::object status() const {
    return visit("status", [&](const auto& f) -> py::object {
      std::vector<std::pair<std::string, std::vector<Index>>> bad;
      for (std::size_t h = 0; h < f->heads.size(); ++h) {
        const Status s = f->heads[h]->info();
        if (s == Status::Success) continue;
        const std::string name = status_name(s);
        auto it = std::find_if(bad.begin(), bad.end(), [&](const auto& b) { return b.first == name; });
        if (it == bad.end()) bad.push_back({name, {Index(h)}});
        else it->second.push_back(Index(h));
      }
      if (bad.empty()) return py::str("success");
      std::string text;
      for (const auto& [name, heads] : bad) {
        if (!text.empty()) text += "; ";
        text += name;
        if (f->batched) text += fmt::format(" (head{} {})", heads.size() == 1 ? "" : "s", fmt::join(heads, ", "));
      }
      return py::str(text);
    });
  }

 private:
  using State = std::variant<std::monostate, FittedPtr<float>, FittedPtr<double>>;

  /// f(shared_ptr<Fitted<T>>) on the fitted state (a reference that keeps it alive through the call), or Error
  /// naming what needs the fit.
  /// Runs a refit: the previous fit stays in place while the new one is computed (with the GIL released, other
  /// threads go on using it), and is replaced only when the new one is complete; a fit that fails leaves the method
  /// unfitted, never on its previous data.
  template <typename F>
  void unfit_on_error(F&& refit) {
    try {
      refit();
    } catch (...) {
      state_ = std::monostate{};
      throw;
    }
  }

  template <typename F>
  py::object visit(const char* what, F&& fn) const {
    if (const auto* f = std::get_if<FittedPtr<float>>(&state_)) {
      const FittedPtr<float> keep = *f;
      return fn(keep);
    }
    if (const auto* f = std::get_if<FittedPtr<double>>(&state_)) {
      const FittedPtr<double> keep = *f;
      return fn(keep);
    }
    throw Error(fmt::format("{}: the method is not fitted; call fit(q, k) first", what));
  }

  /// An array to apply the fitted method to (V, X): the fit's layout and heads, `rows` rows.
  template <typename T>
  Heads<T> operand(const Fitted<T>& f, const py::handle& obj, const char* name, Index rows, const char* rows_name,
                   const char* what) const {
    const Heads<T> x = heads_of<T>(obj, name, "the fit's");
    const Index heads = Index(f.heads.size());
    if (x.batched != f.batched || x.heads != heads)
      throw Error(fmt::format("{}: {} has shape {}, but the method was fitted on {}; give {} as {}", what, name,
                              shape_str(x.batched, x.heads, x.rows, x.cols),
                              f.batched ? fmt::format("{} heads", heads) : std::string("(n, d) inputs"), name,
                              f.batched ? fmt::format("({}, {}, ·)", heads, rows) : fmt::format("({}, ·)", rows)));
    if (x.rows != rows)
      throw Error(fmt::format("{}: {} has {} rows, but P̃ is n_q × n_k = {} × {}: {} needs {} = {} rows", what, name,
                              x.rows, f.n_q, f.n_k, name, rows_name, rows));
    return x;
  }

  template <typename T>
  FittedPtr<T> fit_heads(const Heads<T>& q, const Heads<T>& k, Index d_v) const {
    auto f = std::make_shared<Fitted<T>>();
    f->batched = q.batched;
    f->n_q = q.rows;
    f->n_k = k.rows;
    f->d = q.cols;
    for (Index h = 0; h < q.heads; ++h) f->heads.push_back(make_method<T>(text_, seed_));
    precheck<T>(*f->heads.front(), q, k, d_v, q.heads);
    run_released([&] {
      for (Index h = 0; h < q.heads; ++h) {
        throw_if_cancelled();
        f->heads[h]->compute(q.head(h), k.head(h), opts_);
      }
    });
    return f;
  }

  /// Before any work: a budget beyond the sequence, or more memory than the guard allows (the fit keeps every
  /// head's state: `kept` heads of it).
  template <typename T>
  void precheck(const Method<T>& m, const Heads<T>& q, const Heads<T>& k, Index d_v, Index kept) const {
    const ProblemSize size{q.rows, k.rows, q.cols, d_v, sizeof(T)};
    check_method_fits(m, size);
    if (kept > 1) {
      const std::uint64_t one = m.memory_estimate(size);
      if (one > 0)
        check_memory(matrix_bytes(one, std::uint64_t(kept), 1),
                     "{} fitted on {} heads (each head's state is kept) of n_q = {}, n_k = {}, d = {} ({})",
                     m.spec(), kept, q.rows, k.rows, q.cols, dtype_name(dtype_of<T>()));
    }
  }

  template <typename T>
  void fit_t(const py::handle& qo, const py::handle& ko) {
    const Heads<T> q = heads_of<T>(qo, "q"), k = heads_of<T>(ko, "k");
    check_qkv<T>(q, k, nullptr);
    state_ = fit_heads<T>(q, k, q.cols);
  }

  template <typename T>
  py::array_t<T> output_heads(Fitted<T>& f, const Heads<T>& v) const {
    const Index heads = Index(f.heads.size());
    py::array_t<T> out = new_array<T>(f.batched, heads, f.n_q, v.cols);
    T* dst = out.mutable_data();
    const std::string label = fmt::format("the output of {}", canonical_);
    run_released([&] {
      std::lock_guard<std::mutex> lock(f.mutex);
      for (Index h = 0; h < heads; ++h) {
        throw_if_cancelled();
        // A numerical failure (e.g. float64 inputs of 1e300 overflow the scores) is an error, never a silent NaN.
        // Under a reduced storage the failure is the finding: returned, and said by diagnostics (output_nonfinite,
        // output_zero_rows) and by the Python layer's warning.
        const MatrixR<T> o = f.heads[h]->output(v.head(h));
        if (opts_.storage == Storage::native) require_finite_output(o, head_label(label, f.batched, h));
        Eigen::Map<MatrixR<T>>(dst + h * f.n_q * v.cols, f.n_q, v.cols) = o;
      }
    });
    return out;
  }

  template <typename T>
  py::object call_t(const py::handle& qo, const py::handle& ko, const py::handle& vo, bool matrix, bool keep) {
    const Heads<T> q = heads_of<T>(qo, "q"), k = heads_of<T>(ko, "k"), v = heads_of<T>(vo, "v");
    check_qkv(q, k, &v);
    if (keep) {
      FittedPtr<T> f = fit_heads<T>(q, k, v.cols);
      state_ = f;
      py::array_t<T> out = output_heads<T>(*f, v);
      if (!matrix) return std::move(out);
      return py::make_tuple(out, matrix_of(f));
    }
    auto method = make_method<T>(text_, seed_);
    precheck<T>(*method, q, k, v.cols, 1);
    return apply_heads<T>(*method, q, k, v, opts_, matrix);
  }

  std::string text_;  // the spec as given, keyword parameters added
  std::optional<std::uint64_t> seed_;
  bool causal_ = false;
  std::optional<double> scale_;
  AttentionOptions opts_;
  std::string canonical_, short_, name_, lookahead_;
  bool supports_causal_ = false;
  State state_;
};

}  // namespace

void bind_method(py::module_& m) {
  // The docstrings users read are the Python layer's (attnlab.Method); these name what each member takes.
  py::class_<PyMethod>(m, "Method", "attnlab's compiled Method; use attnlab.Method (it checks its arguments).")
      .def(py::init<const std::string&, const std::vector<std::pair<std::string, std::string>>&, bool,
                    std::optional<double>, std::optional<std::uint64_t>, bool, const std::string&,
                    const std::string&>(),
           py::arg("spec"), py::arg("options"), py::arg("causal"), py::arg("scale"), py::arg("seed"),
           py::arg("strict"), py::arg("precision") = "native", py::arg("policy") = "eager")
      .def_property_readonly("spec", &PyMethod::spec)
      .def_property_readonly("short_spec", &PyMethod::short_form)
      .def_property_readonly("name", &PyMethod::name)
      .def_property_readonly("lookahead", &PyMethod::lookahead)
      .def_property_readonly("causal", &PyMethod::causal)
      .def_property_readonly("supports_causal", &PyMethod::supports_causal)
      .def_property_readonly("scale", &PyMethod::scale)
      .def_property_readonly("fitted", &PyMethod::fitted)
      .def_property_readonly("dtype", &PyMethod::dtype)
      .def_property_readonly("fit_shape", &PyMethod::fit_shape)
      .def_property_readonly("diagnostics", &PyMethod::diagnostics)
      .def_property_readonly("rank_bound", &PyMethod::rank_bound)
      .def_property_readonly("status", &PyMethod::status)
      .def("fit", &PyMethod::fit, py::arg("q"), py::arg("k"))
      .def("call", &PyMethod::call, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("matrix"), py::arg("keep"))
      .def("output", &PyMethod::output, py::arg("v"))
      .def("backward", &PyMethod::backward, py::arg("v"), py::arg("do"))
      .def("apply", &PyMethod::apply, py::arg("x"), py::arg("transpose"))
      .def("matrix", &PyMethod::matrix)
      .def("spectrum", &PyMethod::spectrum, py::arg("top"), py::arg("solver"), py::arg("tol"));
}
