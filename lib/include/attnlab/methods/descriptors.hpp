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
MethodDescriptor vq_descriptor();           // methods/vq.cpp
MethodDescriptor probsparse_descriptor();   // methods/probsparse.cpp
MethodDescriptor local_descriptor();        // methods/sparse_patterns.cpp
MethodDescriptor sparse_descriptor();       // methods/sparse_patterns.cpp
MethodDescriptor reformer_descriptor();     // methods/sparse_patterns.cpp
MethodDescriptor scatterbrain_descriptor(); // methods/scatterbrain.cpp

}  // namespace attnlab
