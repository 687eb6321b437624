// Software prefetch of the lines of a byte range, for the CPU loops' rows at random slots.
#pragma once
#include <cstdint>

namespace kvc::cpu {

// Asks for the cache lines of [p, p + bytes) (for writing: exclusive). Always inlined: GCC counts
// a prefetch as no side effect, finds an out-of-line prefetching function pure and deletes the
// call (GCC 12 did, to the gathers' row prefetches).
[[gnu::always_inline]] inline void prefetch_lines(const uint8_t* p, int64_t bytes, bool write = false) {
  const uint8_t* line = reinterpret_cast<const uint8_t*>(reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63});
  for (; line < p + bytes; line += 64) write ? __builtin_prefetch(line, 1, 3) : __builtin_prefetch(line, 0, 3);
}

}  // namespace kvc::cpu
