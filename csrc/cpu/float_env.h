// The CPU row loops run under IEEE's default floating-point environment, whatever the caller set:
// a thread that flushes denormals (torch.set_flush_denormal) or rounds upward would otherwise get
// other fp8 codes and scales than the format defines (and than the CUDA kernels write), and
// OpenMP workers need not share the calling thread's setting.
#pragma once
#include <ATen/Parallel.h>

#include <cstdint>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#else
#include <cfenv>
#endif

namespace kvc::cpu {

// Round to nearest, denormals kept (in and out) for this scope; the caller's setting after it.
class DefaultFloatEnv {
 public:
#if defined(__x86_64__) || defined(_M_X64)
  DefaultFloatEnv() : saved_(_mm_getcsr()) {
    constexpr unsigned kDaz = 1u << 6, kRounding = 3u << 13, kFtz = 1u << 15;
    const unsigned want = saved_ & ~(kDaz | kRounding | kFtz);
    changed_ = want != saved_;
    if (changed_) _mm_setcsr(want);
  }
  ~DefaultFloatEnv() {
    if (changed_) _mm_setcsr(saved_);
  }
#else  // rounding only: flush-to-zero has no portable control
  DefaultFloatEnv() : saved_(static_cast<unsigned>(std::fegetround())) {
    changed_ = saved_ != FE_TONEAREST;
    if (changed_) std::fesetround(FE_TONEAREST);
  }
  ~DefaultFloatEnv() {
    if (changed_) std::fesetround(static_cast<int>(saved_));
  }
#endif
  DefaultFloatEnv(const DefaultFloatEnv&) = delete;
  DefaultFloatEnv& operator=(const DefaultFloatEnv&) = delete;

 private:
  unsigned saved_;
  bool changed_;
};

// at::parallel_for whose chunks each run under DefaultFloatEnv (on whichever thread runs them).
template <class F>
void parallel_rows(int64_t begin, int64_t end, int64_t grain, const F& f) {
  at::parallel_for(begin, end, grain, [&f](int64_t b, int64_t e) {
    const DefaultFloatEnv env;
    f(b, e);
  });
}

}  // namespace kvc::cpu
