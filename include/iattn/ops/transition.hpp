// iattn/ops/transition.hpp: Transition(lambda, a, b, q, k), the per-head matrix of a state whose
// transition is a diagonal plus a low-rank part (the delta-rule family: DeltaNet, Gated DeltaNet,
// Kimi Delta Attention, RWKV-7, DeltaProduct):
//   S_t = A_t S_{t-1} + k_t v_t^T,   o_t = S_t^T q_t          (state S: N x P per head)
//   H^c[t, s] = q_t^T A_t A_{t-1} ... A_{s+1} k_s   for s <= t (the empty product at s = t is I)
//   A_t = Diag(exp(lambda_t)) + sum_{r<R} b_{t,r} a_{t,r}^T
// for channel c in head h = c / P; the head's P value channels share the one L x L matrix.
//
//   q, k    (L, H*N)     query and (already scaled) key vectors, element [t, h*N + m]
//   lambda  (L, H)       one log-decay per head, or (L, H*N) one per key
//   a, b    (L, H*R*N)   the rank-R part, element [t, (h*R + r)*N + m]; R may be 0
// Channels D = H * P.   Causal: yes.
//
// Model factories (q and k the model's raw per-head query and key, (L, H*N); beta (L, H)):
//   delta_rule(q, k, beta)          A = I - beta k k^T,                 k~ = beta k
//   gated_delta_rule(q, k, beta, g) A = e^g (I - beta k k^T), g (L, H), k~ = beta k
//   kimi_delta_rule(q, k, beta, g)  A = (I - beta k k^T) Diag(e^g), g (L, H*N), k~ = beta k
// Each forms the coefficients above once: DeltaNet lambda = 0, b = -beta k, a = k; Gated DeltaNet
// lambda = g, b = -e^g beta k, a = k; KDA lambda = g, b = -beta k, a = e^g (.) k. No decay is ever
// divided by, and every exp argument is a log-decay (<= 0). RWKV-7 (A = Diag(w) + b a^T in the
// (K, V) orientation, its code's state transposed) and DeltaProduct (R Householder factors, their
// product expanded to rank R) use transition() directly.
//
// Numerics. The CPU evaluator takes each chunk of 32-64 tokens in the chunked (UT / WY) form
// (backend/cpu/transition_chunk.hpp): the chunk's transitions unroll into products of factors
// e^{lambda} <= 1 and one unit lower-triangular system (forward substitution; nothing is inverted
// but that system, no decay is divided by). A chunk the form cannot take exactly or stably (a reset
// lambda = -inf, a positive log-decay, a non-finite coefficient or value, rank R > 4, products that
// grow) runs the recurrence token by token, multiplying by A_t as Diag plus rank R, so a reset (with
// a zero low-rank part, e.g. g = -inf in the gated factories) gives exact zeros behind it; the
// transposed apply is always that recurrence, backwards. Rounding errors stay bounded
// (they do not grow with L) when every A_t is a non-expansion in the 2-norm: for the delta rule that
// holds when the keys are normalised (|k_t| = 1, as the models' L2-normalised keys are) and
// beta in [0, 2], where I - beta k k^T has eigenvalues 1 and 1 - beta in [-1, 1]; gates e^g <= 1
// only shrink it further. Non-normalised keys are not checked and not rescaled: the operator denotes
// the exact product as given, and when beta |k|^2 > 2 the factor 1 - beta |k|^2 has modulus above 1,
// so entries can grow geometrically with t - s and overflow to inf (then NaN) in long sequences,
// exactly as the model's own recurrence would. lambda > 0 (a growing state) throws std::domain_error
// unless options.allow_growth is set; NaN passes (non-finite values propagate).
#pragma once

#include "../core/coefficient.hpp"
#include "../core/error.hpp"
#include "../core/traits.hpp"

#include <cmath>
#include <cstddef>
#include <initializer_list>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace iattn {

struct transition_options {
  Index heads = 0;     ///< H (required)
  Index head_dim = 1;  ///< P value channels per head; D = H*P
  Index state = 0;     ///< N key dimension per head; 0 infers it from q and k
  Index rank = -1;     ///< R of the low-rank part; -1 infers it from a and b (the factories: 1)
  /// Accept positive log-decays (growing states). Off by default: a positive lambda (or g) throws
  /// std::domain_error naming the argument, the index and the value.
  bool allow_growth = false;
};

namespace detail {

/// The positive-log-decay check shared by the node and the factories: throws std::domain_error
/// naming where[row, col] = value. NaN passes; -inf is a reset.
template <Scalar T>
void require_log_decay(const coefficient<T>& m, const char* where, const char* arg, const char* what) {
  for (Index t = 0; t < m.rows(); ++t) {
    const T* row = m.row(t);
    for (Index j = 0; j < m.cols(); ++j)
      if (row[j] > T(0)) {
        std::ostringstream s;
        s << where << ": " << arg << "[" << t << ", " << j << "] = " << row[j] << " is a positive " << what
          << "; expected " << arg << " <= 0 (set options.allow_growth to accept growing states)";
        throw std::domain_error(s.str());
      }
  }
}

/// The rows of the majority of the given extents (one that more than half agree on), so that one
/// wrong argument is the one reported; the first extent when there is none.
inline Index majority_rows(std::initializer_list<Index> rows) {
  for (Index r : rows) {
    std::size_t votes = 0;
    for (Index s : rows) votes += (s == r);
    if (2 * votes > rows.size()) return r;
  }
  return *rows.begin();
}

/// N from options.state, else from q's and k's columns (H*N); a disagreement is settled by
/// `third` (another argument's N, or -1 when there is none), else both are named. The argument
/// whose shape then disagrees with N is reported by the caller's require_shape.
template <Scalar T>
Index infer_state(const char* where, const coefficient<T>& q, const coefficient<T>& k, Index H, Index state,
                  Index third) {
  if (state < 0) fail(where, "options.state is " + std::to_string(state) + " but must be >= 0 (0: inferred)");
  if (state > 0) return state;
  const Index qN = q.cols() % H == 0 ? q.cols() / H : -1, kN = k.cols() % H == 0 ? k.cols() / H : -1;
  Index N = -1;
  if (qN == kN) N = qN;
  else if (third > 0 && (qN == third || kN == third)) N = third;
  else if (qN > 0 && kN <= 0) N = qN;
  else if (kN > 0 && qN <= 0) N = kN;
  else
    fail(where, "q " + shape_string(q.rows(), q.cols()) + " and k " + shape_string(k.rows(), k.cols()) +
                    " disagree: both must be (L, H*N) with H = " + std::to_string(H) +
                    " (set options.state to say which N is meant)");
  if (N < 1)
    require_shape(false, where, "q", q.rows(), q.cols(), "(L, H*N) with H = " + std::to_string(H) + " and N >= 1");
  return N;
}

inline void check_heads(const char* where, const transition_options& o) {
  if (o.heads < 1) fail(where, "options.heads is " + std::to_string(o.heads) + " but must be >= 1 (H)");
  if (o.head_dim < 1) fail(where, "options.head_dim is " + std::to_string(o.head_dim) + " but must be >= 1 (P)");
}

}  // namespace detail

template <Scalar T>
class Transition : public op_base {
 public:
  using scalar = T;

  Transition(coefficient<T> lambda, coefficient<T> a, coefficient<T> b, coefficient<T> q, coefficient<T> k,
             transition_options o)
      : lambda_(std::move(lambda)), a_(std::move(a)), b_(std::move(b)), q_(std::move(q)), k_(std::move(k)), o_(o) {
    check_shapes();
    if (!o_.allow_growth) detail::require_log_decay(lambda_, "transition", "lambda", "log-decay");
  }

  Index length() const { return q_.rows(); }
  Index channels() const { return o_.heads * o_.head_dim; }
  Index heads() const { return o_.heads; }
  Index head_dim() const { return o_.head_dim; }
  Index state() const { return o_.state; }
  Index rank() const { return o_.rank; }
  /// True when lambda has one log-decay per (token, head, key): (L, H*N). False: (L, H).
  bool per_key() const { return lambda_.cols() != o_.heads; }

  IATTN_HOST_DEVICE Index head_of(Index c) const { return c / o_.head_dim; }
  /// lambda[t, h*N + m] (m ignored with one decay per head).
  IATTN_HOST_DEVICE T log_decay(Index t, Index h, Index m) const {
    return lambda_.cols() == o_.heads ? lambda_(t, h) : lambda_(t, h * o_.state + m);
  }

  const coefficient<T>& lambda() const { return lambda_; }  ///< (L, H) or (L, H*N)
  const coefficient<T>& a() const { return a_; }            ///< (L, H*R*N)
  const coefficient<T>& b() const { return b_; }            ///< (L, H*R*N)
  const coefficient<T>& q() const { return q_; }            ///< (L, H*N)
  const coefficient<T>& k() const { return k_; }            ///< (L, H*N)
  const transition_options& options() const { return o_; }

 private:
  /// L from the majority of q, k and lambda (and a, b when they carry columns), N from
  /// options.state or q and k, R from options.rank or a and b; then every argument against them.
  void check_shapes() {
    const char* where = "transition";
    using detail::fail;
    using std::to_string;
    detail::check_heads(where, o_);
    const Index H = o_.heads;
    const bool lowrank = a_.cols() > 0 || b_.cols() > 0;
    const Index L = lowrank ? detail::majority_rows({q_.rows(), k_.rows(), lambda_.rows(), a_.rows(), b_.rows()})
                            : detail::majority_rows({q_.rows(), k_.rows(), lambda_.rows()});
    const Index lN = (lambda_.cols() != H && lambda_.cols() % H == 0) ? lambda_.cols() / H : -1;
    const Index N = detail::infer_state(where, q_, k_, H, o_.state, lN);
    o_.state = N;
    Index R = o_.rank;
    if (R < -1) fail(where, "options.rank is " + to_string(R) + " but must be >= 0 (-1: inferred)");
    if (R == -1) {
      const Index HN = H * N;
      const Index aR = a_.cols() % HN == 0 ? a_.cols() / HN : -1, bR = b_.cols() % HN == 0 ? b_.cols() / HN : -1;
      if (aR == bR || bR < 0) R = aR;
      else if (aR < 0) R = bR;
      if (R < 0)
        fail(where, "a " + detail::shape_string(a_.rows(), a_.cols()) + " and b " +
                        detail::shape_string(b_.rows(), b_.cols()) + " disagree: both must be (L, H*R*N) with H*N = " +
                        to_string(HN) + " (set options.rank to say which R is meant)");
      o_.rank = R;
    }
    const std::string hn = "(L=" + to_string(L) + ", H*N=" + to_string(H * N) + ")";
    detail::require_shape(q_.rows() == L && q_.cols() == H * N, where, "q", q_.rows(), q_.cols(), hn);
    detail::require_shape(k_.rows() == L && k_.cols() == H * N, where, "k", k_.rows(), k_.cols(), hn);
    detail::require_shape(lambda_.rows() == L && (lambda_.cols() == H || lambda_.cols() == H * N), where, "lambda",
                          lambda_.rows(), lambda_.cols(),
                          "(L=" + to_string(L) + ", H=" + to_string(H) + ") for one decay per head or (L=" +
                              to_string(L) + ", H*N=" + to_string(H * N) + ") for one per key");
    const std::string hrn = "(L=" + to_string(L) + ", H*R*N=" + to_string(H * R * N) + ") with R = " + to_string(R) +
                            (R == 0 ? " (any rows with 0 columns)" : "");
    auto lowrank_ok = [&](const coefficient<T>& m) {
      return m.cols() == H * R * N && (m.rows() == L || (R == 0 && m.rows() == 0));
    };
    detail::require_shape(lowrank_ok(a_), where, "a", a_.rows(), a_.cols(), hrn);
    detail::require_shape(lowrank_ok(b_), where, "b", b_.rows(), b_.cols(), hrn);
  }

  coefficient<T> lambda_, a_, b_, q_, k_;
  transition_options o_;
};

template <class T>
inline constexpr bool is_lower_v<Transition<T>> = true;

/// The generic DPLR transition: A_t = Diag(e^lambda_t) + sum_r b_{t,r} a_{t,r}^T; see the header.
/// lambda (L, H) or (L, H*N); a, b (L, H*R*N); q, k (L, H*N) (k already scaled, e.g. by beta).
template <class LA, class AE, class BE, class QE, class KE>
Transition<detail::scalar_of<QE>> transition(LA&& lambda, AE&& a, BE&& b, QE&& q, KE&& k, transition_options o) {
  using T = detail::scalar_of<QE>;
  static_assert(std::is_same_v<T, detail::scalar_of<LA>> && std::is_same_v<T, detail::scalar_of<AE>> &&
                    std::is_same_v<T, detail::scalar_of<BE>> && std::is_same_v<T, detail::scalar_of<KE>>,
                "transition: lambda, a, b, q and k must share a scalar type");
  return Transition<T>(detail::make_coefficient(std::forward<LA>(lambda)), detail::make_coefficient(std::forward<AE>(a)),
                       detail::make_coefficient(std::forward<BE>(b)), detail::make_coefficient(std::forward<QE>(q)),
                       detail::make_coefficient(std::forward<KE>(k)), o);
}

namespace detail {

enum class delta_gate { none, head, key };

/// The model factories' shape checks (naming q, k, beta, g) and their coefficients; q and k are
/// the model's raw (L, H*N), beta (L, H), g (L, H) or (L, H*N) by the gate kind.
template <Scalar T>
Transition<T> delta_transition(const char* where, coefficient<T> q, const coefficient<T>& k, const coefficient<T>& beta,
                               const coefficient<T>& g, delta_gate gate, transition_options o) {
  using std::to_string;
  check_heads(where, o);
  if (o.rank != -1 && o.rank != 1)
    fail(where, "options.rank is " + to_string(o.rank) + " but the delta rule has rank 1 (leave it -1 or set 1)");
  const Index H = o.heads;
  const Index L = gate == delta_gate::none ? majority_rows({q.rows(), k.rows(), beta.rows()})
                                           : majority_rows({q.rows(), k.rows(), beta.rows(), g.rows()});
  const Index gN = gate == delta_gate::key && g.cols() % H == 0 ? g.cols() / H : -1;
  const Index N = infer_state(where, q, k, H, o.state, gN);
  const std::string hn = "(L=" + to_string(L) + ", H*N=" + to_string(H * N) + ")";
  const std::string lh = "(L=" + to_string(L) + ", H=" + to_string(H) + ")";
  require_shape(q.rows() == L && q.cols() == H * N, where, "q", q.rows(), q.cols(), hn);
  require_shape(k.rows() == L && k.cols() == H * N, where, "k", k.rows(), k.cols(), hn);
  require_shape(beta.rows() == L && beta.cols() == H, where, "beta", beta.rows(), beta.cols(), lh);
  if (gate != delta_gate::none) {
    const Index gc = gate == delta_gate::head ? H : H * N;
    require_shape(g.rows() == L && g.cols() == gc, where, "g", g.rows(), g.cols(), gate == delta_gate::head ? lh : hn);
    if (!o.allow_growth) require_log_decay(g, where, "g", "log-gate");
  }
  // k~ = beta k; lambda, b and a per the header comment. One pass, no division, exp of g <= 0 only.
  Matrix<T> kt(L, H * N), lam(L, gate == delta_gate::key ? H * N : H), bm(L, H * N);
  Matrix<T> am(gate == delta_gate::key ? L : 0, gate == delta_gate::key ? H * N : 0);
  for (Index t = 0; t < L; ++t)
    for (Index h = 0; h < H; ++h) {
      const T be = beta(t, h);
      const T eg = gate == delta_gate::head ? std::exp(g(t, h)) : T(1);
      if (gate != delta_gate::key) lam(t, h) = gate == delta_gate::head ? g(t, h) : T(0);
      for (Index m = 0; m < N; ++m) {
        const Index j = h * N + m;
        const T km = k(t, j);
        kt(t, j) = be * km;
        bm(t, j) = -(eg * be) * km;
        if (gate == delta_gate::key) {
          lam(t, j) = g(t, j);
          am(t, j) = std::exp(g(t, j)) * km;
        }
      }
    }
  o.state = N;
  o.rank = 1;
  // a = k itself (shared storage) unless the per-key gate folds into it.
  coefficient<T> ac = gate == delta_gate::key ? coefficient<T>(std::move(am)) : k;
  return Transition<T>(coefficient<T>(std::move(lam)), std::move(ac), coefficient<T>(std::move(bm)), std::move(q),
                       coefficient<T>(std::move(kt)), o);
}

}  // namespace detail

/// DeltaNet: S_t = (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T. q, k (L, H*N), beta (L, H).
template <class QE, class KE, class BE>
Transition<detail::scalar_of<QE>> delta_rule(QE&& q, KE&& k, BE&& beta, transition_options o) {
  using T = detail::scalar_of<QE>;
  static_assert(std::is_same_v<T, detail::scalar_of<KE>> && std::is_same_v<T, detail::scalar_of<BE>>,
                "delta_rule: q, k and beta must share a scalar type");
  return detail::delta_transition<T>("delta_rule", detail::make_coefficient(std::forward<QE>(q)),
                                     detail::make_coefficient(std::forward<KE>(k)),
                                     detail::make_coefficient(std::forward<BE>(beta)), coefficient<T>{},
                                     detail::delta_gate::none, o);
}

/// Gated DeltaNet: S_t = e^{g_t} (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T; g (L, H) <= 0.
template <class QE, class KE, class BE, class GE>
Transition<detail::scalar_of<QE>> gated_delta_rule(QE&& q, KE&& k, BE&& beta, GE&& g, transition_options o) {
  using T = detail::scalar_of<QE>;
  static_assert(std::is_same_v<T, detail::scalar_of<KE>> && std::is_same_v<T, detail::scalar_of<BE>> &&
                    std::is_same_v<T, detail::scalar_of<GE>>,
                "gated_delta_rule: q, k, beta and g must share a scalar type");
  return detail::delta_transition<T>("gated_delta_rule", detail::make_coefficient(std::forward<QE>(q)),
                                     detail::make_coefficient(std::forward<KE>(k)),
                                     detail::make_coefficient(std::forward<BE>(beta)),
                                     detail::make_coefficient(std::forward<GE>(g)), detail::delta_gate::head, o);
}

/// Kimi Delta Attention: S_t = (I - beta_t k_t k_t^T) Diag(e^{g_t}) S_{t-1} + beta_t k_t v_t^T;
/// g (L, H*N) <= 0, one gate per key.
template <class QE, class KE, class BE, class GE>
Transition<detail::scalar_of<QE>> kimi_delta_rule(QE&& q, KE&& k, BE&& beta, GE&& g, transition_options o) {
  using T = detail::scalar_of<QE>;
  static_assert(std::is_same_v<T, detail::scalar_of<KE>> && std::is_same_v<T, detail::scalar_of<BE>> &&
                    std::is_same_v<T, detail::scalar_of<GE>>,
                "kimi_delta_rule: q, k, beta and g must share a scalar type");
  return detail::delta_transition<T>("kimi_delta_rule", detail::make_coefficient(std::forward<QE>(q)),
                                     detail::make_coefficient(std::forward<KE>(k)),
                                     detail::make_coefficient(std::forward<BE>(beta)),
                                     detail::make_coefficient(std::forward<GE>(g)), detail::delta_gate::key, o);
}

}  // namespace iattn
