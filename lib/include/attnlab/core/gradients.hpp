// The result of a backward pass: the vector–Jacobian products of O = attention(Q, K)·V for an upstream dO.
#pragma once

#include "attnlab/core/types.hpp"

namespace attnlab {

/// dL/dQ (n_q × d), dL/dK (n_k × d), dL/dV (n_k × d_v) for the upstream gradient dO = dL/dO.
template <typename T>
struct Gradients {
  MatrixR<T> dq, dk, dv;
};

}  // namespace attnlab
