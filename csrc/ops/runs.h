// Strided runs [R, 6] = (src offset, dst offset, length, src stride, dst stride, count): their
// rules (check_runs and copy_runs check every call with them), their cut into work items (the
// kernels' RunCopyParams), and the planner's output (plan_runs.cpp).
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace kvc::ops {

// A contiguous CPU int64 tensor [N, width] (TypeError / ValueError naming it otherwise).
const int64_t* rows_arg(const at::Tensor& t, int64_t width, const char* name);

// count >= 1, length >= 0, strides (dst >= length, src >= 0) when count > 1, every piece inside
// both buffers, no two destination pieces overlapping; ValueError / IndexError name the run.
void check_run_rows(const int64_t* runs, int64_t n, int64_t src_bytes, int64_t dst_bytes,
                    const std::string& name);
// Runs cut into items of about `chunk` bytes: a CPU int64 tensor [num_items, 6].
at::Tensor run_items(const int64_t* runs, int64_t n, int64_t chunk);

}  // namespace kvc::ops
