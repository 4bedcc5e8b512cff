// Mamba-3 SISO (state-spaces/mamba `Mamba3`): the exact decomposition against the layer's own
// recurrent forward (the kernel's step reference), decompose(w, u) == attention(activations(w, u)),
// the inner output without the out projection, the final states against the forward's, the head's
// core against a dense oracle built with explicit 2 x 2 rotations in double, the rotated kernel
// against std::complex<double>, and shape errors naming the field.
#include "support/model_checks.hpp"

#include <iattn/models/mamba3.hpp>

#include <complex>
#include <numbers>
#include <vector>

using namespace test;
using namespace iattn::models;
using Catch::Matchers::Contains;
using iattn::Matrix;

namespace {

/// A small Mamba-3 layer (d_model 16, d_inner 32, H = 4 heads of P = 8) with weights drawn so that
/// every term matters: projections of std 0.3 (trap in about (0.1, 0.9), decays spread over (0, 1)),
/// dt_bias near 0 so that DT is O(1) and the angles turn by up to pi per token, biases and norm
/// weights that are not 1, D not 1.
template <class T>
mamba3_weights<T> small_mamba3(std::uint64_t seed, Index d_state, Index ngroups, double rope_fraction) {
  auto w = mamba3_init<T>({.d_model = 16, .d_state = d_state, .expand = 2, .headdim = 8, .ngroups = ngroups,
                           .rope_fraction = rope_fraction},
                          seed);
  init::generator g(seed + 100);
  const Index H = w.config.nheads(), N = d_state;
  w.in_proj_weight = init::normal<T>(g, w.in_proj_weight.rows(), 16, 0.3);
  w.dt_bias = init::uniform<T>(g, 1, H, -1.5, 0.5);
  w.B_bias = (init::normal<T>(g, H, N, 0.7).array() + T(0.5)).matrix();
  w.C_bias = (init::normal<T>(g, H, N, 0.7).array() + T(0.5)).matrix();
  w.B_norm_weight = init::uniform<T>(g, 1, N, 0.5, 1.5);
  w.C_norm_weight = init::uniform<T>(g, 1, N, 0.5, 1.5);
  w.D = init::uniform<T>(g, 1, H, 0.5, 1.5);
  return w;
}

struct case_t {
  const char* name;
  Index d_state, ngroups;
  double rope_fraction;
};
const std::vector<case_t> cases = {
    {"N = 12, G = 1, rope 0.5 (S = 3: 6 rotated, 6 plain dims)", 12, 1, 0.5},
    {"N = 12, G = 2, rope 0.5", 12, 2, 0.5},
    {"N = 10, G = 1, rope 0.5 (split 5 made even: S = 2)", 10, 1, 0.5},
    {"N = 8, G = 2, rope 1.0 (S = 4: every dim rotated)", 8, 2, 1.0},
};

/// Per-head q and k (before the rotation) in double, from the activations' B, C and biases.
template <class T>
void dense_qk(const mamba3_activations<T>& a, Index h, MatD& q, MatD& k) {
  const Index L = a.length(), N = a.d_state(), g = h / (a.nheads() / a.ngroups);
  q.resize(L, N);
  k.resize(L, N);
  for (Index t = 0; t < L; ++t)
    for (Index n = 0; n < N; ++n) {
      q(t, n) = double(a.C(t, g * N + n)) + double(a.C_bias(h, n));
      k(t, n) = double(a.B(t, g * N + n)) + double(a.B_bias(h, n));
    }
}

/// The accumulated angle phi_t[i] = sum_{r<=t} pi tanh(angles_r[i]) DT_r[h] in double, not reduced.
template <class T>
MatD dense_phi(const mamba3_activations<T>& a, Index h) {
  const Index L = a.length(), S = a.num_rope_angles();
  MatD phi(L, S);
  for (Index i = 0; i < S; ++i) {
    double acc = 0;
    for (Index t = 0; t < L; ++t) {
      acc += std::numbers::pi * std::tanh(double(a.angles(t, i))) * double(a.DT(t, h));
      phi(t, i) = acc;
    }
  }
  return phi;
}

/// Head h's core from the trapezoidal rule written out, with explicit 2 x 2 rotation matrices:
/// core[t, s] = exp(sum_{r=s+1..t} ADT_r) (lam_s DT_s + (1 - lam_{s+1}) DT_{s+1}) (R(phi_t) q_t).(R(phi_s) k_s)
/// for s < t and lam_t DT_t q_t.k_t at s = t.
template <class T>
MatD dense_core(const mamba3_activations<T>& a, Index h) {
  const Index L = a.length(), S = a.num_rope_angles();
  MatD q, k;
  dense_qk(a, h, q, k);
  const MatD phi = dense_phi(a, h);
  MatD qr = q, kr = k;
  for (Index t = 0; t < L; ++t)
    for (Index i = 0; i < S; ++i) {
      Eigen::Matrix2d R;
      R << std::cos(phi(t, i)), -std::sin(phi(t, i)), std::sin(phi(t, i)), std::cos(phi(t, i));
      qr.row(t).segment(2 * i, 2) = (R * q.row(t).segment(2 * i, 2).transpose()).transpose();
      kr.row(t).segment(2 * i, 2) = (R * k.row(t).segment(2 * i, 2).transpose()).transpose();
    }
  auto lam = [&](Index t) { return 1.0 / (1.0 + std::exp(-double(a.trap(t, h)))); };
  auto dt = [&](Index t) { return double(a.DT(t, h)); };
  MatD M = MatD::Zero(L, L);
  for (Index t = 0; t < L; ++t) {
    M(t, t) = lam(t) * dt(t) * q.row(t).dot(k.row(t));
    double logdecay = 0;
    for (Index s = t - 1; s >= 0; --s) {
      logdecay += double(a.ADT(s + 1, h));
      const double w = lam(s) * dt(s) + (1.0 - lam(s + 1)) * dt(s + 1);
      M(t, s) = std::exp(logdecay) * w * qr.row(t).dot(kr.row(s));
    }
  }
  return M;
}

/// Head h's rotated kernel exp(sum ADT) q~_t.k~_s with std::complex<double>: per pair
/// Re(q^_t conj(k^_s) e^{i (phi_t - phi_s)}), plus the plain dims.
template <class T>
MatD dense_kernel_complex(const mamba3_activations<T>& a, Index h) {
  const Index L = a.length(), N = a.d_state(), S = a.num_rope_angles();
  MatD q, k;
  dense_qk(a, h, q, k);
  const MatD phi = dense_phi(a, h);
  MatD M = MatD::Zero(L, L);
  for (Index t = 0; t < L; ++t) {
    double logdecay = 0;
    for (Index s = t; s >= 0; --s) {
      if (s < t) logdecay += double(a.ADT(s + 1, h));
      double acc = 0;
      for (Index i = 0; i < S; ++i) {
        const std::complex<double> qh(q(t, 2 * i), q(t, 2 * i + 1)), kh(k(s, 2 * i), k(s, 2 * i + 1));
        acc += (qh * std::conj(kh) * std::polar(1.0, phi(t, i) - phi(s, i))).real();
      }
      for (Index n = 2 * S; n < N; ++n) acc += q(t, n) * k(s, n);
      M(t, s) = std::exp(logdecay) * acc;
    }
  }
  return M;
}

/// max |a - b| over angles, modulo 2 pi.
inline double angle_error(const MatD& a, const MatD& b) {
  double e = 0;
  for (Index i = 0; i < a.size(); ++i)
    e = std::max(e, std::abs(std::remainder(a.data()[i] - b.data()[i], 2 * std::numbers::pi)));
  return e;
}

}  // namespace

TEMPLATE_TEST_CASE("Mamba-3 SISO: exact decomposition and doors", "[models][mamba3]", float, double) {
  using T = TestType;
  for (const auto& cs : cases) {
    INFO(cs.name);
    const auto w = small_mamba3<T>(1, cs.d_state, cs.ngroups, cs.rope_fraction);
    for (Index L : model_lengths) {
      INFO("L = " << L);
      const auto u = sample_input<T>(L, 16, 50 + std::uint64_t(L));
      Matrix<T> S_fwd;
      mamba3_cache<T> cache_fwd;
      const Matrix<T> block = mamba3_forward(w, u, &S_fwd, &cache_fwd);
      const auto acts = activations(w, u);
      const auto d = attention(acts);
      check_exact<T>(block, d);
      check_close(dd(decompose(w, u).output()), dd(d.output()), model_tol<T>());
      check_close(dd(mamba3_decompose(w, u).output()), dd(d.output()), model_tol<T>());
      // the inner output (no out_proj), projected by the weights' out_proj
      auto inner_acts = acts;
      inner_acts.out_proj_weight.resize(0, 0);
      const auto inner = attention(inner_acts);
      REQUIRE(inner.out_weight.size() == 0);
      check_close(dd(Matrix<T>(nn::linear<T>(inner.output(), w.out_proj_weight))), dd(block), model_tol<T>());
      // the final states, in log space, against the forward's recurrence
      const Matrix<T> S = final_state(acts);
      REQUIRE(S.rows() == 32);
      REQUIRE(S.cols() == cs.d_state);
      check_close(dd(S), dd(S_fwd), model_tol<T>());
      const auto cache = final_cache(acts);
      check_close(dd(cache.ssm_state), dd(cache_fwd.ssm_state), model_tol<T>());
      check_close(dd(cache.k_state), dd(cache_fwd.k_state), model_tol<T>());
      check_close(dd(cache.v_state), dd(cache_fwd.v_state), model_tol<T>());
      REQUIRE(cache.angle_state.rows() == 4);
      REQUIRE(cache.angle_state.cols() == w.config.num_rope_angles());
      REQUIRE(angle_error(dd(cache.angle_state), dd(cache_fwd.angle_state)) <= (std::is_same_v<T, float> ? 1e-4 : 1e-10));
    }
  }
}

TEMPLATE_TEST_CASE("Mamba-3 SISO: the head's core against a dense oracle", "[models][mamba3]", float, double) {
  using T = TestType;
  for (const auto& cs : {cases[1], cases[2], cases[3]}) {
    INFO(cs.name);
    const auto w = small_mamba3<T>(2, cs.d_state, cs.ngroups, cs.rope_fraction);
    for (Index L : {Index(1), Index(7), Index(70)}) {
      INFO("L = " << L);
      const auto acts = activations(w, sample_input<T>(L, 16, 9));
      // the angles do turn: a few radians accumulated by the end
      if (L == 70) REQUIRE(dense_phi(acts, 0).row(L - 1).cwiseAbs().maxCoeff() > 6.0);
      const auto core = mamba3_core(acts);
      const auto K = mamba3_rotated_kernel(acts);
      for (Index h = 0; h < acts.nheads(); ++h) {
        INFO("head " << h);
        const MatD ref = dense_core(acts, h), refK = dense_kernel_complex(acts, h);
        for (Index c : {h * 8, h * 8 + 7}) {
          check_close(dd(Matrix<T>(iattn::materialize(core, c, L))), ref, model_tol<T>());
          check_close(dd(Matrix<T>(iattn::materialize(K, c, L))), refK, model_tol<T>());
        }
      }
    }
  }
}

TEST_CASE("Mamba-3 SISO: the reference init and the layout", "[models][mamba3]") {
  const mamba3_config c{};
  REQUIRE(c.nheads() == 4);
  REQUIRE(c.num_rope_angles() == 8);
  REQUIRE(mamba3_config{.d_state = 128}.num_rope_angles() == 32);
  REQUIRE(c.d_in_proj() == 2 * 128 + 2 * 32 + 3 * 4 + 8);
  const auto w = mamba3_init<double>(c, 3);
  w.check();
  for (Index h = 0; h < 4; ++h) {
    const double dt = nn::softplus(w.dt_bias(0, h));
    REQUIRE(dt >= 1e-3 * (1 - 1e-12));
    REQUIRE(dt <= 1e-1 * (1 + 1e-12));
  }
  REQUIRE(w.B_bias.cwiseAbs().minCoeff() == 1.0);
  REQUIRE(w.C_bias.cwiseAbs().maxCoeff() == 1.0);
  // with the reference init the decomposition is exact too
  const auto u = sample_input<double>(40, 64, 5);
  check_exact<double>(mamba3_forward(w, u), decompose(w, u));
}

TEST_CASE("Mamba-3 SISO: shape errors name the field", "[models][mamba3][errors]") {
  using T = double;
  const auto w = small_mamba3<T>(3, 12, 2, 0.5);
  const auto u = sample_input<T>(5, 16, 1);
  {
    auto bad = w;
    bad.B_bias.resize(3, 12);
    REQUIRE_THROWS_WITH(decompose(bad, u), Contains("B_bias has shape (3, 12)") && Contains("(nheads=4, d_state=12)"));
  }
  {
    auto bad = w;
    bad.in_proj_weight.resize(10, 16);
    REQUIRE_THROWS_WITH(mamba3_forward(bad, u), Contains("in_proj_weight has shape (10, 16)"));
  }
  {
    auto bad = w;
    bad.config.rope_fraction = 0.25;
    REQUIRE_THROWS_WITH(decompose(bad, u), Contains("rope_fraction"));
  }
  {
    auto bad = w;
    bad.config.ngroups = 3;
    REQUIRE_THROWS_WITH(decompose(bad, u), Contains("ngroups"));
  }
  REQUIRE_THROWS_WITH(decompose(w, Matrix<T>(Matrix<T>::Zero(5, 7))), Contains("u has shape (5, 7)"));
  const auto acts = activations(w, u);
  {
    auto bad = acts;
    bad.ADT.resize(5, 3);
    REQUIRE_THROWS_WITH(attention(bad), Contains("ADT has shape (5, 3)"));
  }
  {
    auto bad = acts;
    bad.angles.resize(5, 7);
    REQUIRE_THROWS_WITH(attention(bad), Contains("angles has shape (5, 7)"));
  }
  {
    auto bad = acts;
    bad.C_bias.resize(4, 11);
    REQUIRE_THROWS_WITH(final_state(bad), Contains("C_bias has shape (4, 11)"));
  }
  {
    auto bad = acts;
    bad.C.resize(5, 12);
    REQUIRE_THROWS_WITH(final_cache(bad), Contains("C has shape (5, 12)"));
  }
  {
    auto bad = acts;
    bad.ADT(2, 1) = 0.5;
    REQUIRE_THROWS_WITH(attention(bad), Contains("ADT must be <= 0"));
  }
}

TEST_CASE("Mamba-3 SISO: an empty sequence gives an empty output", "[models][mamba3][empty]") {
  using T = double;
  const auto w = small_mamba3<T>(4, 12, 1, 0.5);
  const Matrix<T> u0(0, 16);
  mamba3_cache<T> cache;
  const Matrix<T> block = mamba3_forward<T>(w, u0, nullptr, &cache);
  REQUIRE(block.rows() == 0);
  const auto d = decompose(w, u0);
  REQUIRE(d.output().rows() == 0);
  REQUIRE(d.x.cols() == 32);
  const auto acts = activations(w, u0);
  REQUIRE(final_state(acts).cwiseAbs().maxCoeff() == 0.0);
  REQUIRE(final_cache(acts).k_state.cwiseAbs().maxCoeff() == 0.0);
  REQUIRE(cache.ssm_state.cwiseAbs().maxCoeff() == 0.0);
}
