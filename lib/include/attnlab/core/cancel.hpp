// Cooperative cancellation. Long computations (the streaming kernels' tile loops, the block Krylov passes, loops
// over heads and methods) poll cancel_requested() and stop with Interrupted, so that Ctrl-C from Python or a
// terminal is honoured within a tile rather than after minutes. request_cancel() only stores to a lock-free atomic:
// it is safe to call from a signal handler. Inside an OpenMP loop a tile is skipped (an exception may not leave the
// parallel region) and throw_if_cancelled() follows the region.
#pragma once

#include "attnlab/core/error.hpp"

#include <atomic>

namespace attnlab {

class Interrupted : public Error {
 public:
  Interrupted() : Error("interrupted") {}
};

namespace detail {
inline std::atomic<bool> cancel_flag{false};
}  // namespace detail

inline void request_cancel() noexcept { detail::cancel_flag.store(true, std::memory_order_relaxed); }
inline void clear_cancel() noexcept { detail::cancel_flag.store(false, std::memory_order_relaxed); }
inline bool cancel_requested() noexcept { return detail::cancel_flag.load(std::memory_order_relaxed); }
inline void throw_if_cancelled() {
  if (cancel_requested()) throw Interrupted();
}

static_assert(std::atomic<bool>::is_always_lock_free, "request_cancel must be async-signal-safe");

}  // namespace attnlab
