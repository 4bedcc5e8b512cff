// Stage timings of the CUDA backend's Semiseparable kernels, one kernel at a time (docs/performance.md,
// "The CUDA backend on an H200"): the scan's passes (chunk states, carry, outputs) of the channel
// layout at chunks of 16 to 128 tokens and of the lane layout, beside `v2`, a reference kernel
// specialised to Mamba-1 (factored decay, one group, one channel per head, int indices, 128
// registers) that shows what the generic kernel still loses; the materialization's kernels
// (factors, totals, tile-pair walk, tiles) beside a cudaMemsetAsync of the same bytes. Mamba-1's
// sizes: D = 1536, N = 16, fp32. An experiment kept for the next round of tuning, not a CMake target:
//   nvcc -std=c++20 -O3 -arch=sm_90 --expt-relaxed-constexpr -Iinclude -isystem /usr/include/eigen3 \
//        bench/cuda_stages.cu -o cuda_stages && ./cuda_stages
#include <iattn/cuda.hpp>
#include <cstdio>
#include <random>
using namespace iattn;
using namespace iattn::cuda_detail;
using Mat = Matrix<float>;

template <class F>
float time_ms(cudaStream_t s, F&& f, int reps = 20) {
  f();
  cudaStreamSynchronize(s);
  cudaEvent_t a, b;
  cudaEventCreate(&a); cudaEventCreate(&b);
  cudaEventRecord(a, s);
  for (int i = 0; i < reps; ++i) f();
  cudaEventRecord(b, s);
  cudaEventSynchronize(b);
  float ms = 0; cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a); cudaEventDestroy(b);
  simt::check(cudaGetLastError(), "lab");
  return ms / reps;
}

// V2: the channel kernel for Mamba-1 (factored, G = 1, P = 1, inclusive) with x and dt loaded 8
// tokens at a time and B, C as float4.
template <int Out>
__global__ __launch_bounds__(128, 4) void v2(const float* x, const float* dt, const float* A, const float* B,
                                             const float* C, int L, int D, int chunk, float* st_io, float* decay,
                                             float* y) {
  const int c = blockIdx.y * 128 + threadIdx.x;
  if (c >= D) return;
  const int j = blockIdx.x, t0 = j * chunk, t1 = min(L, t0 + chunk);
  float st[16], rate[16];
  float dsum = 0;
#pragma unroll
  for (int k = 0; k < 16; ++k) {
    rate[k] = A[c * 16 + k];
    st[k] = Out ? st_io[(size_t(j) * D + c) * 16 + k] : 0.f;
  }
  for (int tb = t0; tb < t1; tb += 8) {
    float xb[8], db[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int t = tb + u < t1 ? tb + u : t1 - 1;
      xb[u] = x[size_t(t) * D + c];
      db[u] = dt[size_t(t) * D + c];
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int t = tb + u;
      if (t < t1) {
        const float4* b4 = reinterpret_cast<const float4*>(B + size_t(t) * 16);
        float bb[16];
#pragma unroll
        for (int q = 0; q < 4; ++q) { float4 v = b4[q]; bb[4*q] = v.x; bb[4*q+1] = v.y; bb[4*q+2] = v.z; bb[4*q+3] = v.w; }
        float acc = 0;
        if (Out) {
          const float4* c4 = reinterpret_cast<const float4*>(C + size_t(t) * 16);
          float cc[16];
#pragma unroll
          for (int q = 0; q < 4; ++q) { float4 v = c4[q]; cc[4*q] = v.x; cc[4*q+1] = v.y; cc[4*q+2] = v.z; cc[4*q+3] = v.w; }
#pragma unroll
          for (int k = 0; k < 16; ++k) { st[k] = expf(db[u] * rate[k]) * st[k] + bb[k] * xb[u]; acc += cc[k] * st[k]; }
          y[size_t(t) * D + c] = acc;
        } else {
          dsum += db[u];
#pragma unroll
          for (int k = 0; k < 16; ++k) st[k] = expf(db[u] * rate[k]) * st[k] + bb[k] * xb[u];
        }
      }
    }
  }
  if (!Out) {
#pragma unroll
    for (int k = 0; k < 16; ++k) {
      st_io[(size_t(j) * D + c) * 16 + k] = st[k];
      decay[(size_t(j) * D + c) * 16 + k] = expf(dsum * rate[k]);
    }
  }
}

int main() {
  cudaStream_t s; cudaStreamCreate(&s);
  {
  const cuda on{s};
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> un(0.f, 1.f);
  const Index D = 1536, N = 16;
  for (Index L : {Index(4096)}) {
    Mat x(L, D), dt(L, D), A(D, N), B(L, N), C(L, N);
    for (Index i = 0; i < x.size(); ++i) x.data()[i] = nd(rng);
    for (Index i = 0; i < dt.size(); ++i) dt.data()[i] = 0.001f + 0.099f * un(rng);
    for (Index i = 0; i < B.size(); ++i) B.data()[i] = nd(rng), C.data()[i] = nd(rng);
    for (Index c = 0; c < D; ++c) for (Index m = 0; m < N; ++m) A(c, m) = -float(m + 1);
    const auto S = semiseparable(factored_decay(dt, A), B, C, {.heads = D});
    const device_semiseparable<float> ds(S, s);
    auto xd = to_device(x, on);
    device_buffer<float> y(L * D, s);
    double upd = double(L) * D * N;
    for (int chunk : {16, 32, 64, 128}) {
      const Index chunks = (L + chunk - 1) / chunk;
      device_buffer<float> st(chunks * D * N, s), dec(chunks * D * N, s);
      ss_scan_args<float> args{ds.view, xd.data(), chunk, 1u};
      args.vec4 = true;
      const simt::launch_config pc{{unsigned(chunks), unsigned((D + 127) / 128)}, {128}, 0};
      const simt::launch_config carry{{simt::blocks_for(D * N, 256)}, {256}, 0};
      float a = time_ms(s, [&] { simt::launch("st", &ss_channel_states<float, 16, ss_decay_form::factored>, pc, s, args, st.data(), dec.data()); });
      float b = time_ms(s, [&] { simt::launch("carry", &chunk_carry<float>, carry, s, st.data(), (const float*)dec.data(), chunks, D * N); });
      float c = time_ms(s, [&] { simt::launch("out", &ss_channel_outputs<float, 16, ss_decay_form::factored>, pc, s, args, (const float*)st.data(), y.data()); });
      std::printf("L=%ld channel chunk=%d: states %.3f ms, carry %.3f ms, outputs %.3f ms, total %.3f ms = %.0f G/s\n", (long)L, chunk, a, b, c, a + b + c, upd / (a + b + c) / 1e6);
      dim3 g(unsigned(chunks), unsigned((D + 127) / 128));
      float a2 = time_ms(s, [&] { v2<0><<<g, 128, 0, s>>>(xd.data(), ds.view.lambda, ds.view.A, ds.view.B, ds.view.C, int(L), int(D), chunk, st.data(), dec.data(), y.data()); });
      float c2 = time_ms(s, [&] { v2<1><<<g, 128, 0, s>>>(xd.data(), ds.view.lambda, ds.view.A, ds.view.B, ds.view.C, int(L), int(D), chunk, st.data(), dec.data(), y.data()); });
      std::printf("L=%ld v2 chunk=%d: states %.3f ms, outputs %.3f ms, total %.3f ms = %.0f G/s\n", (long)L, chunk, a2, c2, a2 + b + c2, upd / (a2 + b + c2) / 1e6);
      if (chunk == 64) {
        const ss_scan_args<float> la{ds.view, xd.data(), chunk, 16u};
        const simt::launch_config lc{{unsigned(chunks), unsigned((D + 7) / 8)}, {128}, 0};
        float a3 = time_ms(s, [&] { simt::launch("lst", &ss_chunk_states<float, 1>, lc, s, la, st.data(), dec.data()); });
        float c3 = time_ms(s, [&] { simt::launch("lout", &ss_chunk_outputs<float, 1>, lc, s, la, (const float*)st.data(), y.data()); });
        std::printf("L=%ld lanes chunk=64: states %.3f ms, outputs %.3f ms\n", (long)L, a3, c3);
      }
    }
    // the whole apply through the public call, for reference
    std::printf("apply(S) public: %.3f ms\n", time_ms(s, [&] { auto r = apply(on, S, xd); }));
  }
  for (Index L : {Index(4096), Index(8192)}) {
    Mat dt(L, D), A(D, N), B(L, N), C(L, N);
    for (Index i = 0; i < dt.size(); ++i) dt.data()[i] = 0.001f + 0.099f * un(rng);
    for (Index i = 0; i < B.size(); ++i) B.data()[i] = nd(rng), C.data()[i] = nd(rng);
    for (Index c = 0; c < D; ++c) for (Index m = 0; m < N; ++m) A(c, m) = -float(m + 1);
    const auto S = semiseparable(factored_decay(dt, A), B, C, {.heads = D});
    const device_semiseparable<float> ds(S, s);
    const Index tiles = (L + 31) / 32;
    device_buffer<float> ct(L * N, s), bt(L * N, s), total(tiles * N, s), mid(tiles * tiles * N, s), out(L * L, s);
    const simt::launch_config per_token{{simt::blocks_for(L * N, 256)}, {256}, 0};
    const simt::launch_config per_tile{{simt::blocks_for(tiles * N, 256)}, {256}, 0};
    float f = time_ms(s, [&] { simt::launch("f", &ss_tile_factors<float>, per_token, s, ds.view, Index(7), ct.data(), bt.data()); });
    float t = time_ms(s, [&] { simt::launch("t", &ss_tile_totals<float>, per_tile, s, ds.view, Index(7), total.data(), tiles); });
    float m = time_ms(s, [&] { simt::launch("m", &ss_tile_mid<float>, per_tile, s, ds.view, Index(7), (const float*)total.data(), tiles, mid.data()); });
    const unsigned macros = unsigned((tiles + 1) / 2);
    float k = time_ms(s, [&] { simt::launch("k", &ss_materialize_macro<float>, {{macros, macros}, {16, 16}, 0}, s, ds.view, (const float*)ct.data(), (const float*)bt.data(), (const float*)mid.data(), tiles, out.data()); });
    float kb = time_ms(s, [&] { simt::launch("kb", &ss_materialize_tiles<float>, {{2, 2, macros}, {32, 8}, 0}, s, ds.view, Index(7), (const float*)ct.data(), (const float*)bt.data(), (const float*)mid.data(), tiles, out.data()); });
    std::printf("L=%ld macro tiles %.3f ms, band tiles %.3f ms\n", (long)L, k, kb);
    k += kb;
    float z = time_ms(s, [&] { cudaMemsetAsync(out.data(), 0, sizeof(float) * L * L, s); });
    std::printf("L=%ld tiles: factors %.3f ms, totals %.3f, mid %.3f, tiles %.3f (%.0f GB/s), memset %.3f (%.0f GB/s)\n", (long)L, f, t, m, k, 4.0 * L * L / k / 1e6, z, 4.0 * L * L / z / 1e6);
    std::printf("materialize(S) public: %.3f ms\n", time_ms(s, [&] { auto r = materialize(on, S, 7); }));
  }
  }
  cudaStreamDestroy(s);
}
