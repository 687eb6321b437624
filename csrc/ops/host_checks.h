// Checks that read tensor values on the host (slots, block tables, lengths), run before anything
// is written: always on the CPU, and for a validated CUDA gather on host copies of its small
// metadata tensors. The tensors here are CPU tensors whose shapes were checked already.
#pragma once
#include <ATen/core/Tensor.h>

#include "tensor_args.h"

namespace kvc {

// Every slot < the view's slots (and >= 0 unless allow_negative: negative slots are padding).
void check_slots_in_range(const at::Tensor& slots, int64_t num_tokens, const PagedView& v,
                          const char* arg, bool allow_negative = true);
// Two tokens of one call with one slot are a caller error (the row would be one token's, or in
// dsa_write half of each). Slots are in range already.
void check_unique_slots(const at::Tensor& slots, int64_t num_tokens, const PagedView& v,
                        const char* arg);
// A write's slot_mapping on the host: both of the above.
void check_slot_values(const at::Tensor& slot_mapping, int64_t num_tokens, const PagedView& v,
                       const char* arg = "slot_mapping");
// A gather's block table, lengths and starts (or slots) against the view and out's rows.
void check_gather_source(const GatherSource& src, const PagedView& v, int64_t out_rows);
// Positions [first, end) of request r read through block-table row r: inside the table and
// every block they touch inside the view (IndexError naming arg otherwise).
void check_table_range(const at::Tensor& bt, const char* arg, int64_t r, int64_t first,
                       int64_t end, const PagedView& v, const char* what);
// CPU copies of a gather source's tensors (for the checks of a validated CUDA gather).
GatherSource on_host(const GatherSource& g);

}  // namespace kvc
