// .npy I/O: round trips, every supported header version and order, and every malformed file refused
// with an Error (never a crash or a huge allocation).
#include "attnlab/core/error.hpp"
#include "attnlab/io/npy.hpp"
#include "test_util.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

namespace attnlab {
namespace {

std::string tmp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("attnlab_test_" + name)).string();
}

/// A .npy file with any header and payload, for malformed cases.
std::string raw_npy(const std::string& name, const std::string& dict, const std::string& payload, int major = 1,
                    bool pad = true) {
  std::string header = dict;
  const std::size_t prefix = major == 1 ? 10 : 12;
  if (pad) {
    const std::size_t total = prefix + header.size() + 1;
    header.append((64 - total % 64) % 64, ' ');
    header += '\n';
  }
  std::string bytes = std::string("\x93NUMPY", 6) + char(major) + char(0);
  const std::uint32_t len = std::uint32_t(header.size());
  bytes += char(len & 0xff);
  bytes += char((len >> 8) & 0xff);
  if (major != 1) {
    bytes += char((len >> 16) & 0xff);
    bytes += char((len >> 24) & 0xff);
  }
  bytes += header + payload;
  const std::string path = tmp_path(name);
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

template <typename T>
std::string payload(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

TEST(Npy, RoundTripFloatAndDouble) {
  const MatrixR<float> a = test::randn<float>(7, 3, 1);
  write_npy(tmp_path("rt_f4.npy"), a);
  const NpyArray ra = NpyArray::read(tmp_path("rt_f4.npy"));
  EXPECT_EQ(ra.dtype(), DType::f32);
  EXPECT_EQ(ra.ndim(), 2);
  EXPECT_EQ(ra.heads(), 1);
  EXPECT_EQ(MatrixR<float>(ra.head<float>(0)), a);
  const MatrixR<double> b = test::randn<double>(2 * 5, 4, 2);
  write_npy<double>(tmp_path("rt_f8.npy"), b.data(), {2, 5, 4});
  const NpyArray rb = NpyArray::read(tmp_path("rt_f8.npy"));
  EXPECT_EQ(rb.heads(), 2);
  EXPECT_EQ(rb.rows(), 5);
  EXPECT_EQ(rb.cols(), 4);
  EXPECT_EQ(MatrixR<double>(rb.head<double>(1)), b.middleRows(5, 5));
  EXPECT_EQ(rb.head_as<float>(0), b.topRows(5).cast<float>());
  EXPECT_THROW(rb.head<float>(0), Error);  // a view needs the file's dtype
  EXPECT_FALSE(std::filesystem::exists(tmp_path("rt_f8.npy.partial")));
}

TEST(Npy, AllVersionsAndFortranOrder) {
  const std::vector<double> data = {1, 2, 3, 4, 5, 6};
  for (int major : {1, 2, 3}) {
    const auto path = raw_npy("v" + std::to_string(major) + ".npy",
                              "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }", payload(data), major);
    const NpyArray a = NpyArray::read(path);
    EXPECT_EQ(a.head<double>(0)(1, 0), 4.0) << "version " << major;
  }
  // Fortran order: the data is column-major; the reader hands back C order.
  const auto f2 = raw_npy("fortran2.npy", "{'descr': '<f8', 'fortran_order': True, 'shape': (2, 3), }", payload(data));
  const NpyArray a = NpyArray::read(f2);
  EXPECT_EQ(a.head<double>(0)(0, 1), 3.0);  // element (0,1) at 0 + 2·1
  EXPECT_EQ(a.head<double>(0)(1, 2), 6.0);
  // (h, n, d) Fortran: element (a, b, c) at a + h·(b + n·c)
  std::vector<float> f3(2 * 3 * 4);
  for (std::size_t i = 0; i < f3.size(); ++i) f3[i] = float(i);
  const auto p3 = raw_npy("fortran3.npy", "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3, 4), }", payload(f3));
  const NpyArray b = NpyArray::read(p3);
  for (Index h = 0; h < 2; ++h)
    for (Index r = 0; r < 3; ++r)
      for (Index c = 0; c < 4; ++c) EXPECT_EQ(b.head<float>(h)(r, c), float(h + 2 * (r + 3 * c)));
  // Keys in another order, double quotes, no trailing comma: still a valid dict literal.
  const auto odd =
      raw_npy("odd.npy", "{\"shape\": (3, 2), \"fortran_order\": False, \"descr\": \"<f8\"}", payload(data));
  EXPECT_EQ(NpyArray::read(odd).rows(), 3);
}

void expect_refused(const std::string& path, const std::string& fragment) {
  try {
    NpyArray::read(path);
    ADD_FAILURE() << path << " was accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(fragment), std::string::npos) << msg;
    EXPECT_NE(msg.find(path), std::string::npos) << "message must name the file: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
  }
}

TEST(Npy, RefusesMalformedFiles) {
  const std::vector<double> six = {1, 2, 3, 4, 5, 6};
  const std::string ok_dict = "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }";
  expect_refused(tmp_path("missing.npy"), "cannot open");
  {
    std::ofstream(tmp_path("empty.npy"), std::ios::binary);
    expect_refused(tmp_path("empty.npy"), "too short");
  }
  {
    std::ofstream(tmp_path("text.npy"), std::ios::binary) << "hello, this is not numpy at all";
    expect_refused(tmp_path("text.npy"), "bad magic");
  }
  expect_refused(raw_npy("v4.npy", ok_dict, payload(six), 4), "version 4.0");
  expect_refused(raw_npy("int.npy", "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }",
                         std::string(24, '\0')),
                 "'<i4' is not supported");
  {
    // float16 ('<f2') is read, each value exact in float32: 1, −2, 0.5, 65504, 2^−24 (the smallest subnormal), 0.
    const std::uint16_t bits[6] = {0x3C00, 0xC000, 0x3800, 0x7BFF, 0x0001, 0x0000};
    const NpyArray h = NpyArray::read(raw_npy("f2.npy", "{'descr': '<f2', 'fortran_order': False, 'shape': (2, 3), }",
                                              std::string(reinterpret_cast<const char*>(bits), sizeof bits)));
    EXPECT_TRUE(h.float16());
    EXPECT_EQ(h.dtype(), DType::f32);
    const MatrixR<float> m = h.head_as<float>(0);
    EXPECT_EQ(m(0, 0), 1.0f);
    EXPECT_EQ(m(0, 1), -2.0f);
    EXPECT_EQ(m(0, 2), 0.5f);
    EXPECT_EQ(m(1, 0), 65504.0f);
    EXPECT_EQ(m(1, 1), std::ldexp(1.0f, -24));
    EXPECT_EQ(m(1, 2), 0.0f);
  }
  expect_refused(raw_npy("f2b.npy", "{'descr': '>f2', 'fortran_order': False, 'shape': (2, 3), }",
                         std::string(12, '\0')),
                 "big-endian");
  expect_refused(raw_npy("be.npy", "{'descr': '>f8', 'fortran_order': False, 'shape': (2, 3), }", payload(six)),
                 "big-endian");
  expect_refused(raw_npy("struct.npy", "{'descr': [('a', '<f8')], 'fortran_order': False, 'shape': (6,), }",
                         payload(six)),
                 "structured");
  expect_refused(raw_npy("1d.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (6,), }", payload(six)),
                 "1 dimensions");
  expect_refused(raw_npy("4d.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (1, 1, 2, 3), }",
                         payload(six)),
                 "4 dimensions");
  expect_refused(raw_npy("0d.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (), }", payload(six)),
                 "0 dimensions");
  expect_refused(raw_npy("emptyshape.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (0, 3), }", ""),
                 "empty");
  // Truncated data, extra data, and a header that lies about the shape.
  expect_refused(raw_npy("trunc.npy", ok_dict, payload(six).substr(0, 40)), "truncated");
  expect_refused(raw_npy("extra.npy", ok_dict, payload(six) + "12345678"), "needs 48 bytes");
  // Absurd shapes: refused from the file size, before any allocation.
  expect_refused(raw_npy("huge.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (1000000000, 1000000000), }",
                         payload(six)),
                 "needs");
  expect_refused(raw_npy("overflow.npy",
                         "{'descr': '<f8', 'fortran_order': False, 'shape': (99999999999, 99999999999, 99999999999), }",
                         payload(six)),
                 "needs");
  expect_refused(raw_npy("digits.npy",
                         "{'descr': '<f8', 'fortran_order': False, 'shape': (1234567890123456789012, 3), }",
                         payload(six)),
                 "absurd");
  // Headers: truncated, absurd length, garbage inside.
  {
    std::string bytes = std::string("\x93NUMPY\x01\x00", 8) + char(0x00) + char(0x10) + "{'descr'";
    std::ofstream(tmp_path("trunchdr.npy"), std::ios::binary) << bytes;
    expect_refused(tmp_path("trunchdr.npy"), "truncated header");
  }
  {
    std::string bytes = std::string("\x93NUMPY\x02\x00", 8) + std::string("\xff\xff\xff\x7f", 4) + "{}";
    std::ofstream(tmp_path("hugehdr.npy"), std::ios::binary) << bytes;
    expect_refused(tmp_path("hugehdr.npy"), "absurd");
  }
  expect_refused(raw_npy("garbage.npy", "{'descr': '<f8', 'fortran_order': Maybe, 'shape': (2, 3), }", payload(six)),
                 "fortran_order");
  expect_refused(raw_npy("nokeys.npy", "{'descr': '<f8'}", payload(six)), "lacks");
  expect_refused(raw_npy("unterminated.npy", "{'descr: <f8", payload(six)), "malformed header");
  expect_refused(raw_npy("badshape.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (2, -3), }", payload(six)),
                 "shape");
}

TEST(Npy, FindsNonFiniteValues) {
  std::vector<float> v = {1, 2, 3, 4, 5, 6};
  v[4] = std::numeric_limits<float>::quiet_NaN();
  const auto path = raw_npy("nan.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", payload(v));
  const NpyArray a = NpyArray::read(path);
  try {
    a.check_finite();
    ADD_FAILURE() << "NaN not found";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("NaN at row 1, column 1"), std::string::npos) << e.what();
  }
  v[4] = 5;
  v[0] = std::numeric_limits<float>::infinity();
  const NpyArray b = NpyArray::read(raw_npy("inf.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
                                            payload(v)));
  EXPECT_THROW(b.check_finite(), Error);
}

TEST(Npy, WriterRefusesShortWritesAndLeavesNoFile) {
  const std::string path = tmp_path("short.npy");
  std::remove(path.c_str());
  {
    NpyWriter<float> w(path, {2, 3});
    const float x[3] = {1, 2, 3};
    w.write(x, 3);
    EXPECT_THROW(w.close(), Error);
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".partial"));
  EXPECT_THROW(NpyWriter<float>("/nonexistent-dir/x.npy", {1, 1}), Error);
}

}  // namespace
}  // namespace attnlab
