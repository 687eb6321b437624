// Runs the CUDA kernels of csrc/cuda/*_kernels.cuh on the host, one std::thread per lane of a
// warp, so that a machine without a GPU (CI) executes their lane mappings, address
// arithmetic, alignment branches, warp reductions and slot checks. It provides the few CUDA
// built-ins those kernels use and a launch policy for their dispatch_* functions.
//
// What it cannot check: the hardware fp8 conversion (the host path is the software encoder,
// proven equal to the instruction's emulation by tests/test_fp8_vs_cuda.py), the memory model
// and timing. Include it after torch's headers and before the kernel headers.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define KVC_SIMT_CHECK_ALIGNED(p, bytes) ::kvc::simt::check_aligned(p, bytes)

struct uint2 { unsigned x, y; };
struct uint4 { unsigned x, y, z, w; };
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

struct SimtIndex { unsigned x = 0, y = 0, z = 0; };
inline thread_local SimtIndex threadIdx, blockIdx;

namespace kvc::simt {

constexpr int kWarpSize = 32;

// Vector accesses a GPU would fault on (device_util.cuh routes them all through vec<V>()).
inline std::atomic<int> misaligned{0};
inline void check_aligned(const void* p, std::size_t bytes) {
  if (reinterpret_cast<std::uintptr_t>(p) % bytes != 0) misaligned.store(static_cast<int>(bytes));
}

// The lanes of one warp meet at every shuffle. A lane that never arrives (a shuffle under
// divergent control flow, undefined behaviour on a GPU) marks the warp broken after a timeout
// instead of hanging, and the launch then fails.
class Warp {
 public:
  float exchange(int lane, float v, int lane_mask) {
    values_[lane] = v;
    meet();
    const float r = values_[(lane ^ lane_mask) & (kWarpSize - 1)];
    meet();
    return r;
  }
  bool broken() const { return broken_; }

 private:
  void meet() {
    std::unique_lock<std::mutex> lock(mutex_);
    if (broken_) return;  // after a miss, every lane runs to the end without waiting
    const uint64_t generation = generation_;
    if (++arrived_ == kWarpSize) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    if (!cv_.wait_for(lock, std::chrono::seconds(5),
                      [&] { return generation_ != generation || broken_; })) {
      broken_ = true;
      cv_.notify_all();
    }
  }
  std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  std::atomic<bool> broken_{false};
  float values_[kWarpSize] = {};
};

inline thread_local Warp* current_warp = nullptr;

// launch(kernel, grid, args...) with kThreadsPerBlock threads per block. The kernels never
// synchronise a block (no __syncthreads, no shared memory), so warps are independent: 32 host
// threads, one per lane, run every (block, warp) in turn.
template <int kThreadsPerBlock>
struct HostLaunch {
  template <class... Params, class... Args>
  void operator()(void (*kernel)(Params...), unsigned grid, const Args&... args) const {
    static_assert(kThreadsPerBlock % kWarpSize == 0, "whole warps");
    Warp warp;
    misaligned.store(0);
    std::vector<std::thread> lanes;
    for (int lane = 0; lane < kWarpSize; ++lane) {
      lanes.emplace_back([&, lane] {
        current_warp = &warp;
        for (unsigned b = 0; b < grid && !warp.broken(); ++b) {
          for (int w = 0; w < kThreadsPerBlock / kWarpSize; ++w) {
            blockIdx.x = b;
            threadIdx.x = static_cast<unsigned>(w * kWarpSize + lane);
            kernel(args...);
          }
        }
      });
    }
    for (auto& th : lanes) th.join();
    if (warp.broken()) throw std::runtime_error("simt: a lane missed a warp shuffle (divergent shuffle)");
    if (const int bytes = misaligned.load())
      throw std::runtime_error("simt: a misaligned " + std::to_string(bytes) + "-byte vector access");
  }
};

}  // namespace kvc::simt

inline float __shfl_xor_sync(unsigned /*mask: the whole warp*/, float v, int lane_mask) {
  return kvc::simt::current_warp->exchange(static_cast<int>(threadIdx.x) % kvc::simt::kWarpSize,
                                           v, lane_mask);
}
