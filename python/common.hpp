// What every translation unit of the Python core (attnlab._core) shares: the module's OpenMP thread count, the
// Ctrl-C handler and run_released(), the one way C++ work runs from Python (module.cpp's functions and
// method_binding.cpp's Method class alike). Inline functions: module_threads() is one setting for the whole module.
#pragma once

#include "attnlab/analysis/evaluate.hpp"
#include "attnlab/core/cancel.hpp"
#include "attnlab/core/error.hpp"
#include "attnlab/core/method.hpp"
#include "attnlab/core/options.hpp"

#include <omp.h>
#include <Eigen/Core>
#include <fmt/format.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "attnlab/core/types.hpp"

#include <csignal>
#include <string>
#include <thread>

namespace attnlab_python {

// ---- threads ------------------------------------------------------------------------------------------------

/// The OpenMP default of this process as libgomp derived it from the environment (OMP_NUM_THREADS, else the CPUs
/// this process may run on). Read on a fresh thread: omp_set_num_threads changes only the calling thread's
/// setting, and libraries loaded before attnlab may have called it on the main thread — PyTorch sets it to its
/// count of physical cores when imported (1 on a 2-vCPU machine), which halved the module's threads.
inline int initial_threads() {
  int n = 1;
  std::thread([&n] { n = omp_get_max_threads(); }).join();
  return n;
}

/// The module's thread count (threads(), set_threads()): one for every translation unit.
inline int& module_threads() {
  static int n = initial_threads();
  return n;
}

/// For one call: the calling thread runs OpenMP regions on the module's thread count, and gets its own setting
/// back afterwards (PyTorch reads the same libgomp setting for its thread count; an attnlab call must not change it).
class ThreadsGuard {
 public:
  ThreadsGuard() : saved_(omp_get_max_threads()) { omp_set_num_threads(module_threads()); }
  ~ThreadsGuard() { omp_set_num_threads(saved_); }
  ThreadsGuard(const ThreadsGuard&) = delete;
  ThreadsGuard& operator=(const ThreadsGuard&) = delete;

 private:
  int saved_;
};

// ---- Ctrl-C -------------------------------------------------------------------------------------------------

/// While C++ runs with the GIL released, Python's own SIGINT handler cannot run: this one sets the library's
/// cancel flag instead (and nothing else: it must be async-signal-safe), and the previous handler comes back after.
class SigintGuard {
 public:
  SigintGuard() {
    attnlab::clear_cancel();
    const pybind11::object threading = pybind11::module_::import("threading");
    installed_ = threading.attr("current_thread")().is(threading.attr("main_thread")());
    if (!installed_) return;
    struct sigaction sa {};
    sa.sa_handler = [](int) { attnlab::request_cancel(); };
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_);
  }
  ~SigintGuard() {
    if (installed_) sigaction(SIGINT, &old_, nullptr);
    attnlab::clear_cancel();
  }
  SigintGuard(const SigintGuard&) = delete;
  SigintGuard& operator=(const SigintGuard&) = delete;

 private:
  bool installed_ = false;
  struct sigaction old_ {};
};

/// Runs `work` as every call's C++ part runs: Ctrl-C honoured, the module's threads, the GIL released. The cost
/// harness reports an interruption inside a timed call as a refused cost (Interrupted is an Error); a cancel
/// request still pending when an Error leaves is that interruption, and becomes KeyboardInterrupt.
template <typename F>
void run_released(F&& work) {
  SigintGuard sigint;
  ThreadsGuard threads;
  pybind11::gil_scoped_release release;
  try {
    work();
  } catch (const attnlab::Error&) {
    attnlab::throw_if_cancelled();
    throw;
  }
}

// ---- arrays: what the module's functions and attnlab.Method both read -------------------------------------

/// A (n, d) or (h, n, d) float array seen as h row-major matrices, read in place when C-contiguous.
template <typename T>
struct Heads {
  pybind11::array_t<T> array;  // keeps the buffer alive (the caller's array, or its contiguous copy)
  attnlab::Index heads = 1, rows = 0, cols = 0;
  bool batched = false;
  const T* data = nullptr;
  Eigen::Map<const attnlab::MatrixR<T>> head(attnlab::Index h) const { return {data + h * rows * cols, rows, cols}; }
};

inline std::string dtype_str(const pybind11::array& a) { return pybind11::str(a.dtype()).cast<std::string>(); }

inline pybind11::array as_array(const pybind11::handle& obj, const char* name) {
  if (obj.is_none()) throw attnlab::Error(fmt::format("{}: an array is required, got None", name));
  pybind11::array a = pybind11::array::ensure(obj);
  if (!a) throw attnlab::Error(fmt::format("{}: not convertible to a numpy array", name));
  return a;
}

/// The dtype a call or a fit computes in: Q's, which must be float32 or float64.
inline bool is_f32(const pybind11::handle& q) {
  const pybind11::array a = as_array(q, "q");
  if (a.dtype().is(pybind11::dtype::of<float>())) return true;
  if (a.dtype().is(pybind11::dtype::of<double>())) return false;
  throw attnlab::Error(fmt::format("q: dtype {} is not supported; give float32 or float64 arrays", dtype_str(a)));
}

/// `name` as h matrices of T, read in place when C-contiguous, refused when empty or (check_finite) with NaN or
/// infinities; `ref` says where T comes from in the message of a dtype mismatch (Q's; the fit's, for V and X).
template <typename T>
Heads<T> heads_of(const pybind11::handle& obj, const char* name, const char* ref = "q's", bool check_finite = true) {
  namespace py = pybind11;
  using attnlab::Error;
  using attnlab::Index;
  py::array a = as_array(obj, name);
  if (!a.dtype().is(py::dtype::of<T>()))
    throw Error(fmt::format("{}: dtype {} differs from {} {}; give Q, K, V one dtype (float32 or float64)", name,
                            dtype_str(a), ref, attnlab::dtype_name(attnlab::dtype_of<T>())));
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
    const Eigen::Map<const attnlab::VectorX<T>> all(h.data, h.heads * h.rows * h.cols);
    if (!attnlab::all_finite(all)) throw Error(fmt::format("{}: has NaN or infinite values", name));
  }
  return h;
}

/// Q and K (and V when given) agree: the same layout and heads, Q's and K's d, one row of V per key.
template <typename T>
void check_qkv(const Heads<T>& q, const Heads<T>& k, const Heads<T>* v) {
  using attnlab::Error;
  if (q.batched != k.batched || q.heads != k.heads || (v && (v->batched != q.batched || v->heads != q.heads))) {
    if (v) throw Error("q, k, v: give all three as (n, d) or all as (heads, n, d) with the same number of heads");
    throw Error("q, k: give both as (n, d) or both as (heads, n, d) with the same number of heads");
  }
  if (q.cols != k.cols)
    throw Error(fmt::format("q, k: head dimensions differ (q has d = {}, k has {})", q.cols, k.cols));
  if (v && v->rows != k.rows)
    throw Error(fmt::format("k, v: different lengths (k has {} rows, v has {})", k.rows, v->rows));
}

/// A new (h, rows, cols) or (rows, cols) array.
template <typename T>
pybind11::array_t<T> new_array(bool batched, attnlab::Index heads, attnlab::Index rows, attnlab::Index cols) {
  using pybind11::ssize_t;
  if (batched) return pybind11::array_t<T>({ssize_t(heads), ssize_t(rows), ssize_t(cols)});
  return pybind11::array_t<T>({ssize_t(rows), ssize_t(cols)});
}

/// What an output check names: `what`, with its head after a (heads, n, d) call.
inline std::string head_label(const std::string& what, bool batched, attnlab::Index h) {
  return batched ? fmt::format("{} (head {})", what, h) : what;
}

// ---- one call of a method on every head ---------------------------------------------------------------------

/// `method` fitted on each head's Q and K in turn with `opts` (the fit not kept: memory holds one head's work), its
/// output P̃·V — and with `matrix` P̃ itself — checked finite and written into new arrays: the output, or
/// (output, P̃). The one loop of module.cpp's apply() and of Method's call when it keeps no fit (attnlab.apply).
template <typename T>
pybind11::object apply_heads(attnlab::Method<T>& method, const Heads<T>& q, const Heads<T>& k, const Heads<T>& v,
                             const attnlab::AttentionOptions& opts, bool matrix) {
  using attnlab::Index;
  using attnlab::MatrixR;
  pybind11::array_t<T> out = new_array<T>(q.batched, q.heads, q.rows, v.cols);
  pybind11::array_t<T> p;
  if (matrix) p = new_array<T>(q.batched, q.heads, q.rows, k.rows);
  T* out_data = out.mutable_data();  // taken while the GIL is held
  T* p_data = matrix ? p.mutable_data() : nullptr;
  run_released([&] {
    for (Index h = 0; h < q.heads; ++h) {
      attnlab::throw_if_cancelled();
      method.compute(q.head(h), k.head(h), opts);
      // A numerical failure (e.g. float64 inputs of 1e300 overflow the scores) is an error, never a silent NaN:
      // the command refuses it the same way.
      const MatrixR<T> o = method.output(v.head(h));
      if (opts.storage == attnlab::Storage::native)  // under a reduced storage the failure is the finding
        attnlab::require_finite_output(o, head_label(fmt::format("the output of {}", method.spec()), q.batched, h));
      Eigen::Map<MatrixR<T>>(out_data + h * q.rows * v.cols, q.rows, v.cols) = o;
      if (matrix) {
        const MatrixR<T> ph = method.matrix();
        attnlab::require_finite_output(ph, head_label(fmt::format("the matrix of {}", method.spec()), q.batched, h));
        Eigen::Map<MatrixR<T>>(p_data + h * q.rows * k.rows, q.rows, k.rows) = ph;
      }
    }
  });
  if (matrix) return pybind11::make_tuple(out, p);
  return std::move(out);
}

}  // namespace attnlab_python
