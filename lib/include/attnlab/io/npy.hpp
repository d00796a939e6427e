// .npy reader and writer: format versions 1.0–3.0, little-endian float32 ('<f4') and float64 ('<f8'),
// C and Fortran order, shapes (n, d) and (h, n, d). Anything else is refused with a message naming the file
// and the problem. Truncated files, lying headers and absurd shapes never crash or over-allocate: the
// header's claim is checked against the file's size before anything is allocated.
#pragma once

#include "attnlab/core/types.hpp"

#include <Eigen/Core>
#include <cstdio>
#include <string>
#include <vector>

namespace attnlab {

/// An array read from a .npy file, stored in C order in its file's dtype.
class NpyArray {
 public:
  NpyArray() = default;
  DType dtype() const { return dtype_; }
  const std::vector<Index>& shape() const { return shape_; }
  Index ndim() const { return Index(shape_.size()); }
  /// Heads h: shape[0] of an (h, n, d) array, 1 for (n, d).
  Index heads() const { return ndim() == 3 ? shape_[0] : 1; }
  Index rows() const { return shape_[ndim() - 2]; }
  Index cols() const { return shape_[ndim() - 1]; }
  const std::string& path() const { return path_; }
  /// Whether the file held float16 ('<f2'): its values, exact in float32, are held as float32 (dtype() f32) and the
  /// command computes them in emulated float16 storage unless told otherwise.
  bool float16() const { return float16_; }

  /// Head h as a matrix in type T (no copy when T is the file's dtype).
  template <typename T>
  Eigen::Map<const MatrixR<T>> head(Index h) const;
  /// Head h converted to T (a copy when the dtypes differ, else a view copied).
  template <typename T>
  MatrixR<T> head_as(Index h) const;

  /// Throws Error naming the file and the first NaN or Inf.
  void check_finite() const;
  /// For a float64 file that is to be computed in float32: throws Error naming the file and the first finite value
  /// beyond float32's range (it would become ±Inf in the cast, and the computation's message would then be about an
  /// Inf the file does not hold); `remedy` ends the message. A no-op for float32 and float16 files.
  void check_fits_float32(const std::string& remedy) const;

  static NpyArray read(const std::string& path);

 private:
  std::string path_;
  DType dtype_ = DType::f64;
  bool float16_ = false;
  std::vector<Index> shape_;
  std::vector<float> f32_;
  std::vector<double> f64_;
};

/// The cross-checks of Q, K and (when given) V read from .npy files, every message naming the files and starting with
/// `context`: one layout (all (n, d) or all (h, n, d)), one head count, the same d for Q and K, as many rows in V as in
/// K, finite values, and one dtype — unless `mixed_dtypes` (the caller casts every file to a compute dtype the user
/// chose); `dtype_hint` ends the mixed-dtype refusal (how to choose that dtype). Shared by the command and the
/// experiments, so that both read the user's files by one rule.
void check_qkv_arrays(const NpyArray& q, const NpyArray& k, const NpyArray* v, const std::string& context = "",
                      bool mixed_dtypes = false, const std::string& dtype_hint = "");

/// Writes a C-order .npy array piece by piece (head by head), to `path.partial`, renamed to `path` by close():
/// an interrupted or failed write never leaves a half file under the final name.
template <typename T>
class NpyWriter {
 public:
  NpyWriter(std::string path, std::vector<Index> shape);
  ~NpyWriter();
  NpyWriter(const NpyWriter&) = delete;
  NpyWriter& operator=(const NpyWriter&) = delete;
  /// Appends `count` elements in C order.
  void write(const T* data, std::size_t count);
  /// Checks that exactly the promised number of elements was written, then renames into place.
  void close();

 private:
  std::string path_, tmp_;
  std::size_t expected_ = 1, written_ = 0;
  std::FILE* f_ = nullptr;
};

/// Writes a C-order array of the given shape (2-D or 3-D) as .npy version 1.0 (2.0 if the header needs it).
template <typename T>
void write_npy(const std::string& path, const T* data, const std::vector<Index>& shape) {
  NpyWriter<T> w(path, shape);
  std::size_t count = 1;
  for (Index s : shape) count *= std::size_t(s);
  w.write(data, count);
  w.close();
}

/// Writes a matrix as an (rows, cols) array.
template <typename T>
void write_npy(const std::string& path, const MatrixR<T>& m) {
  write_npy<T>(path, m.data(), {m.rows(), m.cols()});
}

}  // namespace attnlab
