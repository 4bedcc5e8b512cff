// libFuzzer target: expression evaluation on random shapes and coefficients. The input bytes choose
// an expression kind, L, D, N, K and the coefficients (bounded, with occasional resets); in double,
// apply(H, X) must equal materialize(H, c) X[:, c] for every channel, and row/col must equal the
// materialized rows and columns. A mismatch aborts (a crash for libFuzzer). First bytes 240-255
// choose the Transition family (the delta rules and a generic diagonal-plus-low-rank transition, at
// lengths up to 140: more than two chunks of the tiles and four of apply), whose apply (chunked or
// recurrent), materialize (chunk summaries by either form) and row/col (transposed scans) are
// independent paths; first bytes 224-239 Mamba-like terms at lengths up to 200; the other first
// bytes keep their kinds (byte % 8), and a byte after the Mamba-like terms may add heads of 64 and
// more channels (the chunked scan's shape). Every expression's whole-matrix paths (materialize_all, the
// channel, abs, range and head means) are checked against its per-channel matrices too.
#include <iattn/iattn.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <tuple>
#include <type_traits>
#include <vector>

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

/// a and b agree entry by entry within tol (1 + the largest |entry| of b).
bool close(const M& a, const M& b, double tol) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         (a.size() == 0 || (a - b).cwiseAbs().maxCoeff() <= tol * (1.0 + b.cwiseAbs().maxCoeff()));
}

/// The mean over channels [c0, c1) of the per-channel matrices ms, or of their absolute values.
M mean_of(const std::vector<M>& ms, Index c0, Index c1, bool abs) {
  M m = M::Zero(ms[0].rows(), ms[0].cols());
  for (Index c = c0; c < c1; ++c) m += (abs ? M(ms[std::size_t(c)].cwiseAbs()) : ms[std::size_t(c)]) / double(c1 - c0);
  return m;
}

/// The whole-matrix paths against the per-channel matrices ms (materialize(h, c)): every channel at
/// once, the channel mean and the mean of |H^c|, the mean over a channel range picked by the input
/// (read after everything else, so older inputs keep their meaning), and every head's mean where
/// the expression has heads of `P` channels. These paths have structured kernels of their own
/// (all_channels.hpp, mean.hpp, head_mean.hpp, wkv_mean.hpp).
template <class H>
void check_whole(const H& h, const std::vector<M>& ms, reader& in, Index P) {
  const Index D = Index(ms.size()), L = ms[0].rows();
  const double tol = 1e-9;
  const iattn::Tensor3<double> all = iattn::materialize_all(h, L);
  if (all.dims[0] != D || all.dims[1] != L || all.dims[2] != L) std::abort();
  for (Index c = 0; c < D; ++c)
    if (!close(M(all.slice(c)), ms[std::size_t(c)], tol)) std::abort();
  if (!close(iattn::materialize_mean(h, L), mean_of(ms, 0, D, false), tol)) std::abort();
  if (!close(iattn::materialize_mean(h, {.abs = true}, L), mean_of(ms, 0, D, true), tol)) std::abort();
  const Index c0 = Index(in.byte()) % D, c1 = c0 + 1 + Index(in.byte()) % (D - c0);
  const bool abs = in.byte() % 2;
  if (!close(iattn::materialize_mean(h, {.abs = abs, .channels = iattn::range{c0, c1}}, L), mean_of(ms, c0, c1, abs), tol))
    std::abort();
  if (P <= 0) return;
  const iattn::Tensor3<double> heads = iattn::materialize_head_means(h, {.abs = abs}, L);
  if (heads.dims[0] != D / P) std::abort();
  for (Index g = 0; g < D / P; ++g)
    if (!close(M(heads.slice(g)), mean_of(ms, g * P, (g + 1) * P, abs), tol)) std::abort();
}

/// P: the channels per head of h's heads (0: none), for check_whole's head means. Returns the
/// per-channel matrices (none when L = 0).
template <class H>
std::vector<M> check(const H& h, const M& x, reader& in, Index P = 0) {
  const Index L = x.rows(), D = x.cols();
  const M y = iattn::apply(h, x);
  if (y.rows() != L || y.cols() != D) std::abort();
  if (L == 0) {
    if (iattn::materialize(h, 0, 0).size() != 0) std::abort();
    return {};
  }
  std::vector<M> ms;
  for (Index c = 0; c < D; ++c) ms.push_back(iattn::materialize(h, c, L));
  const double scale = 1.0 + y.cwiseAbs().maxCoeff() + x.cwiseAbs().maxCoeff();
  for (Index c = 0; c < D; ++c) {
    const M& m = ms[std::size_t(c)];
    const M yc = m * x.col(c);
    if (!((yc - y.col(c)).cwiseAbs().maxCoeff() <= 1e-8 * scale * (1.0 + m.cwiseAbs().maxCoeff()))) std::abort();
  }
  const Index t = L / 2;
  const M r = iattn::row(h, t, L), co = iattn::col(h, t, L);
  for (Index c = 0; c < D; ++c) {
    const M& m = ms[std::size_t(c)];
    if (!((r.row(c) - m.row(t)).cwiseAbs().maxCoeff() <= 1e-9 * (1.0 + m.cwiseAbs().maxCoeff()))) std::abort();
    if (!((co.row(c).transpose() - m.col(t)).cwiseAbs().maxCoeff() <= 1e-9 * (1.0 + m.cwiseAbs().maxCoeff()))) std::abort();
  }
  check_whole(h, ms, in, P);
  return ms;
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
    if (per_key) check(iattn::diagonal(d) * iattn::kimi_delta_rule(q, k, beta, g, o) * iattn::diagonal(M(d.cwiseAbs())) * iattn::causal_conv(w), x, in, P);
    else check(iattn::diagonal(d) * iattn::gated_delta_rule(q, k, beta, g, o) * iattn::diagonal(M(d.cwiseAbs())) * iattn::causal_conv(w), x, in, P);
    return;
  }
  // A_t = Diag(e^lambda_t) + sum_r b_r a_r^T, rank 1 to 3, lambda <= -0.05 and |a|, |b| small enough
  // that every A_t is a contraction; flipped or not, plus a diagonal.
  const Index R = in.pick(1, 3);
  const double s = 0.12 / std::sqrt(double(R * N));
  const M lam = in.matrix(L, per_key ? H * N : H, -2, -0.05, ninf);
  const M a = in.matrix(L, H * R * N, -s, s), b = in.matrix(L, H * R * N, -s, s);
  auto T = iattn::transition(lam, a, b, q, k, o);
  if (in.byte() % 2) check(iattn::flip(std::move(T)) + iattn::diagonal(d), x, in, P);
  else check(std::move(T) + iattn::diagonal(d), x, in, P);
}

/// The float whole-matrix paths (their own kernels: float packs, AVX2's transposed referrals, the
/// one-pack diagonal blocks of AVX-512) against the per-channel matrices ms of the same expression in
/// double: every channel, the channel mean and the mean of |H^c|, within float rounding of the
/// entries' scale.
template <class HF>
void check_float(const HF& hf, const std::vector<M>& ms) {
  if (ms.empty()) return;  // L = 0
  const Index D = Index(ms.size()), L = ms[0].rows();
  const double tol = 2e-4;
  const iattn::Tensor3<float> all = iattn::materialize_all(hf, L);
  for (Index c = 0; c < D; ++c)
    if (!close(iattn::Matrix<float>(all.slice(c)).cast<double>(), ms[std::size_t(c)], tol)) std::abort();
  if (!close(iattn::Matrix<float>(iattn::materialize_mean(hf, L)).cast<double>(), mean_of(ms, 0, D, false), tol))
    std::abort();
  if (!close(iattn::Matrix<float>(iattn::materialize_mean(hf, {.abs = true}, L)).cast<double>(), mean_of(ms, 0, D, true), tol))
    std::abort();
}

/// First bytes 224-239: Mamba-like terms at lengths up to 200, so that the whole-matrix paths run
/// past one block of their own (the channel mean's 64-token blocks and row groups, every channel's
/// 16-row panels, several of them flipped): diag * S * diag * conv with a factored decay (Mamba-1),
/// its sum with a flipped twin (Vision Mamba), or one decay per head (Mamba-2) or per state; in
/// double (check) and in float (check_float). A last byte may add Mamba's skip D to the chain.
void long_cores(reader& in, int variant) {
  const Index L = in.pick(0, 200), H = in.pick(1, 2), P = in.pick(1, 2), N = in.pick(1, 8), K = in.pick(1, 5);
  const Index D = H * P;
  const double ninf = -std::numeric_limits<double>::infinity();
  const iattn::semiseparable_options o{.heads = H, .head_dim = P};
  const M x = in.matrix(L, D, -2, 2);
  const M post = in.matrix(L, D, -2, 2, 0.0), pre = in.matrix(L, D, 0, 2), w = in.matrix(K, D, -1, 1);
  // Two terms' B, C and decays (the second one used by the sum only): one per head (variant 2), one
  // per state (3), or factored dt A (0 and 1).
  struct core {
    M B, C, lam, dt, A;
  };
  core k[2];
  for (auto& t : k) {
    t.B = in.matrix(L, N, -2, 2);
    t.C = in.matrix(L, N, -2, 2);
    if (variant == 2) t.lam = in.matrix(L, H, -1, 0, ninf);
    else if (variant == 3) t.lam = in.matrix(L, H * N, -1, 0, ninf);
    else {
      t.dt = in.matrix(L, H, 0, 1);
      t.A = in.matrix(H, N, -2, 0);
    }
  }
  auto core_of = [&]<class T>(const core& t, std::type_identity<T>) {
    return variant >= 2 ? iattn::semiseparable(t.lam.cast<T>().eval(), t.B.cast<T>().eval(), t.C.cast<T>().eval(), o)
                        : iattn::semiseparable(iattn::factored_decay(t.dt.cast<T>().eval(), t.A.cast<T>().eval()),
                                               t.B.cast<T>().eval(), t.C.cast<T>().eval(), o);
  };
  auto term = [&]<class T>(const core& t, std::type_identity<T> ty) {
    return iattn::diagonal(post.cast<T>().eval()) * core_of(t, ty) * iattn::diagonal(pre.cast<T>().eval()) *
           iattn::causal_conv(w.cast<T>().eval());
  };
  auto run = [&](auto build) {
    const std::vector<M> ms = check(build(std::type_identity<double>{}), x, in, P);
    check_float(build(std::type_identity<float>{}), ms);
  };
  if (variant == 1)
    run([&](auto ty) { return 0.5 * (term(k[0], ty) + iattn::flip(term(k[1], ty))); });
  else
    run([&](auto ty) { return term(k[0], ty); });
  // Read after everything else, so the saved inputs keep what they checked (one that ends before
  // it reads a 0 byte: no check; one with bytes left may gain this check): Mamba's skip D,
  // diag(post) (S diag(dt) + diag(skip)) diag(pre) conv, the sum's diagonal added inside the scan's
  // pass with the skip reading the row without dt (row_ops::skip_pre).
  if (in.byte() % 2 == 0) return;
  const M dt = in.matrix(L, D, 0, 2), skip = in.matrix(in.byte() % 2 ? L : 1, D, -2, 2);
  run([&]<class T>(std::type_identity<T> ty) {
    return iattn::diagonal(post.cast<T>().eval()) *
           (core_of(k[0], ty) * iattn::diagonal(dt.cast<T>().eval()) + iattn::diagonal(skip.cast<T>().eval())) *
           iattn::diagonal(pre.cast<T>().eval()) * iattn::causal_conv(w.cast<T>().eval());
  });
}

/// After long_cores, a byte may add Mamba-2's own shape: heads of at least ssd_min_head_dim channels
/// and ssd_min_state states with one decay per head, the one shape whose apply takes the chunked
/// (SSD) form (semiseparable.hpp's run_chunked); the heads above have at most two channels. The
/// shapes, the resets, the skip and the terms come from bytes; the bulk values (x, B, C, the
/// diagonals: thousands of entries) from a generator seeded by two bytes, so that a short input
/// still draws them from their whole ranges. Only apply is checked (double and float), against
/// the materialized matrices of a few channels (each head's first and last): the full check of
/// every channel's matrix and mean takes 20-40 s an input at these sizes under the fuzzer's
/// instrumentation, past scripts/fuzz.sh's 10 s timeout.
void wide_heads(reader& in) {
  const Index L = in.pick(1, 80), H = in.pick(1, 2), P = 64 + in.pick(0, 1), N = 64 + in.pick(0, 2), K = in.pick(1, 4);
  const Index D = H * P;
  const std::uint32_t lo = in.byte(), hi = in.byte();  // named: the order of reads is fixed
  std::mt19937 gen(lo | hi << 8);
  auto draw = [&](Index r, Index c, double lo, double hi) {
    std::uniform_real_distribution<double> u(lo, hi);
    M m(r, c);
    for (Index k = 0; k < m.size(); ++k) m.data()[k] = u(gen);
    return m;
  };
  M lam = draw(L, H, -1, 0);
  for (Index r = in.pick(0, 3); r > 0; --r) {
    const Index t = in.pick(0, L - 1), h = in.pick(0, H - 1);
    lam(t, h) = -std::numeric_limits<double>::infinity();
  }
  const M B = draw(L, N, -1, 1), C = draw(L, N, -1, 1), x = draw(L, D, -2, 2), post = draw(L, D, -2, 2), dt = draw(L, D, 0, 2),
          pre = draw(L, D, 0, 2), w = draw(K, D, -1, 1);
  const M skip = draw(in.byte() % 2 ? L : 1, D, -2, 2);
  const int terms = in.byte() % 3;
  auto build = [&]<class T>(std::type_identity<T>) {
    auto d = [](const M& m) { return iattn::diagonal(m.cast<T>().eval()); };
    auto S = iattn::semiseparable(lam.cast<T>().eval(), B.cast<T>().eval(), C.cast<T>().eval(), {.heads = H, .head_dim = P});
    if (!iattn::cpu_detail::takes_chunked_apply(S)) std::abort();  // the shape this check is for
    auto chain = d(post) * (S * d(dt) + d(skip)) * d(pre) * iattn::causal_conv(w.cast<T>().eval());
    // 0: the core times the convolution; 1: Mamba-2's chain with the skip D (its sum's diagonal
    // inside the chunked scan's pass); 2: that chain's sum with its flip (a bidirectional Mamba-2).
    return std::tuple{S * iattn::causal_conv(w.cast<T>().eval()), chain, 0.5 * (chain + iattn::flip(chain))};
  };
  auto verify = [&](const auto& h, const auto& hf) {
    const M y = iattn::apply(h, x);
    const double scale = 1.0 + y.cwiseAbs().maxCoeff() + x.cwiseAbs().maxCoeff();
    for (Index g = 0; g < H; ++g)
      for (Index c : {g * P, g * P + P - 1}) {
        const M m = iattn::materialize(h, c, L);
        if (!((m * x.col(c) - y.col(c)).cwiseAbs().maxCoeff() <= 1e-8 * scale * (1.0 + m.cwiseAbs().maxCoeff()))) std::abort();
      }
    const M yf = iattn::apply(hf, iattn::Matrix<float>(x.cast<float>())).template cast<double>();
    if (!close(yf, y, 1e-3)) std::abort();
  };
  const auto hd = build(std::type_identity<double>{});
  const auto hf = build(std::type_identity<float>{});
  if (terms == 0) verify(std::get<0>(hd), std::get<0>(hf));
  else if (terms == 1) verify(std::get<1>(hd), std::get<1>(hf));
  else verify(std::get<2>(hd), std::get<2>(hf));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  reader in{data, size};
  const std::uint8_t first = in.byte();
  if (first >= 240) {
    transitions(in, first % 2);
    return 0;
  }
  if (first >= 224) {
    long_cores(in, first % 4);
    if (in.byte() % 2) wide_heads(in);  // read after long_cores' bytes: older inputs keep their meaning
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
      check(iattn::semiseparable(lam, B, C, {.heads = H, .head_dim = P}), x, in, P);
      break;
    }
    case 1: {
      const M lam = in.matrix(L, H, -3, 0, ninf), B = in.matrix(L, N, -2, 2), C = in.matrix(L, N, -2, 2);
      check(iattn::diagonal(d) * iattn::semiseparable(lam, B, C, {.heads = H, .head_dim = P}) * iattn::diagonal(M(d.cwiseAbs())) *
                iattn::causal_conv(w),
            x, in, P);
      break;
    }
    case 2: {
      const M dt = in.matrix(L, H, 0, 2), A = in.matrix(H, N, -3, 0), B = in.matrix(L, N, -2, 2), C = in.matrix(L, N, -2, 2), bonus = in.matrix(H, N, -1, 1);
      check(iattn::semiseparable(iattn::factored_decay(dt, A), B, C, bonus, {.heads = H, .head_dim = P}), x, in, P);
      break;
    }
    case 3: {
      const M a = in.matrix(L, D, -1, 1, 0.0), b = in.matrix(L, D, -2, 2);
      check(iattn::linear_recurrence(a, b) * iattn::causal_conv(w), x, in);
      break;
    }
    case 4: {
      const M wd = in.matrix(L, D, -3, 0, ninf), k = in.matrix(L, D, -30, 30), u = in.matrix(1, D, -1, 1);
      check(iattn::wkv(wd, k, u), x, in);
      break;
    }
    case 5: {
      const M a = in.matrix(L, D, 0, 1), b = in.matrix(L, D, -2, 2);
      check(iattn::flip(iattn::linear_recurrence(a, b)) + 2.0 * iattn::diagonal(d), x, in);
      break;
    }
    case 6: {
      const M lam = in.matrix(L, H, -2, 0), B = in.matrix(L, N, 0.1, 2), C = in.matrix(L, N, 0.1, 2);
      check(iattn::row_normalize(iattn::semiseparable(lam, B, C, {.heads = H, .head_dim = P})), x, in, P);
      break;
    }
    default: {
      const M q = in.matrix(L, H * N, -3, 3), k = in.matrix(L, H * N, -3, 3);
      check(iattn::softmax_attention(q, k, {.heads = H, .head_dim = P}) * iattn::causal_conv(w), x, in, P);
      break;
    }
  }
  return 0;
}
