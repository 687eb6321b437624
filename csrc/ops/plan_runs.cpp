// The transfer planner in compiled code: the strided runs that move a request's tokens between
// two cache plans (kvc.TransferPlan.token_runs), from the plans' spec moves (a table computed
// once per pair of plans) and the two block tables. One pass over (spec, layer, chunk, head), in
// the source's nesting order, each piece or run merged into the previous one where it continues
// it on both sides (or steps evenly from it): no list of pieces, no sort. A chunk is a run of
// tokens inside one block on both sides; the pieces of one (layer, chunk, head), as
// kvcache_ext/transfer/plan.py describes them:
//   split rows (a | b): the chunk's first-part bytes (or, channel-major with element e, one run
//   of a / e channels: k x e bytes each, stepping block_size x e on each side) and its
//   second-part bytes;
//   other rows: one piece of k x unit bytes when both token strides are the unit (a head's row,
//   or the moved heads' rows side by side), else a run of k units stepping the token strides.
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <vector>

#include "ops.h"
#include "runs.h"

namespace kvc::ops {
namespace {

constexpr int64_t kMoveFields = 20;

struct Side {
  int64_t offset, layer, block, head, token;  // byte offset of the spec, its strides
};

struct Move {
  int64_t row, a, b, e;           // row bytes; split (a, b) or a = -1; channel-major element or 0
  int64_t sl0, dl0, nl, sh0, dh0, nh;
  Side s, d;
};

struct Chunk {
  int64_t sb, db, sn, dn, k;  // src block, dst block, first token in each, tokens
};

// Emits runs, merging each into the open one where that stays one run; a run is written out
// once the next one cannot join it, at most cap rows (token_runs gives as many as the pieces
// added can make, and keeps a view of the rows written). out == nullptr: counts them only.
struct Emitter {
  int64_t* out;
  int64_t cap, n = 0;  // n: runs closed so far
  int64_t L[6] = {};   // the open run
  bool open = false;

  void add(int64_t a, int64_t b, int64_t len, int64_t sa, int64_t sb, int64_t cnt) {
    if (len == 0) return;
    if (cnt == 1) sa = sb = len;
    if (open) {
      if (L[5] == 1 && cnt == 1 && L[0] + L[2] == a && L[1] + L[2] == b) {
        L[2] += len, L[3] = L[4] = L[2];
        return;
      }
      if (L[2] == len) {
        if (L[5] == 1) {
          const int64_t da = a - L[0], db = b - L[1];
          if (da >= len && db >= len && (cnt == 1 || (sa == da && sb == db))) {
            L[3] = da, L[4] = db, L[5] = 1 + cnt;
            return;
          }
        } else if (a == L[0] + L[5] * L[3] && b == L[1] + L[5] * L[4] &&
                   (cnt == 1 || (sa == L[3] && sb == L[4]))) {
          L[5] += cnt;
          return;
        }
      }
      close();
    }
    L[0] = a, L[1] = b, L[2] = len, L[3] = sa, L[4] = sb, L[5] = cnt;
    open = true;
  }

  void close() {
    if (!open) return;
    if (out != nullptr) {
      TORCH_CHECK(n < cap, "plan_token_runs: more runs than the ", cap, " rows given");
      std::copy(L, L + 6, out + 6 * n);
    }
    ++n, open = false;
  }
};

void emit(Emitter& out, const Move& m, const Chunk& q, int64_t l, int64_t h, bool grouped,
          int64_t ns, int64_t nd) {
  const int64_t s_page = m.s.offset + (m.sl0 + l) * m.s.layer + q.sb * m.s.block;
  const int64_t d_page = m.d.offset + (m.dl0 + l) * m.d.layer + q.db * m.d.block;
  if (m.a >= 0) {  // split rows: per head, the first part, then the second
    const int64_t s_pg = s_page + (m.sh0 + h) * m.s.head, d_pg = d_page + (m.dh0 + h) * m.d.head;
    const bool whole = q.sn == 0 && q.dn == 0 && q.k == ns && q.k == nd;
    if (m.e == 0 || whole)
      out.add(s_pg + q.sn * m.a, d_pg + q.dn * m.a, q.k * m.a, 0, 0, 1);
    else
      out.add(s_pg + q.sn * m.e, d_pg + q.dn * m.e, q.k * m.e, ns * m.e, nd * m.e, m.a / m.e);
    out.add(s_pg + ns * m.a + q.sn * m.b, d_pg + nd * m.a + q.dn * m.b, q.k * m.b, 0, 0, 1);
    return;
  }
  const int64_t unit = grouped ? m.nh * m.row : m.row;
  const int64_t s_row = s_page + (grouped ? m.sh0 : m.sh0 + h) * m.s.head + q.sn * m.s.token;
  const int64_t d_row = d_page + (grouped ? m.dh0 : m.dh0 + h) * m.d.head + q.dn * m.d.token;
  if (m.s.token == unit && m.d.token == unit)
    out.add(s_row, d_row, q.k * unit, 0, 0, 1);
  else
    out.add(s_row, d_row, unit, m.s.token, m.d.token, q.k);
}

const int64_t* table_arg(const Tensor& t, const char* name) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kLong, name, " must be int64, got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.dim() == 1 && t.is_contiguous() && t.is_cpu(), name,
                    " must be a contiguous 1-D CPU tensor, got shape ", t.sizes());
  return t.data_ptr<int64_t>();
}

}  // namespace

void plan_token_runs(const Tensor& moves, const Tensor& src_table, const Tensor& dst_table,
                     int64_t src_block_size, int64_t dst_block_size, int64_t src_num_blocks,
                     int64_t dst_num_blocks, int64_t num_tokens, int64_t src_start,
                     int64_t dst_start, const Tensor& runs, const Tensor& count) {
  const int64_t* mv = rows_arg(moves, kMoveFields, "moves");
  const int64_t* st = table_arg(src_table, "src_table");
  const int64_t* dt = table_arg(dst_table, "dst_table");
  int64_t* out = const_cast<int64_t*>(rows_arg(runs, 6, "runs"));
  if (runs.size(0) == 0) out = nullptr;  // count only
  TORCH_CHECK_VALUE(count.scalar_type() == at::kLong && count.numel() == 1 && count.is_cpu(),
                    "count must be a CPU int64 tensor of one element");
  const int64_t ns = src_block_size, nd = dst_block_size;
  TORCH_CHECK_VALUE(ns > 0 && nd > 0, "block sizes must be > 0, got ", ns, " and ", nd);
  TORCH_CHECK_VALUE(num_tokens >= 0 && src_start >= 0 && dst_start >= 0,
                    "num_tokens, src_start and dst_start must be >= 0");
  std::vector<Chunk> chunks;
  for (int64_t i = 0; i < num_tokens;) {
    const int64_t sp = src_start + i, dp = dst_start + i;
    const int64_t k = std::min({ns - sp % ns, nd - dp % nd, num_tokens - i});
    TORCH_CHECK_INDEX(sp / ns < src_table.numel() && dp / nd < dst_table.numel(),
                      "the block tables do not cover token ", i);
    const int64_t sb = st[sp / ns], db = dt[dp / nd];
    TORCH_CHECK_INDEX(sb >= 0 && sb < src_num_blocks, "src_table[", sp / ns, "] = ", sb,
                      " is outside [0, ", src_num_blocks, ")");
    TORCH_CHECK_INDEX(db >= 0 && db < dst_num_blocks, "dst_table[", dp / nd, "] = ", db,
                      " is outside [0, ", dst_num_blocks, ")");
    chunks.push_back({sb, db, sp % ns, dp % nd, k});
    i += k;
  }
  Emitter e{out, runs.size(0)};
  for (int64_t i = 0; i < moves.size(0); ++i) {
    const int64_t* f = mv + kMoveFields * i;
    const Move m{f[0],  f[1],  f[2],  f[3],  f[4],  f[5],  f[6],  f[7],  f[8],  f[9],
                 {f[10], f[11], f[12], f[13], f[14]}, {f[15], f[16], f[17], f[18], f[19]}};
    const bool grouped = m.a < 0 && (m.nh == 1 || (m.s.head == m.row && m.d.head == m.row));
    const int64_t heads = grouped ? 1 : m.nh;
    // loop nesting: the source's, outermost its largest stride (layer, block, head)
    const std::array<int64_t, 3> size{m.nl, static_cast<int64_t>(chunks.size()), heads};
    const std::array<int64_t, 3> stride{m.s.layer, m.s.block, m.s.head};
    std::array<int, 3> order{0, 1, 2};
    std::stable_sort(order.begin(), order.end(),
                     [&](int x, int y) { return stride[x] > stride[y]; });
    std::array<int64_t, 3> idx{};
    for (idx[order[0]] = 0; idx[order[0]] < size[order[0]]; ++idx[order[0]])
      for (idx[order[1]] = 0; idx[order[1]] < size[order[1]]; ++idx[order[1]])
        for (idx[order[2]] = 0; idx[order[2]] < size[order[2]]; ++idx[order[2]])
          emit(e, m, chunks[idx[1]], idx[0], idx[2], grouped, ns, nd);
  }
  e.close();
  count.data_ptr<int64_t>()[0] = e.n;
}

}  // namespace kvc::ops
