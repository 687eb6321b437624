// Target attributes and the small helpers the AVX-512 row loops share (rows_avx512.cpp,
// rows_avx512_decode.cpp). Each function is compiled for AVX-512 by its attribute, not the whole
// file, so the library still loads on any x86-64; rows.cpp calls them only on CPUs that have it.
#pragma once
#if defined(__x86_64__) && defined(__GNUC__)
// GCC 12's avx512fintrin.h seeds some intrinsics with _mm512_undefined_*(), which
// -Wmaybe-uninitialized reports inside the header (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#define KVC_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,f16c")))
#define KVC_AVX512_INLINE __attribute__((target("avx512f,avx512bw,avx512vl,avx2,f16c"), always_inline)) inline
#define KVC_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,f16c")))

#include <cstdint>

namespace kvc::cpu::avx512 {
KVC_AVX512_INLINE __m512i splat(int32_t v) { return _mm512_set1_epi32(v); }
}  // namespace kvc::cpu::avx512

#endif
