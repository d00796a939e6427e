// Every registered method's typed class and options struct, one header per method under attnlab/methods/.
// This list is the registry: its order is the registry's (`attnlab methods`, the conformance test, the experiments'
// families), and the build derives the registry's and the typed tests' lists from it (lib/CMakeLists.txt). Adding a
// method: its header here (NameOptions with ATTNLAB_OPTIONS, then ATTNLAB_TYPED_METHOD(Name), where Name is the
// file's name capitalised), its .cpp under lib/src/methods/ (the method, NameOptions::descriptor(), from(), spec(),
// ATTNLAB_TYPED_METHOD_DEFINE(Name)), and one line below.
#pragma once

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
