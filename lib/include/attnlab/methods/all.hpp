// Every method's typed class and options struct (one header per method under attnlab/methods/).
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
