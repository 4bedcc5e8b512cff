// iattn/backend/cuda/softmax.hpp: CUDA evaluator of SoftmaxAttention (kernels/softmax.hpp), causal
// or bidirectional:
//   apply        softmax_apply, one thread per (token, channel), online softmax over the keys
//   materialize  softmax_stats of channel c's head, then softmax_entries (every entry written)
//   vector       forward: softmax_apply of one channel on the vector; transposed: the head's
//                statistics, then softmax_transposed
#pragma once

#include "../../ops/softmax_attention.hpp"
#include "band.hpp"
#include "evaluator.hpp"
#include "kernels/softmax.hpp"

namespace iattn::cuda_detail {

template <class T, bool Causal>
struct cuda_eval<SoftmaxAttention<T, Causal>> {
  using Node = SoftmaxAttention<T, Causal>;
  static constexpr bool applies = true;
  static constexpr bool materializes = true;
  static constexpr bool slices = true;

  struct coefficients {
    device_buffer<T> Q, K;
    softmax_args<T> a{};
    coefficients(const Node& n, const cuda& on, Index L) : Q(upload(n.Q(), on.stream)), K(upload(n.K(), on.stream)) {
      a = softmax_args<T>{Q.data(), K.data(), L, n.heads(), n.key_dim(), n.head_dim(), n.scale(), Causal};
    }
  };

  static void apply(const Node& n, const cuda& on, const T* x, T* y, Index L) {
    if (L == 0) return;
    const coefficients co(n, on, L);
    const Index D = n.channels();
    simt::launch("softmax_apply", &softmax_apply<T>, elementwise_launch(L * D), on.stream, co.a, Index(0), D, x, D, y);
  }
  static void materialize(const Node& n, const cuda& on, Index c, T* out, Index L) {
    if (L == 0) return;
    const coefficients co(n, on, L);
    device_buffer<T> m(L, on.stream), z(L, on.stream);
    const Index h = c / n.head_dim();
    simt::launch("softmax_stats", &softmax_stats<T>, elementwise_launch(L), on.stream, co.a, h, m.data(), z.data());
    simt::launch("softmax_entries", &softmax_entries<T>, elementwise_launch(L * L), on.stream, co.a, h,
                 static_cast<const T*>(m.data()), static_cast<const T*>(z.data()), out);
  }
  static void vector(const Node& n, const cuda& on, Index c, bool transposed, const T* x, T* y, Index L) {
    if (L == 0) return;
    const coefficients co(n, on, L);
    if (transposed) {
      device_buffer<T> m(L, on.stream), z(L, on.stream);
      const Index h = c / n.head_dim();
      simt::launch("softmax_stats", &softmax_stats<T>, elementwise_launch(L), on.stream, co.a, h, m.data(), z.data());
      simt::launch("softmax_transposed", &softmax_transposed<T>, elementwise_launch(L), on.stream, co.a, h,
                   static_cast<const T*>(m.data()), static_cast<const T*>(z.data()), x, y);
    } else {
      simt::launch("softmax_apply", &softmax_apply<T>, elementwise_launch(L), on.stream, co.a, c, Index(1), x, Index(1), y);
    }
  }
};

}  // namespace iattn::cuda_detail
