// iattn/backend/cuda/kernels/semiseparable_view.hpp: a Semiseparable's coefficients as the kernels
// read them (device pointers and extents, trivially copyable: passed by value to every launch).
// The accessors mirror Semiseparable's (ops/semiseparable.hpp):
//   log_decay(t, h, m)  lambda[t, h*N + m] (per state), lambda[t, h] (per head) or dt[t, h] A[h, m]
//   b(t, g, m), c(t, g, m)   B[t, g*N + m], C[t, g*N + m]
#pragma once

#include "../simt.hpp"

namespace iattn::cuda_detail {

template <class T>
struct ss_view {
  const T* lambda;  // (L, H*N) per-state log-decay, (L, H) per head, or dt (L, H) when A is set
  const T* A;       // (H, N) of a factored decay, or null
  const T* B;       // (L, G*N)
  const T* C;       // (L, G*N)
  const T* bonus;   // (H, N) of the strict form, or null (a zero diagonal)
  simt::index L, H, P, G, N;
  bool per_state;   // lambda is (L, H*N)
  bool strict;      // strict-with-bonus form: decays over s+1..t-1, the bonus on the diagonal

  IATTN_HOST_DEVICE simt::index channels() const { return H * P; }
  IATTN_HOST_DEVICE simt::index head(simt::index c) const { return c / P; }
  IATTN_HOST_DEVICE simt::index group(simt::index h) const { return h / (H / G); }
  IATTN_HOST_DEVICE T log_decay(simt::index t, simt::index h, simt::index m) const {
    if (A) return lambda[t * H + h] * A[h * N + m];
    return per_state ? lambda[(t * H + h) * N + m] : lambda[t * H + h];
  }
  IATTN_HOST_DEVICE T b(simt::index t, simt::index g, simt::index m) const { return B[(t * G + g) * N + m]; }
  IATTN_HOST_DEVICE T c(simt::index t, simt::index g, simt::index m) const { return C[(t * G + g) * N + m]; }
  IATTN_HOST_DEVICE T bonus_of(simt::index h, simt::index m) const { return bonus ? bonus[h * N + m] : T(0); }
};

}  // namespace iattn::cuda_detail
