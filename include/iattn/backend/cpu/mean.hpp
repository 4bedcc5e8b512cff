// iattn/backend/cpu/mean.hpp: materialize_mean as blocked matrix products whose inner dimension
// runs over channels and states together.
//
// An expression that is a sum of terms  w * diag(P) * Core * diag(Q) * [Conv]  (Core a Semiseparable,
// a LinearRecurrence or nothing; Diagonal, bound GroupNorm, scalar scales, identities and sums are
// distributed into that form by expand_terms, shared with head_mean.hpp) has the channel mean
//   mean_c H^c = sum over terms of (w / D) sum_c P^c Core^c Q^c Conv^c.
// For a term with a core, column s' of Core Q Conv is the core applied to the K-sparse input
// sum_lag tap(lag) Q[s'+lag] e_{s'+lag}. Folded into one state injection at sigma = s' + K - 1,
//   z_sigma[(c,m)] = sum_lag tap(lag, c) Q[s'+lag, c] B[s'+lag, m] E(s'+lag+1 .. sigma)[c,m],
// every entry at least K-1 (strict form: K) below the diagonal is an entry of the inclusive
//   G[t', sigma] = sum_{c,m} U[t', (c,m)] E(sigma+1 .. t')[c,m] z_sigma[(c,m)],  t' >= sigma,
// with U[t'] = P[t'+delta] C[t'+delta] (delta = 1 for the strict form, 0 otherwise), written to
// out[t' + delta, sigma - K + 1] (added to out's transpose, whose rows the products' packs run
// along, and transposed once at the end). G is evaluated in blocks of mean_block tokens:
//   below the diagonal block: Ut_I diag(E(j1 .. i0)) Vt_J^T for every J < I, Ut_I packed once per
//                             row block, Vt_J scaled once per pair (gemm.hpp's kernel);
//   inside the diagonal block: halved recursively, the lower-left quadrant a product referred to
//                              the split point, down to 8 tokens, which take running products;
// the inner dimension (c, m) a chunk of at most 1024 at a time (channel-major, or channel-minor where
// every channel is its own head: token_lanes). Two parallel passes per chunk: the
// token blocks (window of per-token rows, band, injection, ut and vt, diagonal block), then the
// row blocks' products. The remaining K-1 (strict: K)
// diagonals nearest the main one are summed directly. Decays across blocks are exps of sums of
// log-decays (never of differences: no positive arguments); inside a block of mean_block tokens they
// are running products of the per-token factors, as in decay_tiles' diagonal blocks. lambda = -inf
// gives exact zeros. Everything else (Flip, RowNormalize, Wkv, softmax,
// products of two cores, convolutions wider than max_mean_conv) takes the tile path of evaluate.hpp.
// The expansion also reads a convolution followed by diagonals (diag * conv * diag * [conv], the
// Hyena) as a term whose core is that convolution (tconv): toeplitz_mean.hpp takes those, with the
// time-invariant complex cores (the LRU); this file's GEMMs do not.
#pragma once

#include "../../ops/causal_conv.hpp"
#include "../../ops/complex_semiseparable.hpp"
#include "../../ops/diagonal.hpp"
#include "../../ops/group_norm.hpp"
#include "../../ops/identity.hpp"
#include "../../ops/linear_recurrence.hpp"
#include "../../ops/product.hpp"
#include "../../ops/row_normalize.hpp"
#include "../../ops/scaled.hpp"
#include "../../ops/semiseparable.hpp"
#include "../../ops/sum.hpp"
#include "../../ops/transition.hpp"
#include "algebra.hpp"
#include "complex_semiseparable.hpp"
#include "decay_tiles.hpp"
#include "gemm.hpp"
#include "parallel.hpp"
#include "product.hpp"
#include "semiseparable.hpp"
#include "simd.hpp"
#include "softmax_attention.hpp"
#include "tile.hpp"
#include "transition.hpp"

#include <algorithm>
#include <functional>
#include <memory>
#include <type_traits>
#include <vector>

namespace iattn::cpu_detail {

/// The entrywise product of diagonals, each (L, D) or (1, D) row-major, kept as references to the
/// operands' coefficients (no (L, D) products or copies are formed; a bound GroupNorm's is its
/// scale()); none means ones.
template <class T>
struct diag_factors {
  struct factor {
    const T* data;
    Index rows;
  };
  std::vector<factor> f;
  bool empty() const { return f.empty(); }
  void append(const diag_factors& o) {
    f.insert(f.end(), o.f.begin(), o.f.end());
  }
  /// Entries [c0, c0 + n) of row t (D columns): a pointer to the operand's row when there is one
  /// factor, the product written into scratch otherwise; nullptr when there is none.
  const T* row(Index t, Index D, Index c0, Index n, std::vector<T>& scratch) const {
    auto at = [&](const factor& x) { return x.data + (x.rows == 1 ? 0 : t) * D + c0; };
    if (f.empty()) return nullptr;
    if (f.size() == 1) return at(f[0]);
    if (scratch.size() < std::size_t(n)) scratch.resize(std::size_t(n));
    std::copy(at(f[0]), at(f[0]) + n, scratch.begin());
    for (std::size_t k = 1; k < f.size(); ++k) {
      const T* r = at(f[k]);
      for (Index j = 0; j < n; ++j) scratch[std::size_t(j)] *= r[j];
    }
    return scratch.data();
  }
};

/// One head's core, through its node's channel evaluator (type-erased: cores of several types);
/// the head path's view of a core (head_mean.hpp).
template <class T>
struct head_core {
  virtual ~head_core() = default;
  virtual void block(Index i0, Index i1, Index j0, Index j1, tile<T> out) const = 0;
};
template <class Node, class T>
struct head_core_of final : head_core<T> {
  channel_eval<Node, T> ev;
  head_core_of(const Node& n, const context& cx, Index c) : ev(n, cx, c) {}
  void block(Index i0, Index i1, Index j0, Index j1, tile<T> out) const override { ev.block(i0, i1, j0, j1, out); }
};

/// One term w * diag(post) * core * diag(pre) * [conv] of a channel-mean expansion, as both mean
/// paths read it: this file's (channel, state) GEMMs take a core that is a Semiseparable (S) or a
/// LinearRecurrence (R); head_mean.hpp's head path takes a core whose matrix depends on the channel
/// only through its head (core: one evaluator per head, head_dim >= 2 channels per head). A
/// Semiseparable is both.
template <class T>
struct mean_term {
  double weight = 1;
  diag_factors<T> post, pre;
  const CausalConv<T>* conv = nullptr;
  /// A convolution that is the term's core (diag * conv * diag * ..., the Hyena's long filter): a
  /// Toeplitz matrix per channel, taken by toeplitz_mean.hpp only.
  const CausalConv<T>* tconv = nullptr;
  const Semiseparable<T>* S = nullptr;
  const LinearRecurrence<T>* R = nullptr;
  std::function<std::unique_ptr<head_core<T>>(const context&, Index c)> core;  // for channel c's head
  Index head_dim = 0;  // P of a head-shared core (0: none)
  /// The head-shared core's node and its type, for the other backends' head paths (the CUDA
  /// backend's structured means, cuda.hpp): none without one.
  enum class core_kind { none, semiseparable, row_normalize, transition, complex, softmax } kind = core_kind::none;
  const void* node = nullptr;
  Index state = 0;     // N of the core (the head path's cost)
  bool has_core() const { return S != nullptr || R != nullptr || tconv != nullptr || bool(core); }
  bool trivial() const { return !has_core() && conv == nullptr && post.empty() && pre.empty(); }
  Index width() const { return conv ? conv->width() : 1; }
  /// The core is a Semiseparable: the (channel, state) GEMMs could take the term too.
  bool plain() const { return S != nullptr; }
};
template <class T>
using mean_terms = std::vector<mean_term<T>>;

inline constexpr std::size_t max_mean_terms = 64;  ///< beyond this the expansion is not worth it
inline constexpr Index max_mean_conv = 16;         ///< widest convolution folded into a core's injection
inline constexpr Index mean_block = 64;            ///< tokens per block of G
inline constexpr Index mean_row_group = 2;         ///< row blocks of G whose products share V's scaled copies
inline constexpr Index fused_width = 4;            ///< the convolution width of mean_core_term's fused token pass

/// node's matrix is its head's (head_dim channels per head, state N): a head core of one.
template <class T, class Node>
void set_head_core(mean_term<T>& one, const Node& node, Index head_dim, Index state,
                   typename mean_term<T>::core_kind kind) {
  one.kind = kind;
  one.node = &node;
  one.core = [&node](const context& c, Index ch) -> std::unique_ptr<head_core<T>> {
    return std::make_unique<head_core_of<Node, T>>(node, c, ch);
  };
  one.head_dim = head_dim;
  one.state = state;
}

/// out += b (a sum's terms); false past max_mean_terms. Like multiply_terms, compiled once per
/// scalar type rather than inlined into every expression's expansion (issue 19 part 5).
template <class T>
bool append_terms(mean_terms<T>& out, mean_terms<T>& b) {
  for (auto& t : b) out.push_back(std::move(t));
  return out.size() <= max_mean_terms;
}

/// out = a b distributed (a product's terms): false when a pair does not fit the form.
template <class T>
bool multiply_terms(const mean_terms<T>& a, const mean_terms<T>& b, mean_terms<T>& out) {
  if (a.size() * b.size() > max_mean_terms) return false;
  for (const auto& x : a)
    for (const auto& y : b) {
      mean_term<T> r;
      if (x.conv && !y.trivial()) {
        // A convolution is the rightmost factor, or the core of a term diag * conv * diag * [conv]
        // (each channel's matrix Toeplitz; toeplitz_mean.hpp) when neither side has another core.
        if (x.has_core() || y.has_core()) return false;
        r = x;
        r.tconv = x.conv;
        r.conv = y.conv;
        r.pre.append(y.post);
        r.pre.append(y.pre);
      } else if (x.conv) {
        r = x;
      } else if (x.has_core()) {  // core · diag: y's diagonals join the right-hand side
        if (y.has_core()) return false;
        r = x;
        r.pre.append(y.post);
        r.pre.append(y.pre);
        r.conv = y.conv;
      } else {  // diag · y: x joins y's left-hand diagonal
        r = y;
        r.post = x.post;
        r.post.append(y.post);
      }
      r.weight = x.weight * y.weight;
      if (r.has_core() && r.conv && r.conv->width() > max_mean_conv) return false;
      out.push_back(std::move(r));
    }
  return true;
}

/// Expands n into out, the one expansion of both mean paths (a product distributes over sums, a
/// diagonal joins the nearest core's left or right factor, a convolution must stay rightmost);
/// false when n is not a sum of terms of the form above. Which path can take the terms is decided
/// afterwards (channel_path_takes, head_mean.hpp's make_head_plan).
template <class T, class Node>
bool expand_terms(const Node& n, const context& cx, mean_terms<T>& out) {
  out.clear();
  mean_term<T> one;
  if constexpr (std::is_same_v<Node, Diagonal<T>>) {
    one.post.f.push_back({n.d().row(0), n.d().rows()});
  } else if constexpr (std::is_same_v<Node, GroupNorm<T>>) {
    if (!n.bound()) return false;
    one.post.f.push_back({bound_scale(n, cx).data(), cx.L});  // the node's own (L, D) diagonal
  } else if constexpr (std::is_same_v<Node, Identity>) {
  } else if constexpr (std::is_same_v<Node, CausalConv<T>>) {
    one.conv = &n;
  } else if constexpr (std::is_same_v<Node, Semiseparable<T>>) {
    one.S = &n;
    set_head_core<T>(one, n, n.head_dim(), n.state(), mean_term<T>::core_kind::semiseparable);
  } else if constexpr (std::is_same_v<Node, LinearRecurrence<T>>) {
    one.R = &n;
    one.state = 1;
  } else if constexpr (std::is_same_v<Node, RowNormalize<Semiseparable<T>>>) {
    // diag(1 / (S_h 1)) S_h: shared by the head too
    set_head_core<T>(one, n, n.inner().head_dim(), n.inner().state() + 1, mean_term<T>::core_kind::row_normalize);
  } else if constexpr (std::is_same_v<Node, Transition<T>>) {
    // the head's matrix (backend/cpu/transition.hpp computes it once per head)
    set_head_core<T>(one, n, n.head_dim(), n.state(), mean_term<T>::core_kind::transition);
  } else if constexpr (std::is_same_v<Node, ComplexSemiseparable<T>>) {
    set_head_core<T>(one, n, n.head_dim(), 2 * n.state(), mean_term<T>::core_kind::complex);  // rank 2N real tiles per head
  } else if constexpr (std::is_same_v<Node, SoftmaxAttention<T, true>>) {
    // a head's causal attention matrix (its row statistics computed once per head; the head
    // path's blocks are lower triangular, so the bidirectional form keeps the tile path)
    set_head_core<T>(one, n, n.head_dim(), n.key_dim(), mean_term<T>::core_kind::softmax);
  } else if constexpr (is_scaled_node<Node>::value) {
    if (!expand_terms<T>(n.inner(), cx, out)) return false;
    for (auto& t : out) t.weight *= n.factor();
    return true;
  } else if constexpr (is_sum_node<Node>::value) {
    mean_terms<T> b;
    if (!expand_terms<T>(n.left(), cx, out) || !expand_terms<T>(n.right(), cx, b)) return false;
    return append_terms(out, b);
  } else if constexpr (is_product_node<Node>::value) {
    mean_terms<T> a, b;
    if (!expand_terms<T>(n.left(), cx, a) || !expand_terms<T>(n.right(), cx, b)) return false;
    return multiply_terms(a, b, out);
  } else {
    return false;
  }
  out.push_back(std::move(one));
  return true;
}

/// Whether this file's (channel, state) GEMMs take the terms: every core a Semiseparable or a
/// LinearRecurrence.
template <class T>
bool channel_path_takes(const mean_terms<T>& terms) {
  return std::all_of(terms.begin(), terms.end(), [](const mean_term<T>& t) { return !t.has_core() || t.S || t.R; });
}

/// Expands n for this file's path; false when n is not a sum of terms it takes.
template <class T, class Node>
bool expand_mean(const Node& n, const context& cx, mean_terms<T>& out) {
  return expand_terms<T>(n, cx, out) && channel_path_takes(out);
}

// The mean of one term with a core, added transposed into outT (see the header comment).
template <class T, class Policy>
class mean_core_term {
 public:
  /// The mean over channels [cb, ce) (default: all D).
  mean_core_term(const mean_term<T>& term, const context& cx, Index cb = 0, Index ce = any)
      : term_(term), L_(cx.L), D_(cx.D), cb_(cb), ce_(ce == any ? cx.D : ce) {
    N_ = term.S ? term.S->state() : 1;
    strict_ = term.S && term.S->strict();
    delta_ = strict_ ? 1 : 0;
    K_ = term.conv ? term.conv->width() : 1;
    scale_ = T(term.weight / double(ce_ - cb_));
    fused_ = term.S && !strict_ && K_ == fused_width && N_ % simd::width<T> == 0;  // taken for log_decay only
    // The channel-minor layout (token_lanes): every channel its own head, one group of B and C, and
    // a decay factored (dt A) or one per channel.
    lanes_ok_ = fused_ && term.S->head_dim() == 1 && term.S->groups() == 1 &&
                (term.S->factored() || !term.S->per_state());
    const Index target = std::clamp<Index>((Index(1) << 22) / std::max<Index>(L_, 1), 64, 1024);
    Dc_ = std::clamp<Index>(target / N_, 1, ce_ - cb_);
  }

  void accumulate(Matrix<T>& outT) {
    // Rows padded to whole packs, and off multiples of 1 KiB so the product kernel's B rows do not
    // share L1 sets.
    constexpr Index W = simd::width<T>;
    Index M = (Dc_ * N_ + W - 1) / W * W;
    if ((M * Index(sizeof(T))) % 1024 == 0) M += W;
    ut_.resize(L_, M);
    vt_.resize(L_, M);
    const Index nb = (L_ + mean_block - 1) / mean_block;
    blk_.resize(nb, M);
    lam0_.resize(nb, M);
    tail_.resize(nb, M);
    bufs_.assign(std::size_t(max_threads()), buffers{});
    for (Index c0 = cb_; c0 < ce_; c0 += Dc_) {
      dc_ = std::min(Dc_, ce_ - c0);
      m_ = dc_ * N_;
      lanes_ = lanes_ok_ && dc_ % W == 0;
      taps_.assign(std::size_t(K_ * m_), T(0));
      bonus_.assign(std::size_t(m_), T(0));
      for (Index j = 0; j < dc_; ++j)
        for (Index m = 0; m < N_; ++m) {
          const Index i = inner(j, m);
          for (Index lag = 0; lag < K_; ++lag) taps_[std::size_t(lag * m_ + i)] = tap(lag, c0 + j);
          if (term_.S && term_.S->has_bonus()) bonus_[std::size_t(i)] = term_.S->bonus()(term_.S->head_of(c0 + j), m);
        }
      c0_ = c0;
      if (lanes_) {
        ones_.assign(std::size_t(dc_), T(1));
        if (term_.S->factored()) {  // A transposed, at the inner index (m, j)
          rate_.resize(std::size_t(m_));
          for (Index j = 0; j < dc_; ++j)
            for (Index m = 0; m < N_; ++m) rate_[std::size_t(inner(j, m))] = term_.S->decay_rate()(c0 + j, m);
        }
      } else if (term_.S) {  // the channel-major layout's per-channel offsets (fill, token_fused)
        head_.resize(std::size_t(dc_));
        group_.resize(std::size_t(dc_));
        for (Index j = 0; j < dc_; ++j) {
          head_[std::size_t(j)] = term_.S->head_of(c0 + j);
          group_[std::size_t(j)] = term_.S->group_of_head(head_[std::size_t(j)]) * N_;
        }
      }
      parallel_for(nb, [&](Index b) { token_block(b, outT); });
      // Row blocks 1 .. nb-1 in groups of mean_row_group from the last down (the first group the
      // remainder): longest rows first.
      const Index ng = (nb - 1 + mean_row_group - 1) / mean_row_group;
      parallel_for(ng, [&](Index k) {
        const Index I1 = nb - mean_row_group * k, I = std::max<Index>(1, I1 - mean_row_group);
        row_group(I, I1, outT);
      });
    }
  }

 private:
  template <int W>
  using Pk = simd::pack<T, W>;

  // The per-token rows of one token block and its neighbours (K - 1 before, delta after), in a
  // buffer of the thread that works on the block, so they stay in its cache from the pass that
  // computes them to the diagonal block: log-decay lam, factor fac = Policy::factor(lam), left
  // and right factors uf = P C and bf = Q B, injection vz (see the header comment).
  struct window {
    Index base = 0, ld = 0;
    std::vector<T> data;
    void reset(Index t0, Index t1, Index m) {
      base = t0;
      ld = m;
      if (data.size() < std::size_t(5 * (t1 - t0) * m)) data.resize(std::size_t(5 * (t1 - t0) * m));
    }
    T* at(int a, Index t) { return data.data() + (5 * (t - base) + a) * ld; }
    T* lam(Index t) { return at(0, t); }
    T* fac(Index t) { return at(1, t); }
    T* uf(Index t) { return at(2, t); }
    T* bf(Index t) { return at(3, t); }
    T* vz(Index t) { return at(4, t); }
  };

  // Per-thread buffers, kept across row blocks (fresh allocations would page-fault every time).
  struct buffers {
    std::vector<T> ws, up, vp, acc, f, g, post, pre;
    window win;
  };
  // Token block b: its window, the band and injections of its tokens, its edges for the products
  // below it, and its diagonal block.
  void token_block(Index b, Matrix<T>& outT) {
    const Index b0 = b * mean_block, b1 = std::min(L_, b0 + mean_block);
    buffers& bu = local();
    window& w = bu.win;
    const Index t0 = std::max<Index>(0, b0 - (K_ - 1)), t1 = std::min(L_, b1 + delta_);
    const Index M = ut_.cols();
    w.reset(t0, t1, M);
    // One pass over the tokens while their rows are fresh in L1: fill (one row ahead in the strict
    // form), band, injection, ut = U E(b0+1 .. t) referred forward to the block's first token, and
    // the block's whole decay as a sum of log-decays.
    // The fused pass forms a token's rows itself: the window is filled up to b0 only.
    Index filled = std::min(t1, b0 + delta_ + (fused_ ? 0 : 1));
    fill(t0, filled, w, bu);
    T* f = sized(bu.f, m_);
    std::fill(f, f + m_, T(1));
    T* decay = blk_.row(b).data();
    std::fill(decay, decay + m_, Policy::template neutral<T>());
    for (Index t = b0; t < b1; ++t) {
      if constexpr (std::is_same_v<Policy, log_decay>)
        if (fused_ && t >= K_ - 1 && filled == t) {
          if (lanes_) {
            if (term_.S->factored())
              token_lanes<0>(t, b0, outT, w, bu, f, decay);
            else
              token_lanes<2>(t, b0, outT, w, bu, f, decay);
            ++filled;
            continue;
          }
          switch (decay_mode(*term_.S)) {
            case 0: token_fused<0>(t, b0, outT, w, bu, f, decay); break;
            case 1: token_fused<1>(t, b0, outT, w, bu, f, decay); break;
            default: token_fused<2>(t, b0, outT, w, bu, f, decay); break;
          }
          ++filled;
          continue;
        }
      for (; filled < t1 && filled <= t + delta_; ++filled) fill(filled, filled + 1, w, bu);
      token_step(t, b0, outT, w, f, decay);
    }
    std::copy(w.lam(b0), w.lam(b0) + m_, lam0_.row(b).data());
    std::copy(f, f + m_, tail_.row(b).data());  // E(b0+1 .. b1-1) as the running product
    std::fill(f, f + m_, T(1));
    // vt = z E(s+1 .. b1-1), referred to the block's last token. Where the diagonal block is split
    // (more than 8 tokens, at mid), its referral of the tokens before mid to mid reads the same
    // window rows, so it writes their vt rows too, times g = E(mid+1 .. b1-1): here only [mid, b1).
    T* vt = vt_.row(b0).data();
    const Index mid = b1 - b0 > 8 ? b0 + diagonal_split(b1 - b0) : b0;
    if (mid == b0) {
      refer_backward(b0, b1, vt, M, f, w);
      diagonal_block(b0, b1, outT, bu, w);
      return;
    }
    refer_backward(mid + 1, b1, vt + (mid + 1 - b0) * M, M, f, w);
    T* g = sized(bu.g, m_);
    std::copy(f, f + m_, g);  // E(mid+1 .. b1-1)
    refer_backward(mid, mid + 1, vt + (mid - b0) * M, M, f, w);
    diagonal_block(b0, b1, outT, bu, w, g);
  }

  // Where token t's log-decays of one head come from: d * rate[m] (factored: dt times the head's
  // rates), rate[m] (one per state: lambda's row) or d (the head's scalar), for lambda's row lrow.
  // pack_as: the same with the mode known at compile time (token_fused's loop, one branch fewer
  // per pack).
  struct decay_source {
    int mode;  // 0 factored, 1 per state, 2 scalar
    const T* rate;
    T d;
    template <class P>
    P pack(Index m) const {
      return mode == 0 ? pack_as<0, P>(m) : mode == 1 ? pack_as<1, P>(m) : pack_as<2, P>(m);
    }
    template <int Mode, class P>
    P pack_as(Index m) const {
      if constexpr (Mode == 0) return P::broadcast(d) * P::load(rate + m);
      else if constexpr (Mode == 1) return P::load(rate + m);
      else return P::broadcast(d);
    }
  };
  template <class Core>
  static int decay_mode(const Core& S) {
    return S.factored() ? 0 : S.per_state() ? 1 : 2;
  }
  template <class Core>
  decay_source decay_of(const Core& S, const T* lrow, Index h, int mode = -1) const {
    if (mode < 0) mode = decay_mode(S);
    return {mode, mode == 0 ? S.decay_rate().row(h) : lrow + h * N_, mode == 1 ? T(1) : lrow[h]};
  }

  // Rows [t0, t1) of the window; inner index i = j * N + m for channel c0 + j and state m. The
  // per-channel offsets into the coefficients (head, group) come from the chunk's tables; a core's
  // row of a channel is written in one pass of packs over its states (log-decay, its factor, the
  // left and right factors).
  void fill(Index t0, Index t1, window& w, buffers& bu) {
    const auto* S = term_.S;
    const auto* R = term_.R;
    const Index c0 = c0_;
    if (lanes_) return fill_lanes(t0, t1, w, bu);
    for (Index t = t0; t < t1; ++t) {
      T* lam = w.lam(t);
      T* fac = w.fac(t);
      T* uf = w.uf(t);
      T* bf = w.bf(t);
      const T* post = term_.post.row(t, D_, c0, dc_, bu.post);
      const T* pre = term_.pre.row(t, D_, c0, dc_, bu.pre);
      if (S) {
        const T* B = S->B().row(t);
        const T* C = S->C().row(t);
        const T* lrow = S->lambda().row(t);
        for (Index j = 0; j < dc_; ++j) {
          const Index o = j * N_, h = head_[std::size_t(j)], g = group_[std::size_t(j)];
          const T p = post ? post[j] : T(1), q = pre ? pre[j] : T(1);
          const decay_source src = decay_of(*S, lrow, h);
          simd::for_packs<T>(N_, [&](auto wd, Index m) {
            using P = Pk<decltype(wd)::value>;
            const P l = src.template pack<P>(m);
            l.store(lam + o + m);
            Policy::factor(l).store(fac + o + m);
            (P::broadcast(p) * P::load(C + g + m)).store(uf + o + m);
            (P::broadcast(q) * P::load(B + g + m)).store(bf + o + m);
          });
        }
      } else {
        const T* a = R->a().row(t) + c0;
        const T* bb = R->b().row(t) + c0;
        for (Index j = 0; j < dc_; ++j) {
          lam[j] = a[j];
          uf[j] = post ? post[j] : T(1);
          bf[j] = (pre ? pre[j] : T(1)) * bb[j];
        }
        factor_row(lam, fac);
      }
    }
  }

  // fill in the channel-minor layout (lanes_; token_lanes).
  void fill_lanes(Index t0, Index t1, window& w, buffers& bu) {
    constexpr int W = simd::width<T>;
    using P = Pk<W>;
    const bool factored = term_.S->factored();
    for (Index t = t0; t < t1; ++t) {
      const lane_rows x = lanes_of_token(t, bu);
      for (Index m = 0; m < N_; ++m)
        for (Index j = 0, i = m * dc_; j < dc_; j += W, i += W) {
          P l = P::load(x.dt + j);
          if (factored) l = l * P::load(rate_.data() + i);
          l.store(w.lam(t) + i);
          Policy::factor(l).store(w.fac(t) + i);
          (P::load(x.post + j) * P::broadcast(x.C[m])).store(w.uf(t) + i);
          (P::load(x.pre + j) * P::broadcast(x.B[m])).store(w.bf(t) + i);
        }
    }
  }

  // Token t's operand rows in the channel-minor layout, from channel c0: the diagonals (ones where
  // there is none), B's and C's rows (one group), and dt (lambda, one head a channel).
  struct lane_rows {
    const T *post, *pre, *B, *C, *dt;
  };
  lane_rows lanes_of_token(Index t, buffers& bu) const {
    const T* post = term_.post.row(t, D_, c0_, dc_, bu.post);
    const T* pre = term_.pre.row(t, D_, c0_, dc_, bu.pre);
    return {post ? post : ones_.data(), pre ? pre : ones_.data(), term_.S->B().row(t), term_.S->C().row(t),
            term_.S->lambda().row(t) + c0_};
  }

  // The inner index of channel c0 + j and state m: channel-major (j N + m), or channel-minor
  // (m dc + j) with lanes_.
  Index inner(Index j, Index m) const { return lanes_ ? m * dc_ + j : j * N_ + m; }

  T tap(Index lag, Index c) const { return term_.conv ? term_.conv->tap(lag, c) : T(1); }

  // dst[i] = Policy::factor(src[i]) over the chunk's m_ entries.
  void factor_row(const T* src, T* dst) const {
    simd::for_packs<T>(m_, [&](auto w, Index i) {
      using P = Pk<decltype(w)::value>;
      Policy::factor(P::load(src + i)).store(dst + i);
    });
  }

  // Token t of the block starting at b0, in one pass over the inner index that reads each window
  // row once: its row of the Kb = K - 1 + delta diagonals nearest the main one, summed directly,
  //   outT[t-d, t] += scale sum_c sum_{ls + lag = d} tap(lag, c) U[t] E(s+1 .. t) Q B[s],  s = t - ls
  // (strict form: E(s+1 .. t-1), and the bonus for ls = 0) with the Kb sums in registers; its
  // injection vz[t] = z_t for t >= K-1 (zero below), by Horner from the oldest lag,
  //   z = (..(tap(0) Q B[s']) f[s'+1] + tap(1) Q B[s'+1]) f[s'+2] + .. + tap(K-1) Q B[t];
  // ut[t] = U[t+delta] E(b0+1 .. t) with f the running product (zero past the output); and the
  // block's decay.
  void token_step(Index t, Index b0, Matrix<T>& outT, window& w, T* f, T* decay) {
    const Index Kb = K_ - 1 + delta_;
    // Every diagonal exists: the unrolled forms for the widths the models have (no convolution: 0,
    // strict: 1; a 4-tap convolution: 3). Each form is a kernel of its own to compile (issue 19
    // part 5), so the rarer widths take the general one.
    if (t + 1 >= Kb) {
      switch (Kb) {
        case 0: return token_pass<0>(t, b0, Kb, outT, w, f, decay);
        case 1: return token_pass<1>(t, b0, Kb, outT, w, f, decay);
        case 3: return token_pass<3>(t, b0, Kb, outT, w, f, decay);
        default: break;
      }
    }
    token_pass<-1>(t, b0, Kb, outT, w, f, decay);
  }

  // KB = Kb (and t + 1 >= Kb), or -1 for any Kb and t.
  template <int KB>
  void token_pass(Index t, Index b0, Index Kb, Matrix<T>& outT, window& w, T* f, T* decay) {
    constexpr int NA = KB > 0 ? KB : KB == 0 ? 1 : int(max_mean_conv) + 1;
    const int nls = KB >= 0 ? KB : int(std::min(Kb, t + 1));  // s = t - ls >= 0
    const T* uf = w.uf(t);
    const T* bf[NA] = {};
    const T* fc[NA] = {};  // the factor joining E at ls (none at ls = 0, nor at 1 in the strict form)
    for (int ls = 0; ls < nls; ++ls) {
      bf[ls] = w.bf(t - ls);
      if ((!strict_ && ls >= 1) || (strict_ && ls >= 2)) fc[ls] = w.fac(t - ls + 1);
    }
    const int nlag = t >= K_ - 1 ? int(K_) : 0;  // injection rows s' + lag, s' = t - (K-1)
    const T* ib[max_mean_conv] = {};
    const T* ifc[max_mean_conv] = {};
    for (int lag = 0; lag < nlag; ++lag) {
      ib[lag] = w.bf(t - (K_ - 1) + lag);
      if (lag > 0) ifc[lag] = w.fac(t - (K_ - 1) + lag);
    }
    const bool step = t > b0, live = t + delta_ < L_;
    const T* ft = w.fac(t);
    const T* un = live ? w.uf(t + delta_) : nullptr;
    const T* lam = w.lam(t);
    T* z = w.vz(t);
    T* ut = ut_.row(t).data();
    const T* bonus = bonus_.data();
    const T* taps = taps_.data();
    T sums[NA] = {};
    auto run = [&](auto wd, Index i0, Index i1) {
      constexpr int V = decltype(wd)::value;
      using P = Pk<V>;
      P acc[NA];
      for (int d = 0; d < NA; ++d) acc[d] = P::broadcast(T(0));
      for (Index i = i0; i + V <= i1; i += V) {
        const P u = P::load(uf + i);
        P e = P::broadcast(T(1));
        for (int ls = 0; ls < nls; ++ls) {
          if (fc[ls]) e = e * P::load(fc[ls] + i);
          const P sv = u * ((strict_ && ls == 0) ? P::load(bonus + i) : e) * P::load(bf[ls] + i);
          // d = ls + lag < Kb and sp = t - d >= 0
          for (int lag = 0; lag < (KB >= 0 ? KB - ls : int(std::min(Kb, t + 1)) - ls); ++lag)
            acc[ls + lag] = fma(P::load(taps + lag * m_ + i), sv, acc[ls + lag]);
        }
        P zv = P::broadcast(T(0));
        for (int lag = 0; lag < nlag; ++lag) {
          const P tb = P::load(taps + lag * m_ + i) * P::load(ib[lag] + i);
          zv = lag > 0 ? fma(zv, P::load(ifc[lag] + i), tb) : tb;
        }
        zv.store(z + i);
        P fv = P::load(f + i);
        if (step) {
          fv = fv * P::load(ft + i);
          fv.store(f + i);
        }
        (live ? P::load(un + i) * fv : P::broadcast(T(0))).store(ut + i);
        Policy::combine(P::load(decay + i), P::load(lam + i)).store(decay + i);
      }
      for (int d = 0; d < NA; ++d) sums[d] += reduce_add(acc[d]);
    };
    constexpr int W = simd::width<T>;
    const Index iv = m_ / W * W;
    run(std::integral_constant<int, W>{}, 0, iv);
    if constexpr (W > 1) run(std::integral_constant<int, 1>{}, iv, m_);
    for (Index d = 0; d < Kb && d <= t; ++d) outT(t - d, t) += scale_ * sums[d];
  }

  // token_pass for the common form (a log-decay core, not strict, a convolution of fused_width
  // taps, t >= K - 1, whole packs per channel: Mamba-1 and its kin) with fill's work for token t
  // in the same pass: its rows are formed in registers and used there (the taps are one broadcast
  // per channel; the running product f and the block's decay are read and written once), and
  // stored to the window for the next tokens and the diagonal block. Same sums as fill +
  // token_pass<3>, in a different order. Mode: decay_mode(S), fixed for the loop; the loop runs over
  // the inner index i itself, so the window's row pointers stay put from channel to channel (with
  // the pointers offset per channel, g++ 12 spent about 108 instructions a channel on them, 65 now,
  // beside 76 per pack). token_lanes takes the channel-minor layout.
  template <int Mode>
  void token_fused(Index t, Index b0, Matrix<T>& outT, window& w, buffers& bu, T* f, T* decay) {
    constexpr int W = simd::width<T>;
    using P = Pk<W>;
    const auto* S = term_.S;
    const Index c0 = c0_;
    const T* post = term_.post.row(t, D_, c0, dc_, bu.post);
    const T* pre = term_.pre.row(t, D_, c0, dc_, bu.pre);
    const T* B = S->B().row(t);
    const T* C = S->C().row(t);
    const T* lrow = S->lambda().row(t);
    const fused_rows r = rows_of_token(t, b0, w, f, decay);
    const T* taps = taps_.data();
    P acc0 = P::broadcast(T(0)), acc1 = acc0, acc2 = acc0;
    for (Index j = 0; j < dc_; ++j) {
      const Index o = j * N_, h = head_[std::size_t(j)], g = group_[std::size_t(j)];
      const T p = post ? post[j] : T(1), q = pre ? pre[j] : T(1);
      const decay_source src = decay_of(*S, lrow, h, Mode);
      const P k0 = P::broadcast(taps[o]), k1 = P::broadcast(taps[m_ + o]), k2 = P::broadcast(taps[2 * m_ + o]),
              k3 = P::broadcast(taps[3 * m_ + o]);
      const P pp = P::broadcast(p), qq = P::broadcast(q);
      const T* Cg = C + g;
      const T* Bg = B + g;
      for (Index i = o; i < o + N_; i += W) {
        const Index m = i - o;
        fused_pack(r, i, src.template pack_as<Mode, P>(m), pp * P::load(Cg + m), qq * P::load(Bg + m), k0, k1, k2, k3,
                   acc0, acc1, acc2);
      }
    }
    const T sums[3] = {reduce_add(acc0), reduce_add(acc1), reduce_add(acc2)};
    for (Index dg = 0; dg < 3; ++dg) outT(t - dg, t) += scale_ * sums[dg];
  }

  // token_fused with the inner index channel-minor, i = m dc + j (lanes_: every channel its own
  // head, one group of B and C, a decay factored or one per channel, dc a multiple of the pack
  // width): a pack is W channels at one state, so the channels' scalars (dt, the diagonals, the
  // taps) are pack loads and B's and C's entries broadcasts, with no set-up per channel (65
  // instructions a channel beside 76 a pack in the channel-major form at N = 16: two packs a
  // channel). About 2 % of the Mamba-1 mean, not the 40 % fewer instructions of the pass: its time
  // is in its rows' traffic (docs/performance.md, session 46). Mode 0: lambda = dt A (rate_: A at the
  // inner index), 2: lambda = dt.
  template <int Mode>
  void token_lanes(Index t, Index b0, Matrix<T>& outT, window& w, buffers& bu, T* f, T* decay) {
    constexpr int W = simd::width<T>;
    using P = Pk<W>;
    const auto* S = term_.S;
    const lane_rows x = lanes_of_token(t, bu);
    const T *post = x.post, *pre = x.pre, *B = x.B, *C = x.C, *dt = x.dt;
    const T* rate = rate_.data();
    const fused_rows r = rows_of_token(t, b0, w, f, decay);
    if (t + 1 < L_) {  // the next token's (L, D) rows: D entries apart, which the prefetchers miss
      for (const auto* fs : {&term_.post, &term_.pre})
        for (const auto& d : fs->f)
          if (d.rows != 1) prefetch_row(d.data, D_, t + 1, c0_, dc_);
      prefetch_span(S->lambda().row(t + 1) + c0_, dc_);
    }
    const T* taps = taps_.data();
    P acc0 = P::broadcast(T(0)), acc1 = acc0, acc2 = acc0;
    for (Index m = 0; m < N_; ++m) {
      const P cm = P::broadcast(C[m]), bm = P::broadcast(B[m]);
      for (Index j = 0, i = m * dc_; j < dc_; j += W, i += W) {
        P l = P::load(dt + j);
        if constexpr (Mode == 0) l = l * P::load(rate + i);
        fused_pack(r, i, l, P::load(post + j) * cm, P::load(pre + j) * bm, P::load(taps + i), P::load(taps + m_ + i),
                   P::load(taps + 2 * m_ + i), P::load(taps + 3 * m_ + i), acc0, acc1, acc2);
      }
    }
    const T sums[3] = {reduce_add(acc0), reduce_add(acc1), reduce_add(acc2)};
    for (Index dg = 0; dg < 3; ++dg) outT(t - dg, t) += scale_ * sums[dg];
  }

  // The rows token t's fused pass writes (lam only at the block's first token: only that row is
  // read, into lam0_), and those of the three tokens before it that it reads.
  struct fused_rows {
    T *lam, *fac, *uf, *bf, *z, *ut, *f, *decay;
    const T *fac1, *fac2, *bf1, *bf2, *bf3;
    bool step;
  };
  fused_rows rows_of_token(Index t, Index b0, window& w, T* f, T* decay) {
    return {t == b0 ? w.lam(t) : nullptr, w.fac(t), w.uf(t), w.bf(t), w.vz(t), ut_.row(t).data(), f, decay,
            w.fac(t - 1), w.fac(t - 2), w.bf(t - 1), w.bf(t - 2), w.bf(t - 3), t > b0};
  }

  // One pack of the fused pass at inner index i: the log-decay l, the left and right factors u = P C
  // and b0v = Q B and the channel's four taps k0 .. k3 given; the factor and the rows to the window,
  // the band's three sums, the injection by Horner from the oldest lag, ut, f and the block's decay.
  template <class P>
  [[gnu::always_inline]] static inline void fused_pack(const fused_rows& r, Index i, P l, P u, P b0v, P k0, P k1,
                                                       P k2, P k3, P& acc0, P& acc1, P& acc2) {
    if (r.lam) l.store(r.lam + i);
    const P e1 = log_decay::factor(l);  // E(t .. t): the factor joining lag 1
    e1.store(r.fac + i);
    u.store(r.uf + i);
    b0v.store(r.bf + i);
    const P f1 = P::load(r.fac1 + i), b1v = P::load(r.bf1 + i), b2v = P::load(r.bf2 + i);
    // the band: d = ls + lag < 3, sv_ls = u E(t-ls+1 .. t) B[t-ls]
    const P e2 = e1 * f1;
    const P s0 = u * b0v, s1 = u * e1 * b1v, s2 = u * e2 * b2v;
    acc0 = fma(k0, s0, acc0);
    acc1 = fma(k1, s0, fma(k0, s1, acc1));
    acc2 = fma(k2, s0, fma(k1, s1, fma(k0, s2, acc2)));
    // the injection at t, by Horner from the oldest lag
    P zv = k0 * P::load(r.bf3 + i);
    zv = fma(zv, P::load(r.fac2 + i), k1 * b2v);
    zv = fma(zv, f1, k2 * b1v);
    zv = fma(zv, e1, k3 * b0v);
    zv.store(r.z + i);
    P fv = P::load(r.f + i);
    if (r.step) {
      fv = fv * e1;
      fv.store(r.f + i);
    }
    (u * fv).store(r.ut + i);
    (P::load(r.decay + i) + l).store(r.decay + i);
  }

  // dst row t - t0 = U[t] E(t0+1 .. t) for t in [t0, t1) (zero past the output), f the running product
  // of at most mean_block per-token factors.
  void refer_forward(Index t0, Index t1, T* dst, Index ld, T* f, window& w) const {
    std::fill(f, f + m_, T(1));
    for (Index t = t0; t < t1; ++t) {
      T* d = dst + (t - t0) * ld;
      if (t > t0) multiply(f, w.fac(t));
      if (t + delta_ < L_) {
        const T* u = w.uf(t + delta_);
        for (Index i = 0; i < m_; ++i) d[i] = u[i] * f[i];
      } else {
        std::fill(d, d + m_, T(0));
      }
    }
  }
  // dst row s - a = z_s f E(s+1 .. e-1) for s in [a, e), backwards; f holds the factor at e on entry.
  // With g: dst2 row s - a = that row times g too.
  void refer_backward(Index a, Index e, T* dst, Index ld, T* f, window& w, T* dst2 = nullptr,
                      const T* g = nullptr) const {
    for (Index s = e - 1; s >= a; --s) {
      const T* z = w.vz(s);
      T* d = dst + (s - a) * ld;
      if (g) {
        T* d2 = dst2 + (s - a) * ld;
        for (Index i = 0; i < m_; ++i) {
          d[i] = z[i] * f[i];
          d2[i] = d[i] * g[i];
        }
      } else {
        for (Index i = 0; i < m_; ++i) d[i] = z[i] * f[i];
      }
      multiply(f, w.fac(s));
    }
  }

  void multiply(T* acc, const T* fac) const {
    simd::for_packs<T>(m_, [&](auto w, Index i) {
      using P = Pk<decltype(w)::value>;
      (P::load(acc + i) * P::load(fac + i)).store(acc + i);
    });
  }

  void combine(T* acc, const T* d) const {
    simd::for_packs<T>(m_, [&](auto w, Index i) {
      using P = Pk<decltype(w)::value>;
      Policy::combine(P::load(acc + i), P::load(d + i)).store(acc + i);
    });
  }

  buffers& local() { return bufs_[std::min(std::size_t(thread_index()), bufs_.size() - 1)]; }

  // outT[sigma-K+1, t'+delta] += scale (U V^T)[t', sigma] for t' in [r0, r0+nr), sigma in
  // [q0, q0+nq), U given packed (gemm_pack_a of its nr rows), V row-major with row stride ld; rows
  // past the output and columns before K-1 are left out.
  void product(Matrix<T>& outT, const T* up, Index r0, Index nr, const T* V, Index q0, Index nq, Index ld) const {
    const Index rows = std::min(nr, L_ - delta_ - r0);
    const Index cut = std::max<Index>(0, (K_ - 1) - q0);
    if (rows <= 0 || nq - cut <= 0) return;
    T* dst = outT.data() + (q0 + cut - (K_ - 1)) * L_ + (r0 + delta_);
    gemm_tile_add(rows, nq - cut, m_, up, gemm_mr<T> * m_, V + cut * ld, ld, dst, L_, scale_);
  }

  // ws rows [0, mean_block) = Vt_J's rows scaled by f (the decay between J and the row block).
  void scale_rows(T* ws, Index J, const T* f) const {
    const Index j0 = J * mean_block, M = ut_.cols();
    for (Index s = j0; s < j0 + mean_block; ++s) {
      const T* vt = vt_.row(s).data();
      T* w = ws + (s - j0) * M;
      simd::for_packs<T>(m_, [&](auto wd, Index i) {
        using P = Pk<decltype(wd)::value>;
        (P::load(vt + i) * P::load(f + i)).store(w + i);
      });
    }
  }

  // Row blocks [I, I1) of G together. First each block's pairs inside the group, against its own
  // panels; then each block a > I's packed rows take the rest of its decay beyond block I's,
  // E(i0+1 .. i0_a) = the product over the blocks J in [I, a) of J's running product (tail_) and
  // the first factor of J + 1 (no log-decay differenced), so that for every J < I one copy of Vt_J
  // scaled by E(j1 .. i0) serves the products of all the group's rows.
  void row_group(Index I, Index I1, Matrix<T>& outT) {
    static_assert(mean_block % gemm_mr<T> == 0, "a row block is whole panels");
    const Index i0 = I * mean_block, i1 = std::min(L_, I1 * mean_block), M = ut_.cols();
    buffers& b = local();
    T* acc = sized(b.acc, m_);
    T* f = sized(b.f, m_);
    T* up = sized(b.up, gemm_padded_rows<T>(i1 - i0) * m_);
    gemm_pack_a(ut_.row(i0).data(), M, i1 - i0, m_, up);
    T* ws = sized(b.ws, mean_block * M);
    auto panels = [&](Index a) { return up + (a - I) * mean_block * m_; };  // block a's packed rows
    auto rows = [&](Index a) { return std::min(L_, (a + 1) * mean_block) - a * mean_block; };
    // Rows [r0, r0 + nr) (packed at pk, referred to their block's first token, block A's) against
    // column blocks J = A-1 down to J0, each scaled by E(j1 .. first token of A).
    auto sweep = [&](Index A, Index J0, const T* pk, Index r0, Index nr) {
      std::copy(lam0_.row(A).data(), lam0_.row(A).data() + m_, acc);  // E(j1 .. i0_A) for J = A-1
      for (Index J = A - 1; J >= J0; --J) {
        factor_row(acc, f);
        scale_rows(ws, J, f);
        product(outT, pk, r0, nr, ws, J * mean_block, mean_block, M);
        combine(acc, blk_.row(J).data());
      }
    };
    for (Index a = I + 1; a < I1; ++a) sweep(a, I, panels(a), a * mean_block, rows(a));
    std::fill(f, f + m_, T(1));
    for (Index a = I + 1; a < I1; ++a) {
      factor_row(lam0_.row(a).data(), acc);
      const T* tail = tail_.row(a - 1).data();
      for (Index i = 0; i < m_; ++i) f[i] *= tail[i] * acc[i];  // E(i0+1 .. i0_a)
      gemm_scale_packed(panels(a), rows(a), m_, f);
    }
    sweep(I, 0, up, i0, i1 - i0);
  }

  // acc *= ft (none: unchanged), then returns u . acc, in one pass with four partial sums (the
  // dot products of the leaves are too short to hide one add chain's latency).
  T leaf_step(T* acc, const T* ft, const T* u) const {
    constexpr Index W = simd::width<T>;
    using P = Pk<int(W)>;
    P s[4] = {P::broadcast(T(0)), P::broadcast(T(0)), P::broadcast(T(0)), P::broadcast(T(0))};
    Index i = 0;
    for (; i + 4 * W <= m_; i += 4 * W)
      for (int k = 0; k < 4; ++k) {
        P x = P::load(acc + i + k * W);
        if (ft) {
          x = x * P::load(ft + i + k * W);
          x.store(acc + i + k * W);
        }
        s[k] = fma(P::load(u + i + k * W), x, s[k]);
      }
    T r = reduce_add((s[0] + s[1]) + (s[2] + s[3]));
    for (; i < m_; ++i) {
      if (ft) acc[i] *= ft[i];
      r += u[i] * acc[i];
    }
    return r;
  }

  // Tokens before the split of a diagonal block of n > 8 tokens: a multiple of 8, half or just over.
  static Index diagonal_split(Index n) { return (n + 15) / 16 * 8; }

  // G[t', sigma] for a <= sigma <= t' < e: split in two, the lower-left quadrant a GEMM with both
  // sides referred to the split point, each half recursively; 8 tokens or fewer directly. With g
  // (the token block's own block, split): vt rows [a, mid) = the referral of those tokens to mid
  // times g = E(mid+1 .. e-1) (token_block).
  void diagonal_block(Index a, Index e, Matrix<T>& outT, buffers& b, window& w, const T* g = nullptr) {
    const Index n = e - a, M = ut_.cols();
    T* acc = sized(b.acc, m_);
    T* f = sized(b.f, m_);
    if (n <= 8) {
      for (Index sigma = std::max(a, K_ - 1); sigma < e; ++sigma) {
        std::copy(w.vz(sigma), w.vz(sigma) + m_, acc);
        for (Index tp = sigma; tp < e && tp + delta_ < L_; ++tp)
          outT(sigma - (K_ - 1), tp + delta_) += scale_ * leaf_step(acc, tp > sigma ? w.fac(tp) : nullptr, w.uf(tp + delta_));
      }
      return;
    }
    const Index h = diagonal_split(n), mid = a + h;
    T* ur = sized(b.ws, (e - mid) * M);
    T* vp = sized(b.vp, h * M);
    // ur[t'] = U[t'] E(mid+1 .. t'); vp[sigma] = z_sigma E(sigma+1 .. mid)
    refer_forward(mid, e, ur, M, f, w);
    std::copy(w.fac(mid), w.fac(mid) + m_, f);
    refer_backward(a, mid, vp, M, f, w, g ? vt_.row(a).data() : nullptr, g);
    T* up = sized(b.up, gemm_padded_rows<T>(e - mid) * m_);
    gemm_pack_a(ur, M, e - mid, m_, up);
    product(outT, up, mid, e - mid, vp, a, h, M);
    diagonal_block(a, mid, outT, b, w);
    diagonal_block(mid, e, outT, b, w);
  }

  const mean_term<T>& term_;
  Index L_, D_, cb_, ce_, N_, K_, Dc_, c0_ = 0, dc_ = 0, m_ = 0, delta_;
  std::vector<Index> head_, group_;  // per channel of the chunk: its head, its group's first column
  bool strict_, fused_ = false;
  bool lanes_ok_ = false, lanes_ = false;  // the channel-minor layout: possible for the term, taken in this chunk
  T scale_;
  Matrix<T> ut_, vt_, blk_, lam0_, tail_;  // ut, vt (L, M); per token block: its whole decay, its
                                         // first lam, the running product of its other factors
  std::vector<T> taps_, bonus_;  // (K, m) convolution taps and (m) bonus of the current chunk
  std::vector<T> ones_, rate_;   // with lanes_: dc ones (a diagonal that is none), A at the inner index
  std::vector<buffers> bufs_;
};

/// A term without a core: diag(post) * [conv], a band of width K; the mean over channels [cb, ce).
template <class T>
void mean_band_term(const mean_term<T>& term, const context& cx, Matrix<T>& out, Index cb = 0, Index ce = any) {
  if (ce == any) ce = cx.D;
  const Index K = term.conv ? term.conv->width() : 1;
  const T scale = T(term.weight / double(ce - cb));
  std::vector<std::vector<T>> rows(static_cast<std::size_t>(max_threads()));
  parallel_for(cx.L, [&](Index t) {
    const T* p = term.post.row(t, cx.D, cb, ce - cb, rows[std::min(std::size_t(thread_index()), rows.size() - 1)]);
    for (Index lag = 0; lag < K && lag <= t; ++lag) {
      // sum_c post[t, c] tap(lag, c): tap(lag, .) is row K-1-lag of the (K, D) weight
      const T* w = term.conv ? term.conv->w().row(K - 1 - lag) + cb : nullptr;
      const T v = !p && !w ? T(ce - cb) : simd::sum_packs<T>(ce - cb, [&](auto wd, Index i) {
        using P = simd::pack<T, decltype(wd)::value>;
        return p && w ? P::load(p + i) * P::load(w + i) : P::load(p ? p + i : w + i);
      });
      out(t, t - lag) += scale * v;
    }
  });
}

/// The channel mean of a sum of terms over channels [cb, ce) (default: all), (L, L). The terms with
/// a core add their means transposed (their products' packs run along the output's columns), so
/// those go first, then one transposition.
/// HasS / HasR: whether the expression contains a Semiseparable / a LinearRecurrence at all, so a
/// translation unit compiles only the core kinds its expressions have (each mean_core_term kind is
/// several large kernels; issue 19 part 5).
template <class T, bool HasS = true, bool HasR = true>
Matrix<T> mean_of_terms(const mean_terms<T>& terms, const context& cx, Index cb = 0, Index ce = any) {
  Matrix<T> out = Matrix<T>::Zero(cx.L, cx.L);
  if (cx.L == 0 || cx.D == 0) return out;
  bool cores = false;
  for (const auto& term : terms) {
    if constexpr (HasS)
      if (term.S) mean_core_term<T, log_decay>(term, cx, cb, ce).accumulate(out);
    if constexpr (HasR)
      if (!term.S && term.R) mean_core_term<T, linear_decay>(term, cx, cb, ce).accumulate(out);
    cores = cores || term.has_core();
  }
  if (cores) out.transposeInPlace();  // square: Eigen swaps in place (4x faster than a blocked loop of ours)
  for (const auto& term : terms)
    if (!term.has_core()) mean_band_term(term, cx, out, cb, ce);
  return out;
}

}  // namespace iattn::cpu_detail
