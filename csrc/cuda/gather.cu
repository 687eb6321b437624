// Entry points of the CUDA gathers (kernels in gather_kernels.cuh).
#include "../core/entry.h"
#include "gather_kernels.cuh"
#include "launch.cuh"

namespace kvc::cuda {

void mla_gather(const MlaGatherParams& p, void* stream) {
  dispatch_mla_gather(p, StreamLaunch{stream, "kvcache_ext gather_mla"});
}

void kv_gather(const KvGatherParams& p, void* stream) {
  dispatch_kv_gather(p, StreamLaunch{stream, "kvcache_ext gather_kv"});
}

void indexer_gather(const IndexerGatherParams& p, void* stream) {
  dispatch_indexer_gather(p, StreamLaunch{stream, "kvcache_ext gather_indexer"});
}

}  // namespace kvc::cuda
