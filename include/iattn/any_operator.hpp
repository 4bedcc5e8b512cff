// iattn/any_operator.hpp: AnyOperator<T>, an operator whose type is decided at run time.
//
// erase(H) hides an expression's type behind one class, so that expressions built at run time (the
// Python package's operators, a model chosen by name) share one type. AnyOperator is an operator
// node like any other: it composes with *, +, flip, row_normalize and scalars, and every evaluation
// function takes it.
//
// What it costs (docs/operators.md "Type erasure", measured by bench/any_operator_bench.cpp):
// - Evaluating an erased expression (apply, materialize, the means, row, col, block, bind) forwards
//   through one virtual call to the concrete expression's own evaluator: the same kernels, the same
//   structured paths, no copies.
// - Composing erased operands loses the compile-time structure the product rewrites key on. The
//   structure is kept at run time instead (lower, upper, band width, head_dim), and a product of two
//   erased operands takes the same rewrites by run-time dispatch: diagonal factors fold into
//   row/column scalings, a band on either side becomes a banded correlation, anything else is a dense
//   tile product over the inner range the structure allows. What is lost: apply chains no longer fuse
//   into one streaming pass (each factor runs on the slab in turn), and the means of erased
//   compositions take the per-channel tile path (no (channel, state) GEMMs, no head cores).
#pragma once

#include "evaluate.hpp"
#include "iattn.hpp"

#include <memory>
#include <string>
#include <type_traits>
#include <utility>

namespace iattn {

template <Scalar T>
class AnyOperator;

namespace detail {

/// Structure known at run time: what is_lower_v / is_upper_v / is_band_v / band_width / head_dim_of
/// say of the concrete expression.
struct any_structure {
  bool lower = false, upper = false;
  Index band = 0;      ///< width of a lower band (1: diagonal), 0: not a band
  Index head_dim = 0;  ///< P of its heads, 0: none, -1: disagreeing
  bool diagonal() const { return lower && upper; }
};

template <class Node>
any_structure structure_of(const Node& n);

/// One channel's tile evaluator behind a virtual call.
template <Scalar T>
struct any_channel {
  virtual ~any_channel() = default;
  virtual void block(Index i0, Index i1, Index j0, Index j1, cpu_detail::tile<T> out) const = 0;
  virtual T diag(Index t) const = 0;  ///< only for a diagonal operator
};

template <Scalar T>
struct any_concept {
  virtual ~any_concept() = default;
  virtual Index length() const = 0;
  virtual Index channels() const = 0;
  virtual bool bound() const = 0;
  virtual const any_structure& structure() const = 0;
  // as a node inside another expression
  virtual Matrix<T> apply_full(const cpu_detail::context& cx, const Matrix<T>& X) const = 0;
  virtual std::shared_ptr<const any_concept> bind(const cpu_detail::context& cx, const Matrix<T>& X) const = 0;
  virtual void slab(const cpu_detail::context& cx, Index c0, Index nc, const T* x, T* y, bool transposed) const = 0;
  virtual std::unique_ptr<any_channel<T>> channel(const cpu_detail::context& cx, Index c) const = 0;
  // as the whole expression: the concrete front-end, with its checks and its fastest paths
  virtual Matrix<T> apply(const Matrix<T>& X) const = 0;
  virtual void apply_into(Matrix<T>& Y, const Matrix<T>& X) const = 0;
  virtual Matrix<T> materialize(Index c, Index L) const = 0;
  virtual void materialize_into(Matrix<T>& out, Index c, Index L) const = 0;
  virtual Matrix<T> mean(const mean_options& o, Index L) const = 0;
  virtual Tensor3<T> head_means(const mean_options& o, Index L) const = 0;
  virtual void materialize_all_into(Tensor3<T>& out, Index L) const = 0;
  virtual Tensor3<T> materialize_all(Index L) const = 0;
  virtual Matrix<T> row(Index t, Index L) const = 0;
  virtual Matrix<T> col(Index s, Index L) const = 0;
  virtual void row_into(Matrix<T>& out, Index t, Index L) const = 0;
  virtual void col_into(Matrix<T>& out, Index s, Index L) const = 0;
  virtual Matrix<T> block(Index c, range rows, range cols, Index L) const = 0;
};

template <Scalar T, class H>
struct any_channel_model final : any_channel<T> {
  cpu_detail::channel_eval<H, T> ev;
  any_channel_model(const H& h, const cpu_detail::context& cx, Index c) : ev(h, cx, c) {}
  void block(Index i0, Index i1, Index j0, Index j1, cpu_detail::tile<T> out) const override {
    cpu_detail::structured_block(ev, i0, i1, j0, j1, out);
  }
  T diag(Index t) const override {
    if constexpr (is_diagonal_v<H>) return ev.diag(t);
    else fail("AnyOperator", "diag() of an operator that is not diagonal");  // unreachable: callers check
  }
};

template <Scalar T, class H>
struct any_model final : any_concept<T> {
  H h;
  any_structure s;
  explicit any_model(H e) : h(std::move(e)), s(structure_of(h)) {}

  Index length() const override { return h.length(); }
  Index channels() const override { return h.channels(); }
  bool bound() const override { return cpu_detail::is_bound(h); }
  const any_structure& structure() const override { return s; }

  Matrix<T> apply_full(const cpu_detail::context& cx, const Matrix<T>& X) const override {
    return cpu_detail::apply_full(h, cx, X);
  }
  std::shared_ptr<const any_concept<T>> bind(const cpu_detail::context& cx, const Matrix<T>& X) const override {
    return std::make_shared<any_model<T, H>>(cpu_detail::bind_node(h, cx, X));
  }
  void slab(const cpu_detail::context& cx, Index c0, Index nc, const T* x, T* y, bool transposed) const override {
    if (transposed) cpu_detail::slab_eval<H>::apply_t(h, cx, c0, nc, x, y);
    else cpu_detail::slab_eval<H>::apply(h, cx, c0, nc, x, y);
  }
  std::unique_ptr<any_channel<T>> channel(const cpu_detail::context& cx, Index c) const override {
    return std::make_unique<any_channel_model<T, H>>(h, cx, c);
  }

  Matrix<T> apply(const Matrix<T>& X) const override { return iattn::apply(h, X); }
  void apply_into(Matrix<T>& Y, const Matrix<T>& X) const override { iattn::apply_into(Y, h, X); }
  Matrix<T> materialize(Index c, Index L) const override { return iattn::materialize(h, c, L); }
  void materialize_into(Matrix<T>& out, Index c, Index L) const override { iattn::materialize_into(out, h, c, L); }
  Matrix<T> mean(const mean_options& o, Index L) const override { return iattn::materialize_mean(h, o, L); }
  Tensor3<T> head_means(const mean_options& o, Index L) const override { return iattn::materialize_head_means(h, o, L); }
  void materialize_all_into(Tensor3<T>& out, Index L) const override { iattn::materialize_all_into(out, h, L); }
  Tensor3<T> materialize_all(Index L) const override { return iattn::materialize_all(h, L); }
  Matrix<T> row(Index t, Index L) const override { return iattn::row(h, t, L); }
  Matrix<T> col(Index s, Index L) const override { return iattn::col(h, s, L); }
  void row_into(Matrix<T>& out, Index t, Index L) const override { iattn::row_into(out, h, t, L); }
  void col_into(Matrix<T>& out, Index s, Index L) const override { iattn::col_into(out, h, s, L); }
  Matrix<T> block(Index c, range rows, range cols, Index L) const override { return iattn::block(h, c, rows, cols, L); }
};

}  // namespace detail

/// An operator of any expression type with scalar T (see the top of this file). Copies share the
/// (immutable) expression.
template <Scalar T>
class AnyOperator : public op_base {
 public:
  using scalar = T;

  template <Operator H>
    requires(!std::is_same_v<std::remove_cvref_t<H>, AnyOperator>)
  explicit AnyOperator(H&& h) {
    using E = std::remove_cvref_t<H>;
    static_assert(std::is_same_v<typename E::scalar, T>,
                  "erase: the expression's scalar type must be T (the identity alone has none: scale it)");
    p_ = std::make_shared<const detail::any_model<T, E>>(std::forward<H>(h));
  }
  explicit AnyOperator(std::shared_ptr<const detail::any_concept<T>> p) : p_(std::move(p)) {}

  Index length() const { return p_->length(); }
  Index channels() const { return p_->channels(); }
  /// No GroupNorm waits for its statistics (bind(H, X) fixes them).
  bool bound() const { return p_->bound(); }
  const detail::any_structure& structure() const { return p_->structure(); }
  Index erased_head_dim() const { return p_->structure().head_dim; }
  const detail::any_concept<T>& concept_() const { return *p_; }

  // The node interface of backend/cpu/bind.hpp, found by argument-dependent lookup.
  friend bool is_bound(const AnyOperator& a) { return a.bound(); }
  friend Matrix<T> apply_full(const AnyOperator& a, const cpu_detail::context& cx, const Matrix<T>& X) {
    return a.p_->apply_full(cx, X);
  }
  friend AnyOperator bind_node(const AnyOperator& a, const cpu_detail::context& cx, const Matrix<T>& X) {
    if (a.bound()) return a;
    return AnyOperator(a.p_->bind(cx, X));
  }

 private:
  std::shared_ptr<const detail::any_concept<T>> p_;
};

template <class T>
inline constexpr bool has_group_norm_v<AnyOperator<T>> = true;  // known at run time: bound()

/// H with its type erased: AnyOperator<scalar of H>. erase(AnyOperator) returns it unchanged.
template <Operator H>
auto erase(H&& h) {
  using E = std::remove_cvref_t<H>;
  if constexpr (requires { typename E::scalar; } && std::is_same_v<E, AnyOperator<typename E::scalar>>) return E(std::forward<H>(h));
  else return AnyOperator<typename E::scalar>(std::forward<H>(h));
}

namespace detail {

template <class Node>
any_structure structure_of(const Node& n) {
  any_structure s;
  if constexpr (std::is_same_v<Node, AnyOperator<typename Node::scalar>>) {
    return n.structure();
  } else if constexpr (requires { n.left(); n.right(); }) {
    const any_structure a = structure_of(n.left()), b = structure_of(n.right());
    constexpr bool product = cpu_detail::is_product_node<Node>::value;
    s.lower = a.lower && b.lower;
    s.upper = a.upper && b.upper;
    if (a.band > 0 && b.band > 0) s.band = product ? a.band + b.band - 1 : std::max(a.band, b.band);
    s.head_dim = a.head_dim == 0 ? b.head_dim : b.head_dim == 0 ? a.head_dim : a.head_dim == b.head_dim ? a.head_dim : -1;
    return s;
  } else if constexpr (cpu_detail::is_scaled_node<Node>::value) {
    return structure_of(n.inner());
  } else if constexpr (requires { n.inner(); }) {  // Flip mirrors the structure; RowNormalize keeps it
    s = structure_of(n.inner());
    if constexpr (std::is_same_v<Node, Flip<std::remove_cvref_t<decltype(n.inner())>>>) {
      std::swap(s.lower, s.upper);
      s.band = 0;  // an upper band now
    }
    return s;
  } else {
    s.lower = is_lower_v<Node>;
    s.upper = is_upper_v<Node>;
    if constexpr (is_band_v<Node>) s.band = cpu_detail::band_width(n);
    s.head_dim = cpu_detail::head_dim_of(n);
    return s;
  }
}

}  // namespace detail

// ---- the evaluation functions on an erased expression: one virtual call to the concrete ones ------

template <Scalar T, class XD>
Matrix<T> apply(cpu, const AnyOperator<T>& h, const Eigen::MatrixBase<XD>& X) {
  static_assert(std::is_same_v<T, typename XD::Scalar>, "apply: X must have the expression's scalar type");
  return h.concept_().apply(X.derived());
}
template <Scalar T, class XD>
Matrix<T> apply(const AnyOperator<T>& h, const Eigen::MatrixBase<XD>& X) {
  return apply(cpu{}, h, X);
}
template <Scalar T, class XD>
void apply_into(cpu, Matrix<T>& Y, const AnyOperator<T>& h, const Eigen::MatrixBase<XD>& X) {
  static_assert(std::is_same_v<T, typename XD::Scalar>, "apply_into: X must have the expression's scalar type");
  h.concept_().apply_into(Y, X.derived());
}
template <Scalar T, class XD>
void apply_into(Matrix<T>& Y, const AnyOperator<T>& h, const Eigen::MatrixBase<XD>& X) {
  apply_into(cpu{}, Y, h, X);
}
template <Scalar T, class XD>
AnyOperator<T> bind(cpu, const AnyOperator<T>& h, const Eigen::MatrixBase<XD>& X) {
  static_assert(std::is_same_v<T, typename XD::Scalar>, "bind: X must have the expression's scalar type");
  detail::check_input(h, X.rows(), X.cols(), "bind", "X");
  const Matrix<T>& x = X.derived();
  return bind_node(h, cpu_detail::context{x.rows(), x.cols()}, x);
}
template <Scalar T, class XD>
AnyOperator<T> bind(const AnyOperator<T>& h, const Eigen::MatrixBase<XD>& X) {
  return bind(cpu{}, h, X);
}
template <Scalar T>
Matrix<T> materialize(cpu, const AnyOperator<T>& h, Index c, Index L = any) {
  return h.concept_().materialize(c, L);
}
template <Scalar T>
Matrix<T> materialize(const AnyOperator<T>& h, Index c, Index L = any) {
  return materialize(cpu{}, h, c, L);
}
template <Scalar T>
void materialize_into(cpu, Matrix<T>& out, const AnyOperator<T>& h, Index c, Index L = any) {
  h.concept_().materialize_into(out, c, L);
}
template <Scalar T>
void materialize_into(Matrix<T>& out, const AnyOperator<T>& h, Index c, Index L = any) {
  h.concept_().materialize_into(out, c, L);
}
template <Scalar T>
Matrix<T> materialize_mean(cpu, const AnyOperator<T>& h, const mean_options& o, Index L = any) {
  return h.concept_().mean(o, L);
}
template <Scalar T>
Matrix<T> materialize_mean(const AnyOperator<T>& h, const mean_options& o, Index L = any) {
  return h.concept_().mean(o, L);
}
template <Scalar T>
Matrix<T> materialize_mean(cpu, const AnyOperator<T>& h, Index L = any) {
  return h.concept_().mean({}, L);
}
template <Scalar T>
Matrix<T> materialize_mean(const AnyOperator<T>& h, Index L = any) {
  return h.concept_().mean({}, L);
}
template <Scalar T>
Tensor3<T> materialize_head_means(cpu, const AnyOperator<T>& h, const mean_options& o = {}, Index L = any) {
  return h.concept_().head_means(o, L);
}
template <Scalar T>
Tensor3<T> materialize_head_means(const AnyOperator<T>& h, const mean_options& o = {}, Index L = any) {
  return h.concept_().head_means(o, L);
}
template <Scalar T>
void materialize_all_into(cpu, Tensor3<T>& out, const AnyOperator<T>& h, Index L = any) {
  h.concept_().materialize_all_into(out, L);
}
template <Scalar T>
void materialize_all_into(Tensor3<T>& out, const AnyOperator<T>& h, Index L = any) {
  h.concept_().materialize_all_into(out, L);
}
template <Scalar T>
Tensor3<T> materialize_all(cpu, const AnyOperator<T>& h, Index L = any) {
  return h.concept_().materialize_all(L);
}
template <Scalar T>
Tensor3<T> materialize_all(const AnyOperator<T>& h, Index L = any) {
  return materialize_all(cpu{}, h, L);
}
template <Scalar T>
void row_into(cpu, Matrix<T>& out, const AnyOperator<T>& h, Index t, Index L = any) {
  h.concept_().row_into(out, t, L);
}
template <Scalar T>
void row_into(Matrix<T>& out, const AnyOperator<T>& h, Index t, Index L = any) {
  h.concept_().row_into(out, t, L);
}
template <Scalar T>
Matrix<T> row(cpu, const AnyOperator<T>& h, Index t, Index L = any) {
  return h.concept_().row(t, L);
}
template <Scalar T>
Matrix<T> row(const AnyOperator<T>& h, Index t, Index L = any) {
  return row(cpu{}, h, t, L);
}
template <Scalar T>
void col_into(cpu, Matrix<T>& out, const AnyOperator<T>& h, Index s, Index L = any) {
  h.concept_().col_into(out, s, L);
}
template <Scalar T>
void col_into(Matrix<T>& out, const AnyOperator<T>& h, Index s, Index L = any) {
  h.concept_().col_into(out, s, L);
}
template <Scalar T>
Matrix<T> col(cpu, const AnyOperator<T>& h, Index s, Index L = any) {
  return h.concept_().col(s, L);
}
template <Scalar T>
Matrix<T> col(const AnyOperator<T>& h, Index s, Index L = any) {
  return col(cpu{}, h, s, L);
}
template <Scalar T>
Matrix<T> block(cpu, const AnyOperator<T>& h, Index c, range rows, range cols, Index L = any) {
  return h.concept_().block(c, rows, cols, L);
}
template <Scalar T>
Matrix<T> block(const AnyOperator<T>& h, Index c, range rows, range cols, Index L = any) {
  return h.concept_().block(c, rows, cols, L);
}

}  // namespace iattn

// ---- AnyOperator as a node inside another expression ----------------------------------------------
namespace iattn::cpu_detail {

template <class T>
struct slab_eval<AnyOperator<T>> {
  static void apply(const AnyOperator<T>& n, const context& cx, Index c0, Index nc, const T* x, T* y) {
    n.concept_().slab(cx, c0, nc, x, y, false);
  }
  static void apply_t(const AnyOperator<T>& n, const context& cx, Index c0, Index nc, const T* x, T* y) {
    n.concept_().slab(cx, c0, nc, x, y, true);
  }
};

template <class T>
struct channel_eval<AnyOperator<T>, T> {
  std::unique_ptr<detail::any_channel<T>> ev;
  channel_eval(const AnyOperator<T>& n, const context& cx, Index c) : ev(n.concept_().channel(cx, c)) {}
  T diag(Index t) const { return ev->diag(t); }
  void block(Index i0, Index i1, Index j0, Index j1, tile<T> out) const { ev->block(i0, i1, j0, j1, out); }
};

/// A product of two erased operands: product.hpp's rewrites, chosen by the run-time structure.
template <class T>
struct channel_eval<Product<AnyOperator<T>, AnyOperator<T>>, T> {
  channel_eval<AnyOperator<T>, T> a, b;
  detail::any_structure sa, sb;
  Index L;

  channel_eval(const Product<AnyOperator<T>, AnyOperator<T>>& n, const context& cx, Index c)
      : a(n.left(), cx, c), b(n.right(), cx, c), sa(n.left().structure()), sb(n.right().structure()), L(cx.L) {}

  T diag(Index t) const { return a.diag(t) * b.diag(t); }

  void block(Index i0, Index i1, Index j0, Index j1, tile<T> out) const {
    if ((sa.lower && sb.lower && j0 >= i1) || (sa.upper && sb.upper && i0 >= j1)) {
      out.set_zero();
    } else if (sa.diagonal() && sb.diagonal()) {
      diagonal_block(*this, i0, i1, j0, j1, out);
    } else if (sa.diagonal()) {
      b.block(i0, i1, j0, j1, out);
      for (Index i = 0; i < out.rows; ++i) {
        const T d = a.diag(i0 + i);
        for (Index j = 0; j < out.cols; ++j) out(i, j) *= d;
      }
    } else if (sb.diagonal()) {
      a.block(i0, i1, j0, j1, out);
      std::vector<T> e(static_cast<std::size_t>(out.cols));
      for (Index j = 0; j < out.cols; ++j) e[std::size_t(j)] = b.diag(j0 + j);
      for (Index i = 0; i < out.rows; ++i)
        for (Index j = 0; j < out.cols; ++j) out(i, j) *= e[std::size_t(j)];
    } else if (sb.band > 0) {
      band_right(i0, i1, j0, j1, out);
    } else if (sa.band > 0) {
      band_left(i0, i1, j0, j1, out);
    } else {
      dense(i0, i1, j0, j1, out);
    }
  }

 private:
  void band_right(Index i0, Index i1, Index j0, Index j1, tile<T> out) const {
    band_right_product<T>(a, b, sb.band, sa.lower, L, i0, i1, j0, j1, out);
  }
  void band_left(Index i0, Index i1, Index j0, Index j1, tile<T> out) const {
    band_left_product<T>(a, b, sa.band, sb.lower, i0, i1, j0, j1, out);
  }
  void dense(Index i0, Index i1, Index j0, Index j1, tile<T> out) const {
    dense_product<T>(a, b, {sa.lower, sa.upper, sb.lower, sb.upper}, L, i0, i1, j0, j1, out);
  }
};

}  // namespace iattn::cpu_detail
