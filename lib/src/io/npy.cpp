// .npy format (NEP 1): magic "\x93NUMPY", version, header length (2 bytes in 1.0, 4 in 2.0/3.0), then a
// Python dict literal {'descr': ..., 'fortran_order': ..., 'shape': (...)}, then the raw data.
// Every claim of the header is checked against the file before anything is allocated.
#include "attnlab/io/npy.hpp"

#include "attnlab/core/error.hpp"
#include "attnlab/core/formats.hpp"
#include "attnlab/core/memory.hpp"

#include <fmt/format.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>

namespace attnlab {
namespace {

constexpr std::size_t kMaxHeader = 1 << 20;  // numpy itself refuses headers over 10 000 bytes by default

bool host_is_little_endian() {
  const std::uint16_t x = 1;
  unsigned char c;
  std::memcpy(&c, &x, 1);
  return c == 1;
}

/// A tiny parser for the header's dict literal.
class HeaderParser {
 public:
  HeaderParser(const std::string& text, const std::string& path) : s_(text), path_(path) {}

  void parse(std::string& descr, bool& fortran, std::vector<Index>& shape) {
    bool have_descr = false, have_fortran = false, have_shape = false;
    expect('{');
    while (true) {
      skip_ws();
      if (peek() == '}') {
        ++i_;
        break;
      }
      const std::string key = string_literal();
      expect(':');
      skip_ws();
      if (key == "descr") {
        if (peek() != '\'' && peek() != '"')
          fail("'descr' is not a simple dtype string (structured arrays are not supported)");
        descr = string_literal();
        have_descr = true;
      } else if (key == "fortran_order") {
        fortran = boolean();
        have_fortran = true;
      } else if (key == "shape") {
        shape = tuple();
        have_shape = true;
      } else {
        fail(fmt::format("unexpected header key '{}'", key));
      }
      skip_ws();
      if (peek() == ',') ++i_;
      else if (peek() != '}') fail("malformed header dict");
    }
    if (!have_descr || !have_fortran || !have_shape)
      fail("header lacks one of 'descr', 'fortran_order', 'shape'");
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { throw Error(fmt::format("{}: {}", path_, what)); }
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  void skip_ws() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  void expect(char c) {
    skip_ws();
    if (peek() != c) fail(fmt::format("malformed header: expected '{}'", c));
    ++i_;
  }
  std::string string_literal() {
    skip_ws();
    const char q = peek();
    if (q != '\'' && q != '"') fail("malformed header: expected a quoted key or string");
    const auto end = s_.find(q, i_ + 1);
    if (end == std::string::npos) fail("malformed header: unterminated string");
    std::string out = s_.substr(i_ + 1, end - i_ - 1);
    i_ = end + 1;
    return out;
  }
  bool boolean() {
    if (s_.compare(i_, 4, "True") == 0) return i_ += 4, true;
    if (s_.compare(i_, 5, "False") == 0) return i_ += 5, false;
    fail("malformed header: 'fortran_order' is not True or False");
  }
  std::vector<Index> tuple() {
    expect('(');
    std::vector<Index> dims;
    while (true) {
      skip_ws();
      if (peek() == ')') {
        ++i_;
        return dims;
      }
      if (!std::isdigit(static_cast<unsigned char>(peek()))) fail("malformed header: bad 'shape'");
      std::size_t j = i_;
      while (j < s_.size() && std::isdigit(static_cast<unsigned char>(s_[j]))) ++j;
      const std::string num = s_.substr(i_, j - i_);
      if (num.size() > 18) fail(fmt::format("absurd dimension {} in 'shape'", num));
      dims.push_back(Index(std::stoll(num)));
      i_ = j;
      skip_ws();
      if (peek() == 'L') ++i_;  // Python 2 longs
      skip_ws();
      if (peek() == ',') ++i_;
      else if (peek() != ')') fail("malformed header: bad 'shape'");
    }
  }

  const std::string& s_;
  const std::string& path_;
  std::size_t i_ = 0;
};

std::string shape_str(const std::vector<Index>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

/// Fortran-ordered data (first index fastest) to C order (last index fastest).
template <typename T>
std::vector<T> fortran_to_c(const std::vector<T>& f, const std::vector<Index>& shape) {
  std::vector<T> c(f.size());
  const Index h = shape.size() == 3 ? shape[0] : 1;
  const Index n = shape[shape.size() - 2], d = shape[shape.size() - 1];
  for (Index a = 0; a < h; ++a)
    for (Index b = 0; b < n; ++b)
      for (Index e = 0; e < d; ++e) c[std::size_t((a * n + b) * d + e)] = f[std::size_t(a + h * (b + n * e))];
  return c;
}

template <typename T>
void read_data(std::ifstream& in, std::vector<T>& out, std::size_t count, bool fortran,
               const std::vector<Index>& shape, const std::string& path) {
  out.resize(count);
  in.read(reinterpret_cast<char*>(out.data()), std::streamsize(count * sizeof(T)));
  if (!in) throw Error(fmt::format("{}: could not read the data (truncated?)", path));
  if (fortran) out = fortran_to_c(out, shape);
}

}  // namespace

NpyArray NpyArray::read(const std::string& path) {
  if (!host_is_little_endian()) throw Error("attnlab's .npy reader needs a little-endian machine");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  in.seekg(0, std::ios::end);
  const std::streamoff file_size = in.tellg();
  in.seekg(0, std::ios::beg);
  if (file_size < 0) throw Error(fmt::format("{}: cannot determine the file size (not a regular file?)", path));

  unsigned char pre[8];
  if (file_size < 10 || !in.read(reinterpret_cast<char*>(pre), 8))
    throw Error(fmt::format("{}: not a .npy file (too short for the header)", path));
  if (std::memcmp(pre, "\x93NUMPY", 6) != 0) throw Error(fmt::format("{}: not a .npy file (bad magic)", path));
  const int major = pre[6], minor = pre[7];
  if (major < 1 || major > 3 || minor != 0)
    throw Error(fmt::format("{}: unsupported .npy format version {}.{} (supported: 1.0, 2.0, 3.0)", path, major,
                            minor));
  std::uint64_t header_len = 0;
  std::streamoff offset = 0;
  if (major == 1) {
    unsigned char b[2];
    if (!in.read(reinterpret_cast<char*>(b), 2)) throw Error(fmt::format("{}: truncated header", path));
    header_len = std::uint64_t(b[0]) | (std::uint64_t(b[1]) << 8);
    offset = 10;
  } else {
    unsigned char b[4];
    if (!in.read(reinterpret_cast<char*>(b), 4)) throw Error(fmt::format("{}: truncated header", path));
    header_len = std::uint64_t(b[0]) | (std::uint64_t(b[1]) << 8) | (std::uint64_t(b[2]) << 16) |
                 (std::uint64_t(b[3]) << 24);
    offset = 12;
  }
  if (header_len > kMaxHeader)
    throw Error(fmt::format("{}: header length {} is absurd (over {} bytes)", path, header_len, kMaxHeader));
  if (std::uint64_t(file_size - offset) < header_len)
    throw Error(fmt::format("{}: truncated header ({} bytes promised, {} in the file)", path, header_len,
                            file_size - offset));
  std::string header(header_len, '\0');
  in.read(header.data(), std::streamsize(header_len));
  offset += std::streamoff(header_len);

  std::string descr;
  bool fortran = false;
  std::vector<Index> shape;
  HeaderParser(header, path).parse(descr, fortran, shape);

  NpyArray a;
  a.path_ = path;
  if (descr == "<f4") a.dtype_ = DType::f32;
  else if (descr == "<f8") a.dtype_ = DType::f64;
  else if (descr == "<f2") a.dtype_ = DType::f32, a.float16_ = true;  // every float16 value is exact in float32
  else if (descr == ">f4" || descr == ">f8" || descr == ">f2")
    throw Error(fmt::format("{}: big-endian dtype '{}' is not supported; save with arr.astype('<{}')", path, descr,
                            descr.substr(1)));
  else
    throw Error(fmt::format("{}: dtype '{}' is not supported; attnlab reads float16 ('<f2'), float32 ('<f4') and "
                            "float64 ('<f8'), "
                            "convert with arr.astype(np.float32)",
                            path, descr));
  if (shape.size() != 2 && shape.size() != 3)
    throw Error(fmt::format("{}: shape {} has {} dimensions; attnlab reads (n, d) or (heads, n, d)", path,
                            shape_str(shape), shape.size()));
  std::uint64_t count = 1;
  for (Index dim : shape) {
    if (dim == 0) throw Error(fmt::format("{}: shape {} is empty", path, shape_str(shape)));
    count = matrix_bytes(count, std::uint64_t(dim), 1);
  }
  const std::uint64_t bytes = matrix_bytes(count, 1, a.float16_ ? 2 : dtype_size(a.dtype_));
  const std::uint64_t have = std::uint64_t(file_size - offset);
  if (bytes != have)
    throw Error(fmt::format("{}: shape {} of {} needs {} bytes of data but the file has {}{}", path,
                            shape_str(shape), descr, bytes, have, bytes > have ? " (truncated?)" : ""));
  check_memory(bytes, "reading {}", path);
  a.shape_ = shape;
  if (a.float16_) {
    check_memory(matrix_bytes(count, 1, 4), "reading {} (float16 held as float32)", path);
    std::vector<std::uint16_t> bits;
    read_data(in, bits, std::size_t(count), fortran, shape, path);
    a.f32_.resize(bits.size());
    for (std::size_t i = 0; i < bits.size(); ++i) a.f32_[i] = float(from_half_bits(Format::fp16, bits[i]));
  } else if (a.dtype_ == DType::f32) read_data(in, a.f32_, std::size_t(count), fortran, shape, path);
  else read_data(in, a.f64_, std::size_t(count), fortran, shape, path);
  return a;
}

template <typename T>
Eigen::Map<const MatrixR<T>> NpyArray::head(Index h) const {
  if (dtype_of<T>() != dtype_)
    throw Error(fmt::format("{}: holds {}, asked for {}", path_, dtype_name(dtype_), dtype_name(dtype_of<T>())));
  require(h >= 0 && h < heads(), "{}: no head {}", path_, h);
  const T* base;
  if constexpr (std::is_same_v<T, float>) base = f32_.data();
  else base = f64_.data();
  return Eigen::Map<const MatrixR<T>>(base + h * rows() * cols(), rows(), cols());
}

template <typename T>
MatrixR<T> NpyArray::head_as(Index h) const {
  if (dtype_ == DType::f32) return head<float>(h).template cast<T>();
  return head<double>(h).template cast<T>();
}

namespace {

/// Where flat index i of an (n, d) or (h, n, d) array is, in words.
std::string npy_position(const NpyArray& a, std::size_t i) {
  const std::size_t c = std::size_t(a.cols()), n = std::size_t(a.rows());
  return a.ndim() == 3 ? fmt::format("head {}, row {}, column {}", i / (n * c), (i / c) % n, i % c)
                       : fmt::format("row {}, column {}", i / c, i % c);
}

}  // namespace

void NpyArray::check_finite() const {
  const auto scan = [&](const auto& v) {
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (std::isfinite(v[i])) continue;
      throw Error(
          fmt::format("{}: contains {} at {}", path_, std::isnan(v[i]) ? "NaN" : "Inf", npy_position(*this, i)));
    }
  };
  if (dtype_ == DType::f32) scan(f32_);
  else scan(f64_);
}

void NpyArray::check_fits_float32(const std::string& remedy) const {
  if (dtype_ != DType::f64) return;
  const double largest = double(std::numeric_limits<float>::max());
  for (std::size_t i = 0; i < f64_.size(); ++i)
    if (std::isfinite(f64_[i]) && std::fabs(f64_[i]) > largest)
      throw Error(fmt::format("{}: {} at {} is beyond float32's range (largest {:g}){}", path_, f64_[i],
                              npy_position(*this, i), largest, remedy));
}

namespace {

std::string layout_of(const NpyArray& a) {
  return a.ndim() == 3 ? fmt::format("(h={}, n={}, d={})", a.heads(), a.rows(), a.cols())
                       : fmt::format("(n={}, d={})", a.rows(), a.cols());
}

}  // namespace

void check_qkv_arrays(const NpyArray& q, const NpyArray& k, const NpyArray* v, const std::string& context,
                      bool mixed_dtypes, const std::string& dtype_hint) {
  // ", V path is …" when V is given, for the messages naming every file.
  const auto v_part = [&](const std::string& what) { return v ? fmt::format(", V {} {}", v->path(), what) : ""; };
  require(q.ndim() == k.ndim() && (!v || v->ndim() == q.ndim()),
          "{}Q {} is {}, K {} is {}{}: give them all as (n, d) or all as (h, n, d)", context, q.path(),
          layout_of(q), k.path(), layout_of(k), v_part("is " + (v ? layout_of(*v) : "")));
  require(q.heads() == k.heads() && (!v || v->heads() == q.heads()),
          "{}head counts differ: Q {} has {}, K {} has {}{}", context, q.path(), q.heads(), k.path(),
          k.heads(), v_part(fmt::format("has {}", v ? v->heads() : 0)));
  require(q.cols() == k.cols(), "{}Q {} has d = {} but K {} has d = {}; they must match", context,
                                q.path(), q.cols(), k.path(), k.cols());
  require(!v || v->rows() == k.rows(), "{}K {} has n_k = {} rows but V {} has {}; they must match", context,
                                       k.path(), k.rows(), v ? v->path() : "", v ? v->rows() : 0);
  // Mixed dtypes: a silent cast would hide which precision the results are in; the user chooses it explicitly. As
  // stored: a float16 file (held as float32) beside a float32 one differs too (Q's would pick the emulation).
  const auto stored = [](const NpyArray& a) { return a.float16() ? "float16" : dtype_name(a.dtype()); };
  const auto same = [&](const NpyArray& a) { return a.dtype() == q.dtype() && a.float16() == q.float16(); };
  require(mixed_dtypes || (same(k) && (!v || same(*v))),
          "{}Q {} is {}, K {} is {}{}: the files differ in dtype; convert them to one{}", context, q.path(),
          stored(q), k.path(), stored(k), v_part(fmt::format("is {}", stored(v ? *v : q))), dtype_hint);
  q.check_finite();
  k.check_finite();
  if (v) v->check_finite();
}

template <typename T>
NpyWriter<T>::NpyWriter(std::string path, std::vector<Index> shape) : path_(std::move(path)), tmp_(path_ + ".partial") {
  require(shape.size() == 2 || shape.size() == 3, "write_npy: shape must have 2 or 3 dimensions");
  for (Index s : shape) expected_ *= std::size_t(s);
  std::string dict = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}",
                                 sizeof(T) == 4 ? "<f4" : "<f8", shape_str(shape));
  // Pad with spaces so that magic + length + header is a multiple of 64, the header ending in '\n'.
  int major = 1;
  std::size_t prefix = 10;
  if (dict.size() + 1 + 64 > 65535) {
    major = 2;
    prefix = 12;
  }
  const std::size_t total = prefix + dict.size() + 1;
  dict.append((64 - total % 64) % 64, ' ');
  dict += '\n';
  f_ = std::fopen(tmp_.c_str(), "wb");
  if (!f_) throw Error(fmt::format("{}: cannot write: {}", path_, std::strerror(errno)));
  const std::uint32_t len = std::uint32_t(dict.size());
  const unsigned char pre[12] = {0x93, 'N', 'U', 'M', 'P', 'Y', static_cast<unsigned char>(major), 0,
                                 static_cast<unsigned char>(len & 0xff), static_cast<unsigned char>((len >> 8) & 0xff),
                                 static_cast<unsigned char>((len >> 16) & 0xff),
                                 static_cast<unsigned char>((len >> 24) & 0xff)};
  const bool ok =
      std::fwrite(pre, 1, prefix, f_) == prefix && std::fwrite(dict.data(), 1, dict.size(), f_) == dict.size();
  if (!ok) throw Error(fmt::format("{}: write failed: {}", path_, std::strerror(errno)));
}

template <typename T>
NpyWriter<T>::~NpyWriter() {
  if (f_) {
    std::fclose(f_);
    std::remove(tmp_.c_str());
  }
}

template <typename T>
void NpyWriter<T>::write(const T* data, std::size_t count) {
  require(f_ != nullptr, "{}: write after close", path_);
  require(written_ + count <= expected_, "{}: more data than the shape holds", path_);
  if (std::fwrite(data, sizeof(T), count, f_) != count)
    throw Error(fmt::format("{}: write failed: {}", path_, std::strerror(errno)));
  written_ += count;
}

template <typename T>
void NpyWriter<T>::close() {
  require(f_ != nullptr, "{}: closed twice", path_);
  require(written_ == expected_,
          "{}: {} of {} elements written", path_, written_, expected_);
  const bool ok = std::fclose(f_) == 0;
  f_ = nullptr;
  if (!ok || std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    std::remove(tmp_.c_str());
    throw Error(fmt::format("{}: write failed: {}", path_, std::strerror(errno)));
  }
}

template Eigen::Map<const MatrixR<float>> NpyArray::head<float>(Index) const;
template Eigen::Map<const MatrixR<double>> NpyArray::head<double>(Index) const;
template MatrixR<float> NpyArray::head_as<float>(Index) const;
template MatrixR<double> NpyArray::head_as<double>(Index) const;
template class NpyWriter<float>;
template class NpyWriter<double>;

}  // namespace attnlab
