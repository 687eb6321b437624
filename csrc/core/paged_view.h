// Index math of a paged cache view, written once for host and device.
//
// A kernel is handed one layer's view: uint8 [num_blocks, H, block_size, C] with arbitrary
// strides (section 2 of the spec). Everything a kernel needs to turn (slot, head, byte) into
// a byte address lives here; all arithmetic is 64-bit so buffers beyond 4 GiB work.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define KVC_HD __host__ __device__ __forceinline__
#else
#define KVC_HD inline
#endif

namespace kvc {

// Leading zeros of a non-zero 64-bit value.
KVC_HD int clz64(uint64_t v) {
#if defined(__CUDA_ARCH__)
  return __clzll(static_cast<long long>(v));
#else
  return __builtin_clzll(v);
#endif
}

struct PagedView {
  uint8_t* base;  // address of (block 0, head 0, token 0, byte 0): the view's data_ptr
  int64_t num_blocks;
  int64_t num_heads;
  int64_t block_size;
  int64_t row_bytes;  // C
  int64_t block_stride;
  int64_t head_stride;
  int64_t token_stride;

  KVC_HD int64_t num_slots() const { return num_blocks * block_size; }
  KVC_HD bool valid_slot(int64_t slot) const { return slot >= 0 && slot < num_slots(); }

  // slot = block * block_size + position. A 64-bit division is dozens of instructions on a GPU:
  // a power-of-two block size (the usual case) divides by a shift, a slot range below 2^31 by
  // 32-bit division; only other views pay for 64 bits.
  KVC_HD void split(int64_t slot, int64_t& block, int64_t& pos) const {
    if ((block_size & (block_size - 1)) == 0) {
      block = slot >> (63 - clz64(static_cast<uint64_t>(block_size)));
    } else if (num_slots() <= 0x7FFFFFFF) {
      block = static_cast<uint32_t>(slot) / static_cast<uint32_t>(block_size);
    } else {
      block = slot / block_size;
    }
    pos = slot - block * block_size;
  }

  // Byte offset of (slot, head, byte) from base.
  KVC_HD int64_t offset(int64_t slot, int64_t head = 0, int64_t byte = 0) const {
    int64_t block, pos;
    split(slot, block, pos);
    return block * block_stride + head * head_stride + pos * token_stride + byte;
  }
  KVC_HD uint8_t* row(int64_t slot, int64_t head = 0) const { return base + offset(slot, head); }
};

// Indexer rows: 128 fp8 codes + one fp32 scale per token, H = 1, two placements in a page.
constexpr int64_t kIndexerDim = 128;
constexpr int64_t kIndexerRowBytes = kIndexerDim + 4;

enum class IndexerPlacement : int32_t { kRow = 0, kSplit = 1 };

struct IndexerAddress {
  int64_t codes;  // byte offset of the 128 codes
  int64_t scale;  // byte offset of the fp32 scale
};

// A split page of a one-head view holds rows of (a + b) bytes as all rows' first a bytes, then
// all rows' last b bytes: row n's parts at n * a and block_size * a + n * b (SPEC 10, layout.py
// split_address). Defined on contiguous pages (token_stride == a + b), which the op layer checks.
struct SplitAddress {
  int64_t first;  // byte offset of the row's first a bytes
  int64_t last;   // byte offset of its last b bytes
};

KVC_HD SplitAddress split_address(const PagedView& v, int64_t slot, int64_t a, int64_t b) {
  int64_t block, pos;
  v.split(slot, block, pos);
  const int64_t page = block * v.block_stride;
  return {page + pos * a, page + v.block_size * a + pos * b};
}

// `row`: token n's 132 bytes at n * token_stride (codes then scale).
// `split`: codes at n * 128, scales packed after all codes at block_size * 128 + 4 n.
KVC_HD IndexerAddress indexer_address(const PagedView& v, int64_t slot, IndexerPlacement p) {
  if (p == IndexerPlacement::kRow) {
    int64_t block, pos;
    v.split(slot, block, pos);
    const int64_t row = block * v.block_stride + pos * v.token_stride;
    return {row, row + kIndexerDim};
  }
  const SplitAddress a = split_address(v, slot, kIndexerDim, 4);
  return {a.first, a.last};
}

// MLA fp8_ds_mla rows: 4 tiles of 128 fp8 codes, 4 fp32 scales, 64 bf16 rope values.
constexpr int64_t kMlaLatentDim = 512;
constexpr int64_t kMlaRopeDim = 64;
constexpr int64_t kMlaDim = kMlaLatentDim + kMlaRopeDim;  // 576
constexpr int64_t kMlaTile = 128;
constexpr int64_t kMlaScalesOffset = kMlaLatentDim;        // 512
constexpr int64_t kMlaRopeOffset = kMlaLatentDim + 16;     // 528
constexpr int64_t kMlaFp8RowBytes = kMlaRopeOffset + 2 * kMlaRopeDim;  // 656

// What TokenSource::slot_of returns besides a valid slot.
constexpr int64_t kZeroRow = -1;  // a token without a valid slot: its output row is zeroed
constexpr int64_t kNoRow = -2;    // past cu_seq_lens[-1]: no token, the caller's row is kept

// Slot of position (row) pos of a request whose block-table row is bt (max_blocks entries):
// kZeroRow when the position or its block-table entry is outside the view.
KVC_HD int64_t block_table_slot(const int32_t* bt, int64_t max_blocks, int64_t pos,
                                const PagedView& v) {
  if (pos < 0 || pos >= max_blocks * v.block_size) return kZeroRow;
  const int64_t logical = (v.block_size & (v.block_size - 1)) == 0
                              ? pos >> (63 - clz64(static_cast<uint64_t>(v.block_size)))
                          : (pos | v.block_size) <= 0x7FFFFFFF ? static_cast<int64_t>(static_cast<uint32_t>(pos) /
                                                                     static_cast<uint32_t>(v.block_size))
                                              : pos / v.block_size;
  const int64_t block = bt[logical];
  if (block < 0 || block >= v.num_blocks) return kZeroRow;
  return block * v.block_size + (pos - logical * v.block_size);
}

// Tokens of a gather: either explicit slots, or requests read through a block table.
struct TokenSource {
  const int64_t* slots;        // explicit slots [T] (nullptr when reading a block table)
  const int32_t* block_table;  // [num_reqs, max_blocks], row stride bt_stride
  int64_t bt_stride;
  int64_t max_blocks;
  const int32_t* cu_seq_lens;  // [num_reqs + 1]
  const int32_t* seq_starts;   // [num_reqs] or nullptr
  int64_t num_reqs;

  // Slot of output row t; kZeroRow when the token has no valid slot (padding, or entries a
  // validated call would have rejected): readers then produce a zero row. kNoRow for rows past
  // the last request's tokens (out= buffers sized for the worst case): readers leave them alone.
  KVC_HD int64_t slot_of(int64_t t, const PagedView& v) const {
    int64_t slot;
    if (slots != nullptr) {
      slot = slots[t];
    } else {
      int64_t lo = 0, hi = num_reqs;  // find r with cu[r] <= t < cu[r + 1]
      if (num_reqs <= 0 || t >= cu_seq_lens[num_reqs]) return kNoRow;
      while (hi - lo > 1) {
        const int64_t mid = (lo + hi) / 2;
        if (cu_seq_lens[mid] <= t) lo = mid; else hi = mid;
      }
      const int64_t pos = t - cu_seq_lens[lo] + (seq_starts ? seq_starts[lo] : 0);
      return block_table_slot(block_table + lo * bt_stride, max_blocks, pos, v);
    }
    return v.valid_slot(slot) ? slot : kZeroRow;
  }
};

}  // namespace kvc
