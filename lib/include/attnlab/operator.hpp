// Attention matrices as linear operators (the Spectra pattern: algorithm apart from operator). Every operator
// has its own header under attnlab/operators/ (as Spectra's MatOp/); this header gathers the basic ones.
#pragma once

#include "attnlab/operators/difference.hpp"
#include "attnlab/operators/dense.hpp"
#include "attnlab/operators/low_rank.hpp"
#include "attnlab/operators/operator.hpp"
