// Entry points of DeepSeek-V4's row kernels (v4_kernels.cuh).
#include "../core/entry.h"
#include "launch.cuh"
#include "v4_kernels.cuh"

namespace kvc::cuda {

void v4_write(const V4WriteParams& p, void* stream) {
  dispatch_v4_write(p, StreamLaunch{stream, "kvcache_ext v4_quant_and_cache"});
}

void v4_pair_write(const V4WriteParams& mla, const V4WriteParams& idx, void* stream) {
  dispatch_v4_pair_write(mla, idx, StreamLaunch{stream, "kvcache_ext v4_dsa_write"});
}

void v4_gather(const V4GatherParams& p, void* stream) {
  dispatch_v4_gather(p, StreamLaunch{stream, "kvcache_ext gather_v4"});
}

void v4_window_gather(const V4WindowGatherParams& p, void* stream) {
  dispatch_v4_window_gather(p, StreamLaunch{stream, "kvcache_ext gather_v4_window"});
}

}  // namespace kvc::cuda
