// libFuzzer target: expression evaluation on random shapes and coefficients. The input bytes choose
// an expression kind, L, D, N, K and the coefficients (bounded, with occasional resets); in double,
// apply(H, X) must equal materialize(H, c) X[:, c] for every channel, and row/col must equal the
// materialized rows and columns. A mismatch aborts (a crash for libFuzzer). First bytes 240-255
// choose the Transition family (the delta rules and a generic diagonal-plus-low-rank transition, at
// lengths up to 140: more than two chunks of the tiles and four of apply), whose apply (chunked or
// recurrent), materialize (chunk summaries by either form) and row/col (transposed scans) are
// independent paths; the other first bytes keep their kinds (byte % 8).
#include <iattn/iattn.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>

namespace {

using M = iattn::Matrix<double>;
using iattn::Index;

struct reader {
  const std::uint8_t* p;
  std::size_t n, i = 0;
  std::uint8_t byte() { return i < n ? p[i++] : 0; }
  Index pick(Index lo, Index hi) { return lo + Index(byte()) % (hi - lo + 1); }
  /// A value in [lo, hi]; byte 255 gives `special` (a reset or an exact zero) when asked, hi
  /// otherwise (never past hi: a log-decay drawn from [lo, 0] must not come out positive).
  double value(double lo, double hi, double special = std::numeric_limits<double>::quiet_NaN()) {
    const std::uint8_t b = byte();
    if (b == 255 && !std::isnan(special)) return special;
    return lo + (hi - lo) * double(std::min<int>(b, 254)) / 254.0;
  }
  M matrix(Index r, Index c, double lo, double hi, double special = std::numeric_limits<double>::quiet_NaN()) {
    M m(r, c);
    for (Index k = 0; k < m.size(); ++k) m.data()[k] = value(lo, hi, special);
    return m;
  }
};

template <class H>
void check(const H& h, const M& x) {
  const Index L = x.rows(), D = x.cols();
  const M y = iattn::apply(h, x);
  if (y.rows() != L || y.cols() != D) std::abort();
  if (L == 0) {
    if (iattn::materialize(h, 0, 0).size() != 0) std::abort();
    return;
  }
  const double scale = 1.0 + y.cwiseAbs().maxCoeff() + x.cwiseAbs().maxCoeff();
  for (Index c = 0; c < D; ++c) {
    const M m = iattn::materialize(h, c, L);
    const M yc = m * x.col(c);
    if (!((yc - y.col(c)).cwiseAbs().maxCoeff() <= 1e-8 * scale * (1.0 + m.cwiseAbs().maxCoeff()))) std::abort();
  }
  const Index t = L / 2;
  const M r = iattn::row(h, t, L), co = iattn::col(h, t, L);
  for (Index c = 0; c < D; ++c) {
    const M m = iattn::materialize(h, c, L);
    if (!((r.row(c) - m.row(t)).cwiseAbs().maxCoeff() <= 1e-9 * (1.0 + m.cwiseAbs().maxCoeff()))) std::abort();
    if (!((co.row(c).transpose() - m.col(t)).cwiseAbs().maxCoeff() <= 1e-9 * (1.0 + m.cwiseAbs().maxCoeff()))) std::abort();
  }
}

/// Rows of k scaled to unit norm per (token, head) (zero rows stay zero): the models' L2-normalised
/// keys, so that every delta-rule transition is a non-expansion.
M unit_keys(M k, Index H, Index N) {
  for (Index t = 0; t < k.rows(); ++t)
    for (Index h = 0; h < H; ++h) {
      const double n = k.row(t).segment(h * N, N).norm();
      if (n > 0) k.row(t).segment(h * N, N) /= n;
    }
  return k;
}

void transitions(reader& in, int variant) {
  const Index L = in.pick(0, 140), H = in.pick(1, 2), P = in.pick(1, 3), N = in.pick(1, 9), K = in.pick(1, 4);
  const Index D = H * P;
  const double ninf = -std::numeric_limits<double>::infinity();
  const iattn::transition_options o{.heads = H, .head_dim = P, .state = 0, .rank = -1};
  const M x = in.matrix(L, D, -2, 2);
  const M d = in.matrix(L, D, -2, 2, 0.0), w = in.matrix(K, D, -1, 1);
  const M q = in.matrix(L, H * N, -2, 2), k = unit_keys(in.matrix(L, H * N, -2, 2), H, N);
  const bool per_key = in.byte() % 2;
  if (variant == 0) {  // Gated DeltaNet (a gate per head) or Kimi (per key), between diagonals and a convolution
    const M beta = in.matrix(L, H, 0, 2), g = in.matrix(L, per_key ? H * N : H, -3, 0, ninf);
    if (per_key) check(iattn::diagonal(d) * iattn::kimi_delta_rule(q, k, beta, g, o) * iattn::diagonal(M(d.cwiseAbs())) * iattn::causal_conv(w), x);
    else check(iattn::diagonal(d) * iattn::gated_delta_rule(q, k, beta, g, o) * iattn::diagonal(M(d.cwiseAbs())) * iattn::causal_conv(w), x);
    return;
  }
  // A_t = Diag(e^lambda_t) + sum_r b_r a_r^T, rank 1 to 3, lambda <= -0.05 and |a|, |b| small enough
  // that every A_t is a contraction; flipped or not, plus a diagonal.
  const Index R = in.pick(1, 3);
  const double s = 0.12 / std::sqrt(double(R * N));
  const M lam = in.matrix(L, per_key ? H * N : H, -2, -0.05, ninf);
  const M a = in.matrix(L, H * R * N, -s, s), b = in.matrix(L, H * R * N, -s, s);
  auto T = iattn::transition(lam, a, b, q, k, o);
  if (in.byte() % 2) check(iattn::flip(std::move(T)) + iattn::diagonal(d), x);
  else check(std::move(T) + iattn::diagonal(d), x);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  reader in{data, size};
  const std::uint8_t first = in.byte();
  if (first >= 240) {
    transitions(in, first % 2);
    return 0;
  }
  const int kind = first % 8;
  const Index L = in.pick(0, 40), H = in.pick(1, 3), P = in.pick(1, 2), N = in.pick(1, 4), K = in.pick(1, 6);
  const Index D = H * P;
  const double ninf = -std::numeric_limits<double>::infinity();
  const M x = in.matrix(L, D, -2, 2);
  const M d = in.matrix(L, D, -2, 2, 0.0), w = in.matrix(K, D, -1, 1);
  // Every matrix read into a name of its own, in the order of the arguments: the order in which a
  // call's arguments are evaluated is unspecified (clang left to right, GCC on x86-64 right to
  // left), and an input found by the clang fuzzer must build the same expression in the replay test
  // that CTest compiles with GCC. Left to right keeps the meaning the saved inputs had under clang.
  switch (kind) {
    case 0: {
      const M lam = in.matrix(L, H * N, -3, 0, ninf), B = in.matrix(L, N, -2, 2), C = in.matrix(L, N, -2, 2);
      check(iattn::semiseparable(lam, B, C, {.heads = H, .head_dim = P}), x);
      break;
    }
    case 1: {
      const M lam = in.matrix(L, H, -3, 0, ninf), B = in.matrix(L, N, -2, 2), C = in.matrix(L, N, -2, 2);
      check(iattn::diagonal(d) * iattn::semiseparable(lam, B, C, {.heads = H, .head_dim = P}) * iattn::diagonal(M(d.cwiseAbs())) *
                iattn::causal_conv(w),
            x);
      break;
    }
    case 2: {
      const M dt = in.matrix(L, H, 0, 2), A = in.matrix(H, N, -3, 0), B = in.matrix(L, N, -2, 2), C = in.matrix(L, N, -2, 2), bonus = in.matrix(H, N, -1, 1);
      check(iattn::semiseparable(iattn::factored_decay(dt, A), B, C, bonus, {.heads = H, .head_dim = P}), x);
      break;
    }
    case 3: {
      const M a = in.matrix(L, D, -1, 1, 0.0), b = in.matrix(L, D, -2, 2);
      check(iattn::linear_recurrence(a, b) * iattn::causal_conv(w), x);
      break;
    }
    case 4: {
      const M wd = in.matrix(L, D, -3, 0, ninf), k = in.matrix(L, D, -30, 30), u = in.matrix(1, D, -1, 1);
      check(iattn::wkv(wd, k, u), x);
      break;
    }
    case 5: {
      const M a = in.matrix(L, D, 0, 1), b = in.matrix(L, D, -2, 2);
      check(iattn::flip(iattn::linear_recurrence(a, b)) + 2.0 * iattn::diagonal(d), x);
      break;
    }
    case 6: {
      const M lam = in.matrix(L, H, -2, 0), B = in.matrix(L, N, 0.1, 2), C = in.matrix(L, N, 0.1, 2);
      check(iattn::row_normalize(iattn::semiseparable(lam, B, C, {.heads = H, .head_dim = P})), x);
      break;
    }
    default: {
      const M q = in.matrix(L, H * N, -3, 3), k = in.matrix(L, H * N, -3, 3);
      check(iattn::softmax_attention(q, k, {.heads = H, .head_dim = P}) * iattn::causal_conv(w), x);
      break;
    }
  }
  return 0;
}
