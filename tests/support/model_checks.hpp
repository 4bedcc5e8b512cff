// tests/support/model_checks.hpp: what every model test checks of a decomposition.
#pragma once

#include "support/test_common.hpp"

#include <iattn/models/common.hpp>

namespace test {

/// The lengths every model is checked at.
inline const std::vector<Index> model_lengths = {1, 5, 64, 300};

template <class T>
double model_tol() { return std::is_same_v<T, float> ? 1e-4 : 1e-10; }

/// |block - out_proj(H x + beta)| <= tol (1 + max|block|) (relative in float), and per channel
/// materialize(H, c) x[:, c] equals apply's column c, and H is causal.
template <class T, class Dec>
void check_exact(const iattn::Matrix<T>& block, const Dec& d, bool causal = true) {
  using iattn::Matrix;
  const double scale = 1.0 + dd(block).cwiseAbs().maxCoeff();
  const double err = (dd(d.output()) - dd(block)).cwiseAbs().maxCoeff();
  INFO("max |block - decomposition| = " << err << ", scale " << scale);
  REQUIRE(err <= model_tol<T>() * scale);
  const MatD y = dd(Matrix<T>(iattn::apply(d.H, d.x)));
  const Index D = d.x.cols(), L = d.x.rows();
  for (Index c : {Index(0), D / 2, D - 1}) {
    const MatD M = dd(Matrix<T>(iattn::materialize(d.H, c, L)));  // L given: at L = 1 no coefficient fixes it
    check_close(M * dd(d.x).col(c), y.col(c), model_tol<T>());
    if (causal && L > 1) REQUIRE(MatD(M.triangularView<Eigen::StrictlyUpper>()).cwiseAbs().maxCoeff() == 0.0);
  }
}

}  // namespace test
