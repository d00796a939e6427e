// Loading a (Q, K, V) problem from .npy files, with every check the command owes its user: matching
// dimensions and heads across the three files, finite values, a known dtype.
#pragma once

#include "attnlab/npy.hpp"
#include "attnlab/types.hpp"

#include <optional>
#include <string>

namespace attnlab::cli {

struct QkvFiles {
  NpyArray q, k, v;
  Index heads() const { return q.heads(); }
  bool batched() const { return q.ndim() == 3; }
};

/// Reads and cross-checks the three files; throws Error naming the file and the mismatch.
QkvFiles load_qkv(const std::string& q, const std::string& k, const std::string& v);

/// "auto" → the dtype of Q's file; "f32"/"f64" as given.
DType resolve_dtype(const std::string& flag, const NpyArray& q);

/// A head of a file in type T: a view when the dtypes agree, else a converted copy held in `storage`.
template <typename T>
ConstRef<T> head_view(const NpyArray& a, Index h, MatrixR<T>& storage) {
  if (a.dtype() == dtype_of<T>()) return ConstRef<T>(a.head<T>(h));
  storage = a.head_as<T>(h);
  return ConstRef<T>(storage);
}

}  // namespace attnlab::cli
