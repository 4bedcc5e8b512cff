// iattn/core/coefficient.hpp: how an operator holds its coefficient matrices.
//
// Lifetime rule (xtensor's closure rule): an lvalue with contiguous row-major storage is
// *referenced*, so it must outlive the operator; anything else (an rvalue, an expression, a
// column-major matrix) is evaluated once into storage the operator owns, shared between copies.
//
//   Matrix<float> dA = ...;
//   auto S = semiseparable(dA, B, C, {.heads = D});   // references dA: keep dA alive
//   auto T = semiseparable(dA * 2.f, B, C, {...});     // owns its copy of 2*dA
#pragma once

#include "config.hpp"

#include <memory>
#include <type_traits>
#include <utility>

namespace iattn {

template <Scalar T>
class coefficient {
 public:
  coefficient() = default;

  /// Wraps an Eigen dense expression; see the lifetime rule above.
  template <class E>
  explicit coefficient(E&& e) {
    using D = std::remove_cvref_t<E>;
    static_assert(std::is_same_v<typename D::Scalar, T>,
                  "iattn: a coefficient's scalar type must match the operator's (float or double)");
    if constexpr (std::is_lvalue_reference_v<E&&> &&
                  bool(Eigen::internal::traits<D>::Flags & Eigen::DirectAccessBit)) {
      const Index row_stride = D::IsRowMajor ? e.outerStride() : e.innerStride();
      const Index col_stride = D::IsRowMajor ? e.innerStride() : e.outerStride();
      if ((e.cols() <= 1 || col_stride == 1) && (e.rows() <= 1 || row_stride == e.cols())) {
        data_ = e.data();
        rows_ = e.rows();
        cols_ = e.cols();
        return;
      }
    }
    auto owned = std::make_shared<Matrix<T>>(std::forward<E>(e));
    data_ = owned->data();
    rows_ = owned->rows();
    cols_ = owned->cols();
    owned_ = std::move(owned);
  }

  IATTN_HOST_DEVICE const T* data() const { return data_; }
  IATTN_HOST_DEVICE Index rows() const { return rows_; }
  IATTN_HOST_DEVICE Index cols() const { return cols_; }
  IATTN_HOST_DEVICE bool empty() const { return data_ == nullptr; }
  IATTN_HOST_DEVICE const T* row(Index r) const { return data_ + r * cols_; }
  IATTN_HOST_DEVICE T operator()(Index r, Index c) const { return data_[r * cols_ + c]; }
  /// True when this operator owns the storage (it was given an rvalue or an expression).
  bool owning() const { return owned_ != nullptr; }

  Eigen::Map<const Matrix<T>> map() const { return {data_, rows_, cols_}; }

 private:
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
