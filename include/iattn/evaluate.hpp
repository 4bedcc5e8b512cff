// iattn/evaluate.hpp: the ways to evaluate an expression H (docs/design.md section 3).
//
//   apply(H, X)                 Y = H X, (L, D), O(L*D*N); never forms an L x L matrix
//   materialize(H, c)           H^c, (L, L), by stable blocked rank-N tiles
//   materialize_mean(H)         mean over channels of H^c, (L, L), no per-channel L x L temporaries
//   materialize_mean(H, opts)   mean of H^c or |H^c| over all channels, one head's, or a range
//   materialize_head_means(H)   every head's mean, Tensor3 (heads, L, L)
//   materialize_all(H)          every channel's H^c, Tensor3 (D, L, L); materialize_all_into(out, H)
//   row(H, t), col(H, s)        row t / column s of every channel's matrix, (D, L), O(L*D*N)
//   block(H, c, rows, cols)     a tile of H^c, for L too large to materialize
//   apply_into(Y, H, X), materialize_into(out, H, c), row_into(out, H, t), col_into(out, H, s):
//                               the same results written into the caller's matrix (resized only
//                               when its shape differs): repeated calls allocate nothing and pay
//                               no first-touch page faults
//   bind(H, X)                  H with every GroupNorm's statistics fixed from the forward pass on X
//
// Each takes an optional backend tag first (`apply(iattn::cpu{}, H, X)`; cpu is the default).
// An expression without a fixed length (only convolutions, constant diagonals, the identity) takes
// L as a trailing argument: materialize(H, c, L). Bad arguments throw std::invalid_argument naming
// the argument, its shape and the expected one.
#pragma once

#include "backend/cpu/evaluate.hpp"
#include "core/backend.hpp"
#include "core/error.hpp"
#include "core/means.hpp"
#include "core/tensor3.hpp"
#include "core/traits.hpp"

#include <optional>
#include <string>
#include <type_traits>

namespace iattn {

namespace detail {

template <class H, class XS>
using eval_scalar_t = std::conditional_t<std::is_void_v<typename H::scalar>, XS, typename H::scalar>;

template <class H>
void require_bound(const H& h, const char* where) {
  if (!cpu_detail::is_bound(h))
    fail(where, "the expression contains an unbound GroupNorm, whose statistics depend on the input; call "
                "bind(H, X) first");
}

template <class H>
Index resolve_channels(const H& h, Index c_hint) {
  return h.channels() == any ? c_hint + 1 : h.channels();
}

}  // namespace detail

/// Y = H X. X is (L, D); any Eigen dense expression, evaluated once into the row-major layout.
template <Operator H, class XD>
Matrix<detail::eval_scalar_t<H, typename XD::Scalar>> apply(cpu, const H& h, const Eigen::MatrixBase<XD>& X) {
  using T = detail::eval_scalar_t<H, typename XD::Scalar>;
  static_assert(std::is_same_v<T, typename XD::Scalar>, "apply: X must have the expression's scalar type");
  detail::check_input(h, X.rows(), X.cols(), "apply", "X");
  const Matrix<T>& x = X.derived();  // no copy when X already is a Matrix<T>
  const cpu_detail::context cx{x.rows(), x.cols()};
  return cpu_detail::apply_full(h, cx, x);
}
template <Operator H, class XD>
auto apply(const H& h, const Eigen::MatrixBase<XD>& X) {
  return apply(cpu{}, h, X);
}

namespace detail {
/// out resized to (rows, cols) unless it already has that shape (then its memory is reused).
template <class T>
void shape_output(Matrix<T>& out, Index rows, Index cols) {
  if (out.rows() != rows || out.cols() != cols) out.resize(rows, cols);
}
}  // namespace detail

/// Y = H X into the caller's Y, resized to (L, D) only when its shape differs: a repeated call
/// allocates nothing and writes memory already touched. Y must not be X. An expression with an
/// unbound GroupNorm computes its statistics on the way, in temporaries, as apply does.
template <Operator H, class XD, Scalar T>
void apply_into(cpu, Matrix<T>& Y, const H& h, const Eigen::MatrixBase<XD>& X) {
  static_assert(std::is_same_v<T, detail::eval_scalar_t<H, T>>, "apply_into: Y must have the expression's scalar type");
  static_assert(std::is_same_v<T, typename XD::Scalar>, "apply_into: X must have the expression's scalar type");
  detail::check_input(h, X.rows(), X.cols(), "apply_into", "X");
  const Matrix<T>& x = X.derived();
  if (x.size() != 0 && x.data() == Y.data())
    detail::fail("apply_into", "Y is X: the result cannot overwrite its own input; pass another matrix as Y");
  detail::shape_output(Y, x.rows(), x.cols());
  const cpu_detail::context cx{x.rows(), x.cols()};
  if constexpr (has_group_norm_v<H>) {
    if (!cpu_detail::is_bound(h)) {
      const Matrix<T> y = cpu_detail::apply_full(h, cx, x);
      std::copy(y.data(), y.data() + y.size(), Y.data());  // into Y's own storage
      return;
    }
  }
  cpu_detail::apply_slabs_into<T, H, false>(h, cx, x.data(), Y.data());
}
template <Operator H, class XD, Scalar T>
void apply_into(Matrix<T>& Y, const H& h, const Eigen::MatrixBase<XD>& X) {
  apply_into(cpu{}, Y, h, X);
}

/// H with every GroupNorm's statistics fixed from the forward pass on X (L, D): the frozen linear
/// map at X. apply(bind(H, X), X) == apply(H, X); materialize and friends need a bound expression.
template <Operator H, class XD>
H bind(cpu, const H& h, const Eigen::MatrixBase<XD>& X) {
  using T = detail::eval_scalar_t<H, typename XD::Scalar>;
  static_assert(std::is_same_v<T, typename XD::Scalar>, "bind: X must have the expression's scalar type");
  detail::check_input(h, X.rows(), X.cols(), "bind", "X");
  const Matrix<T>& x = X.derived();
  return cpu_detail::bind_node(h, cpu_detail::context{x.rows(), x.cols()}, x);
}
template <Operator H, class XD>
H bind(const H& h, const Eigen::MatrixBase<XD>& X) {
  return bind(cpu{}, h, X);
}

/// Channel c's (L, L) matrix.
template <Operator H>
auto materialize(cpu, const H& h, Index c, Index L = any) {
  using T = detail::eval_scalar_t<H, double>;
  static_assert(!std::is_void_v<typename H::scalar> || sizeof(H) == 0,
                "materialize: the expression has no scalar type (only the identity); scale a typed operator");
  L = detail::resolve_length(h, L, "materialize");
  detail::check_channel(h, c, "materialize");
  detail::require_bound(h, "materialize");
  return cpu_detail::materialize<T>(h, cpu_detail::context{L, detail::resolve_channels(h, c)}, c);
}
template <Operator H>
auto materialize(const H& h, Index c, Index L = any) {
  return materialize(cpu{}, h, c, L);
}

/// Channel c's (L, L) matrix into the caller's out (resized only when its shape differs).
template <Operator H, Scalar T>
void materialize_into(cpu, Matrix<T>& out, const H& h, Index c, Index L = any) {
  static_assert(std::is_same_v<T, detail::eval_scalar_t<H, T>>, "materialize_into: out must have the expression's scalar type");
  L = detail::resolve_length(h, L, "materialize_into");
  detail::check_channel(h, c, "materialize_into");
  detail::require_bound(h, "materialize_into");
  detail::shape_output(out, L, L);
  cpu_detail::materialize_into<T>(h, cpu_detail::context{L, detail::resolve_channels(h, c)}, c, out.data());
}
template <Operator H, Scalar T>
void materialize_into(Matrix<T>& out, const H& h, Index c, Index L = any) {
  materialize_into(cpu{}, out, h, c, L);
}

/// Mean over the D channels of H^c, (L, L).
template <Operator H>
auto materialize_mean(cpu, const H& h, Index L = any) {
  using T = detail::eval_scalar_t<H, double>;
  L = detail::resolve_length(h, L, "materialize_mean");
  if (h.channels() == any) detail::fail("materialize_mean", "the expression does not fix the channel count D");
  detail::require_bound(h, "materialize_mean");
  return cpu_detail::materialize_mean<T>(h, cpu_detail::context{L, h.channels()});
}
template <Operator H>
auto materialize_mean(const H& h, Index L = any) {
  return materialize_mean(cpu{}, h, L);
}

/// mean_options (what materialize_mean averages): core/means.hpp.
namespace detail {
template <class H>
Index resolve_mean_length(const H& h, Index L, const char* where) {
  L = resolve_length(h, L, where);
  if (h.channels() == any) fail(where, "the expression does not fix the channel count D");
  require_bound(h, where);
  return L;
}
}  // namespace detail

/// Mean of H^c (or |H^c| with o.abs) over all channels, one head's (o.head) or a range
/// (o.channels), (L, L). Exact; see docs/operators.md for the paths and their costs.
template <Operator H>
auto materialize_mean(cpu, const H& h, const mean_options& o, Index L = any) {
  using T = detail::eval_scalar_t<H, double>;
  L = detail::resolve_mean_length(h, L, "materialize_mean");
  const auto rq = detail::resolve_mean(h, o, "materialize_mean");
  return cpu_detail::materialize_mean<T>(h, cpu_detail::context{L, h.channels()}, rq);
}
template <Operator H>
auto materialize_mean(const H& h, const mean_options& o, Index L = any) {
  return materialize_mean(cpu{}, h, o, L);
}

/// Every head's mean (of H^c, or of |H^c| with o.abs), (heads, L, L); o.head and o.channels must
/// be unset.
template <Operator H>
auto materialize_head_means(cpu, const H& h, const mean_options& o = {}, Index L = any) {
  using T = detail::eval_scalar_t<H, double>;
  const char* where = "materialize_head_means";
  L = detail::resolve_mean_length(h, L, where);
  if (o.head || o.channels) detail::fail(where, "options.head and options.channels must be unset (every head is computed)");
  const Index P = detail::require_heads(h, where), D = h.channels();
  Tensor3<T> out(D / P, L, L);
  cpu_detail::materialize_head_means<T>(h, cpu_detail::context{L, D}, P, o.abs, out.data());
  return out;
}
template <Operator H>
auto materialize_head_means(const H& h, const mean_options& o = {}, Index L = any) {
  return materialize_head_means(cpu{}, h, o, L);
}

/// Every channel's matrix into the caller's out, which must be (D, L, L): no allocation.
template <Operator H, Scalar T>
void materialize_all_into(cpu, Tensor3<T>& out, const H& h, Index L = any) {
  static_assert(std::is_same_v<T, detail::eval_scalar_t<H, T>>, "materialize_all_into: out must have the expression's scalar type");
  const char* where = "materialize_all_into";
  L = detail::resolve_mean_length(h, L, where);
  const Index D = h.channels();
  if (out.dims[0] != D || out.dims[1] != L || out.dims[2] != L)
    detail::fail(where, "out has shape (" + std::to_string(out.dims[0]) + ", " + std::to_string(out.dims[1]) + ", " +
                            std::to_string(out.dims[2]) + ") but expected (D=" + std::to_string(D) + ", L=" +
                            std::to_string(L) + ", L=" + std::to_string(L) + ")");
  cpu_detail::materialize_all<T>(h, cpu_detail::context{L, D}, out.data(), false);
}
template <Operator H, Scalar T>
void materialize_all_into(Tensor3<T>& out, const H& h, Index L = any) {
  materialize_all_into(cpu{}, out, h, L);
}

/// Every channel's (L, L) matrix, (D, L, L) row-major [c][t][s]: what the authors' code returns.
template <Operator H>
auto materialize_all(cpu, const H& h, Index L = any) {
  using T = detail::eval_scalar_t<H, double>;
  L = detail::resolve_mean_length(h, L, "materialize_all");
  Tensor3<T> out(h.channels(), L, L);
  cpu_detail::materialize_all<T>(h, cpu_detail::context{L, h.channels()}, out.data(), true);
  return out;
}
template <Operator H>
auto materialize_all(const H& h, Index L = any) {
  return materialize_all(cpu{}, h, L);
}

/// Row t of every channel's matrix, (D, L): result(c, s) = H^c[t, s].
template <Operator H>
auto row(cpu, const H& h, Index t, Index L = any) {
  using T = detail::eval_scalar_t<H, double>;
  L = detail::resolve_length(h, L, "row");
  if (t < 0 || t >= L) detail::fail("row", "t = " + std::to_string(t) + " is out of range [0, L=" + std::to_string(L) + ")");
  if (h.channels() == any) detail::fail("row", "the expression does not fix the channel count D");
  detail::require_bound(h, "row");
  return cpu_detail::row_or_col<T>(h, cpu_detail::context{L, h.channels()}, t, true);
}
template <Operator H>
auto row(const H& h, Index t, Index L = any) {
  return row(cpu{}, h, t, L);
}

/// Row t (is_row) or column t of every channel's matrix into out (D, L), resized only when its
/// shape differs.
namespace detail {
template <class H, Scalar T>
void row_or_col_into(Matrix<T>& out, const H& h, Index k, Index L, bool is_row) {
  static_assert(std::is_same_v<T, eval_scalar_t<H, T>>, "row_into/col_into: out must have the expression's scalar type");
  const char* where = is_row ? "row_into" : "col_into";
  L = resolve_length(h, L, where);
  if (k < 0 || k >= L)
    fail(where, std::string(is_row ? "t" : "s") + " = " + std::to_string(k) + " is out of range [0, L=" + std::to_string(L) + ")");
  if (h.channels() == any) fail(where, "the expression does not fix the channel count D");
  require_bound(h, where);
  shape_output(out, h.channels(), L);
  cpu_detail::row_or_col_into<T>(h, cpu_detail::context{L, h.channels()}, k, is_row, out.data());
}
}  // namespace detail

/// Row t of every channel's matrix into the caller's out (D, L), resized only when its shape differs.
template <Operator H, Scalar T>
void row_into(cpu, Matrix<T>& out, const H& h, Index t, Index L = any) {
  detail::row_or_col_into(out, h, t, L, true);
}
template <Operator H, Scalar T>
void row_into(Matrix<T>& out, const H& h, Index t, Index L = any) {
  detail::row_or_col_into(out, h, t, L, true);
}
/// Column s of every channel's matrix into the caller's out (D, L), resized only when its shape differs.
template <Operator H, Scalar T>
void col_into(cpu, Matrix<T>& out, const H& h, Index s, Index L = any) {
  detail::row_or_col_into(out, h, s, L, false);
}
template <Operator H, Scalar T>
void col_into(Matrix<T>& out, const H& h, Index s, Index L = any) {
  detail::row_or_col_into(out, h, s, L, false);
}

/// Column s of every channel's matrix, (D, L): result(c, t) = H^c[t, s].
template <Operator H>
auto col(cpu, const H& h, Index s, Index L = any) {
  using T = detail::eval_scalar_t<H, double>;
  L = detail::resolve_length(h, L, "col");
  if (s < 0 || s >= L) detail::fail("col", "s = " + std::to_string(s) + " is out of range [0, L=" + std::to_string(L) + ")");
  if (h.channels() == any) detail::fail("col", "the expression does not fix the channel count D");
  detail::require_bound(h, "col");
  return cpu_detail::row_or_col<T>(h, cpu_detail::context{L, h.channels()}, s, false);
}
template <Operator H>
auto col(const H& h, Index s, Index L = any) {
  return col(cpu{}, h, s, L);
}

/// The tile H^c[rows, cols], (rows.size(), cols.size()).
template <Operator H>
auto block(cpu, const H& h, Index c, range rows, range cols, Index L = any) {
  using T = detail::eval_scalar_t<H, double>;
  L = detail::resolve_length(h, L, "block");
  detail::check_channel(h, c, "block");
  auto check = [&](range r, const char* name) {
    if (r.begin < 0 || r.end < r.begin || r.end > L)
      detail::fail("block", std::string(name) + " = [" + std::to_string(r.begin) + ", " + std::to_string(r.end) +
                                ") is not a range inside [0, L=" + std::to_string(L) + ")");
  };
  check(rows, "rows");
  check(cols, "cols");
  detail::require_bound(h, "block");
  return cpu_detail::block<T>(h, cpu_detail::context{L, detail::resolve_channels(h, c)}, c, rows, cols);
}
template <Operator H>
auto block(const H& h, Index c, range rows, range cols, Index L = any) {
  return block(cpu{}, h, c, rows, cols, L);
}

}  // namespace iattn
