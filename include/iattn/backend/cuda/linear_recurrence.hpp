// iattn/backend/cuda/linear_recurrence.hpp: CUDA evaluator of LinearRecurrence: the chunked scan
// of kernels/linear_recurrence.hpp (per-chunk states, the carry over chunks, per-chunk outputs).
#pragma once

#include "../../ops/linear_recurrence.hpp"
#include "evaluator.hpp"
#include "kernels/linear_recurrence.hpp"

namespace iattn::cuda_detail {

template <class T>
struct cuda_eval<LinearRecurrence<T>> {
  static constexpr bool applies = true;
  static constexpr bool materializes = false;

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
};

}  // namespace iattn::cuda_detail
