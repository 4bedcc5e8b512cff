// python/src/explain.cpp: iattn.explain: the explainability methods of iattn/explain/methods.hpp
// (raw attention, rollout, Mamba-Attribution and its scores) and the heatmap colormaps.
#include "common.hpp"

#include <iattn/explain/colormap.hpp>
#include <iattn/explain/methods.hpp>

#include <nanobind/stl/vector.h>

namespace iattn::py {
namespace {

/// A list of (L, L) arrays of one dtype as matrices.
template <class T>
std::vector<Matrix<T>> matrices(const std::vector<array_in>& list, const char* where, const char* arg) {
  std::vector<Matrix<T>> out;
  for (std::size_t i = 0; i < list.size(); ++i) out.push_back(to_matrix<T>(list[i], where, std::string(arg) + "[" + std::to_string(i) + "]"));
  return out;
}

template <class F>
nb::object on_list(const std::vector<array_in>& list, const char* where, const char* arg, F&& f) {
  if (list.empty()) throw std::invalid_argument(std::string(where) + ": " + arg + " is empty; give at least one (L, L) map");
  auto run = [&](auto tag) -> nb::object {
    using T = decltype(tag);
    auto ms = matrices<T>(list, where, arg);
    std::optional<Matrix<T>> r;
    {
      nb::gil_scoped_release release;
      r.emplace(f(ms));
    }
    return to_numpy<T>(std::move(*r));
  };
  return on_scalar(dtype_of(list[0], where, std::string(arg) + "[0]"), run);
}

template <class F>
nb::object on_matrix(const array_in& a, const char* where, const char* arg, F&& f) {
  auto run = [&](auto tag) -> nb::object {
    using T = decltype(tag);
    const Matrix<T> m = to_matrix<T>(a, where, arg, true);
    return to_numpy<T>(Matrix<T>(f(m)));
  };
  return on_scalar(dtype_of(a, where, arg), run);
}

}  // namespace

void bind_explain(nb::module_& top) {
  nb::module_ m = top.def_submodule("explain", "Explainability: raw attention, rollout, Mamba-Attribution, heatmap colours.");
  m.def("raw_attention", [](const std::vector<array_in>& layers) {
        return on_list(layers, "raw_attention", "layers", [](const auto& ms) { return explain::raw_attention(ms); });
      }, nb::arg("layers"), "The mean of the per-layer (L, L) maps.");
  m.def("rollout", [](const std::vector<array_in>& layers, Index start_layer) {
        return on_list(layers, "rollout", "layers", [&](const auto& ms) { return explain::rollout(ms, {.start_layer = start_layer}); });
      }, nb::arg("layers"), nb::kw_only(), nb::arg("start_layer") = 0,
      "Attention rollout (Abnar & Zuidema): rho = A~(last) ... A~(start), A~ = rownorm(I + A_layer), first layer\n"
      "first in the list. Row q of rho is query q's relevance over the tokens, (L, L).");
  m.def(
      "mamba_attribution",
      [](const std::vector<array_in>& layers, const std::vector<array_in>& scores, Index start_layer) {
        if (layers.empty()) throw std::invalid_argument("mamba_attribution: layers is empty");
        auto run = [&](auto tag) -> nb::object {
          using T = decltype(tag);
          auto ls = matrices<T>(layers, "mamba_attribution", "layers");
          std::vector<Matrix<T>> ss;
          for (std::size_t i = 0; i < scores.size(); ++i)
            ss.push_back(to_matrix<T>(scores[i], "mamba_attribution", "scores[" + std::to_string(i) + "]", true));
          Matrix<T> r;
          {
            nb::gil_scoped_release release;
            r = explain::mamba_attribution(ls, ss, {.start_layer = start_layer});
          }
          return to_numpy<T>(std::move(r));
        };
        return on_scalar(dtype_of(layers[0], "mamba_attribution", "layers[0]"), run);
      },
      nb::arg("layers"), nb::arg("scores"), nb::kw_only(), nb::arg("start_layer") = 0,
      "Mamba-Attribution (Ali et al., eq. 23, then rollout): per layer rownorm(I + relu(A) diag(score)); scores\n"
      "(L,) per layer, e.g. gradient_scores(frozen_gradient(d, query, target)).");
  m.def("gradient_scores", [](const array_in& grad) {
        return on_matrix(grad, "gradient_scores", "grad", [](const auto& g) { return explain::gradient_scores(g); });
      }, nb::arg("grad"), "Per-token score from a gradient at the block (L, D): max over channels of its positive part,\n"
                          "min-max normalised to [0, 1], (1, L).");
  m.def(
      "frozen_gradient",
      [](const Decomposition& d, Index query, const array_in& target) {
        return std::visit([&](const auto& e) -> nb::object {
          using T = typename std::remove_cvref_t<decltype(e)>::scalar_type;
          const Matrix<T> tg = to_matrix<T>(target, "frozen_gradient", "target", true);
          return to_numpy<T>(explain::frozen_gradient(e, query, tg));
        }, d.d);
      },
      nb::arg("d"), nb::arg("query"), nb::arg("target"),
      "The exact gradient of the frozen decomposition's output at token `query`, projected on target (d_model,),\n"
      "with respect to its inner input: g[s, c] = H^c[query, s] (out_weight^T target)[c], (L, D).");
  m.def("minmax_abs", [](const array_in& M) {
        return on_matrix(M, "minmax_abs", "M", [](const auto& x) { return explain::minmax_abs(x); });
      }, nb::arg("M"), "|M| scaled to [0, 1] over the whole matrix.");
  m.def("bidirectional", [](const array_in& f, const array_in& b) {
        auto run = [&](auto tag) -> nb::object {
          using T = decltype(tag);
          return to_numpy<T>(explain::bidirectional(to_matrix<T>(f, "bidirectional", "forward"), to_matrix<T>(b, "bidirectional", "backward")));
        };
        return on_scalar(dtype_of(f, "bidirectional", "forward"), run);
      }, nb::arg("forward"), nb::arg("backward"), "F + J B J: a bidirectional layer's map from its two scans' maps.");
  m.def(
      "colorize",
      [](const array_in& M, const std::string& cmap) {
        if (cmap != "viridis" && cmap != "diverging")
          throw std::invalid_argument("colorize: cmap is '" + cmap + "' but expected 'viridis' or 'diverging'");
        const Matrix<double> v = dtype_of(M, "colorize", "values") == dtype::f32 ? Matrix<double>(to_matrix<float>(M, "colorize", "values").cast<double>())
                                                                                 : to_matrix<double>(M, "colorize", "values");
        auto* px = new std::vector<std::uint8_t>(std::size_t(v.size()) * 3);
        for (Index i = 0; i < v.size(); ++i) {
          const explain::rgb c = cmap == "viridis" ? explain::viridis(v.data()[i]) : explain::diverging(v.data()[i]);
          std::copy(c.begin(), c.end(), px->data() + 3 * i);
        }
        nb::capsule owner(px, [](void* p) noexcept { delete static_cast<std::vector<std::uint8_t>*>(p); });
        const std::size_t shape[3] = {std::size_t(v.rows()), std::size_t(v.cols()), 3};
        return nb::ndarray<nb::numpy, std::uint8_t, nb::ndim<3>>(px->data(), 3, shape, owner);
      },
      nb::arg("values"), nb::arg("cmap") = "viridis",
      "8-bit RGB (rows, cols, 3) of values in [0, 1]: 'viridis' (sequential) or 'diverging' (blue-white-red,\n"
      "white at 0.5), the colormaps of the C++ heatmaps.");
}

}  // namespace iattn::py
