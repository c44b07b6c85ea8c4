// Requests on a device pool, through the CUDA executor's own source (core/transfer/
// cuda_transfer.cu) built against an emulated runtime (tests/emu/runtime) in which each stream is
// a thread and every piece of a stream's work first sleeps a random moment: the work of
// different streams runs in whatever order the library's event waits allow, and the kernels run
// in their CPU emulation. A fake engine computes on its own stream (work enqueued there, as an
// engine's kernels are), reading every loaded element after wait_layer_load and writing the rest;
// then the saved chunks are compared byte for byte. So the order rules that only a GPU run
// exercised (the load and save streams' waits, the staging buffers' reuse two layers on, stream
// pages shared by every layer, the host's wait for a layer read from lent memory) fail here when
// one is missing. Beside the order, the cases cover lent device memory (read in place, leases
// lost or asked back mid-request, a second device with and without peer access), disk chunks, and
// a runtime that refuses or fails copies. The devices' memory is host memory; a lender's memory
// of a device is an elastic region of this process whose leases name that device. Under ASan the
// host touching device memory outside device work stops the test (use-after-poison), as it
// faults on a device (swiftkv_emu_rt::guarded).
#include <cuda_runtime_api.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "core/common/error.hpp"
#include "core/connector/request.hpp"
#include "core/context/context.hpp"
#include "core/elastic/elastic_region.hpp"
#include "core/geometry/model_geometry.hpp"
#include "core/index/chunk_key.hpp"
#include "core/memory/host_region.hpp"
#include "core/pool/kv_pool.hpp"
#include "core/pool/page_layout.hpp"
#include "core/tiers/chunk_cache.hpp"
#include "core/tiers/disk_tier.hpp"
#include "core/tiers/lender_link.hpp"
#include "flip_byte.hpp"

#include <csetjmp>
#include <cstdarg>

// cmocka last: it defines a `fail` macro that the core's headers must not see.
extern "C" {
#include <cmocka.h>
}

namespace {

using swiftkv::ChunkKey;

constexpr uint32_t kLayers = 6, kHeads = 2, kDim = 64, kBlock = 4, kChunk = 8, kPages = 48;

// host: NHD pages in host memory, a pool the library's CPU copy engine serves.
enum class Layout { nhd, hnd, stream, host };

// The value the engine computes for one element of a sequence: an f16 in [0.5, 1), finite as a
// codec's input must be.
uint16_t value(uint32_t seq, uint32_t layer, uint64_t token, uint32_t c, uint32_t head,
               uint32_t dim) {
  uint64_t x = seq * 1000003u + layer * 7919u + token * 131u + c * 17u + head * 5u + dim;
  x *= 0x9E3779B97F4A7C15ull;
  return static_cast<uint16_t>(0x3800u + (x >> 54));
}

// Element (layer, c, token t of the chunk, head, dim) of a chunk's bytes, (L, 2, CHUNK, H, D).
size_t chunk_index(uint32_t layer, uint32_t c, uint64_t t, uint32_t head, uint32_t dim) {
  return (((layer * 2 + c) * kChunk + t) * kHeads + head) * kDim + dim;
}

// An elastic region of this process whose lent memory reads as a device's: every lease granted
// is memory of `device` (host memory in the emulation), as a lender's VMM memory on the pool's
// device or another one.
class DeviceLender final : public swiftkv::LenderLink {
 public:
  DeviceLender(std::shared_ptr<swiftkv::ElasticRegion> r, int32_t device)
      : inner_(swiftkv::local_lender(std::move(r))), device_(device) {}
  void check_geometry(const swiftkv::GeometrySizes &sizes) const override {
    inner_->check_geometry(sizes);
  }
  swiftkv::LeaseGrant lend(uint64_t max_units) override {
    swiftkv::LeaseGrant g = inner_->lend(max_units);
    g.device = device_;
    return g;
  }
  swiftkv::LinkLeaseState renew(uint64_t id) override { return inner_->renew(id); }
  std::vector<swiftkv::LinkLeaseState> renew_many(std::span<const uint64_t> ids) override {
    return inner_->renew_many(ids);
  }
  uint64_t clock_now() const override { return inner_->clock_now(); }
  const void *identity() const noexcept override { return inner_->identity(); }
  void watch_reclaims(std::function<void()> wake) override { inner_->watch_reclaims(wake); }
  bool valid(uint64_t id) const noexcept override { return inner_->valid(id); }
  void release(uint64_t id) noexcept override { inner_->release(id); }
  std::string describe() const override { return "an emulated device's elastic region"; }

 private:
  std::shared_ptr<swiftkv::LenderLink> inner_;
  const int32_t device_;
};

struct Rig {
  swiftkv::ModelGeometry g;
  swiftkv::GeometrySizes sizes;
  ChunkKey fp;
  std::unique_ptr<swiftkv::Context> ctx;
  std::unique_ptr<swiftkv::ChunkCache> cache;
  swiftkv::CpuExecutor exec{2};
  std::unique_ptr<swiftkv::KvPool> host_pool;  // the memory of a stream-page pool
  std::vector<void *> mem;                     // the memory of the others, a block per layer
  std::shared_ptr<const swiftkv::KvPool> pool;
  cudaStream_t engine = nullptr;
  // With lent_chunks: a lender's region lent to this model as memory of device lent_device, on a
  // clock the test moves.
  std::shared_ptr<std::atomic<uint64_t>> now = std::make_shared<std::atomic<uint64_t>>(1);
  std::shared_ptr<swiftkv::ElasticRegion> lender;

  std::string dir;  // the disk tier's, with disk_chunks; removed with the rig

  explicit Rig(Layout layout, uint64_t lent_chunks = 0, uint64_t disk_chunks = 0,
               int32_t lent_device = 0) {
    g.num_layers = kLayers;
    g.num_kv_heads = kHeads;
    g.head_dim = kDim;
    g.block_tokens = kBlock;
    g.chunk_tokens = kChunk;
    g.device = 0;
    sizes = swiftkv::geometry_sizes(g, "g");
    fp = swiftkv::model_fingerprint("emulated", g);
    swiftkv::ContextConfig c;
    c.host_budget_bytes = 4 << 20;
    if (disk_chunks != 0) {
      char t[] = "/tmp/swiftkv-emulated-XXXXXX";
      assert_non_null(mkdtemp(t));
      dir = t;
      c.disk_path = dir;
      c.disk_budget_bytes = swiftkv::DiskTier::budget_for(disk_chunks, sizes.full_chunk_bytes);
      c.disk_segment_bytes = swiftkv::DiskTier::segment_for(sizes.full_chunk_bytes);
    }
    ctx = std::make_unique<swiftkv::Context>(c);
    swiftkv::CacheOptions o;
    o.demote_free_percent = 0;
    o.maintenance_interval_ms = 0;
    cache = std::make_unique<swiftkv::ChunkCache>(*ctx, o);

    swiftkv::PageLayout l;
    if (layout == Layout::stream) {
      // Regular pages per layer, then stream pages that every layer maps from one memory.
      swiftkv::ModelGeometry h = g;
      h.device = SWIFTKV_DEVICE_HOST;
      host_pool = swiftkv::KvPool::create_host(h, kPages - 16, 16);
      l = host_pool->layout();
    } else {
      l = swiftkv::nhd_layout(g, kPages);
      if (layout == Layout::hnd) {  // [pages, 2, H, B, D]
        l.head_stride = int64_t{kBlock} * kDim;
        l.token_stride = kDim;
      }
      for (uint32_t i = 0; i < kLayers; ++i) {
        mem.push_back(std::aligned_alloc(256, l.layer_span_bytes));
        l.layer_base.push_back(static_cast<std::byte *>(mem.back()));
      }
    }
    l.device = layout == Layout::host ? SWIFTKV_DEVICE_HOST : 0;
    pool = std::make_shared<swiftkv::KvPool>(g, l);
    if (layout != Layout::host) {  // device 0's: only its work touches the pages (guarded())
      for (std::byte *base : l.layer_base) {
        swiftkv_emu_rt::add_device_memory(base, l.layer_span_bytes, 0);
      }
    }
    assert_int_equal(cudaStreamCreateWithPriority(&engine, cudaStreamNonBlocking, 0), cudaSuccess);
    if (lent_chunks != 0) {
      swiftkv::ElasticConfig e;
      e.lender = g;
      e.borrower = g;
      const swiftkv::LendUnit u = swiftkv::lend_unit(sizes, sizes);
      e.capacity_blocks = lent_chunks / u.borrower_chunks * u.lender_blocks;
      e.owned_blocks = 0;
      e.clock = [n = now] { return n->load(); };
      swiftkv::HostRegionOptions ho;
      ho.size = swiftkv::ElasticRegion::required_bytes(e);
      lender = std::make_shared<swiftkv::ElasticRegion>(e, swiftkv::create_host_region(ho));
      swiftkv_emu_rt::add_device_memory(lender->memory().data(), lender->memory().size(),
                                        lent_device);
      cache->borrow(fp, sizes, std::make_shared<DeviceLender>(lender, lent_device), UINT64_MAX);
    }
  }
  ~Rig() {
    if (lender) swiftkv_emu_rt::remove_device_memory(lender->memory().data());
    cudaStreamDestroy(engine);
    for (std::byte *base : layout().layer_base) swiftkv_emu_rt::remove_device_memory(base);
    pool.reset();
    cache.reset();
    ctx.reset();
    for (void *p : mem) std::free(p);
    if (!dir.empty()) std::filesystem::remove_all(dir);
  }

  // The lender writes `byte` over all of its memory with its device (it is memory of a device:
  // the host never touches it), and what of it differs from `byte`.
  void lender_writes(unsigned char byte) const {
    swiftkv_emu_rt::as_device(
        [&] { std::memset(lender->memory().data(), byte, lender->memory().size()); });
  }
  uint64_t lender_bytes_not(unsigned char byte) const {
    uint64_t n = 0;
    swiftkv_emu_rt::as_device([&] {
      const auto *m = reinterpret_cast<const unsigned char *>(lender->memory().data());
      for (uint64_t i = 0; i < lender->memory().size(); ++i) n += m[i] != byte;
    });
    return n;
  }
  const swiftkv::PageLayout &layout() const { return pool->layout(); }
  uint16_t *element(uint32_t layer, int32_t page, uint32_t c, uint32_t t, uint32_t h) const {
    return reinterpret_cast<uint16_t *>(layout().layer_base[layer] +
                                        layout().offset(static_cast<uint32_t>(page), c, t, h));
  }
  // The engine writes (or checks, counting what differs) layer `layer` of tokens [from, to):
  // value(), or where `ref` is given, the chunks' bytes there (chunk after chunk).
  uint64_t engine_pass(bool write, const std::vector<int32_t> &pages, uint32_t seq, uint32_t layer,
                       uint64_t from, uint64_t to,
                       const std::vector<uint16_t> *ref = nullptr) const {
    uint64_t wrong = 0;
    for (uint64_t t = from; t < to; ++t) {
      for (uint32_t c = 0; c < 2; ++c) {
        for (uint32_t h = 0; h < kHeads; ++h) {
          uint16_t *e = element(layer, pages[t / kBlock], c, static_cast<uint32_t>(t % kBlock), h);
          for (uint32_t d = 0; d < kDim; ++d) {
            const uint16_t v = ref != nullptr ? (*ref)[t / kChunk * (sizes.full_chunk_bytes / 2) +
                                                       chunk_index(layer, c, t % kChunk, h, d)]
                                              : value(seq, layer, t, c, h, d);
            if (write) {
              e[d] = v;
            } else {
              wrong += e[d] != v;
            }
          }
        }
      }
    }
    return wrong;
  }
  // The pages' previous user, on the engine's stream: a request's loads must come after it.
  void scramble() const {
    const Rig *rig = this;
    swiftkv_emu_rt::enqueue(engine, [rig] {
      const swiftkv::PageLayout &l = rig->layout();
      for (uint32_t layer = 0; layer < kLayers; ++layer) {
        std::memset(l.layer_base[layer], 0xEE, l.layer_span_bytes);
      }
    });
  }
  std::vector<ChunkKey> keys(const std::vector<uint32_t> &tokens) const {
    std::vector<ChunkKey> k(tokens.size() / kChunk);
    swiftkv::chunk_keys(k.data(), fp, tokens.data(), tokens.size(), kChunk);
    return k;
  }
  // The model's compression settings: its chunk shape, lossy chunks accepted, no fixed codec.
  static swiftkv::ModelCompression lossy_compression() {
    swiftkv::ModelCompression m;
    m.shape = swiftkv::codec::ChunkShape{kLayers, kChunk, kHeads, kDim, SWIFTKV_DTYPE_F16};
    m.accept_lossy = true;
    return m;
  }
  // Stores the chunk of `key` encoded: kivi of `bits` in groups of `group`, or fp8 where bits is
  // 0. The model accepts lossy chunks from the first call on.
  void encode(const ChunkKey &key, uint32_t bits, uint32_t group = 0) {
    namespace cd = swiftkv::codec;
    cache->set_compression(fp, lossy_compression());
    cd::CodecParams p;
    p.codec = bits == 0 ? cd::Codec::fp8 : cd::Codec::kivi;
    p.bits = bits;
    p.group = group;
    assert_int_equal(cache->compress(fp, {&key, 1}, p), 1);
  }
  // The chunks of `k` as the cache gives them back (decoded), one after another.
  std::vector<uint16_t> cached(const std::vector<ChunkKey> &k) const {
    std::vector<uint16_t> out(k.size() * sizes.full_chunk_bytes / 2);
    assert_int_equal(
        cache->retrieve(k, 0, sizes.full_chunk_bytes, reinterpret_cast<std::byte *>(out.data())),
        k.size());
    return out;
  }
  // A request of the model over `tokens` in `pages`, loading and saving.
  swiftkv::RequestSpec spec(const std::vector<uint32_t> &tokens,
                            const std::vector<int32_t> &pages) const {
    swiftkv::RequestSpec s;
    s.model = fp;
    s.keys = keys(tokens);
    s.pages = pages;
    s.n_tokens = tokens.size();
    return s;
  }
  // Chunk i of seq as the cache holds it, element by element against value(): what differs.
  uint64_t chunk_wrong(const std::vector<uint32_t> &tokens, uint32_t seq, size_t i) const {
    std::vector<uint16_t> got(sizes.full_chunk_bytes / 2);
    std::vector<ChunkKey> k = keys(tokens);
    k.resize(i + 1);  // retrieve reads from chunk i to the end of the keys
    if (cache->retrieve(k, i, sizes.full_chunk_bytes, reinterpret_cast<std::byte *>(got.data())) !=
        1) {
      return got.size();
    }
    uint64_t wrong = 0;
    for (uint32_t l = 0; l < kLayers; ++l)
      for (uint32_t c = 0; c < 2; ++c)
        for (uint32_t t = 0; t < kChunk; ++t)
          for (uint32_t h = 0; h < kHeads; ++h)
            for (uint32_t d = 0; d < kDim; ++d) {
              wrong += got[chunk_index(l, c, t, h, d)] != value(seq, l, i * kChunk + t, c, h, d);
            }
    return wrong;
  }
};

std::vector<uint32_t> tokens_of(uint32_t seq, size_t n) {
  std::vector<uint32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = seq * 100000u + static_cast<uint32_t>(i);
  return t;
}

// `n` distinct pages of [first, first + span) in a scrambled order.
std::vector<int32_t> pick_pages(size_t n, uint32_t first, uint32_t span, uint32_t seed) {
  std::vector<int32_t> all(span);
  for (uint32_t i = 0; i < span; ++i) all[i] = static_cast<int32_t>(first + i);
  for (uint32_t i = span - 1; i > 0; --i) {
    seed = seed * 1103515245u + 12345u;
    std::swap(all[i], all[(seed >> 8) % (i + 1)]);
  }
  all.resize(n);
  return all;
}

struct Turn {
  uint64_t wrong_loaded = 0;  // loaded elements the engine read wrong, every layer
  std::vector<uint64_t> valid_end;
  uint64_t saved = 0;
  uint64_t wrong_saved = 0;  // elements of the saved chunks that differ, read at wait_save
  swiftkv::RequestInfo info;
};

// One engine step over tokens[0, n) in `pages`: loads what is cached, the engine reading each
// loaded layer and computing the rest on its stream, then saves. Only the engine's stream work
// touches the pages, and only the library's waits order it against the library's streams.
// Loaded elements are checked against value(), or against `ref` (the cached chunks' bytes as
// retrieve gives them) where given. `after_wait(l)` runs on the host once wait_layer_load(l)
// has returned.
Turn run_turn(Rig &r, const std::vector<uint32_t> &tokens, const std::vector<int32_t> &pages,
              uint32_t seq, const std::vector<uint16_t> *ref = nullptr,
              const std::function<void(uint32_t)> &after_wait = {}) {
  Turn turn;
  auto wrong = std::make_shared<std::atomic<uint64_t>>(0);
  // A host pool's engine works on the host: its stream's work is done before each call.
  const bool host = r.layout().device == SWIFTKV_DEVICE_HOST;
  auto engine_done = [&] {
    if (host) assert_int_equal(cudaStreamSynchronize(r.engine), cudaSuccess);
  };
  {
    swiftkv::Request req(*r.cache, r.exec, r.pool, r.spec(tokens, pages));
    engine_done();
    req.start_load(r.engine);
    const uint64_t n = tokens.size();
    for (uint32_t l = 0; l < kLayers; ++l) {
      const uint64_t v = req.wait_layer_load(l, r.engine);
      turn.valid_end.push_back(v);
      if (after_wait) after_wait(l);
      const Rig *rig = &r;
      swiftkv_emu_rt::enqueue(r.engine, [=] {
        wrong->fetch_add(rig->engine_pass(false, pages, seq, l, 0, v, ref));
        rig->engine_pass(true, pages, seq, l, v, n);
      });
      engine_done();
      req.save_layer(l, r.engine);
    }
    turn.saved = req.wait_save(r.engine);
    turn.info = req.info();
    // Saved chunks are whole once wait_save returns, while the request still holds its lane.
    for (uint64_t i = turn.info.load_end / kChunk; i < n / kChunk; ++i) {
      turn.wrong_saved += r.chunk_wrong(tokens, seq, i);
    }
  }
  assert_int_equal(cudaStreamSynchronize(r.engine), cudaSuccess);
  turn.wrong_loaded = wrong->load();
  return turn;
}

// Two turns of one conversation: the first saves 4 chunks from the pages the engine wrote, the
// second loads them into other pages and saves 2 more; every loaded and saved byte checked,
// under several orders of the streams' work. With a `lent` device the chunks go to lent memory
// of that device. The kernels read and write the memory of the pool's device, or of a peer with
// peer access, in place: the saves gather straight into the lender's memory (no staging), and
// the loads' wait is on the host (sync_load), after which the request checks the lease. Memory of
// a device out of reach goes through staging on the pool's device, copied by the copy streams.
// A host pool reaches lent device memory through host memory (the loads copy each piece out to
// a bounce buffer, the saves stage the chunk and publish copies it in).
void round_trip(Layout layout, std::optional<int32_t> lent = std::nullopt) {
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    swiftkv_emu_rt::set_jitter(300, seed);
    Rig r(layout, lent ? 8 : 0, 0, lent.value_or(0));
    const bool stream = layout == Layout::stream;
    const uint32_t first = stream ? r.layout().stream_first : 0;
    const uint32_t span = stream ? r.layout().stream_pages : kPages;
    const std::vector<uint32_t> tokens = tokens_of(1, 6 * kChunk + 1);
    const std::vector<uint32_t> four(tokens.begin(), tokens.begin() + 4 * kChunk + 3);
    const std::vector<ChunkKey> k = r.keys(tokens);
    const swiftkv::Tier tier = lent ? swiftkv::Tier::peer : swiftkv::Tier::host;
    r.scramble();
    Turn t1 = run_turn(r, four, pick_pages(9, first, span, 1 + seed), 1);
    assert_int_equal(t1.saved, 4 * kChunk);
    assert_int_equal(t1.wrong_saved, 0);
    assert_int_equal(t1.info.stream_ordered, stream);
    for (size_t i = 0; i < 4; ++i) {
      assert_true(r.cache->tier_of(k[i]) == tier);
      assert_int_equal(r.chunk_wrong(four, 1, i), 0);
    }

    r.scramble();
    Turn t2 = run_turn(r, tokens, pick_pages(13, first, span, 7 + seed), 1);
    assert_int_equal(t2.info.load_end, 4 * kChunk);
    for (uint64_t v : t2.valid_end) assert_int_equal(v, 4 * kChunk);
    assert_int_equal(t2.wrong_loaded, 0);
    assert_int_equal(t2.saved, 2 * kChunk);
    assert_int_equal(t2.wrong_saved, 0);
    for (size_t i = 0; i < 6; ++i) {
      assert_true(r.cache->tier_of(k[i]) == tier);
      assert_int_equal(r.chunk_wrong(tokens, 1, i), 0);
    }
  }
  swiftkv_emu_rt::set_jitter(0, 1);
}

// Chunks stored encoded cross to the device as stored and are decoded there, after the
// layer's scatter on the same stream: a load of a raw, a kivi-4, an fp8 and a kivi-8 chunk into
// NHD pages gives what the CPU decodes, bit for bit (retrieve's bytes), in every order of the
// streams' work. From the disk tier, the chunks are read on the host into the request's staging
// (checked as they are read) and cross from there; with one byte of the fp8 chunk's record
// flipped on disk after it was written, its read fails the check and the load stops before it
// (every layer's prefix the two chunks ahead of it, loaded right), the chunk gone.
enum class From { host, disk, corrupt_disk };

void load_encoded(From from) {
  const bool disk = from != From::host, corrupt = from == From::corrupt_disk;
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    swiftkv_emu_rt::set_jitter(300, seed);
    Rig r(Layout::nhd, 0, disk ? 16 : 0);
    const std::vector<uint32_t> tokens = tokens_of(2, 6 * kChunk + 1);
    const std::vector<uint32_t> four(tokens.begin(), tokens.begin() + 4 * kChunk);
    r.scramble();
    assert_int_equal(run_turn(r, four, pick_pages(8, 0, kPages, seed), 2).wrong_saved, 0);
    const std::vector<ChunkKey> k = r.keys(four);
    r.encode(k[1], 4, 32);
    r.encode(k[2], 0);
    r.encode(k[3], 8, 64);
    assert_int_equal(r.chunk_wrong(four, 2, 0), 0);  // raw
    assert_true(r.chunk_wrong(four, 2, 1) > 0);      // lossy
    if (disk) {
      assert_int_equal(r.cache->move(k, swiftkv::Tier::disk), 4);
      for (const ChunkKey &key : k) assert_true(r.cache->tier_of(key) == swiftkv::Tier::disk);
    }
    const std::vector<uint16_t> decoded = r.cached(k);
    if (corrupt) {
      const std::optional<swiftkv::ChunkUse> use = r.cache->begin_read(k[2]);
      assert_true(use.has_value());
      r.cache->end_read(k[2]);
      const swiftkv::DiskTier::Location loc = r.cache->disk()->location_of(use->where.slot);
      assert_false(loc.path.empty());
      flip_byte(loc.path, loc.offset + swiftkv::DiskTier::kHeaderBytes + use->meta.stored() / 2);
    }
    const uint64_t failures = r.cache->stats().load_failures;
    r.scramble();
    Turn t = run_turn(r, tokens, pick_pages(13, 0, kPages, 9 + seed), 2, &decoded);
    assert_int_equal(t.info.load_end, 4 * kChunk);
    for (uint64_t v : t.valid_end) assert_int_equal(v, corrupt ? 2 * kChunk : 4 * kChunk);
    assert_int_equal(t.wrong_loaded, 0);
    assert_int_equal(t.wrong_saved, 0);
    assert_int_equal(r.cache->stats().load_failures - failures, corrupt ? 1 : 0);
    if (!corrupt) assert_int_equal(t.saved, 2 * kChunk);
    if (corrupt) assert_false(r.cache->resident(k[2]));
  }
  swiftkv_emu_rt::set_jitter(0, 1);
}

void encoded_chunks_decode_on_the_device(void **) { load_encoded(From::host); }
void disk_chunks_load_into_device_pages(void **) { load_encoded(From::disk); }
void corrupt_disk_chunk_ends_the_prefix(void **) { load_encoded(From::corrupt_disk); }

// The lender's lease runs out while a request loads from it, and the lender writes over the
// memory at once, as it may. Each layer's loaded prefix (valid_end) must hold what was cached:
// the layers whose wait returned before the expiry loaded whole (the host waited for their
// copies, then found the lease held), every later one loads nothing. The copies of later layers,
// queued ahead, may read the lender's new bytes: those layers' prefixes are empty. Under TSan
// the lender's writes are left out: they race with those reads by design.
void lent_lease_lost_during_a_load(void **) {
#if defined(__SANITIZE_THREAD__)
  constexpr bool scribble = false;
#else
  constexpr bool scribble = true;
#endif
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    swiftkv_emu_rt::set_jitter(300, seed);
    Rig r(Layout::nhd, 8);
    const std::vector<uint32_t> tokens = tokens_of(5, 4 * kChunk + 3);
    r.scramble();
    assert_int_equal(run_turn(r, tokens, pick_pages(9, 0, kPages, seed), 5).saved, 4 * kChunk);
    const std::vector<ChunkKey> k = r.keys(tokens);
    for (size_t i = 0; i < 4; ++i) assert_true(r.cache->tier_of(k[i]) == swiftkv::Tier::peer);
    const uint32_t lost_after = static_cast<uint32_t>(seed % (kLayers - 1));
    r.scramble();
    Turn t = run_turn(r, tokens, pick_pages(9, 0, kPages, 5 + seed), 5, nullptr, [&](uint32_t l) {
      if (l != lost_after) return;
      r.now->fetch_add(r.lender->lease_ns() + 1);  // every lease expired
      if (scribble) r.lender_writes(0xEE);
    });
    assert_int_equal(t.info.load_end, 4 * kChunk);
    for (uint32_t l = 0; l < kLayers; ++l) {
      assert_int_equal(t.valid_end[l], l <= lost_after ? 4 * kChunk : 0);
    }
    assert_int_equal(t.wrong_loaded, 0);
    assert_int_equal(t.info.valid_end, 0);
    // The next maintenance pass drops the lost lease's chunks.
    r.cache->maintain();
    for (size_t i = 0; i < 4; ++i) assert_false(r.cache->resident(k[i]));
    assert_int_equal(r.cache->stats().revocations, 4);
  }
  swiftkv_emu_rt::set_jitter(0, 1);
}

// Chunks saved into lent device memory leave it through the host's copies of device memory
// (copy_bytes): one to host memory, one to disk as it is (through host memory), two to disk
// re-encoded on the way (kivi-4, the disk tier's codec from then on: read out of lent memory,
// encoded on the host). Each reads back as the cache now holds it (the raw ones as saved), and the
// next turn loads all four from where they are into device pages, each element as retrieve gives
// it, saving two more.
void lent_chunks_leave_through_host_copies(void **) {
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    swiftkv_emu_rt::set_jitter(300, seed);
    Rig r(Layout::nhd, 8, 16);
    const std::vector<uint32_t> tokens = tokens_of(8, 6 * kChunk + 1);
    const std::vector<uint32_t> four(tokens.begin(), tokens.begin() + 4 * kChunk + 3);
    const std::vector<ChunkKey> k = r.keys(four);
    r.scramble();
    assert_int_equal(run_turn(r, four, pick_pages(9, 0, kPages, seed), 8).saved, 4 * kChunk);
    for (const ChunkKey &key : k) assert_true(r.cache->tier_of(key) == swiftkv::Tier::peer);
    const std::span<const ChunkKey> ks(k);
    assert_int_equal(r.cache->move(ks.subspan(0, 1), swiftkv::Tier::host), 1);
    assert_int_equal(r.cache->move(ks.subspan(1, 1), swiftkv::Tier::disk), 1);
    swiftkv::ModelCompression m = Rig::lossy_compression();
    m.fixed[swiftkv::tier_slot(swiftkv::Tier::disk)] =
        swiftkv::codec::CodecParams{swiftkv::codec::Codec::kivi, 4, 32};
    r.cache->set_compression(r.fp, m);
    assert_int_equal(r.cache->move(ks.subspan(2), swiftkv::Tier::disk), 2);
    assert_true(r.cache->tier_of(k[0]) == swiftkv::Tier::host);
    for (size_t i : {1, 2, 3}) assert_true(r.cache->tier_of(k[i]) == swiftkv::Tier::disk);
    for (size_t i : {0, 1}) assert_int_equal(r.chunk_wrong(four, 8, i), 0);
    for (size_t i : {2, 3}) assert_true(r.chunk_wrong(four, 8, i) > 0);  // lossy now
    const std::vector<uint16_t> ref = r.cached(k);
    r.scramble();
    Turn t = run_turn(r, tokens, pick_pages(13, 0, kPages, 3 + seed), 8, &ref);
    for (uint64_t v : t.valid_end) assert_int_equal(v, 4 * kChunk);
    assert_int_equal(t.wrong_loaded, 0);
    assert_int_equal(t.saved, 2 * kChunk);
    assert_int_equal(t.wrong_saved, 0);
  }
  swiftkv_emu_rt::set_jitter(0, 1);
}

// The lender asks its memory back while a request loads from it and saves into it, the
// borrower's maintenance running all along on another thread, and the lender writes over the
// memory as soon as the lease is given back. The lease may go only once no copy reads or writes
// it: every layer loads whole and right, the new chunks are saved, everything ends up in host
// memory byte for byte, and the lender's bytes are never touched after it got them back. A
// request that only loads holds the lease by its reads alone (the chunks move to host memory
// while it reads them; the old copies stay until it ends); one that the engine drops after
// save_layer(k) without wait_save, as an engine that cancels it does, must still wait for the
// gathers it queued before the reserved slots go.
enum class Asked { finish, load_only, abandon };

void asked_back(Asked how) {
  const bool abandon = how == Asked::abandon;
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    swiftkv_emu_rt::set_jitter(300, seed);
    Rig r(Layout::nhd, 8);
    const std::vector<uint32_t> tokens = tokens_of(6, 6 * kChunk + 1);
    const std::vector<uint32_t> four(tokens.begin(), tokens.begin() + 4 * kChunk + 3);
    r.scramble();
    assert_int_equal(run_turn(r, four, pick_pages(9, 0, kPages, seed), 6).saved, 4 * kChunk);
    const std::vector<uint32_t> &asked = how == Asked::load_only ? four : tokens;
    const uint32_t ask_after = static_cast<uint32_t>(seed % (kLayers - 1));
    std::atomic<bool> given_back{false}, stop{false};
    std::thread lender;
    auto ask = [&](uint32_t l) {
      if (l != ask_after) return;
      r.lender->reclaim(swiftkv::ElasticRegion::kAllLeases);
      lender = std::thread([&] {
        while (!stop.load()) {
          r.cache->maintain();
          if (r.lender->stats().leases == 0) {
            r.lender_writes(0xEE);
            given_back = true;
            return;
          }
          std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
      });
    };
    const std::vector<int32_t> pages = pick_pages(13, 0, kPages, 17 + seed);
    if (abandon) {
      {
        swiftkv::Request req(*r.cache, r.exec, r.pool, r.spec(asked, pages));
        req.start_load(r.engine);
        for (uint32_t l = 0; l <= ask_after; ++l) {
          assert_int_equal(req.wait_layer_load(l, r.engine), 4 * kChunk);
          ask(l);
          req.save_layer(l, r.engine);
        }
      }  // dropped with its gathers queued
      assert_int_equal(cudaStreamSynchronize(r.engine), cudaSuccess);
    } else {
      Turn t = run_turn(r, asked, pages, 6, nullptr, ask);
      for (uint64_t v : t.valid_end) assert_int_equal(v, 4 * kChunk);
      assert_int_equal(t.wrong_loaded, 0);
      assert_int_equal(t.saved, how == Asked::finish ? 2 * kChunk : 0);
      assert_int_equal(t.wrong_saved, 0);
    }
    for (int i = 0; i < 100000 && !given_back.load(); ++i) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    stop = true;
    lender.join();
    assert_true(given_back.load());
    // Every cached chunk moved to host memory, whole.
    const std::vector<ChunkKey> k = r.keys(tokens);
    const size_t cached = how == Asked::finish ? 6 : 4;
    for (size_t i = 0; i < cached; ++i) {
      assert_true(r.cache->tier_of(k[i]) == swiftkv::Tier::host);
      assert_int_equal(r.chunk_wrong(tokens, 6, i), 0);
    }
    if (how != Asked::finish) assert_false(r.cache->resident(k[4]));
    assert_int_equal(r.lender_bytes_not(0xEE), 0);
  }
  swiftkv_emu_rt::set_jitter(0, 1);
}

void lent_memory_asked_back_during_a_request(void **) { asked_back(Asked::finish); }
void lent_memory_asked_back_during_a_load(void **) { asked_back(Asked::load_only); }
void lent_memory_asked_back_from_a_dropped_request(void **) { asked_back(Asked::abandon); }

void round_trip_nhd(void **) { round_trip(Layout::nhd); }
void round_trip_hnd(void **) { round_trip(Layout::hnd); }
void round_trip_stream_pages(void **) { round_trip(Layout::stream); }
void lent_device_memory_nhd(void **) { round_trip(Layout::nhd, 0); }
void lent_device_memory_hnd(void **) { round_trip(Layout::hnd, 0); }
void lent_device_memory_stream_pages(void **) { round_trip(Layout::stream, 0); }
void lent_device_memory_host_pool(void **) { round_trip(Layout::host, 0); }
// Two devices: the lender's memory on device 1, the pool on device 0.
void lent_memory_of_a_peer_device(void **) {
  swiftkv_emu_rt::set_devices(2, true);
  round_trip(Layout::nhd, 1);
  swiftkv_emu_rt::set_devices(1, false);
}
void lent_memory_of_a_device_out_of_reach(void **) {
  swiftkv_emu_rt::set_devices(2, false);
  round_trip(Layout::nhd, 1);
  round_trip(Layout::stream, 1);
  swiftkv_emu_rt::set_devices(1, false);
}

// A runtime that refuses 2D copies (a pitch past the device's limit) and a driver without
// batched copies: the copies into and out of staging go row by row, one plain asynchronous copy
// each, with the same bytes and the same order.
void copies_fall_back_when_refused(void **) {
  const int64_t refused = swiftkv_emu_rt::copies_refused();
  swiftkv_emu_rt::refuse_copies(true, true);
  round_trip(Layout::nhd);
  round_trip(Layout::stream);
  swiftkv_emu_rt::refuse_copies(false, false);
  assert_true(swiftkv_emu_rt::copies_refused() > refused);
}

// A runtime call that fails in the middle of a request (the k-th copy it asks for, for every k
// up to its last): the call that made it fails with ECUDA, and once the engine drops the request
// the pool serves the next one whole, as the lane that carried the failure is drained and reused.
// Every piece goes as a plain copy here (2D and batched copies refused), so the failure falls on
// the copy tables' upload, on loads and on saves in turn.
void a_failed_copy_fails_only_its_request(void **) {
  swiftkv_emu_rt::refuse_copies(true, true);
  bool past_the_last = false;
  for (int64_t k = 1; !past_the_last; ++k) {
    assert_true(k < 200);
    swiftkv_emu_rt::set_jitter(100, static_cast<uint64_t>(k));
    Rig r(Layout::nhd);
    const std::vector<uint32_t> tokens = tokens_of(8, 6 * kChunk + 1);
    const std::vector<uint32_t> four(tokens.begin(), tokens.begin() + 4 * kChunk + 3);
    r.scramble();
    assert_int_equal(run_turn(r, four, pick_pages(9, 0, kPages, 1), 8).saved, 4 * kChunk);
    const std::vector<int32_t> pages = pick_pages(13, 0, kPages, 2);
    swiftkv_emu_rt::fail_copy(k);
    bool failed = false;
    try {
      run_turn(r, tokens, pages, 8);
    } catch (const swiftkv::Error &e) {
      assert_int_equal(e.status(), SWIFTKV_ECUDA);
      failed = true;
    }
    assert_int_equal(cudaStreamSynchronize(r.engine), cudaSuccess);
    const bool pending = swiftkv_emu_rt::fail_copy(0);
    assert_true(failed != pending);  // it failed exactly when the failing copy was reached
    past_the_last = !failed;
    // The next request on the pool loads the cached chunks whole (the failed request saved
    // none) and saves the rest.
    const uint64_t cached = (failed ? 4 : 6) * kChunk;
    r.scramble();
    Turn t = run_turn(r, tokens, pick_pages(13, 0, kPages, 3), 8);
    assert_int_equal(t.info.load_end, cached);
    for (uint64_t v : t.valid_end) assert_int_equal(v, cached);
    assert_int_equal(t.wrong_loaded, 0);
    assert_int_equal(t.saved, 6 * kChunk - cached);
    assert_int_equal(t.wrong_saved, 0);
  }
  swiftkv_emu_rt::refuse_copies(false, false);
  swiftkv_emu_rt::set_jitter(0, 1);
}

// What the library took of the runtime it gives back (a lane's streams and events are kept by
// the pool for the next request, and go with it).
void pools_give_back_their_streams(void **) {
  const int64_t streams = swiftkv_emu_rt::streams_alive();
  const int64_t events = swiftkv_emu_rt::events_alive();
  {
    Rig r(Layout::nhd);
    const std::vector<uint32_t> tokens = tokens_of(3, 2 * kChunk);
    r.scramble();
    run_turn(r, tokens, pick_pages(4, 0, kPages, 3), 3);
    assert_true(swiftkv_emu_rt::streams_alive() > streams + 1);  // the engine's and a lane's
  }
  assert_int_equal(swiftkv_emu_rt::streams_alive(), streams);
  assert_int_equal(swiftkv_emu_rt::events_alive(), events);
}

// What a host thread touching device memory itself does here. Device work (a stream's work, a
// copy, as_device) reads and writes it; where the build guards device memory (ASan), the host
// reading one byte of cudaMalloc's memory, or of memory marked as a device's, outside device work
// stops the process with ASan's use-after-poison, as it faults on a device: every other case of
// this program then fails at the line of the library that did so. Pinned host memory stays the
// host's. The touch runs in a child, which must die saying so.
void host_touching_device_memory_stops(void **) {
  constexpr size_t kBytes = 4096;
  void *device = nullptr, *pinned = nullptr;
  assert_int_equal(cudaMalloc(&device, kBytes), cudaSuccess);
  assert_int_equal(cudaMallocHost(&pinned, kBytes), cudaSuccess);
  std::vector<unsigned char> marked(kBytes, 3);
  swiftkv_emu_rt::add_device_memory(marked.data(), kBytes, 0);
  swiftkv_emu_rt::as_device([&] { std::memset(device, 1, kBytes); });
  cudaStream_t s = nullptr;
  assert_int_equal(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, 0), cudaSuccess);
  swiftkv_emu_rt::enqueue(s, [device] { static_cast<unsigned char *>(device)[100] = 2; });
  assert_int_equal(cudaMemcpyAsync(pinned, device, kBytes, cudaMemcpyDeviceToHost, s), cudaSuccess);
  assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
  assert_int_equal(cudaStreamDestroy(s), cudaSuccess);
  const auto *back = static_cast<const unsigned char *>(pinned);
  assert_int_equal(back[0], 1);
  assert_int_equal(back[100], 2);
  assert_int_equal(cudaMemcpy(pinned, marked.data(), kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
  assert_int_equal(back[kBytes - 1], 3);
  if (swiftkv_emu_rt::guarded()) {
    for (const void *p :
         {static_cast<const void *>(device), static_cast<const void *>(marked.data())}) {
      int out[2];
      assert_int_equal(pipe(out), 0);
      std::fflush(nullptr);
      const pid_t child = fork();
      assert_true(child >= 0);
      if (child == 0) {
        dup2(out[1], 2);
        alarm(60);  // a report that never comes fails the case instead of hanging it
        const unsigned char byte = static_cast<const volatile unsigned char *>(p)[7];
        _exit(byte == 255 ? 2 : 0);
      }
      close(out[1]);
      std::string report;
      char buf[4096];
      for (ssize_t n; (n = read(out[0], buf, sizeof buf)) > 0;) report.append(buf, n);
      close(out[0]);
      int status = 0;
      assert_int_equal(waitpid(child, &status, 0), child);
      assert_false(WIFEXITED(status) && WEXITSTATUS(status) == 0);
      assert_true(report.find("use-after-poison") != std::string::npos);
    }
  }
  swiftkv_emu_rt::remove_device_memory(marked.data());
  marked[0] = 4;  // the host's again
  assert_int_equal(cudaFree(device), cudaSuccess);
  assert_int_equal(cudaFreeHost(pinned), cudaSuccess);
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(round_trip_nhd),
      cmocka_unit_test(round_trip_hnd),
      cmocka_unit_test(round_trip_stream_pages),
      cmocka_unit_test(encoded_chunks_decode_on_the_device),
      cmocka_unit_test(disk_chunks_load_into_device_pages),
      cmocka_unit_test(corrupt_disk_chunk_ends_the_prefix),
      cmocka_unit_test(lent_device_memory_nhd),
      cmocka_unit_test(lent_device_memory_hnd),
      cmocka_unit_test(lent_device_memory_stream_pages),
      cmocka_unit_test(lent_device_memory_host_pool),
      cmocka_unit_test(lent_memory_of_a_peer_device),
      cmocka_unit_test(lent_memory_of_a_device_out_of_reach),
      cmocka_unit_test(lent_lease_lost_during_a_load),
      cmocka_unit_test(lent_chunks_leave_through_host_copies),
      cmocka_unit_test(lent_memory_asked_back_during_a_request),
      cmocka_unit_test(lent_memory_asked_back_during_a_load),
      cmocka_unit_test(lent_memory_asked_back_from_a_dropped_request),
      cmocka_unit_test(copies_fall_back_when_refused),
      cmocka_unit_test(a_failed_copy_fails_only_its_request),
      cmocka_unit_test(pools_give_back_their_streams),
      cmocka_unit_test(host_touching_device_memory_stops),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
