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
};

extern "C" const OldRows* old_rows_table() {
  namespace cpu = kvc::cpu;
  static const OldRows t{cpu::isa, cpu::row_amax, cpu::quantize_row, cpu::tile_amax, cpu::quantize_tiles,
                         cpu::decode_row, cpu::e2m1_blocks};
  return &t;
}
