// Every registered method: its header (the options struct and the public typed class, e.g. NystromOptions and
// NystromMethod<T>) and its place in the registry. The tuple below is the registry's list, in its order (`attnlab
// methods`, the conformance test, the experiments' families); lib/src/methods/all.cpp reads it. Adding a method:
// its header under attnlab/methods/ — the options struct declares every fact about it once: its parameters with
// their ranges, the budget families the studies sweep (grid, simplicity rank, place in the listing) and its size
// limits (core/parameters.hpp), and, where it has them, memory() and check_size() — and its .cpp under
// lib/src/methods/ (NameOptions::registry_entry(), the class's overrides, the float and double instantiations), then
// its #include and its entry in the tuple here. Nothing else: every study, the report and `attnlab methods` read it.
#pragma once

#include <tuple>

#include "attnlab/methods/exact.hpp"
#include "attnlab/methods/linear.hpp"
#include "attnlab/methods/efficient.hpp"
#include "attnlab/methods/taylor.hpp"
#include "attnlab/methods/performer.hpp"
#include "attnlab/methods/nystrom.hpp"
#include "attnlab/methods/linformer.hpp"
#include "attnlab/methods/svd.hpp"
#include "attnlab/methods/cur.hpp"
#include "attnlab/methods/vq.hpp"
#include "attnlab/methods/probsparse.hpp"
#include "attnlab/methods/local.hpp"
#include "attnlab/methods/sparse.hpp"
#include "attnlab/methods/reformer.hpp"
#include "attnlab/methods/scatterbrain.hpp"

namespace attnlab {

/// The registry: every method's options struct, in registry order.
using RegisteredMethodOptions =
    std::tuple<ExactOptions, LinearOptions, EfficientOptions, TaylorOptions, PerformerOptions, NystromOptions,
               LinformerOptions, SvdOptions, CurOptions, VqOptions, ProbSparseOptions, LocalOptions, SparseOptions,
               ReformerOptions, ScatterbrainOptions>;

}  // namespace attnlab
