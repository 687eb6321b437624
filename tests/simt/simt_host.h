// Runs the CUDA kernels of csrc/cuda/*_kernels.cuh on the host, one fiber per lane of a warp
// (ucontext, all on the calling thread), so that a machine without a GPU (CI) executes their lane mappings, address
// arithmetic, alignment branches, warp reductions and slot checks. It provides the few CUDA
// built-ins those kernels use and a launch policy for their dispatch_* functions.
//
// What it cannot check: the hardware fp8 conversion (the host path is the software encoder,
// proven equal to the instruction's emulation by tests/test_fp8_vs_cuda.py), the memory model
// and timing. Include it after torch's headers and before the kernel headers.
#pragma once
#include <ucontext.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
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

// The lanes of one warp meet at every shuffle. Each lane is a fiber on the launching thread; a
// lane that reaches a shuffle hands control back to the launch, which resumes the lanes in turn,
// so one round of resumes moves every lane from one meeting to the next (a switch between
// fibers is a function call, not the kernel's thread switch, which made 32 threads on two cores
// the suite's slowest part). A lane that never arrives (a shuffle under divergent control flow,
// undefined behaviour on a GPU) shows as lanes ending while others wait: the warp is marked
// broken, every lane runs to its end without waiting, and the launch fails.
class Warp {
 public:
  float exchange(int lane, float v, int lane_mask) {
    values_[lane] = v;
    meet(lane);
    const float r = values_[(lane ^ lane_mask) & (kWarpSize - 1)];
    meet(lane);
    return r;
  }
  bool broken() const { return broken_; }

  // Runs body(lane) for the 32 lanes, interleaved at their meetings.
  void run(const std::function<void(int)>& body) {
    constexpr std::size_t kStack = 256 * 1024;
    body_ = &body;
    for (int lane = 0; lane < kWarpSize; ++lane) {
      Lane& l = lanes_[lane];
      l.stack = std::make_unique<char[]>(kStack);
      l.done = false;
      getcontext(&l.context);
      l.context.uc_stack.ss_sp = l.stack.get();
      l.context.uc_stack.ss_size = kStack;
      l.context.uc_link = &launcher_;
      makecontext(&l.context, reinterpret_cast<void (*)()>(&Warp::entry), 2,
                  static_cast<int>(reinterpret_cast<std::uintptr_t>(this) & 0xFFFFFFFFu),
                  static_cast<int>(reinterpret_cast<std::uintptr_t>(this) >> 32));
    }
    for (;;) {
      int live = 0, parked = 0;
      for (int lane = 0; lane < kWarpSize; ++lane) {
        if (lanes_[lane].done) continue;
        ++live;
        current_ = lane;
        swapcontext(&launcher_, &lanes_[lane].context);
        parked += !lanes_[lane].done;
      }
      if (live == 0) break;
      if (parked != 0 && parked != live) broken_ = true;  // some ended while others wait
      if (parked == 0) break;
    }
  }

 private:
  struct Lane {
    ucontext_t context;
    std::unique_ptr<char[]> stack;
    bool done = true;
  };

  static void entry(int low, int high) {
    Warp* w = reinterpret_cast<Warp*>((static_cast<std::uintptr_t>(static_cast<unsigned>(high)) << 32) |
                                      static_cast<unsigned>(low));
    const int lane = w->current_;
    (*w->body_)(lane);
    w->lanes_[lane].done = true;  // uc_link returns to the launcher
  }

  void meet(int lane) {
    if (broken_) return;  // after a miss, every lane runs to the end without waiting
    const SimtIndex thread = threadIdx, block = blockIdx;  // the other lanes set theirs meanwhile
    swapcontext(&lanes_[lane].context, &launcher_);
    threadIdx = thread;
    blockIdx = block;
  }

  ucontext_t launcher_;
  Lane lanes_[kWarpSize];
  int current_ = 0;
  const std::function<void(int)>* body_ = nullptr;
  bool broken_ = false;
  float values_[kWarpSize] = {};
};

inline thread_local Warp* current_warp = nullptr;

// launch(kernel, grid, args...) with kThreadsPerBlock threads per block. The kernels never
// synchronise a block (no __syncthreads, no shared memory), so warps are independent: 32 lanes
// run every (block, warp) in turn, each lane setting threadIdx / blockIdx for itself whenever
// it runs (they are the launching thread's, shared by its fibers).
template <int kThreadsPerBlock>
struct HostLaunch {
  template <class... Params, class... Args>
  void operator()(void (*kernel)(Params...), unsigned grid, const Args&... args) const {
    static_assert(kThreadsPerBlock % kWarpSize == 0, "whole warps");
    auto warp = std::make_unique<Warp>();
    misaligned.store(0);
    Warp* outer = current_warp;
    current_warp = warp.get();
    const std::function<void(int)> body = [&](int lane) {
      for (unsigned b = 0; b < grid && !warp->broken(); ++b) {
        for (int w = 0; w < kThreadsPerBlock / kWarpSize; ++w) {
          blockIdx.x = b;
          threadIdx.x = static_cast<unsigned>(w * kWarpSize + lane);
          kernel(args...);
        }
      }
    };
    warp->run(body);
    current_warp = outer;
    if (warp->broken()) throw std::runtime_error("simt: a lane missed a warp shuffle (divergent shuffle)");
    if (const int bytes = misaligned.load())
      throw std::runtime_error("simt: a misaligned " + std::to_string(bytes) + "-byte vector access");
  }
};

}  // namespace kvc::simt

inline float __shfl_xor_sync(unsigned /*mask: the whole warp*/, float v, int lane_mask) {
  return kvc::simt::current_warp->exchange(static_cast<int>(threadIdx.x) % kvc::simt::kWarpSize,
                                           v, lane_mask);
}
