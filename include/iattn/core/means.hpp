// iattn/core/means.hpp: what the channel means of both backends take (evaluate.hpp for the CPU,
// cuda.hpp for the CUDA backend), free of either backend:
//   mean_options     abs, one head, or a range of channels
//   head_dim_of(H)   P, the channels per head of the expression's head-shared nodes
//   resolve_mean     the options checked against the expression: channels [c0, c1), abs
#pragma once

#include "config.hpp"
#include "error.hpp"

#include <optional>
#include <string>

namespace iattn {

/// What materialize_mean averages. A head is the P = head_dim channels [h P, (h+1) P) of the
/// expression's Semiseparable nodes (which must agree on P); for expressions without one, give an
/// explicit channel range instead. At most one of head and channels.
struct mean_options {
  bool abs = false;               ///< the mean of |H^c| instead of H^c
  std::optional<Index> head{};    ///< only head h's channels
  std::optional<range> channels{};  ///< only channels [begin, end), non-empty, inside [0, D)
};

template <Scalar T>
class Semiseparable;
template <Scalar T>
class Transition;
template <Scalar T>
class ComplexSemiseparable;
template <Scalar T, bool Causal>
class SoftmaxAttention;

namespace cpu_detail {

/// The nodes whose P channels of a head share one core (their head_dim).
template <class>
inline constexpr bool is_semiseparable_node_v = false;
template <class T>
inline constexpr bool is_semiseparable_node_v<Semiseparable<T>> = true;
template <class T>
inline constexpr bool is_semiseparable_node_v<Transition<T>> = true;  // head-shared likewise
template <class T>
inline constexpr bool is_semiseparable_node_v<ComplexSemiseparable<T>> = true;
template <class T, bool Causal>
inline constexpr bool is_semiseparable_node_v<SoftmaxAttention<T, Causal>> = true;  // a head's attention matrix

/// P of the expression's Semiseparable nodes (their head_dim); 0 when it has none, -1 when they
/// disagree. What `head` means in mean_options and materialize_head_means.
template <class Node>
Index head_dim_of(const Node& n) {
  auto join = [](Index a, Index b) { return a == 0 ? b : b == 0 ? a : a == b ? a : Index(-1); };
  if constexpr (is_semiseparable_node_v<Node>) return n.head_dim();
  else if constexpr (requires { n.left(); n.right(); }) return join(head_dim_of(n.left()), head_dim_of(n.right()));
  else if constexpr (requires { n.inner(); }) return head_dim_of(n.inner());
  else if constexpr (requires { n.erased_head_dim(); }) return n.erased_head_dim();  // AnyOperator
  else return 0;
}

}  // namespace cpu_detail

namespace detail {

/// What a channel mean averages: H^c, or |H^c| with abs, over channels [c0, c1).
struct mean_request {
  Index c0 = 0, c1 = 0;
  bool abs = false;
};

inline std::string range_string(range r) { return "[" + std::to_string(r.begin) + ", " + std::to_string(r.end) + ")"; }

/// P of the expression's heads, or a throw naming why there is none.
template <class H>
Index require_heads(const H& h, const char* where) {
  const Index P = cpu_detail::head_dim_of(h);
  if (P == 0)
    fail(where, "the expression has no heads (no Semiseparable, Transition, ComplexSemiseparable or SoftmaxAttention); give "
         "options.channels = {c0, c1} instead");
  if (P < 0) fail(where, "the expression's Semiseparable nodes disagree on head_dim, so it has no heads; give options.channels");
  return P;
}

template <class H>
mean_request resolve_mean(const H& h, const mean_options& o, const char* where) {
  const Index D = h.channels();
  if (o.head && o.channels) fail(where, "options.head and options.channels are both set; give one of them");
  if (o.head) {
    const Index P = require_heads(h, where), nh = D / P;
    if (*o.head < 0 || *o.head >= nh)
      fail(where, "options.head = " + std::to_string(*o.head) + " is out of range [0, H=" + std::to_string(nh) +
                      ") (D=" + std::to_string(D) + ", P=" + std::to_string(P) + ")");
    return {*o.head * P, (*o.head + 1) * P, o.abs};
  }
  if (o.channels) {
    const range r = *o.channels;
    if (r.begin < 0 || r.end > D || r.end <= r.begin)
      fail(where, "options.channels = " + range_string(r) + " is not a non-empty range inside [0, D=" + std::to_string(D) + ")");
    return {r.begin, r.end, o.abs};
  }
  return {0, D, o.abs};
}

}  // namespace detail
}  // namespace iattn
