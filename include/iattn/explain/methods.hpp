// iattn/explain/methods.hpp: the explainability methods of the papers (docs/design.md section 7) on
// per-layer (L, L) maps: display normalisations, raw attention, attention rollout, Mamba-Attribution
// and its gradient-free variant, and the bidirectional combination with a class token.
//
// Every function validates its input: maps must be square and of one size across layers, scores
// finite; violations throw std::invalid_argument / std::domain_error naming the argument.
// The reference code's bugs (docs/design.md section 7) are not reproduced: rollout multiplies matrices (not
// broadcast vectors), the class token's row is taken at its true index and its diagonal is kept.
#pragma once

#include "../core/config.hpp"
#include "../core/error.hpp"
#include "../evaluate.hpp"

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

namespace iattn::explain {

namespace detail {
template <class T>
void require_finite(const Matrix<T>& m, const char* where, const char* argument) {
  if (!m.allFinite())
    throw std::domain_error(std::string(where) + ": " + argument + " " + iattn::detail::shape_string(m.rows(), m.cols()) +
                            " contains NaN or infinity; expected finite values");
}
template <class T>
void require_square(const Matrix<T>& m, const char* where, const char* argument) {
  iattn::detail::require_shape(m.rows() == m.cols() && m.rows() >= 1, where, argument, m.rows(), m.cols(), "(L, L) with L >= 1");
}
template <class T>
Index common_size(const std::vector<Matrix<T>>& layers, const char* where) {
  if (layers.empty()) iattn::detail::fail(where, "layers is empty; expected at least one (L, L) map");
  const Index L = layers.front().rows();
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const std::string arg = "layers[" + std::to_string(i) + "]";
    iattn::detail::require_shape(layers[i].rows() == L && layers[i].cols() == L, where, arg.c_str(), layers[i].rows(),
                                 layers[i].cols(), "(L, L) with L = " + std::to_string(L) + " (the size of layers[0])");
    require_finite(layers[i], where, arg.c_str());
  }
  return L;
}
}  // namespace detail

/// |M| scaled to [0, 1] over the whole matrix: (|M| - min) / (max - min); all zeros when |M| is constant.
template <class T>
Matrix<T> minmax_abs(const Matrix<T>& M) {
  detail::require_finite(M, "minmax_abs", "M");
  Matrix<T> a = M.cwiseAbs();
  if (a.size() == 0) return a;
  const T lo = a.minCoeff(), hi = a.maxCoeff();
  if (hi == lo) return Matrix<T>::Zero(a.rows(), a.cols());
  return ((a.array() - lo) / (hi - lo)).matrix();
}

/// Row-wise softmax with the row maximum subtracted (for a Transformer's score maps).
template <class T>
Matrix<T> row_softmax(const Matrix<T>& M) {
  detail::require_finite(M, "row_softmax", "M");
  Matrix<T> out(M.rows(), M.cols());
  for (Index t = 0; t < M.rows(); ++t) {
    const T mx = M.row(t).maxCoeff();
    out.row(t) = (M.row(t).array() - mx).exp().matrix();
    out.row(t) /= out.row(t).sum();
  }
  return out;
}

/// Raw attention of one layer: the mean over channels of H^c, (L, L) (materialize_mean).
template <class Expr>
auto raw_attention(const Expr& H, Index L = any) {
  return materialize_mean(H, L);
}

/// Raw attention over layers: the mean of the per-layer maps (all (L, L)).
template <class T>
Matrix<T> raw_attention(const std::vector<Matrix<T>>& layers) {
  const Index L = detail::common_size(layers, "raw_attention");
  Matrix<T> m = Matrix<T>::Zero(L, L);
  for (const auto& a : layers) m += a;
  return m / T(layers.size());
}

/// I + A with every row divided by its sum (the rollout's per-layer step). A row that sums to 0
/// cannot be normalised and throws std::domain_error naming it.
template <class T>
Matrix<T> add_identity_normalize_rows(const Matrix<T>& A, const char* where = "rollout") {
  Matrix<T> m = A;
  m.diagonal().array() += T(1);
  for (Index t = 0; t < m.rows(); ++t) {
    const T s = m.row(t).sum();
    if (s == T(0) || !std::isfinite(double(s)))
      throw std::domain_error(std::string(where) + ": row " + std::to_string(t) + " of I + A sums to " + std::to_string(double(s)) +
                              "; cannot normalise it to 1");
    m.row(t) /= s;
  }
  return m;
}

struct rollout_options {
  Index start_layer = 0;  ///< layers before this one are skipped (Chefer et al.'s start_layer)
};

/// Attention rollout (Abnar & Zuidema; the papers' eq. 20-21): rho = A~(last) ... A~(start) with
/// A~ = rownorm(I + A_layer), later layers on the left. Row q of rho is query q's relevance map.
template <class T>
Matrix<T> rollout(const std::vector<Matrix<T>>& layers, rollout_options o = {}) {
  const Index L = detail::common_size(layers, "rollout");
  if (o.start_layer < 0 || o.start_layer >= Index(layers.size()))
    iattn::detail::fail("rollout", "start_layer is " + std::to_string(o.start_layer) + " but must lie in [0, " +
                                       std::to_string(layers.size()) + ")");
  Matrix<T> rho = Matrix<T>::Identity(L, L);
  for (std::size_t l = std::size_t(o.start_layer); l < layers.size(); ++l)
    rho = add_identity_normalize_rows(layers[l]) * rho;  // later layers on the left
  return rho;
}

/// Row `query` of a (L, L) map as a (1, L) relevance vector; with a class token at `query` it is
/// that token's map over all tokens (its own column included).
template <class T>
Matrix<T> query_row(const Matrix<T>& rho, Index query) {
  detail::require_square(rho, "query_row", "rho");
  if (query < 0 || query >= rho.rows())
    iattn::detail::fail("query_row", "query is " + std::to_string(query) + " but must lie in [0, " + std::to_string(rho.rows()) + ")");
  return rho.row(query);
}

/// The per-token score of Mamba-Attribution from a gradient at the block (L, D): the maximum over
/// channels of its positive part, min-max normalised over tokens to [0, 1] (constant -> zeros).
template <class T>
Matrix<T> gradient_scores(const Matrix<T>& grad) {
  detail::require_finite(grad, "gradient_scores", "grad");
  iattn::detail::require_shape(grad.rows() >= 1 && grad.cols() >= 1, "gradient_scores", "grad", grad.rows(), grad.cols(), "(L, D) with L, D >= 1");
  Matrix<T> s(1, grad.rows());
  for (Index t = 0; t < grad.rows(); ++t) s(0, t) = std::max(grad.row(t).maxCoeff(), T(0));
  return minmax_abs(s);
}

/// Mamba-Attribution (Ali et al., eq. 23, then rollout): per layer A~ = I + relu(A_layer) diag(score),
/// the score (1, L) scaling each key token's column, rows normalised, multiplied as in rollout.
template <class T>
Matrix<T> mamba_attribution(const std::vector<Matrix<T>>& layers, const std::vector<Matrix<T>>& scores, rollout_options o = {}) {
  const Index L = detail::common_size(layers, "mamba_attribution");
  if (scores.size() != layers.size())
    iattn::detail::fail("mamba_attribution", "scores has " + std::to_string(scores.size()) + " entries but layers has " +
                                                 std::to_string(layers.size()) + "; expected one (1, L) score per layer");
  std::vector<Matrix<T>> weighted;
  weighted.reserve(layers.size());
  for (std::size_t l = 0; l < layers.size(); ++l) {
    const std::string arg = "scores[" + std::to_string(l) + "]";
    iattn::detail::require_shape(scores[l].rows() == 1 && scores[l].cols() == L, "mamba_attribution", arg.c_str(), scores[l].rows(),
                                 scores[l].cols(), "(1, L=" + std::to_string(L) + ")");
    detail::require_finite(scores[l], "mamba_attribution", arg.c_str());
    Matrix<T> w = layers[l].cwiseMax(T(0));
    w.array().rowwise() *= scores[l].row(0).array();
    weighted.push_back(std::move(w));
  }
  return rollout(weighted, o);
}

/// The gradient-free score: the gradient that the frozen decomposition's output at token `query`,
/// projected on `target` (1, d_model), has with respect to the inner input x:
///   g[s, c] = H^c[query, s] * (out_weight^T target^T)[c]        (L, D)
/// "Frozen" means every data-controlled coefficient (gates, decays, norm statistics) is held at its
/// value for this input; g is then the exact gradient of that linear map. Feed it to gradient_scores.
template <class Dec, class T = typename Dec::scalar_type>
Matrix<T> frozen_gradient(const Dec& d, Index query, const Matrix<T>& target) {
  const Index L = d.x.rows(), D = d.x.cols();
  iattn::detail::require_shape(target.rows() == 1 && target.cols() == d.out_weight.rows(), "frozen_gradient", "target", target.rows(),
                               target.cols(), "(1, d_model=" + std::to_string(d.out_weight.rows()) + ")");
  if (query < 0 || query >= L)
    iattn::detail::fail("frozen_gradient", "query is " + std::to_string(query) + " but must lie in [0, " + std::to_string(L) + ")");
  const Matrix<T> w = target * d.out_weight;  // (1, D)
  const Matrix<T> r = row(d.H, query, L);     // (D, L): r(c, s) = H^c[query, s]
  Matrix<T> g(L, D);
  for (Index s = 0; s < L; ++s)
    for (Index c = 0; c < D; ++c) g(s, c) = r(c, s) * w(0, c);
  return g;
}

/// The bidirectional map (Vision Mamba): F + J B J, with F the forward scan's map and B the backward
/// scan's map over the reversed tokens; both (L, L).
template <class T>
Matrix<T> bidirectional(const Matrix<T>& forward, const Matrix<T>& backward) {
  detail::require_square(forward, "bidirectional", "forward");
  iattn::detail::require_shape(backward.rows() == forward.rows() && backward.cols() == forward.cols(), "bidirectional", "backward",
                               backward.rows(), backward.cols(), "the shape of forward, " + iattn::detail::shape_string(forward.rows(), forward.cols()));
  return forward + backward.reverse();  // reverse() of both axes is J B J
}

/// A class token's relevance over the other tokens: row `cls` of rho without its own column, (1, L-1).
template <class T>
Matrix<T> cls_relevance(const Matrix<T>& rho, Index cls) {
  const Matrix<T> r = query_row(rho, cls);
  Matrix<T> out(1, r.cols() - 1);
  out << r.leftCols(cls), r.rightCols(r.cols() - cls - 1);
  return out;
}

}  // namespace iattn::explain
