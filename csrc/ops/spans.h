// The rules of a span list (src offset, dst offset, length) [n, 3], in one place: copy_spans
// checks every call with them, and kvcache_ext.check_spans (NIXL transfers) is this function.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

namespace kvc {

// Lengths >= 0; every span inside both buffers (start > size - length is refused, so start +
// length cannot wrap past 2^63); no two destinations overlapping; and, when src and dst share an
// address space (dst_minus_src: dst's address minus src's), no destination over a source -- a
// memcpy over overlapping bytes is undefined. Empty spans are no copy and overlap nothing.
void check_spans(const int64_t* spans, int64_t n, int64_t src_bytes, int64_t dst_bytes,
                 std::optional<int64_t> dst_minus_src, const char* name = "spans");
// Spans cut into chunks of at most `chunk` bytes: a CPU int64 tensor [num_chunks, 3] (even
// parallel work on the CPU, one thread block each on CUDA).
at::Tensor chunk_spans(const int64_t* spans, int64_t n, int64_t chunk);

}  // namespace kvc
