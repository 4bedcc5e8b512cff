// iattn/backend/cuda/linear_recurrence.hpp: CUDA evaluator of LinearRecurrence:
//   apply        the chunked scan of kernels/linear_recurrence.hpp (per-chunk states, the carry
//                over chunks, per-chunk outputs)
//   materialize  the stable product tiles of kernels/linear_recurrence_tiles.hpp
//   vector       one channel's scan, forward or transposed (kernels/vector_scan.hpp)
#pragma once

#include "../../ops/linear_recurrence.hpp"
#include "evaluator.hpp"
#include "kernels/linear_recurrence.hpp"
#include "kernels/linear_recurrence_tiles.hpp"
#include "vector_scan.hpp"

namespace iattn::cuda_detail {

template <class T>
struct cuda_eval<LinearRecurrence<T>> {
  static constexpr bool applies = true;
  static constexpr bool materializes = true;
  static constexpr bool slices = true;

  static void apply(const LinearRecurrence<T>& n, const cuda& on, const T* x, T* y, Index L) {
    const Index D = n.channels(), chunks = (L + scan_chunk - 1) / scan_chunk;
    if (chunks == 0) return;
    const auto a = upload(n.a(), on.stream), b = upload(n.b(), on.stream);  // (L, D) each
    device_buffer<T> state(chunks * D, on.stream), decay(chunks * D, on.stream);  // (chunks, D)
    const lr_args<T> p{a.data(), b.data(), x, L, D, scan_chunk};
    const simt::launch_config per_chunk{{unsigned(chunks), unsigned((D + scan_threads - 1) / scan_threads)}, {scan_threads}, 0};
    simt::launch("lr_chunk_states", &lr_chunk_states<T>, per_chunk, on.stream, p, state.data(), decay.data());
    simt::launch("chunk_carry", &chunk_carry<T>, {{simt::blocks_for(D, elementwise_threads)}, {elementwise_threads}, 0},
                 on.stream, state.data(), static_cast<const T*>(decay.data()), chunks, D);
    simt::launch("lr_chunk_outputs", &lr_chunk_outputs<T>, per_chunk, on.stream, p,
                 static_cast<const T*>(state.data()), y);
  }

  static void materialize(const LinearRecurrence<T>& n, const cuda& on, Index c, T* out, Index L) {
    const Index tiles = (L + tile_dim - 1) / tile_dim;
    if (tiles == 0) return;
    const auto a = upload(n.a(), on.stream), b = upload(n.b(), on.stream);  // (L, D) each
    const lr_tile_args<T> p{a.data(), b.data(), L, n.channels(), c};
    device_buffer<T> total(tiles, on.stream);
    simt::launch("lr_tile_totals", &lr_tile_totals<T>, {{simt::blocks_for(tiles, 256)}, {256}, 0}, on.stream, p,
                 total.data(), tiles);
    simt::launch("lr_materialize_tiles", &lr_materialize_tiles<T>,
                 {{unsigned(tiles), unsigned(tiles)}, {tile_dim, tile_rows}, 0}, on.stream, p,
                 static_cast<const T*>(total.data()), out);
  }

  static void vector(const LinearRecurrence<T>& n, const cuda& on, Index c, bool transposed, const T* x, T* y, Index L) {
    if (L == 0) return;
    const auto a = upload(n.a(), on.stream), b = upload(n.b(), on.stream);
    run_vector_scan(lr_vector_source<T>{a.data(), b.data(), L, n.channels(), c, transposed}, on, x, y, L);
  }
};

}  // namespace iattn::cuda_detail
