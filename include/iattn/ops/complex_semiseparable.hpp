// iattn/ops/complex_semiseparable.hpp: ComplexSemiseparable(rho, theta, B, C), the semiseparable
// matrix of a diagonal linear RNN with complex per-state decays and real input and output
// (LRU, S4D run as a recurrence, Mamba-3's complex state):
//   H^c[t, s] = Re sum_m C_t[g, m] * exp(sum_{k=s+1..t} lambda_k[h, m]) * B_s[g, m]     (s <= t; 0 above)
//   lambda = rho + i theta,  B = B_re + i B_im,  C = C_re + i C_im
// for channel c in head h = c / P, whose B/C group is g = h / (H/G). As a recurrence, per channel
// and state, h_t[m] = e^{lambda_t[m]} h_{t-1}[m] + B_t[m] x_t (complex), y_t = Re sum_m C_t[m] h_t[m].
//
//   log_mag  rho    (L, H*N) or (1, H*N)   log |a| <= 0; -inf is a reset (decay exactly 0)
//   angle    theta  (L, H*N) or (1, H*N)   arg a, radians, any real value
//   B_re, B_im      (L, G*N)               input projection of the state, real and imaginary parts
//   C_re, C_im      (L, G*N)               output projection of the state
// Channels D = H * P.   Causal: yes (lower-triangular).
//
// Token-independent decays: rho and theta may each be given once for all tokens as a single row
// (1, H*N) (S4D and the LRU have a fixed eigenvalue per state); a (1, H*N) row is read for every
// token. Each of the two is checked and read on its own, so a fixed magnitude with a
// data-dependent angle (or the converse) is accepted too. When L = 1 the two forms coincide.
//
// The public API holds only real row-major matrices (never std::complex), so the CUDA backend can
// share the coefficient accessors.
//
// Numerics (docs/design.md section 3). Log-magnitudes are only summed over a range and
// exponentiated, never differenced, so rho = -inf is exact and no exp argument is positive when
// rho <= 0 (a positive rho throws std::domain_error unless options.allow_growth; NaN passes and
// propagates). Angles are accumulated relative to a block start, in double, and block totals are
// reduced mod 2 pi, so cos and sin of a long cumulative angle keep full accuracy in fp32 at any L.
// The apply reduces each token's own angle by a three-part Cody-Waite split of pi/2 (exact for
// |theta| <= 4096 in float, 2^20 in double; larger angles take std::cos / std::sin in double).
#pragma once

#include "../core/coefficient.hpp"
#include "../core/error.hpp"
#include "../core/traits.hpp"

#include <initializer_list>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace iattn {

struct complex_semiseparable_options {
  Index heads = 0;     ///< H (required): rho and theta have H*N columns
  Index head_dim = 1;  ///< P channels per head; D = H*P (LRU / S4D: H = D, P = 1)
  Index groups = 1;    ///< G groups of B/C; must divide H
  Index state = 0;     ///< N (complex states per head); 0 infers N from the arguments
  /// Accept positive log-magnitudes (growing states). Off by default: a positive rho throws
  /// std::domain_error naming its index and value, since exp of a sum of them overflows.
  bool allow_growth = false;
};

template <Scalar T>
class ComplexSemiseparable : public op_base {
 public:
  using scalar = T;

  ComplexSemiseparable(coefficient<T> log_mag, coefficient<T> angle, coefficient<T> B_re, coefficient<T> B_im,
                       coefficient<T> C_re, coefficient<T> C_im, complex_semiseparable_options o)
      : rho_(std::move(log_mag)), theta_(std::move(angle)), Br_(std::move(B_re)), Bi_(std::move(B_im)),
        Cr_(std::move(C_re)), Ci_(std::move(C_im)), o_(o) {
    check_shapes();
    if (!o_.allow_growth) check_decay();
  }

  Index length() const { return Br_.rows(); }
  Index channels() const { return o_.heads * o_.head_dim; }
  Index heads() const { return o_.heads; }
  Index head_dim() const { return o_.head_dim; }
  Index groups() const { return o_.groups; }
  Index state() const { return o_.state; }
  /// True when rho (theta) is one row (1, H*N) read for every token.
  bool constant_log_mag() const { return rho_.rows() == 1; }
  bool constant_angle() const { return theta_.rows() == 1; }

  IATTN_HOST_DEVICE Index head_of(Index c) const { return c / o_.head_dim; }
  IATTN_HOST_DEVICE Index group_of_head(Index h) const { return h / (o_.heads / o_.groups); }

  /// rho (L, H*N) or (1, H*N).
  const coefficient<T>& log_mag() const { return rho_; }
  /// theta (L, H*N) or (1, H*N).
  const coefficient<T>& angle() const { return theta_; }
  /// rho[t, h*N + m], whatever the storage.
  IATTN_HOST_DEVICE T log_mag_at(Index t, Index h, Index m) const {
    return rho_(rho_.rows() == 1 ? 0 : t, h * o_.state + m);
  }
  /// theta[t, h*N + m], whatever the storage.
  IATTN_HOST_DEVICE T angle_at(Index t, Index h, Index m) const {
    return theta_(theta_.rows() == 1 ? 0 : t, h * o_.state + m);
  }
  const coefficient<T>& B_re() const { return Br_; }
  const coefficient<T>& B_im() const { return Bi_; }
  const coefficient<T>& C_re() const { return Cr_; }
  const coefficient<T>& C_im() const { return Ci_; }
  const complex_semiseparable_options& options() const { return o_; }

 private:
  /// The value most of the candidates agree on (the first of a tie); candidates < 0 do not vote.
  static Index majority(std::initializer_list<Index> v) {
    Index best = -1, best_n = 0;
    for (Index a : v) {
      if (a < 0) continue;
      Index k = 0;
      for (Index b : v) k += (a == b);
      if (k > best_n) best = a, best_n = k;
    }
    return best;
  }

  /// Shape checks that name the argument that is wrong: L is the row count most of B_re, B_im,
  /// C_re, C_im (and a per-token rho, theta) agree on, N the state count most of the six arguments
  /// agree on (or options.state), so one bad argument is the one reported.
  void check_shapes() {
    const char* where = "complex_semiseparable";
    using detail::fail;
    using std::to_string;
    if (o_.heads < 1) fail(where, "options.heads is " + to_string(o_.heads) + " but must be >= 1 (H)");
    if (o_.head_dim < 1) fail(where, "options.head_dim is " + to_string(o_.head_dim) + " but must be >= 1 (P)");
    if (o_.groups < 1 || o_.heads % o_.groups != 0)
      fail(where, "options.groups is " + to_string(o_.groups) + " but must divide heads = " + to_string(o_.heads));
    if (o_.state < 0) fail(where, "options.state is " + to_string(o_.state) + " but must be >= 0 (0: inferred)");
    const Index H = o_.heads, G = o_.groups;
    // A one-row rho or theta says nothing about L unless the others have one row too.
    auto rows_vote = [](const coefficient<T>& m) { return m.rows() == 1 ? Index(-1) : m.rows(); };
    Index L = majority({Br_.rows(), Bi_.rows(), Cr_.rows(), Ci_.rows(), rows_vote(rho_), rows_vote(theta_)});
    if (L < 0) L = 1;
    Index N = o_.state;
    if (N == 0) {
      auto per = [](const coefficient<T>& m, Index k) { return m.cols() % k == 0 ? m.cols() / k : Index(-1); };
      N = majority({per(Br_, G), per(Bi_, G), per(Cr_, G), per(Ci_, G), per(rho_, H), per(theta_, H)});
      if (N <= 0)
        fail(where, "cannot infer N: B_re " + detail::shape_string(Br_.rows(), Br_.cols()) + ", C_re " +
                        detail::shape_string(Cr_.rows(), Cr_.cols()) + " and log_mag " +
                        detail::shape_string(rho_.rows(), rho_.cols()) + " must be (L, G*N), (L, G*N) and (L, H*N) with G = " +
                        to_string(G) + ", H = " + to_string(H) + " and N >= 1 (or set options.state)");
      o_.state = N;
    }
    const std::string gn = "(L=" + to_string(L) + ", G*N=" + to_string(G * N) + ")";
    detail::require_shape(Br_.rows() == L && Br_.cols() == G * N, where, "B_re", Br_.rows(), Br_.cols(), gn);
    detail::require_shape(Bi_.rows() == L && Bi_.cols() == G * N, where, "B_im", Bi_.rows(), Bi_.cols(), gn);
    detail::require_shape(Cr_.rows() == L && Cr_.cols() == G * N, where, "C_re", Cr_.rows(), Cr_.cols(), gn);
    detail::require_shape(Ci_.rows() == L && Ci_.cols() == G * N, where, "C_im", Ci_.rows(), Ci_.cols(), gn);
    const std::string hn = "(L=" + to_string(L) + ", H*N=" + to_string(H * N) + ") or (1, H*N=" + to_string(H * N) +
                           ") for a decay fixed over tokens";
    detail::require_shape((rho_.rows() == L || rho_.rows() == 1) && rho_.cols() == H * N, where, "log_mag",
                          rho_.rows(), rho_.cols(), hn);
    detail::require_shape((theta_.rows() == L || theta_.rows() == 1) && theta_.cols() == H * N, where, "angle",
                          theta_.rows(), theta_.cols(), hn);
  }

  /// rho <= 0, the library's invariant (exp of a sum of positive values overflows); NaN passes.
  void check_decay() const {
    for (Index t = 0; t < rho_.rows(); ++t) {
      const T* row = rho_.row(t);
      for (Index j = 0; j < rho_.cols(); ++j)
        if (row[j] > T(0)) {
          std::ostringstream s;
          s << "complex_semiseparable: log_mag[" << t << ", " << j << "] = " << row[j]
            << " is a positive log-magnitude; expected log_mag <= 0 (|a| <= 1; set options.allow_growth to accept "
               "growing states)";
          throw std::domain_error(s.str());
        }
    }
  }

  coefficient<T> rho_, theta_, Br_, Bi_, Cr_, Ci_;
  complex_semiseparable_options o_;
};

template <class T>
inline constexpr bool is_lower_v<ComplexSemiseparable<T>> = true;

/// S(rho + i theta, B_re + i B_im, C_re + i C_im): log_mag and angle (L, H*N) or (1, H*N); B_re,
/// B_im, C_re, C_im (L, G*N). Owns its operands (an lvalue copied once, an rvalue moved).
template <class RE, class AE, class BRE, class BIE, class CRE, class CIE>
ComplexSemiseparable<detail::scalar_of<RE>> complex_semiseparable(RE&& log_mag, AE&& angle, BRE&& B_re, BIE&& B_im,
                                                                  CRE&& C_re, CIE&& C_im,
                                                                  complex_semiseparable_options o) {
  using T = detail::scalar_of<RE>;
  static_assert(std::is_same_v<T, detail::scalar_of<AE>> && std::is_same_v<T, detail::scalar_of<BRE>> &&
                    std::is_same_v<T, detail::scalar_of<BIE>> && std::is_same_v<T, detail::scalar_of<CRE>> &&
                    std::is_same_v<T, detail::scalar_of<CIE>>,
                "complex_semiseparable: log_mag, angle, B_re, B_im, C_re and C_im must share a scalar type");
  return ComplexSemiseparable<T>(
      detail::make_coefficient(std::forward<RE>(log_mag)), detail::make_coefficient(std::forward<AE>(angle)),
      detail::make_coefficient(std::forward<BRE>(B_re)), detail::make_coefficient(std::forward<BIE>(B_im)),
      detail::make_coefficient(std::forward<CRE>(C_re)), detail::make_coefficient(std::forward<CIE>(C_im)), o);
}

}  // namespace iattn
