// The gather/scatter kernel's work items and its CPU twin: for every page layout, a request's
// chunks cut into items move exactly the bytes the copy plans move (scatter and gather), whether
// a chunk is read in place (direct) or through staging; items never exceed kItemBytes, keep a
// segment's 16-byte alignment, and a prefix of the chunks touches only those chunks' pages.
// The decode kernel's twin: chunks staged as one layer of a kivi or fp8 frame land in the pages
// as exactly what codec::decode makes of the whole frame, beside raw chunks of the same request.
// Both kernels' own source (kernels/segment_copy.cuh), run in the CPU emulation of the CUDA
// execution model (tests/emu), move and decode exactly the bytes their twins do.
#include <algorithm>
#include <csetjmp>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include <sys/mman.h>

#include "core/codec/chunk_codec.hpp"
#include "core/codec/layer_decode.hpp"
#include "core/common/error.hpp"
#include "core/tiers/chunk_encoding.hpp"
#include "core/transfer/copy_items.hpp"
#include "core/transfer/copy_plan.hpp"
#if defined(SWIFTKV_TEST_EMULATION)  // every build but TSan's (tests/CMakeLists.txt)
#include "emu_kernels.hpp"
#endif

// After the core headers: CMocka defines a macro named fail.
extern "C" {
#include <cmocka.h>
}

namespace {

using swiftkv::ChunkSource;
using swiftkv::CopyItem;
using swiftkv::CopySegment;
using swiftkv::PageLayout;

enum class Kind { nhd, hnd, vllm, cross_layer };

struct Case {
  Kind kind;
  uint32_t page_tokens, heads, head_dim, dtype_bytes;
};

// One layer of a pool of `pages` pages in the given layout (layer 1 of 3 for cross-layer pages,
// so its base is not the allocation's start).
struct Pool {
  PageLayout layout;
  std::vector<std::byte> memory;
  std::byte *base = nullptr;
  Pool(const Case &c, uint32_t pages) {
    const int64_t row = c.head_dim;
    const int64_t b = c.page_tokens, h = c.heads, d = c.head_dim;
    layout.num_pages = pages;
    layout.page_tokens = c.page_tokens;
    layout.heads = c.heads;
    layout.head_dim = c.head_dim;
    layout.dtype_bytes = c.dtype_bytes;
    uint64_t elements = uint64_t{pages} * 2 * b * h * d;
    uint64_t base_at = 0;
    switch (c.kind) {
      case Kind::nhd:
        layout.page_stride = 2 * b * h * d, layout.kv_stride = b * h * d;
        layout.token_stride = h * d, layout.head_stride = row;
        break;
      case Kind::hnd:
        layout.page_stride = 2 * h * b * d, layout.kv_stride = h * b * d;
        layout.head_stride = b * d, layout.token_stride = row;
        break;
      case Kind::vllm:
        layout.kv_stride = int64_t{pages} * b * h * d, layout.page_stride = b * h * d;
        layout.token_stride = h * d, layout.head_stride = row;
        break;
      case Kind::cross_layer:
        layout.page_stride = 3 * 2 * b * h * d, layout.kv_stride = b * h * d;
        layout.token_stride = h * d, layout.head_stride = row;
        base_at = uint64_t{2} * b * h * d * c.dtype_bytes;  // layer 1
        elements *= 3;
        break;
    }
    memory.assign(elements * c.dtype_bytes, std::byte{0});
    base = memory.data() + base_at;
  }
};

#if defined(SWIFTKV_TEST_EMULATION)
// Two blocks of eight warps, one item per warp at a time: a request of more than 16 items goes
// through the kernels' grid-stride loop.
constexpr unsigned kEmuGrid = 2;
#endif

std::vector<std::byte> random_bytes(std::mt19937_64 &rng, size_t n) {
  std::vector<std::byte> v(n);
  for (auto &b : v) b = static_cast<std::byte>(rng() & 0xff);
  return v;
}

void check_case(const Case &c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const uint32_t pages_per_chunk = 1 + static_cast<uint32_t>(rng() % 3);
  const uint32_t chunks = 1 + static_cast<uint32_t>(rng() % 4);
  const uint32_t pool_pages = chunks * pages_per_chunk + 3;
  const uint32_t chunk_tokens = pages_per_chunk * c.page_tokens;
  const uint64_t piece_bytes = uint64_t{2} * chunk_tokens * c.heads * c.head_dim * c.dtype_bytes;
  constexpr uint32_t kLayer = 1;  // direct chunks are read at layer 1 of 2

  std::vector<int32_t> order(pool_pages);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);

  Pool want(c, pool_pages), got(c, pool_pages);
  std::vector<std::vector<CopySegment>> plans;
  std::vector<CopyItem> items;
  std::vector<uint32_t> items_before{0};
  std::vector<ChunkSource> sources;
  std::vector<std::vector<std::byte>> direct;  // two layers of pieces per chunk
  std::vector<std::byte> staging(chunks * piece_bytes);
  uint64_t staged = 0;
  for (uint32_t i = 0; i < chunks; ++i) {
    const std::span<const int32_t> pages(order.data() + i * pages_per_chunk, pages_per_chunk);
    plans.push_back(swiftkv::chunk_copy_plan(want.layout, pages, chunk_tokens));
    const std::vector<CopySegment> &plan = plans.back();
    swiftkv::append_copy_items(reinterpret_cast<const uint64_t *>(plan.data()), plan.size(), i,
                               items);
    items_before.push_back(static_cast<uint32_t>(items.size()));
    direct.push_back(random_bytes(rng, 2 * piece_bytes));
    if (rng() % 2 == 0) {
      sources.push_back(ChunkSource{reinterpret_cast<uint64_t>(direct.back().data()), 0, 0, 0});
    } else {
      sources.push_back(ChunkSource{0, staged, 0, 0});
      std::memcpy(staging.data() + staged, direct.back().data() + kLayer * piece_bytes,
                  piece_bytes);
      staged += piece_bytes;
    }
    // Every segment's bytes, cut at kItemBytes from its start, in order.
    uint64_t seg_bytes = 0;
    for (const CopySegment &s : plan) seg_bytes += s.bytes;
    uint64_t item_bytes = 0;
    for (uint32_t k = items_before[i]; k < items_before[i + 1]; ++k) {
      const CopyItem &it = items[k];
      assert_int_equal(it.chunk, i);
      assert_true(it.bytes > 0 && it.rows > 0 &&
                  it.rows * uint32_t{it.bytes} <= swiftkv::kItemBytes);
      if (it.rows > 1) assert_true(it.page_stride >= it.bytes && it.piece_stride >= it.bytes);
      item_bytes += uint64_t{it.rows} * it.bytes;
    }
    assert_int_equal(item_bytes, seg_bytes);
    assert_int_equal(seg_bytes, piece_bytes);
  }
  for (const CopyItem &it : items) {
    // Every row lies in one segment at the segment's own distance between page and piece (a
    // joined row is a whole segment; a cut one starts a multiple of kItemBytes into it, so a
    // segment aligned to 16 bytes on both sides gives rows aligned the same way).
    for (uint32_t r = 0; r < it.rows; ++r) {
      const uint64_t page = it.page_offset + uint64_t{r} * it.page_stride;
      const uint64_t piece = it.piece_offset + uint64_t{r} * it.piece_stride;
      const auto seg =
          std::find_if(plans[it.chunk].begin(), plans[it.chunk].end(), [&](const CopySegment &s) {
            return piece >= s.piece_offset && piece < s.piece_offset + s.bytes;
          });
      assert_true(seg != plans[it.chunk].end());
      assert_int_equal(page - seg->page_offset, piece - seg->piece_offset);
      assert_int_equal((piece - seg->piece_offset) % swiftkv::kItemBytes, 0);
      assert_true(piece + it.bytes <= seg->piece_offset + seg->bytes);
      if (it.rows > 1) assert_int_equal(it.bytes, seg->bytes);
    }
  }

  // Scatter of a prefix: only those chunks' pages change, exactly as the plans put them.
  const uint32_t prefix = static_cast<uint32_t>(rng() % (chunks + 1));
  for (uint32_t i = 0; i < prefix; ++i) {
    swiftkv::scatter_piece(plans[i], direct[i].data() + kLayer * piece_bytes, want.base);
  }
  swiftkv::copy_items_cpu(items.data(), items_before[prefix], sources.data(), kLayer, piece_bytes,
                          staging.data(), got.base, true);
  {
    // The host copy engine's non-temporal scatter writes the same bytes as the memcpy one.
    Pool nt(c, pool_pages);
    for (uint32_t i = 0; i < prefix; ++i) {
      swiftkv::scatter_piece(plans[i], direct[i].data() + kLayer * piece_bytes, nt.base, true);
    }
    assert_true(nt.memory == want.memory);
  }
  assert_true(got.memory == want.memory);
#if defined(SWIFTKV_TEST_EMULATION)
  // Both launches of the kernel (CopyKernel: spread, ahead).
  for (const bool ahead : {false, true}) {
    Pool emu(c, pool_pages);
    kernel_emulation::run_copy_items(
        kEmuGrid, items.data(), items_before[prefix], sources.data(), kLayer * piece_bytes,
        reinterpret_cast<unsigned char *>(staging.data()),
        reinterpret_cast<unsigned char *>(emu.base), true, ahead, {seed});
    assert_true(emu.memory == want.memory);
  }
#endif

  // Gather every chunk back out of pages filled at random.
  const std::vector<std::byte> fill = random_bytes(rng, want.memory.size());
  want.memory = fill;
  got.memory = fill;
  std::vector<std::vector<std::byte>> back_direct(chunks, std::vector<std::byte>(2 * piece_bytes));
  std::vector<ChunkSource> back_sources = sources;
  for (uint32_t i = 0; i < chunks; ++i) {
    if (back_sources[i].direct != 0) {
      back_sources[i].direct = reinterpret_cast<uint64_t>(back_direct[i].data());
    }
  }
  std::vector<std::byte> back_staging(staging.size());
  swiftkv::copy_items_cpu(items.data(), items.size(), back_sources.data(), kLayer, piece_bytes,
                          back_staging.data(), got.base, false);
#if defined(SWIFTKV_TEST_EMULATION)
  // The kernel gathers into buffers of its own: the same bytes everywhere, pieces and the rest.
  for (const bool ahead : {false, true}) {
    std::vector<std::vector<std::byte>> emu_direct(chunks, std::vector<std::byte>(2 * piece_bytes));
    std::vector<ChunkSource> emu_sources = back_sources;
    for (uint32_t i = 0; i < chunks; ++i) {
      if (emu_sources[i].direct != 0) {
        emu_sources[i].direct = reinterpret_cast<uint64_t>(emu_direct[i].data());
      }
    }
    std::vector<std::byte> emu_staging(staging.size());
    Pool emu(c, pool_pages);
    emu.memory = fill;
    kernel_emulation::run_copy_items(
        kEmuGrid, items.data(), static_cast<uint32_t>(items.size()), emu_sources.data(),
        kLayer * piece_bytes, reinterpret_cast<unsigned char *>(emu_staging.data()),
        reinterpret_cast<unsigned char *>(emu.base), false, ahead, {seed + 1});
    assert_true(emu_direct == back_direct);
    assert_true(emu_staging == back_staging);
    assert_true(emu.memory == fill);
  }
#endif
  for (uint32_t i = 0; i < chunks; ++i) {
    std::vector<std::byte> expect(piece_bytes);
    swiftkv::gather_piece(plans[i], want.base, expect.data());
    std::vector<std::byte> expect_nt(piece_bytes);
    swiftkv::gather_piece(plans[i], want.base, expect_nt.data(), true);
    assert_true(expect_nt == expect);
    const std::byte *out = back_sources[i].direct != 0
                               ? back_direct[i].data() + kLayer * piece_bytes
                               : back_staging.data() + back_sources[i].staged_at;
    assert_memory_equal(out, expect.data(), piece_bytes);
  }
  assert_true(got.memory == fill);  // a gather leaves the pages alone
}

void every_layout_moves_the_plans_bytes(void **) {
  const Case cases[] = {
      {Kind::nhd, 16, 8, 128, 2},
      {Kind::nhd, 1, 4, 64, 2},
      {Kind::hnd, 16, 8, 128, 2},
      {Kind::hnd, 256, 2, 128, 2},
      {Kind::vllm, 16, 8, 128, 2},
      {Kind::vllm, 4, 3, 5, 1},
      {Kind::cross_layer, 16, 2, 64, 4},
      {Kind::hnd, 8, 3, 6, 1},
      {Kind::nhd, 32, 1, 2, 1},
      // HND rows of 3 words (a warp step ends mid-row) and of 64 words (a row takes two steps).
      {Kind::hnd, 4, 5, 24, 2},
      {Kind::hnd, 2, 3, 512, 2},
      // Items of one row whose word count is not a power of two (a page's K or V block, 240
      // words), and rows of 10 words (head dim 80): the kernel's two ways besides shifts.
      {Kind::nhd, 16, 3, 40, 2},
      {Kind::hnd, 16, 2, 80, 2},
  };
  uint64_t seed = 1;
  for (const Case &c : cases) {
    for (int rep = 0; rep < 8; ++rep) check_case(c, seed++);
  }
}

// The plan row by row: each (K or V, token, head) row its own segment, joined to the one before
// where both sides continue it (every layout but HND). chunk_copy_plan must give exactly this,
// however it walks the rows.
std::vector<CopySegment> plan_row_by_row(const PageLayout &l, const std::vector<int32_t> &pages,
                                         uint32_t chunk_tokens, uint32_t first_token) {
  const bool heads_outer = l.heads > 1 && l.page_tokens > 1 && l.token_stride == l.head_dim;
  const uint64_t row = uint64_t{l.head_dim} * l.dtype_bytes;
  std::vector<CopySegment> plan;
  for (uint32_t c = 0; c < 2; ++c) {
    for (uint32_t p = 0; p < chunk_tokens; p += l.page_tokens) {
      for (uint32_t a = 0; a < (heads_outer ? l.heads : l.page_tokens); ++a) {
        for (uint32_t b = 0; b < (heads_outer ? l.page_tokens : l.heads); ++b) {
          const uint32_t t = p + (heads_outer ? b : a), h = heads_outer ? a : b;
          if (t < first_token || t >= chunk_tokens) continue;
          const uint64_t at =
              l.offset(static_cast<uint32_t>(pages[t / l.page_tokens]), c, t % l.page_tokens, h);
          const uint64_t piece = ((uint64_t{c} * chunk_tokens + t) * l.heads + h) * row;
          if (!heads_outer && !plan.empty() && plan.back().page_offset + plan.back().bytes == at &&
              plan.back().piece_offset + plan.back().bytes == piece) {
            plan.back().bytes += row;
          } else {
            plan.push_back(CopySegment{at, piece, row});
          }
        }
      }
    }
  }
  return plan;
}

void plans_are_the_row_by_row_plan(void **) {
  const Case cases[] = {
      {Kind::nhd, 16, 8, 128, 2},   {Kind::nhd, 1, 4, 64, 2}, {Kind::hnd, 16, 8, 128, 2},
      {Kind::vllm, 16, 64, 128, 2}, {Kind::vllm, 4, 3, 5, 1}, {Kind::cross_layer, 16, 2, 64, 4},
      {Kind::hnd, 8, 3, 6, 1},      {Kind::nhd, 32, 1, 2, 1},
  };
  std::mt19937_64 rng(7);
  for (const Case &c : cases) {
    for (int spaced = 0; spaced < 2; ++spaced) {
      Pool pool(c, 64);
      if (spaced && c.kind != Kind::hnd) {
        // A token's heads side by side, tokens apart (a pool whose token rows interleave
        // another's): only the heads of one token join.
        pool.layout.token_stride = 3 * int64_t{c.heads} * c.head_dim;
        pool.layout.kv_stride = pool.layout.token_stride * c.page_tokens;
        pool.layout.page_stride = 2 * pool.layout.kv_stride;
      }
      for (const uint32_t chunk_pages : {1u, 2u, 4u}) {
        const uint32_t chunk_tokens = chunk_pages * c.page_tokens;
        std::vector<int32_t> pages(64);
        std::iota(pages.begin(), pages.end(), 0);
        std::shuffle(pages.begin(), pages.end(), rng);
        pages.resize(chunk_pages);
        if (chunk_pages == 2) pages[1] = pages[0] + 1;  // consecutive pages join in vLLM's
        for (const uint32_t first : {0u, chunk_tokens / 2, chunk_tokens - 1}) {
          const std::vector<CopySegment> got =
              swiftkv::chunk_copy_plan(pool.layout, pages, chunk_tokens, first);
          const std::vector<CopySegment> want =
              plan_row_by_row(pool.layout, pages, chunk_tokens, first);
          assert_int_equal(got.size(), want.size());
          for (size_t i = 0; i < got.size(); ++i) {
            assert_int_equal(got[i].page_offset, want[i].page_offset);
            assert_int_equal(got[i].piece_offset, want[i].piece_offset);
            assert_int_equal(got[i].bytes, want[i].bytes);
          }
        }
      }
    }
  }
}

void a_long_segment_is_cut_at_item_size(void **) {
  const uint64_t segs[] = {0, 0, 3 * swiftkv::kItemBytes + 48, 1 << 20, 1 << 16, 16};
  std::vector<CopyItem> items;
  swiftkv::append_copy_items(segs, 2, 7, items);
  assert_int_equal(items.size(), 5);
  const uint32_t bytes[] = {swiftkv::kItemBytes, swiftkv::kItemBytes, swiftkv::kItemBytes, 48, 16};
  for (size_t k = 0; k < items.size(); ++k) {
    assert_int_equal(items[k].bytes, bytes[k]);
    assert_int_equal(items[k].chunk, 7);
  }
  assert_int_equal(items[3].page_offset, 3 * swiftkv::kItemBytes);
  assert_int_equal(items[3].piece_offset, 3 * swiftkv::kItemBytes);
  assert_int_equal(items[4].page_offset, 1 << 20);
  assert_int_equal(items[4].piece_offset, 1 << 16);
  items.clear();
  swiftkv::append_copy_items(segs, 0, 0, items);
  assert_int_equal(items.size(), 0);
}

// HND's segments (a token's heads: 256 bytes each, heads a page's head stride apart in the pages
// and next to each other in the piece) are joined into rows, up to kItemBytes an item; what
// breaks the spacing or the size starts a new item, and no item spans two chunks.
void evenly_spaced_segments_become_rows(void **) {
  std::vector<uint64_t> segs;
  for (uint64_t t = 0; t < 2; ++t) {
    for (uint64_t h = 0; h < 20; ++h) {  // 20 heads: 16 rows fill an item, 4 more start one
      segs.insert(segs.end(), {h * 4096 + t * 256, (t * 20 + h) * 256, 256});
    }
  }
  std::vector<CopyItem> items;
  swiftkv::append_copy_items(segs.data(), segs.size() / 3, 3, items);
  // Token 0: heads 0-15, then 16-19; token 1 starts again at page offset 256, which is not the
  // next row of token 0's second item.
  assert_int_equal(items.size(), 4);
  const uint16_t rows[] = {16, 4, 16, 4};
  const uint64_t page[] = {0, 16 * 4096, 256, 16 * 4096 + 256};
  const uint64_t piece[] = {0, 16 * 256, 20 * 256, 36 * 256};
  for (size_t k = 0; k < items.size(); ++k) {
    assert_int_equal(items[k].rows, rows[k]);
    assert_int_equal(items[k].bytes, 256);
    assert_int_equal(items[k].page_offset, page[k]);
    assert_int_equal(items[k].piece_offset, piece[k]);
    assert_int_equal(items[k].page_stride, 4096);
    assert_int_equal(items[k].piece_stride, 256);
    assert_int_equal(items[k].chunk, 3);
  }
  // The next chunk's items start afresh even where its segments would continue the spacing.
  const uint64_t next[] = {20 * 4096 + 256, 40 * 256, 256};
  swiftkv::append_copy_items(next, 1, 4, items);
  assert_int_equal(items.size(), 5);
  assert_int_equal(items[4].rows, 1);
  assert_int_equal(items[4].chunk, 4);
  // A segment of another size, one that would overlap the row before it, and one going
  // backwards are not joined: five segments, five items of one row.
  const uint64_t odd[] = {0,   0,    256, 4096, 256, 128,  8192, 512,
                          256, 8292, 768, 256,  100, 1024, 256};
  items.clear();
  swiftkv::append_copy_items(odd, 5, 0, items);
  assert_int_equal(items.size(), 5);
  for (const CopyItem &it : items) assert_int_equal(it.rows, 1);
}

// The items a real chunk makes: 256 tokens of 8 heads x 128 f16, its pages in descending order
// (no two of them adjacent in memory the way the chunk's tokens are). HND pages are walked a head
// at a time, so each head's tokens of a page join into one item of 16 rows, contiguous in the
// page: 4 KiB items, as many as NHD's whole pages cut at kItemBytes (a token's heads at a time
// would give 8 rows, 2 KiB). A load from a block boundary leaves the pages before it out.
void hnd_pages_give_whole_items(void **) {
  for (const uint32_t page_tokens : {16u, 256u}) {
    for (const Kind kind : {Kind::hnd, Kind::nhd}) {
      const Case c{kind, page_tokens, 8, 128, 2};
      const uint32_t chunk_tokens = 256, n_pages = chunk_tokens / page_tokens;
      Pool pool(c, n_pages);
      std::vector<int32_t> pages(n_pages);
      for (uint32_t i = 0; i < n_pages; ++i) pages[i] = static_cast<int32_t>(n_pages - 1 - i);
      for (const uint32_t first_token : {0u, page_tokens == 16 ? 16u : 0u}) {
        const std::vector<CopySegment> plan =
            swiftkv::chunk_copy_plan(pool.layout, pages, chunk_tokens, first_token);
        std::vector<CopyItem> items;
        swiftkv::append_copy_items(reinterpret_cast<const uint64_t *>(plan.data()), plan.size(), 0,
                                   items);
        const uint64_t bytes = uint64_t{2} * (chunk_tokens - first_token) * 8 * 128 * 2;
        assert_int_equal(items.size(), bytes / swiftkv::kItemBytes);
        for (const CopyItem &it : items) {
          if (kind == Kind::hnd) {
            assert_int_equal(it.rows, 16);
            assert_int_equal(it.bytes, 256);
            assert_int_equal(it.page_stride, 256);    // a head's tokens, next to each other
            assert_int_equal(it.piece_stride, 2048);  // a token's 8 heads apart in the piece
          } else {
            assert_int_equal(it.rows, 1);
            assert_int_equal(it.bytes, swiftkv::kItemBytes);
          }
          // Nothing of the pages before first_token: they hold tokens [0, first_token).
          const uint64_t page_bytes = uint64_t{2} * page_tokens * 8 * 128 * 2;
          const uint64_t page = it.page_offset / page_bytes;
          assert_true(page < n_pages);
          assert_true(n_pages - 1 - page >= first_token / page_tokens);
        }
      }
    }
  }
}

// Smooth f16/bf16 values with per-channel offsets, as KV looks (codecs refuse NaN and inf).
std::vector<std::byte> kv_like(std::mt19937_64 &rng, const swiftkv::codec::ChunkShape &s) {
  std::vector<std::byte> v(s.bytes());
  std::normal_distribution<float> noise(0.0f, 0.3f);
  const uint64_t row = uint64_t{s.heads} * s.dim;
  for (uint64_t e = 0; e < s.elements(); ++e) {
    const float x = static_cast<float>((e % row) % 7) - 3.0f + noise(rng);
    const uint16_t b = swiftkv::codec::float_to_element(x, s.dtype);
    std::memcpy(v.data() + 2 * e, &b, 2);
  }
  return v;
}

void encoded_chunks_decode_into_the_plans_pages(void **) {
  using swiftkv::codec::Codec;
  using swiftkv::codec::CodecParams;
  // Head dims of 8's multiples decode eight elements at a time; where kivi's codes fill whole
  // 16-byte multiples (all of these but the 2-token pages' 2- and 4-bit codes) each word is read
  // in one load of its size (codec::layer_words_aligned), else byte by byte where unaligned.
  // HND items are a page's tokens of one head, rows of fewer than 32 groups, which the spread
  // launch decodes several at a time: 2 groups a row (16 rows a step), 16 (2 rows a step, 8
  // steps), and 4 with 12 rows (8 rows a step, the second step partial); and rows of 10 and 12
  // groups (head dims 80 and 96), 3 and 2 rows a step (30 and 24 lanes busy; 16 rows, the last
  // step partial at 10).
  const Case cases[] = {
      {Kind::nhd, 16, 2, 64, 2},         {Kind::hnd, 16, 3, 16, 2},  {Kind::vllm, 8, 2, 24, 2},
      {Kind::cross_layer, 16, 2, 32, 2}, {Kind::nhd, 4, 3, 5, 2},    {Kind::hnd, 8, 1, 12, 2},
      {Kind::nhd, 2, 1, 8, 2},           {Kind::hnd, 16, 2, 128, 2}, {Kind::hnd, 12, 2, 32, 2},
      {Kind::hnd, 16, 2, 80, 2},         {Kind::hnd, 16, 1, 96, 2}};
  const CodecParams codecs[] = {{Codec::kivi, 8, 8},   {Codec::kivi, 4, 32}, {Codec::kivi, 2, 16},
                                {Codec::kivi, 2, 256}, {Codec::fp8, 0, 0},   {Codec::raw, 0, 0}};
  constexpr uint32_t kLayers = 3, kLayer = 2;
  uint64_t seed = 100;
  for (const Case &c : cases) {
    for (swiftkv_dtype dtype : {SWIFTKV_DTYPE_F16, SWIFTKV_DTYPE_BF16}) {
      std::mt19937_64 rng(seed++);
      const uint32_t pages_per_chunk = 1 + static_cast<uint32_t>(rng() % 3);
      const uint32_t chunks = 6;
      const uint32_t pool_pages = chunks * pages_per_chunk + 2;
      const swiftkv::codec::ChunkShape shape{kLayers, pages_per_chunk * c.page_tokens, c.heads,
                                             c.head_dim, dtype};
      const swiftkv::codec::LayerShape ls = swiftkv::codec::layer_shape_of(shape);
      const uint64_t piece_bytes = shape.bytes() / kLayers;
      std::vector<int32_t> order(pool_pages);
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      Pool want(c, pool_pages), got(c, pool_pages);
      std::vector<CopyItem> items;
      std::vector<ChunkSource> sources;
      std::vector<std::byte> staging;
      for (uint32_t i = 0; i < chunks; ++i) {
        const CodecParams &p = codecs[(i + seed) % std::size(codecs)];
        const std::span<const int32_t> pages(order.data() + i * pages_per_chunk, pages_per_chunk);
        const std::vector<CopySegment> plan =
            swiftkv::chunk_copy_plan(want.layout, pages, shape.tokens);
        swiftkv::append_copy_items(reinterpret_cast<const uint64_t *>(plan.data()), plan.size(), i,
                                   items);
        const std::vector<std::byte> raw = kv_like(rng, shape);
        const std::vector<std::byte> frame = swiftkv::codec::encode(shape, p, raw);
        std::vector<std::byte> decoded(shape.bytes());
        swiftkv::codec::decode(frame, shape, decoded);
        swiftkv::scatter_piece(plan, decoded.data() + kLayer * piece_bytes, want.base);
        ChunkSource src{0, staging.size(), 0, 0};
        if (p.codec == Codec::raw) {
          staging.insert(staging.end(), decoded.begin() + kLayer * piece_bytes,
                         decoded.begin() + (kLayer + 1) * piece_bytes);
        } else {
          src.encoding = swiftkv::encoding_of(p, false);
          const uint64_t layer = swiftkv::codec::layer_payload_bytes(ls, src.encoding);
          assert_int_equal(frame.size(), swiftkv::codec::kFrameHeaderBytes + kLayers * layer);
          swiftkv::codec::check_layer_values(frame, shape, p);
          const auto at = frame.begin() + static_cast<ptrdiff_t>(swiftkv::codec::kFrameHeaderBytes +
                                                                 kLayer * layer);
          staging.insert(staging.end(), at, at + static_cast<ptrdiff_t>(layer));
        }
        staging.resize((staging.size() + 15) / 16 * 16);
        sources.push_back(src);
      }
      // The copy kernel's twin moves the raw chunks, the decode kernel's the encoded ones.
      swiftkv::copy_items_cpu(items.data(), items.size(), sources.data(), kLayer, piece_bytes,
                              staging.data(), got.base, true);
      swiftkv::decode_items_cpu(items.data(), items.size(), sources.data(), ls, staging.data(),
                                got.base);
      assert_true(got.memory == want.memory);
#if defined(SWIFTKV_TEST_EMULATION)
      // The two kernels, as the CUDA executor launches them for one layer (the copy kernel
      // either way: both leave the encoded chunks' items to the decode kernel).
      for (const bool ahead : {false, true}) {
        Pool emu(c, pool_pages);
        const auto n = static_cast<uint32_t>(items.size());
        auto *stage = reinterpret_cast<unsigned char *>(staging.data());
        auto *pages = reinterpret_cast<unsigned char *>(emu.base);
        kernel_emulation::run_copy_items(kEmuGrid, items.data(), n, sources.data(),
                                         kLayer * piece_bytes, stage, pages, true, ahead, {seed});
        kernel_emulation::run_decode_items(kEmuGrid, items.data(), n, sources.data(), stage, pages,
                                           &ls, sizeof ls, ahead, {seed});
        assert_true(emu.memory == want.memory);
      }
#endif
    }
  }
}

// The device decodes a layer whose two tensors hold at most 2^32 - 1 elements together (its index
// arithmetic is 32-bit); ChunkCache leaves a larger one to the host.
void only_layers_of_32_bit_positions_decode_on_a_device(void **) {
  using swiftkv::codec::LayerShape;
  assert_true(swiftkv::codec::layer_fits_device(LayerShape{256, 8, 128, 0}));
  // 2 * 2^15 * 2^8 * 255 = 2^32 - 2^24 elements: fits; at dim 256, 2^32 does not.
  assert_true(swiftkv::codec::layer_fits_device(LayerShape{1u << 15, 1u << 8, 255, 0}));
  assert_false(swiftkv::codec::layer_fits_device(LayerShape{1u << 15, 1u << 8, 256, 0}));
  assert_true(swiftkv::codec::layer_fits_device(LayerShape{(1u << 31) - 1, 1, 1, 0}));
  assert_false(swiftkv::codec::layer_fits_device(LayerShape{1u << 31, 1, 1, 0}));
  // Products past 64 bits are not taken for small ones.
  assert_false(swiftkv::codec::layer_fits_device(LayerShape{UINT32_MAX, UINT32_MAX, 4, 1}));
  assert_false(swiftkv::codec::layer_fits_device(LayerShape{1u << 31, 1u << 31, 8, 1}));
}

#if defined(SWIFTKV_TEST_EMULATION)
// The device's index arithmetic is 32-bit (codec::LayerIndex) where the host's is 64-bit: at the
// largest layer a device decodes, the last tokens of K and V and the first of V decode to the
// same elements in the emulated kernel as in its twin. There a kivi code's byte and a pair's index
// are just under 2^31 and the value pairs and fp8's V records lie past 4 GiB, so a product left
// in 32 bits reads other bytes. The payload is mapped, not filled: only the parts these tokens
// read hold values (random codes, finite pairs and scales), the rest reads as zeros.
void a_layer_at_the_device_limit_decodes_as_on_the_host(void **) {
  using swiftkv::codec::LayerShape;
  // 2 x 65535 x 8 x 4096 = 2^32 - 2^17 elements: the two tensors fit 32 bits, each just under
  // 2^31.
  const LayerShape shape{65535, 8, 4096, 0};
  assert_true(swiftkv::codec::layer_fits_device(shape));
  assert_false(swiftkv::codec::layer_fits_device(LayerShape{65536, 8, 4096, 0}));
  const uint64_t n = swiftkv::codec::layer_tensor_elements(shape);
  const uint64_t row = uint64_t{shape.heads} * shape.dim;
  using swiftkv::codec::Codec;
  const uint32_t kivi8 = swiftkv::encoding_of({Codec::kivi, 8, 32}, false);
  const uint32_t kivi2 = swiftkv::encoding_of({Codec::kivi, 2, 128}, false);
  const uint32_t fp8 = swiftkv::encoding_of({Codec::fp8, 0, 0}, false);
  std::mt19937_64 rng(4646);
  for (const uint32_t bf16 : {0u, 1u}) {
    for (const uint32_t encoding : {kivi8, kivi2, fp8}) {
      const LayerShape s{shape.tokens, shape.heads, shape.dim, bf16};
      const uint64_t bytes = swiftkv::codec::layer_payload_bytes(s, encoding);
      // kivi-8's value pairs and fp8's last records lie past 4 GiB (kivi-2's layer is 1.1 GiB).
      assert_true(bytes > (uint64_t{1} << 32) || encoding == kivi2);
      void *map = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      assert_true(map != MAP_FAILED);
      auto *payload = static_cast<unsigned char *>(map);
      // Random codes over [at, at + len); pair halves or fp8 scales made finite where asked.
      const auto fill_codes = [&](uint64_t at, uint64_t len) {
        for (uint64_t k = 0; k < len; ++k) {
          uint8_t c = static_cast<uint8_t>(rng());
          if (encoding == fp8 && (c & 0x7f) == 0x7f) c = 0x3c;  // no NaN
          payload[at + k] = c;
        }
      };
      const auto fill_pairs = [&](uint64_t at, uint64_t len) {
        // Halves below 2 in magnitude, of either type: sign, and an exponent under 0x0f / 0x7f.
        for (uint64_t k = 0; k < len; k += 2) {
          const auto h = static_cast<uint16_t>(rng() & 0xbfff);
          std::memcpy(payload + at + k, &h, 2);
        }
      };
      if (encoding == fp8) {
        const uint64_t record = 4 + row;
        for (const uint64_t t :
             {n / row - 2, n / row - 1, n / row, 2 * n / row - 2, 2 * n / row - 1}) {
          const float scale = 0.001f + static_cast<float>(rng() % 1000) / 1000.0f;
          std::memcpy(payload + t * record, &scale, 4);
          fill_codes(t * record + 4, row);
        }
      } else {
        const uint32_t bits = swiftkv::codec::layer_bits(encoding);
        const uint32_t group = 1u << swiftkv::codec::layer_group_log2(encoding);
        const uint64_t codes = swiftkv::codec::kivi_code_bytes(s, bits);
        const uint64_t key_pairs = swiftkv::codec::kivi_key_pair_bytes(s, group);
        const uint64_t token_codes = row * bits / 8;
        const uint64_t value_pairs_per_token =
            uint64_t{s.heads} * ((s.dim + group - 1) / group) * 4;
        // K: the last two tokens' codes and their token group's pairs; V: the first token's and
        // the last two tokens' codes and pairs.
        fill_codes(codes - 2 * token_codes, 2 * token_codes);
        fill_pairs(codes + key_pairs - row * 4, row * 4);
        const uint64_t v_codes = codes + key_pairs, v_pairs = 2 * codes + key_pairs;
        fill_codes(v_codes, token_codes);
        fill_codes(v_codes + codes - 2 * token_codes, 2 * token_codes);
        fill_pairs(v_pairs, value_pairs_per_token);
        fill_pairs(bytes - 2 * value_pairs_per_token, 2 * value_pairs_per_token);
      }
      // Items of one 4096-byte row each over those tokens' elements (piece offsets in decoded
      // bytes), into consecutive pages; and one of 30 bytes at an odd element, which the kernel
      // decodes element by element.
      std::vector<CopyItem> items;
      uint64_t out_at = 0;
      for (const uint64_t t :
           {n / row - 2, n / row - 1, n / row, 2 * n / row - 2, 2 * n / row - 1}) {
        for (uint64_t b = 0; b < row * 2; b += swiftkv::kItemBytes) {
          items.push_back(CopyItem{out_at, t * row * 2 + b, 0, swiftkv::kItemBytes, 1, 0, 0});
          out_at += swiftkv::kItemBytes;
        }
      }
      items.push_back(CopyItem{out_at, (2 * n - 17) * 2, 0, 30, 1, 0, 0});
      out_at += 32;
      const ChunkSource source{0, 0, encoding, 0};
      std::vector<std::byte> twin(out_at), emu(out_at);
      swiftkv::decode_items_cpu(items.data(), items.size(), &source, s,
                                reinterpret_cast<const std::byte *>(payload), twin.data());
      kernel_emulation::run_decode_items(
          kEmuGrid, items.data(), static_cast<uint32_t>(items.size()), &source, payload,
          reinterpret_cast<unsigned char *>(emu.data()), &s, sizeof s, false, {7});
      assert_true(emu == twin);
      // What was filled was read: not every element decodes to zero.
      assert_true(std::count(twin.begin(), twin.end(), std::byte{0}) <
                  static_cast<ptrdiff_t>(out_at / 2));
      assert_int_equal(munmap(map, bytes), 0);
    }
  }
}
#endif

#if defined(SWIFTKV_TEST_EMULATION)
// Items of rows of every length a warp step can end inside (1 to 31 words, where the kernel
// finds a lane's first word and a step's rows by a multiplier made from a float reciprocal unless
// the length is a power of two), longer ones, and 1, 2, 3 and as many rows as fit, at strides past
// the row: both launches move exactly the twin's bytes, both ways. A quotient one off at any
// length fails.
void rows_of_every_length_move_as_the_twin_moves_them(void **) {
  std::mt19937_64 rng(80);
  std::vector<uint32_t> lengths;
  for (uint32_t w = 1; w <= 48; ++w) lengths.push_back(w);
  for (const uint32_t w : {63u, 96u, 100u, 128u, 240u, 256u}) lengths.push_back(w);
  std::vector<CopyItem> items;
  uint64_t page_at = 0, piece_at = 0;
  for (const uint32_t w : lengths) {
    const uint32_t most = swiftkv::kItemBytes / (16 * w);
    for (const uint32_t rows : {1u, 2u, 3u, most}) {
      if (rows > most) continue;
      const uint32_t bytes = 16 * w;
      const uint32_t page_stride = rows > 1 ? bytes + 16 * static_cast<uint32_t>(rng() % 3) : 0;
      const uint32_t piece_stride = rows > 1 ? bytes + 16 * static_cast<uint32_t>(rng() % 3) : 0;
      items.push_back(CopyItem{page_at, piece_at, 0, static_cast<uint16_t>(bytes),
                               static_cast<uint16_t>(rows), page_stride, piece_stride});
      page_at += uint64_t{rows - 1} * page_stride + bytes;
      piece_at += uint64_t{rows - 1} * piece_stride + bytes;
    }
  }
  const ChunkSource source{0, 0, 0, 0};
  const auto n = static_cast<uint32_t>(items.size());
  const std::vector<std::byte> pages = random_bytes(rng, page_at);
  const std::vector<std::byte> staging = random_bytes(rng, piece_at);
  for (const bool scatter : {true, false}) {
    std::vector<std::byte> twin_pages = pages, twin_staging = staging;
    swiftkv::copy_items_cpu(items.data(), n, &source, 0, 0, twin_staging.data(), twin_pages.data(),
                            scatter);
    // The twin moved something: the side written differs from where it started.
    assert_true(scatter ? twin_pages != pages : twin_staging != staging);
    for (const bool ahead : {false, true}) {
      std::vector<std::byte> emu_pages = pages, emu_staging = staging;
      kernel_emulation::run_copy_items(kEmuGrid, items.data(), n, &source, 0,
                                       reinterpret_cast<unsigned char *>(emu_staging.data()),
                                       reinterpret_cast<unsigned char *>(emu_pages.data()), scatter,
                                       ahead, {static_cast<uint64_t>(rng())});
      assert_true(emu_pages == twin_pages);
      assert_true(emu_staging == twin_staging);
    }
  }
}
#endif

// The decoder's division by a layer's row and channel counts (codec::Divisor) is exact for every
// 32-bit dividend: each divisor up to 2^12, and the powers of two, their neighbours and the
// largest divisors, at the dividends where a quotient steps (k d - 1, k d) near 0, near 2^31 and
// near 2^32, and at random ones (quotient_31 those under 2^31, by divisors up to 2^31). A magic
// number one off, or a shift one short, fails here.
void a_divisor_divides_every_32_bit_dividend_exactly(void **) {
  using swiftkv::codec::Divisor;
  std::vector<uint32_t> divisors;
  for (uint32_t d = 1; d <= 4096; ++d) divisors.push_back(d);
  for (uint32_t b = 12; b < 32; ++b) {
    for (const uint32_t delta : {0u, 1u, 2u}) divisors.push_back((uint32_t{1} << b) - 1 + delta);
  }
  for (const uint32_t d : {0x7fffffffu, 0xfffffffdu, 0xfffffffeu, UINT32_MAX, 3u * 1000003u}) {
    divisors.push_back(d);
  }
  std::mt19937_64 rng(46);
  uint64_t checked = 0;
  for (const uint32_t d : divisors) {
    const Divisor v = swiftkv::codec::divisor_of(d);
    assert_int_equal(v.d, d);
    const auto check = [&](uint64_t n) {
      if (n > UINT32_MAX) return;
      const auto n32 = static_cast<uint32_t>(n);
      if (swiftkv::codec::quotient(n32, v) != n32 / d) {
        fail_msg("%u / %u: %u, not %u", n32, d, swiftkv::codec::quotient(n32, v), n32 / d);
      }
      // The 32-bit form, for the dividends under 2^31 and divisors up to 2^31 it is for.
      if (n32 < (uint32_t{1} << 31) && d <= (uint32_t{1} << 31) &&
          swiftkv::codec::quotient_31(n32, v) != n32 / d) {
        fail_msg("%u / %u in 32 bits: %u", n32, d, swiftkv::codec::quotient_31(n32, v));
      }
      ++checked;
    };
    for (const uint64_t around : {uint64_t{0}, uint64_t{1} << 31, uint64_t{UINT32_MAX}}) {
      const uint64_t k0 = around / d;
      for (uint64_t k = k0 > 3 ? k0 - 3 : 0; k <= k0 + 3; ++k) {
        check(k * d);
        if (k > 0) check(k * d - 1);
      }
    }
    check(UINT32_MAX);
    for (int r = 0; r < 64; ++r) check(rng() & UINT32_MAX);
  }
  assert_true(checked > divisors.size() * 80);  // the dividends above, where they fit
  // A shape's divisors, made by its constructor; a row past 32 bits has none (the host divides
  // such a layer in 64 bits, and no device decodes it).
  const swiftkv::codec::LayerShape s{256, 12, 80, 1};
  assert_int_equal(s.row.d, 960);
  assert_int_equal(s.channels.d, 80);
  assert_int_equal(swiftkv::codec::quotient(960 * 255 + 959, s.row), 255);
  assert_int_equal(swiftkv::codec::LayerShape(1, 1u << 20, 1u << 12, 0).row.d, 0);
  assert_int_equal(swiftkv::codec::LayerShape{}.channels.d, 0);
}

// Where the decode kernel reads a group's words in single loads: kivi codes of whole 16-byte
// multiples (then its pairs start aligned too) and fp8, at head dims of 8's multiples.
void words_are_read_whole_where_the_layout_aligns_them(void **) {
  using swiftkv::codec::layer_words_aligned;
  using swiftkv::codec::LayerShape;
  const auto kivi = [](uint32_t bits, uint32_t group_log2) {
    return swiftkv::codec::kLayerKivi | (bits << 8) | (group_log2 << 16);
  };
  // 256 tokens x 8 heads x 128: 2^18 elements, codes 2^16 bytes at 2 bits.
  assert_true(layer_words_aligned(LayerShape{256, 8, 128, 1}, kivi(2, 5)));
  assert_true(layer_words_aligned(LayerShape{256, 8, 128, 0}, swiftkv::codec::kLayerFp8));
  // 2 tokens x 1 head x 8: 16 elements, codes of 4, 8 and 16 bytes.
  assert_false(layer_words_aligned(LayerShape{2, 1, 8, 0}, kivi(2, 4)));
  assert_false(layer_words_aligned(LayerShape{2, 1, 8, 0}, kivi(4, 4)));
  assert_true(layer_words_aligned(LayerShape{2, 1, 8, 0}, kivi(8, 4)));
  // fp8 records of 4 + 3 * 8 bytes: every word still at a multiple of 4.
  assert_true(layer_words_aligned(LayerShape{5, 3, 8, 0}, swiftkv::codec::kLayerFp8));
  // Head dims that are not 8's multiples decode element by element; raw is not decoded.
  assert_false(layer_words_aligned(LayerShape{256, 8, 12, 0}, swiftkv::codec::kLayerFp8));
  assert_false(layer_words_aligned(LayerShape{256, 8, 128, 0}, 0));
}

// SWIFTKV_COPY_KERNEL names the launch; anything else is refused with EINVAL, naming the value.
void the_copy_kernel_is_chosen_by_name(void **) {
  using swiftkv::CopyKernel;
  assert_int_equal(unsetenv("SWIFTKV_COPY_KERNEL"), 0);
  assert_true(swiftkv::copy_kernel_choice() == CopyKernel::spread);
  const std::pair<const char *, CopyKernel> named[] = {
      {"", CopyKernel::spread}, {"spread", CopyKernel::spread}, {"ahead", CopyKernel::ahead}};
  for (const auto &[value, kernel] : named) {
    assert_int_equal(setenv("SWIFTKV_COPY_KERNEL", value, 1), 0);
    assert_true(swiftkv::copy_kernel_choice() == kernel);
  }
  for (const char *bad : {"Ahead", "fast", "ahead "}) {
    assert_int_equal(setenv("SWIFTKV_COPY_KERNEL", bad, 1), 0);
    try {
      (void)swiftkv::copy_kernel_choice();
      fail_msg("SWIFTKV_COPY_KERNEL=%s was taken", bad);
    } catch (const swiftkv::Error &e) {
      assert_int_equal(e.status(), SWIFTKV_EINVAL);
      assert_non_null(std::strstr(e.what(), bad));
    }
  }
  assert_int_equal(unsetenv("SWIFTKV_COPY_KERNEL"), 0);
}

}  // namespace

int main() {
#if defined(SWIFTKV_TEST_EMULATION)
  assert_int_equal(kernel_emulation::copy_item_size(), sizeof(CopyItem));
  assert_int_equal(kernel_emulation::chunk_source_size(), sizeof(ChunkSource));
#endif
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(every_layout_moves_the_plans_bytes),
    cmocka_unit_test(plans_are_the_row_by_row_plan),
    cmocka_unit_test(a_long_segment_is_cut_at_item_size),
    cmocka_unit_test(evenly_spaced_segments_become_rows),
    cmocka_unit_test(hnd_pages_give_whole_items),
    cmocka_unit_test(encoded_chunks_decode_into_the_plans_pages),
    cmocka_unit_test(the_copy_kernel_is_chosen_by_name),
    cmocka_unit_test(only_layers_of_32_bit_positions_decode_on_a_device),
    cmocka_unit_test(words_are_read_whole_where_the_layout_aligns_them),
    cmocka_unit_test(a_divisor_divides_every_32_bit_dividend_exactly),
#if defined(SWIFTKV_TEST_EMULATION)
    cmocka_unit_test(rows_of_every_length_move_as_the_twin_moves_them),
    cmocka_unit_test(a_layer_at_the_device_limit_decodes_as_on_the_host),
#endif
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
