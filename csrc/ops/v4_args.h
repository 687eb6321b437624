// One parse per DeepSeek-V4 op (rows in core/v4_rows.h): arguments in, kernel parameters out,
// after every check, as write_args.h and gather_args.h do for the other ops.
#pragma once
#include <ATen/core/Tensor.h>

#include <string_view>

#include "../core/v4_params.h"
#include "tensor_args.h"

namespace kvc {

// format: "fp8_ds_mla_v4" (584-B rows <-> 512 values), "v41_mxfp8" (DeepSeek-V4.1's 528-B rows
// <-> 512 values) or "mxfp4" (68-B rows <-> 128 values).
V4Format parse_v4_format(std::string_view format);

// Main-KV rows, format "fp8_ds_mla_v4" or "v41_mxfp8". The rounding choices where engines'
// writers differ (kvcache_ext/ops/profiles.py names each engine's): scale_floor "amax" / "scale"
// (the floor 1e-4 of the tile amax, or of the scale), subnormals "keep" / "flush".
V4WriteParams parse_v4_mla_quant_and_cache(const at::Tensor& kv, const at::Tensor& view,
                                           const at::Tensor& slot_mapping,
                                           std::string_view scale_floor, std::string_view format,
                                           std::string_view subnormals, bool on_host);
V4WriteParams parse_mxfp4_quant_and_cache(const at::Tensor& k, const at::Tensor& view,
                                          const at::Tensor& slot_mapping, bool on_host);

// V4's fp8 indexer row: V3.2's 132-B row (scale_fmt "ue8m0", placement "split") of k rounded to
// bf16 first. `k_bf16` holds the rounded copy the kernel reads (k itself when it is bf16); it
// is made after every check, overlap included, ran on the caller's k.
struct V4IndexerWrite {
  IndexerWriteParams p;
  at::Tensor k_bf16;
};
V4IndexerWrite parse_v4_indexer_quant_and_cache(const at::Tensor& k, const at::Tensor& view,
                                                const at::Tensor& slot_mapping, bool on_host);

// A compressed group's pair at one slot_mapping: kv [T, 512] -> mla_view (584 B, or 528 B with
// format "v41_mxfp8"), k_idx
// [T, 128] -> indexer_view: MXFP4 (68 B, `mxfp4`) or V4's fp8 indexer (`fp8`, with its bf16
// copy of k_idx). Every argument of both rows is checked before either is written.
struct V4PairWrite {
  V4WriteParams mla;
  bool fp8_indexer;
  V4WriteParams mxfp4;
  V4IndexerWrite fp8;
};
V4PairWrite parse_v4_dsa_write(const at::Tensor& kv, const at::Tensor& mla_view,
                               const at::Tensor& k_idx, const at::Tensor& indexer_view,
                               const at::Tensor& slot_mapping, std::string_view scale_floor,
                               std::string_view indexer, std::string_view format,
                               std::string_view subnormals, bool on_host);

V4GatherParams parse_gather_v4(const at::Tensor& view, const GatherSource& src,
                               std::string_view format, const at::Tensor& out, bool validate);

struct WindowSource {
  at::Tensor c_block_table, swa_block_table, seq_lens, cu_out;
};
V4WindowGatherParams parse_gather_v4_window(const at::Tensor& c_view, const at::Tensor& swa_view,
                                            const WindowSource& src, int64_t ratio,
                                            int64_t window, const at::Tensor& out, bool validate,
                                            std::string_view format);

}  // namespace kvc
