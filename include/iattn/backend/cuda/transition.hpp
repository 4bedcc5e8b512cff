// iattn/backend/cuda/transition.hpp: CUDA evaluator of Transition (the delta-rule family), every
// form the node has (one log-decay per head or per key, any rank R, heads and channels per head).
// One kernel, the recurrence of kernels/transition.hpp, serves every mode:
//   apply        the D channels of X, O(L D N (R + 2)), sequential over the tokens
//   vector       one channel's vector, forward (col) or transposed (row)
//   materialize  the recurrence of the identity's columns, each from its own token: O(L^2 N (R + 2) / 2)
// Up to transition_max_state keys per head (N <= 32 lanes x 8). The chunked WY / UT form of the
// CPU (backend/cpu/transition_chunk.hpp) is not on the device yet.
#pragma once

#include "../../ops/transition.hpp"
#include "evaluator.hpp"
#include "kernels/transition.hpp"

#include <string>
#include <type_traits>

namespace iattn::cuda_detail {

inline constexpr Index transition_max_state = Index(simt::warp_size) * 8;

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

  /// The recurrence of columns [col0, col0 + cols) of x (L, stride) into y (L, stride); x null:
  /// the identity.
  static void run(const Transition<T>& n, const coefficients& co, const cuda& on, const T* x, T* y, Index col0,
                  Index cols, Index stride, Index channel, bool transposed) {
    const Index N = n.state();
    // W: the fewest lanes (a power of two) that hold N in 8 states each: each dot product is
    // log2 W shuffles, and a warp takes 32 / W columns.
    unsigned lanes = 1;
    while (lanes < simt::warp_size && lanes * 8 < N) lanes *= 2;
    const tr_scan_args<T> args{co.view, x, cols, col0, stride, channel, lanes, transposed};
    const Index per_block = transition_threads / lanes;
    const simt::launch_config config{{unsigned((cols + per_block - 1) / per_block)}, {transition_threads}, 0};
    auto launch = [&](auto ms) {
      constexpr int MS = decltype(ms)::value;
      simt::launch("transition_scan", &transition_scan<T, MS>, config, on.stream, args, y);
    };
    const Index per_thread = (N + lanes - 1) / lanes;  // MS: 4 or 8 states in registers
    if (per_thread <= 4) launch(std::integral_constant<int, 4>{});
    else launch(std::integral_constant<int, 8>{});
  }
};

}  // namespace iattn::cuda_detail
