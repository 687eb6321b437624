// One NVTX range per op call, visible in `nsys profile -t cuda,nvtx`. NVTX3 is header-only;
// without its headers (CPU-only builds) the range compiles to nothing.
#pragma once
#if defined(KVC_WITH_NVTX)
#include <nvtx3/nvToolsExt.h>
#endif

namespace kvc {
struct NvtxRange {
#if defined(KVC_WITH_NVTX)
  explicit NvtxRange(const char* name) { nvtxRangePushA(name); }
  ~NvtxRange() { nvtxRangePop(); }
#else
  explicit NvtxRange(const char*) {}
#endif
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};
}  // namespace kvc
