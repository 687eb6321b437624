// CUDA write kernels: one warp per cache row, 8 rows per thread block, vector loads and stores
// at the widest width the addresses allow, warp-shuffle amax. No host synchronisation: tokens
// whose slot is outside the view are skipped (never written), so the kernels capture in graphs.
//
// Device code only, and the choice of kernel for a call (dispatch_*), which takes the launch as
// a parameter: write.cu launches on a CUDA stream, tests/simt/ runs the same kernels on the
// host, lane by lane, so that CI without a GPU executes them.
#pragma once
#include "../core/params.h"
#include "device_util.cuh"

namespace kvc::cuda {
namespace {

__device__ __forceinline__ const uint8_t* elem(const void* base, int64_t i, int64_t esize) {
  return static_cast<const uint8_t*>(base) + i * esize;
}

// Each row is written in two steps: load (the token's inputs and its slot, all issued before
// any is used, so their latencies overlap instead of adding up), then store (skipped when the
// slot is outside the view). The inputs hold at least num_tokens rows, so loading them for a
// padding token is safe.

// ---- MLA fp8_ds_mla: lane l owns kv_c values [16 l, 16 l + 16); tile k = lanes 8k..8k+7. ----
struct MlaInputs {
  uint32_t latent[8];  // 16 x 16-bit values
  uint32_t rope[4];    // lanes 0..7: 8 rope values
};

template <bool kAligned>
__device__ __forceinline__ MlaInputs load_mla_fp8(const MlaWriteParams& p, int64_t t, int lane) {
  MlaInputs in;
  load_words<8, kAligned>(elem(p.kv_c, t * p.kv_c_stride + 16 * lane, 2), in.latent);
  if (lane < 8) load_words<4, kAligned>(elem(p.k_pe, t * p.k_pe_stride + 8 * lane, 2), in.rope);
  return in;
}

// N 16-bit values held in words -> floats.
template <bool kHalf, int N>
__device__ __forceinline__ void unpack_words(const uint32_t (&w)[N / 2], float (&x)[N]) {
#pragma unroll
  for (int i = 0; i < N / 2; ++i) unpack2<kHalf>(w[i], x[2 * i], x[2 * i + 1]);
}

// e4m3 codes of x / scale (IEEE division), four to a word.
template <int N>
__device__ __forceinline__ void encode_words(const float (&x)[N], float scale, uint32_t (&codes)[N / 4]) {
#pragma unroll
  for (int i = 0; i < N / 4; ++i)
    codes[i] = pack4_e4m3(x[4 * i] / scale, x[4 * i + 1] / scale, x[4 * i + 2] / scale,
                          x[4 * i + 3] / scale);
}

// The same codes when scale is a tile scale (numerics.h tile_div: no division).
template <int N>
__device__ __forceinline__ void encode_tile_words(const float (&x)[N], const TileDivisor& d,
                                                  uint32_t (&codes)[N / 4]) {
  if (d.y == 0.0f) return encode_words<N>(x, d.s, codes);  // all-zero, tiny or inf tiles
#pragma unroll
  for (int i = 0; i < N / 4; ++i)
    codes[i] = pack4_e4m3(tile_div_fma(x[4 * i], d), tile_div_fma(x[4 * i + 1], d),
                          tile_div_fma(x[4 * i + 2], d), tile_div_fma(x[4 * i + 3], d));
}

// x[i] / scale in place, scale a tile scale (one test of the divisor, not one per value).
template <int N>
__device__ __forceinline__ void tile_divide(float (&x)[N], float scale) {
  const TileDivisor d = tile_divisor(scale);
  if (d.y == 0.0f) {
#pragma unroll
    for (int i = 0; i < N; ++i) x[i] /= scale;
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) x[i] = tile_div_fma(x[i], d);
  }
}

template <bool kHalf, bool kAligned>
__device__ __forceinline__ void store_mla_fp8(const MlaWriteParams& p, int64_t slot,
                                              MlaInputs& in, int lane) {
  float x[16];
  unpack_words<kHalf, 16>(in.latent, x);
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 16; ++i) amax = amax_step(amax, x[i]);
  const float scale = mla_tile_scale(group_max<8>(amax), p.tile_scale);  // every lane: shuffles need all 32
  if (!p.view.valid_slot(slot)) return;
  uint8_t* row = p.view.row(slot);
  uint32_t codes[4];
  encode_tile_words<16>(x, tile_divisor(scale), codes);
  store_words<4, kAligned>(row + 16 * lane, codes);
  if (lane % 8 == 0) {
    const uint32_t s[1] = {float_bits(scale)};
    store_words<1, kAligned>(row + kMlaScalesOffset + 4 * (lane / 8), s);
  }
  if (lane < 8) {  // rope values stored as bf16
    if constexpr (kHalf) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float lo, hi;
        unpack2<true>(in.rope[i], lo, hi);
        in.rope[i] = pack_bf16(lo, hi);  // the paired hardware conversion, NaN made 0x7FC0
      }
    }
    store_words<4, kAligned>(row + kMlaRopeOffset + 16 * lane, in.rope);
  }
}

// Per-tensor fp8 rows (576 B): lane l encodes kv_c values [16 l, 16 l + 16) to bytes 16 l..,
// lanes 0..7 the rope values [8 l, 8 l + 8) to bytes 512 + 8 l.. .
template <bool kHalf, bool kAligned>
__device__ __forceinline__ void store_mla_fp8_tensor(const MlaWriteParams& p, int64_t slot,
                                                     const MlaInputs& in, int lane) {
  if (!p.view.valid_slot(slot)) return;
  const float scale = p.scale.get();
  float x[16];
  unpack_words<kHalf, 16>(in.latent, x);
  uint8_t* row = p.view.row(slot);
  uint32_t codes[4];
  encode_words<16>(x, scale, codes);
  store_words<4, kAligned>(row + 16 * lane, codes);
  if (lane < 8) {
    float r[8];
    unpack_words<kHalf, 8>(in.rope, r);
    uint32_t rope[2];
    encode_words<8>(r, scale, rope);
    store_words<2, kAligned>(row + kMlaLatentDim + 8 * lane, rope);
  }
}

// Unquantized rows are plain copies: the slot is needed before the first load.
__device__ __forceinline__ void mla_auto_row(const MlaWriteParams& p, int64_t slot, int64_t t,
                                             int lane) {
  if (!p.view.valid_slot(slot)) return;
  const int64_t es = dtype_size(p.dtype);
  uint8_t* row = p.view.row(slot);
  warp_copy(row, elem(p.kv_c, t * p.kv_c_stride, es), kMlaLatentDim * es, lane);
  warp_copy(row + kMlaLatentDim * es, elem(p.k_pe, t * p.k_pe_stride, es), kMlaRopeDim * es, lane);
}

// ---- Indexer: lane l owns values [4 l, 4 l + 4); the whole warp reduces the amax. ----
struct IndexerInputs {
  uint32_t k[2];  // 4 x 16-bit values
};

template <bool kAligned>
__device__ __forceinline__ IndexerInputs load_indexer(const IndexerWriteParams& p, int64_t t,
                                                      int lane) {
  IndexerInputs in;
  load_words<2, kAligned>(elem(p.k, t * p.k_stride + 4 * lane, 2), in.k);
  return in;
}

template <bool kHalf, bool kAligned>
__device__ __forceinline__ void store_indexer(const IndexerWriteParams& p, int64_t slot,
                                              const IndexerInputs& in, int lane) {
  float x[4];
  unpack2<kHalf>(in.k[0], x[0], x[1]);
  unpack2<kHalf>(in.k[1], x[2], x[3]);
  const float amax = amax_step(amax_step(amax_step(amax_step(0.0f, x[0]), x[1]), x[2]), x[3]);
  const float scale = indexer_scale(group_max<32>(amax), p.ue8m0);
  if (!p.view.valid_slot(slot)) return;
  const IndexerAddress a = indexer_address(p.view, slot, p.placement);
  // ue8m0 scales are powers of two: multiplying by the reciprocal is the IEEE quotient.
  const float recip = p.ue8m0 ? exact_recip(scale) : 0.0f;
  if (recip != 0.0f) {
#pragma unroll
    for (int i = 0; i < 4; ++i) x[i] *= recip;
  } else {
    tile_divide<4>(x, scale);
  }
  const uint32_t codes[1] = {pack4_e4m3(x[0], x[1], x[2], x[3])};
  store_words<1, kAligned>(p.view.base + a.codes + 4 * lane, codes);
  if (lane == 0) {
    const uint32_t s[1] = {float_bits(scale)};
    store_words<1, kAligned>(p.view.base + a.scale, s);
  }
}

template <bool kHalf, MlaFormat kFormat, bool kAligned>
__global__ void __launch_bounds__(kWarpsPerBlock * kWarp) mla_fp8_kernel(MlaWriteParams p) {
  const int64_t t = warp_row();
  if (t >= p.num_tokens) return;
  const int lane = threadIdx.x % kWarp;
  const int64_t slot = p.slots[t];
  MlaInputs in = load_mla_fp8<kAligned>(p, t, lane);
  if constexpr (kFormat == MlaFormat::kFp8DsMla)
    store_mla_fp8<kHalf, kAligned>(p, slot, in, lane);
  else
    store_mla_fp8_tensor<kHalf, kAligned>(p, slot, in, lane);
}

__global__ void __launch_bounds__(kWarpsPerBlock * kWarp) mla_auto_kernel(MlaWriteParams p) {
  const int64_t t = warp_row();
  if (t < p.num_tokens) mla_auto_row(p, p.slots[t], t, threadIdx.x % kWarp);
}

template <bool kHalf, bool kAligned>
// The indexer write alone: 132-byte rows are too short for a warp, so each warp writes
// kIndexerTokensPerWarp tokens, 8 lanes a token, 16 values a lane.
__global__ void __launch_bounds__(kWarpsPerBlock * kWarp) indexer_kernel(IndexerWriteParams p) {
  const int lane = threadIdx.x % kWarp, sub = lane % kIndexerLanes;
  const int64_t t = warp_row() * kIndexerTokensPerWarp + lane / kIndexerLanes;
  if (warp_row() * kIndexerTokensPerWarp >= p.num_tokens) return;  // whole warp: shuffles below
  const bool live = t < p.num_tokens;
  const int64_t row = live ? t : 0;  // a dead lane group reads row 0 (it exists) and writes nothing
  const int64_t slot = live ? p.slots[t] : -1;
  uint32_t w[8];
  load_words<8, kAligned>(elem(p.k, row * p.k_stride + 16 * sub, 2), w);
  float x[16];
#pragma unroll
  for (int i = 0; i < 8; ++i) unpack2<kHalf>(w[i], x[2 * i], x[2 * i + 1]);
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 16; ++i) amax = amax_step(amax, x[i]);
  const float scale = indexer_scale(group_max<kIndexerLanes>(amax), p.ue8m0);
  if (!p.view.valid_slot(slot)) return;
  const IndexerAddress a = indexer_address(p.view, slot, p.placement);
  const float recip = p.ue8m0 ? exact_recip(scale) : 0.0f;  // ue8m0: exact by multiplication
  if (recip != 0.0f) {
#pragma unroll
    for (int i = 0; i < 16; ++i) x[i] *= recip;
  } else {
    tile_divide<16>(x, scale);
  }
  uint32_t codes[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) codes[i] = pack4_e4m3(x[4 * i], x[4 * i + 1], x[4 * i + 2], x[4 * i + 3]);
  store_words<4, kAligned>(p.view.base + a.codes + 16 * sub, codes);
  if (sub == 0) {
    const uint32_t s[1] = {float_bits(scale)};
    store_words<1, kAligned>(p.view.base + a.scale, s);
  }
}

// The DSA pair in one launch: each warp loads its token's MLA and indexer inputs together,
// then writes the MLA row and the indexer row.
template <bool kHalf, bool kFp8, bool kAligned>
__global__ void __launch_bounds__(kWarpsPerBlock * kWarp) dsa_kernel(MlaWriteParams mla,
                                                                     IndexerWriteParams idx) {
  const int64_t t = warp_row();
  if (t >= mla.num_tokens) return;
  const int lane = threadIdx.x % kWarp;
  const int64_t slot = mla.slots[t];
  const IndexerInputs k = load_indexer<kAligned>(idx, t, lane);
  if constexpr (kFp8) {
    MlaInputs in = load_mla_fp8<kAligned>(mla, t, lane);
    store_mla_fp8<kHalf, kAligned>(mla, slot, in, lane);
  } else {
    mla_auto_row(mla, slot, t, lane);
  }
  store_indexer<kHalf, kAligned>(idx, slot, k, lane);
}

// ---- Plain rows: one warp per (token, head) row. ----
__device__ __forceinline__ void plain_row(const PlainWriteParams& p, int64_t t, int64_t h,
                                          int64_t slot, int lane) {
  const int64_t es = dtype_size(p.dtype);
  const uint8_t* src = elem(p.key, t * p.key_token_stride + h * p.key_head_stride, es);
  uint8_t* dst = p.view.row(slot, h);
  if (p.elem_stride != 0) {  // a channel-major page: element i at i x elem_stride
    for (int64_t i = lane; i < p.head_dim; i += kWarp)
      for (int64_t b = 0; b < es; ++b) dst[i * p.elem_stride + b] = src[i * es + b];
    return;
  }
  if (!p.fp8) {
    warp_copy(dst, src, p.head_dim * es, lane);
    return;
  }
  const float scale = p.scale.get(h);
  for (int64_t i = lane; i < p.head_dim; i += kWarp)
    dst[i] = e4m3_encode(load_as_float(src, i, p.dtype) / scale);
}

__global__ void plain_kernel(PlainWriteParams p) {
  const int64_t r = warp_row();
  if (r >= p.num_tokens * p.num_heads) return;
  const int64_t t = r / p.num_heads, h = r - t * p.num_heads;
  const int64_t slot = p.slots[t];
  if (p.view.valid_slot(slot)) plain_row(p, t, h, slot, threadIdx.x % kWarp);
}

// K and V of one (token, head) by one warp: both rows of a layer in one launch.
__global__ void kv_kernel(PlainWriteParams k, PlainWriteParams v) {
  const int64_t r = warp_row();
  if (r >= k.num_tokens * k.num_heads) return;
  const int64_t t = r / k.num_heads, h = r - t * k.num_heads;
  const int64_t slot = k.slots[t];
  if (!k.view.valid_slot(slot)) return;
  const int lane = threadIdx.x % kWarp;
  plain_row(k, t, h, slot, lane);
  plain_row(v, t, h, slot, lane);
}

// ---- Which kernel a call runs. `launch(kernel, grid, args...)` runs it with
// kWarpsPerBlock * kWarp threads per block. ----
template <class Launch>
void dispatch_plain_write(const PlainWriteParams& p, const Launch& launch) {
  launch(plain_kernel, grid_for(p.num_tokens * p.num_heads), p);
}

template <class Launch>
void dispatch_kv_write(const PlainWriteParams& k, const PlainWriteParams& v, const Launch& launch) {
  launch(kv_kernel, grid_for(k.num_tokens * k.num_heads), k, v);
}

// Host-side: may the aligned variants (kAligned: no run-time alignment tests) run? Every
// address they touch must then be aligned to its access width; these predicates check the
// bases and strides those addresses are built from.
inline bool divides(int64_t align, uintptr_t v) { return v % static_cast<uintptr_t>(align) == 0; }
inline bool view_aligned(const PagedView& v, int64_t align) {
  return divides(align, reinterpret_cast<uintptr_t>(v.base)) && divides(align, v.block_stride) &&
         divides(align, v.head_stride) && divides(align, v.token_stride);
}
inline bool input_aligned(const void* p, int64_t stride_elems, int64_t esize, int64_t align) {
  return divides(align, reinterpret_cast<uintptr_t>(p)) && divides(align, stride_elems * esize);
}
// MLA rows: 16-B accesses at 16-B multiples of the row (codes, rope), 4-B tile scales, 8-B
// per-tensor rope codes; kv_c at 32-B and k_pe at 16-B multiples of a token's row.
inline bool mla_fp8_aligned(const MlaWriteParams& p) {
  const int64_t es = dtype_size(p.dtype);
  return view_aligned(p.view, 16) && input_aligned(p.kv_c, p.kv_c_stride, es, 16) &&
         input_aligned(p.k_pe, p.k_pe_stride, es, 16);
}
// Indexer rows in dsa_write: 4-B code and scale stores, 8-B loads of k.
inline bool dsa_indexer_aligned(const IndexerWriteParams& p) {
  return view_aligned(p.view, 4) && input_aligned(p.k, p.k_stride, 2, 8);
}
// The indexer write alone stores 16 codes a lane: split pages (codes at 128-B multiples of a
// 16-B aligned page); row placement's 132-B rows never are.
inline bool indexer_aligned(const IndexerWriteParams& p) {
  return p.placement == IndexerPlacement::kSplit && divides(16, reinterpret_cast<uintptr_t>(p.view.base)) &&
         divides(16, p.view.block_stride) && input_aligned(p.k, p.k_stride, 2, 16);
}

template <class Launch>
void dispatch_mla_write(const MlaWriteParams& p, const Launch& launch) {
  const unsigned grid = grid_for(p.num_tokens);
  const bool half = p.dtype == DType::kFloat16, al = p.format != MlaFormat::kAuto && mla_fp8_aligned(p);
  constexpr MlaFormat kDs = MlaFormat::kFp8DsMla, kT = MlaFormat::kFp8Tensor;
  switch (p.format) {
    case MlaFormat::kAuto:
      launch(mla_auto_kernel, grid, p);
      break;
    case MlaFormat::kFp8DsMla:
      half ? (al ? launch(mla_fp8_kernel<true, kDs, true>, grid, p) : launch(mla_fp8_kernel<true, kDs, false>, grid, p))
           : (al ? launch(mla_fp8_kernel<false, kDs, true>, grid, p) : launch(mla_fp8_kernel<false, kDs, false>, grid, p));
      break;
    case MlaFormat::kFp8Tensor:
      half ? (al ? launch(mla_fp8_kernel<true, kT, true>, grid, p) : launch(mla_fp8_kernel<true, kT, false>, grid, p))
           : (al ? launch(mla_fp8_kernel<false, kT, true>, grid, p) : launch(mla_fp8_kernel<false, kT, false>, grid, p));
      break;
  }
}

template <class Launch>
void dispatch_indexer_write(const IndexerWriteParams& p, const Launch& launch) {
  const unsigned grid = grid_for((p.num_tokens + kIndexerTokensPerWarp - 1) / kIndexerTokensPerWarp);
  const bool half = p.dtype == DType::kFloat16, al = indexer_aligned(p);
  half ? (al ? launch(indexer_kernel<true, true>, grid, p) : launch(indexer_kernel<true, false>, grid, p))
       : (al ? launch(indexer_kernel<false, true>, grid, p) : launch(indexer_kernel<false, false>, grid, p));
}

template <class Launch>
void dispatch_dsa_write(const MlaWriteParams& mla, const IndexerWriteParams& idx,
                        const Launch& launch) {
  const unsigned grid = grid_for(mla.num_tokens);
  // The op layer guarantees kv_c and k_idx share their dtype when the MLA rows are fp8, and
  // that dsa_write's MLA rows are fp8_ds_mla or auto.
  const bool half = idx.dtype == DType::kFloat16;
  if (mla.format == MlaFormat::kFp8DsMla) {
    const bool al = mla_fp8_aligned(mla) && dsa_indexer_aligned(idx);
    half ? (al ? launch(dsa_kernel<true, true, true>, grid, mla, idx) : launch(dsa_kernel<true, true, false>, grid, mla, idx))
         : (al ? launch(dsa_kernel<false, true, true>, grid, mla, idx) : launch(dsa_kernel<false, true, false>, grid, mla, idx));
  } else {
    half ? launch(dsa_kernel<true, false, false>, grid, mla, idx)
         : launch(dsa_kernel<false, false, false>, grid, mla, idx);
  }
}

}  // namespace
}  // namespace kvc::cuda
