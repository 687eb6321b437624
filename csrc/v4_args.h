// Argument checks of DeepSeek-V4's row ops: tensors in, kernel parameters out (v4_args.cpp).
#pragma once
#include "op_args.h"
#include "v4_kernels.h"

namespace kvc {

// format: "fp8_ds_mla_v4" (x [T, 512], 584-B view rows) or "mxfp4" (x [T, 128], 68-B rows).
V4Format parse_v4_format(std::string_view format);
V4WriteParams v4_write_args(const at::Tensor& x, const at::Tensor& view,
                            const at::Tensor& slot_mapping, V4Format format,
                            std::string_view scale_floor);
// The compressed pair at one slot_mapping: kv [T, 512] -> mla_view (584 B), k_idx [T, 128] ->
// indexer_view (MXFP4, 68 B); the views share a block table, the inputs a dtype.
struct V4PairArgs {
  V4WriteParams mla, idx;
};
V4PairArgs v4_pair_write_args(const at::Tensor& kv, const at::Tensor& mla_view,
                              const at::Tensor& k_idx, const at::Tensor& indexer_view,
                              const at::Tensor& slot_mapping, std::string_view scale_floor);
// The pair with V4's fp8 indexer instead: k_idx [T, 128] bf16 -> V3.2's 132-B row
// (scale_fmt "ue8m0", placement "split") in indexer_view; every argument of both checked here,
// so neither row is written when one argument is wrong.
struct V4Fp8PairArgs {
  V4WriteParams mla;
  IndexerWriteParams idx;
};
V4Fp8PairArgs v4_fp8_pair_write_args(const at::Tensor& kv, const at::Tensor& mla_view,
                                     const at::Tensor& k_idx, const at::Tensor& indexer_view,
                                     const at::Tensor& slot_mapping, std::string_view scale_floor);
V4GatherParams v4_gather_args(const at::Tensor& view, const GatherSource& src, V4Format format,
                              const at::Tensor& out);

struct WindowSource {
  at::Tensor c_block_table, swa_block_table, seq_lens, cu_out;
};
V4WindowGatherParams v4_window_gather_args(const at::Tensor& c_view, const at::Tensor& swa_view,
                                           const WindowSource& src, int64_t ratio, int64_t window,
                                           const at::Tensor& out);
// Value checks (CPU tensors) of a validated window read: lengths >= 0, cu_out the prefix sum of
// each request's rows, out large enough, every block a request reads inside its view.
void check_window_source(const WindowSource& src, const V4WindowGatherParams& p);

}  // namespace kvc
