// The fuzz target (see fuzz_inputs.hpp).
#include "fuzz_inputs.hpp"

#include "attnlab/core/error.hpp"
#include "attnlab/core/memory.hpp"
#include "attnlab/io/npy.hpp"
#include "attnlab/core/registry.hpp"

#include <cstdio>
#include <fstream>
#include <unistd.h>

namespace attnlab::fuzz {
namespace {

std::string npy_bytes(const std::string& descr, bool fortran, const std::vector<int>& shape, int version) {
  std::string dict = "{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") + ", 'shape': (";
  std::size_t count = 1;
  for (int s : shape) {
    dict += std::to_string(s) + ",";
    count *= std::size_t(s);
  }
  dict += "), }";
  const std::size_t pre = version == 1 ? 10 : 12;
  while ((pre + dict.size() + 1) % 64) dict += ' ';
  dict += '\n';
  std::string out = "\x93NUMPY";
  out += char(version);
  out += char(0);
  const std::size_t len = dict.size();
  out += char(len & 0xff);
  out += char((len >> 8) & 0xff);
  if (version != 1) out += std::string{char((len >> 16) & 0xff), char((len >> 24) & 0xff)};
  out += dict;
  const std::size_t elem = descr.back() == '8' ? 8 : 4;
  for (std::size_t i = 0; i < count; ++i) {
    if (elem == 8) {
      const double v = 0.25 * double(i % 7) - 0.5;
      out.append(reinterpret_cast<const char*>(&v), 8);
    } else {
      const float v = 0.25f * float(i % 7) - 0.5f;
      out.append(reinterpret_cast<const char*>(&v), 4);
    }
  }
  return out;
}

}  // namespace

std::vector<std::string> seeds() {
  std::vector<std::string> s;
  s.push_back(std::string(1, '\0') + npy_bytes("<f8", false, {5, 3}, 1));
  s.push_back(std::string(1, '\0') + npy_bytes("<f4", false, {2, 4, 3}, 1));
  s.push_back(std::string(1, '\0') + npy_bytes("<f8", true, {3, 6}, 2));
  s.push_back(std::string(1, '\0') + npy_bytes("<f4", false, {1, 1}, 3));
  for (const auto& d : registered_methods()) {
    s.push_back("\x01" + d.name);
    s.push_back("\x01" + make_method<double>(d.name)->spec());
  }
  return s;
}

Counts& counts() {
  static Counts c;
  return c;
}

}  // namespace attnlab::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace attnlab;
  static const bool limited = [] {
    set_memory_limit(std::uint64_t(256) << 20);  // a mutated shape must be refused, not allocated
    return true;
  }();
  (void)limited;
  if (size == 0) return 0;
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  const int target = data[0] % 2;
  try {
    if (target == 0) {
      static const std::string path = "/tmp/attnlab_fuzz_" + std::to_string(::getpid()) + ".npy";
      std::ofstream(path, std::ios::binary | std::ios::trunc) << body;
      const NpyArray a = NpyArray::read(path);
      a.check_finite();
      if (a.ndim() >= 2 && a.rows() > 0 && a.cols() > 0) {
        const MatrixR<double> h = a.head_as<double>(a.heads() - 1);
        volatile double sink = h.sum();
        (void)sink;
      }
    } else {
      auto m = make_method<double>(body);
      // A tiny problem: a spec that parses must run, or refuse with an Error.
      MatrixR<double> q(80, 6), k(80, 6), v(80, 3);
      for (Index i = 0; i < q.size(); ++i) q.data()[i] = 0.1 * double((i * 7) % 11) - 0.5;
      for (Index i = 0; i < k.size(); ++i) k.data()[i] = 0.1 * double((i * 5) % 13) - 0.6;
      for (Index i = 0; i < v.size(); ++i) v.data()[i] = double(i % 3);
      m->compute(q, k);
      const MatrixR<double> o = m->output(v);
      volatile double sink = o.sum();
      (void)sink;
    }
    ++fuzz::counts().accepted[target];
  } catch (const Error&) {
    ++fuzz::counts().refused[target];  // refused with a message: the expected outcome for a malformed input
  }
  return 0;
}
