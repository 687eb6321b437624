// Host program: the AVX2 and AVX-512 row loops (csrc/cpu/rows_avx2.cpp, rows_avx512.cpp, both
// from csrc/cpu/simd/rows_simd.h) against the scalar ones (csrc/cpu/rows.cpp) byte for byte, each that
// this CPU has (AVX-512 also with its AVX512-BF16 decoding). fp32 -> e4m3 over every one of the
// 2^32 float bit patterns with a power-of-two, a non-power-of-two and a negative scale, and a
// sample of them under zero, inf, NaN and tiny scales; every bf16 / fp16 pattern under many
// scales; several tiles per call with tails; every code decoded to bf16 / fp16 / fp32 under
// ordinary, extreme, 2000 random and 96 bf16-tie scales; MXFP4 codes of every bf16 pattern under
// every block exponent, and every packed byte decoded under every scale byte; amax with NaN, inf
// and lengths that leave scalar tails; streaming copies at every alignment. Prints
// "mismatches: N"; exit status 1 if any.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <emmintrin.h>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "cpu/rows.h"

using kvc::DType;
namespace scalar = kvc::cpu::scalar;

// One SIMD implementation of the row loops.
struct Impl {
  bool (*supported)();
  const kvc::cpu::RowLoops* loops;
};

static unsigned long long bad = 0;

template <class T>
static void expect_same(const char* what, const std::vector<T>& a, const std::vector<T>& b, uint64_t at) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i] && bad++ < 8)
      std::printf("%s: element %llu: simd 0x%x, scalar 0x%x\n", what, (unsigned long long)(at + i),
                  (unsigned)a[i], (unsigned)b[i]);
  }
}

// Every float through quantize_row (n = kChunk - 3: the last values take the scalar tail); a
// negative scale flips the codes' signs. The 2^32-value pass is the program's cost, so the scalar
// codes of a chunk are made once and every ISA's loop (each distinct one once) is compared with
// them; mismatches are counted per ISA.
static void compare_every_float(const std::vector<const Impl*>& simds, std::vector<unsigned long long>& per) {
  constexpr int64_t kChunk = 1 << 16;
  for (float scale : {1.0f, 0.3f, -2.5f}) {
#pragma omp parallel for schedule(dynamic)
    for (int64_t c = 0; c < (int64_t{1} << 32) / kChunk; ++c) {
      std::vector<uint32_t> x(kChunk);
      for (int64_t i = 0; i < kChunk; ++i) x[i] = static_cast<uint32_t>(c * kChunk + i);
      std::vector<uint8_t> a(kChunk), b(kChunk);
      scalar::quantize_row(x.data(), DType::kFloat32, kChunk - 3, scale, b.data());
      for (size_t s = 0; s < simds.size(); ++s) {
        bool same_loop = false;  // an ISA whose quantize_row an earlier one already ran
        for (size_t e = 0; e < s; ++e) same_loop |= simds[e]->loops->quantize_row == simds[s]->loops->quantize_row;
        if (!same_loop) simds[s]->loops->quantize_row(x.data(), DType::kFloat32, kChunk - 3, scale, a.data());
#pragma omp critical
        {
          const unsigned long long before = bad;
          expect_same("quantize fp32", a, b, c * kChunk);
          per[s] += bad - before;
        }
      }
    }
  }
}

// Everything else, for one ISA.
static void compare(const Impl& simd) {
  // Every 61st float (a stride that visits every low-bit pattern) under the scales the pass
  // above leaves out: zeros, infinities, NaN, subnormal and extreme powers of two.
  for (float scale : {0.0f, -0.0f, kvc::bits_float(0x7F800000u), kvc::bits_float(0xFF800000u),
                      kvc::bits_float(0x7FC00000u), 1.1754944e-38f, 0x1p-149f, 0x1p-100f, 0x1p100f}) {
#pragma omp parallel for schedule(dynamic)
    for (int64_t c = 0; c < 1024; ++c) {
      constexpr int64_t kN = (int64_t{1} << 32) / 61 / 1024 + 1;
      std::vector<uint32_t> x(kN);
      for (int64_t i = 0; i < kN; ++i) x[i] = static_cast<uint32_t>((c * kN + i) * 61);
      std::vector<uint8_t> a(kN), b(kN);
      simd.loops->quantize_row(x.data(), DType::kFloat32, kN, scale, a.data());
      scalar::quantize_row(x.data(), DType::kFloat32, kN, scale, b.data());
#pragma omp critical
      expect_same("quantize fp32 (special scales)", a, b, c * kN);
    }
  }
  // Every bf16 and fp16 pattern, scales with and without a power of two, tiny and huge, signed
  // zeros, inf and NaN, powers of two at and beyond the bounds of the bf16 exponent path.
  std::vector<uint16_t> h(1 << 16);
  for (int i = 0; i < (1 << 16); ++i) h[i] = static_cast<uint16_t>(i);
  const float nan = kvc::bits_float(0xFFC00001u), inf = kvc::bits_float(0x7F800000u);
  for (DType t : {DType::kBFloat16, DType::kFloat16}) {
    for (float scale : {1.0f, 0.0625f, 0.3f, 1.1754944e-38f, 2.2e-4f, 3.0e38f, -0.3f, 0.0f, -0.0f, inf, -inf, nan,
                        // powers of two (bf16 takes an exact path for |e| <= 100)
                        0x1p-20f, 0x1p-100f, 0x1p100f, 0x1p-101f, 0x1p101f, 0x1p-126f, 0x1p-149f, 0x1p10f, -0.25f, 0.5f}) {
      std::vector<uint8_t> a(1 << 16), b(1 << 16);
      simd.loops->quantize_row(h.data(), t, 1 << 16, scale, a.data());
      scalar::quantize_row(h.data(), t, 1 << 16, scale, b.data());
      expect_same("quantize 16-bit", a, b, 0);
    }
  }
  // Several tiles per call: each tile's amax and codes with its own scale, as row by row (tile
  // lengths that leave vector and scalar tails in every tile; tiles apart or adjacent).
  for (DType t : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
    for (auto [tile, stride] : {std::pair<int64_t, int64_t>{128, 128}, {64, 64}, {37, 37}, {128, 131}, {32, 200},
                                {61, 61}, {61, 64}, {29, 30}}) {
      const float scales[] = {0.3f, 1.1754944e-38f, -2.0f, 7.0f, 2.2e-4f, 0.0f, -0.0f, kvc::bits_float(0x7F800000u),
                              kvc::bits_float(0xFFC00000u), 0x1p-20f, -0x1p100f};
      constexpr int64_t kTiles = 11;
      std::vector<uint8_t> x(kTiles * stride * kvc::dtype_size(t));
      for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<uint8_t>(h[(i * 40503u) & 0xFFFF] >> (i & 1) * 8);
      std::vector<uint8_t> a(kTiles * tile), b(kTiles * tile);
      std::vector<uint32_t> ma(kTiles), mb(kTiles);
      float amax[kTiles];
      simd.loops->quantize_tiles(x.data(), t, kTiles, tile, stride, scales, a.data());
      simd.loops->tile_amax(x.data(), t, kTiles, tile, stride, amax);
      for (int64_t k = 0; k < kTiles; ++k) {
        const uint8_t* xk = x.data() + k * stride * kvc::dtype_size(t);
        scalar::quantize_row(xk, t, tile, scales[k], b.data() + k * tile);
        ma[k] = kvc::float_bits(amax[k]);
        mb[k] = kvc::float_bits(scalar::row_amax(xk, t, tile));
      }
      expect_same("quantize_tiles", a, b, 0);
      expect_same("tile_amax", ma, mb, 0);
    }
  }
  // MXFP4 codes: every bf16 pattern (2048 blocks of 32) under every block exponent.
  if (simd.loops->e2m1_blocks != nullptr) {
    constexpr int64_t kBlocks = 2048;
    for (int32_t e = -127; e <= 127; ++e) {
      const std::vector<int32_t> exps(kBlocks, e);
      std::vector<uint8_t> a(kBlocks * 16), b(kBlocks * 16);
      simd.loops->e2m1_blocks(h.data(), kBlocks, exps.data(), a.data());
      kvc::cpu::scalar::e2m1_blocks(h.data(), kBlocks, exps.data(), b.data());
      expect_same("e2m1", a, b, static_cast<uint64_t>(e + 127) << 16);
    }
    // Random patterns with a random exponent per block (both sides of -100 in one call), and
    // inf / NaN planted among finite values in one half of some blocks.
    std::mt19937 gb(5);
    std::vector<uint16_t> xs(kBlocks * 32);
    std::vector<int32_t> exps(kBlocks);
    for (auto& v : xs) v = static_cast<uint16_t>(gb());
    for (auto& v : xs) v = (v & 0x7F80) == 0x7F80 ? static_cast<uint16_t>(v & 0xBFFF) : v;  // finite
    for (int64_t k = 0; k < kBlocks; ++k) {
      exps[k] = static_cast<int32_t>(gb() % 255) - 127;
      // (a NaN with its sign bit set codes 0x7, where the threshold count would give 0xF)
      if (k % 7 == 3) xs[k * 32 + gb() % 16] = (gb() & 1) ? 0x7F80 : 0xFFC1;            // first half
      if (k % 11 == 5) xs[k * 32 + 16 + gb() % 16] = (gb() & 1) ? 0xFF80 : 0xFFC0;      // second half
    }
    std::vector<uint8_t> a(kBlocks * 16), b(kBlocks * 16);
    simd.loops->e2m1_blocks(xs.data(), kBlocks, exps.data(), a.data());
    kvc::cpu::scalar::e2m1_blocks(xs.data(), kBlocks, exps.data(), b.data());
    expect_same("e2m1 mixed", a, b, 0);
  }
  // MXFP4 decoding: every packed byte (16 blocks of 16) under every scale byte, to bf16 and fp32,
  // then blocks of mixed scale bytes; outputs poisoned differently, so an unwritten word differs.
  for (DType t : {DType::kBFloat16, DType::kFloat32}) {
    if (simd.loops->e2m1_decode_blocks == nullptr) break;
    const auto words = std::make_unique<kvc::cpu::Mxfp4Words>(t);
    constexpr int64_t kBlocks = 256 * 16;
    std::vector<uint8_t> packed(kBlocks * 16), scale_bytes(kBlocks);
    for (int64_t k = 0; k < kBlocks; ++k) {
      scale_bytes[k] = static_cast<uint8_t>(k / 16);
      for (int i = 0; i < 16; ++i) packed[k * 16 + i] = static_cast<uint8_t>((k % 16) * 16 + i);
    }
    std::vector<uint8_t> a(kBlocks * 32 * kvc::dtype_size(t), 0xAA), b(a.size(), 0x55);
    simd.loops->e2m1_decode_blocks(packed.data(), scale_bytes.data(), kBlocks, *words, a.data());
    scalar::loops.e2m1_decode_blocks(packed.data(), scale_bytes.data(), kBlocks, *words, b.data());
    expect_same("e2m1_decode", a, b, 0);
    std::mt19937 gm(3);
    for (auto& v : scale_bytes) v = static_cast<uint8_t>(gm());
    for (auto& v : packed) v = static_cast<uint8_t>(gm());
    std::fill(a.begin(), a.end(), 0xAA);
    std::fill(b.begin(), b.end(), 0x55);
    simd.loops->e2m1_decode_blocks(packed.data(), scale_bytes.data(), kBlocks - 1, *words, a.data());
    scalar::loops.e2m1_decode_blocks(packed.data(), scale_bytes.data(), kBlocks - 1, *words, b.data());
    const size_t last = a.size() - 32 * kvc::dtype_size(t);  // the block past the end: unwritten
    expect_same("e2m1_decode past the end", std::vector<uint8_t>(a.begin() + last, a.end()),
                std::vector<uint8_t>(a.size() - last, 0xAA), last);
    a.resize(last);
    b.resize(last);
    expect_same("e2m1_decode mixed", a, b, 0);
  }
  // Streaming copies: every 16-B offset in a line, lengths across several lines; the bytes
  // around the destination untouched.
  {
    alignas(64) uint8_t src[1088], dst[1280];
    for (int i = 0; i < 1088; ++i) src[i] = static_cast<uint8_t>(i * 37 + 11);
    for (int64_t off = 0; off < 64; off += 16) {
      for (int64_t bytes = 16; bytes <= 1088; bytes += 16) {
        std::vector<uint8_t> want(1280, 0xA5);
        std::memset(dst, 0xA5, sizeof(dst));
        std::memcpy(want.data() + 64 + off, src + off / 16, bytes);
        simd.loops->stream_copy(dst + 64 + off, src + off / 16, bytes);
        _mm_sfence();
        expect_same("stream_copy", std::vector<uint8_t>(dst, dst + 1280), want, off * 10000 + bytes);
      }
    }
  }
  // Every code decoded, scales including negative NaN, inf, the smallest normal and a huge one.
  std::vector<uint8_t> codes(256 * 3 + 5);
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint8_t>(i * 7 + i / 256);
  std::vector<float> decode_scales{1.0f, 0.3f, 1.1754944e-38f, 3.0e38f, 2.0e-3f, nan, inf, -0.7f, 0x1p100f,
                                   0x1p-100f, 0x1.fffffep99f, 0x1.000002p-100f, 0x1p101f, 0x1p-101f};
  std::mt19937 gs(7);  // and random scales over the whole fast range, both signs
  for (int i = 0; i < 2000; ++i)
    decode_scales.push_back(std::ldexp(1.0f + static_cast<float>(gs() % (1u << 23)) / (1u << 23),
                                       static_cast<int>(gs() % 201) - 100) * (i % 3 ? 1.0f : -1.0f));
  for (int i = 0; i < 96; ++i) {  // scales whose products by power-of-two codes are bf16 ties (low
    // 16 bits 0x8000), one ulp off them (0x7FFF with bit 16 set, 0x8001), across the fast range
    const uint32_t low = i % 3 == 0 ? 0x8000u : i % 3 == 1 ? 0x17FFFu : 0x8001u;
    const uint32_t mantissa = ((gs() % 64u) << 17) | low;
    decode_scales.push_back(std::ldexp(1.0f + static_cast<float>(mantissa) / (1u << 23),
                                       static_cast<int>(gs() % 201) - 100) * (i % 2 ? 1.0f : -1.0f));
  }
  for (DType t : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
    for (float scale : decode_scales) {
      const size_t bytes = codes.size() * kvc::dtype_size(t);
      std::vector<uint8_t> a(bytes), b(bytes);
      simd.loops->decode_row(codes.data(), codes.size(), scale, t, a.data());
      scalar::decode_row(codes.data(), codes.size(), scale, t, b.data());
      expect_same("decode", a, b, 0);
    }
  }
  // amax over random rows with NaN / inf / -0 planted, every length from 0 to 300.
  std::mt19937 g(1);
  for (DType t : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
    for (int n = 0; n <= 300; ++n) {
      std::vector<uint32_t> w(n);
      for (auto& v : w) v = g();
      if (n > 3) {
        w[g() % n] = t == DType::kFloat32 ? 0x7FC00000u : 0x7FC17FC1u;  // NaN
        if (n % 5 == 0) w[g() % n] = t == DType::kFloat32 ? 0xFF800000u : 0xFC00FF80u;  // -inf
      }
      const std::vector<uint32_t> a{kvc::float_bits(simd.loops->row_amax(w.data(), t, n))};
      const std::vector<uint32_t> b{kvc::float_bits(scalar::row_amax(w.data(), t, n))};
      expect_same("amax", a, b, n);
    }
  }
}

int main() {
  const Impl impls[] = {{kvc::cpu::avx2::supported, &kvc::cpu::avx2::loops},
                        {kvc::cpu::avx512::supported, &kvc::cpu::avx512::loops},
                        // the same with bf16 decoding by the AVX512-BF16 conversion
                        {kvc::cpu::avx512::bf16_supported, &kvc::cpu::avx512::loops_bf16}};
  std::vector<const Impl*> here;
  for (const Impl& simd : impls) {
    if (simd.supported()) here.push_back(&simd);
    else std::printf("%s: not on this CPU, not compared\n", simd.loops->name);
  }
  std::vector<unsigned long long> per(here.size(), 0);
  compare_every_float(here, per);
  for (size_t s = 0; s < here.size(); ++s) {
    const unsigned long long before = bad;
    compare(*here[s]);
    std::printf("%s: compared, %llu mismatches\n", here[s]->loops->name, per[s] + bad - before);
  }
  std::printf("mismatches: %llu\n", bad);
  return bad ? 1 : 0;
}
