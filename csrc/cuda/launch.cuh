// Kernel launches on a CUDA stream, for the dispatch_* functions of the kernel headers, and
// launch-error reporting.
#pragma once
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "device_util.cuh"

namespace kvc::cuda {

struct StreamLaunch {
  void* stream;      // cudaStream_t
  const char* what;  // named in a launch error

  template <class... Params, class... Args>
  void operator()(void (*kernel)(Params...), unsigned grid, const Args&... args) const {
    kernel<<<grid, kWarpsPerBlock * kWarp, 0, static_cast<cudaStream_t>(stream)>>>(args...);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
  }
};

}  // namespace kvc::cuda
