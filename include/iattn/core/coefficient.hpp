// iattn/core/coefficient.hpp: how an operator holds its coefficient matrices.
//
// Ownership rule (safe by default, fast by choice; docs/design.md section 4):
//   - a factory *owns* its operands: an lvalue is copied once into shared immutable storage, an
//     rvalue Matrix<T> is moved (no copy), an expression is evaluated once; copies of an operator
//     share that storage. An expression returned from a function that built it from its locals
//     stays valid.
//   - `iattn::ref(m)` references m's storage with no copy. Lifetime rule: m must outlive every
//     operator (and every copy of it) built from the reference, and must not be resized or
//     reallocated meanwhile; writes to m's values are seen by the operator. m must be contiguous
//     row-major (or a single row or column); anything else throws std::invalid_argument.
//
//   Matrix<float> dA = ...;
//   auto S = semiseparable(dA, B, C, {.heads = D});        // owns a copy of dA
//   auto R = semiseparable(ref(dA), ref(B), ref(C), {...}); // zero-copy: keep dA, B, C alive
//   auto T = semiseparable(std::move(dA), B, C, {...});     // moves dA in
#pragma once

#include "config.hpp"

#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace iattn {

/// A zero-copy reference to contiguous row-major storage, made by `iattn::ref`; see the ownership
/// rule. It keeps the pointer and shape only (not the Eigen object), so a reference made from a
/// temporary view (`ref(m.middleRows(1, 3))`) stays valid as long as m's storage does.
template <Scalar T>
struct matrix_ref {
  using Scalar = T;
  const T* data;
  Index rows, cols;
};

/// References m's storage instead of copying it (see the lifetime rule above). m must have direct
/// access to contiguous row-major storage (a Matrix<T>, a Map of one, a block of whole rows, a single
/// row or column); otherwise std::invalid_argument.
template <class M>
matrix_ref<typename M::Scalar> ref(const M& m) {
  static_assert(bool(Eigen::internal::traits<M>::Flags & Eigen::DirectAccessBit),
                "iattn::ref: only objects with storage (a Matrix, a Map, a block) can be referenced; "
                "pass an expression without ref() to have it evaluated once and owned");
  const Index row_stride = M::IsRowMajor ? m.outerStride() : m.innerStride();
  const Index col_stride = M::IsRowMajor ? m.innerStride() : m.outerStride();
  if (!((m.cols() <= 1 || col_stride == 1) && (m.rows() <= 1 || row_stride == m.cols())))
    throw std::invalid_argument("iattn::ref: the referenced matrix of shape (" + std::to_string(m.rows()) + ", " +
                                std::to_string(m.cols()) + ") is not contiguous row-major (row stride " +
                                std::to_string(row_stride) + ", column stride " + std::to_string(col_stride) +
                                "; expected " + std::to_string(m.cols()) +
                                " and 1); pass it without ref() to have it copied into that layout");
  return {m.data(), m.rows(), m.cols()};
}
/// A temporary matrix cannot be referenced: it would dangle. Pass it without ref() (it is moved in).
/// (Temporary *views* of live storage, such as blocks and maps, can.)
template <class M>
  requires std::is_base_of_v<Eigen::PlainObjectBase<M>, M>
void ref(const M&& m) = delete;

namespace detail {
template <class E>
inline constexpr bool is_matrix_ref_v = false;
template <class T>
inline constexpr bool is_matrix_ref_v<matrix_ref<T>> = true;
}  // namespace detail

template <Scalar T>
class coefficient {
 public:
  coefficient() = default;

  /// Takes an Eigen dense object or expression (owned), or an `iattn::ref` (referenced).
  template <class E>
  explicit coefficient(E&& e) {
    using D = std::remove_cvref_t<E>;
    static_assert(std::is_same_v<typename D::Scalar, T>,
                  "iattn: a coefficient's scalar type must match the operator's (float or double)");
    if constexpr (detail::is_matrix_ref_v<D>) {
      data_ = e.data;
      rows_ = e.rows;
      cols_ = e.cols;
    } else {
      own(std::forward<E>(e));
    }
  }

  IATTN_HOST_DEVICE const T* data() const { return data_; }
  IATTN_HOST_DEVICE Index rows() const { return rows_; }
  IATTN_HOST_DEVICE Index cols() const { return cols_; }
  IATTN_HOST_DEVICE bool empty() const { return data_ == nullptr; }
  IATTN_HOST_DEVICE const T* row(Index r) const { return data_ + r * cols_; }
  IATTN_HOST_DEVICE T operator()(Index r, Index c) const { return data_[r * cols_ + c]; }
  /// True when this operator owns the storage (everything but an `iattn::ref`).
  bool owning() const { return owned_ != nullptr; }

  Eigen::Map<const Matrix<T>> map() const { return {data_, rows_, cols_}; }

 private:
  /// Copies an lvalue once, moves an rvalue Matrix<T>, evaluates an expression once.
  template <class E>
  void own(E&& e) {
    auto owned = std::make_shared<Matrix<T>>(std::forward<E>(e));
    data_ = owned->data();
    rows_ = owned->rows();
    cols_ = owned->cols();
    owned_ = std::move(owned);
  }

  const T* data_ = nullptr;
  Index rows_ = 0;
  Index cols_ = 0;
  std::shared_ptr<const Matrix<T>> owned_;
};

namespace detail {
template <class E>
using scalar_of = typename std::remove_cvref_t<E>::Scalar;

template <class E>
coefficient<scalar_of<E>> make_coefficient(E&& e) {
  return coefficient<scalar_of<E>>(std::forward<E>(e));
}
}  // namespace detail

}  // namespace iattn
