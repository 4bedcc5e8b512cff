// tests/cuda/emulated_support.hpp: what the emulated kernel tests' translation units share
// (emulated_kernels_test.cpp, emulated_kernels_part2.cpp: one program, two units compiled side by
// side): the Catch2 check, the emulated streams, the schedules' lengths under ThreadSanitizer, and
// the macro that makes a case's concurrent and serial TEST_CASEs.
#pragma once

#if defined(IATTN_CATCH2_V3)
#include <catch2/catch_all.hpp>
#else
#include <catch2/catch.hpp>
#endif

#include "kernel_cases.hpp"

namespace {

using iattn::simt::schedule;
namespace simt = iattn::simt;

/// Reports a case's comparison as one Catch2 assertion.
struct catch_check {
  void operator()(const std::string& what, double err, double allowed) const {
    INFO(what << ": max abs error " << err << ", allowed " << allowed);
    CHECK(err <= allowed);
  }
};

iattn::cuda on(schedule s) { return iattn::cuda{simt::emulated_stream{s}}; }

#if defined(__SANITIZE_THREAD__)
constexpr bool under_tsan = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
constexpr bool under_tsan = true;
#else
constexpr bool under_tsan = false;
#endif
#else
constexpr bool under_tsan = false;
#endif
/// The concurrent schedule's lengths: under ThreadSanitizer (5-15x slower) the serial ones, which
/// reach the same tails and code paths, with the rows and columns of the matrix cases (without
/// the widest configurations: the 8-lane Transition already shuffles; the structured means of the
/// Semiseparable's head cores only, one run per path: the other cores' materializations run in
/// their own cases, the options change no kernel).
const cuda_test::lengths tsan_lengths = [] {
  cuda_test::lengths l = cuda_test::serial;
  l.slices = true;
  l.widest = false;
  l.every_core = false;
  l.thorough = false;
  return l;
}();
const cuda_test::lengths& concurrent_lengths = under_tsan ? tsan_lengths : cuda_test::emulated;

}  // namespace

// Each case: float and double on the concurrent schedule; float on both serial schedules (the
// barrier logic does not depend on the scalar type), at the shorter serial lengths (the new
// matrix cases at one length: serial_matrices; rows and columns, whose kernels have no barrier,
// on the concurrent schedule only). Under ThreadSanitizer float only, for the same reason, except
// the cases whose kernels take another schedule in double (IATTN_EMULATED_CASE_BOTH: the
// Semiseparable channel scan's batch, channel_scan_batch).
#define IATTN_EMULATED_CASE_IMPL(title, cases, serial_lengths, double_under_tsan)             \
  TEST_CASE(title ", concurrent", "[kernels][concurrent]") {                                 \
    cases<float>(on(schedule::concurrent), catch_check{}, concurrent_lengths);               \
    if (!under_tsan || (double_under_tsan))                                                  \
      cases<double>(on(schedule::concurrent), catch_check{}, concurrent_lengths);            \
  }                                                                                          \
  TEST_CASE(title ", serial schedules", "[kernels][serial]") {                               \
    for (schedule s : {schedule::serial_forward, schedule::serial_reverse})                  \
      cases<float>(on(s), catch_check{}, serial_lengths);                                    \
  }
#define IATTN_EMULATED_CASE_AT(title, cases, serial_lengths) \
  IATTN_EMULATED_CASE_IMPL(title, cases, serial_lengths, false)
#define IATTN_EMULATED_CASE(title, cases) IATTN_EMULATED_CASE_IMPL(title, cases, cuda_test::serial, false)
#define IATTN_EMULATED_CASE_BOTH(title, cases) IATTN_EMULATED_CASE_IMPL(title, cases, cuda_test::serial, true)
