// iattn/backend/cpu/stream.hpp: copies into large results with non-temporal (streaming) stores.
//
// A result far larger than the caches (every channel's matrix: 119 MB for a Vision-Mamba-small
// layer) is written once and not read back by the writer. A plain store to a line that is not in
// the cache first reads the line from memory (read for ownership), doubling the memory traffic; a
// streaming store writes whole lines without reading them. Rows are formed in a cache-resident
// buffer and copied out with stream_copy; stream_fence orders the streamed stores before the
// result is handed to another thread (the caller's parallel loop ends with one per task).
// Without SSE2 (or under nvcc) both are a plain copy and nothing.
#pragma once

#include "../../core/config.hpp"

#include <cstdint>
#include <cstring>

#if !defined(__CUDACC__) && (defined(__SSE2__) || defined(__AVX__) || defined(__AVX512F__))
#include <immintrin.h>
#define IATTN_HAS_STREAM 1
#else
#define IATTN_HAS_STREAM 0
#endif

namespace iattn::cpu_detail {

/// Results at least this large are streamed (smaller ones are likely to be read from the cache).
inline constexpr std::size_t stream_min_bytes = std::size_t(16) << 20;

/// dst[0, n) = src[0, n): the whole 64-byte cache lines of dst with streaming stores, its partial
/// first and last lines with plain ones. dst and src must not overlap.
template <class T>
void stream_copy(T* dst, const T* src, Index n) {
  auto* d = reinterpret_cast<unsigned char*>(dst);
  const auto* s = reinterpret_cast<const unsigned char*>(src);
  std::size_t bytes = std::size_t(n) * sizeof(T);
#if IATTN_HAS_STREAM
  constexpr std::size_t line = 64;
  const std::size_t head = (line - reinterpret_cast<std::uintptr_t>(d) % line) % line;
  if (bytes >= head + 4 * line) {
    std::memcpy(d, s, head);
    d += head, s += head, bytes -= head;
    for (; bytes >= line; d += line, s += line, bytes -= line) {
#if defined(__AVX512F__)
      _mm512_stream_si512(reinterpret_cast<__m512i*>(d), _mm512_loadu_si512(s));
#elif defined(__AVX__)
      for (std::size_t o = 0; o < line; o += 32)
        _mm256_stream_si256(reinterpret_cast<__m256i*>(d + o), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + o)));
#else
      for (std::size_t o = 0; o < line; o += 16)
        _mm_stream_si128(reinterpret_cast<__m128i*>(d + o), _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + o)));
#endif
    }
  }
#endif
  std::memcpy(d, s, bytes);
}

/// Orders the calling thread's streamed stores before its later stores (and the end of the
/// parallel loop that hands the result on).
inline void stream_fence() {
#if IATTN_HAS_STREAM
  _mm_sfence();
#endif
}

}  // namespace iattn::cpu_detail
