// iattn/backend/cuda/identity.hpp: CUDA evaluator of Identity, and apply_node, the one way the
// composite evaluators and the entry points apply a node. Identity has no channel count or scalar
// type of its own, so its apply needs the D of the expression around it: apply_node passes it (the
// enclosing node's channels(), or X's columns at the top), and copies x to y for an Identity.
//   apply        y = x, L D entries (copy_strided, stride 1)
//   materialize  the (L, L) identity: zeros, then ones on the diagonal (stride L + 1)
//   vector       y = x, L entries (forward or transposed)
#pragma once

#include "../../core/error.hpp"
#include "../../ops/identity.hpp"
#include "band.hpp"
#include "evaluator.hpp"
#include "kernels/copy.hpp"
#include "kernels/row_normalize.hpp"

#include <type_traits>

namespace iattn::cuda_detail {

/// dst[i] = src[i] for i < n, on the device.
template <class T>
void copy_device(const cuda& on, const T* src, T* dst, Index n) {
  if (n > 0)
    simt::launch("copy_strided", &copy_strided<T>, elementwise_launch(n), on.stream, src, n, dst, Index(1));
}

template <>
struct cuda_eval<Identity> {
  static constexpr bool applies = true;  // through apply_node, which knows D
  static constexpr bool materializes = true;
  static constexpr bool slices = true;

  template <class T>
  static void materialize(const Identity&, const cuda& on, Index, T* out, Index L) {
    if (L == 0) return;
    simt::launch("fill_value", &fill_value<T>, elementwise_launch(L * L), on.stream, out, L * L, T(0));
    device_buffer<T> ones(L, on.stream);
    simt::launch("fill_value", &fill_value<T>, elementwise_launch(L), on.stream, ones.data(), L, T(1));
    simt::launch("copy_strided", &copy_strided<T>, elementwise_launch(L), on.stream, static_cast<const T*>(ones.data()),
                 L, out, L + 1);
  }
  template <class T>
  static void vector(const Identity&, const cuda& on, Index, bool, const T* x, T* y, Index L) {
    copy_device(on, x, y, L);
  }
};

/// The D of the apply in progress on this thread (apply_node sets it around each node), for the
/// parts of an expression whose channel count is not fixed (a scaled or flipped Identity).
inline thread_local Index apply_channels = any;

/// The D an apply of n works on: its own channel count, or the enclosing apply's where n fixes none.
template <class Node>
Index apply_channels_of(const Node& n) {
  const Index D = n.channels();
  return D != any ? D : apply_channels;
}

/// y = n x for x, y (L, D) on the device; D is the channel count of the expression n sits in (an
/// Identity has none of its own; any: the enclosing apply's).
template <class Node, class T>
void apply_node(const Node& n, const cuda& on, const T* x, T* y, Index L, Index D) {
  if (D == any) D = apply_channels;
  if constexpr (std::is_same_v<Node, Identity>) {
    if (D == any)
      detail::fail("apply(iattn::cuda, H, X)", "an Identity in an expression whose channel count D is not fixed");
    copy_device(on, x, y, L * D);
  } else {
    struct restore {
      Index saved;
      ~restore() { apply_channels = saved; }
    } guard{apply_channels};
    apply_channels = D;
    cuda_eval<Node>::apply(n, on, x, y, L);
  }
}

}  // namespace iattn::cuda_detail
