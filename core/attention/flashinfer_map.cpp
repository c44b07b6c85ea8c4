// The host side of FlashInfer's batch prefill: refusals, schedule, workspace layout, tensor
// mapping; see flashinfer_map.hpp.
#include "core/attention/flashinfer_map.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "core/common/checked_math.hpp"
#include "core/common/error.hpp"

namespace swiftkv {

namespace {

// FlashInfer's kernels load and store 16 bytes at a time: 8 elements of f16 or bf16.
constexpr int64_t kVectorElems = 8;
constexpr uintptr_t kVectorBytes = 16;
constexpr uint64_t kArrayAlign = 16;
// Elements of one tensor FlashInfer addresses with 32-bit signed products.
constexpr uint64_t kIndexLimit = uint64_t{INT32_MAX};

bool fits_u32(int64_t v) { return v >= 1 && v <= int64_t{UINT32_MAX}; }

// One int32 array of n entries at the next 16-byte boundary.
uint64_t take_array(uint64_t *cursor, uint64_t n) {
  const uint64_t at = round_up(*cursor, kArrayAlign);
  *cursor = checked_add(at, checked_mul(n, sizeof(int32_t), "flashinfer arrays"), "workspace");
  return at;
}

}  // namespace

const char *flashinfer_refusal_text(FlashInferRefusal r) {
  switch (r) {
    case FlashInferRefusal::none: return "none";
    case FlashInferRefusal::not_built: return "this library was built without FlashInfer";
    case FlashInferRefusal::host: return "the plan is a host plan";
    case FlashInferRefusal::dtype: return "the dtype is neither f16 nor bf16";
    case FlashInferRefusal::soft_cap:
      return "logits_soft_cap > 0 is not among the FlashInfer kernels built";
    case FlashInferRefusal::not_causal:
      return "causal is 0 and a sub-request has more than one query token";
    case FlashInferRefusal::unseen_queries:
      return "a query sees no key (a sub-request with fewer keys than causal queries, or none)";
    case FlashInferRefusal::forced_split: return "kv_chunk_tokens is not a multiple of page_tokens";
    case FlashInferRefusal::no_queries: return "the batch has no query token";
    case FlashInferRefusal::workspace:
      return "the workspace has no room for FlashInfer's arrays and partials "
             "(size it with swiftkv_attention_workspace_size)";
    case FlashInferRefusal::too_large:
      return "the batch's offsets pass FlashInfer's 32-bit indices";
  }
  return "unknown";
}

uint32_t flashinfer_cta_tile_q(uint64_t avg_packed_rows, uint32_t head_dim) {
  if (avg_packed_rows <= 16) return 16;
  if (avg_packed_rows <= 64 || head_dim >= 256) return 64;
  return 128;
}

FlashInferRefusal flashinfer_schedule(const AttentionShape &s, const AttentionBatch &b,
                                      uint32_t max_ctas, FlashInferSchedule *out) {
  *out = FlashInferSchedule{};
  if (s.device == SWIFTKV_DEVICE_HOST) return FlashInferRefusal::host;
  if (s.dtype != SWIFTKV_DTYPE_F16 && s.dtype != SWIFTKV_DTYPE_BF16) {
    return FlashInferRefusal::dtype;
  }
  if (s.soft_cap > 0) return FlashInferRefusal::soft_cap;
  const uint32_t n = b.n_requests;
  if (n == 0 || b.qo_indptr[n] == 0) return FlashInferRefusal::no_queries;
  if (s.kv_chunk_tokens > 0 && s.kv_chunk_tokens % s.page_tokens != 0) {
    return FlashInferRefusal::forced_split;
  }
  const uint64_t group = s.group();
  uint64_t packed_sum = 0;
  for (uint32_t r = 0; r < n; ++r) {
    const int64_t q_len = b.qo_indptr[r + 1] - b.qo_indptr[r];
    const int64_t pages = b.kv_indptr[r + 1] - b.kv_indptr[r];
    const int64_t kv_len = pages == 0 ? 0 : (pages - 1) * s.page_tokens + b.kv_last_page_len[r];
    if (q_len > 0) {
      if (kv_len == 0 || (s.causal && kv_len < q_len)) return FlashInferRefusal::unseen_queries;
      if (!s.causal && q_len > 1) return FlashInferRefusal::not_causal;
    }
    packed_sum += static_cast<uint64_t>(q_len) * group;
  }
  const uint32_t cta = flashinfer_cta_tile_q(packed_sum / n, s.head_dim);
  std::vector<uint64_t> tiles(n), pages(n);
  uint64_t max_pages = 1;
  for (uint32_t r = 0; r < n; ++r) {
    tiles[r] = ceil_div(static_cast<uint64_t>(b.qo_indptr[r + 1] - b.qo_indptr[r]) * group, cta);
    // A sub-request without pages still has one (empty) chunk, as the kernel counts it.
    pages[r] = std::max<uint64_t>(static_cast<uint64_t>(b.kv_indptr[r + 1] - b.kv_indptr[r]), 1);
    if (tiles[r] > 0) max_pages = std::max(max_pages, pages[r]);
  }
  auto blocks_for = [&](uint64_t chunk) {
    uint64_t blocks = 0;
    for (uint32_t r = 0; r < n; ++r) blocks += tiles[r] * ceil_div(pages[r], chunk);
    return blocks;
  };
  uint64_t chunk_pages = max_pages;
  bool split = false;
  if (s.kv_chunk_tokens > 0) {
    chunk_pages = s.kv_chunk_tokens / s.page_tokens;
    split = chunk_pages < max_pages;
  } else {
    // The shortest chunk (at least 128 tokens) whose blocks still fit the device once; longer
    // KV splits only while the unsplit blocks are too few to fill it.
    const uint64_t max_blocks = max_ctas / s.num_kv_heads;
    uint64_t lo = std::max<uint64_t>(128 / s.page_tokens, 1), hi = max_pages;
    if (lo < hi && blocks_for(max_pages) < max_blocks) {
      while (lo < hi) {
        const uint64_t mid = lo + (hi - lo) / 2;
        if (blocks_for(mid) <= max_blocks) {
          hi = mid;
        } else {
          lo = mid + 1;
        }
      }
      chunk_pages = lo;
      split = chunk_pages < max_pages;
    }
  }
  if (!split) chunk_pages = max_pages;
  const uint64_t blocks = blocks_for(chunk_pages);
  const uint64_t chunk_tokens = chunk_pages * s.page_tokens;
  if (blocks > kIndexLimit || chunk_tokens > kIndexLimit) return FlashInferRefusal::too_large;

  FlashInferSchedule &sc = *out;
  sc.cta_tile_q = cta;
  sc.split = split;
  sc.chunk_tokens = static_cast<uint32_t>(chunk_tokens);
  sc.request_indices.reserve(blocks);
  sc.qo_tile_indices.reserve(blocks);
  sc.kv_tile_indices.reserve(blocks);
  sc.o_indptr.reserve(n + 1);
  sc.merge_indptr.reserve(static_cast<size_t>(b.qo_indptr[n]) + 1);
  sc.o_indptr.push_back(0);
  sc.merge_indptr.push_back(0);
  uint64_t rows = 0;
  for (uint32_t r = 0; r < n; ++r) {
    const uint64_t chunks = split ? ceil_div(pages[r], chunk_pages) : 1;
    for (uint64_t t = 0; t < tiles[r]; ++t) {
      for (uint64_t c = 0; c < chunks; ++c) {
        sc.request_indices.push_back(static_cast<int32_t>(r));
        sc.qo_tile_indices.push_back(static_cast<int32_t>(t));
        sc.kv_tile_indices.push_back(static_cast<int32_t>(c));
      }
    }
    const uint64_t q_len = static_cast<uint64_t>(b.qo_indptr[r + 1] - b.qo_indptr[r]);
    for (uint64_t i = 0; i < q_len; ++i) {
      rows += chunks;
      if (rows > kIndexLimit) return FlashInferRefusal::too_large;
      sc.merge_indptr.push_back(static_cast<int32_t>(rows));
    }
    sc.o_indptr.push_back(static_cast<int32_t>(rows));
  }
  sc.partial_rows = split ? rows : 0;
  const uint64_t row_elems = uint64_t{s.num_qo_heads} * s.head_dim;
  if (checked_mul(std::max<uint64_t>(rows, 1), row_elems, "partials") > kIndexLimit) {
    return FlashInferRefusal::too_large;
  }
  return FlashInferRefusal::none;
}

FlashInferLayout flashinfer_layout(const AttentionShape &s, uint32_t n, uint64_t q_tokens,
                                   uint32_t ctas, bool split, uint64_t partial_rows) {
  FlashInferLayout l;
  uint64_t at = 0;
  l.qo_indptr = take_array(&at, uint64_t{n} + 1);
  l.kv_indptr = take_array(&at, uint64_t{n} + 1);
  l.last_page_len = take_array(&at, n);
  l.request_indices = take_array(&at, ctas);
  l.qo_tile_indices = take_array(&at, ctas);
  l.kv_tile_indices = take_array(&at, ctas);
  l.o_indptr = take_array(&at, uint64_t{n} + 1);
  l.merge_indptr = take_array(&at, checked_add(q_tokens, 1, "query tokens"));
  l.kv_chunk_size = take_array(&at, 1);
  l.int_bytes = at;
  at = round_up(at, kAttentionAlign);
  if (split) {
    const uint64_t heads = s.num_qo_heads;
    l.tmp_s = at;
    at = round_up(
        checked_add(at, checked_mul(partial_rows, heads * sizeof(float), "partials"), "workspace"),
        kAttentionAlign);
    l.tmp_v = at;
    // The partial outputs are in the output's dtype (2 bytes), as FlashInfer's kernel writes them.
    at = round_up(
        checked_add(at, checked_mul(partial_rows, heads * s.head_dim * 2, "partials"), "workspace"),
        kAttentionAlign);
  }
  l.bytes = at;
  return l;
}

void serialize_flashinfer_plan(const FlashInferSchedule &sc, const AttentionBatch &b,
                               const FlashInferLayout &l, void *dst) {
  auto *base = static_cast<unsigned char *>(dst);
  std::memset(base, 0, l.int_bytes);
  auto put = [&](uint64_t offset, const int32_t *src, size_t count) {
    if (count > 0) std::memcpy(base + offset, src, count * sizeof(int32_t));
  };
  const uint32_t n = b.n_requests;
  put(l.qo_indptr, b.qo_indptr, n + 1);
  put(l.kv_indptr, b.kv_indptr, n + 1);
  std::vector<int32_t> last(n);
  for (uint32_t r = 0; r < n; ++r) {
    last[r] = b.kv_indptr[r + 1] == b.kv_indptr[r] ? 0 : b.kv_last_page_len[r];
  }
  put(l.last_page_len, last.data(), n);
  put(l.request_indices, sc.request_indices.data(), sc.request_indices.size());
  put(l.qo_tile_indices, sc.qo_tile_indices.data(), sc.qo_tile_indices.size());
  put(l.kv_tile_indices, sc.kv_tile_indices.data(), sc.kv_tile_indices.size());
  put(l.o_indptr, sc.o_indptr.data(), sc.o_indptr.size());
  put(l.merge_indptr, sc.merge_indptr.data(), sc.merge_indptr.size());
  const int32_t chunk = static_cast<int32_t>(sc.chunk_tokens);
  put(l.kv_chunk_size, &chunk, 1);
}

uint64_t flashinfer_workspace_bound(const AttentionShape &s, uint32_t max_requests,
                                    uint64_t max_q_tokens) {
  const uint64_t group = s.group();
  // Unsplit: at most one partly filled tile (of at least 16 rows) per sub-request beyond the
  // full ones. Split: at most max_ctas / num_kv_heads blocks, each of at most 128 packed rows.
  const uint64_t split_blocks = kFlashInferMaxCtas / s.num_kv_heads;
  const uint64_t blocks =
      std::max(checked_add(ceil_div(checked_mul(max_q_tokens, group, "query rows"), 16),
                           max_requests, "blocks"),
               split_blocks);
  const uint64_t rows = ceil_div(split_blocks * 128, group);
  if (blocks > UINT32_MAX) fail_invalid("the batch bounds pass 2^32 thread blocks");
  return flashinfer_layout(s, max_requests, max_q_tokens, static_cast<uint32_t>(blocks), true, rows)
      .bytes;
}

std::optional<FlashInferTensors> flashinfer_tensors(const AttentionShape &shape,
                                                    const swiftkv_attention_args &args,
                                                    uint64_t q_tokens, std::string *why) {
  auto refuse = [&](std::string reason) -> std::optional<FlashInferTensors> {
    if (why != nullptr) *why = std::move(reason);
    return std::nullopt;
  };
  if (shape.dtype != SWIFTKV_DTYPE_F16 && shape.dtype != SWIFTKV_DTYPE_BF16) {
    return refuse("the dtype is neither f16 nor bf16");
  }
  if (shape.head_dim != 64 && shape.head_dim != 128 && shape.head_dim != 256) {
    return refuse("head_dim " + std::to_string(shape.head_dim) + " is not 64, 128 or 256");
  }
  const struct {
    const char *name;
    int64_t value;
  } strides[] = {{"page_stride", args.page_stride},
                 {"token_stride", args.token_stride},
                 {"head_stride", args.head_stride},
                 {"q_token_stride", args.q_token_stride},
                 {"q_head_stride", args.q_head_stride}};
  for (const auto &s : strides) {
    if (!fits_u32(s.value)) {
      return refuse(std::string(s.name) + " " + std::to_string(s.value) +
                    " does not fit FlashInfer's 32-bit strides");
    }
    if (s.value % kVectorElems != 0) {
      return refuse(std::string(s.name) + " " + std::to_string(s.value) +
                    " is not a multiple of 8 elements (16 bytes)");
    }
  }
  // q's offsets are 32-bit signed products in the kernel, and so are out's.
  const uint64_t q_reach =
      (q_tokens > 0 ? (q_tokens - 1) : 0) * static_cast<uint64_t>(args.q_token_stride) +
      uint64_t{shape.num_qo_heads} * static_cast<uint64_t>(args.q_head_stride);
  if (q_reach > kIndexLimit) {
    return refuse("q spans " + std::to_string(q_reach) +
                  " elements, past FlashInfer's 32-bit offsets");
  }
  if (q_tokens * shape.num_qo_heads * shape.head_dim > kIndexLimit) {
    return refuse("out spans past FlashInfer's 32-bit offsets");
  }
  const struct {
    const char *name;
    const void *p;
  } bases[] = {{"k_base", args.k_base}, {"v_base", args.v_base}, {"q", args.q}, {"out", args.out}};
  for (const auto &b : bases) {
    if (reinterpret_cast<uintptr_t>(b.p) % kVectorBytes != 0) {
      return refuse(std::string(b.name) + " is not 16-byte aligned");
    }
  }
  // The output is written densely: token t, head h at (t * num_qo_heads + h) * head_dim.
  const int64_t dense_head = shape.head_dim;
  const int64_t dense_token = int64_t{shape.num_qo_heads} * shape.head_dim;
  if (args.out_head_stride != dense_head || args.out_token_stride != dense_token) {
    return refuse("out is not dense [q_tokens, num_qo_heads, head_dim] (strides " +
                  std::to_string(args.out_token_stride) + ", " +
                  std::to_string(args.out_head_stride) + "; FlashInfer writes " +
                  std::to_string(dense_token) + ", " + std::to_string(dense_head) + ")");
  }
  FlashInferTensors t;
  t.page_stride = static_cast<uint32_t>(args.page_stride);
  t.token_stride = static_cast<uint32_t>(args.token_stride);
  t.head_stride = static_cast<uint32_t>(args.head_stride);
  t.q_token_stride = static_cast<int32_t>(args.q_token_stride);
  t.q_head_stride = static_cast<int32_t>(args.q_head_stride);
  return t;
}

namespace {
constexpr uint32_t kCtaTiles[3] = {16, 64, 128};
}  // namespace

uint64_t encode_plan_word(const AttentionPlanWord &w) {
  uint32_t cta = 0;
  while (cta < 2 && kCtaTiles[cta] != w.cta_tile_q) ++cta;
  const uint32_t bits = (w.causal ? 1u : 0u) | ((w.tile_rows & 0xffu) << 1) |
                        ((static_cast<uint32_t>(w.refusal) & 0xffu) << 9) | (cta << 17) |
                        ((w.split ? 1u : 0u) << 19);
  return uint64_t{bits} | (uint64_t{w.ctas} << 32);
}

AttentionPlanWord decode_plan_word(uint64_t word) {
  const auto bits = static_cast<uint32_t>(word);
  AttentionPlanWord w;
  w.causal = (bits & 1u) != 0;
  w.tile_rows = (bits >> 1) & 0xffu;
  const uint32_t refusal = (bits >> 9) & 0xffu;
  const uint32_t cta = (bits >> 17) & 3u;
  w.refusal = refusal <= kFlashInferRefusalMax && cta < 3 ? static_cast<FlashInferRefusal>(refusal)
                                                          : FlashInferRefusal::too_large;
  w.cta_tile_q = kCtaTiles[cta < 3 ? cta : 0];
  w.split = ((bits >> 19) & 1u) != 0;
  w.ctas = static_cast<uint32_t>(word >> 32);
  return w;
}

AttentionKernelChoice attention_kernel_choice() {
  const char *e = std::getenv("SWIFTKV_ATTENTION_KERNEL");
  if (e == nullptr || *e == '\0') return AttentionKernelChoice::automatic;
  if (std::strcmp(e, "flashinfer") == 0) return AttentionKernelChoice::flashinfer;
  if (std::strcmp(e, "fa2") == 0) return AttentionKernelChoice::fa2;
  fail_invalid(std::string("SWIFTKV_ATTENTION_KERNEL is '") + e +
               "': it names the attention kernel, flashinfer or fa2 (unset: FlashInfer where it "
               "can run, else fa2)");
}

}  // namespace swiftkv
