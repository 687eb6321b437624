// The op bodies, one per entry of op_list.h (same names, the schema's arguments in order): each
// parses its arguments once into kernel parameters, then runs the CPU loop or launches the CUDA
// kernel on the view's device and current stream. writes.cpp, v4_writes.cpp, gathers.cpp, copy.cpp,
// runs.cpp, plan_runs.cpp.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <optional>
#include <string_view>

namespace kvc::ops {

using at::Tensor;
using OptTensor = std::optional<at::Tensor>;
using Str = c10::string_view;
using OptStr = std::optional<c10::string_view>;

// The parses take std::string_view.
inline std::string_view sv(Str s) { return {s.data(), s.size()}; }
inline std::optional<std::string_view> osv(const OptStr& s) {
  return s ? std::optional<std::string_view>(sv(*s)) : std::nullopt;
}

void reshape_and_cache(const Tensor& key, const Tensor& view, const Tensor& slot_mapping,
                       Str kv_cache_dtype, const OptTensor& scale);
void reshape_and_cache_kv(const Tensor& key, const Tensor& value, const Tensor& k_view,
                          const Tensor& v_view, const Tensor& slot_mapping, Str kv_cache_dtype,
                          const OptTensor& k_scale, const OptTensor& v_scale);
void concat_and_cache_mla(const Tensor& kv_c, const Tensor& k_pe, const Tensor& view,
                          const Tensor& slot_mapping, Str kv_cache_dtype, const OptTensor& scale,
                          OptStr tile_scale);
void indexer_k_quant_and_cache(const Tensor& k, const Tensor& view, const Tensor& slot_mapping,
                               OptStr scale_fmt, Str placement);
void dsa_write(const Tensor& kv_c, const Tensor& k_pe, const Tensor& mla_view, const Tensor& k_idx,
               const Tensor& indexer_view, const Tensor& slot_mapping, Str kv_cache_dtype,
               OptStr scale_fmt, Str placement, OptStr tile_scale);
void reshape_and_cache_kv_split(const Tensor& key, const Tensor& value, const Tensor& view,
                                const Tensor& slot_mapping, bool k_channel_major);
void v4_mla_quant_and_cache(const Tensor& kv, const Tensor& view, const Tensor& slot_mapping,
                            Str scale_floor, Str format, Str subnormals);
void mxfp4_quant_and_cache(const Tensor& k, const Tensor& view, const Tensor& slot_mapping);
void v4_indexer_quant_and_cache(const Tensor& k, const Tensor& view, const Tensor& slot_mapping);
void v4_dsa_write(const Tensor& kv, const Tensor& mla_view, const Tensor& k_idx,
                  const Tensor& indexer_view, const Tensor& slot_mapping, Str scale_floor,
                  Str indexer, Str format, Str subnormals);
void state_write(const Tensor& kv, const Tensor& score, const Tensor& view,
                 const Tensor& slot_mapping);
void gather_mla(const Tensor& view, const Tensor& block_table, const Tensor& cu_seq_lens,
                const OptTensor& seq_starts, Str kv_cache_dtype, const Tensor& out, bool validate,
                const OptTensor& scale);
void gather_mla_slots(const Tensor& view, const Tensor& slots, Str kv_cache_dtype,
                      const Tensor& out, bool validate, const OptTensor& scale);
void gather_kv(const Tensor& view, const Tensor& block_table, const Tensor& cu_seq_lens,
               const OptTensor& seq_starts, const Tensor& out, bool validate,
               const OptTensor& scale);
void gather_kv_slots(const Tensor& view, const Tensor& slots, const Tensor& out, bool validate,
                     const OptTensor& scale);
void gather_indexer(const Tensor& view, const Tensor& block_table, const Tensor& cu_seq_lens,
                    const OptTensor& seq_starts, Str placement, const Tensor& codes,
                    const Tensor& scales, bool validate);
void gather_indexer_slots(const Tensor& view, const Tensor& slots, Str placement,
                          const Tensor& codes, const Tensor& scales, bool validate);
void gather_v4(const Tensor& view, const Tensor& block_table, const Tensor& cu_seq_lens,
               const OptTensor& seq_starts, Str format, const Tensor& out, bool validate);
void gather_v4_slots(const Tensor& view, const Tensor& slots, Str format, const Tensor& out,
                     bool validate);
void gather_v4_window(const Tensor& c_view, const Tensor& c_block_table, const Tensor& swa_view,
                      const Tensor& swa_block_table, const Tensor& seq_lens, const Tensor& cu_out,
                      int64_t ratio, int64_t window, const Tensor& out, bool validate,
                      Str format);
void copy_spans(const Tensor& src, const Tensor& dst, const Tensor& spans);
void check_spans(const Tensor& spans, int64_t src_bytes, int64_t dst_bytes, bool same_buffer,
                 Str name);
void check_slot_mapping(const Tensor& slot_mapping, const Tensor& view);
void runs_of_spans(const Tensor& spans, const Tensor& runs, const Tensor& count);
void check_runs(const Tensor& runs, int64_t src_bytes, int64_t dst_bytes, Str name);
void copy_runs(const Tensor& src, const Tensor& dst, const Tensor& runs);
void plan_token_runs(const Tensor& moves, const Tensor& src_table, const Tensor& dst_table,
                     int64_t src_block_size, int64_t dst_block_size, int64_t src_num_blocks,
                     int64_t dst_num_blocks, int64_t num_tokens, int64_t src_start,
                     int64_t dst_start, const Tensor& runs, const Tensor& count);

}  // namespace kvc::ops
