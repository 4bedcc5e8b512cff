// Numerical extremes and error growth: prints the tables of docs/numerics.md.
//   numerics [--quick]        (--quick: L up to 10^4, for the smoke test)
// A. extremes: decays of exactly 1 and 0, lambda = -inf resets, RWKV keys of +-80 in float.
// B. fp32 against fp64: max |y32 - y64| / max |y64| as L grows, for a Mamba-1 S6 scan, a long-memory
//    linear recurrence (a = 0.999) and RWKV's WKV.
// C. L = 10^6: apply and row in O(L D N) time and O(L D) memory (peak RSS); printed first, so that the
//    peak is its own.
#include <iattn/iattn.hpp>

#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

using namespace iattn;

namespace {

std::mt19937_64 rng(42);

template <class T>
Matrix<T> uniform(Index r, Index c, double lo, double hi) {
  std::uniform_real_distribution<double> d(lo, hi);
  Matrix<T> m(r, c);
  for (Index i = 0; i < m.size(); ++i) m.data()[i] = T(d(rng));
  return m;
}

double rel(const Matrix<float>& a, const Matrix<double>& b) {
  return (a.cast<double>() - b).cwiseAbs().maxCoeff() / std::max(b.cwiseAbs().maxCoeff(), 1e-300);
}

double peak_rss_mb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_maxrss) / 1024.0;
}

template <class F>
double seconds(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  const Index Lmax = quick ? 10000 : 1000000, D = 16, N = 16;
  int failures = 0;

  // C first, so that its peak RSS is its own
  {
    const Index L = Lmax;
    std::printf("C. L = %lld, D = %lld, N = %lld, float\n\n| call | seconds | peak RSS (MiB) |\n| --- | --- | --- |\n", static_cast<long long>(L),
                static_cast<long long>(D), static_cast<long long>(N));
    const Matrix<float> dt = uniform<float>(L, D, 0.001, 0.1), A = uniform<float>(D, N, -16, -1), B = uniform<float>(L, N, -1, 1),
                        C = uniform<float>(L, N, -1, 1), x = uniform<float>(L, D, -1, 1);
    const auto S = semiseparable(factored_decay(dt, A), B, C, {.heads = D});
    const double inputs_mb = double(L) * double(D * 3 + 2 * N) * 4 / 1048576.0;
    Matrix<float> y;
    const double ta = seconds([&] { y = apply(S, x); });
    std::printf("| apply (L D N = %.2g state updates) | %.3f | %.0f |\n", double(L) * double(D * N), ta, peak_rss_mb());
    Matrix<float> r;
    const double tr = seconds([&] { r = row(S, L - 1); });
    std::printf("| row(H, L-1): a (D, L) result | %.3f | %.0f |\n", tr, peak_rss_mb());
    std::printf("| inputs and output alone (L (3D + 2N) floats) | | %.0f |\n", inputs_mb);
    failures += !y.allFinite() || !r.allFinite();
  }
  std::printf("\n");
  std::printf("A. extremes\n\n| case | L | result | expected |\n| --- | --- | --- | --- |\n");
  {  // decay exactly 1: lambda = 0, B = C = 1 counts tokens exactly in float
    const auto S = semiseparable(Matrix<float>(Matrix<float>::Zero(Lmax, D)), Matrix<float>(Matrix<float>::Ones(Lmax, 1)),
                                 Matrix<float>(Matrix<float>::Ones(Lmax, 1)), {.heads = D});
    const Matrix<float> y = apply(S, Matrix<float>(Matrix<float>::Ones(Lmax, D)));
    double err = 0;
    for (Index t = 0; t < Lmax; ++t) err = std::max(err, std::abs(double(y(t, 3)) - double(t + 1)));
    std::printf("| decay exactly 1 (lambda = 0), float: max abs error of the running count | %lld | %g | 0 |\n", static_cast<long long>(Lmax), err);
    failures += err != 0;
  }
  {  // decay exactly 0: a reset every 97 tokens; nothing crosses it
    Matrix<float> lam = uniform<float>(Lmax, D, -0.01, 0);
    for (Index t = 97; t < Lmax; t += 97) lam.row(t).setConstant(-INFINITY);
    const auto S = semiseparable(lam, uniform<float>(Lmax, 1, 0.5, 1), uniform<float>(Lmax, 1, 0.5, 1), {.heads = D});
    const Index t = (Lmax / 97) * 97 + 5 < Lmax ? (Lmax / 97) * 97 + 5 : Lmax - 1, reset = t - t % 97;
    const Matrix<float> r = row(S, t);
    double leak = 0;
    for (Index c = 0; c < D; ++c) leak = std::max(leak, double(r.row(c).head(reset).cwiseAbs().maxCoeff()));
    std::printf("| lambda = -inf resets (float): max |H[t, s]| across a reset, from row(H, t) | %lld | %g | 0 |\n", static_cast<long long>(Lmax), leak);
    failures += leak != 0;
  }
  {  // RWKV keys of +-80 in float
    const Index L = std::min<Index>(Lmax, 100000);
    Matrix<float> k = uniform<float>(L, D, -80, 80);
    k.topRows(50).setConstant(-80.0f);
    const Matrix<float> w = uniform<float>(1, D, -0.5, -0.01), u = uniform<float>(1, D, -1, 1), x = uniform<float>(L, D, -1, 1);
    const Matrix<float> y = apply(wkv(w, k, u), x);
    const Matrix<double> yd = apply(wkv(Matrix<double>(w.cast<double>()), Matrix<double>(k.cast<double>()), Matrix<double>(u.cast<double>())),
                                    Matrix<double>(x.cast<double>()));
    Matrix<float> B(L, D);
    for (Index c = 0; c < D; ++c) B.col(c) = (k.col(c).array() - k.col(c).maxCoeff()).exp().matrix();
    const auto shifted = row_normalize(semiseparable(Matrix<float>(w.replicate(L, 1)), B, Matrix<float>(Matrix<float>::Ones(L, D)),
                                                     Matrix<float>(u.transpose().array().exp().matrix()), {.heads = D, .groups = D}));
    const Matrix<float> ys = apply(shifted, x);
    Index bad = 0;
    for (Index i = 0; i < ys.size(); ++i) bad += !std::isfinite(ys.data()[i]);
    std::printf("| RWKV keys in [-80, 80], float, wkv(): relative error against double | %lld | %.1e | <= 1e-5 |\n", static_cast<long long>(L), rel(y, yd));
    std::printf("| the same with e^(k - kmax) and row_normalize (the old form): non-finite outputs | %lld | %lld of %lld | (why wkv exists) |\n",
                static_cast<long long>(L), static_cast<long long>(bad), static_cast<long long>(ys.size()));
    failures += !(rel(y, yd) <= 1e-5);
  }

  std::printf("\nB. fp32 against fp64: max |y32 - y64| / max |y64|\n\n| L | Mamba-1 S6 (N = 16) | linear recurrence a = 0.999 | RWKV WKV |\n| --- | --- | --- | --- |\n");
  for (Index L = 100; L <= Lmax; L *= 10) {
    const Matrix<double> dt = uniform<double>(L, D, 0.001, 0.1), A = uniform<double>(D, N, -16, -1), B = uniform<double>(L, N, -1, 1),
                         C = uniform<double>(L, N, -1, 1), x = uniform<double>(L, D, -1, 1);
    const auto Sd = semiseparable(factored_decay(dt, A), B, C, {.heads = D});
    const auto Sf = semiseparable(factored_decay(Matrix<float>(dt.cast<float>()), Matrix<float>(A.cast<float>())), Matrix<float>(B.cast<float>()),
                                  Matrix<float>(C.cast<float>()), {.heads = D});
    const double e1 = rel(apply(Sf, Matrix<float>(x.cast<float>())), apply(Sd, x));
    const Matrix<double> a = Matrix<double>::Constant(L, D, 0.999), b = uniform<double>(L, D, 0.5, 1);
    const double e2 = rel(apply(linear_recurrence(Matrix<float>(a.cast<float>()), Matrix<float>(b.cast<float>())), Matrix<float>(x.cast<float>())),
                          apply(linear_recurrence(a, b), x));
    const Matrix<double> w = uniform<double>(1, D, -0.2, -0.001), k = uniform<double>(L, D, -5, 5), u = uniform<double>(1, D, -1, 1);
    const double e3 = rel(apply(wkv(Matrix<float>(w.cast<float>()), Matrix<float>(k.cast<float>()), Matrix<float>(u.cast<float>())), Matrix<float>(x.cast<float>())),
                          apply(wkv(w, k, u), x));
    std::printf("| %lld | %.1e | %.1e | %.1e |\n", static_cast<long long>(L), e1, e2, e3);
    failures += !(e1 <= 1e-4 && e2 <= 1e-4 && e3 <= 1e-4);
  }

  std::printf("\n%s\n", failures ? "FAILED: a result left its expected range" : "all results within their expected ranges");
  return failures ? 1 : 0;
}
