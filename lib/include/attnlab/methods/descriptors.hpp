// Descriptors of every registered method (name, parameters, causal support, factories). The registry lists
// them; each is defined next to its method.
#pragma once

#include "attnlab/registry.hpp"

namespace attnlab {

MethodDescriptor exact_descriptor();        // methods/exact_method.cpp
MethodDescriptor linear_descriptor();       // methods/kernel_methods.cpp
MethodDescriptor efficient_descriptor();    // methods/kernel_methods.cpp
MethodDescriptor taylor_descriptor();       // methods/kernel_methods.cpp
MethodDescriptor performer_descriptor();    // methods/performer.cpp
MethodDescriptor nystrom_descriptor();      // methods/nystrom.cpp
MethodDescriptor linformer_descriptor();    // methods/linformer.cpp
MethodDescriptor svd_descriptor();          // methods/lowrank_baselines.cpp
MethodDescriptor cur_descriptor();          // methods/lowrank_baselines.cpp

}  // namespace attnlab
