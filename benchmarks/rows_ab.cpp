// The CPU row loops of two source trees timed interleaved in one process (bench_rows_ab.py builds
// it): "new" is this tree's csrc/cpu/rows*.cpp, "old" another revision's, compiled with
// -Dkvc=kvc_old so both link side by side; old_rows_table (rows_ab_old.cpp) hands over the old
// public functions. Each process picks its loops at load from KVC_CPU_ISA, both trees alike.
// Prints one JSON line per workload: median ns per row of each, over interleaved repeats, and
// whether both wrote the same bytes.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/entry.h"
#include "cpu/rows.h"

using kvc::DType;
namespace cpu = kvc::cpu;

struct OldRows {  // the old tree's public row functions (DType has the same values there)
  const char* (*isa)();
  float (*row_amax)(const void*, DType, int64_t);
  void (*quantize_row)(const void*, DType, int64_t, float, uint8_t*);
  void (*tile_amax)(const void*, DType, int64_t, int64_t, int64_t, float*);
  void (*quantize_tiles)(const void*, DType, int64_t, int64_t, int64_t, const float*, uint8_t*);
  void (*decode_row)(const uint8_t*, int64_t, float, DType, uint8_t*);
  void (*e2m1_blocks)(const uint16_t*, int64_t, const int32_t*, uint8_t*);
  void (*stream_copy)(uint8_t*, const uint8_t*, int64_t);
  void (*e2m1_decode_bf16)(const uint8_t*, const uint8_t*, int64_t, uint8_t*);
  bool (*avx512_supported)();
  void (*avx512_decode_row)(const uint8_t*, int64_t, float, DType, uint8_t*);
};
extern "C" const OldRows* old_rows_table();

namespace {
constexpr int64_t kRows = 1024, kRow = 512, kTile = 128;

uint64_t state = 0x9E3779B97F4A7C15ull;
float normal() {  // sum of 4 uniforms, centred: close enough to a normal for row data
  float s = 0;
  for (int k = 0; k < 4; ++k) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    s += static_cast<float>(state >> 40) / static_cast<float>(1 << 24);
  }
  return (s - 2.0f) * 1.7f;
}

struct Workload {
  std::string name;
  std::function<void(bool old, std::vector<uint8_t>& out)> run;
};

double time_ns_per_row(const Workload& w, bool old, std::vector<uint8_t>& out) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int k = 0; k < 4; ++k) w.run(old, out);
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / (4.0 * kRows);
}
}  // namespace

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::atoi(argv[1]) : 21;
  const OldRows& o = *old_rows_table();
  std::printf("{\"isa_new\": \"%s\", \"isa_old\": \"%s\"}\n", cpu::isa(), o.isa());
  std::vector<float> f32(kRows * kRow);
  std::vector<uint16_t> bf16(kRows * kRow), fp16(kRows * kRow);
  for (size_t i = 0; i < f32.size(); ++i) {
    f32[i] = normal();
    bf16[i] = kvc::float_to_bf16(f32[i]);
    fp16[i] = kvc::float_to_fp16(f32[i]);
  }
  const int64_t tiles = kRows * kRow / kTile;
  std::vector<float> amax(tiles), pow2(tiles), fp32s(tiles);
  cpu::scalar::loops.tile_amax(bf16.data(), DType::kBFloat16, tiles, kTile, kTile, amax.data());
  for (int64_t k = 0; k < tiles; ++k) {
    fp32s[k] = std::max(amax[k] / 448.0f, 1.17549435e-38f);
    pow2[k] = std::exp2(std::ceil(std::log2(std::max(amax[k] / 448.0f, 1e-4f))));
  }
  std::vector<uint8_t> codes(kRows * kRow);
  cpu::scalar::loops.quantize_tiles(bf16.data(), DType::kBFloat16, tiles, kTile, kTile, pow2.data(), codes.data());
  std::vector<int32_t> exps(kRows * kRow / 32, -2);
  std::vector<uint8_t> packed(kRows * kRow / 2), scale_bytes(kRows * kRow / 32, 125);
  cpu::scalar::loops.e2m1_blocks(bf16.data(), kRows * kRow / 32, exps.data(), packed.data());
  static const cpu::Mxfp4Words words(DType::kBFloat16);

  const auto quantize = [&](const void* x, DType t, const std::vector<float>& s) {
    return [&, x, t](bool old, std::vector<uint8_t>& out) {
      out.resize(kRows * kRow + tiles * 4);
      (old ? o.tile_amax : cpu::tile_amax)(x, t, tiles, kTile, kTile, reinterpret_cast<float*>(out.data() + kRows * kRow));
      (old ? o.quantize_tiles : cpu::quantize_tiles)(x, t, tiles, kTile, kTile, s.data(), out.data());
    };
  };
  const auto decode_with = [&](auto old_fn, auto new_fn, DType t, float scale) {
    return [&, old_fn, new_fn, t, scale](bool old, std::vector<uint8_t>& out) {
      out.resize(kRows * kRow * 4);
      for (int64_t r = 0; r < kRows; ++r)
        (old ? old_fn : new_fn)(codes.data() + r * kRow, kRow, scale, t, out.data() + r * kRow * kvc::dtype_size(t));
    };
  };
  const auto decode = [&](DType t, float scale) { return decode_with(o.decode_row, cpu::decode_row, t, scale); };
  std::vector<Workload> work{
      {"tiles bf16 pow2", quantize(bf16.data(), DType::kBFloat16, pow2)},
      {"tiles bf16 fp32", quantize(bf16.data(), DType::kBFloat16, fp32s)},
      {"tiles fp16 pow2", quantize(fp16.data(), DType::kFloat16, pow2)},
      {"tiles fp32 pow2", quantize(f32.data(), DType::kFloat32, pow2)},
      {"row bf16 per-tensor", [&](bool old, std::vector<uint8_t>& out) {
         out.resize(kRows * kRow);
         for (int64_t r = 0; r < kRows; ++r)
           (old ? o.quantize_row : cpu::quantize_row)(bf16.data() + r * kRow, DType::kBFloat16, kRow, 0.0123f,
                                                      out.data() + r * kRow);
       }},
      {"decode bf16", decode(DType::kBFloat16, 0.0078125f)},
      {"decode fp32", decode(DType::kFloat32, 0.0078125f)},
      {"decode fp16", decode(DType::kFloat16, 0.0078125f)},
      {"decode bf16 tiny scale", decode(DType::kBFloat16, 1.17549435e-38f)},
      {"decode fp32 tiny scale", decode(DType::kFloat32, 1.17549435e-38f)},
      {"e2m1 bf16", [&](bool old, std::vector<uint8_t>& out) {
         out.resize(kRows * kRow / 2);
         (old ? o.e2m1_blocks : cpu::e2m1_blocks)(bf16.data(), kRows * kRow / 32, exps.data(), out.data());
       }},
      {"e2m1 decode bf16", [&](bool old, std::vector<uint8_t>& out) {
         out.resize(kRows * kRow * 2);
         if (old) o.e2m1_decode_bf16(packed.data(), scale_bytes.data(), kRows * kRow / 32, out.data());
         else cpu::e2m1_decode_blocks(packed.data(), scale_bytes.data(), kRows * kRow / 32, words, out.data());
       }},
      {"row amax bf16", [&](bool old, std::vector<uint8_t>& out) {
         out.resize(kRows * 4);
         for (int64_t r = 0; r < kRows; ++r) {
           const float m = (old ? o.row_amax : cpu::row_amax)(bf16.data() + r * kRow, DType::kBFloat16, kRow);
           std::memcpy(out.data() + 4 * r, &m, 4);
         }
       }},
      {"stream copy 512 B rows", [&](bool old, std::vector<uint8_t>& out) {
         out.resize(kRows * kRow);  // malloc'd: 16-B aligned, as stream_copy needs
         for (int64_t r = 0; r < kRows; ++r)
           (old ? o.stream_copy : cpu::stream_copy)(out.data() + r * kRow, codes.data() + r * kRow, kRow);
       }},
  };
  // AVX-512 decoding without the AVX512-BF16 conversion (what a CPU without it runs), timed apart:
  // the table this CPU picks under KVC_CPU_ISA=avx512 may be the BF16 one
  if (std::string(cpu::isa()).rfind("avx512", 0) == 0 && o.avx512_supported())
    work.push_back({"decode bf16 avx512 (no BF16 insn)",
                    decode_with(o.avx512_decode_row, cpu::avx512::loops.decode_row, DType::kBFloat16, 0.0078125f)});
  for (const Workload& w : work) {
    std::vector<uint8_t> a, b;
    w.run(true, a);
    w.run(false, b);
    // both timed into one buffer: two buffers can differ in where their pages lie (huge pages
    // or not), which showed as a steady 10-25 % between identical loops
    std::vector<uint8_t> scratch(b.size());
    std::vector<double> t_old, t_new;
    for (int r = 0; r < repeats; ++r) {  // alternate which goes first
      if (r % 2) t_old.push_back(time_ns_per_row(w, true, scratch)), t_new.push_back(time_ns_per_row(w, false, scratch));
      else t_new.push_back(time_ns_per_row(w, false, scratch)), t_old.push_back(time_ns_per_row(w, true, scratch));
    }
    std::sort(t_old.begin(), t_old.end());
    std::sort(t_new.begin(), t_new.end());
    std::printf("{\"workload\": \"%s\", \"old_ns_per_row\": %.1f, \"new_ns_per_row\": %.1f, \"same_bytes\": %s}\n",
                w.name.c_str(), t_old[repeats / 2], t_new[repeats / 2], a == b ? "true" : "false");
  }
  return 0;
}
