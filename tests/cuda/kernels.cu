// Every kernel of the CUDA backend, instantiated for float and double (and each states-per-thread
// variant of the scan), in a translation unit free of Eigen: what tests/cuda/ptxas_check.py
// compiles for sm_80 and sm_90 and checks ptxas' resource report of (no local-memory spills, the
// register floor per kernel). The vector scan kernels are instantiated for both of their sources
// (Semiseparable, LinearRecurrence). A new kernel gets a line here and a row in ptxas_check.py's
// table.
#include <iattn/backend/cuda/kernels/all.hpp>

namespace iattn::cuda_detail {

#define IATTN_INSTANTIATE_KERNELS(T)                                                                                 \
  template __global__ void diagonal_apply<T>(diagonal_args<T>);                                                      \
  template __global__ void causal_conv_apply<T>(causal_conv_args<T>);                                                \
  template __global__ void chunk_carry<T>(T*, const T*, simt::index, simt::index);                                   \
  template __global__ void lr_chunk_states<T>(lr_args<T>, T*, T*);                                                   \
  template __global__ void lr_chunk_outputs<T>(lr_args<T>, const T*, T*);                                            \
  template __global__ void ss_chunk_states<T, 1>(ss_scan_args<T>, T*, T*);                                           \
  template __global__ void ss_chunk_states<T, 2>(ss_scan_args<T>, T*, T*);                                           \
  template __global__ void ss_chunk_states<T, 4>(ss_scan_args<T>, T*, T*);                                           \
  template __global__ void ss_chunk_outputs<T, 1>(ss_scan_args<T>, const T*, T*);                                    \
  template __global__ void ss_chunk_outputs<T, 2>(ss_scan_args<T>, const T*, T*);                                    \
  template __global__ void ss_chunk_outputs<T, 4>(ss_scan_args<T>, const T*, T*);                                    \
  template __global__ void ss_channel_states<T, 4, ss_decay_form::factored>(ss_scan_args<T>, T*, T*);                \
  template __global__ void ss_channel_outputs<T, 4, ss_decay_form::factored>(ss_scan_args<T>, const T*, T*);         \
  template __global__ void ss_channel_states<T, 4, ss_decay_form::per_head>(ss_scan_args<T>, T*, T*);                \
  template __global__ void ss_channel_outputs<T, 4, ss_decay_form::per_head>(ss_scan_args<T>, const T*, T*);         \
  template __global__ void ss_channel_states<T, 4, ss_decay_form::per_state>(ss_scan_args<T>, T*, T*);               \
  template __global__ void ss_channel_outputs<T, 4, ss_decay_form::per_state>(ss_scan_args<T>, const T*, T*);        \
  template __global__ void ss_channel_states<T, 16, ss_decay_form::factored>(ss_scan_args<T>, T*, T*);               \
  template __global__ void ss_channel_outputs<T, 16, ss_decay_form::factored>(ss_scan_args<T>, const T*, T*);        \
  template __global__ void ss_channel_states<T, 16, ss_decay_form::per_head>(ss_scan_args<T>, T*, T*);               \
  template __global__ void ss_channel_outputs<T, 16, ss_decay_form::per_head>(ss_scan_args<T>, const T*, T*);        \
  template __global__ void ss_channel_states<T, 16, ss_decay_form::per_state>(ss_scan_args<T>, T*, T*);              \
  template __global__ void ss_channel_outputs<T, 16, ss_decay_form::per_state>(ss_scan_args<T>, const T*, T*);       \
  template __global__ void ss_tile_totals<T>(ss_view<T>, simt::index, T*, simt::index);                              \
  template __global__ void ss_tile_factors<T>(ss_view<T>, simt::index, T*, T*);                                     \
  template __global__ void ss_tile_mid<T>(ss_view<T>, simt::index, const T*, simt::index, T*);                      \
  template __global__ void ss_materialize_tiles<T>(ss_view<T>, simt::index, const T*, const T*, const T*,          \
                                                   simt::index, T*);                                                 \
  template __global__ void ss_materialize_macro<T>(ss_view<T>, const T*, const T*, const T*, simt::index, T*);       \
  template __global__ void band_materialize<T>(band_factor<T>, T*, simt::index);                                     \
  template __global__ void band_multiply<T>(band_factor<T>, bool, bool, const T*, T*, simt::index);                  \
  template __global__ void band_vector<T>(band_factor<T>, bool, const T*, T*, simt::index);                          \
  template __global__ void lr_tile_totals<T>(lr_tile_args<T>, T*, simt::index);                                      \
  template __global__ void lr_materialize_tiles<T>(lr_tile_args<T>, const T*, T*);                                   \
  template __global__ void lower_product_tiles<T>(const T*, const T*, T*, simt::index, bool);                        \
  template __global__ void reverse_rows<T>(const T*, T*, simt::index, simt::index);                                  \
  template __global__ void fill_value<T>(T*, simt::index, T);                                                        \
  template __global__ void divide_rows<T>(const T*, const T*, T*, simt::index, simt::index);                         \
  template __global__ void group_norm_stats<T>(const T*, simt::index, simt::index, simt::index, double, bool, T*, T*); \
  template __global__ void group_norm_scale<T>(const T*, const T*, const T*, T*, simt::index, simt::index,            \
                                               simt::index, simt::index, simt::index);                               \
  template __global__ void scan_vector_states<ss_vector_source<T>, T>(ss_vector_source<T>, const T*, T*, T*);        \
  template __global__ void scan_vector_states<lr_vector_source<T>, T>(lr_vector_source<T>, const T*, T*, T*);        \
  template __global__ void scan_vector_outputs<ss_vector_source<T>, T>(ss_vector_source<T>, const T*, const T*, T*); \
  template __global__ void scan_vector_outputs<lr_vector_source<T>, T>(lr_vector_source<T>, const T*, const T*, T*); \
  template __global__ void vector_sum_states<T>(const T*, simt::index, T*, simt::index);                            \
  template __global__ void wkv_scan<T>(wkv_args<T>, simt::index, simt::index, const T*, simt::index, T*, T*,      \
                                       simt::index, wkv_states<T>, wkv_states<T>);                                   \
  template __global__ void wkv_carry<T>(wkv_states<T>, simt::index, simt::index);                                  \
  template __global__ void wkv_transposed<T>(wkv_args<T>, simt::index, const T*, const T*, T*);                     \
  template __global__ void wkv_materialize<T>(wkv_args<T>, simt::index, const T*, T*);                              \
  template __global__ void softmax_apply<T>(softmax_args<T>, simt::index, simt::index, const T*, simt::index, T*);  \
  template __global__ void softmax_stats<T>(softmax_args<T>, simt::index, T*, T*);                                  \
  template __global__ void softmax_entries<T>(softmax_args<T>, simt::index, const T*, const T*, T*);                \
  template __global__ void softmax_transposed<T>(softmax_args<T>, simt::index, const T*, const T*, const T*, T*);   \
  template __global__ void cs_chunk_states<T, 1>(cs_scan_args<T>, T*, T*, T*, T*);                                \
  template __global__ void cs_chunk_states<T, 2>(cs_scan_args<T>, T*, T*, T*, T*);                                \
  template __global__ void cs_chunk_states<T, 4>(cs_scan_args<T>, T*, T*, T*, T*);                                \
  template __global__ void cs_chunk_outputs<T, 1>(cs_scan_args<T>, const T*, const T*, T*);                       \
  template __global__ void cs_chunk_outputs<T, 2>(cs_scan_args<T>, const T*, const T*, T*);                       \
  template __global__ void cs_chunk_outputs<T, 4>(cs_scan_args<T>, const T*, const T*, T*);                       \
  template __global__ void cs_chunk_carry<T>(T*, T*, const T*, const T*, simt::index, simt::index);               \
  template __global__ void transition_scan<T, 4>(tr_scan_args<T>, T*);                                           \
  template __global__ void transition_scan<T, 8>(tr_scan_args<T>, T*);                                           \
  template __global__ void transition_carry<T>(T*, const T*, T*, simt::index, simt::index, simt::index, simt::index); \
  template __global__ void copy_strided<T>(const T*, simt::index, T*, simt::index);                                \
  template __global__ void mean_accumulate<T>(T*, const T*, simt::index, T, bool, bool);                           \
  template __global__ void head_mean_term<T>(head_mean_args<T>, T*);                                              \
  template __global__ void ssd_chunk_states<T>(ss_scan_args<T>, T*, T*);                                          \
  template __global__ void ssd_chunk_outputs<T>(ss_scan_args<T>, const T*, T*);                                              \
  template __global__ void mb_factors<T>(mb_args<T>, T*, T*, T*, T*);                                            \
  template __global__ void mb_mid<T>(mb_args<T>, T*);                                                              \
  template __global__ void mb_tiles<T>(mb_args<T>, const T*, const T*, const T*, const T*, const T*, T, T*);       \
  template __global__ void mb_band<T>(mb_args<T>, simt::index, T, T*);

IATTN_INSTANTIATE_KERNELS(float)
IATTN_INSTANTIATE_KERNELS(double)

// 16-bit storage: read into float and rounded back (storage16.hpp).
template __global__ void widen_values<float16>(const float16*, float*, simt::index);
template __global__ void widen_values<bfloat16>(const bfloat16*, float*, simt::index);
template __global__ void narrow_values<float16>(const float*, float16*, simt::index);
template __global__ void narrow_values<bfloat16>(const float*, bfloat16*, simt::index);

}  // namespace iattn::cuda_detail
