// The low-rank methods' size checks (a budget that counts rows and columns taken from P cannot exceed min(n_q, n_k))
// are declared with their parameters now (`.within_min_n()`, core/parameters.hpp) and checked by core/registry.cpp's
// check_limits. This translation unit stays, empty, so that the unity batches of lib/CMakeLists.txt (8 sources each,
// in order) keep their sources and their object code.
#include "attnlab/methods/base/lowrank_method.hpp"
