// Entry point of the one-launch span copy (kernel in copy_kernels.cuh).
#include "../core/entry.h"
#include "copy_kernels.cuh"
#include "launch.cuh"

namespace kvc::cuda {

void copy_chunks(const CopyParams& p, void* stream) {
  if (p.num_chunks > 0) dispatch_copy_chunks(p, StreamLaunch{stream, "kvcache_ext copy_spans"});
}

}  // namespace kvc::cuda

namespace kvc::cuda {

void copy_run_items(const RunCopyParams& p, void* stream) {
  if (p.num_items > 0) dispatch_copy_run_items(p, StreamLaunch{stream, "kvcache_ext copy_runs"});
}

}  // namespace kvc::cuda
