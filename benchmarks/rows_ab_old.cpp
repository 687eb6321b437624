// Compiled against the old tree's csrc with -Dkvc=kvc_old (bench_rows_ab.py): its public row
// functions, handed to rows_ab.cpp by C linkage.
#include "core/entry.h"
#include "cpu/rows.h"

struct OldRows {
  const char* (*isa)();
  float (*row_amax)(const void*, kvc::DType, int64_t);
  void (*quantize_row)(const void*, kvc::DType, int64_t, float, uint8_t*);
  void (*tile_amax)(const void*, kvc::DType, int64_t, int64_t, int64_t, float*);
  void (*quantize_tiles)(const void*, kvc::DType, int64_t, int64_t, int64_t, const float*, uint8_t*);
  void (*decode_row)(const uint8_t*, int64_t, float, kvc::DType, uint8_t*);
  void (*e2m1_blocks)(const uint16_t*, int64_t, const int32_t*, uint8_t*);
  void (*stream_copy)(uint8_t*, const uint8_t*, int64_t);
  void (*e2m1_decode_bf16)(const uint8_t*, const uint8_t*, int64_t, uint8_t*);  // blocks to bf16
  bool (*avx512_supported)();
  void (*avx512_decode_row)(const uint8_t*, int64_t, float, kvc::DType, uint8_t*);  // without AVX512-BF16
};

namespace {
void e2m1_decode_bf16(const uint8_t* packed, const uint8_t* scales, int64_t blocks, uint8_t* out) {
  static const kvc::cpu::Mxfp4Words words(kvc::DType::kBFloat16);
  kvc::cpu::e2m1_decode_blocks(packed, scales, blocks, words, out);
}
}  // namespace

extern "C" const OldRows* old_rows_table() {
  namespace cpu = kvc::cpu;
  static const OldRows t{cpu::isa, cpu::row_amax, cpu::quantize_row, cpu::tile_amax, cpu::quantize_tiles,
                         cpu::decode_row, cpu::e2m1_blocks, cpu::stream_copy, e2m1_decode_bf16,
                         cpu::avx512::supported, cpu::avx512::decode_row};
  return &t;
}
