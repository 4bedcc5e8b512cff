// iattn/backend/cuda/transition.hpp: CUDA evaluator of Transition (the delta-rule family), every
// form the node has (one log-decay per head or per key, any rank R, heads and channels per head).
// One kernel, the recurrence of kernels/transition.hpp, serves every mode:
//   apply        the D channels of X, O(L D N (R + 2)): sequential over the tokens within one
//                chunk (L <= transition_chunk()), else the chunked scan of kernels/transition.hpp
//                (per-chunk end states and transition products, transition_carry, the outputs)
//   vector       one channel's vector, forward (col) or transposed (row)
//   materialize  the recurrence of the identity's columns, each from its own token: O(L^2 N (R + 2) / 2)
// Up to transition_max_state keys per head (N <= 32 lanes x 8). The chunked apply runs the
// recurrence in each chunk (exact for any coefficients), not the CPU's WY / UT solve
// (backend/cpu/transition_chunk.hpp): its work is (2 P + N) / P times the sequential scan's, its
// scratch D N + H N^2 values per chunk, in segments of chunks within transition_scratch().
#pragma once

#include "../../ops/transition.hpp"
#include "band.hpp"  // elementwise_launch
#include "evaluator.hpp"
#include "kernels/row_normalize.hpp"
#include "kernels/transition.hpp"

#include <algorithm>
#include <string>
#include <type_traits>

namespace iattn::cuda_detail {

inline constexpr Index transition_max_state = Index(simt::warp_size) * 8;

/// Tokens per chunk of the chunked apply (a longer X takes it); settable for tests.
inline Index& transition_chunk() {
  static Index c = 64;
  return c;
}
/// The chunked apply's scratch per segment of chunks, in values (E_j: D N, Phi_j: H N^2 per chunk;
/// 2^26: 256 MiB of float), at least one chunk; settable for tests.
inline Index& transition_scratch() {
  static Index s = Index(1) << 26;
  return s;
}

template <class T>
struct cuda_eval<Transition<T>> {
  static constexpr bool applies = true;
  static constexpr bool materializes = true;
  static constexpr bool slices = true;

  struct coefficients {
    device_buffer<T> lambda, a, b, q, k;
    tr_view<T> view{};
    coefficients(const Transition<T>& n, simt::stream s)
        : lambda(upload(n.lambda(), s)), a(upload(n.a(), s)), b(upload(n.b(), s)), q(upload(n.q(), s)),
          k(upload(n.k(), s)) {
      view = tr_view<T>{lambda.data(), a.data(),   b.data(),    q.data(),  k.data(),    n.length(),
                        n.heads(),     n.head_dim(), n.state(), n.rank(), n.per_key()};
    }
  };

  static void apply(const Transition<T>& n, const cuda& on, const T* x, T* y, Index L) {
    if (L == 0) return;
    const coefficients co = check(n, on, "apply(iattn::cuda, H, X)");
    if (L > transition_chunk()) return chunked(n, co, on, x, y);
    run(n, co, on, x, y, 0, n.channels(), n.channels(), -1, false);
  }
  static void materialize(const Transition<T>& n, const cuda& on, Index c, T* out, Index L) {
    if (L == 0) return;
    const coefficients co = check(n, on, "materialize(iattn::cuda, H, c)");
    run(n, co, on, nullptr, out, 0, L, L, c, false);
  }
  static void vector(const Transition<T>& n, const cuda& on, Index c, bool transposed, const T* x, T* y, Index L) {
    if (L == 0) return;
    const coefficients co = check(n, on, transposed ? "row(iattn::cuda, H, t, c)" : "col(iattn::cuda, H, s, c)");
    run(n, co, on, x, y, 0, 1, 1, c, transposed);
  }

 private:
  static coefficients check(const Transition<T>& n, const cuda& on, const char* where) {
    if (n.state() > transition_max_state)
      detail::fail(where, "the Transition has N = " + std::to_string(n.state()) +
                              " keys per head; the CUDA recurrence holds at most " +
                              std::to_string(transition_max_state));
    return coefficients(n, on.stream);
  }

  /// The chunked scan of the D channels of x (L, D) into y (kernels/transition.hpp's passes), in
  /// segments of chunks whose scratch (E_j and Phi_j) stays within transition_scratch() values.
  static void chunked(const Transition<T>& n, const coefficients& co, const cuda& on, const T* x, T* y) {
    const Index L = n.length(), C = transition_chunk(), chunks = (L + C - 1) / C;
    const Index H = n.heads(), P = n.head_dim(), N = n.state(), D = n.channels();
    const Index per_chunk = D * N + H * N * N;
    const Index segment = std::clamp<Index>(transition_scratch() / per_chunk, 1, std::min<Index>(chunks, 65535));
    device_buffer<T> state(segment * D * N, on.stream), phi(segment * H * N * N, on.stream), carried(D * N, on.stream);
    simt::launch("fill_value", &fill_value<T>, elementwise_launch(D * N), on.stream, carried.data(), D * N, T(0));
    const Index groups = (P + transition_carry_cols - 1) / transition_carry_cols;
    for (Index j0 = 0; j0 < chunks; j0 += segment) {
      const Index count = std::min(segment, chunks - j0);
      tr_scan_args<T> ends{co.view, x, D, 0, D, -1, lanes_for(N), false};
      ends.chunk = C;
      ends.chunk0 = j0;
      ends.fin = state.data();
      launch_scan(ends, N, count, on, static_cast<T*>(nullptr));  // E_j
      tr_scan_args<T> products = ends;
      products.x = nullptr;
      products.cols = H * N;
      products.unit_start = true;
      products.fin = phi.data();
      launch_scan(products, N, count, on, static_cast<T*>(nullptr));  // Phi_j
      simt::launch("transition_carry", &transition_carry<T>,
                   {{unsigned(groups), unsigned(H)}, {transition_carry_threads},
                    std::size_t(2 * transition_carry_cols * N) * sizeof(T)},
                   on.stream, state.data(), static_cast<const T*>(phi.data()), carried.data(), count, H, P, N);
      tr_scan_args<T> outputs = ends;
      outputs.fin = nullptr;
      outputs.init = state.data();
      launch_scan(outputs, N, count, on, y);  // from S_j
    }
  }

  /// W: the fewest lanes (a power of two) that hold N in 8 states each: each dot product is
  /// log2 W shuffles, and a warp takes 32 / W columns.
  static unsigned lanes_for(Index N) {
    unsigned lanes = 1;
    while (lanes < simt::warp_size && lanes * 8 < N) lanes *= 2;
    return lanes;
  }

  static void launch_scan(const tr_scan_args<T>& args, Index N, Index chunks, const cuda& on, T* y) {
    const Index per_block = transition_threads / args.lanes;
    const simt::launch_config config{
        {unsigned((args.cols + per_block - 1) / per_block), unsigned(chunks)}, {transition_threads}, 0};
    auto launch = [&](auto ms) {
      constexpr int MS = decltype(ms)::value;
      simt::launch("transition_scan", &transition_scan<T, MS>, config, on.stream, args, y);
    };
    const Index per_thread = (N + args.lanes - 1) / args.lanes;  // MS: 4 or 8 states in registers
    if (per_thread <= 4) launch(std::integral_constant<int, 4>{});
    else launch(std::integral_constant<int, 8>{});
  }

  /// The recurrence of columns [col0, col0 + cols) of x (L, stride) into y (L, stride); x null:
  /// the identity.
  static void run(const Transition<T>& n, const coefficients& co, const cuda& on, const T* x, T* y, Index col0,
                  Index cols, Index stride, Index channel, bool transposed) {
    const Index N = n.state();
    launch_scan(tr_scan_args<T>{co.view, x, cols, col0, stride, channel, lanes_for(N), transposed}, N, 1, on, y);
  }
};

}  // namespace iattn::cuda_detail
