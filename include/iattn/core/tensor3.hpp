// iattn/core/tensor3.hpp: Tensor3<T>, a contiguous row-major (n0, n1, n2) array: the result of
// materialize_all (D, L, L) and materialize_head_means (heads, L, L), the layout of the authors'
// code ([c][t][s], s fastest). slice(i) is the (n1, n2) matrix i as an Eigen map, no copy.
//
// Construction does not initialise the elements (the evaluators write every one of them once);
// Tensor3(n0, n1, n2, value) fills. Copies are deep; moves steal the storage.
#pragma once

#include "config.hpp"

#include <Eigen/Core>

#include <algorithm>
#include <array>
#include <memory>

namespace iattn {

template <Scalar T>
class Tensor3 {
 public:
  using scalar = T;
  using slice_map = Eigen::Map<Matrix<T>>;
  using const_slice_map = Eigen::Map<const Matrix<T>>;

  Tensor3() = default;
  /// (n0, n1, n2), uninitialised.
  Tensor3(Index n0, Index n1, Index n2) : dims{n0, n1, n2}, data_(new T[std::size_t(std::max<Index>(n0 * n1 * n2, 1))]) {}
  Tensor3(Index n0, Index n1, Index n2, T value) : Tensor3(n0, n1, n2) { std::fill(data(), data() + size(), value); }
  Tensor3(const Tensor3& o) : Tensor3(o.dims[0], o.dims[1], o.dims[2]) { std::copy(o.data(), o.data() + size(), data()); }
  Tensor3(Tensor3&&) noexcept = default;
  Tensor3& operator=(const Tensor3& o) {
    if (this != &o) *this = Tensor3(o);
    return *this;
  }
  Tensor3& operator=(Tensor3&&) noexcept = default;

  /// (n0, n1, n2).
  std::array<Index, 3> dims{0, 0, 0};

  Index size() const { return dims[0] * dims[1] * dims[2]; }
  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  T& operator()(Index i, Index j, Index k) { return data_[std::size_t((i * dims[1] + j) * dims[2] + k)]; }
  const T& operator()(Index i, Index j, Index k) const { return data_[std::size_t((i * dims[1] + j) * dims[2] + k)]; }
  /// Matrix i, (n1, n2) row-major, as a map into this tensor's storage.
  slice_map slice(Index i) { return slice_map(data() + i * dims[1] * dims[2], dims[1], dims[2]); }
  const_slice_map slice(Index i) const { return const_slice_map(data() + i * dims[1] * dims[2], dims[1], dims[2]); }

 private:
  std::unique_ptr<T[]> data_;
};

}  // namespace iattn
