// A deterministic mutation fuzzer for the suite (libFuzzer needs clang; this needs nothing): starting from the seeds,
// it applies seeded mutations (bit flips, interesting bytes, inserts, deletes, repeats, splices, truncations) and
// keeps every input that ran as a future parent. The same iterations run on every machine.
//   attnlab_fuzz [iterations (default 100000)] [seed (default 1)]
#include "fuzz_inputs.hpp"

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

struct SplitMix {
  std::uint64_t s;
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  std::size_t below(std::size_t n) { return n ? std::size_t(next() % n) : 0; }
};

std::string mutate(std::string x, const std::vector<std::string>& pool, SplitMix& r) {
  static const char interesting[] = {'\0', '\xff', '\x7f', '\x80', '9', '0', '-', ',', ':', '=', '(', ')', '\'', ' ',
                                     'e', '.', 'n', 'a', 'i', 'f'};
  const int rounds = 1 + int(r.below(4));
  for (int k = 0; k < rounds; ++k) {
    const std::size_t pos = x.size() > 1 ? 1 + r.below(x.size() - 1) : x.size();  // keep the target byte
    switch (r.below(8)) {
      case 0:
        if (pos < x.size()) x[pos] = char(x[pos] ^ char(1 << r.below(8)));
        break;
      case 1:
        if (pos < x.size()) x[pos] = interesting[r.below(sizeof(interesting))];
        break;
      case 2:
        x.insert(x.begin() + std::ptrdiff_t(std::min(pos, x.size())), char(r.below(256)));
        break;
      case 3:
        if (pos < x.size()) x.erase(pos, 1 + r.below(std::min<std::size_t>(8, x.size() - pos)));
        break;
      case 4:
        if (pos < x.size()) x.insert(pos, x.substr(pos, 1 + r.below(16)));
        break;
      case 5: {  // splice the tail of another input of the same target
        const std::string& o = pool[r.below(pool.size())];
        if (!o.empty() && o[0] == x[0] && o.size() > 1) x = x.substr(0, pos) + o.substr(1 + r.below(o.size() - 1));
        break;
      }
      case 6:
        if (pos < x.size()) x.resize(pos);
        break;
      default:  // a digit run: large and negative numbers
        x.insert(std::min(pos, x.size()), r.below(2) ? "99999999999" : "-1");
    }
  }
  return x;
}

/// Structured mutations, so that most inputs get past the first check: a spec keeps its shape but a value, a key or
/// the name changes; a .npy keeps its magic but a header field (dtype, order, shape) or the data length changes.
std::string mutate_structured(std::string x, SplitMix& r) {
  static const char* values[] = {"0", "-1", "1", "2", "3", "7", "64", "4096", "99999999999", "1e308", "-1e308", "nan",
                                 "inf", "", "true", "false", "yes", "0.5", "1e-300", "segments", "random", "svd",
                                 "pool", "identity", "hard", "soft", "both", "elu", "relu", "chunked", "4.5", "+3",
                                 " 3", "3 ", "0x10", "1,2", "=", ":"};
  if (x[0] % 2 == 1) {
    const std::size_t colon = x.find(':');
    if (colon == std::string::npos || r.below(6) == 0) {
      x += r.below(2) ? ":seed=" + std::string(values[r.below(sizeof(values) / sizeof(*values))]) : ",";
      return x;
    }
    // Split into key=value items, change one, rejoin.
    std::vector<std::string> items;
    std::size_t start = colon + 1;
    while (true) {
      const std::size_t c = x.find(',', start);
      items.push_back(x.substr(start, c == std::string::npos ? std::string::npos : c - start));
      if (c == std::string::npos) break;
      start = c + 1;
    }
    std::string& it = items[r.below(items.size())];
    const std::size_t eq = it.find('=');
    switch (r.below(4)) {
      case 0:
      case 1:
        if (eq != std::string::npos) it = it.substr(0, eq + 1) + values[r.below(sizeof(values) / sizeof(*values))];
        break;
      case 2:
        items.push_back(it);  // a repeated key
        break;
      default:
        it = "";  // a missing item
    }
    std::string out = x.substr(0, colon + 1);
    for (std::size_t i = 0; i < items.size(); ++i) out += (i ? "," : "") + items[i];
    return out;
  }
  static const char* fields[] = {"'<f4'", "'<f8'", "'>f8'", "'<i8'", "'|u1'", "'<f2'", "True", "False", "(0,)",
                                 "(1,)", "(3,)", "(2, 0)", "(0, 3)", "(5, 3)", "(3, 5)", "(2, 2, 2)", "(1, 1, 1, 1)",
                                 "(99999999, 99999999)", "(-1, 3)", "()", "(5,3", "5, 3)"};
  // Header and data apart (target byte, 8 magic/version bytes, the length, the header), so that a changed header
  // gets a correct length field and reaches the parser.
  if (x.size() < 12 || x.compare(1, 6, "\x93NUMPY") != 0) return x;
  const bool v1 = x[7] == 1;
  const std::size_t pre = 1 + (v1 ? 10 : 12);
  std::size_t len = std::uint8_t(x[9]) | (std::size_t(std::uint8_t(x[10])) << 8);
  if (!v1) len |= (std::size_t(std::uint8_t(x[11])) << 16) | (std::size_t(std::uint8_t(x[12])) << 24);
  if (pre + len > x.size()) return x;
  std::string h = x.substr(pre, len), data = x.substr(pre + len);
  const std::size_t which = r.below(4);
  const auto replace_value = [&](const char* key) {
    const std::size_t k = h.find(key);
    if (k == std::string::npos) return;
    const std::size_t b = k + std::string(key).size();
    std::size_t e = h.find(", '", b);
    if (e == std::string::npos) e = h.find(", }", b);
    if (e == std::string::npos) return;
    h = h.substr(0, b) + fields[r.below(sizeof(fields) / sizeof(*fields))] + h.substr(e);
  };
  if (which == 0) replace_value("'descr': ");
  else if (which == 1) replace_value("'fortran_order': ");
  else if (which == 2) replace_value("'shape': ");
  else data.resize(data.size() - r.below(std::min<std::size_t>(data.size() + 1, 64)));  // truncated data
  std::string out = x.substr(0, 9);
  out += char(h.size() & 0xff);
  out += char((h.size() >> 8) & 0xff);
  if (!v1) out += std::string{char((h.size() >> 16) & 0xff), char((h.size() >> 24) & 0xff)};
  return out + h + data;
}

}  // namespace

int main(int argc, char** argv) {
  const long iterations = argc > 1 ? std::atol(argv[1]) : 100000;
  SplitMix r{argc > 2 ? std::uint64_t(std::atoll(argv[2])) : 1};
  std::vector<std::string> pool = attnlab::fuzz::seeds();
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto& s : pool) LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(s.data()), s.size());
  for (long i = 0; i < iterations; ++i) {
    // Each target half the time; its inputs mutated structurally or bytewise.
    const char target = char(r.below(2));
    std::string parent;
    for (int tries = 0; tries < 64 && (parent.empty() || parent[0] != target); ++tries)
      parent = pool[r.below(pool.size())];
    std::string x = r.below(2) ? mutate_structured(parent, r) : mutate(parent, pool, r);
    if (x.size() > 4096) x.resize(4096);
    const auto& c = attnlab::fuzz::counts();
    const long before = c.accepted[0] + c.accepted[1];
    LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(x.data()), x.size());
    // An input that ran (parsed and computed) becomes a parent: the search walks through valid inputs to the edges.
    if (c.accepted[0] + c.accepted[1] > before && pool.size() < 4000) pool.push_back(std::move(x));
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto& c = attnlab::fuzz::counts();
  std::printf("attnlab_fuzz: %ld mutated inputs (+%zu seeds) in %.1f s, no crash; .npy accepted %ld, refused %ld; "
              "specs accepted %ld, refused %ld\n",
              iterations, attnlab::fuzz::seeds().size(), s, c.accepted[0], c.refused[0], c.accepted[1], c.refused[1]);
  // Both targets must be explored on both sides, or the run tested nothing.
  if (iterations >= 1000 && (c.accepted[0] == 0 || c.refused[0] == 0 || c.accepted[1] == 0 || c.refused[1] == 0)) {
    std::printf("attnlab_fuzz: a target was never accepted or never refused: the mutations do not explore it\n");
    return 1;
  }
  return 0;
}
