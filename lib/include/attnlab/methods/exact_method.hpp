// `exact`: softmax attention itself, the ground truth every other method is measured against.
#pragma once

#include "attnlab/registry.hpp"

namespace attnlab {

MethodDescriptor exact_descriptor();

}  // namespace attnlab
