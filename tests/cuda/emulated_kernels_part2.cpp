// The CUDA backend's kernels on the host emulator, part 2 of emulated_kernels_test (see
// emulated_kernels_test.cpp): Wkv, ComplexSemiseparable, Transition, Identity, SoftmaxAttention,
// materialize_all and the channel means (structured and channel by channel), resident
// expressions, and 16-bit storage.
#include "emulated_support.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

IATTN_EMULATED_CASE_AT("Wkv apply, materialize, row, col", cuda_test::wkv_cases, cuda_test::serial_matrices)
IATTN_EMULATED_CASE_AT("ComplexSemiseparable apply, materialize, row, col (alone and diag * S * conv)",
                       cuda_test::complex_semiseparable_cases, cuda_test::serial_matrices)
IATTN_EMULATED_CASE_AT("Transition apply, materialize, row, col (the delta-rule family, alone and diag * S * conv)",
                       cuda_test::transition_cases, cuda_test::serial_shuffles)
IATTN_EMULATED_CASE_AT("Identity apply, materialize, row, col (beside, in products, scaled, flipped)",
                       cuda_test::identity_cases, cuda_test::serial_matrices)
IATTN_EMULATED_CASE_AT("SoftmaxAttention apply, materialize, row, col", cuda_test::softmax_cases, cuda_test::serial_matrices)
// The means' own kernel has no barrier, and the materialize kernels they call run on the serial
// schedules above: the concurrent schedule only.
TEST_CASE("materialize_all, channel and head means, concurrent", "[kernels][concurrent][concurrent-only]") {
  cuda_test::mean_cases<float>(on(schedule::concurrent), catch_check{}, concurrent_lengths);
  if (!under_tsan) cuda_test::mean_cases<double>(on(schedule::concurrent), catch_check{}, concurrent_lengths);
}

// The structured means: the head path's own kernel has no barrier and its cores' materialize
// kernels run on the serial schedules in their cases (concurrent only); the blocked products'
// tiles have barriers (both).
TEST_CASE("Structured channel means: head cores, concurrent", "[kernels][concurrent][concurrent-only]") {
  cuda_test::head_mean_cases<float>(on(schedule::concurrent), catch_check{}, concurrent_lengths);  // float only
}
IATTN_EMULATED_CASE_AT("Structured channel means: blocked (channel, state) products", cuda_test::blocked_mean_cases,
                       cuda_test::serial_structured)

TEST_CASE("device_expression: copied once, the same results, one stream", "[kernels][concurrent][concurrent-only]") {
  cuda_test::resident_cases<float>(on(schedule::concurrent), catch_check{}, concurrent_lengths);
  if (!under_tsan) cuda_test::resident_cases<double>(on(schedule::concurrent), catch_check{}, concurrent_lengths);
}

// ---- 16-bit storage ----------------------------------------------------------------------------

namespace storage_test {

/// Bit pattern b's value, for a 16-bit format of e_bits exponent and m_bits mantissa bits (IEEE
/// layout, bias 2^(e_bits-1) - 1), by ldexp in double: the oracle of to_float.
double decode(std::uint16_t b, int e_bits, int m_bits) {
  const int bias = (1 << (e_bits - 1)) - 1, emax = (1 << e_bits) - 1;
  const int e = (b >> m_bits) & emax, m = b & ((1 << m_bits) - 1);
  const double sign = (b >> 15) ? -1.0 : 1.0;
  if (e == emax) return m ? std::numeric_limits<double>::quiet_NaN() : sign * std::numeric_limits<double>::infinity();
  if (e == 0) return sign * std::ldexp(double(m), 1 - bias - m_bits);
  return sign * std::ldexp(double((1 << m_bits) + m), e - bias - m_bits);
}

/// The format's positive finite values, indexed by bit pattern (0 .. largest finite).
std::vector<double> positives(int e_bits, int m_bits) {
  std::vector<double> v;
  const int largest = (((1 << e_bits) - 1) << m_bits) - 1;
  for (int b = 0; b <= largest; ++b) v.push_back(decode(std::uint16_t(b), e_bits, m_bits));
  return v;
}

/// The pattern nearest f (not NaN), ties to the even pattern; from the largest finite value plus
/// half its spacing on, infinity: the oracle of round_to, by search in the table above.
std::uint16_t nearest(float f, const std::vector<double>& pos, int e_bits, int m_bits) {
  const std::uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::abs(double(f)), top = pos.back(), spacing = top - pos[pos.size() - 2];
  if (a >= top + spacing / 2) return std::uint16_t(sign | (((1 << e_bits) - 1) << m_bits));
  const std::size_t k = std::size_t(std::lower_bound(pos.begin(), pos.end(), a) - pos.begin());
  if (k == pos.size()) return std::uint16_t(sign | (k - 1));
  if (pos[k] == a || k == 0) return std::uint16_t(sign | k);
  const double below = a - pos[k - 1], above = pos[k] - a;
  const std::size_t pick = below < above ? k - 1 : above < below ? k : (k % 2 == 0 ? k : k - 1);
  return std::uint16_t(sign | pick);
}

template <class S>
void against_oracle(int e_bits, int m_bits) {
  using iattn::round_to;
  using iattn::to_float;
  const std::vector<double> pos = positives(e_bits, m_bits);
  // to_float: every pattern against the ldexp decoding.
  long long wrong = 0;
  for (int b = 0; b < 65536; ++b) {
    const double want = decode(std::uint16_t(b), e_bits, m_bits);
    const float got = to_float(S{std::uint16_t(b)});
    wrong += std::isnan(want) ? !std::isnan(got) : (double(got) != want || std::signbit(got) != std::signbit(want));
  }
  CHECK(wrong == 0);
  // round_to: every value, every midpoint between neighbours (the ties), a step either side of
  // each midpoint, and 2^21 random float patterns against the nearest-value search.
  std::vector<float> probes;
  long long inexact = 0;  // a midpoint is a float: the ties are exact
  for (std::size_t k = 0; k + 1 < pos.size(); ++k) {
    const float mid = float((pos[k] + pos[k + 1]) / 2);
    inexact += double(mid) != (pos[k] + pos[k + 1]) / 2;
    for (float v : {float(pos[k]), mid, std::nextafter(mid, 0.0f), std::nextafter(mid, std::numeric_limits<float>::infinity())}) {
      probes.push_back(v);
      probes.push_back(-v);
    }
  }
  CHECK(inexact == 0);
  std::uniform_int_distribution<std::uint32_t> bits;
  for (int i = 0; i < (1 << 21); ++i) probes.push_back(std::bit_cast<float>(bits(test::rng())));
  for (float v : {65504.0f, 65519.99f, 65520.0f, 3.3895314e38f, 3.3961e38f, 3.4028235e38f,
                  std::numeric_limits<float>::infinity(), std::numeric_limits<float>::denorm_min()})
    probes.insert(probes.end(), {v, -v});
  wrong = 0;
  long long nans = 0;
  for (float f : probes) {
    const std::uint16_t got = round_to<S>(f).bits;
    if (std::isnan(f)) {  // a quiet NaN of the same sign
      ++nans;
      wrong += !std::isnan(to_float(S{got})) || (got & 0x8000) != (std::bit_cast<std::uint32_t>(f) >> 16 & 0x8000) ||
               !(got & (1 << (m_bits - 1)));
      continue;
    }
    wrong += got != nearest(f, pos, e_bits, m_bits);
  }
  INFO(probes.size() << " probes, " << nans << " NaN");
  CHECK(wrong == 0);
  CHECK(nans > 0);
}

}  // namespace storage_test

TEST_CASE("16-bit storage: to_float and round_to against an independent oracle", "[storage]") {
  SECTION("float16") { storage_test::against_oracle<iattn::float16>(5, 10); }
  SECTION("bfloat16") { storage_test::against_oracle<iattn::bfloat16>(8, 7); }
}

// The conversion kernels have no barrier; the apply kernels behind them run on the serial
// schedules in their own cases: the concurrent schedule only.
TEST_CASE("16-bit storage: convert, apply and bind with float16 / bfloat16 X, concurrent",
          "[kernels][concurrent][concurrent-only]") {
  cuda_test::storage16_cases<float>(on(schedule::concurrent), catch_check{}, concurrent_lengths);
}

