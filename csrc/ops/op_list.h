// The one list of the library's ops. Everything per op that is not the op's own code comes from
// here: the schemas (library.cpp), the CPU and CUDA registrations (library.cpp), the autograd
// keys and the device check (dispatch_keys.cpp), and Python's fakes and device checks, which read
// it through kvcache_ext._C.op_table().
//
// X(name, arguments, anchor, host, cpu):
//   arguments  the schema's argument list; every op returns nothing (writes are Tensor(a!))
//   anchor     the argument whose device every other tensor argument must be on
//   host       arguments the op reads on the host: on the CPU, or on the anchor's device
//   cpu        arguments that must be on the CPU
// A meta tensor is refused wherever the anchor is not one (a fake call: every tensor is fake).
// copy_spans alone has no anchor: its source and destination may differ by design.
#pragma once

#define KVC_OPS(X)                                                                                      \
  /* Writes: the view is mutated in place; T = slot_mapping.numel(), slot < 0 is padding. */          \
  X(reshape_and_cache,                                                                                 \
    "Tensor key, Tensor(a!) view, Tensor slot_mapping, str kv_cache_dtype=\"auto\", "                \
    "Tensor? scale=None",                                                                              \
    "view", "scale", "")                                                                               \
  X(reshape_and_cache_kv,                                                                              \
    "Tensor key, Tensor value, Tensor(a!) k_view, Tensor(b!) v_view, Tensor slot_mapping, "           \
    "str kv_cache_dtype=\"auto\", Tensor? k_scale=None, Tensor? v_scale=None",                        \
    "k_view", "k_scale v_scale", "")                                                                   \
  X(reshape_and_cache_kv_split,                                                                        \
    "Tensor key, Tensor value, Tensor(a!) view, Tensor slot_mapping, bool k_channel_major=True",     \
    "view", "", "")                                                                                    \
  X(concat_and_cache_mla,                                                                              \
    "Tensor kv_c, Tensor k_pe, Tensor(a!) view, Tensor slot_mapping, "                                \
    "str kv_cache_dtype=\"fp8_ds_mla\", Tensor? scale=None, str? tile_scale=None",                    \
    "view", "scale", "")                                                                               \
  X(indexer_k_quant_and_cache,                                                                         \
    "Tensor k, Tensor(a!) view, Tensor slot_mapping, str? scale_fmt=None, str placement=\"row\"",     \
    "view", "", "")                                                                                    \
  X(dsa_write,                                                                                         \
    "Tensor kv_c, Tensor k_pe, Tensor(a!) mla_view, Tensor k_idx, Tensor(b!) indexer_view, "          \
    "Tensor slot_mapping, str kv_cache_dtype=\"fp8_ds_mla\", str? scale_fmt=None, "                   \
    "str placement=\"row\", str? tile_scale=None",                                                    \
    "mla_view", "", "")                                                                                \
  /* DeepSeek-V4 rows in split pages (core/v4_rows.h); compressor states are [kv | score] rows. */    \
  X(v4_mla_quant_and_cache,                                                                            \
    "Tensor kv, Tensor(a!) view, Tensor slot_mapping, str scale_floor=\"amax\", "                   \
    "str format=\"fp8_ds_mla_v4\", str subnormals=\"keep\"",                                        \
    "view", "", "")                                                                                    \
  X(mxfp4_quant_and_cache, "Tensor k, Tensor(a!) view, Tensor slot_mapping", "view", "", "")          \
  X(v4_indexer_quant_and_cache, "Tensor k, Tensor(a!) view, Tensor slot_mapping", "view", "", "")     \
  X(v4_dsa_write,                                                                                      \
    "Tensor kv, Tensor(a!) mla_view, Tensor k_idx, Tensor(b!) indexer_view, Tensor slot_mapping, "    \
    "str scale_floor=\"amax\", str indexer=\"mxfp4\", str format=\"fp8_ds_mla_v4\", "              \
    "str subnormals=\"keep\"",                                                                       \
    "mla_view", "", "")                                                                                \
  X(state_write, "Tensor kv, Tensor score, Tensor(a!) view, Tensor slot_mapping", "view", "", "")     \
  /* Reads into caller-provided outputs (fixed shapes, so they capture in CUDA graphs). */             \
  X(gather_mla,                                                                                        \
    "Tensor view, Tensor block_table, Tensor cu_seq_lens, Tensor? seq_starts, str kv_cache_dtype, "   \
    "Tensor(a!) out, bool validate=True, Tensor? scale=None",                                         \
    "view", "scale", "")                                                                               \
  X(gather_mla_slots,                                                                                  \
    "Tensor view, Tensor slots, str kv_cache_dtype, Tensor(a!) out, bool validate=True, "             \
    "Tensor? scale=None",                                                                              \
    "view", "scale", "")                                                                               \
  X(gather_kv,                                                                                         \
    "Tensor view, Tensor block_table, Tensor cu_seq_lens, Tensor? seq_starts, Tensor(a!) out, "       \
    "bool validate=True, Tensor? scale=None",                                                          \
    "view", "scale", "")                                                                               \
  X(gather_kv_slots,                                                                                   \
    "Tensor view, Tensor slots, Tensor(a!) out, bool validate=True, Tensor? scale=None",              \
    "view", "scale", "")                                                                               \
  X(gather_indexer,                                                                                    \
    "Tensor view, Tensor block_table, Tensor cu_seq_lens, Tensor? seq_starts, str placement, "        \
    "Tensor(a!) codes, Tensor(b!) scales, bool validate=True",                                        \
    "view", "", "")                                                                                    \
  X(gather_indexer_slots,                                                                              \
    "Tensor view, Tensor slots, str placement, Tensor(a!) codes, Tensor(b!) scales, "                 \
    "bool validate=True",                                                                              \
    "view", "", "")                                                                                    \
  /* V4 reads: format "fp8_ds_mla_v4" (584 B <-> 512 values), "v41_mxfp8" (V4.1's 528 B <-> 512 */ \
  /* values) or "mxfp4" (68 B <-> 128 values), to bf16 / fp32 values or raw rows (uint8 out). */      \
  X(gather_v4,                                                                                         \
    "Tensor view, Tensor block_table, Tensor cu_seq_lens, Tensor? seq_starts, str format, "           \
    "Tensor(a!) out, bool validate=True",                                                              \
    "view", "", "")                                                                                    \
  X(gather_v4_slots, "Tensor view, Tensor slots, str format, Tensor(a!) out, bool validate=True",     \
    "view", "", "")                                                                                    \
  /* Per request: its compressed rows, then its last `window` SWA rows. */                            \
  X(gather_v4_window,                                                                                  \
    "Tensor c_view, Tensor c_block_table, Tensor swa_view, Tensor swa_block_table, "                  \
    "Tensor seq_lens, Tensor cu_out, int ratio, int window, Tensor(a!) out, bool validate=True, "    \
    "str format=\"fp8_ds_mla_v4\"",                                                                  \
    "c_view", "", "")                                                                                  \
  /* Byte spans [S, 3] = (src offset, dst offset, length) between two flat buffers. */                \
  X(copy_spans, "Tensor src, Tensor(a!) dst, Tensor spans", "", "", "spans")                         \
  /* Checks alone, for callers that move or write bytes by other means (NIXL, debug runs). */        \
  X(check_spans, "Tensor spans, int src_bytes, int dst_bytes, bool same_buffer, str name=\"spans\"", \
    "", "", "spans")                                                                                 \
  X(check_slot_mapping, "Tensor slot_mapping, Tensor view", "view", "slot_mapping", "")            \
  /* Strided runs [R, 6] = (src, dst, length, src stride, dst stride, count) (runs.cpp). */          \
  X(runs_of_spans, "Tensor spans, Tensor(a!) runs, Tensor(b!) count", "", "",                        \
    "spans runs count")                                                                              \
  X(check_runs, "Tensor runs, int src_bytes, int dst_bytes, str name=\"runs\"", "", "", "runs")  \
  /* Runs between two buffers (a re-tiling: one parallel CPU loop or one CUDA launch). */             \
  X(copy_runs, "Tensor src, Tensor(a!) dst, Tensor runs", "", "", "runs")                            \
  /* The runs moving a request's tokens between two plans (plan_runs.cpp); runs of 0 rows: count */  \
  /* them only (into count), so the caller can allocate exactly that many. */                          \
  X(plan_token_runs,                                                                                   \
    "Tensor moves, Tensor src_table, Tensor dst_table, int src_block_size, int dst_block_size, "      \
    "int src_num_blocks, int dst_num_blocks, int num_tokens, int src_start, int dst_start, "          \
    "Tensor(a!) runs, Tensor(b!) count",                                                               \
    "", "", "moves src_table dst_table runs count")
