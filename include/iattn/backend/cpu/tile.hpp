// iattn/backend/cpu/tile.hpp: the evaluator interface of the CPU backend.
//
// Every node type has two evaluators (specialised in backend/cpu/<node>.hpp):
//   slab_eval<Node>::apply  (node, ctx, c0, nc, x, y)  y = H x on channels [c0, c0+nc)
//   slab_eval<Node>::apply_t(node, ctx, c0, nc, x, y)  y = H^T x (the anti-causal, transposed apply)
//     x and y are (L, nc) row-major slabs with row stride nc; y never aliases x.
//   channel_eval<Node, T>(node, ctx, c)                prepared once per channel, then
//     .block(i0, i1, j0, j1, out)                      writes H^c[i0:i1, j0:j1] into the tile
//     .diag(t)                                         H^c[t, t], for diagonal nodes only
// Evaluators assume a bound expression (GroupNorm statistics fixed); the drivers check that.
#pragma once

#include "../../core/config.hpp"
#include "../../ops/causal_conv.hpp"
#include "simd.hpp"

#include <Eigen/Core>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

namespace iattn::cpu_detail {

/// Sizes fixed for one evaluation: L tokens, D channels.
struct context {
  Index L;
  Index D;
};

/// A strided view of a row-major tile of an (L, L) matrix.
template <class T>
struct tile {
  T* data;
  Index rows, cols, stride;

  T& operator()(Index i, Index j) const { return data[i * stride + j]; }
  T* row(Index i) const { return data + i * stride; }
  tile sub(Index i, Index j, Index r, Index c) const { return {data + i * stride + j, r, c, stride}; }
  void set_zero() const {
    for (Index i = 0; i < rows; ++i) std::fill(row(i), row(i) + cols, T(0));
  }
  Eigen::Map<Matrix<T>, 0, Eigen::OuterStride<>> map() const { return {data, rows, cols, Eigen::OuterStride<>(stride)}; }
};

/// An owned (rows, cols) tile buffer.
template <class T>
struct tile_buffer {
  std::vector<T> storage;
  tile<T> view;
  tile_buffer(Index rows, Index cols) : storage(std::size_t(std::max<Index>(rows * cols, 1))), view{storage.data(), rows, cols, cols} {}
};

/// A Diagonal's coefficient as the scans read it: row t of an (L, D) matrix, or its one (1, D) row.
template <class T>
struct diag_ref {
  const T* data;
  Index cols;
  bool constant;
  const T* row(Index t) const { return constant ? data : data + t * cols; }
};

/// One term diag(scale) conv of row_ops::conv_sum; conv's taps are zero on every channel outside
/// lags [lo, hi) (Griffin's terms read one lag each), and those lags are not read: a structural
/// zero of H, as materialize shows it (docs/decisions.md, session 27).
template <class T>
struct conv_term {
  diag_ref<T> scale;
  const CausalConv<T>* conv;
  Index lo, hi;
};

/// What a streaming node (a scan) does to each token row around its own apply, so that a chain
/// diag * core * diag * conv is one pass over the tokens: the input row t is x's row, convolved by
/// `conv` when set (rows t-K+1..t), then multiplied by every `pre` factor; the output row is
/// multiplied by every `post` factor. Rows of x and y lie ldx and ldy entries apart: the slab's nc
/// when 0, the caller's (L, D) matrices when apply_slabs hands them over in place (streams_rows).
/// Nodes without a streaming apply get the same result from whole-slab passes (product.hpp).
/// A sum core + diag(skip) (RWKV's bonus, a skip connection) that only a node with skip support
/// reaches (algebra.hpp) sets `skip`: then
///   y_t = post[0..skip_post) * (post[skip_post..) * core_t + skip_t * in_t),
/// in_t being the input row shaped by the factors outside the sum (conv and pre[0..skip_pre));
/// the core reads in_t times pre[skip_pre..), the diagonals between the sum and the core (Mamba's
/// S diag(dt) + diag(D): only a node that splits its input rows, skip_inputs, is given those).
template <class T>
struct row_ops {
  std::vector<diag_ref<T>> pre, post;
  const CausalConv<T>* conv = nullptr;
  /// Instead of conv: a sum of scaled convolutions sum_k diag(scale_k) conv_k as the first factor
  /// (Griffin's document-masked convolution, one lag per term).
  std::vector<conv_term<T>> conv_sum;
  Index ldx = 0, ldy = 0;
  /// When >= 0, the core writes row `row_t` of the whole chain instead of applying it (a node that
  /// streams elementwise, streams_rows): its slab's channels as rows of the (D, L) result, y being
  /// the slab's first row and x unused (apply_slabs_into's row; LinearRecurrence::row_scaled).
  Index row_t = -1;
  std::optional<diag_ref<T>> skip;
  std::size_t skip_post = 0, skip_pre = 0;
  bool shapes_input() const { return conv != nullptr || !conv_sum.empty() || !pre.empty(); }
  Index x_stride(Index nc) const { return ldx ? ldx : nc; }
  Index y_stride(Index nc) const { return ldy ? ldy : nc; }
};

/// yt[j] *= f[t, c0 + j] for j < nc.
template <class T>
void times_row(const diag_ref<T>& f, Index t, Index c0, Index nc, T* yt) {
  const T* r = f.row(t) + c0;
  simd::for_packs<T>(nc, [&](auto w, Index j) {
    using P = simd::pack<T, decltype(w)::value>;
    (P::load(yt + j) * P::load(r + j)).store(yt + j);
  });
}

/// dst[j] = src[j] * prod_k f_k[t, c0 + j] for j < nc (dst may be src).
template <class T>
void scale_row(const std::vector<diag_ref<T>>& fs, Index t, Index c0, Index nc, const T* src, T* dst) {
  if (fs.empty()) {
    if (dst != src) std::copy(src, src + nc, dst);
    return;
  }
  const T* f0 = fs[0].row(t) + c0;
  const T* f1 = fs.size() > 1 ? fs[1].row(t) + c0 : nullptr;
  simd::for_packs<T>(nc, [&](auto w, Index j) {  // the first two factors in one pass (a gate and a norm)
    using P = simd::pack<T, decltype(w)::value>;
    const P v = P::load(src + j) * P::load(f0 + j);
    (f1 ? v * P::load(f1 + j) : v).store(dst + j);
  });
  for (std::size_t k = 2; k < fs.size(); ++k) times_row(fs[k], t, c0, nc, dst);
}

/// dst[j] = (sum_{lag < K, lag <= t} w[K-1-lag, c0+j] x[t-lag, j]) * prod_k f_k[t, c0+j]: one token
/// of a causal convolution and the scalings after it, x's rows ld apart. The lags accumulate in
/// the order of the convolution's own apply (causal_conv.hpp), so the fused and the separate
/// passes give the same bits.
template <class T>
void conv_scale_row(const CausalConv<T>& conv, const std::vector<diag_ref<T>>& fs, Index t, Index c0, Index nc,
                    const T* x, Index ld, T* dst) {
  const Index K = conv.width(), lags = std::min(K, t + 1), wld = conv.w().cols();
  const T* w = conv.w().data() + c0;
  constexpr std::size_t few = 4;  // factors whose rows are fetched per pack; more take a second pass
  const T* f[few];
  const std::size_t nf = std::min(fs.size(), few);
  for (std::size_t k = 0; k < nf; ++k) f[k] = fs[k].row(t) + c0;
  simd::for_packs<T>(nc, [&](auto v, Index j) {
    using P = simd::pack<T, decltype(v)::value>;
    P acc = P::load(w + (K - 1) * wld + j) * P::load(x + t * ld + j);
    for (Index lag = 1; lag < lags; ++lag) acc = fma(P::load(w + (K - 1 - lag) * wld + j), P::load(x + (t - lag) * ld + j), acc);
    for (std::size_t k = 0; k < nf; ++k) acc = acc * P::load(f[k] + j);
    acc.store(dst + j);
  });
  for (std::size_t k = few; k < fs.size(); ++k) {
    const T* fk = fs[k].row(t) + c0;
    for (Index j = 0; j < nc; ++j) dst[j] *= fk[j];
  }
}

/// dst[j] = (sum_k s_k[t, c0+j] conv_k(x)[t, j]) * prod_k f_k[t, c0+j]: one token of a sum of
/// scaled convolutions (row_ops::conv_sum), each term formed as conv_scale_row forms it and the
/// terms added left to right (as the separate passes of a left-nested sum add them).
template <class T>
void conv_sum_row(const std::vector<conv_term<T>>& terms, const std::vector<diag_ref<T>>& fs, Index t, Index c0, Index nc,
                  const T* x, Index ld, T* dst) {
  bool first = true;
  for (const conv_term<T>& term : terms) {  // one pass per term over the row (in L1)
    const Index K = term.conv->width(), lags = std::min(term.hi, t + 1), wld = term.conv->w().cols();
    if (term.lo >= lags) continue;
    const T* w = term.conv->w().data() + c0;
    const T* sr = term.scale.row(t) + c0;
    simd::for_packs<T>(nc, [&](auto v, Index j) {
      using P = simd::pack<T, decltype(v)::value>;
      P acc = P::load(w + (K - 1 - term.lo) * wld + j) * P::load(x + (t - term.lo) * ld + j);
      for (Index lag = term.lo + 1; lag < lags; ++lag)
        acc = fma(P::load(w + (K - 1 - lag) * wld + j), P::load(x + (t - lag) * ld + j), acc);
      acc = acc * P::load(sr + j);
      (first ? acc : P::load(dst + j) + acc).store(dst + j);
    });
    first = false;
  }
  if (first) std::fill(dst, dst + nc, T(0));
  if (!fs.empty()) scale_row(fs, t, c0, nc, dst, dst);
}

/// The input row t of a streaming node (row_ops: conv or conv_sum, then pre) into dst, x being
/// the slab's first row and rows ld apart.
template <class T>
void shape_row(const row_ops<T>& sc, Index t, Index c0, Index nc, const T* x, Index ld, T* dst) {
  if (!sc.conv_sum.empty()) conv_sum_row(sc.conv_sum, sc.pre, t, c0, nc, x, ld, dst);
  else if (sc.conv) conv_scale_row(*sc.conv, sc.pre, t, c0, nc, x, ld, dst);
  else scale_row(sc.pre, t, c0, nc, x + t * ld, dst);
}

/// Asks the cache for the n entries from data on (prefetch_span), or for the nc entries from column
/// c0 of row t of an (L, ld) row-major matrix (prefetch_row). A scan walks token rows of (L, D)
/// coefficients with a stride of D entries, one 4 KiB page or more per step at model widths, which
/// the hardware prefetchers do not follow; without this every coefficient row of every slab is a
/// cold miss.
template <class T>
void prefetch_span(const T* data, Index n) {
#if defined(__GNUC__) || defined(__clang__)
  // every 64-byte line of [data, data + n), the last one too when data is not on a line's start
  const auto first = reinterpret_cast<std::uintptr_t>(data) & ~std::uintptr_t(63);
  const auto end = reinterpret_cast<std::uintptr_t>(data + n);
  for (auto a = first; a < end; a += 64) __builtin_prefetch(reinterpret_cast<const void*>(a));
#else
  (void)data, (void)n;
#endif
}
template <class T>
void prefetch_row(const T* data, Index ld, Index t, Index c0, Index nc) {
  prefetch_span(data + t * ld + c0, nc);
}
/// Tokens ahead of the one being scanned whose coefficient rows are prefetched.
inline constexpr Index prefetch_ahead = 4;
/// prefetch_row for token t of every per-token pre and post factor, and of x's row when it is read
/// in place from the caller's matrix (t outside [0, L) is ignored).
template <class T>
void prefetch_scales(const row_ops<T>* sc, Index L, Index t, Index c0, Index nc, const T* x = nullptr) {
  if (!sc || t < 0 || t >= L) return;
  for (const auto* fs : {&sc->pre, &sc->post})
    for (const diag_ref<T>& f : *fs)
      if (!f.constant) prefetch_row(f.data, f.cols, t, c0, nc);
  for (const conv_term<T>& c : sc->conv_sum)
    if (!c.scale.constant) prefetch_row(c.scale.data, c.scale.cols, t, c0, nc);
  if (x && sc->ldx) prefetch_row(x, sc->ldx, t, 0, nc);
}

/// The token row a scan reads: x's row, or its convolved and scaled copy in buf. x is the slab's
/// first row (row t at t * x_stride).
template <class T>
const T* input_row(const row_ops<T>* sc, Index t, Index c0, Index nc, const T* x, T* buf) {
  if (!sc) return x + t * nc;
  const Index ld = sc->x_stride(nc);
  if (!sc->shapes_input()) return x + t * ld;
  shape_row(*sc, t, c0, nc, x, ld, buf);
  return buf;
}
/// A scan's input rows where it may add a sum's diagonal (row_ops::skip): the row the skip reads
/// (shaped by the convolution and pre[0..skip_pre)) and the row the core reads (that one times
/// pre[skip_pre..)), formed in one pass of the shaping per token; without a skip, or without
/// factors between the sum and the core, one row as input_row forms it.
template <class T>
class skip_inputs {
 public:
  /// With nc > 0, rows(t, c0, nc, x, skip) forms the rows in buffers of its own of nc entries;
  /// a scan that keeps several tokens' rows (the chunked one) passes its own with nc = 0.
  explicit skip_inputs(const row_ops<T>* sc, Index nc = 0) : sc_(sc) {
    if (sc && sc->skip && sc->skip_pre < sc->pre.size()) {
      outer_ = *sc;
      outer_.pre.resize(sc->skip_pre);
      inner_.assign(sc->pre.begin() + std::ptrdiff_t(sc->skip_pre), sc->pre.end());
    }
    buf_.resize(std::size_t(nc));
    sbuf_.resize(split() ? std::size_t(nc) : 0);
  }
  /// Token t's row for the core, in buf or x's own row; *skip = the skip's row, in sbuf, x's own
  /// row or the core's (x the slab's first row, as input_row takes it).
  const T* rows(Index t, Index c0, Index nc, const T* x, T* buf, T* sbuf, const T** skip) const {
    if (inner_.empty()) return *skip = input_row(sc_, t, c0, nc, x, buf);
    *skip = input_row(&outer_, t, c0, nc, x, sbuf);
    scale_row(inner_, t, c0, nc, *skip, buf);
    return buf;
  }
  /// The same in the object's own buffers (constructed with this nc); valid until the next call.
  const T* rows(Index t, Index c0, Index nc, const T* x, const T** skip) {
    return rows(t, c0, nc, x, buf_.data(), sbuf_.data(), skip);
  }
  /// Whether the skip's row and the core's differ (the callers' second buffer is needed).
  bool split() const { return !inner_.empty(); }

 private:
  const row_ops<T>* sc_;
  row_ops<T> outer_;
  std::vector<diag_ref<T>> inner_;
  std::vector<T> buf_, sbuf_;
};

/// Row t of a scan's output (y is the slab's first row).
template <class T>
T* output_row(const row_ops<T>* sc, Index t, Index nc, T* y) {
  return y + t * (sc ? sc->y_stride(nc) : nc);
}
/// A scan's finished output row yt, scaled by the post factors in place.
template <class T>
void finish_row(const row_ops<T>* sc, Index t, Index c0, Index nc, T* yt) {
  if (sc && !sc->post.empty()) scale_row(sc->post, t, c0, nc, yt, yt);
}
/// The same for a node that takes row_ops::skip, in_t being the shaped input row the core read:
/// yt = post[0..skip_post) * (post[skip_post..) * yt + skip_t * in_t).
template <class T>
void finish_row(const row_ops<T>* sc, Index t, Index c0, Index nc, T* yt, const T* in) {
  if (!sc || !sc->skip) return finish_row(sc, t, c0, nc, yt);
  for (std::size_t k = sc->skip_post; k < sc->post.size(); ++k) times_row(sc->post[k], t, c0, nc, yt);
  const T* s = sc->skip->row(t) + c0;
  simd::for_packs<T>(nc, [&](auto w, Index j) {
    using P = simd::pack<T, decltype(w)::value>;
    fma(P::load(s + j), P::load(in + j), P::load(yt + j)).store(yt + j);
  });
  for (std::size_t k = 0; k < sc->skip_post; ++k) times_row(sc->post[k], t, c0, nc, yt);
}

template <class Node>
struct slab_eval;
/// y = post * (Node (pre * x)) on a channel slab (defined in product.hpp).
template <class Node, class T>
void apply_scaled(const Node& n, const context& cx, Index c0, Index nc, const T* x, T* y, const row_ops<T>& sc);

/// Buffers a thread's scratch gave back, kept for its next scratch of at most that size: memory
/// the thread has already written, so a repeated evaluation pays no first-touch page faults (about
/// 12 us per 4 KiB page on the VMs of docs/performance.md, more than the slab's arithmetic). At
/// most scratch_pool_keep buffers and scratch_pool_bytes in all are kept per thread; larger ones
/// are freed as before.
inline constexpr std::size_t scratch_pool_keep = 8, scratch_pool_bytes = std::size_t(64) << 20;
template <class T>
struct scratch_pool {
  struct buffer {
    std::size_t size;
    std::unique_ptr<T[]> p;
  };
  std::vector<buffer> kept;
  std::size_t bytes = 0;
  static scratch_pool& local() {
    thread_local scratch_pool pool;
    return pool;
  }
  /// The smallest kept buffer of at least n elements, or a new one.
  buffer take(std::size_t n) {
    std::size_t best = kept.size();
    for (std::size_t i = 0; i < kept.size(); ++i)
      if (kept[i].size >= n && (best == kept.size() || kept[i].size < kept[best].size)) best = i;
    if (best == kept.size()) return {n, std::unique_ptr<T[]>(new T[n])};
    buffer b = std::move(kept[best]);
    kept.erase(kept.begin() + std::ptrdiff_t(best));
    bytes -= b.size * sizeof(T);
    return b;
  }
  void give(buffer b) {
    if (!b.p || b.size * sizeof(T) > scratch_pool_bytes) return;
    while (!kept.empty() && (kept.size() >= scratch_pool_keep || bytes + b.size * sizeof(T) > scratch_pool_bytes)) {
      bytes -= kept.front().size * sizeof(T);  // the oldest goes first
      kept.erase(kept.begin());
    }
    bytes += b.size * sizeof(T);
    kept.push_back(std::move(b));
  }
};

/// Uninitialised scratch for one (L, nc) slab: every evaluator writes its whole output before
/// reading it, so no pass is spent zeroing. Taken from and given back to the thread's pool.
template <class T>
struct scratch {
  typename scratch_pool<T>::buffer b;
  explicit scratch(Index n) : b(scratch_pool<T>::local().take(std::size_t(std::max<Index>(n, 1)))) {}
  scratch(scratch&&) = default;
  scratch(const scratch&) = delete;
  scratch& operator=(const scratch&) = delete;
  scratch& operator=(scratch&&) = delete;
  ~scratch() { scratch_pool<T>::local().give(std::move(b)); }
  T* data() const { return b.p.get(); }
  T& operator[](Index i) const { return b.p[std::size_t(i)]; }
};

template <class Node, class T>
struct channel_eval;

/// Writes the diagonal of a diagonal evaluator into a tile (zero elsewhere).
template <class Ev, class T>
void diagonal_block(const Ev& ev, Index i0, Index i1, Index j0, Index j1, tile<T> out) {
  out.set_zero();
  for (Index t = std::max(i0, j0); t < std::min(i1, j1); ++t) out(t - i0, t - j0) = ev.diag(t);
}

/// Token-block edge used by every tiled evaluator: tiles line up on multiples of it.
inline constexpr Index tile_size = 64;

/// The object stored under key k, shared by every evaluator holding it at the same time (the
/// channels of one head in a channel mean or materialize_all): made by make() when no evaluator
/// holds one. An entry lives only as long as an evaluator holds it; callers key it by their node's
/// address and its coefficients' storage, and evaluators never outlive the evaluation call that
/// made them, during which the node is alive and unchanged. Each instantiation (each caller) has
/// its own registry.
template <class Obj, class Key, class Make>
std::shared_ptr<Obj> shared_while_held(const Key& k, Make&& make) {
  static std::mutex mu;
  static std::map<Key, std::weak_ptr<Obj>> registry;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = registry.find(k); it != registry.end())
    if (auto m = it->second.lock()) return m;
  for (auto it = registry.begin(); it != registry.end();) it = it->second.expired() ? registry.erase(it) : std::next(it);
  std::shared_ptr<Obj> m = make();
  registry[k] = m;
  return m;
}

}  // namespace iattn::cpu_detail
