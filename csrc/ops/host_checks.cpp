// Checks of tensor values on the host (host_checks.h).
#include "host_checks.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <vector>

namespace kvc {

void check_slots_in_range(const at::Tensor& slots, int64_t num_tokens, const PagedView& v,
                          const char* arg, bool allow_negative) {
  TORCH_INTERNAL_ASSERT(slots.device().is_cpu());
  const int64_t* s = ptr<int64_t>(slots);
  for (int64_t t = 0; t < num_tokens; ++t) {
    TORCH_CHECK_INDEX(s[t] < v.num_slots() && (allow_negative || s[t] >= 0), arg, "[", t, "] = ",
                      s[t], " is outside [", allow_negative ? "-inf" : "0", ", num_blocks x block_size = ",
                      v.num_slots(), ")");
  }
}

void check_gather_source(const GatherSource& g, const PagedView& v, int64_t out_rows) {
  if (g.slots) {
    check_slots_in_range(*g.slots, g.slots->numel(), v, "slots");
    return;
  }
  const at::Tensor& bt = *g.block_table;
  const int64_t reqs = bt.size(0);
  const int32_t* cu = g.cu_seq_lens->data_ptr<int32_t>();
  const int32_t* starts = g.seq_starts ? g.seq_starts->data_ptr<int32_t>() : nullptr;
  TORCH_CHECK_VALUE(cu[0] == 0, "cu_seq_lens[0] must be 0, got ", cu[0]);
  for (int64_t r = 0; r < reqs; ++r) {
    TORCH_CHECK_VALUE(cu[r + 1] >= cu[r], "cu_seq_lens must be non-decreasing, got cu_seq_lens[",
                      r, "] = ", cu[r], " > cu_seq_lens[", r + 1, "] = ", cu[r + 1]);
  }
  TORCH_CHECK_VALUE(cu[reqs] <= out_rows, "out must have at least cu_seq_lens[-1] = ", cu[reqs],
                    " rows, got ", out_rows);
  for (int64_t r = 0; r < reqs; ++r) {
    const int64_t start = starts ? starts[r] : 0;
    TORCH_CHECK_INDEX(start >= 0, "seq_starts[", r, "] must be >= 0, got ", start);
    const int64_t end = start + cu[r + 1] - cu[r];
    check_table_range(bt, "block_table", r, start, end, v, "positions");
  }
}

void check_table_range(const at::Tensor& bt, const char* arg, int64_t r, int64_t first,
                       int64_t end, const PagedView& v, const char* what) {
  if (end <= first) return;
  const int64_t width = bt.size(1), bs = v.block_size;
  TORCH_CHECK_INDEX(end <= width * bs, arg, ": request ", r, " reads ", what, " [", first, ", ", end,
                    ") but ", arg, " holds ", width, " blocks of ", bs, " ", what);
  const int32_t* row = ptr<int32_t>(bt) + r * bt.stride(0);
  for (int64_t j = first / bs; j <= (end - 1) / bs; ++j)
    TORCH_CHECK_INDEX(row[j] >= 0 && row[j] < v.num_blocks, arg, "[", r, ", ", j, "] = ", row[j],
                      " is outside [0, num_blocks = ", v.num_blocks, ")");
}

void check_unique_slots(const at::Tensor& slots, int64_t num_tokens, const PagedView& v,
                        const char* arg) {
  TORCH_INTERNAL_ASSERT(slots.device().is_cpu());
  const int64_t* s = ptr<int64_t>(slots);
  auto refuse = [&](int64_t slot) {
    int64_t first = -1, second = -1;
    for (int64_t t = 0; t < num_tokens && second < 0; ++t)
      if (s[t] == slot) (first < 0 ? first : second) = t;
    TORCH_CHECK_VALUE(false, arg, "[", first, "] and ", arg, "[", second, "] are both slot ", slot,
                      ": two tokens of one call must not share a slot");
  };
  const int64_t num_slots = v.num_slots();
  // A bitmap of the view's slots while it is small next to the call (O(T + slots / 64)),
  // else a sorted copy of the slots (O(T log T)).
  if (num_slots <= 64 * std::max<int64_t>(num_tokens, 4096)) {
    std::vector<uint64_t> seen((num_slots + 63) / 64, 0);
    for (int64_t t = 0; t < num_tokens; ++t) {
      if (s[t] < 0) continue;
      uint64_t& word = seen[s[t] >> 6];
      const uint64_t bit = uint64_t{1} << (s[t] & 63);
      if (word & bit) refuse(s[t]);
      word |= bit;
    }
    return;
  }
  std::vector<int64_t> sorted;
  sorted.reserve(num_tokens);
  for (int64_t t = 0; t < num_tokens; ++t)
    if (s[t] >= 0) sorted.push_back(s[t]);
  std::sort(sorted.begin(), sorted.end());
  const auto dup = std::adjacent_find(sorted.begin(), sorted.end());
  if (dup != sorted.end()) refuse(*dup);
}

void check_slot_values(const at::Tensor& slot_mapping, int64_t num_tokens, const PagedView& v,
                       const char* arg) {
  check_slots_in_range(slot_mapping, num_tokens, v, arg);
  check_unique_slots(slot_mapping, num_tokens, v, arg);
}

GatherSource on_host(const GatherSource& g) {
  auto cpu = [](const OptTensor& t) -> OptTensor { return t ? OptTensor(t->cpu()) : std::nullopt; };
  return {cpu(g.block_table), cpu(g.cu_seq_lens), cpu(g.seq_starts), cpu(g.slots)};
}

}  // namespace kvc
