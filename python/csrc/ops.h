// Registration hooks of the binding's parts, called from ops.cpp's TORCH_LIBRARY block and
// PYBIND11_MODULE so that one library definition holds every schema.
#pragma once

#include <pybind11/pybind11.h>
#include <torch/library.h>

namespace treemla::binding {

void define_tree_ops(torch::Library& m);         // tree_ops.cpp
void define_kvpool_ops(torch::Library& m);       // kvpool_ops.cpp
void define_cuda_python(pybind11::module& m);    // cuda_ops.cpp: plan_verify, check_status, ...
void define_kvpool_python(pybind11::module& m);  // kvpool_ops.cpp: the host KvPool class
void define_budget_python(pybind11::module& m);  // budget_ops.cpp: the DDTree budget picker

}  // namespace treemla::binding
