// Entry points of the CUDA writes (kernels in write_kernels.cuh).
#include "../core/entry.h"
#include "launch.cuh"
#include "write_kernels.cuh"

namespace kvc::cuda {

void plain_write(const PlainWriteParams& p, void* stream) {
  dispatch_plain_write(p, StreamLaunch{stream, "kvcache_ext reshape_and_cache"});
}

void kv_write(const PlainWriteParams& k, const PlainWriteParams& v, void* stream) {
  dispatch_kv_write(k, v, StreamLaunch{stream, "kvcache_ext reshape_and_cache_kv"});
}

void mla_write(const MlaWriteParams& p, void* stream) {
  dispatch_mla_write(p, StreamLaunch{stream, "kvcache_ext concat_and_cache_mla"});
}

void indexer_write(const IndexerWriteParams& p, void* stream) {
  dispatch_indexer_write(p, StreamLaunch{stream, "kvcache_ext indexer_k_quant_and_cache"});
}

void dsa_write(const MlaWriteParams& mla, const IndexerWriteParams& idx, void* stream) {
  dispatch_dsa_write(mla, idx, StreamLaunch{stream, "kvcache_ext dsa_write"});
}

}  // namespace kvc::cuda
