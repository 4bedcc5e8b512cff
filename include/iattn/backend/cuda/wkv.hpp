// iattn/backend/cuda/wkv.hpp: CUDA evaluator of Wkv, RWKV's normalised WKV matrix (kernels/wkv.hpp):
//   apply        wkv_scan, one thread per channel over the tokens (O(L) per channel, exact in the
//                log domain); longer than wkv_chunk() tokens: the chunked scan (per-chunk states,
//                wkv_carry, the outputs from each chunk's entering state), twice the work,
//                parallel over the chunks too
//   materialize  ell_t for channel c (wkv_scan of that channel), then wkv_materialize, one thread
//                per column
//   vector       forward: wkv_scan of one channel on the vector; transposed: ell_t, then
//                wkv_transposed (one thread, last token first)
#pragma once

#include "../../ops/wkv.hpp"
#include "band.hpp"
#include "evaluator.hpp"
#include "kernels/wkv.hpp"

namespace iattn::cuda_detail {

/// Tokens per chunk of the chunked apply (a longer X takes it); settable for tests.
inline Index& wkv_chunk() {
  static Index c = 64;
  return c;
}

template <class T>
struct cuda_eval<Wkv<T>> {
  static constexpr bool applies = true;
  static constexpr bool materializes = true;
  static constexpr bool slices = true;

  struct coefficients {
    device_buffer<T> w, k, u;
    wkv_args<T> a{};
    coefficients(const Wkv<T>& n, const cuda& on, Index L)
        : w(upload(n.w(), on.stream)), k(upload(n.k(), on.stream)), u(upload(n.u(), on.stream)) {
      a = wkv_args<T>{w.data(), n.w().rows(), k.data(), u.data(), n.channels(), L};
    }
  };

  static void apply(const Wkv<T>& n, const cuda& on, const T* x, T* y, Index L) {
    if (L == 0) return;
    const coefficients co(n, on, L);
    const Index D = n.channels(), C = wkv_chunk();
    if (L <= C) {
      simt::launch("wkv_scan", &wkv_scan<T>, elementwise_launch(D), on.stream, co.a, Index(0), D, x, D, y,
                   static_cast<T*>(nullptr), Index(0), wkv_states<T>{}, wkv_states<T>{});
      return;
    }
    const Index chunks = (L + C - 1) / C, n_states = chunks * D;
    device_buffer<T> scratch(4 * n_states, on.stream);
    T* p = scratch.data();
    const wkv_states<T> states{p, p + n_states, p + 2 * n_states, p + 3 * n_states};
    simt::launch("wkv_scan", &wkv_scan<T>, elementwise_launch(n_states), on.stream, co.a, Index(0), D, x, D,
                 static_cast<T*>(nullptr), static_cast<T*>(nullptr), C, wkv_states<T>{}, states);
    simt::launch("wkv_carry", &wkv_carry<T>, elementwise_launch(D), on.stream, states, chunks, D);
    simt::launch("wkv_scan", &wkv_scan<T>, elementwise_launch(n_states), on.stream, co.a, Index(0), D, x, D, y,
                 static_cast<T*>(nullptr), C, states, wkv_states<T>{});
  }
  static void materialize(const Wkv<T>& n, const cuda& on, Index c, T* out, Index L) {
    if (L == 0) return;
    const coefficients co(n, on, L);
    const device_buffer<T> ell = normalisers(co, on, c, L);
    simt::launch("wkv_materialize", &wkv_materialize<T>, elementwise_launch(L), on.stream, co.a, c, ell.data(), out);
  }
  static void vector(const Wkv<T>& n, const cuda& on, Index c, bool transposed, const T* x, T* y, Index L) {
    if (L == 0) return;
    const coefficients co(n, on, L);
    if (transposed) {
      const device_buffer<T> ell = normalisers(co, on, c, L);
      simt::launch("wkv_transposed", &wkv_transposed<T>, elementwise_launch(1), on.stream, co.a, c, ell.data(), x, y);
    } else {
      simt::launch("wkv_scan", &wkv_scan<T>, elementwise_launch(1), on.stream, co.a, c, Index(1), x, Index(1), y,
                   static_cast<T*>(nullptr), Index(0), wkv_states<T>{}, wkv_states<T>{});
    }
  }

 private:
  /// ell_t of channel c, (L).
  static device_buffer<T> normalisers(const coefficients& co, const cuda& on, Index c, Index L) {
    device_buffer<T> ell(L, on.stream);
    simt::launch("wkv_scan", &wkv_scan<T>, elementwise_launch(1), on.stream, co.a, c, Index(1),
                 static_cast<const T*>(nullptr), Index(1), static_cast<T*>(nullptr), ell.data(), Index(0),
                 wkv_states<T>{}, wkv_states<T>{});
    return ell;
  }
};

}  // namespace iattn::cuda_detail
