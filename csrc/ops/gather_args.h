// One parse per read op (by block table or by slot): arguments in, kernel parameters out, after
// every check -- shapes, dtypes, row formats, the outputs against everything the op reads
// (memory overlap) and, with `validate`, the block table, lengths and slots against the view
// (on the host: a CUDA gather copies its small metadata tensors there, one synchronisation).
// Devices were checked before (op_list.h).
#pragma once
#include <ATen/core/Tensor.h>

#include <string_view>

#include "../core/params.h"
#include "overlap.h"
#include "tensor_args.h"

namespace kvc {

MlaGatherParams parse_gather_mla(const at::Tensor& view, const GatherSource& src,
                                 std::string_view kv_cache_dtype, const at::Tensor& out,
                                 bool validate, const OptTensor& scale);
KvGatherParams parse_gather_kv(const at::Tensor& view, const GatherSource& src,
                               const at::Tensor& out, bool validate, const OptTensor& scale);
IndexerGatherParams parse_gather_indexer(const at::Tensor& view, const GatherSource& src,
                                         std::string_view placement, const at::Tensor& codes,
                                         const at::Tensor& scales, bool validate);

// Shared with v4_args.cpp: outputs apart from what the gather reads and from themselves, and the
// validation of the source.
void check_gather_outputs(std::initializer_list<NamedTensor> outs, const at::Tensor& view,
                          const GatherSource& src, const OptTensor& scale);
void validate_source(const at::Tensor& view, const GatherSource& src, const PagedView& v,
                     int64_t out_rows);

}  // namespace kvc
