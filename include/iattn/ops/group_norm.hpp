// iattn/ops/group_norm.hpp: GroupNorm, the data-dependent diagonal of a (grouped) RMS or layer norm:
//   H^c[t, t] = weight[c] / sigma_t[g(c)],   sigma_t[g] = sqrt(mean_{c' in g} v_t[c']^2 + eps)   (RMS)
//                                            sigma_t[g] = sqrt(var_{c' in g} v_t[c'] + eps)       (centred)
// where v is the operator's own input and channel c belongs to group g(c) = c / (D/G).
//
//   weight (1, D) optional (1 when absent).   Causal: yes (diagonal).
// The centred norm is exact as diag(weight/sigma) v - weight*mu/sigma (+ bias): the diagonal is the
// operator; the centring term is an affine offset, returned by `offset(bound_norm)`.
//
// Statistics come from the input. `apply` computes them on the fly; `bind(H, X)` fixes them from a
// forward pass, after which the operator is a plain diagonal that `materialize`, `row`, `col` and
// `block` can evaluate. Evaluating an unbound GroupNorm that way throws std::invalid_argument.
#pragma once

#include "../core/coefficient.hpp"
#include "../core/error.hpp"
#include "../core/traits.hpp"

#include <cmath>
#include <memory>
#include <string>

namespace iattn {

struct group_norm_options {
  double eps = 1e-5;
  bool centered = false;  ///< false: RMS norm (Mamba-2); true: layer/group norm (RetNet, GLA)
};

template <Scalar T>
class GroupNorm : public op_base {
 public:
  using scalar = T;

  /// Statistics fixed by `bind`: per token and group, 1/sigma and the mean.
  struct statistics {
    Matrix<T> inv_sigma;  // (L, G)
    Matrix<T> mean;       // (L, G), zero for the RMS norm
    Index channels = 0;   // D the statistics were taken over
  };

  GroupNorm(Index groups, coefficient<T> weight, group_norm_options o) : groups_(groups), weight_(std::move(weight)), o_(o) {
    using std::to_string;
    if (groups_ < 1) detail::fail("group_norm", "groups is " + to_string(groups_) + " but must be >= 1");
    if (!(o_.eps >= 0)) detail::fail("group_norm", "eps is " + std::to_string(o_.eps) + " but must be >= 0");
    if (!weight_.empty()) {
      detail::require_shape(weight_.rows() == 1 && weight_.cols() >= 1 && weight_.cols() % groups_ == 0, "group_norm",
                            "weight", weight_.rows(), weight_.cols(),
                            "(1, D) with D divisible by groups = " + to_string(groups_));
    }
  }

  Index length() const { return stats_ ? stats_->inv_sigma.rows() : any; }
  Index channels() const {
    if (!weight_.empty()) return weight_.cols();
    return stats_ ? stats_->channels : any;
  }
  Index groups() const { return groups_; }
  double eps() const { return o_.eps; }
  bool centered() const { return o_.centered; }
  bool bound() const { return stats_ != nullptr; }
  const statistics& stats() const { return *stats_; }
  const coefficient<T>& weight() const { return weight_; }
  IATTN_HOST_DEVICE T weight_at(Index c) const { return weight_.empty() ? T(1) : weight_(0, c); }

  /// Checks that V (L, D) can be normalised: D divisible by the groups and matching the weight.
  void check_input(Index rows, Index cols, const char* where) const {
    const bool ok = cols >= 1 && cols % groups_ == 0 && (weight_.empty() || cols == weight_.cols());
    detail::require_shape(ok, where, "group_norm input", rows, cols,
                          weight_.empty() ? "(L, D) with D divisible by groups = " + std::to_string(groups_)
                                          : "(L, D=" + std::to_string(weight_.cols()) + ")");
  }

  /// Statistics of V (L, D) (row-major, contiguous).
  statistics compute(const T* v, Index L, Index D) const {
    statistics s;
    s.channels = D;
    s.inv_sigma.resize(L, groups_);
    s.mean.setZero(L, groups_);
    const Index Dg = D / groups_;
    for (Index t = 0; t < L; ++t)
      for (Index g = 0; g < groups_; ++g) {
        const T* p = v + t * D + g * Dg;
        double mu = 0;
        if (o_.centered) {
          for (Index i = 0; i < Dg; ++i) mu += p[i];
          mu /= double(Dg);
        }
        double ss = 0;
        for (Index i = 0; i < Dg; ++i) ss += (double(p[i]) - mu) * (double(p[i]) - mu);
        s.inv_sigma(t, g) = T(1.0 / std::sqrt(ss / double(Dg) + o_.eps));
        s.mean(t, g) = T(mu);
      }
    return s;
  }

  /// A copy whose statistics are fixed, with its diagonal formed once (scale()). s.channels is the
  /// D the statistics were taken over (the weight's when 0).
  GroupNorm bound_to(statistics s) const {
    using std::to_string;
    if (s.channels == 0) s.channels = weight_.cols();
    const Index L = s.inv_sigma.rows(), D = s.channels;
    const bool ok = D >= 1 && D % groups_ == 0 && s.inv_sigma.cols() == groups_ &&
                    (weight_.empty() || weight_.cols() == D) && (s.mean.size() == 0 || (s.mean.rows() == L && s.mean.cols() == groups_));
    if (!ok)
      detail::fail("group_norm", "bound_to: statistics over D = " + to_string(D) + " channels with inv_sigma (" +
                                     to_string(L) + ", " + to_string(s.inv_sigma.cols()) + ") and mean (" +
                                     to_string(s.mean.rows()) + ", " + to_string(s.mean.cols()) + ") but expected D >= 1 divisible by groups = " +
                                     to_string(groups_) + (weight_.empty() ? "" : " and equal to the weight's " + to_string(weight_.cols())) +
                                     ", inv_sigma and mean (L, groups)");
    auto scale = std::make_shared<Matrix<T>>(L, D);
    const Index Dg = D / groups_;
    for (Index t = 0; t < L; ++t)
      for (Index c = 0; c < D; ++c) (*scale)(t, c) = weight_at(c) * s.inv_sigma(t, c / Dg);
    GroupNorm out = *this;
    out.stats_ = std::make_shared<const statistics>(std::move(s));
    out.scale_ = std::move(scale);
    return out;
  }

  /// A bound norm's diagonal as an (L, D) matrix: scale()(t, c) = weight[c] / sigma_t[g(c)] (the
  /// evaluators read it as they read a Diagonal's coefficient).
  const Matrix<T>& scale() const { return *scale_; }

  /// Diagonal entry for token t and channel c of a bound norm over D channels (host only: the
  /// statistics live in host memory; the CUDA backend forms the diagonal on the device, band.hpp).
  T value(Index t, Index c, Index D) const {
    return weight_at(c) * stats_->inv_sigma(t, c / (D / groups_));
  }

 private:
  Index groups_;
  coefficient<T> weight_;
  group_norm_options o_;
  std::shared_ptr<const statistics> stats_;
  std::shared_ptr<const Matrix<T>> scale_;  // (L, D), with stats_
};

template <class T>
inline constexpr bool is_lower_v<GroupNorm<T>> = true;
template <class T>
inline constexpr bool is_upper_v<GroupNorm<T>> = true;
template <class T>
inline constexpr bool has_group_norm_v<GroupNorm<T>> = true;

/// Group norm over `groups` groups of channels with weight (1, D).
template <class E>
GroupNorm<detail::scalar_of<E>> group_norm(Index groups, E&& weight, group_norm_options o = {}) {
  using T = detail::scalar_of<E>;
  return GroupNorm<T>(groups, detail::make_coefficient(std::forward<E>(weight)), o);
}

/// Group norm without a weight (weight 1); the scalar type is explicit: group_norm<float>(G).
template <Scalar T>
GroupNorm<T> group_norm(Index groups, group_norm_options o = {}) {
  return GroupNorm<T>(groups, coefficient<T>{}, o);
}

/// The affine offset of a bound centred norm, (L, D): -weight[c] * mu_t[g] / sigma_t[g], so that
/// the layer's output is apply(norm, v) + offset(norm). Zero for the RMS norm.
template <class T>
Matrix<T> offset(const GroupNorm<T>& n) {
  if (!n.bound()) detail::fail("offset", "the GroupNorm is unbound; call bind(H, X) first");
  const auto& s = n.stats();
  const Index L = s.inv_sigma.rows(), D = s.channels, Dg = D / n.groups();
  Matrix<T> o(L, D);
  for (Index t = 0; t < L; ++t)
    for (Index c = 0; c < D; ++c) o(t, c) = -n.weight_at(c) * s.mean(t, c / Dg) * s.inv_sigma(t, c / Dg);
  return o;
}

}  // namespace iattn
