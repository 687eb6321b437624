// CUDA write kernels: one warp per cache row, 8 rows per thread block, vector loads and stores
// at the widest width the addresses allow, warp-shuffle amax. No host synchronisation: tokens
// whose slot is outside the view are skipped (never written), so the kernels capture in graphs.
#include "../kernels.h"
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

__device__ __forceinline__ MlaInputs load_mla_fp8(const MlaWriteParams& p, int64_t t, int lane) {
  MlaInputs in;
  load_words(elem(p.kv_c, t * p.kv_c_stride + 16 * lane, 2), in.latent);
  if (lane < 8) load_words(elem(p.k_pe, t * p.k_pe_stride + 8 * lane, 2), in.rope);
  return in;
}

template <bool kHalf>
__device__ __forceinline__ void store_mla_fp8(const MlaWriteParams& p, int64_t slot,
                                              MlaInputs& in, int lane) {
  float x[16];
#pragma unroll
  for (int i = 0; i < 8; ++i) unpack2<kHalf>(in.latent[i], x[2 * i], x[2 * i + 1]);
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 16; ++i) amax = fmax_(amax, abs_for_amax(x[i]));
  const float scale = mla_tile_scale(group_max<8>(amax));  // every lane: shuffles need all 32
  if (!p.view.valid_slot(slot)) return;
  uint8_t* row = p.view.row(slot);
  uint32_t codes[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    codes[i] = pack4_e4m3(x[4 * i] / scale, x[4 * i + 1] / scale, x[4 * i + 2] / scale,
                          x[4 * i + 3] / scale);
  store_words(row + 16 * lane, codes);
  if (lane % 8 == 0) {
    const uint32_t s[1] = {float_bits(scale)};
    store_words(row + kMlaScalesOffset + 4 * (lane / 8), s);
  }
  if (lane < 8) {  // rope values stored as bf16
    if constexpr (kHalf) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float lo, hi;
        unpack2<true>(in.rope[i], lo, hi);
        in.rope[i] = float_to_bf16(lo) | (static_cast<uint32_t>(float_to_bf16(hi)) << 16);
      }
    }
    store_words(row + kMlaRopeOffset + 16 * lane, in.rope);
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

__device__ __forceinline__ IndexerInputs load_indexer(const IndexerWriteParams& p, int64_t t,
                                                      int lane) {
  IndexerInputs in;
  load_words(elem(p.k, t * p.k_stride + 4 * lane, 2), in.k);
  return in;
}

template <bool kHalf>
__device__ __forceinline__ void store_indexer(const IndexerWriteParams& p, int64_t slot,
                                              const IndexerInputs& in, int lane) {
  float x[4];
  unpack2<kHalf>(in.k[0], x[0], x[1]);
  unpack2<kHalf>(in.k[1], x[2], x[3]);
  const float amax = fmax_(fmax_(abs_for_amax(x[0]), abs_for_amax(x[1])),
                           fmax_(abs_for_amax(x[2]), abs_for_amax(x[3])));
  const float scale = indexer_scale(group_max<32>(amax), p.ue8m0);
  if (!p.view.valid_slot(slot)) return;
  const IndexerAddress a = indexer_address(p.view, slot, p.placement);
  const uint32_t codes[1] = {pack4_e4m3(x[0] / scale, x[1] / scale, x[2] / scale, x[3] / scale)};
  store_words(p.view.base + a.codes + 4 * lane, codes);
  if (lane == 0) {
    const uint32_t s[1] = {float_bits(scale)};
    store_words(p.view.base + a.scale, s);
  }
}

template <bool kHalf>
__global__ void __launch_bounds__(kWarpsPerBlock * kWarp) mla_fp8_kernel(MlaWriteParams p) {
  const int64_t t = warp_row();
  if (t >= p.num_tokens) return;
  const int lane = threadIdx.x % kWarp;
  const int64_t slot = p.slots[t];
  MlaInputs in = load_mla_fp8(p, t, lane);
  store_mla_fp8<kHalf>(p, slot, in, lane);
}

__global__ void __launch_bounds__(kWarpsPerBlock * kWarp) mla_auto_kernel(MlaWriteParams p) {
  const int64_t t = warp_row();
  if (t < p.num_tokens) mla_auto_row(p, p.slots[t], t, threadIdx.x % kWarp);
}

template <bool kHalf>
__global__ void __launch_bounds__(kWarpsPerBlock * kWarp) indexer_kernel(IndexerWriteParams p) {
  const int64_t t = warp_row();
  if (t >= p.num_tokens) return;
  const int lane = threadIdx.x % kWarp;
  const int64_t slot = p.slots[t];
  const IndexerInputs in = load_indexer(p, t, lane);
  store_indexer<kHalf>(p, slot, in, lane);
}

// The DSA pair in one launch: each warp loads its token's MLA and indexer inputs together,
// then writes the MLA row and the indexer row.
template <bool kHalf, bool kFp8>
__global__ void __launch_bounds__(kWarpsPerBlock * kWarp) dsa_kernel(MlaWriteParams mla,
                                                                     IndexerWriteParams idx) {
  const int64_t t = warp_row();
  if (t >= mla.num_tokens) return;
  const int lane = threadIdx.x % kWarp;
  const int64_t slot = mla.slots[t];
  const IndexerInputs k = load_indexer(idx, t, lane);
  if constexpr (kFp8) {
    MlaInputs in = load_mla_fp8(mla, t, lane);
    store_mla_fp8<kHalf>(mla, slot, in, lane);
  } else {
    mla_auto_row(mla, slot, t, lane);
  }
  store_indexer<kHalf>(idx, slot, k, lane);
}

// ---- Plain rows: one warp per (token, head) row. ----
__global__ void plain_kernel(PlainWriteParams p) {
  const int64_t r = warp_row();
  if (r >= p.num_tokens * p.num_heads) return;
  const int64_t t = r / p.num_heads, h = r - t * p.num_heads;
  const int64_t slot = p.slots[t];
  if (!p.view.valid_slot(slot)) return;
  const int lane = threadIdx.x % kWarp;
  const int64_t es = dtype_size(p.dtype);
  const uint8_t* src = elem(p.key, t * p.key_token_stride + h * p.key_head_stride, es);
  uint8_t* dst = p.view.row(slot, h);
  if (!p.fp8) {
    warp_copy(dst, src, p.head_dim * es, lane);
    return;
  }
  const float scale = *p.scale;
  for (int64_t i = lane; i < p.head_dim; i += kWarp)
    dst[i] = e4m3_encode(load_as_float(src, i, p.dtype) / scale);
}

}  // namespace

void plain_write(const PlainWriteParams& p, void* stream) {
  plain_kernel<<<grid_for(p.num_tokens * p.num_heads), kWarpsPerBlock * kWarp, 0,
                 static_cast<cudaStream_t>(stream)>>>(p);
  check_launch("kvcache_ext reshape_and_cache");
}

void mla_write(const MlaWriteParams& p, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  const unsigned grid = grid_for(p.num_tokens), block = kWarpsPerBlock * kWarp;
  if (!p.fp8)
    mla_auto_kernel<<<grid, block, 0, s>>>(p);
  else if (p.dtype == DType::kFloat16)
    mla_fp8_kernel<true><<<grid, block, 0, s>>>(p);
  else
    mla_fp8_kernel<false><<<grid, block, 0, s>>>(p);
  check_launch("kvcache_ext concat_and_cache_mla");
}

void indexer_write(const IndexerWriteParams& p, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  const unsigned grid = grid_for(p.num_tokens), block = kWarpsPerBlock * kWarp;
  if (p.dtype == DType::kFloat16)
    indexer_kernel<true><<<grid, block, 0, s>>>(p);
  else
    indexer_kernel<false><<<grid, block, 0, s>>>(p);
  check_launch("kvcache_ext indexer_k_quant_and_cache");
}

void dsa_write(const MlaWriteParams& mla, const IndexerWriteParams& idx, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  const unsigned grid = grid_for(mla.num_tokens), block = kWarpsPerBlock * kWarp;
  // The op layer guarantees kv_c and k_idx share their dtype when the MLA rows are fp8.
  const bool half = idx.dtype == DType::kFloat16;
  if (mla.fp8)
    half ? dsa_kernel<true, true><<<grid, block, 0, s>>>(mla, idx)
         : dsa_kernel<false, true><<<grid, block, 0, s>>>(mla, idx);
  else
    half ? dsa_kernel<true, false><<<grid, block, 0, s>>>(mla, idx)
         : dsa_kernel<false, false><<<grid, block, 0, s>>>(mla, idx);
  check_launch("kvcache_ext dsa_write");
}

void copy_spans(const uint8_t* src, uint8_t* dst, const int64_t* spans, int64_t n, void* stream) {
  for (int64_t i = 0; i < n; ++i) {
    const cudaError_t err = cudaMemcpyAsync(dst + spans[3 * i + 1], src + spans[3 * i],
                                            spans[3 * i + 2], cudaMemcpyDefault,
                                            static_cast<cudaStream_t>(stream));
    if (err != cudaSuccess)
      throw std::runtime_error(std::string("kvcache_ext copy_spans: ") + cudaGetErrorString(err));
  }
}

}  // namespace kvc::cuda
