// iattn/cuda.hpp: the CUDA backend, for .cu files (docs/cuda.md).
//
//   apply(cuda{s}, H, X)           Y = H X with X and Y device_matrix<T> (L, D)
//   apply(cuda{s}, H, X)           the same from and to host Eigen matrices (copies in and out)
//   materialize(cuda{s}, H, c)     channel c's (L, L) matrix as a device_matrix<T>
//   row(cuda{s}, H, t, c)          row t of channel c's matrix, (1, L): H^c[t, s] at (0, s)
//   col(cuda{s}, H, s, c)          column s of channel c's matrix, (1, L): H^c[t, s] at (0, t)
//   row_all(cuda{s}, H, t), col_all(cuda{s}, H, s)   every channel's row / column, (D, L)
//   block(cuda{s}, H, c, rows, cols)   the tile H^c[rows, cols], (rows.size(), cols.size())
//   materialize_all(cuda{s}, H)    every channel's matrix, (D L, L): channel c in rows [c L, (c+1) L)
//   materialize_mean(cuda{s}, H, o)          the mean of H^c (or |H^c|) over channels, (L, L)
//   materialize_head_means(cuda{s}, H, o)    every head's mean, (heads L, L)
//   to_device(m, cuda{s}), to_host(dm)   host <-> device copies (backend/cuda/memory.hpp)
//   to_device<S>(m, cuda{s}), convert<S>(cuda{s}, dm)   16-bit storage (S = float16, bfloat16):
//                                  rounded from float on the host or on the device; apply and bind
//                                  take 16-bit X, compute in float, and apply returns Y as X's type
//   bind(cuda{s}, H, X)            H with every GroupNorm's statistics taken from X (L, D) on the
//                                  device (the CPU's bind(H, X)); materialize, row and col need it
//   to_device(H, cuda{s})          H kept on the device: each coefficient copied once, not per call;
//                                  every call above takes it in H's place (on stream s)
//
// Covered now: apply, materialize (one channel, every channel, channel and head means), row and
// col (one channel, every channel) of Diagonal, CausalConv, LinearRecurrence, Semiseparable (every
// form), ComplexSemiseparable, Transition, GroupNorm, Wkv, SoftmaxAttention, Identity, and Products,
// Sums, scalar multiples, Flips and RowNormalizes of them (Mamba-1's chain diag * S * diag * conv;
// Vision Mamba's diag * (H_f + flip(H_b))). Any other node is a compile-time error naming what is
// covered, never a silent fallback to the CPU. Each call copies the expression's coefficients to
// the device (once per call, however many channels it evaluates; never again for a
// device_expression) and runs on stream s.
//
// Compiled by nvcc, the kernels run on the GPU; compiled by any other C++20 compiler, on the host
// emulator (backend/cuda/emulator.hpp), where `s` only chooses the emulator's schedule.
#pragma once

#include "backend/cuda/causal_conv.hpp"
#include "backend/cuda/complex_semiseparable.hpp"
#include "backend/cuda/diagonal.hpp"
#include "backend/cuda/evaluator.hpp"
#include "backend/cuda/flip.hpp"
#include "backend/cuda/group_norm.hpp"
#include "backend/cuda/identity.hpp"
#include "backend/cuda/linear_recurrence.hpp"
#include "backend/cuda/memory.hpp"
#include "backend/cuda/product.hpp"
#include "backend/cuda/row_normalize.hpp"
#include "backend/cuda/scaled.hpp"
#include "backend/cuda/semiseparable.hpp"
#include "backend/cuda/softmax.hpp"
#include "backend/cuda/tag.hpp"
#include "backend/cuda/transition.hpp"
#include "backend/cuda/wkv.hpp"
#include "backend/cpu/mean.hpp"  // expand_terms: the means' term expansion, shared with the CPU
#include "backend/cuda/kernels/copy.hpp"
#include "backend/cuda/kernels/head_mean.hpp"
#include "backend/cuda/kernels/mean_blocks.hpp"
#include "backend/cuda/kernels/mean.hpp"
#include "core/error.hpp"
#include "core/means.hpp"
#include "core/traits.hpp"

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

/// The nodes the backend covers, for the compile-time errors of every entry point (one list).
#define IATTN_CUDA_COVERED                                                                                      \
  "Diagonal, CausalConv, LinearRecurrence, Semiseparable, ComplexSemiseparable, Transition, GroupNorm, Wkv, "     \
  "SoftmaxAttention, Identity and Products, Sums, scalar multiples, Flips and RowNormalizes of these; H contains " \
  "another node (docs/cuda.md lists what is covered)"

namespace iattn {

/// An expression kept on the device: a copy of H (copies of an operator share its immutable
/// coefficient storage, core/coefficient.hpp: nothing is copied on the host) and the device copies
/// of its coefficients, each made by the first evaluation that reads it and kept for the object's
/// life, so later evaluations copy nothing from the host. Made by to_device(H, cuda{s}); evaluated
/// by the same calls as H (apply, materialize, row, col, materialize_all, the means) on the same
/// stream s (another stream throws std::invalid_argument: the copies are ordered on s). Destroy it
/// before s. A coefficient H references with iattn::ref is copied as it is at its first use: later
/// writes to the referenced matrix are not seen (make a new device_expression).
template <Operator H>
class device_expression {
 public:
  using scalar = typename H::scalar;
  device_expression(const H& h, cuda on) : h_(h), copies_(std::make_shared<cuda_detail::coefficient_copies>(on.stream)) {}

  /// The host expression.
  const H& expression() const { return h_; }
  /// The stream the copies live on.
  cuda backend() const { return cuda{copies_->stream()}; }
  /// How many of the expression's coefficients are on the device so far.
  std::size_t coefficients_on_device() const { return copies_->size(); }
  /// The scope an evaluation through `on` runs in; `where` names the call in the error.
  cuda_detail::upload_scope scope(const cuda& on, const char* where) const {
    if (!cuda_detail::same_stream(on.stream, copies_->stream()))
      detail::fail(where, "the device_expression was made on another stream; evaluate it on the stream passed to "
                          "to_device(H, cuda{s}), or make one per stream");
    return cuda_detail::upload_scope(copies_);
  }

 private:
  H h_;
  std::shared_ptr<cuda_detail::coefficient_copies> copies_;
};

/// H kept on the device (device_expression): its coefficients are copied once, by the first
/// evaluation that needs each, not by every call.
template <Operator H>
device_expression<H> to_device(const H& h, cuda on) {
  return device_expression<H>(h, on);
}

/// Y = H X on the device. X is (L, D) on the device; Y is made on on.stream.
template <Operator H, Scalar T>
device_matrix<T> apply(cuda on, const H& h, const device_matrix<T>& X) {
  static_assert(cuda_detail::applies_v<H>,
                "apply(iattn::cuda, H, X): the CUDA backend applies " IATTN_CUDA_COVERED);
  static_assert(std::is_same_v<T, typename H::scalar>, "apply(iattn::cuda, H, X): X must have the expression's scalar type");
  detail::check_input(h, X.rows(), X.cols(), "apply(iattn::cuda, H, X)", "X");
  device_matrix<T> Y(X.rows(), X.cols(), on);
  if constexpr (cuda_detail::applies_v<H>) cuda_detail::apply_node(h, on, X.data(), Y.data(), X.rows(), X.cols());
  return Y;
}

/// m converted on the device (one elementwise pass on on.stream): a float matrix rounded to 16-bit
/// storage (To = float16 or bfloat16: round to nearest, ties to even; beyond the largest finite
/// value ±inf, as CUDA's __float2half_rn), or 16-bit storage read into float (exact).
template <DeviceValue To, DeviceValue From>
device_matrix<To> convert(cuda on, const device_matrix<From>& m) {
  static_assert((std::is_same_v<From, float> && is_storage16_v<To>) || (is_storage16_v<From> && std::is_same_v<To, float>),
                "convert<To>(iattn::cuda, m): converts float to float16 / bfloat16 and back");
  device_matrix<To> out(m.rows(), m.cols(), on);
  if (m.size() == 0) return out;
  if constexpr (std::is_same_v<From, float> && is_storage16_v<To>)
    simt::launch("narrow_values", &cuda_detail::narrow_values<To>, cuda_detail::elementwise_launch(m.size()), on.stream,
                 m.data(), out.data(), m.size());
  else if constexpr (is_storage16_v<From> && std::is_same_v<To, float>)
    simt::launch("widen_values", &cuda_detail::widen_values<From>, cuda_detail::elementwise_launch(m.size()), on.stream,
                 m.data(), out.data(), m.size());
  return out;
}

/// Y = H X with X in 16-bit storage (float16 or bfloat16, (L, D) on the device): X read into float,
/// H X computed in float exactly as for a float X, Y rounded once to X's type (convert's rounding).
/// H must be a float expression.
template <Operator H, class S>
  requires is_storage16_v<S>
device_matrix<S> apply(cuda on, const H& h, const device_matrix<S>& X) {
  static_assert(cuda_detail::applies_v<H>,
                "apply(iattn::cuda, H, X): the CUDA backend applies " IATTN_CUDA_COVERED);
  static_assert(std::is_same_v<typename H::scalar, float>,
                "apply(iattn::cuda, H, X) with X in float16 / bfloat16 storage computes in float: H must be a float "
                "expression");
  detail::check_input(h, X.rows(), X.cols(), "apply(iattn::cuda, H, X)", "X");
  device_matrix<S> Y(X.rows(), X.cols(), on);
  if constexpr (cuda_detail::applies_v<H>) {
    const device_matrix<float> x = convert<float>(on, X);
    device_matrix<float> y(X.rows(), X.cols(), on);
    cuda_detail::apply_node(h, on, x.data(), y.data(), X.rows(), X.cols());
    if (y.size() > 0)
      simt::launch("narrow_values", &cuda_detail::narrow_values<S>, cuda_detail::elementwise_launch(y.size()),
                   on.stream, static_cast<const float*>(y.data()), Y.data(), y.size());
  }
  return Y;
}

/// Y = H X from a host matrix to a host matrix: X copied in, Y copied out (waits for on.stream).
template <Operator H, class XD>
Matrix<typename XD::Scalar> apply(cuda on, const H& h, const Eigen::MatrixBase<XD>& X) {
  return to_host(apply(on, h, to_device(X, on)));
}

/// H with every GroupNorm's statistics fixed from the expression's input X (L, D), computed on the
/// device and copied to the host (the CPU's bind(H, X), walked the same way: a norm on the left of
/// a product sees the right factor's output). materialize, row and col of an expression with a
/// GroupNorm need it; apply does not (it takes the statistics from each norm's own input). Waits
/// for on.stream.
template <Operator H, Scalar T>
H bind(cuda on, const H& h, const device_matrix<T>& X) {
  static_assert(cuda_detail::applies_v<H>,
                "bind(iattn::cuda, H, X): the CUDA backend applies " IATTN_CUDA_COVERED);
  static_assert(std::is_same_v<T, typename H::scalar>, "bind(iattn::cuda, H, X): X must have the expression's scalar type");
  detail::check_input(h, X.rows(), X.cols(), "bind(iattn::cuda, H, X)", "X");
  if constexpr (!has_group_norm_v<H>) {
    return h;
  } else {
    return cuda_detail::device_binder<H>::bind(h, on, X.data(), X.rows(), X.cols());
  }
}

/// bind with X in 16-bit storage: the statistics from X's values read into float.
template <Operator H, class S>
  requires is_storage16_v<S>
H bind(cuda on, const H& h, const device_matrix<S>& X) {
  static_assert(std::is_same_v<typename H::scalar, float>,
                "bind(iattn::cuda, H, X) with X in float16 / bfloat16 storage: H must be a float expression");
  detail::check_input(h, X.rows(), X.cols(), "bind(iattn::cuda, H, X)", "X");
  if constexpr (!has_group_norm_v<H>) {
    return h;
  } else {
    return bind(on, h, convert<float>(on, X));
  }
}

/// bind from a host matrix (copied in).
template <Operator H, class XD>
H bind(cuda on, const H& h, const Eigen::MatrixBase<XD>& X) {
  return bind(on, h, to_device(X, on));
}

/// Channel c's (L, L) matrix on the device, every entry written (zero above the diagonal for a
/// causal H, below it for a flipped one). An expression that does not fix L takes it last.
template <Operator H>
device_matrix<typename H::scalar> materialize(cuda on, const H& h, Index c, Index L = any) {
  static_assert(cuda_detail::materializes_v<H>,
                "materialize(iattn::cuda, H, c): the CUDA backend materializes " IATTN_CUDA_COVERED);
  const char* where = "materialize(iattn::cuda, H, c)";
  detail::check_channel(h, c, where);
  L = detail::resolve_length(h, L, where);
  device_matrix<typename H::scalar> out(L, L, on);
  if constexpr (cuda_detail::materializes_v<H>) cuda_detail::cuda_eval<H>::materialize(h, on, c, out.data(), L);
  return out;
}

namespace cuda_detail {
template <class H>
constexpr void require_materializes() {
  static_assert(materializes_v<H>,
                "materialize_all / materialize_mean / materialize_head_means(iattn::cuda, H): the CUDA backend "
                "materializes " IATTN_CUDA_COVERED);
}

/// L resolved, and D fixed by the expression.
template <class H>
Index resolve_channels_length(const H& h, Index L, const char* where) {
  L = detail::resolve_length(h, L, where);
  if (h.channels() == any) detail::fail(where, "the expression does not fix the channel count D");
  return L;
}

/// How many means the structured path below has served in this process: what the tests count to
/// prove it was taken.
inline std::atomic<long long>& structured_means_taken() {
  static std::atomic<long long> n{0};
  return n;
}

/// Channel c's matrix of a term's head-shared core (its node's own materialize) into out.
template <class T>
void materialize_core(const cpu_detail::mean_term<T>& term, const cuda& on, Index c, T* out, Index L) {
  using kind = typename cpu_detail::mean_term<T>::core_kind;
  switch (term.kind) {
    case kind::semiseparable:
      return cuda_eval<Semiseparable<T>>::materialize(*static_cast<const Semiseparable<T>*>(term.node), on, c, out, L);
    case kind::row_normalize:
      return cuda_eval<RowNormalize<Semiseparable<T>>>::materialize(
          *static_cast<const RowNormalize<Semiseparable<T>>*>(term.node), on, c, out, L);
    case kind::transition:
      return cuda_eval<Transition<T>>::materialize(*static_cast<const Transition<T>*>(term.node), on, c, out, L);
    case kind::complex:
      return cuda_eval<ComplexSemiseparable<T>>::materialize(*static_cast<const ComplexSemiseparable<T>*>(term.node), on,
                                                             c, out, L);
    case kind::softmax:
      return cuda_eval<SoftmaxAttention<T, true>>::materialize(*static_cast<const SoftmaxAttention<T, true>*>(term.node), on,
                                                               c, out, L);
    case kind::none:
      break;
  }
  detail::fail("materialize_mean(iattn::cuda, H)", "internal: a term without a head-shared core");
}

/// The most (channel, state) pairs blocked_mean_term takes at a time (fewer where the tile-pair
/// mids would pass 2^24 values): the tests lower it to reach the chunk loop.
inline Index& blocked_mean_pairs() {
  static Index pairs = 2048;
  return pairs;
}

/// The mean over channels [b, e) of the term w diag(P) S diag(Q) [conv] (S a Semiseparable) as
/// blocked products over (channel, state) pairs (kernels/mean_blocks.hpp), added into acc (L, L):
/// chunks of channels whose (token, pair) factors and tile-pair mids stay within 2^24 values each.
template <class T>
void blocked_mean_term(const cpu_detail::mean_term<T>& term, const cuda& on, Index b, Index e, T scale,
                       const diag_list<T>& post, const diag_list<T>& pre, const T* w, Index D, T* acc, Index L) {
  const device_semiseparable<T> ds(*term.S, on.stream);
  const Index N = term.S->state(), tiles = (L + tile_dim - 1) / tile_dim;
  const Index budget = std::max<Index>(N, std::min<Index>(blocked_mean_pairs(), (Index(1) << 24) / (tiles * tiles)));
  const Index dc = std::clamp<Index>(budget / N, 1, e - b), Mc = dc * N;
  device_buffer<T> ut(L * Mc, on.stream), vt(L * Mc, on.stream), ur(L * Mc, on.stream), zr(L * Mc, on.stream),
      mid(std::max<Index>(tiles * tiles * Mc, 1), on.stream);
  mb_args<T> a{ds.view, post, pre, w, term.width(), L, D, 0, 0, tiles};
  const Index band = a.K - 1 + (term.S->strict() ? 1 : 0);
  for (Index cb = b; cb < e; cb += dc) {
    const Index n = std::min(dc, e - cb);
    a.cb = cb;
    a.Mc = n * N;
    simt::launch("mb_factors", &mb_factors<T>, elementwise_launch(L * a.Mc), on.stream, a, ut.data(), vt.data(), ur.data(),
                 zr.data());
    simt::launch("mb_mid", &mb_mid<T>, elementwise_launch(tiles * a.Mc), on.stream, a, mid.data());
    simt::launch("mb_tiles", &mb_tiles<T>, {{unsigned(tiles), unsigned(tiles)}, {tile_dim, tile_rows}, 0}, on.stream, a,
                 static_cast<const T*>(ut.data()), static_cast<const T*>(vt.data()), static_cast<const T*>(ur.data()),
                 static_cast<const T*>(zr.data()), static_cast<const T*>(mid.data()), scale, acc);
    if (band > 0) simt::launch("mb_band", &mb_band<T>, elementwise_launch(L * band), on.stream, a, n, scale, acc);
  }
}

/// The structured path of channel_means (kernels/head_mean.hpp, kernels/mean_blocks.hpp): when H
/// expands (the CPU's expand_terms, backend/cpu/mean.hpp) into terms w diag(P) Core diag(Q) [conv]
/// with Core
///   - a node whose matrix its head's channels share (Semiseparable, a row-normalised one,
///     Transition, ComplexSemiseparable, a causal SoftmaxAttention) with two or more channels per
///     head: each head's core materialized once, the channels entering through their diagonals and
///     taps;
///   - a Semiseparable with one channel per head (Mamba-1): blocked products over (channel, state);
///   - none (a band): the channels' diagonals and taps.
/// |H^c| (abs) only for a single term without a convolution whose core a head shares. False
/// (nothing written) otherwise: the channel path.
template <class H, class T>
bool structured_means(const H& h, const cuda& on, Index c0, Index n, Index groups, bool abs, T* out, Index L) {
  using kind = typename cpu_detail::mean_term<T>::core_kind;
  const Index D = h.channels();
  cpu_detail::mean_terms<T> terms;
  if (!cpu_detail::expand_terms<T>(h, cpu_detail::context{L, D}, terms)) return false;
  auto blocked = [](const cpu_detail::mean_term<T>& t) { return t.kind == kind::semiseparable && t.head_dim < 2; };
  for (const auto& term : terms) {
    if (term.has_core() && term.kind == kind::none) return false;  // a LinearRecurrence: one channel each
    if (term.kind != kind::none && term.head_dim < 2 && !blocked(term)) return false;
    if (term.post.f.size() > std::size_t(diag_list<T>::capacity) || term.pre.f.size() > std::size_t(diag_list<T>::capacity))
      return false;
    if (term.conv && term.conv->w().cols() != D) return false;
    if (abs && (blocked(term) || terms.size() != 1 || term.conv)) return false;
  }
  structured_means_taken().fetch_add(1, std::memory_order_relaxed);
  const upload_scope uploads(on.stream);
  std::vector<device_buffer<T>> kept;  // this call's copies, alive until its kernels have run
  auto list = [&](const cpu_detail::diag_factors<T>& d) {
    diag_list<T> l;
    for (const auto& f : d.f) {
      const Index size = f.rows * D;
      // Every factor is an operand's own immutable storage (a bound GroupNorm's is its scale(), shared
      // by the node's copies and replaced, never rewritten, by bound_to): kept by address like the rest.
      kept.push_back(!upload_scope::current() ? device_buffer<T>(f.data, size, on.stream)
                                              : upload_scope::current()->borrow_or_upload<T>(f.data, size));
      l.f[l.n] = kept.back().data();
      l.rows[l.n++] = f.rows;
    }
    return l;
  };
  std::vector<head_mean_args<T>> args;  // per term: its diagonals and taps on the device, once per call
  for (const auto& term : terms) {
    head_mean_args<T> a{};
    a.post = list(term.post);
    a.pre = list(term.pre);
    if (term.conv) {
      kept.push_back(upload(term.conv->w(), on.stream));
      a.w = kept.back().data();
    }
    a.K = term.width();
    a.L = L;
    a.D = D;
    a.scale = static_cast<T>(term.weight / static_cast<double>(n));
    a.abs = abs;
    args.push_back(a);
  }
  device_buffer<T> core(L * L, on.stream);
  for (Index g = 0; g < groups; ++g) {
    const Index b = c0 + g * n, e = b + n;
    T* acc = out + g * L * L;
    bool first = true;
    for (std::size_t k = 0; k < terms.size(); ++k) {
      const auto& term = terms[k];
      head_mean_args<T> a = args[k];
      auto run = [&](Index cb, Index ce, const T* c) {
        a.core = c;
        a.c0 = cb;
        a.c1 = ce;
        a.first = first;
        first = false;
        simt::launch("head_mean_term", &head_mean_term<T>, elementwise_launch(L * L), on.stream, a, acc);
      };
      if (term.kind == kind::none) {
        run(b, e, nullptr);
        continue;
      }
      if (blocked(term)) {
        if (first)
          simt::launch("fill_value", &fill_value<T>, elementwise_launch(L * L), on.stream, acc, L * L, T(0));
        first = false;
        blocked_mean_term(term, on, b, e, a.scale, a.post, a.pre, a.w, D, acc, L);
        continue;
      }
      const Index P = term.head_dim;
      for (Index hd = b / P; hd * P < e; ++hd) {
        const Index cb = std::max(b, hd * P), ce = std::min(e, (hd + 1) * P);
        materialize_core(term, on, cb, core.data(), L);
        run(cb, ce, core.data());
      }
    }
  }
  return true;
}

/// Slice g of out, (L, L), for g < groups = the mean of H^c (or |H^c|) over the n channels
/// [c0 + g n, c0 + (g + 1) n): by the structured path where it takes H; otherwise each channel's
/// matrix materialized into one (L, L) scratch and added into its slice (the first one writes it),
/// every coefficient copied to the device once.
template <class H, class T>
void channel_means(const H& h, const cuda& on, Index c0, Index n, Index groups, bool abs, T* out, Index L) {
  if (L == 0 || n == 0) return;
  if (structured_means(h, on, c0, n, groups, abs, out, L)) return;
  const upload_scope uploads(on.stream);
  device_buffer<T> m(L * L, on.stream);
  const T scale = T(1) / static_cast<T>(n);
  for (Index g = 0; g < groups; ++g)
    for (Index c = c0 + g * n; c < c0 + (g + 1) * n; ++c) {
      cuda_eval<H>::materialize(h, on, c, m.data(), L);
      simt::launch("mean_accumulate", &mean_accumulate<T>, elementwise_launch(L * L), on.stream, out + g * L * L,
                   static_cast<const T*>(m.data()), L * L, scale, abs, c == c0 + g * n);
    }
}
}  // namespace cuda_detail

/// Every channel's (L, L) matrix on the device, as one (D L, L) device_matrix: channel c's matrix
/// in rows [c L, (c+1) L), the order of the CPU's materialize_all (D, L, L). The coefficients are
/// copied to the device once for all channels.
template <Operator H>
device_matrix<typename H::scalar> materialize_all(cuda on, const H& h, Index L = any) {
  cuda_detail::require_materializes<H>();
  L = cuda_detail::resolve_channels_length(h, L, "materialize_all(iattn::cuda, H)");
  const Index D = h.channels();
  device_matrix<typename H::scalar> out(D * L, L, on);
  if constexpr (cuda_detail::materializes_v<H>) {
    if (L == 0) return out;
    const cuda_detail::upload_scope uploads(on.stream);
    for (Index c = 0; c < D; ++c) cuda_detail::cuda_eval<H>::materialize(h, on, c, out.data() + c * L * L, L);
  }
  return out;
}

/// The mean of H^c (or of |H^c| with o.abs) over every channel, one head's (o.head) or a range
/// (o.channels), (L, L): the CPU's materialize_mean, channel by channel (each channel's matrix
/// added into the mean; the CPU's structured paths are not on the device yet). The coefficients
/// are copied once.
template <Operator H>
device_matrix<typename H::scalar> materialize_mean(cuda on, const H& h, const mean_options& o = {}, Index L = any) {
  using T = typename H::scalar;
  cuda_detail::require_materializes<H>();
  const char* where = "materialize_mean(iattn::cuda, H)";
  L = cuda_detail::resolve_channels_length(h, L, where);
  const auto rq = detail::resolve_mean(h, o, where);
  device_matrix<T> out(L, L, on);
  if constexpr (cuda_detail::materializes_v<H>) cuda_detail::channel_means(h, on, rq.c0, rq.c1 - rq.c0, 1, rq.abs, out.data(), L);
  return out;
}

/// Every head's mean (of H^c, or of |H^c| with o.abs), as one (heads L, L) device_matrix: head h's
/// mean in rows [h L, (h+1) L), the order of the CPU's materialize_head_means (heads, L, L).
/// o.head and o.channels must be unset.
template <Operator H>
device_matrix<typename H::scalar> materialize_head_means(cuda on, const H& h, const mean_options& o = {}, Index L = any) {
  using T = typename H::scalar;
  cuda_detail::require_materializes<H>();
  const char* where = "materialize_head_means(iattn::cuda, H)";
  L = cuda_detail::resolve_channels_length(h, L, where);
  if (o.head || o.channels) detail::fail(where, "options.head and options.channels must be unset (every head is computed)");
  const Index P = detail::require_heads(h, where), heads = h.channels() / P;
  device_matrix<T> out(heads * L, L, on);
  if constexpr (cuda_detail::materializes_v<H>) cuda_detail::channel_means(h, on, 0, P, heads, o.abs, out.data(), L);
  return out;
}

namespace cuda_detail {
/// k (named `name`) within [0, L), else std::invalid_argument from `where`.
inline void check_index(Index k, Index L, const char* name, const char* where) {
  if (k < 0 || k >= L)
    detail::fail(where, std::string(name) + " = " + std::to_string(k) + " is out of range [0, L=" + std::to_string(L) + ")");
}

/// e_k of length L on the device.
template <class T>
device_buffer<T> unit_vector(Index k, Index L, const cuda& on) {
  std::vector<T> unit(static_cast<std::size_t>(L), T(0));
  unit[static_cast<std::size_t>(k)] = T(1);
  return device_buffer<T>(unit.data(), L, on.stream);
}

/// Row k (is_row: (H^c)^T e_k) or column k (H^c e_k) of channel c's matrix, (1, L).
template <class H>
device_matrix<typename H::scalar> row_or_col(const cuda& on, const H& h, Index k, Index c, Index L, bool is_row) {
  using T = typename H::scalar;
  const char* where = is_row ? "row(iattn::cuda, H, t, c)" : "col(iattn::cuda, H, s, c)";
  L = detail::resolve_length(h, L, where);
  check_index(k, L, is_row ? "t" : "s", where);
  detail::check_channel(h, c, where);
  const device_buffer<T> e = unit_vector<T>(k, L, on);
  device_matrix<T> out(1, L, on);
  if constexpr (slices_v<H>) cuda_eval<H>::vector(h, on, c, is_row, e.data(), out.data(), L);
  return out;
}
}  // namespace cuda_detail

/// Row t of channel c's matrix on the device, (1, L): out(0, s) = H^c[t, s] (row(H, t)'s row c on
/// the CPU). O(L N) per factor: one transposed scan of e_t, never the (L, L) matrix.
template <Operator H>
device_matrix<typename H::scalar> row(cuda on, const H& h, Index t, Index c, Index L = any) {
  static_assert(cuda_detail::slices_v<H>,
                "row(iattn::cuda, H, t, c): the CUDA backend takes rows of " IATTN_CUDA_COVERED);
  return cuda_detail::row_or_col(on, h, t, c, L, true);
}

/// The tile H^c[rows, cols] on the device, (rows.size(), cols.size()), as the CPU's block: by
/// rows (the transposed scan of e_t for each t in rows) or by columns (the scan of e_s for each s
/// in cols), whichever are fewer, each copied into the tile: O(min(rows, cols) L N) per factor,
/// never the (L, L) matrix.
template <Operator H>
device_matrix<typename H::scalar> block(cuda on, const H& h, Index c, range rows, range cols, Index L = any) {
  static_assert(cuda_detail::slices_v<H>,
                "block(iattn::cuda, H, c, rows, cols): the CUDA backend takes tiles of " IATTN_CUDA_COVERED);
  using T = typename H::scalar;
  const char* where = "block(iattn::cuda, H, c, rows, cols)";
  L = detail::resolve_length(h, L, where);
  detail::check_channel(h, c, where);
  auto check = [&](range r, const char* name) {
    if (r.begin < 0 || r.end < r.begin || r.end > L)
      detail::fail(where, std::string(name) + " = [" + std::to_string(r.begin) + ", " + std::to_string(r.end) +
                              ") is not a range inside [0, L=" + std::to_string(L) + ")");
  };
  check(rows, "rows");
  check(cols, "cols");
  device_matrix<T> out(rows.size(), cols.size(), on);
  if (out.size() == 0) return out;
  if constexpr (cuda_detail::slices_v<H>) {
    const bool by_rows = rows.size() <= cols.size();
    const range along = by_rows ? rows : cols;
    cuda_detail::device_buffer<T> unit(L, on.stream), v(L, on.stream);
    auto fill = [&](Index at, Index n, T value) { cuda_detail::fill_device(on, unit.data() + at, n, value); };
    fill(0, L, T(0));
    const cuda_detail::upload_scope uploads(on.stream);
    for (Index i = 0; i < along.size(); ++i) {
      const Index k = along.begin + i;
      fill(k, 1, T(1));
      cuda_detail::cuda_eval<H>::vector(h, on, c, by_rows, static_cast<const T*>(unit.data()), v.data(), L);
      fill(k, 1, T(0));
      // By rows: v is row k, its cols part is the tile's row i; by columns: v is column k, its rows
      // part is the tile's column i.
      const range part = by_rows ? cols : rows;
      simt::launch("copy_strided", &cuda_detail::copy_strided<T>, cuda_detail::elementwise_launch(part.size()),
                   on.stream, static_cast<const T*>(v.data()) + part.begin, part.size(),
                   out.data() + (by_rows ? i * cols.size() : i), by_rows ? Index(1) : cols.size());
    }
  }
  return out;
}

namespace cuda_detail {
/// Row k (is_row) or column k of every channel's matrix, (D, L): channel c's in row c.
template <class H>
device_matrix<typename H::scalar> row_or_col_all(const cuda& on, const H& h, Index k, Index L, bool is_row) {
  static_assert(slices_v<H>,
                "row_all / col_all(iattn::cuda, H): the CUDA backend takes rows and columns of " IATTN_CUDA_COVERED);
  using T = typename H::scalar;
  const char* where = is_row ? "row_all(iattn::cuda, H, t)" : "col_all(iattn::cuda, H, s)";
  L = resolve_channels_length(h, L, where);
  check_index(k, L, is_row ? "t" : "s", where);
  const Index D = h.channels();
  device_matrix<T> out(D, L, on);
  if constexpr (slices_v<H>) {
    const device_buffer<T> e = unit_vector<T>(k, L, on);
    const upload_scope uploads(on.stream);
    for (Index c = 0; c < D; ++c) cuda_eval<H>::vector(h, on, c, is_row, e.data(), out.data() + c * L, L);
  }
  return out;
}
}  // namespace cuda_detail

/// Row t of every channel's matrix on the device, (D, L): out(c, s) = H^c[t, s], the CPU's
/// row(H, t). Channel by channel (one transposed scan of e_t each), the coefficients copied once.
template <Operator H>
device_matrix<typename H::scalar> row_all(cuda on, const H& h, Index t, Index L = any) {
  return cuda_detail::row_or_col_all(on, h, t, L, true);
}

/// Column s of every channel's matrix on the device, (D, L): out(c, t) = H^c[t, s], the CPU's
/// col(H, s).
template <Operator H>
device_matrix<typename H::scalar> col_all(cuda on, const H& h, Index s, Index L = any) {
  return cuda_detail::row_or_col_all(on, h, s, L, false);
}

/// Column s of channel c's matrix on the device, (1, L): out(0, t) = H^c[t, s] (col(H, s)'s row c
/// on the CPU). O(L N) per factor: one scan of e_s, never the (L, L) matrix.
template <Operator H>
device_matrix<typename H::scalar> col(cuda on, const H& h, Index s, Index c, Index L = any) {
  static_assert(cuda_detail::slices_v<H>,
                "col(iattn::cuda, H, s, c): the CUDA backend takes columns of " IATTN_CUDA_COVERED);
  return cuda_detail::row_or_col(on, h, s, c, L, false);
}

// The same calls on a device_expression: its kept copies serve every coefficient.

template <Operator H, Scalar T>
device_matrix<T> apply(cuda on, const device_expression<H>& h, const device_matrix<T>& X) {
  const auto s = h.scope(on, "apply(iattn::cuda, device_expression, X)");
  return apply(on, h.expression(), X);
}
template <Operator H, class S>
  requires is_storage16_v<S>
device_matrix<S> apply(cuda on, const device_expression<H>& h, const device_matrix<S>& X) {
  const auto s = h.scope(on, "apply(iattn::cuda, device_expression, X)");
  return apply(on, h.expression(), X);
}
template <Operator H, class XD>
Matrix<typename XD::Scalar> apply(cuda on, const device_expression<H>& h, const Eigen::MatrixBase<XD>& X) {
  const auto s = h.scope(on, "apply(iattn::cuda, device_expression, X)");
  return apply(on, h.expression(), X);
}
template <Operator H>
device_matrix<typename H::scalar> materialize(cuda on, const device_expression<H>& h, Index c, Index L = any) {
  const auto s = h.scope(on, "materialize(iattn::cuda, device_expression, c)");
  return materialize(on, h.expression(), c, L);
}
template <Operator H>
device_matrix<typename H::scalar> materialize_all(cuda on, const device_expression<H>& h, Index L = any) {
  const auto s = h.scope(on, "materialize_all(iattn::cuda, device_expression)");
  return materialize_all(on, h.expression(), L);
}
template <Operator H>
device_matrix<typename H::scalar> materialize_mean(cuda on, const device_expression<H>& h, const mean_options& o = {},
                                                   Index L = any) {
  const auto s = h.scope(on, "materialize_mean(iattn::cuda, device_expression)");
  return materialize_mean(on, h.expression(), o, L);
}
template <Operator H>
device_matrix<typename H::scalar> materialize_head_means(cuda on, const device_expression<H>& h,
                                                         const mean_options& o = {}, Index L = any) {
  const auto s = h.scope(on, "materialize_head_means(iattn::cuda, device_expression)");
  return materialize_head_means(on, h.expression(), o, L);
}
template <Operator H>
device_matrix<typename H::scalar> row(cuda on, const device_expression<H>& h, Index t, Index c, Index L = any) {
  const auto s = h.scope(on, "row(iattn::cuda, device_expression, t, c)");
  return row(on, h.expression(), t, c, L);
}
template <Operator H>
device_matrix<typename H::scalar> col(cuda on, const device_expression<H>& h, Index s, Index c, Index L = any) {
  const auto sc = h.scope(on, "col(iattn::cuda, device_expression, s, c)");
  return col(on, h.expression(), s, c, L);
}
template <Operator H>
device_matrix<typename H::scalar> block(cuda on, const device_expression<H>& h, Index c, range rows, range cols,
                                        Index L = any) {
  const auto s = h.scope(on, "block(iattn::cuda, device_expression, c, rows, cols)");
  return block(on, h.expression(), c, rows, cols, L);
}
template <Operator H>
device_matrix<typename H::scalar> row_all(cuda on, const device_expression<H>& h, Index t, Index L = any) {
  const auto s = h.scope(on, "row_all(iattn::cuda, device_expression, t)");
  return row_all(on, h.expression(), t, L);
}
template <Operator H>
device_matrix<typename H::scalar> col_all(cuda on, const device_expression<H>& h, Index s, Index L = any) {
  const auto sc = h.scope(on, "col_all(iattn::cuda, device_expression, s)");
  return col_all(on, h.expression(), s, L);
}

}  // namespace iattn
