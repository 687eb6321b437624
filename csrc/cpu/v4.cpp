// CPU loops of DeepSeek-V4's rows (v4_rows.h): quantizing writes and dequantizing reads of
// the 584-byte fp8_ds_mla, 528-byte V4.1 MXFP8 and 68-byte MXFP4 rows in split pages. Slots were range-checked by
// the op layer before the first write; negative slots are padding.
#include <cstring>
#include <memory>

#include "../core/entry.h"
#include "float_env.h"
#include "gather_rows.h"
#include "rows.h"
#include "stream.h"

namespace kvc::cpu {
namespace {

constexpr int64_t kGrain = 64;

// n input values as bf16 bits: the input itself when it is bf16, else rounded into buf.
const uint16_t* as_bf16(const void* src, DType t, int64_t n, uint16_t* buf) {
  if (t == DType::kBFloat16) return static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) buf[i] = float_to_bf16(load_as_float(src, i, t));
  return buf;
}

// tiles x tile values under power-of-two scales (v4_mla_exponent): codes into data, scale bytes
// (UE8M0) into scales. flush: values that would be e4m3 subnormals become +-0 first (into buf,
// a copy of the row: x may be the caller's tensor).
void pow2_tiles(const uint16_t* x, int64_t tiles, int64_t tile, const V4WriteParams& p,
                uint16_t* buf, uint8_t* data, uint8_t* scales) {
  float s[kV41Tiles];  // the most tiles a row has (V4.1: 16)
  tile_amax(x, DType::kBFloat16, tiles, tile, tile, s);
  for (int64_t k = 0; k < tiles; ++k) {
    const int32_t e = v4_mla_exponent(s[k], p.scale_floor);
    if (p.flush_subnormals) {
      const float below = pow2f(e - 6);
      for (int64_t i = k * tile; i < (k + 1) * tile; ++i)
        buf[i] = float_to_bf16(flush_below(bf16_to_float(x[i]), below));
    }
    // IEEE division by 2^e (inf for a tile holding +-inf: finite values -> +-0, inf -> NaN code)
    s[k] = pow2f(e);
    scales[k] = v4_scale_byte(e);
  }
  quantize_tiles(p.flush_subnormals ? buf : x, DType::kBFloat16, tiles, tile, tile, s, data);
}
static_assert(kV4Tiles <= kV41Tiles);

// V4's 584-B row: 7 tiles of 64 NoPE values in fp8, the RoPE values as bf16.
void mla_row(const uint16_t* x, const V4WriteParams& p, uint16_t* buf, uint8_t* data,
             uint8_t* scales) {
  pow2_tiles(x, kV4Tiles, kV4Tile, p, buf, data, scales);
  std::memcpy(data + kV4Nope, x + kV4Nope, 2 * (kV4Dim - kV4Nope));
  scales[kV4Tiles] = 0;
}

void mxfp4_row(const uint16_t* x, uint8_t* packed, uint8_t* scales) {
  float amax[kMxfp4ScaleBytes];
  int32_t e[kMxfp4ScaleBytes];
  tile_amax(x, DType::kBFloat16, kMxfp4ScaleBytes, kMxfp4Block, kMxfp4Block, amax);
  for (int64_t b = 0; b < kMxfp4ScaleBytes; ++b) {
    e[b] = mxfp4_exponent(amax[b]);
    scales[b] = static_cast<uint8_t>(e[b] + 127);
  }
  e2m1_blocks(x, kMxfp4ScaleBytes, e, packed);
}

// One V4 row at (data, footer) decoded into out (mode: raw bytes, bf16 or fp32 values).
void decode_row_v4(V4Format f, MlaGatherMode mode, const uint8_t* data, const uint8_t* footer,
                   const Mxfp4Words* table, uint8_t* out) {
  if (mode == MlaGatherMode::kCopyRow) {
    std::memcpy(out, data, v4_data_bytes(f));
    std::memcpy(out + v4_data_bytes(f), footer, v4_footer_bytes(f));
    return;
  }
  const DType t = mode == MlaGatherMode::kDequantBf16 ? DType::kBFloat16 : DType::kFloat32;
  if (f == V4Format::kMxfp8) {
    for (int64_t k = 0; k < kV41Tiles; ++k)
      decode_row(data + k * kV41Tile, kV41Tile, pow2f(footer[k] - 127), t,
                 out + k * kV41Tile * dtype_size(t));
    return;
  }
  if (f == V4Format::kMla) {
    for (int64_t k = 0; k < kV4Tiles; ++k)
      decode_row(data + k * kV4Tile, kV4Tile, pow2f(footer[k] - 127), t,
                 out + k * kV4Tile * dtype_size(t));
    const uint8_t* rope = data + kV4Nope;
    if (t == DType::kBFloat16) {
      std::memcpy(out + 2 * kV4Nope, rope, 2 * (kV4Dim - kV4Nope));
    } else {
      for (int64_t i = 0; i < kV4Dim - kV4Nope; ++i) {
        uint16_t h;
        std::memcpy(&h, rope + 2 * i, 2);
        store_float(out, kV4Nope + i, bf16_to_float(h), t);
      }
    }
    return;
  }
  e2m1_decode_blocks(data, footer, kMxfp4ScaleBytes, *table, out);
}

}  // namespace

namespace {
// The row's data part is built in `staged` (16-B aligned) and streamed (stream.h); the footer
// bytes, which share lines with other rows' footers, are stored in place.
void write_token(const V4WriteParams& p, int64_t t, int64_t slot, uint16_t* buf, uint8_t* staged) {
  const int64_t dim = v4_dim(p.format);
  const uint16_t* x = as_bf16(static_cast<const uint8_t*>(p.x) + t * p.x_stride * dtype_size(p.dtype),
                              p.dtype, dim, buf);
  const SplitAddress a = v4_address(p.view, slot, p.format);
  if (p.format == V4Format::kMla)
    mla_row(x, p, buf, staged, p.view.base + a.last);
  else if (p.format == V4Format::kMxfp8)
    pow2_tiles(x, kV41Tiles, kV41Tile, p, buf, staged, p.view.base + a.last);  // V4.1: all 512 values
  else
    mxfp4_row(x, staged, p.view.base + a.last);
  stream_row(p.view.base + a.first, staged, v4_data_bytes(p.format));
}
}  // namespace

void v4_write(const V4WriteParams& p) {
  parallel_rows(0, p.num_tokens, kGrain, [&](int64_t begin, int64_t end) {
    uint16_t buf[kV4Dim];
    alignas(64) uint8_t staged[kV4DataBytes];
    for (int64_t t = begin; t < end; ++t)
      if (p.view.valid_slot(p.slots[t])) write_token(p, t, p.slots[t], buf, staged);
    store_fence();
  });
}

void v4_pair_write(const V4WriteParams& mla, const V4WriteParams& idx) {
  parallel_rows(0, mla.num_tokens, kGrain, [&](int64_t begin, int64_t end) {
    uint16_t buf[kV4Dim];
    alignas(64) uint8_t staged[kV4DataBytes];
    for (int64_t t = begin; t < end; ++t) {
      const int64_t slot = mla.slots[t];
      if (!mla.view.valid_slot(slot)) continue;
      write_token(mla, t, slot, buf, staged);
      write_token(idx, t, slot, buf, staged);
    }
    store_fence();
  });
}

void v4_gather(const V4GatherParams& p) {
  const int64_t out_bytes = v4_out_row_bytes(p.format, p.mode);
  std::unique_ptr<Mxfp4Words> table;
  const DefaultFloatEnv env;  // the table's values are products of floats too
  if (p.format == V4Format::kMxfp4 && p.mode != MlaGatherMode::kCopyRow)
    table = std::make_unique<Mxfp4Words>(p.mode == MlaGatherMode::kDequantBf16 ? DType::kBFloat16
                                                                               : DType::kFloat32);
  // a row's data and its footer bytes lie in different lines: both are asked for ahead
  const auto locate = [&](int64_t t, int64_t end) {
    const int64_t ahead = slot_ahead(p.src, p.view, t, end);
    if (ahead >= 0) {
      const SplitAddress a = v4_address(p.view, ahead, p.format);
      prefetch_lines(p.view.base + a.first, v4_data_bytes(p.format));
      prefetch_lines(p.view.base + a.last, v4_footer_bytes(p.format));
    }
    return Located{p.src.slot_of(t, p.view), &p.view};
  };
  gather_rows(p.num_tokens, p.out, p.out_stride, out_bytes, locate,
              [&](const PagedView& v, int64_t slot, uint8_t* out) {
    const SplitAddress a = v4_address(v, slot, p.format);
    decode_row_v4(p.format, p.mode, v.base + a.first, v.base + a.last, table.get(), out);
  });
}

void v4_window_gather(const V4WindowGatherParams& p) {
  gather_rows(p.num_tokens, p.out, p.out_stride, v4_out_row_bytes(p.format, p.mode),
              [&](int64_t t, int64_t) {
                bool swa;
                const int64_t slot = p.src.slot_of(t, p.c_view, p.swa_view, swa);
                return Located{slot, swa ? &p.swa_view : &p.c_view};
              },
              [&](const PagedView& v, int64_t slot, uint8_t* out) {
    const SplitAddress a = v4_address(v, slot, p.format);
    decode_row_v4(p.format, p.mode, v.base + a.first, v.base + a.last, nullptr, out);
  });
}

}  // namespace kvc::cpu
