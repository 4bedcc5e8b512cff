// python/src/module.cpp: the extension module iattn._iattn (the package iattn re-exports it).
#include "common.hpp"

#include <iattn/version.hpp>

namespace iattn::py {
void bind_operators(nb::module_& m);
void bind_explain(nb::module_& m);
void bind_models_mamba(nb::module_& models);
void bind_models_rnn(nb::module_& models);
void bind_models_delta(nb::module_& models);
void bind_models_more(nb::module_& models);
}  // namespace iattn::py

NB_MODULE(_iattn, m) {
  namespace nb = nanobind;
  m.doc() = "iattn's C++ core: operators, evaluation, model decompositions (see the package iattn).";
  m.attr("__version__") = iattn::version;
#if defined(IATTN_USE_XSIMD)
  m.attr("simd") = true;
#else
  m.attr("simd") = false;
#endif
  iattn::py::bind_operators(m);
  iattn::py::bind_explain(m);
  nb::module_ models = m.def_submodule("models", "Model decompositions: one submodule per model.");
  iattn::py::bind_models_mamba(models);
  iattn::py::bind_models_rnn(models);
  iattn::py::bind_models_delta(models);
  iattn::py::bind_models_more(models);
}
