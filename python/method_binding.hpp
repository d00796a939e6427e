// attnlab._core.Method: one method built from its spec, fitted once on (Q, K) and applied to many V; its operator
// P̃, matrix, diagnostics and spectrum (method_binding.cpp). The public class is the Python layer's attnlab.Method
// (python/attnlab/__init__.py), which checks the arguments and carries the docstrings.
#pragma once

#include <pybind11/pybind11.h>

/// Adds the class `Method` to the module (called from module.cpp's PYBIND11_MODULE).
void bind_method(pybind11::module_& m);
