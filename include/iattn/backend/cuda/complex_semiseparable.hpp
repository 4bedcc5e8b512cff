// iattn/backend/cuda/complex_semiseparable.hpp: CUDA evaluator of ComplexSemiseparable (LRU, S4D
// as a recurrence, Mamba-3's complex state), every form the node has (per-token or fixed
// magnitudes and angles, heads, channels per head, groups). One kernel set, the chunked complex
// scan of kernels/complex_scan.hpp, serves every mode:
//   apply        the D channels of X, O(L D N)
//   vector       one channel's vector, forward (col) or transposed (row), O(L N)
//   materialize  the scan of the identity, column j from its own token on: O(L^2 N / 2) complex
//                steps, each entry written once, in batches of columns whose chunk states fit
//                materialize_scratch bytes (the tiled GEMM form of the CPU, rank 2N per tile pair,
//                is not here yet)
// Up to scan_max_state states per channel (512: W = 128 lanes of 4).
#pragma once

#include "../../ops/complex_semiseparable.hpp"
#include "evaluator.hpp"
#include "kernels/complex_scan.hpp"
#include "semiseparable.hpp"  // scan_max_state

#include <algorithm>
#include <string>
#include <type_traits>

namespace iattn::cuda_detail {

/// The most bytes of chunk states one batch of materialize's columns takes (four (chunks, cols, N)
/// arrays).
inline constexpr Index materialize_scratch = Index(64) << 20;

template <class T>
struct cuda_eval<ComplexSemiseparable<T>> {
  static constexpr bool applies = true;
  static constexpr bool materializes = true;
  static constexpr bool slices = true;

  struct coefficients {
    device_buffer<T> rho, theta, Br, Bi, Cr, Ci;
    cs_view<T> view{};
    coefficients(const ComplexSemiseparable<T>& n, simt::stream s)
        : rho(upload(n.log_mag(), s)), theta(upload(n.angle(), s)), Br(upload(n.B_re(), s)), Bi(upload(n.B_im(), s)),
          Cr(upload(n.C_re(), s)), Ci(upload(n.C_im(), s)) {
      view = cs_view<T>{rho.data(), theta.data(), Br.data(),  Bi.data(),   Cr.data(),
                        Ci.data(),  n.length(), n.heads(),    n.head_dim(), n.groups(),
                        n.state(),  n.constant_log_mag(),     n.constant_angle()};
    }
  };

  static void apply(const ComplexSemiseparable<T>& n, const cuda& on, const T* x, T* y, Index L) {
    if (L == 0) return;
    const coefficients co = check(n, on, "apply(iattn::cuda, H, X)");
    run(n, co, on, x, y, L, 0, n.channels(), n.channels(), -1, false);
  }
  static void materialize(const ComplexSemiseparable<T>& n, const cuda& on, Index c, T* out, Index L) {
    if (L == 0) return;
    const coefficients co = check(n, on, "materialize(iattn::cuda, H, c)");
    const Index per_column = ((L + scan_chunk - 1) / scan_chunk) * n.state() * 4 * Index(sizeof(T));
    const Index batch = std::max<Index>(scan_threads, materialize_scratch / std::max<Index>(per_column, 1));
    for (Index c0 = 0; c0 < L; c0 += batch) run(n, co, on, nullptr, out, L, c0, std::min(batch, L - c0), L, c, false);
  }
  static void vector(const ComplexSemiseparable<T>& n, const cuda& on, Index c, bool transposed, const T* x, T* y,
                     Index L) {
    if (L == 0) return;
    const coefficients co = check(n, on, transposed ? "row(iattn::cuda, H, t, c)" : "col(iattn::cuda, H, s, c)");
    run(n, co, on, x, y, L, 0, 1, 1, c, transposed);
  }

 private:
  /// The coefficients on the device, once N is known to fit the scan.
  static coefficients check(const ComplexSemiseparable<T>& n, const cuda& on, const char* where) {
    if (n.state() > scan_max_state)
      detail::fail(where, "the ComplexSemiseparable has N = " + std::to_string(n.state()) +
                              " complex states per channel; the CUDA scan holds at most " +
                              std::to_string(scan_max_state));
    return coefficients(n, on.stream);
  }

  /// The scan of columns [col0, col0 + cols) of x (L, stride) into y (L, stride); x null: the
  /// identity.
  static void run(const ComplexSemiseparable<T>& n, const coefficients& co, const cuda& on, const T* x, T* y, Index L,
                  Index col0, Index cols, Index stride, Index channel, bool transposed) {
    const Index N = n.state();
    const Index chunk = scan_chunk, chunks = (L + chunk - 1) / chunk;
    unsigned lanes = 1;  // W: the power of two >= N, at most scan_threads
    while (lanes < N && lanes < scan_threads) lanes *= 2;
    const cs_scan_args<T> args{co.view, x, cols, col0, stride, channel, chunk, lanes, transposed};
    const Index per_block = scan_threads / lanes, pairs = cols * N;
    if ((cols + per_block - 1) / per_block > 65535)
      detail::fail("apply(iattn::cuda, H, X)", "the CUDA scan takes at most " + std::to_string(65535 * per_block) +
                                                   " channels at N = " + std::to_string(N) + "; got " + std::to_string(cols));
    device_buffer<T> sre(chunks * pairs, on.stream), sim(chunks * pairs, on.stream), dre(chunks * pairs, on.stream),
        dim(chunks * pairs, on.stream);
    const simt::launch_config per_chunk{{unsigned(chunks), unsigned((cols + per_block - 1) / per_block)}, {scan_threads}, 0};
    auto passes = [&](auto ms) {
      constexpr int MS = decltype(ms)::value;
      simt::launch("cs_chunk_states", &cs_chunk_states<T, MS>, per_chunk, on.stream, args, sre.data(), sim.data(),
                   dre.data(), dim.data());
      simt::launch("cs_chunk_carry", &cs_chunk_carry<T>, elementwise_launch(pairs), on.stream, sre.data(), sim.data(),
                   static_cast<const T*>(dre.data()), static_cast<const T*>(dim.data()), chunks, pairs);
      simt::launch("cs_chunk_outputs", &cs_chunk_outputs<T, MS>, per_chunk, on.stream, args,
                   static_cast<const T*>(sre.data()), static_cast<const T*>(sim.data()), y);
    };
    const Index per_thread = (N + lanes - 1) / lanes;  // MS: 1, 2 or 4
    if (per_thread == 1) passes(std::integral_constant<int, 1>{});
    else if (per_thread == 2) passes(std::integral_constant<int, 2>{});
    else passes(std::integral_constant<int, 4>{});
  }
};

}  // namespace iattn::cuda_detail
