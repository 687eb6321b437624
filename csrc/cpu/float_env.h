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

// IEEE's default for this scope: round to nearest, every exception masked (no trap), and on
// x86-64 denormals kept in and out (no FTZ / DAZ); the caller's setting after it. Elsewhere
// flush-to-zero has no portable control and is left as the caller set it.
class DefaultFloatEnv {
 public:
#if defined(__x86_64__) || defined(_M_X64)
  DefaultFloatEnv() : saved_(_mm_getcsr()) {
    constexpr unsigned kDefault = 0x1F80, kFlags = 0x3F;  // masks set, RN, no FTZ / DAZ
    changed_ = (saved_ & ~kFlags) != kDefault;             // raised flags alone change nothing
    if (changed_) _mm_setcsr(kDefault | (saved_ & kFlags));
  }
  ~DefaultFloatEnv() {
    if (changed_) _mm_setcsr(saved_);
  }

 private:
  unsigned saved_;
#else
  DefaultFloatEnv() {
    changed_ = std::feholdexcept(&saved_) == 0;  // saves the environment, masks every trap
    std::fesetround(FE_TONEAREST);
  }
  ~DefaultFloatEnv() {
    if (changed_) std::fesetenv(&saved_);
  }

 private:
  std::fenv_t saved_;
#endif
  bool changed_;

 public:
  DefaultFloatEnv(const DefaultFloatEnv&) = delete;
  DefaultFloatEnv& operator=(const DefaultFloatEnv&) = delete;
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
