// What every translation unit of the Python core (attnlab._core) shares: the module's OpenMP thread count, the
// Ctrl-C handler and run_released(), the one way C++ work runs from Python (module.cpp's functions and
// method_binding.cpp's Method class alike). Inline functions: module_threads() is one setting for the whole module.
#pragma once

#include "attnlab/core/cancel.hpp"
#include "attnlab/core/error.hpp"

#include <omp.h>
#include <Eigen/Core>
#include <fmt/format.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "attnlab/core/types.hpp"

#include <csignal>
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

}  // namespace attnlab_python
