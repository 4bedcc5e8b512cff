// iattn/backend/cuda/vector_scan.hpp: the launches of the one-channel vector scan
// (kernels/vector_scan.hpp): y = H^c x or (H^c)^T x for a Semiseparable or a LinearRecurrence,
// four passes (chunk states, chunk carry, chunk outputs, the sum over states), O(L N).
#pragma once

#include "band.hpp"
#include "kernels/vector_scan.hpp"
#include "memory.hpp"

namespace iattn::cuda_detail {

/// y = the source's matrix (or its transpose, as src.transposed says) times x; x, y length L.
template <class Src, class T>
void run_vector_scan(const Src& src, const cuda& on, const T* x, T* y, Index L) {
  const Index N = src.states(), chunks = (L + scan_chunk - 1) / scan_chunk;
  if (chunks == 0) return;
  device_buffer<T> state(chunks * N, on.stream), decay(chunks * N, on.stream), part(L * N, on.stream);
  const simt::launch_config per_pair = elementwise_launch(chunks * N);
  simt::launch("scan_vector_states", &scan_vector_states<Src, T>, per_pair, on.stream, src, x, state.data(), decay.data());
  simt::launch("chunk_carry", &chunk_carry<T>, elementwise_launch(N), on.stream, state.data(),
               static_cast<const T*>(decay.data()), chunks, N);
  simt::launch("scan_vector_outputs", &scan_vector_outputs<Src, T>, per_pair, on.stream, src, x,
               static_cast<const T*>(state.data()), part.data());
  simt::launch("vector_sum_states", &vector_sum_states<T>, elementwise_launch(L), on.stream,
               static_cast<const T*>(part.data()), N, y, L);
}

}  // namespace iattn::cuda_detail
