// iattn/core/host_device.hpp: the function markers shared by host and device code, with no other
// dependency (the CUDA kernels' headers include it without Eigen).
//
//   IATTN_HOST_DEVICE   a function callable from host and device code (coefficient accessors)
//   IATTN_DEVICE        a function called from kernels only
//   IATTN_KERNEL        a kernel: __global__ under nvcc; a plain function run by the emulator
//                       (backend/cuda/emulator.hpp) elsewhere
//
// Under nvcc (__CUDACC__) they are CUDA's qualifiers; in every other compiler they are empty or
// `inline`, so the same source is ordinary C++.
#pragma once

#if defined(__CUDACC__)
#define IATTN_HOST_DEVICE __host__ __device__
#define IATTN_DEVICE __device__ inline
#define IATTN_KERNEL __global__
#else
#define IATTN_HOST_DEVICE
#define IATTN_DEVICE inline
#define IATTN_KERNEL inline
#endif
