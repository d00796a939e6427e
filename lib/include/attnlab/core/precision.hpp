// Emulated storage precision (issue "Reduced precision"): a method run as users run it in bfloat16 or float16 stores
// every tensor it materialises in that format while its products and reductions accumulate in float32 — what tensor
// cores and eager frameworks do. attnlab emulates it exactly on the CPU: the computation runs in float32
// (Method<float>) and each stored tensor is rounded to the format where it is formed (core/formats.hpp's rounding:
// to nearest, ties to even; overflow to ±inf; subnormals as the format has them), counting what the rounding did.
//
// Two policies say which intermediates are stored in the format:
//   eager    every intermediate: what a straightforward transcription under .half() / .bfloat16() stores (logits,
//            normalisers, key–value states, softmax sums, running accumulators included);
//   careful  the tensors (inputs, features, probabilities, outputs) only; accumulators, normalisers, softmax statistics
//            and prefix / key–value states stay in float32, as FlashAttention and the fixed reference kernels keep
//            them.
// Each method declares which of its intermediates are which (MethodDescriptor::storage_note, `attnlab methods`).
#pragma once

#include "attnlab/core/formats.hpp"
#include "attnlab/core/types.hpp"

#include <cstdint>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

namespace attnlab {

/// The storage precision of one call: native (nothing rounded: float32 or float64, the computing type), bf16 or fp16.
enum class Storage { native, bf16, fp16 };
/// Which intermediates a reduced storage rounds (the header's note).
enum class Policy { eager, careful };
/// What an intermediate is: a tensor the method materialises (rounded under both policies) or an accumulator
/// (normalisers, softmax statistics, logits before the softmax, prefix and key–value states, running sums: rounded
/// under eager only).
enum class Held { tensor, accumulator };

/// "native", "bf16", "fp16" (also "bfloat16", "float16"); "fp64", "fp32" and their long names give native (the
/// computing type decides: the caller picks float64 or float32).
std::string storage_name(Storage s);
Storage parse_storage(const std::string& name);
std::string policy_name(Policy p);
Policy parse_policy(const std::string& name);
/// The format a reduced storage rounds to (bf16 or fp16).
Format storage_format(Storage s);

/// x rounded to the storage format, exactly (round_to's value), from a float32 by bit operations: bf16 drops the 16
/// low bits to nearest even; fp16 scales to the format's quantum and rounds with nearbyint. Native returns x.
float round_stored(Storage s, float x);

/// What storing one tensor found: its entries, those that overflowed (±inf as stored: a finite value the format rounds
/// to ±inf, or one the float32 arithmetic before it already overflowed — in bf16, whose range is float32's, nearly the
/// only way), those that underflowed (nonzero, rounded to 0), and those NaN when stored (produced by an earlier
/// operation).
struct RoundingTally {
  std::uint64_t entries = 0, overflow = 0, underflow = 0, nan = 0;
  RoundingTally& operator+=(const RoundingTally& o) {
    entries += o.entries;
    overflow += o.overflow;
    underflow += o.underflow;
    nan += o.nan;
    return *this;
  }
};

/// Rounds n float32 values in place to the storage format; the tally of what it did.
RoundingTally round_in_place(Storage s, float* x, std::size_t n);

/// The tallies of one computation per intermediate, in the order they were first stored; safe to add to from several
/// threads (the kernels round tiles in parallel).
class RoundingLog {
 public:
  struct Entry {
    std::string what;
    Held held;
    RoundingTally tally;
  };
  void clear();
  void add(const char* what, Held held, const RoundingTally& t);
  std::vector<Entry> entries() const;
  // A method's calls, so that the log holds compute()'s tallies and the last output()'s, then the last backward()'s:
  // a call made twice replaces its tallies, it does not add to them. A backward counts what it stores: V and dO as
  // given, its own tensors, and those of the forward it forms again where its method's backward does (exact
  // attention's P; the methods whose backward reuses the forward's roundings leave them untallied there).
  /// compute() is done: its entries are where an output() starts.
  void fitted();
  /// An output() starts from compute()'s entries; when it ends, its entries are where a backward() starts.
  void begin_output();
  void end_output();
  /// A backward() starts from compute()'s and the last output()'s entries.
  void begin_backward();

 private:
  mutable std::mutex mutex_;
  std::vector<Entry> entries_, fitted_, output_;
};

/// The rounding a kernel applies: the storage, the policy and the log its tallies go to. A default (native) Rounding
/// rounds nothing, so the kernels' native paths are unchanged bit for bit.
struct Rounding {
  Storage storage = Storage::native;
  Policy policy = Policy::eager;
  RoundingLog* log = nullptr;
  bool active() const { return storage != Storage::native; }
  /// The same rounding without a log: a computation formed again (a backward re-forming its forward) is not tallied
  /// twice.
  Rounding untallied() const { return {storage, policy, nullptr}; }
  /// Whether an intermediate of this kind is stored in the format under this policy.
  bool rounds(Held h) const { return active() && (h == Held::tensor || policy == Policy::eager); }
  /// Rounds x (float32) in place when rounds(h), adding its tally under `what`; a no-op for float64 (the emulation
  /// accumulates in float32: Method refuses a reduced storage on float64 before any work).
  template <typename Derived>
  void operator()(Eigen::PlainObjectBase<Derived>& x, Held h, const char* what) const {
    span(x.data(), std::size_t(x.size()), h, what);
  }
  /// n contiguous values (a block of rows of a row-major matrix), as operator().
  template <typename S>
  void span(S* x, std::size_t n, Held h, const char* what) const {
    if constexpr (std::is_same_v<S, float>) {
      if (!rounds(h)) return;
      const RoundingTally t = round_in_place(storage, x, n);
      if (log) log->add(what, h, t);
    }
  }
  /// One value (a tile's statistic), tallied into `t` (added to the log by the caller, once per tile).
  template <typename S>
  S scalar(S x, Held h, RoundingTally& t) const {
    if constexpr (std::is_same_v<S, float>) {
      if (!rounds(h)) return x;
      float y = x;
      t += round_in_place(storage, &y, 1);
      return y;
    } else {
      return x;
    }
  }
};

}  // namespace attnlab
