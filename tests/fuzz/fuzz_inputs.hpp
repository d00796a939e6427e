// The fuzz target for attnlab's two parsers of untrusted text: the .npy reader and the method spec parser (with the
// method it builds run on a tiny problem). Any exception other than attnlab::Error, any crash, and (in the
// sanitizer build) any memory or undefined-behaviour error is a finding. Used by libFuzzer (tools/fuzz.sh, clang)
// and by the deterministic mutation driver that runs in the test suite (mutation_driver.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace attnlab::fuzz {
/// Seed inputs: valid .npy files (float32/float64, 2-D/3-D, C/Fortran order, format 1.0/2.0) and every registered
/// method's canonical spec, each prefixed by its target byte (0: .npy, 1: spec).
std::vector<std::string> seeds();
/// Inputs accepted so far (parsed and ran) and refused with an Error, per target (0: .npy, 1: spec): a run that
/// accepts nothing explores nothing.
struct Counts {
  long accepted[2] = {0, 0}, refused[2] = {0, 0};
};
Counts& counts();
}  // namespace attnlab::fuzz
