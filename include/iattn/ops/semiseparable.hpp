// iattn/ops/semiseparable.hpp: Semiseparable(lambda, B, C), the selective state-space matrix
//   H^c[t, s] = sum_m C_t[g, m] * exp(sum_{k=s+1..t} lambda_k[h, m]) * B_s[g, m]     (s <= t)
// for channel c in head h = c / P, whose B/C group is g = h / (H/G).
//
//   lambda  (L, H*Nd)  log-decay, Nd = N (per-state decay: Mamba-1, GLA, RWKV-6, HGRN2) or
//                      Nd = 1 (one decay per head: Mamba-2/SSD, RetNet, linear attention)
//   B, C    (L, G*N)   input and output projections of the state
//   bonus   (H, N)     only in the strict form (below)
// Channels D = H * P.   Causal: yes.
//
// Factored decay (Mamba-1's discretisation dA = exp(dt A)): lambda[t, h*N + m] = dt[t, h] * A[h, m],
// given as factored_decay(dt (L, H), A (H, N)). It denotes the same matrix as the dense (L, H*N)
// lambda, reads L*H + H*N numbers instead of L*H*N, and lets the scan form each exponent in a
// register. dt >= 0 and A <= 0 keep every exponent non-positive.
//
// lambda <= 0 is the normal case (decay in (0, 1]); lambda = -inf is a reset (decay exactly 0).
// Decays are only ever summed over a range and exponentiated, never differenced, so -inf is exact
// and no exp argument is positive when lambda <= 0.
//
// Strict-with-bonus form (RWKV): for s < t the decay sum runs over k = s+1..t-1, and the diagonal is
//   H^c[t, t] = sum_m C_t[g, m] * bonus[h, m] * B_t[g, m].
#pragma once

#include "../core/coefficient.hpp"
#include "../core/error.hpp"
#include "../core/traits.hpp"

#include <sstream>
#include <stdexcept>
#include <string>

namespace iattn {

struct semiseparable_options {
  Index heads = 0;     ///< H (required): lambda has H*N columns (per-state) or H (per head)
  Index head_dim = 1;  ///< P channels per head; D = H*P (Mamba-1: H = D, P = 1)
  Index groups = 1;    ///< G groups of B/C; must divide H
  Index state = 0;     ///< N; 0 infers N = B.cols() / G
  bool strict = false; ///< strict-with-bonus form (the bonus is given to the 5-argument factory)
  /// Accept positive log-decays (growing states). Off by default: a positive lambda (or dt * A > 0)
  /// throws std::domain_error where the coefficient enters, since exp of a sum of them overflows.
  bool allow_growth = false;
};

/// The factored log-decay lambda[t, h*N + m] = dt[t, h] * A[h, m]; made by factored_decay().
template <Scalar T>
struct decay_factors {
  coefficient<T> dt;  ///< (L, H)
  coefficient<T> A;   ///< (H, N)
};

/// lambda = dt (x) A per head: dt (L, H), A (H, N). See the header comment.
template <class DT, class AE>
decay_factors<detail::scalar_of<DT>> factored_decay(DT&& dt, AE&& A) {
  static_assert(std::is_same_v<detail::scalar_of<DT>, detail::scalar_of<AE>>,
                "factored_decay: dt and A must share a scalar type");
  return {detail::make_coefficient(std::forward<DT>(dt)), detail::make_coefficient(std::forward<AE>(A))};
}

template <Scalar T>
class Semiseparable : public op_base {
 public:
  using scalar = T;

  Semiseparable(coefficient<T> lambda, coefficient<T> B, coefficient<T> C, coefficient<T> bonus,
                semiseparable_options o)
      : Semiseparable(decay_factors<T>{std::move(lambda), {}}, std::move(B), std::move(C), std::move(bonus), o) {}

  /// lambda = decay.dt (x) decay.A when decay.A is given, else lambda = decay.dt.
  Semiseparable(decay_factors<T> decay, coefficient<T> B, coefficient<T> C, coefficient<T> bonus,
                semiseparable_options o)
      : lambda_(std::move(decay.dt)), rate_(std::move(decay.A)), B_(std::move(B)), C_(std::move(C)),
        bonus_(std::move(bonus)), o_(o) {
    check_shapes();
    if (!o_.allow_growth) check_decay();
  }

  Index length() const { return lambda_.rows(); }
  Index channels() const { return o_.heads * o_.head_dim; }
  Index heads() const { return o_.heads; }
  Index head_dim() const { return o_.head_dim; }
  Index groups() const { return o_.groups; }
  Index state() const { return o_.state; }
  /// True when the log-decay has one value per (token, head, state): Nd = N. False: Nd = 1.
  bool per_state() const { return factored() || lambda_.cols() != o_.heads; }
  /// True when lambda = dt (x) A: then lambda() is dt (L, H) and decay_rate() is A (H, N).
  bool factored() const { return !rate_.empty(); }
  bool strict() const { return o_.strict; }
  bool has_bonus() const { return !bonus_.empty(); }

  IATTN_HOST_DEVICE Index head_of(Index c) const { return c / o_.head_dim; }
  IATTN_HOST_DEVICE Index group_of_head(Index h) const { return h / (o_.heads / o_.groups); }

  /// The log-decay (L, H*N) or (L, H); with a factored decay, dt (L, H).
  const coefficient<T>& lambda() const { return lambda_; }
  /// A (H, N) of a factored decay; empty otherwise.
  const coefficient<T>& decay_rate() const { return rate_; }
  /// lambda[t, h*N + m] (m ignored when Nd = 1), whatever the storage.
  IATTN_HOST_DEVICE T log_decay(Index t, Index h, Index m) const {
    if (!rate_.empty()) return lambda_(t, h) * rate_(h, m);
    return lambda_.cols() == o_.heads ? lambda_(t, h) : lambda_(t, h * o_.state + m);
  }
  const coefficient<T>& B() const { return B_; }
  const coefficient<T>& C() const { return C_; }
  const coefficient<T>& bonus() const { return bonus_; }
  const semiseparable_options& options() const { return o_; }

 private:
  /// Shape checks that name the argument that is wrong: L and N are taken from the majority of the
  /// arguments that carry them (and from options.state when given), so one bad argument is the one
  /// reported; where two arguments disagree and nothing decides between them, both are named.
  void check_shapes() {
    const char* where = "semiseparable";
    using detail::fail;
    using std::to_string;
    if (o_.heads < 1) fail(where, "options.heads is " + to_string(o_.heads) + " but must be >= 1 (H)");
    if (o_.head_dim < 1) fail(where, "options.head_dim is " + to_string(o_.head_dim) + " but must be >= 1 (P)");
    if (o_.groups < 1 || o_.heads % o_.groups != 0)
      fail(where, "options.groups is " + to_string(o_.groups) + " but must divide heads = " + to_string(o_.heads));
    if (o_.state < 0) fail(where, "options.state is " + to_string(o_.state) + " but must be >= 0 (0: inferred)");
    const Index H = o_.heads, G = o_.groups;
    const char* lname = factored() ? "factored_decay dt" : "lambda";
    // L: lambda's (or dt's), B's and C's rows; two that agree outvote the third.
    const Index lL = lambda_.rows(), bL = B_.rows(), cL = C_.rows();
    const Index L = (bL == cL) ? bL : lL;
    auto shape = [](const coefficient<T>& m) { return detail::shape_string(m.rows(), m.cols()); };
    if (bL != cL && lL != bL && lL != cL)
      fail(where, std::string(lname) + " " + shape(lambda_) + ", B " + shape(B_) + " and C " + shape(C_) +
                      " disagree on L (their rows): all three must have L rows");
    // N: from options.state, else from the arguments that fix it (B, C, a per-state lambda, A).
    Index N = o_.state;
    if (N == 0) {
      const Index bN = B_.cols() % G == 0 ? B_.cols() / G : -1, cN = C_.cols() % G == 0 ? C_.cols() / G : -1;
      Index lN = -1;  // what the decay says about N, when it says anything
      if (factored()) lN = rate_.cols();
      else if (lambda_.cols() != H && lambda_.cols() % H == 0) lN = lambda_.cols() / H;
      if (bN == cN || bN == lN) N = bN;
      else if (cN == lN) N = cN;
      else if (lN > 0) N = lN;
      else
        fail(where, "B " + shape(B_) + " and C " + shape(C_) + " disagree: both must be (L, G*N) with G = " +
                        to_string(G) + " (set options.state to say which N is meant)");
      if (N <= 0)
        detail::require_shape(false, where, "B", B_.rows(), B_.cols(),
                              "(L=" + to_string(L) + ", G*N) with G = " + to_string(G) + " and N >= 1");
      o_.state = N;
    }
    const std::string gn = "(L=" + to_string(L) + ", G*N=" + to_string(G * N) + ")";
    detail::require_shape(B_.rows() == L && B_.cols() == G * N, where, "B", B_.rows(), B_.cols(), gn);
    detail::require_shape(C_.rows() == L && C_.cols() == G * N, where, "C", C_.rows(), C_.cols(), gn);
    if (!factored())
      detail::require_shape(lambda_.rows() == L && (lambda_.cols() == H * N || lambda_.cols() == H), where,
                            "lambda", lambda_.rows(), lambda_.cols(),
                            "(L=" + to_string(L) + ", H*N=" + to_string(H * N) +
                                ") for per-state decay or (L=" + to_string(L) + ", H=" + to_string(H) +
                                ") for one decay per head");
    else {
      detail::require_shape(lambda_.rows() == L && lambda_.cols() == H, where, "factored_decay dt", lambda_.rows(),
                            lambda_.cols(), "(L=" + to_string(L) + ", H=" + to_string(H) + ")");
      detail::require_shape(rate_.rows() == H && rate_.cols() == N, where, "factored_decay A", rate_.rows(),
                            rate_.cols(), "(H=" + to_string(H) + ", N=" + to_string(N) + ")");
    }
    if (!bonus_.empty()) {
      o_.strict = true;
      detail::require_shape(bonus_.rows() == H && bonus_.cols() == N, where, "bonus", bonus_.rows(),
                            bonus_.cols(), "(H=" + to_string(H) + ", N=" + to_string(N) + ")");
    }
  }

  /// The library's invariant: no positive log-decay (exp of a sum of them overflows). NaN passes
  /// (non-finite values propagate, docs/numerics.md); -inf is a reset. O(L*H + H*N) for a factored
  /// decay (the sign of dt against A's extremes per head), one read of lambda otherwise.
  void check_decay() const {
    auto bad = [](const char* arg, Index r, Index c, T v, const char* hint) {
      std::ostringstream s;
      s << "semiseparable: " << arg << "[" << r << ", " << c << "] = " << v << hint
        << " (set options.allow_growth to accept growing states)";
      throw std::domain_error(s.str());
    };
    if (!factored()) {
      for (Index t = 0; t < lambda_.rows(); ++t) {
        const T* row = lambda_.row(t);
        for (Index j = 0; j < lambda_.cols(); ++j)
          if (row[j] > T(0)) bad("lambda", t, j, row[j], " is a positive log-decay; expected lambda <= 0");
      }
      return;
    }
    const Index H = o_.heads, N = o_.state;
    for (Index h = 0; h < H; ++h) {
      Index mx = 0, mn = 0;  // where A[h, :] is largest and smallest
      for (Index m = 1; m < N; ++m) {
        if (rate_(h, m) > rate_(h, mx)) mx = m;
        if (rate_(h, m) < rate_(h, mn)) mn = m;
      }
      for (Index t = 0; t < lambda_.rows(); ++t) {
        const T dt = lambda_(t, h);
        const Index m = dt > T(0) ? mx : mn;
        if (dt * rate_(h, m) > T(0)) {
          std::ostringstream hint;
          hint << " and A[" << h << ", " << m << "] = " << rate_(h, m)
               << " give a positive log-decay dt * A; expected dt >= 0 and A <= 0";
          bad("factored_decay dt", t, h, dt, hint.str().c_str());
        }
      }
    }
  }

  coefficient<T> lambda_, rate_, B_, C_, bonus_;
  semiseparable_options o_;
};

template <class T>
inline constexpr bool is_lower_v<Semiseparable<T>> = true;

/// S(lambda, B, C): lambda (L, H*N) or (L, H) log-decays, B and C (L, G*N).
template <class LA, class BE, class CE>
Semiseparable<detail::scalar_of<LA>> semiseparable(LA&& lambda, BE&& B, CE&& C, semiseparable_options o) {
  using T = detail::scalar_of<LA>;
  static_assert(std::is_same_v<T, detail::scalar_of<BE>> && std::is_same_v<T, detail::scalar_of<CE>>,
                "semiseparable: lambda, B and C must share a scalar type");
  return Semiseparable<T>(detail::make_coefficient(std::forward<LA>(lambda)),
                          detail::make_coefficient(std::forward<BE>(B)),
                          detail::make_coefficient(std::forward<CE>(C)), coefficient<T>{}, o);
}

/// S with a factored decay: lambda[t, h*N + m] = dt[t, h] * A[h, m]; B and C (L, G*N).
template <Scalar T, class BE, class CE>
Semiseparable<T> semiseparable(decay_factors<T> decay, BE&& B, CE&& C, semiseparable_options o) {
  static_assert(std::is_same_v<T, detail::scalar_of<BE>> && std::is_same_v<T, detail::scalar_of<CE>>,
                "semiseparable: the decay, B and C must share a scalar type");
  return Semiseparable<T>(std::move(decay), detail::make_coefficient(std::forward<BE>(B)),
                          detail::make_coefficient(std::forward<CE>(C)), coefficient<T>{}, o);
}

/// Strict-with-bonus form with a factored decay.
template <Scalar T, class BE, class CE, class UE>
Semiseparable<T> semiseparable(decay_factors<T> decay, BE&& B, CE&& C, UE&& bonus, semiseparable_options o) {
  static_assert(std::is_same_v<T, detail::scalar_of<BE>> && std::is_same_v<T, detail::scalar_of<CE>> &&
                    std::is_same_v<T, detail::scalar_of<UE>>,
                "semiseparable: the decay, B, C and bonus must share a scalar type");
  o.strict = true;
  return Semiseparable<T>(std::move(decay), detail::make_coefficient(std::forward<BE>(B)),
                          detail::make_coefficient(std::forward<CE>(C)),
                          detail::make_coefficient(std::forward<UE>(bonus)), o);
}

/// Strict-with-bonus form (RWKV): as above, with the decay product over k = s+1..t-1 for s < t and
/// the diagonal sum_m C_t[m] bonus[h, m] B_t[m]; bonus is (H, N).
template <class LA, class BE, class CE, class UE>
Semiseparable<detail::scalar_of<LA>> semiseparable(LA&& lambda, BE&& B, CE&& C, UE&& bonus,
                                                   semiseparable_options o) {
  using T = detail::scalar_of<LA>;
  static_assert(std::is_same_v<T, detail::scalar_of<BE>> && std::is_same_v<T, detail::scalar_of<CE>> &&
                    std::is_same_v<T, detail::scalar_of<UE>>,
                "semiseparable: lambda, B, C and bonus must share a scalar type");
  o.strict = true;
  return Semiseparable<T>(detail::make_coefficient(std::forward<LA>(lambda)),
                          detail::make_coefficient(std::forward<BE>(B)),
                          detail::make_coefficient(std::forward<CE>(C)),
                          detail::make_coefficient(std::forward<UE>(bonus)), o);
}

}  // namespace iattn
