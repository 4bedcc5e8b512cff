// iattn/backend/cuda/semiseparable.hpp: CUDA evaluator of Semiseparable, every form the node has
// (per-state, per-head and factored decays; heads, channels per head, groups; the strict form with
// or without a bonus):
//   apply        the chunked scan of kernels/semiseparable_scan.hpp; N <= 512 (scan_max_state)
//   materialize  the stable tiles of kernels/semiseparable_tiles.hpp; any N
//   vector       one channel's scan, forward or transposed (kernels/vector_scan.hpp); any N
#pragma once

#include "../../ops/semiseparable.hpp"
#include "evaluator.hpp"
#include "kernels/semiseparable_scan.hpp"
#include "kernels/semiseparable_tiles.hpp"
#include "vector_scan.hpp"

#include <string>

namespace iattn::cuda_detail {

/// The most states per channel the scan keeps in registers: 128 lanes x 4 states per lane.
inline constexpr Index scan_max_state = Index(scan_threads) * 4;

/// A Semiseparable's coefficients copied to the device, and the view the kernels read.
template <class T>
struct device_semiseparable {
  device_buffer<T> lambda, A, B, C, bonus;
  ss_view<T> view;

  device_semiseparable(const Semiseparable<T>& n, simt::stream s)
      : lambda(upload(n.lambda(), s)), A(upload(n.decay_rate(), s)), B(upload(n.B(), s)), C(upload(n.C(), s)),
        bonus(upload(n.bonus(), s)) {
    view = ss_view<T>{lambda.data(), n.factored() ? A.data() : nullptr, B.data(), C.data(),
                      n.has_bonus() ? bonus.data() : nullptr, n.length(), n.heads(), n.head_dim(), n.groups(),
                      n.state(), !n.factored() && n.per_state(), n.strict()};
  }
};

template <class T>
struct cuda_eval<Semiseparable<T>> {
  static constexpr bool applies = true;
  static constexpr bool materializes = true;
  static constexpr bool slices = true;

  static void apply(const Semiseparable<T>& n, const cuda& on, const T* x, T* y, Index L) {
    const Index N = n.state(), D = n.channels(), chunks = (L + scan_chunk - 1) / scan_chunk;
    if (N > scan_max_state)
      detail::fail("apply(iattn::cuda, H, X)", "the Semiseparable has N = " + std::to_string(N) +
                                                  " states per channel; the CUDA scan holds at most " +
                                                  std::to_string(scan_max_state) + " (materialize has no limit)");
    if (chunks == 0) return;
    const device_semiseparable<T> ds(n, on.stream);
    unsigned lanes = 1;  // W: the power of two >= N, at most scan_threads
    while (lanes < N && lanes < scan_threads) lanes *= 2;
    const Index per_thread = (N + lanes - 1) / lanes;  // MS: 1, 2 or 4
    device_buffer<T> state(chunks * D * N, on.stream), decay(chunks * D * N, on.stream);  // (chunks, D, N)
    const ss_scan_args<T> args{ds.view, x, scan_chunk, lanes};
    const Index per_block = scan_threads / lanes;
    const simt::launch_config per_chunk{{unsigned(chunks), unsigned((D + per_block - 1) / per_block)}, {scan_threads}, 0};
    auto run = [&](auto ms) {
      constexpr int MS = decltype(ms)::value;
      simt::launch("ss_chunk_states", &ss_chunk_states<T, MS>, per_chunk, on.stream, args, state.data(), decay.data());
      simt::launch("chunk_carry", &chunk_carry<T>,
                   {{simt::blocks_for(D * N, elementwise_threads)}, {elementwise_threads}, 0}, on.stream, state.data(),
                   static_cast<const T*>(decay.data()), chunks, D * N);
      simt::launch("ss_chunk_outputs", &ss_chunk_outputs<T, MS>, per_chunk, on.stream, args,
                   static_cast<const T*>(state.data()), y);
    };
    if (per_thread == 1) run(std::integral_constant<int, 1>{});
    else if (per_thread == 2) run(std::integral_constant<int, 2>{});
    else run(std::integral_constant<int, 4>{});
  }

  static void materialize(const Semiseparable<T>& n, const cuda& on, Index c, T* out, Index L) {
    const Index tiles = (L + tile_dim - 1) / tile_dim;
    if (tiles == 0) return;
    const device_semiseparable<T> ds(n, on.stream);
    device_buffer<T> total(tiles * n.state(), on.stream);  // (tiles, N)
    simt::launch("ss_tile_totals", &ss_tile_totals<T>, {{simt::blocks_for(tiles * n.state(), 256)}, {256}, 0},
                 on.stream, ds.view, n.head_of(c), total.data(), tiles);
    simt::launch("ss_materialize_tiles", &ss_materialize_tiles<T>,
                 {{unsigned(tiles), unsigned(tiles)}, {tile_dim, tile_rows}, 0}, on.stream, ds.view, c,
                 static_cast<const T*>(total.data()), out);
  }

  static void vector(const Semiseparable<T>& n, const cuda& on, Index c, bool transposed, const T* x, T* y, Index L) {
    if (L == 0) return;
    const device_semiseparable<T> ds(n, on.stream);
    const Index h = n.head_of(c);
    run_vector_scan(ss_vector_source<T>{ds.view, h, ds.view.group(h), transposed}, on, x, y, L);
  }
};

}  // namespace iattn::cuda_detail
