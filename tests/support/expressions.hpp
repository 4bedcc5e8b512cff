// tests/support/expressions.hpp: random composite expressions shaped like the models (Mamba-1,
// Mamba-2 with its group norm, RWKV, Vision Mamba), with their dense oracles built from the
// factor oracles of test_common.hpp.
#pragma once

#include "test_common.hpp"

namespace test {

/// diag(g) (S diag(dt) + diag(Dskip)) diag(sig) conv(w): the Mamba-1 holistic matrix (eq. 9).
/// expr() takes the factored decay dt (x) A, as Mamba computes it; expr_dense() the same matrix
/// from the dense (L, D*N) log-decay.
template <class T>
struct mamba1 {
  Index L, D, N, K;
  Mat<T> g, lam, A, B, C, dt, Dskip, sig, w;
  mamba1(Index L_, Index D_, Index N_, Index K_ = 4) : L(L_), D(D_), N(N_), K(K_) {
    g = normal<T>(L, D);
    dt = uniform<T>(L, D, 0.001, 0.1);
    A = -uniform<T>(D, N, 0.5, 16.0);
    lam.resize(L, D * N);
    for (Index t = 0; t < L; ++t)
      for (Index c = 0; c < D; ++c)
        for (Index m = 0; m < N; ++m) lam(t, c * N + m) = dt(t, c) * A(c, m);
    B = normal<T>(L, N);
    C = normal<T>(L, N);
    Dskip = normal<T>(1, D);
    sig = uniform<T>(L, D, 0.0, 1.0);
    w = normal<T>(K, D, 0.5);
  }
  auto S() const { return iattn::semiseparable(iattn::factored_decay(dt, A), B, C, {.heads = D}); }
  auto S_dense() const { return iattn::semiseparable(lam, B, C, {.heads = D}); }
  auto expr() const {
    using namespace iattn;
    return diagonal(g) * (S() * diagonal(dt) + diagonal(Dskip)) * diagonal(sig) * causal_conv(w);
  }
  auto expr_dense() const {
    using namespace iattn;
    return diagonal(g) * (S_dense() * diagonal(dt) + diagonal(Dskip)) * diagonal(sig) * causal_conv(w);
  }
  MatD dense(Index c) const {
    return dense_diagonal(dd(g), c, L) *
           (dense_semiseparable(dd(lam), dd(B), dd(C), D, 1, 1, c) * dense_diagonal(dd(dt), c, L) +
            dense_diagonal(dd(Dskip), c, L)) *
           dense_diagonal(dd(sig), c, L) * dense_conv(dd(w), c, L);
  }
};

/// GroupNorm * diag(z) (S_scalar diag(dt) + diag(Dskip)) conv(w): a Mamba-2-like expression.
template <class T>
struct mamba2 {
  Index L, H, P, G, N, D;
  Mat<T> z, lam, B, C, dt, Dskip, w, gw;
  mamba2(Index L_, Index H_, Index P_, Index G_, Index N_) : L(L_), H(H_), P(P_), G(G_), N(N_), D(H_ * P_) {
    z = normal<T>(L, D);
    lam = uniform<T>(L, H, -0.5, -0.01);
    B = normal<T>(L, G * N);
    C = normal<T>(L, G * N);
    dt = uniform<T>(L, D, 0.01, 0.2);
    Dskip = normal<T>(1, D);
    w = normal<T>(4, D, 0.5);
    gw = uniform<T>(1, D, 0.5, 1.5);
  }
  auto expr() const {
    using namespace iattn;
    auto S = semiseparable(lam, B, C, {.heads = H, .head_dim = P, .groups = G});
    return group_norm(G, gw) * diagonal(z) * (S * diagonal(dt) + diagonal(Dskip)) * causal_conv(w);
  }
};

/// diag(r) row_normalize(S_strict with bonus): an RWKV-like expression.
template <class T>
struct rwkv {
  Index L, D;
  Mat<T> r, lam, kexp, ones, u;
  rwkv(Index L_, Index D_) : L(L_), D(D_) {
    r = uniform<T>(L, D, 0, 1);
    lam = uniform<T>(L, D, -1.0, -0.05);
    kexp = uniform<T>(L, D, 0.1, 3.0);  // e^k > 0
    ones = Mat<T>::Ones(L, D);
    u = normal<T>(D, 1);
    u = u.array().exp().matrix();
  }
  auto expr() const {
    using namespace iattn;
    // per channel: N = 1, groups = heads = D: B = e^k, C = 1
    return diagonal(r) * row_normalize(semiseparable(lam, kexp, ones, u, {.heads = D, .groups = D}));
  }
};

/// Forward plus flipped backward scans: a Vision-Mamba-like bidirectional expression.
template <class T>
struct bidir {
  mamba1<T> f, b;
  bidir(Index L, Index D, Index N) : f(L, D, N), b(L, D, N) {}
  auto expr() const { return f.expr() + iattn::flip(b.expr()); }
};

}  // namespace test
