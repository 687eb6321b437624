// Every kernel's entry point: the CPU loops (csrc/cpu) and the CUDA launches (csrc/cuda), as the
// op layer (csrc/ops) calls them. Plain parameter structs in (params.h, v4_params.h); `stream`
// is a cudaStream_t.
#pragma once

#include "params.h"
#include "v4_params.h"

namespace kvc::cpu {
const char* isa();  // the row loops in use: "scalar", "avx2", "avx512" or "avx512+bf16"
void plain_write(const PlainWriteParams& p);
void mla_write(const MlaWriteParams& p);
void indexer_write(const IndexerWriteParams& p);
void mla_gather(const MlaGatherParams& p);
void indexer_gather(const IndexerGatherParams& p);
void kv_gather(const KvGatherParams& p);
void copy_chunks(const CopyParams& p);
void copy_run_items(const RunCopyParams& p);
void v4_write(const V4WriteParams& p);
void v4_pair_write(const V4WriteParams& mla, const V4WriteParams& idx);
void v4_gather(const V4GatherParams& p);
void v4_window_gather(const V4WindowGatherParams& p);
}  // namespace kvc::cpu

namespace kvc::cuda {
void plain_write(const PlainWriteParams& p, void* stream);
void kv_write(const PlainWriteParams& k, const PlainWriteParams& v, void* stream);
void kv_gather(const KvGatherParams& p, void* stream);
void mla_write(const MlaWriteParams& p, void* stream);
void indexer_write(const IndexerWriteParams& p, void* stream);
void dsa_write(const MlaWriteParams& mla, const IndexerWriteParams& idx, void* stream);
void mla_gather(const MlaGatherParams& p, void* stream);
void indexer_gather(const IndexerGatherParams& p, void* stream);
void copy_chunks(const CopyParams& p, void* stream);
void copy_run_items(const RunCopyParams& p, void* stream);
void v4_write(const V4WriteParams& p, void* stream);
// kMla rows and kMxfp4 rows at the same slots (mla.slots), one launch.
void v4_pair_write(const V4WriteParams& mla, const V4WriteParams& idx, void* stream);
void v4_gather(const V4GatherParams& p, void* stream);
void v4_window_gather(const V4WindowGatherParams& p, void* stream);
}  // namespace kvc::cuda
