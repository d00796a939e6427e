// Loading a (Q, K, V) problem from .npy files, with every check the command owes its user: matching
// dimensions and heads across the three files, finite values, a known dtype.
#pragma once

#include "attnlab/io/npy.hpp"
#include "attnlab/core/types.hpp"

#include <cstdint>
#include <optional>
#include <string>

namespace attnlab::cli {

struct QkvFiles {
  NpyArray q, k, v;
  Index heads() const { return q.heads(); }
  bool batched() const { return q.ndim() == 3; }
};

/// Reads and cross-checks the three files; throws Error naming the file and the mismatch. Files of different
/// dtypes (float32 beside float64) are refused — naming each file's dtype — unless the user chose the compute
/// dtype (`dtype_flag` "f32" or "f64"), to which every file is then cast: the same rule as the Python module's.
/// `dtype_option` names that option in the message ("" for a command without one).
QkvFiles load_qkv(const std::string& q, const std::string& k, const std::string& v,
                  const std::string& dtype_flag = "auto", const std::string& dtype_option = "");

/// "auto" → the dtype of Q's file (load_qkv has refused mixed ones); "f32"/"f64" as given.
DType resolve_dtype(const std::string& flag, const NpyArray& q);

/// What the command is working on, for the one line main() prints if memory runs out (std::bad_alloc): the sizes
/// and bytes of the inputs. Set before the work it describes.
void set_work(std::string what);
const std::string& work();
/// "Q 4096×64, K 4096×64, V 4096×64 float32 (3.0 MiB)": a problem's inputs, in sizes (and bytes).
std::string describe_inputs(Index n_q, Index n_k, Index d, Index d_v, DType dtype, bool bytes = true);
/// Bytes of those inputs (saturating).
std::uint64_t input_bytes(Index n_q, Index n_k, Index d, Index d_v, DType dtype);

/// A head of a file in type T: a view when the dtypes agree, else a converted copy held in `storage`.
template <typename T>
ConstRef<T> head_view(const NpyArray& a, Index h, MatrixR<T>& storage) {
  if (a.dtype() == dtype_of<T>()) return ConstRef<T>(a.head<T>(h));
  storage = a.head_as<T>(h);
  return ConstRef<T>(storage);
}

}  // namespace attnlab::cli
