// iattn/backend/cuda/group_norm.hpp: CUDA evaluator of GroupNorm and bind on the device.
//   apply        statistics from the node's own input (kernels/group_norm.hpp, in double, as the
//                CPU backend takes them) when unbound, the bound statistics otherwise; then
//                y = weight[c] / sigma_t[g(c)] x. D is the weight's width or the statistics':
//                an unbound GroupNorm without a weight does not fix it and throws here (bind it
//                first, or give it a weight)
//   materialize, vector   a bound GroupNorm is a band of width 1 (band.hpp's device_band: channel
//                c's diagonal computed on the device from the statistics); unbound, they throw
//   device_binder<Node>::bind(n, on, x, L, D)   a copy of n with every GroupNorm's statistics
//                computed on the device from the input it sees (x (L, D) for the expression;
//                the right factor's output for a norm on the left of a product; x reversed
//                inside a Flip) and copied to the host: the CPU's bind_node, walked the same way
#pragma once

#include "../../core/error.hpp"
#include "../../ops/flip.hpp"
#include "../../ops/group_norm.hpp"
#include "../../ops/product.hpp"
#include "../../ops/row_normalize.hpp"
#include "../../ops/scaled.hpp"
#include "../../ops/sum.hpp"
#include "band.hpp"
#include "evaluator.hpp"
#include "identity.hpp"
#include "kernels/flip.hpp"
#include "kernels/group_norm.hpp"

#include <string>
#include <utility>

namespace iattn::cuda_detail {

/// Statistics of v (L, D) on the device: inv_sigma (L, G) and, when mean is not null, the means.
template <class T>
void device_group_norm_stats(const GroupNorm<T>& n, const cuda& on, const T* v, Index L, Index D, T* inv_sigma,
                             T* mean) {
  const Index G = n.groups();
  if (L == 0) return;
  simt::launch("group_norm_stats", &group_norm_stats<T>, elementwise_launch(L * G), on.stream, v, L, D, G, n.eps(),
               n.centered(), inv_sigma, mean);
}

template <class T>
struct cuda_eval<GroupNorm<T>> : band_node_eval<GroupNorm<T>> {
  static constexpr bool applies = true;
  static constexpr bool materializes = true;
  static constexpr bool slices = true;

  static void apply(const GroupNorm<T>& n, const cuda& on, const T* x, T* y, Index L) {
    const Index D = n.channels(), G = n.groups();
    if (D == any)
      detail::fail("apply(iattn::cuda, H, X)",
                   "a GroupNorm without a weight and unbound does not fix its channel count on the device; "
                   "give it a weight (1, D), or bind it first (bind(iattn::cuda, H, X))");
    if (L == 0) return;
    device_buffer<T> inv, w;
    if (n.bound()) {
      inv = upload(n.stats().inv_sigma, on.stream);
    } else {
      inv = device_buffer<T>(L * G, on.stream);
      device_group_norm_stats(n, on, x, L, D, inv.data(), static_cast<T*>(nullptr));
    }
    if (!n.weight().empty()) w = upload(n.weight(), on.stream);
    simt::launch("group_norm_scale", &group_norm_scale<T>, elementwise_launch(L * D), on.stream,
                 static_cast<const T*>(inv.data()), static_cast<const T*>(w.data()), x, y, L, D, G, Index(0), D);
  }
};

// ---- device_binder: bind on the device ------------------------------------------------------------

template <class Node>
struct device_binder {
  template <class T>
  static Node bind(const Node& n, const cuda&, const T*, Index, Index) {
    static_assert(!has_group_norm_v<Node>, "iattn: missing device_binder for a node containing a GroupNorm");
    return n;
  }
};

template <class T>
struct device_binder<GroupNorm<T>> {
  static GroupNorm<T> bind(const GroupNorm<T>& n, const cuda& on, const T* x, Index L, Index D) {
    n.check_input(L, D, "bind(iattn::cuda, H, X)");
    const Index G = n.groups();
    typename GroupNorm<T>::statistics s;
    s.channels = D;
    s.inv_sigma.resize(L, G);
    s.mean.resize(L, G);
    device_buffer<T> inv(L * G, on.stream), mean(L * G, on.stream);
    device_group_norm_stats(n, on, x, L, D, inv.data(), mean.data());
    inv.download(s.inv_sigma.data());
    mean.download(s.mean.data());
    if (!n.centered()) s.mean.setZero();
    return n.bound_to(std::move(s));
  }
};

template <class A, class B>
struct device_binder<Product<A, B>> {
  template <class T>
  static Product<A, B> bind(const Product<A, B>& n, const cuda& on, const T* x, Index L, Index D) {
    B b = device_binder<B>::bind(n.right(), on, x, L, D);
    if constexpr (has_group_norm_v<A>) {  // the left norm sees the right factor's output
      device_buffer<T> v(L * D, on.stream);
      apply_node(b, on, x, v.data(), L, D);
      return Product<A, B>(device_binder<A>::bind(n.left(), on, static_cast<const T*>(v.data()), L, D), std::move(b));
    } else {
      return Product<A, B>(n.left(), std::move(b));
    }
  }
};

template <class A, class B>
struct device_binder<Sum<A, B>> {
  template <class T>
  static Sum<A, B> bind(const Sum<A, B>& n, const cuda& on, const T* x, Index L, Index D) {
    return Sum<A, B>(device_binder<A>::bind(n.left(), on, x, L, D), device_binder<B>::bind(n.right(), on, x, L, D));
  }
};

template <class A>
struct device_binder<Scaled<A>> {
  template <class T>
  static Scaled<A> bind(const Scaled<A>& n, const cuda& on, const T* x, Index L, Index D) {
    return Scaled<A>(n.factor(), device_binder<A>::bind(n.inner(), on, x, L, D));
  }
};

template <class A>
struct device_binder<Flip<A>> {
  template <class T>
  static Flip<A> bind(const Flip<A>& n, const cuda& on, const T* x, Index L, Index D) {
    device_buffer<T> xr(L * D, on.stream);
    if (L * D > 0)
      simt::launch("reverse_rows", &reverse_rows<T>, elementwise_launch(L * D), on.stream, x, xr.data(), L, D);
    return Flip<A>(device_binder<A>::bind(n.inner(), on, static_cast<const T*>(xr.data()), L, D));
  }
};

template <class A>
struct device_binder<RowNormalize<A>> {
  template <class T>
  static RowNormalize<A> bind(const RowNormalize<A>& n, const cuda& on, const T* x, Index L, Index D) {
    return RowNormalize<A>(device_binder<A>::bind(n.inner(), on, x, L, D));
  }
};

}  // namespace iattn::cuda_detail
