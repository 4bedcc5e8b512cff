// iattn/backend/cuda/semiseparable.hpp: CUDA evaluator of Semiseparable, every form the node has
// (per-state, per-head and factored decays; heads, channels per head, groups; the strict form with
// or without a bonus):
//   apply        the chunked scan of kernels/semiseparable_scan.hpp: the channel layout for
//                N <= 16 (one thread per channel), the lane layout up to N = 512 (scan_max_state);
//                a decay per head and token with heads of 2 or more channels (Mamba-2): the chunked
//                matrix products of kernels/ssd_scan.hpp (any N); apply_scaled folds diagonals
//                around S into either (product.hpp, scan_fold)
//   materialize  the factored stable tiles of kernels/semiseparable_tiles.hpp (factors, tile
//                totals, tile-pair mids, then macro tiles off the diagonal band and the band's
//                tiles); any N
//   vector       one channel's scan, forward or transposed (kernels/vector_scan.hpp); any N
#pragma once

#include "../../ops/semiseparable.hpp"
#include "evaluator.hpp"
#include "kernels/semiseparable_scan.hpp"
#include "kernels/semiseparable_tiles.hpp"
#include "kernels/ssd_scan.hpp"
#include "vector_scan.hpp"

#include <cstdint>
#include <string>
#include <utility>

namespace iattn::cuda_detail {

/// The most states per channel the scan keeps in registers: 128 lanes x 4 states per lane.
inline constexpr Index scan_max_state = Index(scan_threads) * 4;
/// Channels per head from which a per-head decay takes the chunked matrix products (ssd_scan.hpp).
inline constexpr Index ssd_min_head_dim = 2;

/// Diagonals folded into a scan: y = diag(out) S diag(in) x, each (rows, D) on the device, rows = L
/// or 1; null for none.
template <class T>
struct scan_scales {
  const T* in = nullptr;
  Index in_rows = 0;
  const T* out = nullptr;
  Index out_rows = 0;
};

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
    apply_scaled(n, on, x, y, L, scan_scales<T>{});
  }

  /// y = diag(out) S diag(in) x, the diagonals folded into the scan's reads and writes (a
  /// product's apply, product.hpp; null scales for none).
  static void apply_scaled(const Semiseparable<T>& n, const cuda& on, const T* x, T* y, Index L,
                           const scan_scales<T>& scales) {
    const Index N = n.state(), D = n.channels();
    if (takes_ssd(n)) {
      if (L > 0) apply_ssd(n, on, x, y, L, scales);
      return;
    }
    if (N > scan_max_state)
      detail::fail("apply(iattn::cuda, H, X)", "the Semiseparable has N = " + std::to_string(N) +
                                                  " states per channel; the CUDA scan holds at most " +
                                                  std::to_string(scan_max_state) + " (materialize has no limit)");
    if (L == 0) return;
    const device_semiseparable<T> ds(n, on.stream);
    const bool channel_layout = N <= channel_scan_states;  // one thread per channel, all states
    const Index chunk = channel_layout ? channel_scan_chunk : scan_chunk, chunks = (L + chunk - 1) / chunk;
    unsigned lanes = 1;  // W of the lane layout: the power of two >= N, at most scan_threads
    while (!channel_layout && lanes < N && lanes < scan_threads) lanes *= 2;
    device_buffer<T> state(chunks * D * N, on.stream), decay(chunks * D * N, on.stream);  // (chunks, D, N)
    auto aligned = [](const T* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
    const bool vec4 = N % 4 == 0 && aligned(ds.view.B) && aligned(ds.view.C) && aligned(ds.view.lambda);
    const ss_scan_args<T> args{ds.view, x, chunk, lanes, scales.in, scales.in_rows, scales.out, scales.out_rows, vec4};
    const Index per_block = scan_threads / lanes;
    const simt::launch_config per_chunk{{unsigned(chunks), unsigned((D + per_block - 1) / per_block)}, {scan_threads}, 0};
    const simt::launch_config carry{{simt::blocks_for(D * N, elementwise_threads)}, {elementwise_threads}, 0};
    auto run = [&](auto states, auto outputs) {
      simt::launch(states.first, states.second, per_chunk, on.stream, args, state.data(), decay.data());
      simt::launch("chunk_carry", &chunk_carry<T>, carry, on.stream, state.data(), static_cast<const T*>(decay.data()),
                   chunks, D * N);
      simt::launch(outputs.first, outputs.second, per_chunk, on.stream, args, static_cast<const T*>(state.data()), y);
    };
    auto lane_layout = [&](auto ms) {
      constexpr int MS = decltype(ms)::value;
      run(std::pair{"ss_chunk_states", &ss_chunk_states<T, MS>}, std::pair{"ss_chunk_outputs", &ss_chunk_outputs<T, MS>});
    };
    auto channel = [&](auto ns) {  // one kernel pair per decay form
      constexpr int NS = decltype(ns)::value;
      using F = ss_decay_form;
      if (n.factored())
        run(std::pair{"ss_channel_states", &ss_channel_states<T, NS, F::factored>},
            std::pair{"ss_channel_outputs", &ss_channel_outputs<T, NS, F::factored>});
      else if (ds.view.per_state)
        run(std::pair{"ss_channel_states", &ss_channel_states<T, NS, F::per_state>},
            std::pair{"ss_channel_outputs", &ss_channel_outputs<T, NS, F::per_state>});
      else
        run(std::pair{"ss_channel_states", &ss_channel_states<T, NS, F::per_head>},
            std::pair{"ss_channel_outputs", &ss_channel_outputs<T, NS, F::per_head>});
    };
    const Index per_thread = (N + lanes - 1) / lanes;  // MS of the lane layout: 1, 2 or 4
    if (channel_layout && N <= 4) channel(std::integral_constant<int, 4>{});
    else if (channel_layout) channel(std::integral_constant<int, int(channel_scan_states)>{});
    else if (per_thread == 1) lane_layout(std::integral_constant<int, 1>{});
    else if (per_thread == 2) lane_layout(std::integral_constant<int, 2>{});
    else lane_layout(std::integral_constant<int, 4>{});
  }

  static void materialize(const Semiseparable<T>& n, const cuda& on, Index c, T* out, Index L) {
    const Index tiles = (L + tile_dim - 1) / tile_dim, N = n.state(), h = n.head_of(c);
    if (tiles == 0) return;
    const device_semiseparable<T> ds(n, on.stream);
    // The factors (kernels/semiseparable_tiles.hpp): C~ and B~ (L, N), the tiles' totals (tiles, N)
    // and every tile pair's mid (tiles, tiles, N): N / 1024 of the output's size or less for N <= 1024.
    device_buffer<T> ct(L * N, on.stream), bt(L * N, on.stream), total(tiles * N, on.stream),
        mid(tiles * tiles * N, on.stream);
    const simt::launch_config per_token{{simt::blocks_for(L * N, 256)}, {256}, 0};
    const simt::launch_config per_tile{{simt::blocks_for(tiles * N, 256)}, {256}, 0};
    simt::launch("ss_tile_factors", &ss_tile_factors<T>, per_token, on.stream, ds.view, h, ct.data(), bt.data());
    simt::launch("ss_tile_totals", &ss_tile_totals<T>, per_tile, on.stream, ds.view, h, total.data(), tiles);
    simt::launch("ss_tile_mid", &ss_tile_mid<T>, per_tile, on.stream, ds.view, h,
                 static_cast<const T*>(total.data()), tiles, mid.data());
    const unsigned macros = unsigned((tiles + 1) / 2);
    simt::launch("ss_materialize_macro", &ss_materialize_macro<T>, {{macros, macros}, {macro_side, macro_side}, 0},
                 on.stream, ds.view, static_cast<const T*>(ct.data()), static_cast<const T*>(bt.data()),
                 static_cast<const T*>(mid.data()), tiles, out);
    simt::launch("ss_materialize_tiles", &ss_materialize_tiles<T>, {{2, 2, macros}, {tile_dim, tile_rows}, 0},
                 on.stream, ds.view, c, static_cast<const T*>(ct.data()), static_cast<const T*>(bt.data()),
                 static_cast<const T*>(mid.data()), tiles, out);
  }

  /// Whether apply takes the chunked matrix products (kernels/ssd_scan.hpp): one decay per head and
  /// token (not factored, not per state), the inclusive form, and heads of ssd_min_head_dim or more
  /// channels, which share each chunk's decayed Gram matrix.
  static bool takes_ssd(const Semiseparable<T>& n) {
    return !n.factored() && !n.per_state() && !n.strict() && n.head_dim() >= ssd_min_head_dim;
  }

  static void apply_ssd(const Semiseparable<T>& n, const cuda& on, const T* x, T* y, Index L, const scan_scales<T>& scales) {
    const device_semiseparable<T> ds(n, on.stream);
    const Index chunks = (L + ssd_chunk - 1) / ssd_chunk, pairs = n.heads() * n.state() * n.head_dim();
    device_buffer<T> state(chunks * pairs, on.stream), decay(chunks * pairs, on.stream);
    const ss_scan_args<T> args{ds.view, x, ssd_chunk, 1, scales.in, scales.in_rows, scales.out, scales.out_rows, false};
    const simt::launch_config per_chunk{{unsigned(chunks), unsigned(n.heads())}, {ssd_threads}, 0};
    simt::launch("ssd_chunk_states", &ssd_chunk_states<T>, per_chunk, on.stream, args, state.data(), decay.data());
    simt::launch("chunk_carry", &chunk_carry<T>, {{simt::blocks_for(pairs, elementwise_threads)}, {elementwise_threads}, 0},
                 on.stream, state.data(), static_cast<const T*>(decay.data()), chunks, pairs);
    simt::launch("ssd_chunk_outputs", &ssd_chunk_outputs<T>, per_chunk, on.stream, args, static_cast<const T*>(state.data()), y);
  }

  static void vector(const Semiseparable<T>& n, const cuda& on, Index c, bool transposed, const T* x, T* y, Index L) {
    if (L == 0) return;
    const device_semiseparable<T> ds(n, on.stream);
    const Index h = n.head_of(c);
    run_vector_scan(ss_vector_source<T>{ds.view, h, ds.view.group(h), transposed}, on, x, y, L);
  }
};

}  // namespace iattn::cuda_detail
