// The borrower's core: chunk keys, the eviction policies, and the chunk cache over real tiers
// (a host elastic region as the peer, pinned host slabs, files on disk), including the lease
// protocol, restart from disk, corruption and concurrent use.
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <csetjmp>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/common/clock.hpp"
#include "core/common/error.hpp"
#include "core/elastic/elastic_region.hpp"
#include "core/index/chunk_key.hpp"
#include "core/memory/host_region.hpp"
#include "core/memory/large_pages.hpp"
#include "core/policy/eviction_order.hpp"
#include "core/policy/eviction_policy.hpp"
#include "core/tiers/chunk_cache.hpp"
#include "core/tiers/host_tier.hpp"
#include "flip_byte.hpp"

// cmocka last: it defines a `fail` macro that the core's headers must not see.
extern "C" {
#include <cmocka.h>
}

using swiftkv::CacheOptions;
using swiftkv::ChunkCache;
using swiftkv::ChunkKey;
using swiftkv::Tier;

namespace {

swiftkv::ModelGeometry geometry(uint32_t heads, uint32_t dim, swiftkv_dtype dtype) {
  swiftkv::ModelGeometry g;
  g.num_layers = 2;
  g.num_kv_heads = heads;
  g.head_dim = dim;
  g.block_tokens = 4;
  g.chunk_tokens = 8;
  g.dtype = dtype;
  return g;
}

std::string temp_dir() {
  char t[] = "/tmp/swiftkv-cache-XXXXXX";
  assert_non_null(mkdtemp(t));
  return t;
}

// Chunk bytes that say which sequence and chunk they belong to, so a chunk in the wrong place or
// a torn copy shows.
std::vector<std::byte> chunk_bytes(uint64_t bytes, uint32_t seq, size_t chunk) {
  std::vector<std::byte> b(bytes);
  uint64_t x = (uint64_t{seq} << 32) ^ (chunk * 0x9E3779B97F4A7C15ull) ^ 0x1234567ull;
  for (auto &v : b) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v = static_cast<std::byte>(x);
  }
  return b;
}

std::vector<uint32_t> tokens_of(uint32_t seq, size_t chunks, uint32_t chunk_tokens) {
  std::vector<uint32_t> t(chunks * chunk_tokens);
  for (size_t i = 0; i < t.size(); ++i) t[i] = seq * 100000u + static_cast<uint32_t>(i);
  return t;
}

// A borrower model, a context and its cache, and optionally a lender to borrow from.
struct Rig {
  swiftkv::ModelGeometry g;
  swiftkv::GeometrySizes sizes;
  ChunkKey fp;
  std::string dir;
  std::unique_ptr<swiftkv::Context> ctx;
  std::unique_ptr<ChunkCache> cache;
  std::shared_ptr<swiftkv::ElasticRegion> lender;
  uint64_t now = 1'000'000'000;

  Rig(swiftkv::ModelGeometry geo, uint64_t host_chunks, uint64_t disk_chunks, uint64_t peer_chunks,
      swiftkv::EvictionPolicy policy = swiftkv::EvictionPolicy::lru, uint32_t demote_pct = 0,
      uint64_t interval_ms = 0, std::string reuse_dir = "",
      std::array<Tier, swiftkv::kTierCount> chain = swiftkv::kDefaultChain,
      uint64_t disk_sync_ns = swiftkv::ContextConfig{}.disk_sync_ns)
      : g(geo), sizes(swiftkv::geometry_sizes(geo, "g")), fp(swiftkv::model_fingerprint("m", geo)) {
    swiftkv::ContextConfig c;
    // Host slabs are whole pages: the budget is in pages, each holding whole chunks here.
    const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    c.host_budget_bytes =
        host_chunks == 0 ? 0 : (host_chunks * sizes.full_chunk_bytes + page - 1) / page * page;
    if (disk_chunks != 0) {
      dir = reuse_dir.empty() ? temp_dir() : reuse_dir;
      c.disk_path = dir;
      // One record per segment: the tier then holds exactly disk_chunks chunks.
      c.disk_budget_bytes = swiftkv::DiskTier::budget_for(disk_chunks, sizes.full_chunk_bytes);
      c.disk_segment_bytes = swiftkv::DiskTier::segment_for(sizes.full_chunk_bytes);
      c.disk_sync_ns = disk_sync_ns;
    }
    ctx = std::make_unique<swiftkv::Context>(c);
    CacheOptions o;
    o.policy = policy;
    o.demote_free_percent = demote_pct;
    o.host_slab_bytes = page;
    o.chain = chain;
    o.maintenance_interval_ms = interval_ms;
    if (interval_ms == 0) o.clock = [this] { return now; };
    cache = std::make_unique<ChunkCache>(*ctx, o);
    if (peer_chunks != 0) {
      swiftkv::ElasticConfig e;
      e.lender = geo;
      e.borrower = geo;
      const swiftkv::LendUnit u = swiftkv::lend_unit(sizes, sizes);
      e.capacity_blocks = peer_chunks / u.borrower_chunks * u.lender_blocks;
      e.owned_blocks = 0;
      swiftkv::HostRegionOptions ho;
      ho.size = swiftkv::ElasticRegion::required_bytes(e);
      lender = std::make_shared<swiftkv::ElasticRegion>(e, swiftkv::create_host_region(ho));
      cache->borrow(fp, sizes, swiftkv::local_lender(lender), UINT64_MAX);
    }
  }
  ~Rig() {
    cache.reset();
    if (!dir.empty() && keep_dir == false) std::filesystem::remove_all(dir);
  }
  bool keep_dir = false;

  std::vector<ChunkKey> keys(uint32_t seq, size_t chunks) const {
    const std::vector<uint32_t> t = tokens_of(seq, chunks, g.chunk_tokens);
    std::vector<ChunkKey> k(chunks);
    swiftkv::chunk_keys(k.data(), fp, t.data(), t.size(), g.chunk_tokens);
    return k;
  }
  // Stores chunks [0, n) of sequence seq; returns the leading chunks cached.
  uint64_t store(uint32_t seq, size_t n) {
    const std::vector<ChunkKey> k = keys(seq, n);
    std::vector<std::byte> all;
    for (size_t i = 0; i < n; ++i) {
      const auto b = chunk_bytes(sizes.full_chunk_bytes, seq, i);
      all.insert(all.end(), b.begin(), b.end());
    }
    return cache->store(fp, k, g.chunk_tokens, sizes.full_chunk_bytes, all.data());
  }
  // Loads chunk i of seq alone (its whole prefix keys) and checks every byte.
  bool intact(uint32_t seq, size_t i) {
    const std::vector<ChunkKey> k = keys(seq, i + 1);
    std::vector<std::byte> out(sizes.full_chunk_bytes);
    if (cache->retrieve(k, i, sizes.full_chunk_bytes, out.data()) != 1) return false;
    return out == chunk_bytes(sizes.full_chunk_bytes, seq, i);
  }
  std::optional<Tier> where(uint32_t seq, size_t i) {
    const std::vector<ChunkKey> k = keys(seq, i + 1);
    uint8_t r[64];
    cache->lookup(k, r);
    return swiftkv::tier_of_code(r[i]);
  }
};

// --- Keys ------------------------------------------------------------------------------------

void keys_chain_over_the_prefix(void **) {
  const auto g = geometry(2, 8, SWIFTKV_DTYPE_F16);
  const ChunkKey fp = swiftkv::model_fingerprint("m", g);
  std::vector<uint32_t> t = tokens_of(1, 3, 8);
  t.push_back(7);  // a partial chunk: never keyed
  ChunkKey a[3], b[3];
  swiftkv::chunk_keys(a, fp, t.data(), t.size(), 8);
  assert_false(a[0] == a[1]);
  // Changing a token of chunk 1 changes chunks 1 and 2, never chunk 0.
  t[9] ^= 1;
  swiftkv::chunk_keys(b, fp, t.data(), t.size(), 8);
  assert_true(a[0] == b[0]);
  assert_false(a[1] == b[1]);
  assert_false(a[2] == b[2]);
  // The same tokens in the second chunk as the first make another key: the chain differs.
  std::vector<uint32_t> same(16, 5);
  ChunkKey s[2];
  swiftkv::chunk_keys(s, fp, same.data(), same.size(), 8);
  assert_false(s[0] == s[1]);
  // The fingerprint is the seed: another model, other keys for the same tokens.
  const ChunkKey fp2 = swiftkv::model_fingerprint("m2", g);
  ChunkKey c[1];
  swiftkv::chunk_keys(c, fp2, same.data(), 8, 8);
  assert_false(c[0] == s[0]);
  assert_int_equal(swiftkv::to_hex(a[0]).size(), 32);
}

void fingerprint_covers_the_kv_shape(void **) {
  const auto g = geometry(2, 8, SWIFTKV_DTYPE_F16);
  const ChunkKey base = swiftkv::model_fingerprint("m", g);
  auto differs = [&](swiftkv::ModelGeometry o) {
    return !(swiftkv::model_fingerprint("m", o) == base);
  };
  auto o = g;
  o.dtype = SWIFTKV_DTYPE_BF16;
  assert_true(differs(o));
  o = g;
  o.num_layers = 3;
  assert_true(differs(o));
  o = g;
  o.chunk_tokens = 16;
  assert_true(differs(o));
  o = g;
  o.head_dim = 9;
  assert_true(differs(o));
  o = g;
  o.device = 3;  // same bytes on another GPU: same chunks
  assert_false(differs(o));
  assert_false(swiftkv::model_fingerprint("n", g) == base);
  // The identity is part of it; none at all is the fingerprint from before identities, which
  // disk tiers already hold: that value is pinned here.
  assert_true(swiftkv::model_fingerprint("m", g, "") == base);
  assert_false(swiftkv::model_fingerprint("m", g, "rev-2") == base);
  assert_false(swiftkv::model_fingerprint("m", g, "rev-2") ==
               swiftkv::model_fingerprint("m", g, "rev-3"));
  // The name and the identity do not run into each other.
  assert_false(swiftkv::model_fingerprint("mr", g, "ev") ==
               swiftkv::model_fingerprint("m", g, "rev"));
  assert_string_equal(swiftkv::to_hex(base).c_str(), "a07d226135cffd48e34be95d1af08aa7");
}

// The open-addressing shards under crowding: keys of one shard whose home slots collide, random
// drops (backward-shift deletion) and growth, checked against a plain map after every step. Each
// key carries its own slot, position, model and pins, which must move with it when its slot moves.
void index_keeps_every_key_through_collisions_drops_and_growth(void **) {
  swiftkv::ChunkIndex index;
  std::mt19937_64 rng(11);
  struct Want {
    uint64_t slot;
    uint32_t position, pins;
    ChunkKey model;
  };
  std::vector<std::pair<ChunkKey, Want>> live;
  std::vector<ChunkKey> gone;
  const ChunkKey models[2] = {{1, 2}, {3, 4}};
  auto key = [&] {
    // All in shard 0x2a, homes in the first and the last slot of the table (a home is hi scaled
    // to the table's size): long probe runs that wrap around.
    const uint64_t near = rng() & 7;
    return ChunkKey{(uint64_t{0x2a} << 56) | (rng() >> 8), rng() % 2 ? near : ~near};
  };
  for (int step = 0; step < 4000; ++step) {
    if (live.empty() || rng() % 3 != 0) {
      const ChunkKey k = key();
      const Want w{1000u + static_cast<uint64_t>(step), static_cast<uint32_t>(step),
                   static_cast<uint32_t>(rng() % 3), models[step % 2]};
      const swiftkv::ChunkMeta meta{w.model, w.position, 8, 64};
      assert_true(index.insert(k, meta, {Tier::host, w.slot}, 1));
      assert_false(index.insert(k, meta, {Tier::host, 0}, 1));  // never twice
      for (uint32_t p = 0; p < w.pins; ++p) assert_true(index.pin(k));
      live.emplace_back(k, w);
    } else {
      const size_t i = rng() % live.size();
      std::vector<swiftkv::SlotRef> to_free;
      assert_true(index.drop(live[i].first, false, std::nullopt, to_free));
      assert_int_equal(to_free.size(), 1);
      assert_int_equal(to_free[0].slot, live[i].second.slot);
      gone.push_back(live[i].first);
      live[i] = live.back();
      live.pop_back();
    }
    if (step % 500 == 0 || step == 3999) {
      for (const auto &[k, w] : live) {
        assert_true(index.peek(k) == Tier::host);
        assert_int_equal(index.pins(k), w.pins);
      }
      for (const ChunkKey &k : gone) assert_false(index.contains(k));
      std::unordered_map<ChunkKey, swiftkv::ChunkView, swiftkv::ChunkKeyHash> seen;
      index.for_each([&](const swiftkv::ChunkView &v) { seen.emplace(v.key, v); });
      assert_int_equal(seen.size(), live.size());
      for (const auto &[k, w] : live) {
        const swiftkv::ChunkView &v = seen.at(k);
        assert_int_equal(v.where.slot, w.slot);
        assert_int_equal(v.meta.position, w.position);
        assert_true(v.meta.model == w.model);
        assert_int_equal(v.pins, w.pins);
      }
      assert_int_equal(index.chunks(Tier::host), live.size());
    }
  }
  index.reserve(100000);  // growing a populated index keeps it whole
  for (const auto &[k, w] : live) assert_true(index.peek(k) == Tier::host);
}

// The index's memory per chunk it is sized for, as docs/api.md states it: 160 bytes of table
// (64-byte slots, at most 40% full), 40 of eviction node, and the shards' margin for uneven
// shares (four standard deviations of a shard's share: 1.6% of it at 4M chunks, 26% at 64K),
// plus a fixed part (shards, first tables, order domains) under 1 MiB.
void index_memory_per_chunk_is_as_documented(void **) {
  const uint64_t sizes[] = {1u << 16, 1u << 20, 1u << 22};
  const double most[] = {255, 212, 207};
  for (size_t i = 0; i < 3; ++i) {
    swiftkv::ChunkIndex index;
    const uint64_t empty = index.memory_bytes();
    index.reserve(sizes[i]);
    assert_true(index.capacity() >= sizes[i]);
    const uint64_t grown = index.memory_bytes() - empty;
    assert_true(grown <= swiftkv::ChunkIndex::reserve_bytes(sizes[i]));
    const double per_chunk =
        static_cast<double>(index.memory_bytes()) / static_cast<double>(sizes[i]);
    assert_true(per_chunk >= 200.0);
    assert_true(per_chunk <= most[i]);
    const uint64_t before = index.memory_bytes();
    index.reserve(sizes[i] / 2);  // never shrinks, never grows for less
    assert_int_equal(index.memory_bytes(), before);
  }
}

// An index that grows past what it reserved holds its live tables: a shard that outgrows its
// table gives the old one's pages back at once, though the memory it was cut from lives on
// with the shards that have not grown yet (here half of them, halfway through a wave).
void a_growing_index_holds_its_live_tables(void **) {
  swiftkv::ChunkIndex index;  // nothing reserved: every shard grows from its first table
  // 512 chunks a shard on average: about half the shards have grown from 1,024 slots to 2,048.
  const uint64_t n = 256 * 512;
  std::mt19937_64 rng(11);
  const swiftkv::ChunkMeta meta{{1, 2}, 0, 16, 4096};
  std::vector<swiftkv::ChunkKey> keys(n);
  for (uint64_t i = 0; i < n; ++i) {
    keys[i] = {rng(), rng()};
    assert_true(index.insert(keys[i], meta, {Tier::host, i}, i));
  }
  const uint64_t slots = 2 * index.capacity();  // of the shards' tables as they are now
  const uint64_t live = slots * 64;
  assert_true(slots > 256 * 1024 + 256 * 1024 / 4);  // a quarter of the shards or more grew
  assert_true(slots < 256 * 2048 - 256 * 2048 / 4);  // and a quarter or more did not
  // Tables, nodes (as the vector reserved them, at most twice the chunks) and the shards.
  const uint64_t most = live + swiftkv::EvictionOrder::node_bytes(2 * n) + (uint64_t{1} << 20);
  assert_true(index.memory_bytes() <= most);
  for (const auto &k : keys) assert_true(index.peek(k) == Tier::host);
}

// The large-table allocator: 2 MiB alignment from one huge page on, and 64 below; memory that
// reads and writes; pages given back read as zeros and the rest is kept.
void large_tables_are_aligned_and_give_pages_back(void **) {
  using swiftkv::kLargePageBytes;
  for (const size_t bytes : {size_t{64}, size_t{4096} + 1, kLargePageBytes - 1}) {
    void *p = swiftkv::allocate_large(bytes);
    assert_int_equal(reinterpret_cast<uintptr_t>(p) % 64, 0);
    assert_int_equal(swiftkv::large_bytes(bytes), bytes);
    std::memset(p, 0x5a, bytes);
    assert_int_equal(swiftkv::discard_large(p, bytes, bytes), 0);  // not a mapping of its own
    assert_int_equal(static_cast<unsigned char *>(p)[bytes - 1], 0x5a);
    swiftkv::free_large(p, bytes);
  }
  const size_t bytes = 3 * kLargePageBytes + 100;
  assert_int_equal(swiftkv::large_bytes(bytes), 3 * kLargePageBytes + 4096);
  auto *p = static_cast<unsigned char *>(swiftkv::allocate_large(bytes));
  assert_int_equal(reinterpret_cast<uintptr_t>(p) % kLargePageBytes, 0);
  std::memset(p, 0x5a, bytes);
  // From the middle of one page to the middle of a page 2 MiB on: the whole pages between.
  const size_t from = 4096 + 100, len = kLargePageBytes;
  assert_int_equal(swiftkv::discard_large(p + from, len, bytes), kLargePageBytes - 4096);
  assert_int_equal(p[from], 0x5a);  // its page is not whole in the range: kept
  assert_int_equal(p[2 * 4096], 0);
  assert_int_equal(p[from + len - 4097], 0);
  assert_int_equal(p[from + len], 0x5a);
  assert_int_equal(p[bytes - 1], 0x5a);
  swiftkv::free_large(p, bytes);
  // As a vector's allocator, through a reallocation past one huge page.
  std::vector<uint64_t, swiftkv::LargePageAllocator<uint64_t>> v;
  for (uint64_t i = 0; i < kLargePageBytes / 4; ++i) v.push_back(i * 7);
  for (uint64_t i = 0; i < v.size(); ++i) assert_int_equal(v[i], i * 7);
}

// The kernel's flags of the mapping that holds `p` ("VmFlags" in /proc/self/smaps).
std::string vm_flags_of(const void *p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(p);
  bool in = false;
  for (std::string line; std::getline(smaps, line);) {
    unsigned long from = 0, to = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &from, &to) == 2) {  // a mapping's first line
      in = from <= at && at < to;
    } else if (in && line.rfind("VmFlags:", 0) == 0) {
      return line + " ";
    }
  }
  return "";
}

// A host region asked for huge pages says so to the kernel (whether memory gets them is the
// system's setting), and one not asked does not; shared or private.
void host_regions_ask_for_huge_pages_when_told(void **) {
  // A kernel built without transparent huge pages refuses the advice.
  const bool thp = std::filesystem::exists("/sys/kernel/mm/transparent_hugepage/enabled");
  for (const bool shared : {true, false}) {
    for (const bool huge : {true, false}) {
      swiftkv::HostRegionOptions o;
      o.size = 8 << 20;
      o.huge_pages = huge;
      o.shared = shared;
      auto r = swiftkv::create_host_region(o);
      const std::string flags = vm_flags_of(r->data());
      assert_true(flags.rfind("VmFlags:", 0) == 0);
      assert_int_equal(flags.find(" hg ") != std::string::npos, huge && thp);
      assert_int_equal(flags.find(" sh ") != std::string::npos, shared);
      // "dc": not copied into a fork's child.
      assert_int_equal(flags.find(" dc ") != std::string::npos, !shared);
    }
  }
}

// The status of the Error fn throws; 0 when it throws none.
template <class Fn>
int expect_error(Fn fn) {
  try {
    fn();
  } catch (const swiftkv::Error &e) {
    return e.status();
  }
  return 0;
}

// Private host memory (a host tier's slabs): commit and decommit as a memfd region's, never
// exported, no granules, and not in a fork's child, where a shared region is.
void private_host_regions_stay_in_their_process(void **) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  swiftkv::HostRegionOptions o;
  o.size = 3 * page + 1;  // whole pages: 4
  o.shared = false;
  auto r = swiftkv::create_host_region(o);
  assert_true(r->kind() == swiftkv::MemoryKind::host_private);
  assert_int_equal(r->size(), 4 * page);
  assert_int_equal(r->committed_bytes(), 0);
  r->commit(0, 4 * page);
  assert_int_equal(r->committed_bytes(), 4 * page);
  std::memset(r->data(), 0x5a, 4 * page);
  r->decommit(page, page);
  assert_int_equal(r->committed_bytes(), 3 * page);
  assert_int_equal(static_cast<int>(r->data()[page]), 0);  // its page went back: zeros
  assert_int_equal(static_cast<int>(r->data()[2 * page - 1]), 0);
  assert_int_equal(static_cast<int>(r->data()[page - 1]), 0x5a);
  assert_int_equal(static_cast<int>(r->data()[2 * page]), 0x5a);
  r->commit(0, 4 * page);  // only the page that went is made again
  assert_int_equal(r->committed_bytes(), 4 * page);
  assert_int_equal(static_cast<int>(r->data()[page]), 0);
  assert_int_equal(static_cast<int>(r->data()[0]), 0x5a);
  assert_int_equal(expect_error([&] { (void)r->export_range(0, page); }), SWIFTKV_EINVAL);
  o.granule = page;
  assert_int_equal(expect_error([&] { (void)swiftkv::create_host_region(o); }), SWIFTKV_EINVAL);

  swiftkv::HostRegionOptions so;
  so.size = page;
  auto shared = swiftkv::create_host_region(so);
  const pid_t pid = fork();
  if (pid == 0) {  // the child: the shared region mapped, the private one not at all
    const bool ok = !vm_flags_of(shared->data()).empty() && vm_flags_of(r->data()).empty();
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  assert_int_equal(static_cast<int>(r->data()[0]), 0x5a);  // the parent's pages as they were
}

// A move while readers read: the old copy is freed only after the last of them, the new copy is
// what later readers get, and a chunk dropped under its readers is freed by the last one.
void index_frees_moved_and_dropped_copies_after_their_last_reader(void **) {
  swiftkv::ChunkIndex index;
  const ChunkKey k{7, 9};
  const swiftkv::ChunkMeta meta{{1, 2}, 0, 8, 64};
  std::vector<swiftkv::SlotRef> to_free;
  assert_true(index.insert(k, meta, {Tier::peer, 5}, 1));
  assert_true(index.begin_read(k)->where.slot == 5);
  assert_true(index.begin_read(k).has_value());
  assert_true(index.begin_move(k, Tier::peer, true).has_value());
  assert_false(index.begin_move(k, Tier::peer, true).has_value());  // one mover at a time
  assert_true(index.finish_move(k, {Tier::host, 6}, to_free));
  assert_true(to_free.empty());  // two readers may still read slot 5
  assert_true(index.peek(k) == Tier::host);
  assert_int_equal(index.chunks(Tier::peer), 0);
  assert_int_equal(index.bytes(Tier::host), 64);
  const std::optional<swiftkv::ChunkUse> later = index.begin_read(k);
  assert_true(later->where.tier == Tier::host && later->where.slot == 6);
  index.end_read(k, to_free);
  index.end_read(k, to_free);
  assert_true(to_free.empty());  // the later reader still holds the chunk
  index.end_read(k, to_free);
  assert_int_equal(to_free.size(), 1);
  assert_true(to_free[0].tier == Tier::peer && to_free[0].slot == 5);
  to_free.clear();

  // Moved again with no reader: the old copy comes back at once.
  assert_true(index.begin_move(k, Tier::host, true).has_value());
  assert_true(index.finish_move(k, {Tier::disk, 7}, to_free));
  assert_int_equal(to_free.size(), 1);
  assert_int_equal(to_free[0].slot, 6);
  to_free.clear();

  // Dropped under a reader: invisible at once, freed by the reader.
  assert_true(index.begin_read(k).has_value());
  assert_true(index.drop(k, true, std::nullopt, to_free));
  assert_true(to_free.empty());
  assert_false(index.contains(k));
  assert_false(index.begin_read(k).has_value());
  assert_false(index.drop(k, true, std::nullopt, to_free));  // not twice
  assert_int_equal(index.chunks(Tier::disk), 0);
  index.end_read(k, to_free);
  assert_int_equal(to_free.size(), 1);
  assert_int_equal(to_free[0].slot, 7);
  assert_true(index.insert(k, meta, {Tier::host, 8}, 2));  // the key is free again
}

// A chunk being read is nobody's victim, under either policy: a search for one (victim(), and a
// full tier's batch, evict_victims) passes it over and makes it the newest, since it is in use;
// when every chunk is being read there is none, and a batch ends with nothing taken. Once the
// read ends it is a victim again, in its renewed place.
void a_chunk_being_read_is_nobodys_victim(void **) {
  for (const auto policy : {swiftkv::EvictionPolicy::lru, swiftkv::EvictionPolicy::retention}) {
    const ChunkKey model{1, 2};
    const swiftkv::ChunkMeta meta{model, 0, 8, 64};
    std::vector<swiftkv::SlotRef> to_free;
    std::vector<ChunkKey> k;
    for (uint64_t i = 0; i < 6; ++i) k.push_back(ChunkKey{100 + i, 200 + i});
    {
      swiftkv::ChunkIndex index(policy);
      for (uint64_t i = 0; i < 4; ++i)
        assert_true(index.insert(k[i], meta, {Tier::host, i}, 10 * (i + 1)));
      assert_true(index.touch(k[0], 11).has_value());  // still the oldest, with a hit
      assert_true(index.begin_read(k[0]).has_value());
      assert_true(index.victim(Tier::host, model, 100) == k[1]);
      assert_int_equal(index.activity(k[0])->last_active, 100);
      assert_int_equal(index.activity(k[0])->hits, 1);  // a renewal is not a touch
      for (uint64_t i = 1; i < 4; ++i) {
        assert_true(index.victim(Tier::host, model, 100) == k[i]);
        assert_true(index.evict(k[i], Tier::host, true, to_free).has_value());
      }
      assert_false(index.victim(Tier::host, model, 110).has_value());  // only k0, being read
      assert_true(index.contains(k[0]));
      index.end_read(k[0], to_free);
      assert_true(index.victim(Tier::host, model, 120) == k[0]);
      assert_true(index.last_active(k[0]) >= 100);  // renewed by the searches that met it
    }
    {
      swiftkv::ChunkIndex index(policy);
      for (uint64_t i = 0; i < 6; ++i)
        assert_true(index.insert(k[i], meta, {Tier::host, i}, 10 * (i + 1)));
      assert_true(index.touch(k[0], 11).has_value());
      assert_true(index.touch(k[0], 12).has_value());
      assert_true(index.begin_read(k[0]).has_value());
      assert_true(index.begin_read(k[2]).has_value());
      std::vector<swiftkv::ChunkIndex::Evicted> got;
      to_free.clear();
      assert_int_equal(index.evict_victims(Tier::host, model, 100, 3 * 64, got, to_free), 3 * 64);
      assert_int_equal(index.activity(k[0])->last_active, 100);
      assert_int_equal(index.activity(k[0])->hits, 2);  // its history kept
      assert_int_equal(got.size(), 3);
      assert_true(got[0].key == k[1] && got[1].key == k[3] && got[2].key == k[4]);
      assert_int_equal(to_free.size(), 3);
      assert_int_equal(index.chunks(Tier::host), 3);
      // Every chunk left is being read: nothing goes, and the pass ends.
      assert_true(index.begin_read(k[5]).has_value());
      got.clear();
      to_free.clear();
      assert_int_equal(index.evict_victims(Tier::host, model, 200, 64 * 64, got, to_free), 0);
      assert_true(got.empty() && to_free.empty());
      assert_int_equal(index.chunks(Tier::host), 3);
      for (const uint64_t i : {0, 2, 5}) index.end_read(k[i], to_free);
      assert_true(to_free.empty());  // nothing was retired or doomed under the readers
      // In the order the last search met them (k5 stored at 60, k0 and k2 renewed at 100), all
      // renewed at 200 in that order.
      assert_int_equal(index.evict_victims(Tier::host, model, 300, 64 * 64, got, to_free), 3 * 64);
      assert_true(got.size() == 3 && got[0].key == k[5] && got[1].key == k[0] &&
                  got[2].key == k[2]);
    }
  }
}

// --- Policies --------------------------------------------------------------------------------

// The victims an order gives, one after another, each removed before the next is asked.
std::vector<uint32_t> victims_in_turn(swiftkv::EvictionOrder &o, uint64_t now, size_t n) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t v = o.victim(0, now);
    out.push_back(v);
    o.remove(v);
  }
  return out;
}

void lru_order(void **) {
  swiftkv::EvictionOrder o(swiftkv::EvictionPolicy::lru, {});
  const uint32_t a = o.add({1, 1}, 0, 8, 30), b = o.add({2, 2}, 1, 8, 10),
                 c = o.add({3, 3}, 2, 8, 20);
  for (uint32_t n : {a, b, c}) o.link(n, 0);
  assert_true((victims_in_turn(o, 100, 3) == std::vector<uint32_t>{b, c, a}));
  assert_int_equal(o.victim(0, 100), swiftkv::EvictionOrder::kNoNode);
}

void retention_prefers_idle_conversations_and_leading_chunks(void **) {
  swiftkv::RecomputeCost cost;  // s * (1 + l_mid / 1024)
  const uint64_t now = 1'000'000;
  // Conversation A, idle for 900: its chunks 0, 1, 2 of 256 tokens. Conversation B, idle for 100.
  swiftkv::EvictionOrder o(swiftkv::EvictionPolicy::retention, cost);
  const uint32_t b0 = o.add({1, 0}, 0, 256, now - 100), a2 = o.add({2, 2}, 2, 256, now - 900);
  const uint32_t a0 = o.add({2, 0}, 0, 256, now - 900), a1 = o.add({2, 1}, 1, 256, now - 900);
  const uint32_t b1 = o.add({1, 1}, 1, 256, now - 100);
  for (uint32_t n : {b0, a2, a0, a1, b1}) o.link(n, 0);
  // A first (idle longer), and in each conversation the leading chunk first.
  assert_true((victims_in_turn(o, now, 5) == std::vector<uint32_t>{a0, a1, a2, b0, b1}));
  // Exact values: A's first chunk costs 256 * (1 + 128/1024) = 288, over 900 ns.
  assert_true(cost.chunk_cost(256, 256) == 288.0);
  assert_true(cost.chunk_cost(256, 768) == 256.0 * (1.0 + 640.0 / 1024.0));
  // A conversation active now is kept over any idle one, however costly the idle one.
  const uint32_t fresh = o.add({3, 0}, 0, 8, now), old = o.add({4, 0}, 1 << 16, 8, 0);
  o.link(fresh, 0);
  o.link(old, 0);
  assert_int_equal(o.victim(0, now), old);
}

// Freed nodes go back to chunks of their own cost class, oldest first, so that a class's list
// keeps walking its nodes in one order generation after generation; a chunk whose class has none
// free takes another class's before the order grows. Under LRU (one class), first in, first out.
void freed_nodes_go_to_chunks_of_their_class(void **) {
  swiftkv::RecomputeCost cost;  // s * (1 + l_mid / 1024): position 0 and 40 are classes apart
  assert_true(swiftkv::EvictionOrder::cost_class(cost.chunk_cost(256, 256)) !=
              swiftkv::EvictionOrder::cost_class(cost.chunk_cost(256, 41 * 256)));
  swiftkv::EvictionOrder o(swiftkv::EvictionPolicy::retention, cost);
  const uint32_t a0 = o.add({1, 0}, 0, 256, 1), b0 = o.add({1, 1}, 40, 256, 2);
  const uint32_t a1 = o.add({2, 0}, 0, 256, 3), b1 = o.add({2, 1}, 40, 256, 4);
  for (uint32_t n : {a0, b0, a1, b1}) o.link(n, 0);
  for (uint32_t n : {a0, b0, a1, b1}) o.remove(n);  // freed with the classes interleaved
  assert_int_equal(o.add({3, 1}, 40, 256, 5), b0);
  assert_int_equal(o.add({4, 1}, 40, 256, 6), b1);
  assert_int_equal(o.add({3, 0}, 0, 256, 7), a0);
  const uint64_t bytes = o.memory_bytes();
  // Class B has none free: it takes class A's, and the order holds no more nodes than before.
  const uint32_t b2 = o.add({5, 1}, 40, 256, 8);
  assert_int_equal(b2, a1);
  assert_int_equal(o.memory_bytes(), bytes);
  o.link(b2, 0);
  assert_int_equal(o.victim(0, 100), b2);  // the reused node is its new chunk's, class and all
  assert_true(o.key(b2) == (swiftkv::ChunkKey{5, 1}));
  assert_int_equal(o.add({6, 0}, 0, 256, 9), 4);  // none free at all: a new node

  // New nodes come in blocks by class: two classes' chunks stored in turn each walk forward
  // through memory, jumping only from block to block; and the blocks never take more nodes
  // than the room reserved holds chunks (the last come from the other class's block).
  swiftkv::EvictionOrder r(swiftkv::EvictionPolicy::retention, cost);
  r.reserve(1000);
  const uint64_t reserved = r.memory_bytes();
  std::vector<uint32_t> ids[2];
  std::set<uint32_t> all;
  for (uint64_t i = 0; i < 500; ++i) {
    for (uint64_t c = 0; c < 2; ++c) {
      ids[c].push_back(r.add({7 + c, i}, c == 0 ? 0 : 40, 256, 1));
      assert_true(ids[c].back() < 1000);
      all.insert(ids[c].back());
    }
    if (i + 1 == 400) {  // 800 nodes: each class in two blocks of its own
      for (const auto &v : ids) {
        size_t jumps = 0;
        for (size_t j = 1; j < v.size(); ++j) jumps += v[j] != v[j - 1] + 1;
        assert_int_equal(jumps, 1);
      }
    }
  }
  assert_int_equal(all.size(), 1000);
  assert_int_equal(r.memory_bytes(), reserved);
  assert_int_equal(r.add({9, 0}, 0, 256, 1), 1000);  // past the room: the vector grows
  assert_true(r.memory_bytes() > reserved);

  // A class with no node of its own borrows a run of another class's free nodes, so that its
  // next chunks take nodes that lie together: class B and class A stored in turn, A's 200 nodes
  // free, B takes A's first 64 one after another and A goes on from the 65th.
  swiftkv::EvictionOrder w(swiftkv::EvictionPolicy::retention, cost);
  w.reserve(200);
  const uint64_t w_bytes = w.memory_bytes();
  std::vector<uint32_t> a_nodes;
  for (uint64_t i = 0; i < 200; ++i) a_nodes.push_back(w.add({10, i}, 0, 256, 1));
  for (const uint32_t n : a_nodes) w.remove(n);
  for (uint32_t i = 0; i < 10; ++i) {
    assert_int_equal(w.add({11, i}, 40, 256, 2), a_nodes[i]);
    assert_int_equal(w.add({12, i}, 0, 256, 2), a_nodes[64 + i]);
  }
  assert_int_equal(w.memory_bytes(), w_bytes);

  swiftkv::EvictionOrder l(swiftkv::EvictionPolicy::lru, {});
  const uint32_t x = l.add({1, 0}, 0, 256, 1), y = l.add({1, 1}, 40, 256, 2);
  l.remove(y);
  l.remove(x);
  assert_int_equal(l.add({2, 0}, 0, 256, 3), y);
  assert_int_equal(l.add({2, 1}, 40, 256, 4), x);
}

void cost_table_interpolates_between_powers_of_two(void **) {
  swiftkv::RecomputeCost c;
  c.token_cost = 0;
  c.attention_table = {1.0, 2.0, 4.0};  // at 1, 2 and 4 tokens of context
  assert_true(c.attention(1.0) == 1.0);
  assert_true(c.attention(3.0) == 3.0);  // halfway from 2 (2.0) to 4 (4.0)
  assert_true(c.attention(1.5) == 1.5);
  assert_true(c.attention(8.0) == 8.0);  // past the table: in proportion to the context
  assert_true(c.attention(0.5) == 1.0);
  assert_true(c.chunk_cost(2, 4) == 2 * 3.0);  // l_mid = 3
  c.attention_table = {2.0, 1.0};
  bool threw = false;
  try {
    swiftkv::check_recompute_cost(c, "t");
  } catch (const swiftkv::Error &e) {
    threw = e.status() == SWIFTKV_EINVAL && std::strstr(e.what(), "entry 1") != nullptr;
  }
  assert_true(threw);
}

// The eviction order alone against a brute-force scan of the same nodes: random adds, links
// into several domains, touches, pins (unlink) and relinks with old times (which go to the
// second list or the tree), under both policies. LRU must name a node of the oldest activity;
// retention a node whose value is within the documented bound of the smallest.
void eviction_order_matches_a_scan(void **) {
  for (const auto policy : {swiftkv::EvictionPolicy::lru, swiftkv::EvictionPolicy::retention}) {
    swiftkv::RecomputeCost cost;
    cost.attention_cost = 3.0;
    swiftkv::EvictionOrder order(policy, cost);
    std::mt19937_64 rng(policy == swiftkv::EvictionPolicy::lru ? 5 : 6);
    struct Live {
      uint32_t node, position, domain;
      uint64_t la;
      bool linked;
    };
    std::vector<Live> live;
    uint64_t now = 1000;
    uint64_t tree_links = 0, checks = 0;
    auto value = [&](const Live &l) {
      const double c = cost.chunk_cost(16, (uint64_t{l.position} + 1) * 16);
      return c / static_cast<double>(now > l.la ? now - l.la : 1);
    };
    for (int step = 0; step < 20000; ++step) {
      now += rng() % 4;  // ties are common
      const uint64_t op = rng() % 10;
      if (live.size() < 50 || op < 3) {
        const Live l{0, static_cast<uint32_t>(rng() % 200), static_cast<uint32_t>(rng() % 3), now,
                     true};
        Live n = l;
        n.node = order.add(ChunkKey{rng(), rng()}, l.position, 16, now);
        order.link(n.node, n.domain);
        live.push_back(n);
      } else if (op == 3) {
        const size_t i = rng() % live.size();
        order.remove(live[i].node);
        live[i] = live.back();
        live.pop_back();
      } else if (op < 7) {
        Live &l = live[rng() % live.size()];
        order.touch(l.node, now);
        l.la = std::max(l.la, now);
      } else if (op == 7) {
        Live &l = live[rng() % live.size()];
        order.unlink(l.node);
        l.linked = false;
      } else {
        // Back in, perhaps into another domain, with the time it had: usually older than the
        // newest there.
        Live &l = live[rng() % live.size()];
        if (!l.linked) {
          l.domain = static_cast<uint32_t>(rng() % 3);
          order.link(l.node, l.domain);
          l.linked = true;
          ++tree_links;
        }
      }
      for (uint32_t d = 0; d < 3; ++d) {
        uint64_t n = 0;
        uint64_t oldest = UINT64_MAX;
        double best = INFINITY;
        for (const Live &l : live) {
          if (!l.linked || l.domain != d) continue;
          ++n;
          oldest = std::min(oldest, l.la);
          best = std::min(best, value(l));
        }
        assert_int_equal(order.size(d), n);
        const uint32_t v = order.victim(d, now);
        if (n == 0) {
          assert_int_equal(v, swiftkv::EvictionOrder::kNoNode);
          continue;
        }
        const auto it =
            std::find_if(live.begin(), live.end(), [&](const Live &l) { return l.node == v; });
        assert_true(it != live.end() && it->linked && it->domain == d);
        assert_int_equal(order.last_active(v), it->la);
        if (policy == swiftkv::EvictionPolicy::lru) {
          assert_int_equal(it->la, oldest);
        } else {
          assert_true(value(*it) <= best * swiftkv::EvictionOrder::kRetentionBound * (1 + 1e-12));
        }
        ++checks;
      }
    }
    assert_true(tree_links > 500);
    assert_true(checks > 50000);
  }
  // The classes: a factor 2^(1/4) apart, with 0 alone.
  assert_int_equal(swiftkv::EvictionOrder::cost_class(0.0), 0);
  assert_int_equal(swiftkv::EvictionOrder::cost_class(1.0), 128);
  assert_int_equal(swiftkv::EvictionOrder::cost_class(1.18), 128);
  assert_int_equal(swiftkv::EvictionOrder::cost_class(1.19), 129);
  assert_int_equal(swiftkv::EvictionOrder::cost_class(0.5), 124);
  assert_true(swiftkv::EvictionOrder::class_cost(132) == 2.0);
  // A cost is in the last class whose bound is at most the cost (the retention bound relies on
  // it): at each bound, just below it, and at random costs; out of range, the end classes.
  using swiftkv::EvictionOrder;
  for (uint32_t c = 2; c < EvictionOrder::kClasses; ++c) {
    const double b = EvictionOrder::class_cost(c);
    assert_int_equal(EvictionOrder::cost_class(b), c);
    assert_int_equal(EvictionOrder::cost_class(std::nextafter(b, 0.0)), c - 1);
  }
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> octaves(-40, 40);
  for (int i = 0; i < 100000; ++i) {
    const double cost = std::exp2(octaves(rng));
    const uint32_t c = EvictionOrder::cost_class(cost);
    assert_true(c >= 1 && c < EvictionOrder::kClasses);
    if (c > 1) assert_true(EvictionOrder::class_cost(c) <= cost);
    if (c + 1 < EvictionOrder::kClasses) assert_true(cost < EvictionOrder::class_cost(c + 1));
  }
  assert_int_equal(EvictionOrder::cost_class(std::numeric_limits<double>::infinity()), 255);
  assert_int_equal(EvictionOrder::cost_class(std::numeric_limits<double>::denorm_min()), 1);
  assert_int_equal(EvictionOrder::cost_class(std::numeric_limits<double>::quiet_NaN()), 0);
  assert_int_equal(EvictionOrder::cost_class(-1.0), 0);
}

// A batch of victims taken in one pass (EvictionOrder::Victims, how a full tier evicts a store's
// room) gives exactly the nodes that victim() and remove() give one after another, under both
// policies, on two orders built alike by random adds, touches and relinks with old times (tree
// entries included).
void victims_in_one_pass_match_victims_in_turn(void **) {
  for (const auto policy : {swiftkv::EvictionPolicy::lru, swiftkv::EvictionPolicy::retention}) {
    swiftkv::RecomputeCost cost;
    swiftkv::EvictionOrder a(policy, cost), b(policy, cost);
    std::mt19937_64 rng(11);
    std::vector<uint32_t> nodes;
    uint64_t now = 1000;
    for (int step = 0; step < 3000; ++step) {
      now += rng() % 3;
      const uint64_t op = rng() % 8;
      if (nodes.size() < 20 || op < 4) {
        const ChunkKey k{rng(), rng()};
        const auto position = static_cast<uint32_t>(rng() % 64);
        const uint32_t n = a.add(k, position, 16, now);
        assert_int_equal(b.add(k, position, 16, now), n);
        a.link(n, 0);
        b.link(n, 0);
        nodes.push_back(n);
      } else if (op < 6) {
        const uint32_t n = nodes[rng() % nodes.size()];
        a.touch(n, now);
        b.touch(n, now);
      } else {
        const uint32_t n = nodes[rng() % nodes.size()];
        a.unlink(n);
        b.unlink(n);
        a.link(n, 0);  // back with its old time: often into the tree or the second list
        b.link(n, 0);
      }
    }
    const uint64_t at = now + 500;
    std::vector<uint32_t> batch;
    swiftkv::EvictionOrder::Victims v(a, 0, at);
    for (uint32_t n = v.peek(); n != swiftkv::EvictionOrder::kNoNode; n = v.peek()) {
      batch.push_back(n);
      v.pop();
    }
    assert_int_equal(batch.size(), nodes.size());
    assert_int_equal(a.size(0), 0);
    assert_true(batch == victims_in_turn(b, at, nodes.size()));
  }
}

// The bound an order node keeps of its chunk's stored bytes (EvictionOrder::stored_bound), which
// tells a full tier how many victims to take before their slots are read: never below the
// bytes, exact to 64 bytes up to 256 KiB, within 1/2048 (and a 64-byte unit) above; a size not
// said (0, or past 8 GiB) is the largest bound. set_stored replaces it.
void stored_bounds_hold_every_size(void **) {
  swiftkv::EvictionOrder o(swiftkv::EvictionPolicy::lru, {});
  std::mt19937_64 rng(5);
  std::vector<uint64_t> sizes = {1,
                                 63,
                                 64,
                                 65,
                                 4095 * 64,
                                 4095 * 64 + 1,
                                 4096 * 64,
                                 4097 * 64 + 17,
                                 1 << 20,
                                 (5 << 18),
                                 128 << 20,
                                 uint64_t{4095} << 21,
                                 (uint64_t{4095} << 21) + 1};
  for (int i = 0; i < 2000; ++i) sizes.push_back(1 + rng() % (uint64_t{1} << (1 + rng() % 33)));
  for (const uint64_t b : sizes) {
    const uint32_t n = o.add({1, b}, 0, 16, 1, b);
    const uint64_t bound = o.stored_bound(n);
    if (b > (uint64_t{4095} << 21)) {  // past 8 GiB
      assert_int_equal(bound, swiftkv::EvictionOrder::kUnknownStored);
      continue;
    }
    assert_true(bound >= b);
    if (b <= 4095 * 64) {
      assert_int_equal(bound, (b + 63) / 64 * 64);
    } else {
      assert_true(bound - b <= b / 2048 + 64);
    }
    o.set_stored(n, 64);
    assert_int_equal(o.stored_bound(n), 64);
    o.remove(n);
  }
  const uint32_t unsaid = o.add({2, 2}, 0, 16, 1);
  assert_int_equal(o.stored_bound(unsaid), swiftkv::EvictionOrder::kUnknownStored);
}

// A full tier's batch of victims (ChunkIndex::evict_victims, which takes victims out of the order
// ahead of reading their slots) takes exactly the victims the bytes asked for need, in the
// order's order, whatever their stored sizes: chunks of mixed sizes, raw and encoded, some moved
// and re-encoded to another size (the order's bound follows the chunk), pinned ones kept,
// against a victim-by-victim reference on an index built alike. Under both policies.
void a_batch_of_victims_takes_what_the_bytes_need(void **) {
  for (const auto policy : {swiftkv::EvictionPolicy::lru, swiftkv::EvictionPolicy::retention}) {
    swiftkv::ChunkIndex a(policy), b(policy);
    std::mt19937_64 rng(23);
    const ChunkKey model{1, 2};
    std::vector<ChunkKey> live;
    uint64_t now = 100;
    auto meta = [&](uint32_t position) {
      // 16 tokens: raw chunks of 16 x 64 .. 16 x 16 KiB, encoded ones stored in 1 byte to the
      // raw size (an encoding that grows a chunk is as possible as one that shrinks it).
      const uint64_t raw = uint64_t{16} * 64 * (1 + rng() % 256);
      const bool encoded = rng() % 2 != 0;
      return swiftkv::ChunkMeta{
          model, position, 16, raw, encoded ? 1 + rng() % raw : 0, encoded ? 1u : 0u};
    };
    for (int round = 0; round < 40; ++round) {
      for (int i = 0; i < 60; ++i) {
        const ChunkKey k{rng(), rng()};
        const swiftkv::ChunkMeta m = meta(static_cast<uint32_t>(rng() % 64));
        const uint64_t slot = rng();
        now += rng() % 3;
        assert_true(a.insert(k, m, {Tier::host, slot}, now));
        assert_true(b.insert(k, m, {Tier::host, slot}, now));
        live.push_back(k);
      }
      for (int i = 0; i < 40; ++i) {
        const ChunkKey &k = live[rng() % live.size()];
        now += rng() % 3;
        const uint64_t op = rng() % 8;
        if (op < 5) {
          a.touch(k, now);
          b.touch(k, now);
        } else if (op < 7) {  // re-encoded in place by a move: another stored size
          const swiftkv::ChunkMeta m = meta(a.view(k)->meta.position);
          std::vector<swiftkv::SlotRef> fa, fb;
          if (!a.begin_move(k, Tier::host, true)) continue;
          assert_true(b.begin_move(k, Tier::host, true).has_value());
          assert_true(a.finish_move(k, {Tier::host, 7}, m, fa));
          assert_true(b.finish_move(k, {Tier::host, 7}, m, fb));
        } else if (a.pins(k) == 0) {
          assert_true(a.pin(k));
          assert_true(b.pin(k));
        }
      }
      // Room for a random number of bytes, from one unit to a tenth of the tier.
      const uint64_t want = 1 + rng() % (a.bytes(Tier::host) / 10 + 1);
      now += 1000;
      std::vector<swiftkv::ChunkIndex::Evicted> got;
      std::vector<swiftkv::SlotRef> freed;
      const uint64_t bytes = a.evict_victims(Tier::host, model, now, want, got, freed);
      std::vector<ChunkKey> expect;
      uint64_t expect_bytes = 0;
      while (expect_bytes < want) {
        const std::optional<ChunkKey> v = b.victim(Tier::host, model, now);
        if (!v) break;
        std::vector<swiftkv::SlotRef> f;
        const std::optional<swiftkv::ChunkMeta> m = b.evict(*v, Tier::host, true, f);
        assert_true(m.has_value());
        expect.push_back(*v);
        expect_bytes += m->stored();
      }
      assert_int_equal(got.size(), expect.size());
      assert_int_equal(freed.size(), expect.size());
      for (size_t i = 0; i < got.size(); ++i) assert_true(got[i].key == expect[i]);
      assert_int_equal(bytes, expect_bytes);
      assert_int_equal(a.bytes(Tier::host), b.bytes(Tier::host));
      assert_int_equal(a.chunks(Tier::host), b.chunks(Tier::host));
      std::erase_if(live, [&](const ChunkKey &k) { return !a.contains(k); });
    }
  }
}

// A chunk event callback may store into the same cache from inside a full tier's eviction pass
// (a pass within a pass, on one thread, which lists its victims apart from the outer one): every
// chunk evicted is reported once, none twice, and every chunk kept reads back intact. The outer
// pass frees the room of 5 chunks before it reports them; the store in the callback takes it
// and evicts 5 more in a pass of its own while the outer pass is still reporting.
void a_store_from_an_eviction_callback_evicts_in_a_pass_of_its_own(void **) {
  Rig r(geometry(2, 8, SWIFTKV_DTYPE_F16), 12, 0, 0);
  for (uint32_t s = 0; s < 4; ++s) {
    r.now += 10;
    assert_int_equal(r.store(s, 3), 3);
  }
  std::vector<ChunkKey> reported;
  bool nested = false;
  r.cache->set_event_callback([&](const swiftkv::ChunkEvent &e) {
    reported.push_back(e.key);
    if (!nested) {
      nested = true;
      r.now += 10;
      assert_int_equal(r.store(20, 10), 10);
    }
  });
  r.now += 10;
  assert_int_equal(r.store(9, 5), 5);
  r.cache->set_event_callback(nullptr);
  assert_true(nested);
  // 5 for the outer store's room, 5 for the inner store's beyond it, 5 for the outer store's
  // chunks once the inner one had filled the tier again.
  assert_int_equal(r.cache->stats().evictions, 15);
  assert_int_equal(reported.size(), 15);
  std::set<std::pair<uint64_t, uint64_t>> once;
  for (const ChunkKey &k : reported) assert_true(once.insert({k.lo, k.hi}).second);
  assert_int_equal(r.cache->stats().chunks[1], 12);
  for (size_t i = 0; i < 5; ++i) assert_true(r.intact(9, i));
  size_t kept = 5;
  for (const uint32_t s : {0u, 1u, 2u, 3u, 20u}) {
    const size_t n = s == 20 ? 10 : 3;
    const std::vector<ChunkKey> k = r.keys(s, n);
    for (size_t i = 0; i < n; ++i) {
      if (!r.cache->resident(k[i])) continue;
      assert_true(r.intact(s, i));
      ++kept;
    }
  }
  assert_int_equal(kept, 12);
}

// A full last tier (host memory, nothing below it) makes a store's room in one pass: a run of
// new chunks evicts exactly that many of the least recently used, each reported once, and every
// chunk kept reads back intact.
void a_full_last_tier_evicts_a_stores_room_at_once(void **) {
  Rig r(geometry(2, 8, SWIFTKV_DTYPE_F16), 12, 0, 0);
  for (uint32_t s = 0; s < 4; ++s) {
    r.now += 10;
    assert_int_equal(r.store(s, 3), 3);
  }
  r.now += 10;
  assert_true(r.where(0, 2) == Tier::host);  // sequence 0 is now the most recent
  std::vector<swiftkv::ChunkEvent> events;
  r.cache->set_event_callback([&](const swiftkv::ChunkEvent &e) { events.push_back(e); });
  r.now += 10;
  assert_int_equal(r.store(9, 5), 5);  // 5 new chunks into a tier of 12, full
  r.cache->set_event_callback(nullptr);
  // The 5 least recently used: sequence 1 (3 chunks), then the first 2 of sequence 2.
  std::set<std::pair<uint32_t, size_t>> gone;
  for (const swiftkv::ChunkEvent &e : events) {
    assert_true(e.reason == swiftkv::ChunkEventReason::policy);
    assert_true(e.from == Tier::host && !e.to.has_value());
    for (uint32_t s = 1; s <= 2; ++s) {
      const std::vector<ChunkKey> k = r.keys(s, 3);
      for (size_t i = 0; i < 3; ++i) {
        if (k[i] == e.key) gone.insert({s, i});
      }
    }
  }
  assert_int_equal(events.size(), 5);
  assert_true(
      (gone == std::set<std::pair<uint32_t, size_t>>{{1, 0}, {1, 1}, {1, 2}, {2, 0}, {2, 1}}));
  assert_int_equal(r.cache->stats().evictions, 5);
  assert_int_equal(r.cache->stats().chunks[1], 12);
  for (size_t i = 0; i < 5; ++i) assert_true(r.intact(9, i));
  for (uint32_t s : {0u, 3u}) {
    for (size_t i = 0; i < 3; ++i) assert_true(r.intact(s, i));
  }
  assert_true(r.intact(2, 2));  // the 7 kept: sequences 0 and 3, and the last of sequence 2
}

// The cache's victims against the exact order on random work: stores that overflow peer, host
// and disk (demotion chains), lookups and reads (activity), pins, readers holding chunks across
// stores (never victims meanwhile), and moves by hand (old activity put back). Every chunk the
// policy gives up is checked, when it goes, against every chunk that could have gone instead from
// that tier.
void cache_evicts_in_the_exact_order(void **) {
  for (const auto policy : {swiftkv::EvictionPolicy::lru, swiftkv::EvictionPolicy::retention}) {
    Rig r(geometry(2, 8, SWIFTKV_DTYPE_F16), 10, 12, 6, policy);
    const swiftkv::RecomputeCost cost = r.cache->options().cost;
    constexpr uint32_t kSeqs = 24, kLen = 6;
    std::map<std::pair<uint32_t, uint32_t>, ChunkKey> key_of;
    std::unordered_map<ChunkKey, std::pair<uint32_t, uint32_t>, swiftkv::ChunkKeyHash> chunk_of;
    for (uint32_t s = 0; s < kSeqs; ++s) {
      const std::vector<ChunkKey> k = r.keys(s, kLen);
      for (uint32_t i = 0; i < kLen; ++i) {
        key_of[{s, i}] = k[i];
        chunk_of[k[i]] = {s, i};
      }
    }
    std::unordered_map<ChunkKey, uint64_t, swiftkv::ChunkKeyHash> la;  // the exact reference
    std::unordered_map<ChunkKey, uint32_t, swiftkv::ChunkKeyHash> pins;
    auto value = [&](const ChunkKey &k) {
      const uint64_t s = 8, pos = chunk_of.at(k).second;
      const uint64_t idle = r.now > la.at(k) ? r.now - la.at(k) : 1;
      return cost.chunk_cost(s, (pos + 1) * s) / static_cast<double>(idle);
    };
    uint64_t evictions = 0, demotions = 0, bad = 0, read_victims = 0;
    ChunkKey moving{};
    std::vector<ChunkKey> reading;
    auto being_read = [&](const ChunkKey &k) {
      return std::find(reading.begin(), reading.end(), k) != reading.end();
    };
    r.cache->set_event_callback([&](const swiftkv::ChunkEvent &e) {
      if (e.reason != swiftkv::ChunkEventReason::policy) return;
      (e.to ? demotions : evictions) += 1;
      if (being_read(e.key)) ++read_victims;
      // Everything still in the tier the victim left could have gone instead, unless pinned,
      // being moved by hand or being read.
      double best = value(e.key);
      uint64_t oldest = la.at(e.key);
      for (const auto &[k, sc] : chunk_of) {
        if (k == e.key || pins[k] != 0 || k == moving || being_read(k) ||
            r.cache->tier_of(k) != e.from) {
          continue;
        }
        oldest = std::min(oldest, la.at(k));
        best = std::min(best, value(k));
      }
      const bool ok =
          policy == swiftkv::EvictionPolicy::lru
              ? la.at(e.key) == oldest
              : value(e.key) <= best * swiftkv::EvictionOrder::kRetentionBound * (1 + 1e-12);
      if (!ok) ++bad;
    });
    std::mt19937_64 rng(policy == swiftkv::EvictionPolicy::lru ? 21 : 22);
    uint64_t reads = 0;
    for (int step = 0; step < 1500; ++step) {
      r.now += rng() % 3 == 0 ? 0 : 1 + rng() % 5000;
      const uint32_t s = static_cast<uint32_t>(rng() % kSeqs);
      const uint32_t n = 1 + static_cast<uint32_t>(rng() % kLen);
      const uint64_t op = rng() % 12;
      const std::vector<ChunkKey> k = r.keys(s, n);
      if (op < 5) {
        for (const ChunkKey &x : k)
          la[x] = r.now;  // resident ones are touched, new ones stored now
        r.store(s, n);
      } else if (op < 8) {
        std::vector<uint8_t> res(n);
        r.cache->lookup(k, res.data());
        for (uint32_t i = 0; i < n; ++i) {
          if (res[i] != ChunkCache::kDropped) la[k[i]] = r.now;
        }
      } else if (op == 8) {
        const ChunkKey x = k.back();
        if (!r.cache->resident(x)) continue;
        if (pins[x] != 0 && rng() % 2 == 0) {
          r.cache->unpin(std::span<const ChunkKey>(&x, 1));
          --pins[x];
        } else if (pins[x] < 2) {
          r.cache->pin(std::span<const ChunkKey>(&x, 1));
          ++pins[x];
        }
      } else if (op == 9) {
        // A reader holds the chunk across later stores: it is nobody's victim meanwhile (a
        // search that meets it makes it the newest), and it ends with a lookup here, activity
        // later than any such renewal.
        const ChunkKey x = k.back();
        if (r.cache->begin_read(x)) {
          reading.push_back(x);
          ++reads;
        }
        if (reading.size() > 3) {
          const ChunkKey done = reading.front();
          reading.erase(reading.begin());
          r.cache->end_read(done);
          r.now += 1;
          uint8_t res = 0;
          r.cache->lookup(std::span<const ChunkKey>(&done, 1), &res);
          if (res != ChunkCache::kDropped) la[done] = r.now;
        }
      } else if (op == 10) {
        const ChunkKey x = k.back();
        moving = x;
        if (r.cache->resident(x))
          r.cache->move(std::span<const ChunkKey>(&x, 1), static_cast<Tier>(rng() % 3));
        moving = ChunkKey{};
      } else {
        // Reads are activity too, and check the bytes through whichever tier holds them.
        const uint32_t i = n - 1;
        if (r.cache->resident(k[i])) {
          la[k[i]] = r.now;
          assert_true(r.intact(s, i));
        }
      }
    }
    for (const ChunkKey &x : reading) r.cache->end_read(x);
    assert_int_equal(bad, 0);
    assert_int_equal(read_victims, 0);
    assert_true(reads > 10);
    assert_true(evictions > 100);
    assert_true(demotions > 200);
    for (uint32_t s = 0; s < kSeqs; ++s) {
      for (uint32_t i = 0; i < kLen; ++i) {
        if (r.cache->resident(key_of[{s, i}])) assert_true(r.intact(s, i));
      }
    }
  }
}

// --- Tiers -----------------------------------------------------------------------------------

// Every tier and every move between them keeps the bytes, for several geometries and dtypes.
void bytes_survive_every_tier_and_path(void **) {
  const swiftkv::ModelGeometry geos[] = {
      geometry(2, 8, SWIFTKV_DTYPE_F16), geometry(3, 5, SWIFTKV_DTYPE_BF16),
      geometry(1, 16, SWIFTKV_DTYPE_FP8_E4M3), geometry(4, 3, SWIFTKV_DTYPE_F32)};
  for (const auto &geo : geos) {
    Rig r(geo, 64, 64, 4);
    assert_int_equal(r.store(1, 3), 3);
    for (size_t i = 0; i < 3; ++i) {
      assert_true(r.where(1, i) == Tier::peer);
      assert_true(r.intact(1, i));
    }
    const std::vector<ChunkKey> k = r.keys(1, 3);
    const std::vector<ChunkKey> one(k.begin(), k.begin() + 1);
    // Every ordered pair of tiers, chained: peer->host->disk->peer->disk->host->peer.
    const Tier path[] = {Tier::host, Tier::disk, Tier::peer, Tier::disk, Tier::host, Tier::peer};
    for (Tier t : path) {
      assert_int_equal(r.cache->move(one, t), 1);
      assert_true(r.where(1, 0) == t);
      assert_true(r.intact(1, 0));
    }
    // Demotion by pressure: the peer holds 4 chunks; 6 more push the oldest down to host.
    r.now += 10;
    assert_int_equal(r.store(2, 6), 6);
    uint64_t on[3] = {0, 0, 0};
    for (uint32_t seq : {1u, 2u}) {
      for (size_t i = 0; i < (seq == 1 ? 3u : 6u); ++i) {
        const auto t = r.where(seq, i);
        assert_true(t.has_value());
        ++on[static_cast<size_t>(*t)];
        assert_true(r.intact(seq, i));
      }
    }
    assert_int_equal(on[0], 4);
    assert_int_equal(on[1] + on[2], 5);
    const swiftkv::CacheStats s = r.cache->stats();
    assert_true(s.demotions >= 5);
    assert_int_equal(s.chunks[0], 4);
  }
}

// The chain peer -> host -> disk -> dropped under pressure, with the budgets held.
void demotion_chain_ends_in_drop(void **) {
  Rig r(geometry(2, 8, SWIFTKV_DTYPE_F16), 4, 4, 4);
  assert_int_equal(r.store(1, 2), 2);
  r.now += 1;
  assert_int_equal(r.store(2, 12), 12);
  r.now += 1;
  // 14 chunks in 12 places: the two least recently used, sequence 1, went all the way down.
  assert_false(r.where(1, 0).has_value());
  assert_false(r.where(1, 1).has_value());
  const swiftkv::CacheStats s = r.cache->stats();
  assert_int_equal(s.chunks[0], 4);
  assert_int_equal(s.chunks[1], 4);
  assert_int_equal(s.chunks[2], 4);
  assert_int_equal(s.evictions, 2);
  for (size_t i = 0; i < 12; ++i) assert_true(r.intact(2, i));
  assert_true(s.bytes[1] <= r.ctx->config().host_budget_bytes);
  assert_true(r.cache->disk()->free_bytes({}) <= r.ctx->config().disk_budget_bytes);
}

// A tier whose chunks are all being read (a prefill loading its prefix layer by layer) keeps
// them: a store finds no victim there and goes to the tier below, and a maintenance pass short
// of its free target moves nothing. Demoting them would free their slots only when the reads
// end, so each store and pass took the next victim, and the next, until the tier was empty.
// Once the reads end, the tier gives its least recently used up again.
void a_tier_being_read_keeps_its_chunks(void **) {
  Rig r(geometry(2, 8, SWIFTKV_DTYPE_F16), 4, 8, 0, swiftkv::EvictionPolicy::lru, 25);
  assert_int_equal(r.store(1, 4), 4);
  const std::vector<ChunkKey> k = r.keys(1, 4);
  for (const ChunkKey &x : k) assert_true(r.cache->begin_read(x).has_value());
  r.now += 10;
  r.cache->maintain();  // a quarter of the host tier to be free: no victim can give it
  r.now += 10;
  assert_int_equal(r.store(2, 2), 2);
  for (size_t i = 0; i < 4; ++i) assert_true(r.where(1, i) == Tier::host);
  for (size_t i = 0; i < 2; ++i) assert_true(r.where(2, i) == Tier::disk);
  assert_int_equal(r.cache->stats().demotions, 0);
  for (const ChunkKey &x : k) r.cache->end_read(x);
  r.now += 10;
  assert_int_equal(r.store(3, 1), 1);  // host full: its least recently used goes down
  assert_true(r.where(3, 0) == Tier::host);
  assert_true(r.where(1, 0) == Tier::disk);
  assert_int_equal(r.cache->stats().demotions, 1);
  r.now += 10;
  r.cache->maintain();  // now it can: one more down, a quarter of the tier free
  assert_true(r.where(1, 1) == Tier::disk);
  assert_int_equal(r.cache->stats().demotions, 2);
  for (uint32_t s : {1u, 2u}) {
    for (size_t i = 0; i < (s == 1 ? 4u : 2u); ++i) assert_true(r.intact(s, i));
  }
  assert_true(r.intact(3, 0));
}

void pinned_chunks_are_never_evicted(void **) {
  Rig r(geometry(2, 8, SWIFTKV_DTYPE_F16), 4, 0, 0);
  assert_int_equal(r.store(1, 4), 4);
  r.cache->pin(r.keys(1, 4));
  r.now += 1;
  // Nothing can go: the new chunks find no room and the pinned ones stay.
  assert_int_equal(r.store(2, 2), 0);
  assert_int_equal(r.cache->stats().stores_rejected, 2);
  for (size_t i = 0; i < 4; ++i) {
    r.now += 1;  // reading is activity: chunk 0 ends least recently used
    assert_true(r.intact(1, i));
  }
  // Unpinned, they are evicted in LRU order.
  r.cache->unpin(r.keys(1, 4));
  assert_int_equal(r.store(2, 2), 2);
  assert_false(r.where(1, 0).has_value());
  assert_false(r.where(1, 1).has_value());
  assert_true(r.where(1, 2).has_value());
}

// A chunk of a prompt's leading end dropped while later ones stay: lookup reports both.
void lookup_reports_a_dropped_head(void **) {
  Rig r(geometry(2, 8, SWIFTKV_DTYPE_F16), 16, 0, 0, swiftkv::EvictionPolicy::retention);
  assert_int_equal(r.store(1, 4), 4);
  const std::vector<ChunkKey> k = r.keys(1, 4);
  assert_int_equal(r.cache->clear(std::nullopt, 7, std::span<const ChunkKey>(k.data(), 2)), 2);
  uint8_t res[4];
  const swiftkv::LookupResult l = r.cache->lookup(k, res);
  assert_int_equal(l.dropped_head, 2);
  assert_int_equal(l.loadable, 2);
  assert_int_equal(res[0], ChunkCache::kDropped);
  assert_int_equal(res[2], static_cast<int>(Tier::host));
  // The loadable part loads from its start.
  std::vector<std::byte> out(2 * r.sizes.full_chunk_bytes);
  assert_int_equal(r.cache->retrieve(k, 2, r.sizes.full_chunk_bytes, out.data()), 2);
  const auto c2 = chunk_bytes(r.sizes.full_chunk_bytes, 1, 2);
  assert_memory_equal(out.data(), c2.data(), c2.size());
}

// A chunk missing between cached ones (tiers give chunks up each on its own): lookup reports
// the prefix and the longest cached run, the earliest of equal ones.
void lookup_reports_the_longest_run(void **) {
  Rig r(geometry(2, 8, SWIFTKV_DTYPE_F16), 16, 0, 0, swiftkv::EvictionPolicy::retention);
  assert_int_equal(r.store(1, 6), 6);
  const std::vector<ChunkKey> k = r.keys(1, 6);
  assert_int_equal(r.cache->clear(std::nullopt, 7, std::span<const ChunkKey>(k.data() + 1, 2)), 2);
  uint8_t res[6];
  swiftkv::LookupResult l = r.cache->lookup(k, res);
  assert_int_equal(l.prefix, 1);
  assert_int_equal(l.dropped_head, 3);  // chunk 0 cached, 1-2 not: recompute 0-2, load 3-5
  assert_int_equal(l.loadable, 3);
  assert_int_equal(res[0], static_cast<int>(Tier::host));
  assert_int_equal(res[1], ChunkCache::kDropped);
  std::vector<std::byte> out(3 * r.sizes.full_chunk_bytes);
  assert_int_equal(r.cache->retrieve(k, 3, r.sizes.full_chunk_bytes, out.data()), 3);
  const auto c3 = chunk_bytes(r.sizes.full_chunk_bytes, 1, 3);
  assert_memory_equal(out.data(), c3.data(), c3.size());
  // Runs of equal length: the prefix wins, and the result is the prefix's.
  assert_int_equal(r.cache->clear(std::nullopt, 7, std::span<const ChunkKey>(k.data() + 5, 1)), 1);
  assert_int_equal(r.store(1, 2), 2);  // chunk 1 back: 0-1 cached, 2 not, 3-4 cached, 5 not
  l = r.cache->lookup(k, res);
  assert_int_equal(l.prefix, 2);
  assert_int_equal(l.dropped_head, 0);
  assert_int_equal(l.loadable, 2);
  // Nothing cached: nothing to load and no head.
  const std::vector<ChunkKey> other = r.keys(2, 3);
  l = r.cache->lookup(other, nullptr);
  assert_int_equal(l.prefix + l.dropped_head + l.loadable, 0);
}

// The retention policy evicts a long-idle conversation's leading chunks before anything else.
void retention_eviction_in_the_cache(void **) {
  Rig r(geometry(2, 8, SWIFTKV_DTYPE_F16), 8, 0, 0, swiftkv::EvictionPolicy::retention);
  assert_int_equal(r.store(1, 4), 4);  // conversation 1, then idle
  r.now += 1'000'000;
  assert_int_equal(r.store(2, 4), 4);  // conversation 2, just now
  r.now += 1'000;
  assert_int_equal(r.store(3, 2), 2);  // needs two chunks of room
  assert_false(r.where(1, 0).has_value());
  assert_false(r.where(1, 1).has_value());
  assert_true(r.where(1, 2).has_value());
  assert_true(r.where(2, 0).has_value());
}

// The slot of a resident chunk in its tier's store.
uint64_t slot_of(Rig &r, const ChunkKey &k) {
  const std::optional<swiftkv::ChunkUse> use = r.cache->begin_read(k);
  assert_true(use.has_value());
  r.cache->end_read(k);
  return use->where.slot;
}

std::vector<std::string> segment_files(const std::string &dir) {
  std::vector<std::string> out;
  for (const auto &e : std::filesystem::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("seg-", 0) == 0 && e.is_regular_file()) out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

void restart_finds_disk_chunks_and_rejects_corrupt_ones(void **) {
  const auto g = geometry(2, 8, SWIFTKV_DTYPE_F16);
  std::string dir;
  {
    Rig r(g, 0, 8, 0);
    r.keep_dir = true;
    dir = r.dir;
    assert_int_equal(r.store(1, 3), 3);
    assert_true(r.where(1, 2) == Tier::disk);
  }
  // One record per segment here: three segment files, each of the configured size.
  const std::vector<std::string> files = segment_files(dir);
  assert_int_equal(files.size(), 3);
  {
    Rig r(g, 0, 8, 0, swiftkv::EvictionPolicy::lru, 0, 0, dir);
    r.keep_dir = true;
    assert_int_equal(r.cache->stats().corrupt_files_removed, 0);
    assert_int_equal(r.cache->stats().chunks[2], 3);
    for (size_t i = 0; i < 3; ++i) assert_true(r.intact(1, i));
  }
  // One flipped byte in the middle of chunk 1's payload: its record passes recovery (a commit
  // record vouches for it) and fails its checksum when read.
  {
    Rig r(g, 0, 8, 0, swiftkv::EvictionPolicy::lru, 0, 0, dir);
    r.keep_dir = true;
    const auto loc = r.cache->disk()->location_of(slot_of(r, r.keys(1, 2)[1]));
    assert_false(loc.path.empty());
    r.cache.reset();
    flip_byte(loc.path, loc.offset + swiftkv::DiskTier::kHeaderBytes + 100);
  }
  {
    Rig r(g, 0, 8, 0, swiftkv::EvictionPolicy::lru, 0, 0, dir);
    assert_true(r.intact(1, 0));
    assert_false(r.intact(1, 1));             // never loaded
    assert_false(r.where(1, 1).has_value());  // reported missing from now on
    assert_true(r.where(1, 2).has_value());
    assert_int_equal(r.cache->stats().load_failures, 1);
  }
}

// Whatever else is in the directory, the context opens and skips it, counted: a FIFO (which
// would block a plain open), a directory, a socket, a symlink loop, a truncated segment, a
// segment of another size than its header says, one of a newer format, and a file not ours.
void disk_skips_what_is_not_a_segment(void **) {
  const auto g = geometry(2, 8, SWIFTKV_DTYPE_F16);
  std::string dir;
  {
    Rig r(g, 0, 8, 0);
    r.keep_dir = true;
    dir = r.dir;
    assert_int_equal(r.store(1, 2), 2);
  }
  const std::vector<std::string> files = segment_files(dir);
  assert_int_equal(files.size(), 2);
  const std::string seg = dir + "/seg-000000f";
  assert_int_equal(mkfifo((seg + "0.kvlog").c_str(), 0644), 0);
  assert_true(std::filesystem::create_directory(seg + "1.kvlog"));
  {
    const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    const std::string p = seg + "2.kvlog";
    assert_true(p.size() < sizeof a.sun_path);
    std::memcpy(a.sun_path, p.c_str(), p.size() + 1);
    assert_int_equal(bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a), 0);
    close(fd);
  }
  std::filesystem::create_symlink(seg + "3.kvlog", seg + "3.kvlog");
  std::filesystem::copy_file(files[0], seg + "4.kvlog");
  std::filesystem::resize_file(seg + "4.kvlog", std::filesystem::file_size(files[0]) / 2);
  std::filesystem::copy_file(files[0], seg + "5.kvlog");
  std::filesystem::resize_file(seg + "5.kvlog", std::filesystem::file_size(files[0]) * 2);
  std::filesystem::copy_file(files[0], seg + "6.kvlog");
  {
    // A newer format: its header says format 3 (checksum made right, so only the format
    // differs).
    std::fstream f(seg + "6.kvlog", std::ios::in | std::ios::out | std::ios::binary);
    char h[128];
    f.read(h, sizeof h);
    const uint32_t fmt = 3;
    std::memcpy(h + 8, &fmt, 4);
    const uint64_t sum = XXH3_64bits(h, 120);
    std::memcpy(h + 120, &sum, 8);
    f.seekp(0);
    f.write(h, sizeof h);
  }
  std::ofstream(dir + "/notes.txt") << "not a segment";
  {
    Rig r(g, 0, 8, 0, swiftkv::EvictionPolicy::lru, 0, 0, dir);
    r.keep_dir = true;
    const swiftkv::CacheStats s = r.cache->stats();
    assert_int_equal(s.disk_files_skipped, 8);
    assert_int_equal(s.chunks[2], 2);
    assert_true(r.intact(1, 0) && r.intact(1, 1));
    // And they are left alone: nothing of ours replaces them.
    assert_int_equal(r.store(2, 4), 4);
  }
  assert_true(std::filesystem::is_fifo(seg + "0.kvlog"));
  assert_true(std::filesystem::is_directory(seg + "1.kvlog"));
  assert_true(std::filesystem::is_socket(seg + "2.kvlog"));
  assert_true(std::filesystem::is_symlink(seg + "3.kvlog"));
  std::filesystem::remove_all(dir);
}

// A record rewritten under an open context (another writer copies record A over record B) is a
// miss for B, counted, never A's bytes; A itself still reads.
void disk_never_returns_another_record(void **) {
  Rig r(geometry(2, 8, SWIFTKV_DTYPE_F16), 0, 8, 0);
  assert_int_equal(r.store(1, 1), 1);
  assert_int_equal(r.store(2, 1), 1);
  const auto a = r.cache->disk()->location_of(slot_of(r, r.keys(1, 1)[0]));
  const auto b = r.cache->disk()->location_of(slot_of(r, r.keys(2, 1)[0]));
  assert_true(a.length == b.length && a.path != b.path);
  {
    std::vector<char> rec(a.length);
    std::ifstream in(a.path, std::ios::binary);
    in.seekg(static_cast<std::streamoff>(a.offset));
    in.read(rec.data(), static_cast<std::streamsize>(rec.size()));
    std::fstream out(b.path, std::ios::in | std::ios::out | std::ios::binary);
    out.seekp(static_cast<std::streamoff>(b.offset));
    out.write(rec.data(), static_cast<std::streamsize>(rec.size()));
  }
  const std::vector<ChunkKey> kb = r.keys(2, 1);
  std::vector<std::byte> out(r.sizes.full_chunk_bytes, std::byte{0x77});
  assert_int_equal(r.cache->retrieve(kb, 0, r.sizes.full_chunk_bytes, out.data()), 0);
  const swiftkv::CacheStats s = r.cache->stats();
  assert_int_equal(s.disk_records_mismatched, 1);
  assert_int_equal(s.load_failures, 1);
  assert_false(r.where(2, 0).has_value());
  assert_true(r.intact(1, 0));
}

// A record whose checksums hold but whose size is not its model's chunk size (written by
// another build, or crafted) is dropped when asked for: a load failure, never EINTERNAL.
void disk_record_of_the_wrong_size_is_dropped(void **) {
  const auto g = geometry(2, 8, SWIFTKV_DTYPE_F16);
  std::string dir;
  ChunkKey key;
  {
    Rig r(g, 0, 8, 0);
    r.keep_dir = true;
    dir = r.dir;
    key = r.keys(1, 1)[0];
  }
  {
    const auto sizes = swiftkv::geometry_sizes(g, "g");
    swiftkv::DiskOptions o;
    o.dir = dir;
    o.budget_bytes = swiftkv::DiskTier::budget_for(8, sizes.full_chunk_bytes);
    o.segment_bytes = swiftkv::DiskTier::segment_for(sizes.full_chunk_bytes);
    swiftkv::DiskTier t(o);
    t.rebuild([](const swiftkv::DiskTier::Found &) {});
    const swiftkv::ChunkMeta wrong{swiftkv::model_fingerprint("m", g), 0, 8,
                                   sizes.full_chunk_bytes - 64};
    const std::optional<uint64_t> slot = t.allocate(key, wrong);
    assert_true(slot.has_value());
    std::vector<std::byte> bytes(wrong.bytes, std::byte{3});
    t.write(*slot, key, wrong, bytes.data());
  }
  Rig r(g, 0, 8, 0, swiftkv::EvictionPolicy::lru, 0, 0, dir);
  assert_true(r.where(1, 0) == Tier::disk);
  assert_false(r.intact(1, 0));
  assert_int_equal(r.cache->stats().load_failures, 1);
  assert_false(r.where(1, 0).has_value());
  assert_int_equal(r.store(1, 1), 1);  // stored again, properly
  assert_true(r.intact(1, 0));
}

// Killed with SIGKILL at random moments while it stores (and syncs), a process leaves a log from
// which a new context recovers exactly the chunks whose store returned, with their bytes, at
// most the one in flight besides, and nothing else. Twenty kills into one directory.
void disk_survives_sigkill_while_storing(void **) {
  const auto g = geometry(8, 64, SWIFTKV_DTYPE_F16);  // 32 KiB chunks: kills land mid-write
  std::string dir;
  {
    Rig r(g, 0, 4096, 0);
    r.keep_dir = true;
    dir = r.dir;
  }
  std::mt19937 rng(17);
  uint32_t next = 0;                // sequences below this were stored by an earlier child
  std::vector<bool> stored;         // sequences whose store returned
  std::vector<uint32_t> in_flight;  // the one each child was storing when killed
  for (int round = 0; round < 20; ++round) {
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    const uint32_t first = next;
    const pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
      close(fds[0]);
      Rig r(g, 0, 4096, 0, swiftkv::EvictionPolicy::lru, 0, 0, dir);
      r.keep_dir = true;
      for (uint32_t seq = first;; ++seq) {
        if (r.store(seq, 2) != 2) _exit(3);
        if (write(fds[1], &seq, sizeof seq) != sizeof seq) _exit(4);
        if (seq % 5 == 0) r.cache->disk()->sync();  // commit records too
      }
    }
    close(fds[1]);
    usleep(1000 + rng() % 20000);
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    assert_true(WIFSIGNALED(status));
    uint32_t seq = 0;
    uint32_t done = first;  // sequences [first, done) returned
    while (read(fds[0], &seq, sizeof seq) == sizeof seq) done = seq + 1;
    close(fds[0]);
    stored.resize(done + 1, false);
    for (uint32_t s2 = first; s2 < done; ++s2) stored[s2] = true;
    in_flight.push_back(done);
    Rig r(g, 0, 4096, 0, swiftkv::EvictionPolicy::lru, 0, 0, dir);
    r.keep_dir = true;
    uint64_t expect = 0;
    for (uint32_t s2 = 0; s2 <= done + 1; ++s2) {
      const bool maybe = std::find(in_flight.begin(), in_flight.end(), s2) != in_flight.end();
      for (size_t i = 0; i < 2; ++i) {
        const bool there = r.where(s2, i).has_value();
        if (s2 < stored.size() && stored[s2]) {
          assert_true(there);
        } else if (!maybe) {
          assert_false(there);  // never stored
        }
        if (there) {
          assert_true(r.intact(s2, i));  // whole, whichever it is
          ++expect;
        }
      }
    }
    assert_int_equal(r.cache->stats().chunks[2], expect);
    // The next child starts after the one in flight, whose chunks may or may not be back.
    next = done + 1;
  }
  std::filesystem::remove_all(dir);
}

// The log under churn: eight records a segment, random frees (as evictions would make), stores
// that need cleaning to find room, and a reader thread reading records while their segments are
// cleaned. Every read returns exactly the bytes written; the budget holds; a new tier on the
// same directory finds exactly the live records.
void disk_cleaning_moves_records_under_readers(void **) {
  char t[] = "/tmp/swiftkv-log-XXXXXX";
  assert_non_null(mkdtemp(t));
  const std::string dir = t;
  constexpr uint64_t kPayload = 4096;
  swiftkv::DiskOptions o;
  o.dir = dir;
  o.segment_bytes =
      2 * swiftkv::DiskTier::kHeaderBytes + 8 * swiftkv::DiskTier::record_bytes(kPayload);
  o.budget_bytes = 8 * o.segment_bytes;
  o.sync_ns = 0;
  const ChunkKey model{5, 6};
  auto bytes_of = [&](uint64_t id) {
    std::vector<std::byte> b(kPayload);
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::byte>((id * 131 + i * 7) >> 3);
    return b;
  };
  auto key_of = [](uint64_t id) { return ChunkKey{id * 0x9E3779B97F4A7C15ull, id}; };
  std::mutex mu;
  std::map<uint64_t, std::pair<uint64_t, int>> live;  // slot -> (id, readers)
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> reads{0}, bad{0};
  {
    auto tier = std::make_unique<swiftkv::DiskTier>(o);
    tier->rebuild([](const swiftkv::DiskTier::Found &) {});
    std::thread reader([&] {
      std::mt19937_64 rng(3);
      std::vector<std::byte> out(kPayload);
      while (!stop.load()) {
        uint64_t slot = 0, id = 0;
        {
          std::lock_guard lock(mu);
          if (live.empty()) continue;
          auto it = live.begin();
          std::advance(it, static_cast<long>(rng() % live.size()));
          slot = it->first;
          id = it->second.first;
          ++it->second.second;
        }
        const swiftkv::ChunkMeta meta{model, static_cast<uint32_t>(id), 16, kPayload};
        try {
          tier->read(slot, meta, out.data());
          if (out != bytes_of(id)) ++bad;
        } catch (const swiftkv::Error &) {
          ++bad;
        }
        ++reads;
        std::lock_guard lock(mu);
        --live.at(slot).second;
      }
    });
    std::mt19937_64 rng(4);
    for (uint64_t id = 1; id <= 3000; ++id) {
      const swiftkv::ChunkMeta meta{model, static_cast<uint32_t>(id), 16, kPayload};
      std::optional<uint64_t> slot;
      while (!(slot = tier->allocate(key_of(id), meta))) {
        // Full: free a record nobody reads, as the cache's eviction would.
        std::lock_guard lock(mu);
        assert_false(live.empty());
        auto it = live.begin();
        std::advance(it, static_cast<long>(rng() % live.size()));
        if (it->second.second != 0) continue;
        tier->free(it->first);
        live.erase(it);
      }
      const auto b = bytes_of(id);
      tier->write(*slot, key_of(id), meta, b.data());
      {
        std::lock_guard lock(mu);
        live[*slot] = {id, 0};
      }
      const swiftkv::DiskStats st = tier->stats();
      assert_true(st.allocated_bytes <= o.budget_bytes);
      assert_true(st.live_bytes <= tier->capacity_bytes({}));
    }
    stop = true;
    reader.join();
    const swiftkv::DiskStats st = tier->stats();
    assert_true(st.segments_cleaned > 10);
    assert_true(st.bytes_relocated > 0);
    assert_true(reads.load() > 100);
    assert_int_equal(bad.load(), 0);
  }
  // Reopened: exactly the live records, with their bytes.
  swiftkv::DiskTier again(o);
  std::map<uint64_t, uint64_t> found;  // id -> slot
  again.rebuild([&](const swiftkv::DiskTier::Found &f) {
    assert_true(f.meta.bytes == kPayload && f.meta.model == model);
    found[f.meta.position] = f.slot;
  });
  assert_int_equal(found.size(), live.size());
  std::vector<std::byte> out(kPayload);
  for (const auto &[slot, v] : live) {
    const uint64_t id = v.first;
    assert_true(found.count(id) == 1);
    again.read(found[id], swiftkv::ChunkMeta{model, static_cast<uint32_t>(id), 16, kPayload},
               out.data());
    assert_true(out == bytes_of(id));
  }
  std::filesystem::remove_all(dir);
}

// A payload read in pieces (larger than one piece): the bytes come back exactly, and a byte
// flipped in a later piece fails the checksum.
void disk_reads_large_records_in_pieces(void **) {
  char t[] = "/tmp/swiftkv-big-XXXXXX";
  assert_non_null(mkdtemp(t));
  constexpr uint64_t kPayload = (uint64_t{9} << 20) + 4096 + 64;
  swiftkv::DiskOptions o;
  o.dir = t;
  o.segment_bytes = swiftkv::DiskTier::segment_for(kPayload);
  o.budget_bytes = swiftkv::DiskTier::budget_for(2, kPayload);
  swiftkv::DiskTier tier(o);
  tier.rebuild([](const swiftkv::DiskTier::Found &) {});
  const ChunkKey key{1, 2};
  const swiftkv::ChunkMeta meta{ChunkKey{3, 4}, 0, 256, kPayload};
  const std::vector<std::byte> b = chunk_bytes(kPayload, 9, 1);
  const std::optional<uint64_t> slot = tier.allocate(key, meta);
  assert_true(slot.has_value());
  tier.write(*slot, key, meta, b.data());
  std::vector<std::byte> out(kPayload);
  tier.read(*slot, meta, out.data());
  assert_true(out == b);
  const auto loc = tier.location_of(*slot);
  flip_byte(loc.path, loc.offset + swiftkv::DiskTier::kHeaderBytes + (uint64_t{8} << 20) + 5);
  bool failed = false;
  try {
    tier.read(*slot, meta, out.data());
  } catch (const swiftkv::Error &e) {
    failed = e.status() == SWIFTKV_EIO && std::strstr(e.what(), "checksum") != nullptr;
  }
  assert_true(failed);
  std::filesystem::remove_all(t);
}

// A batch of records read at once (read_many: several in flight on helper threads) gives each
// its bytes, and a record that fails its checksum fails alone.
void disk_reads_many_records_at_once(void **) {
  char t[] = "/tmp/swiftkv-many-XXXXXX";
  assert_non_null(mkdtemp(t));
  constexpr uint64_t kPayload = (uint64_t{2} << 20) + 640;
  constexpr size_t kRecords = 7;  // 14 MiB: above the parallel threshold
  static_assert(kPayload * kRecords >= swiftkv::DiskTier::kParallelReadBytes);
  swiftkv::DiskOptions o;
  o.dir = t;
  o.segment_bytes = swiftkv::DiskTier::segment_for(kPayload) * 4;
  o.budget_bytes = o.segment_bytes * 4;
  swiftkv::DiskTier tier(o);
  tier.rebuild([](const swiftkv::DiskTier::Found &) {});
  std::vector<swiftkv::ChunkMeta> metas;
  std::vector<uint64_t> slots;
  for (size_t i = 0; i < kRecords; ++i) {
    const ChunkKey key{10 + i, 20};
    metas.push_back(swiftkv::ChunkMeta{ChunkKey{3, 4}, static_cast<uint32_t>(i), 256, kPayload});
    const std::optional<uint64_t> slot = tier.allocate(key, metas.back());
    assert_true(slot.has_value());
    tier.write(*slot, key, metas.back(), chunk_bytes(kPayload, 11, i).data());
    slots.push_back(*slot);
  }
  std::vector<std::vector<std::byte>> out(kRecords, std::vector<std::byte>(kPayload));
  std::vector<swiftkv::TierStore::SlotRead> reads;
  for (size_t i = 0; i < kRecords; ++i) reads.push_back({slots[i], &metas[i], out[i].data()});
  std::vector<uint8_t> ok(kRecords, 7);
  tier.read_many(reads, ok);
  for (size_t i = 0; i < kRecords; ++i) {
    assert_int_equal(ok[i], 1);
    assert_true(out[i] == chunk_bytes(kPayload, 11, i));
  }
  const auto loc = tier.location_of(slots[3]);
  flip_byte(loc.path, loc.offset + swiftkv::DiskTier::kHeaderBytes + (uint64_t{1} << 20) + 3);
  for (auto &b : out) std::fill(b.begin(), b.end(), std::byte{0});
  tier.read_many(reads, ok);
  for (size_t i = 0; i < kRecords; ++i) {
    assert_int_equal(ok[i], i == 3 ? 0 : 1);
    if (i != 3) assert_true(out[i] == chunk_bytes(kPayload, 11, i));
  }
  std::filesystem::remove_all(t);
}

// Replaces r's context and cache with ones over a disk tier of `budget` bytes in 1 MiB
// segments at dir (host budget 0): records of several chunks per segment.
void reopen_on_disk(Rig &r, const std::string &dir, uint64_t budget) {
  swiftkv::ContextConfig c;
  c.disk_path = dir;
  c.disk_budget_bytes = budget;
  c.disk_segment_bytes = 1u << 20;
  r.cache.reset();
  r.ctx = std::make_unique<swiftkv::Context>(c);
  CacheOptions o;
  o.policy = swiftkv::EvictionPolicy::lru;
  o.demote_free_percent = 0;
  o.host_slab_bytes = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  o.maintenance_interval_ms = 0;
  o.clock = [&r] { return r.now; };
  r.cache = std::make_unique<ChunkCache>(*r.ctx, o);
}

// A disk room reserved and given up unwritten (a connector request that ends without saving, a
// save that the tier re-places encoded) gets a dead record over it: the next start walks past it
// and finds every record written after it in the segment (before, the walk ended at the room's
// zeros and they were all lost, after a clean close).
void a_room_given_up_does_not_end_the_log(void **) {
  const auto g = geometry(2, 64, SWIFTKV_DTYPE_F16);
  const std::string dir = temp_dir();
  {
    Rig r(g, 0, 0, 0);
    reopen_on_disk(r, dir, 4u << 20);
    assert_int_equal(r.store(1, 2), 2);
    const std::vector<ChunkKey> k = r.keys(2, 3);
    const swiftkv::ChunkMeta meta{r.fp, 0, r.g.chunk_tokens, r.sizes.full_chunk_bytes};
    std::optional<swiftkv::SlotRef> room = r.cache->reserve_slot(k[0], meta);
    assert_true(room.has_value());
    assert_int_equal(static_cast<int>(room->tier), static_cast<int>(Tier::disk));
    r.cache->release_slot(*room, meta);
    assert_int_equal(r.store(3, 4), 4);
  }
  Rig again(g, 0, 0, 0);
  reopen_on_disk(again, dir, 4u << 20);
  const swiftkv::CacheStats s = again.cache->stats();
  assert_int_equal(s.chunks[2], 6);
  assert_int_equal(s.corrupt_files_removed, 0);
  for (size_t i = 0; i < 2; ++i) assert_true(again.intact(1, i));
  for (size_t i = 0; i < 4; ++i) assert_true(again.intact(3, i));
  again.cache.reset();
  std::filesystem::remove_all(dir);
}

// Kills while cleaning moves records (issue 44, item 7): can a conversation lose its leading
// chunk that way? A 4 MiB tier of 1 MiB segments (126 chunks of 8 KiB each, 378 in all) takes
// conversations of 10 chunks, one store each; conversation 0 is looked up before every store, so
// it stays while the ones around it are evicted, its segment falls to an eighth live and is
// cleaned, and its chunks move, again and again. Ten children are killed at random moments; after
// each, a fresh tier on the directory finds: every chunk exact; conversation 0, moved again and
// again, whole; the five conversations stored last whole. Cleaning moved records in every run.
// Which chunks of the older conversations are left is the eviction policy's choice (chunks
// recovered after a restart are ordered by when they were written, so leading chunks go first),
// not a loss.
void kills_while_cleaning_lose_no_moved_chunk(void **) {
  const auto g = geometry(2, 64, SWIFTKV_DTYPE_F16);
  const std::string dir = temp_dir();
  std::mt19937 rng(44);
  uint32_t next = 1;
  uint64_t relocated_runs = 0;
  for (int round = 0; round < 10; ++round) {
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    const uint32_t first = next;
    const pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
      close(fds[0]);
      setenv("SWIFTKV_LOG", "off", 1);
      Rig r(g, 0, 0, 0);
      reopen_on_disk(r, dir, 4u << 20);
      if (first == 1 && r.store(0, 10) != 10) _exit(3);
      for (uint32_t seq = first;; ++seq) {
        r.now += 10;
        uint8_t res[10];
        if (r.cache->lookup(r.keys(0, 10), res).prefix != 10) _exit(4);
        r.now += 10;
        if (r.store(seq, 10) != 10) _exit(5);  // room is always made
        const uint64_t moved = r.cache->stats().disk_bytes_relocated;
        const uint64_t msg[2] = {seq, moved};
        if (write(fds[1], msg, sizeof msg) != sizeof msg) _exit(6);
      }
    }
    close(fds[1]);
    // At least 60 conversations in (the tier holds 37: it has evicted and cleaned), then a kill
    // at a random moment of what follows.
    uint64_t msg[2] = {0, 0};
    uint32_t done = first;  // conversations [first, done) returned
    uint64_t moved = 0;
    while (done < first + 60 && read(fds[0], msg, sizeof msg) == sizeof msg) {
      done = static_cast<uint32_t>(msg[0]) + 1;
      moved = msg[1];
    }
    usleep(rng() % 20000);
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFSIGNALED(status)) fail_msg("the child ended itself: %d", WEXITSTATUS(status));
    while (read(fds[0], msg, sizeof msg) == sizeof msg) {
      done = static_cast<uint32_t>(msg[0]) + 1;
      moved = msg[1];
    }
    close(fds[0]);
    assert_true(done >= first + 60);
    if (moved > 0) ++relocated_runs;
    Rig r(g, 0, 0, 0);
    reopen_on_disk(r, dir, 4u << 20);
    for (uint32_t s2 = 0; s2 <= done; ++s2) {
      size_t present = 0;
      for (size_t i = 0; i < 10; ++i) {
        const bool there = r.where(s2, i).has_value();
        if (there) {
          ++present;
          assert_true(r.intact(s2, i));
        }
      }
      if (s2 == 0 || (s2 + 5 >= done && s2 < done)) assert_int_equal(present, 10);
    }
    next = done + 1;
  }
  assert_int_equal(relocated_runs, 10);
  std::filesystem::remove_all(dir);
}

// A full filesystem (issue 44; ENOSPC, EDQUOT or EFBIG, not a lack of fds): 8 MiB of tmpfs under a
// 16 MiB budget of 1 MiB segments, 100 stores of 10 chunks of 8 KiB. The filesystem gives 7
// segments and refuses the next: the tier counts that once, keeps to the 7 (it asks again only
// after 30 s, so segment names stay low and the log says it once), and goes on filling them,
// evicting its oldest and cleaning their segments: it holds what 7 segments fit less at most one
// segment being cleaned, every store is cached, and what it holds is exact. The filesystem is a
// private mount in a child (root only; without it the test is skipped).
void a_full_filesystem_shrinks_the_disk_tier_to_what_it_gave(void **) {
  const auto g = geometry(2, 64, SWIFTKV_DTYPE_F16);
  const pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    char mnt[] = "/tmp/swiftkv-small-XXXXXX";
    if (mkdtemp(mnt) == nullptr) _exit(2);
    if (unshare(CLONE_NEWNS) != 0 ||
        mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        mount("tmpfs", mnt, "tmpfs", 0, "size=8m") != 0) {
      rmdir(mnt);
      _exit(77);
    }
    setenv("SWIFTKV_LOG", "off", 1);
    int rc = 0;
    {
      Rig r(g, 0, 0, 0);
      const std::string kv_dir = std::string(mnt) + "/kv";
      std::filesystem::create_directory(kv_dir);
      reopen_on_disk(r, kv_dir, 16u << 20);
      if (r.sizes.full_chunk_bytes != 8192) rc = 3;
      uint64_t cached = 0;
      for (uint32_t seq = 0; seq < 100 && rc == 0; ++seq) {
        r.now += 10;
        cached += r.store(seq, 10);
      }
      const swiftkv::CacheStats s = r.cache->stats();
      const uint64_t segments = s.disk_bytes_allocated >> 20;
      const uint64_t per_segment = ((1u << 20) - 256) / swiftkv::DiskTier::record_bytes(8192);
      const uint64_t fit = r.cache->disk()->records_that_fit(8192);
      if (rc == 0 && (s.disk_full_refusals != 1 || segments != 7)) rc = 4;
      if (rc == 0 && fit != (segments - 1) * per_segment) rc = 5;
      if (rc == 0 && cached != 1000) rc = 6;
      if (rc == 0 && (s.chunks[2] > fit || s.chunks[2] + per_segment < fit)) rc = 7;
      if (rc == 0 && s.stores_rejected != 0) rc = 8;
      for (uint32_t seq = 90; seq < 100 && rc == 0; ++seq) {
        for (size_t i = 0; i < 10; ++i) {
          if (!r.intact(seq, i)) rc = 9;
        }
      }
      // The names: one per segment made, none burnt on refusals.
      for (const auto &e : std::filesystem::directory_iterator(kv_dir)) {
        const std::string n = e.path().filename().string();
        if (rc == 0 && n.rfind("seg-", 0) == 0 && n > "seg-00000008.kvlog") rc = 10;
      }
      if (rc != 0) {
        std::fprintf(
            stderr, "rc %d: refusals %llu, segments %llu, fit %llu, chunks %llu, cached %llu\n", rc,
            (unsigned long long)s.disk_full_refusals, (unsigned long long)segments,
            (unsigned long long)fit, (unsigned long long)s.chunks[2], (unsigned long long)cached);
      }
    }
    umount(mnt);
    rmdir(mnt);
    _exit(rc);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  assert_true(WIFEXITED(status));
  if (WEXITSTATUS(status) == 77) skip();  // no private mount here (not root)
  assert_int_equal(WEXITSTATUS(status), 0);
}

// A full disk (here: a file size limit, as a full filesystem answers) refuses new segments: the
// tier lives within the segments it has (less the one kept free for cleaning), evicting by its
// policy; with nothing it may evict, stores are rejected and counted; nothing is corrupted and
// the budget's count stays true.
void disk_full_lives_within_its_segments(void **) {
  const auto g = geometry(2, 8, SWIFTKV_DTYPE_F16);
  std::string dir;
  {
    Rig r(g, 0, 64, 0);
    r.keep_dir = true;
    dir = r.dir;
  }
  const pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    signal(SIGXFSZ, SIG_IGN);
    setenv("SWIFTKV_LOG", "off", 1);
    Rig r(g, 0, 64, 0, swiftkv::EvictionPolicy::lru, 0, 0, dir);
    r.keep_dir = true;
    if (r.store(1, 3) != 3) _exit(2);
    const uint64_t allocated = r.cache->stats().disk_bytes_allocated;
    // Segments are preallocated files of segment_bytes: a limit one byte short lets the
    // existing ones be written and no new one be made.
    rlimit lim{};
    lim.rlim_cur = lim.rlim_max = r.cache->disk()->segment_bytes() - 1;
    if (setrlimit(RLIMIT_FSIZE, &lim) != 0) _exit(3);
    r.now += 10;
    // Three segments of one record each, one kept free: room for two. All of seq 1 made room.
    if (r.store(2, 2) != 2) _exit(4);
    if (r.where(1, 0) || r.where(1, 1) || r.where(1, 2)) _exit(5);
    if (!r.intact(2, 0) || !r.intact(2, 1)) _exit(6);
    const swiftkv::CacheStats s = r.cache->stats();
    if (s.disk_bytes_allocated != allocated || s.evictions != 3 || s.stores_rejected != 0 ||
        s.disk_full_refusals != 1 || s.capacity_bytes[2] != r.cache->disk()->capacity_bytes({})) {
      _exit(7);
    }
    // Nothing may go: rejected and counted, the pinned chunks intact.
    r.cache->pin(r.keys(2, 2));
    r.now += 10;
    if (r.store(3, 1) != 0 || r.cache->stats().stores_rejected != 1) _exit(8);
    if (!r.intact(2, 0) || !r.intact(2, 1)) _exit(9);
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  std::filesystem::remove_all(dir);
}

// The borrower's half of the lease protocol.
void reclaimed_leases_are_evacuated_then_released(void **) {
  Rig r(geometry(2, 8, SWIFTKV_DTYPE_F16), 16, 0, 4);
  std::vector<swiftkv::ChunkEvent> events;
  r.cache->set_event_callback([&](const swiftkv::ChunkEvent &e) { events.push_back(e); });
  assert_int_equal(r.store(1, 3), 3);
  assert_int_equal(r.lender->stats().lent_blocks, 8);
  r.lender->reclaim(swiftkv::ElasticRegion::kAllLeases);
  r.cache->maintain();
  for (size_t i = 0; i < 3; ++i) {
    assert_true(r.where(1, i) == Tier::host);
    assert_true(r.intact(1, i));
  }
  assert_int_equal(r.lender->stats().lent_blocks, 0);  // released: the lender may use it
  assert_int_equal(r.lender->pending_reclaims().size(), 0);
  assert_int_equal(events.size(), 3);
  assert_true(events[0].reason == swiftkv::ChunkEventReason::revoked && events[0].to == Tier::host);
  assert_int_equal(r.cache->stats().revocations, 3);
  assert_false(r.cache->configured(Tier::peer, r.fp));
}

void a_lost_lease_drops_its_chunks(void **) {
  Rig r(geometry(2, 8, SWIFTKV_DTYPE_F16), 16, 0, 4);
  assert_int_equal(r.store(1, 2), 2);
  r.lender->end_all_leases();  // the lender went away
  r.cache->maintain();
  assert_false(r.where(1, 0).has_value());
  assert_false(r.where(1, 1).has_value());
  assert_int_equal(r.cache->stats().revocations, 2);
  assert_int_equal(r.cache->stats().chunks[0], 0);
}

// A lender in this process that the peer tier must treat as remote: its grants carry no address,
// and its bytes move only through transfer() (copied here, as UCX would move them). Counts the
// batches; can fail the next one, or lose every lease while one runs.
class RemoteTwin final : public swiftkv::LenderLink {
 public:
  explicit RemoteTwin(std::shared_ptr<swiftkv::ElasticRegion> r)
      : region_(r), local_(swiftkv::local_lender(std::move(r))) {}
  void check_geometry(const swiftkv::GeometrySizes &s) const override { local_->check_geometry(s); }
  swiftkv::LeaseGrant lend(uint64_t max_units) override {
    swiftkv::LeaseGrant g = local_->lend(max_units);
    std::lock_guard lock(mu_);
    data_[g.lease_id] = g.data;
    g.data = nullptr;
    g.remote = true;
    return g;
  }
  swiftkv::LinkLeaseState renew(uint64_t id) override { return local_->renew(id); }
  uint64_t clock_now() const override { return local_->clock_now(); }
  const void *identity() const noexcept override { return this; }
  bool valid(uint64_t id) const noexcept override { return local_->valid(id); }
  void release(uint64_t id) noexcept override { local_->release(id); }
  std::string describe() const override { return "the remote twin"; }
  void transfer(std::span<const swiftkv::transport::RangeOp> ops) override {
    std::lock_guard lock(mu_);
    ++batches;
    ops_in_batches += ops.size();
    if (fail_next) {
      fail_next = false;
      throw swiftkv::Error(SWIFTKV_EPEER, "the remote twin failed a batch");
    }
    for (const auto &o : ops) {
      std::byte *lent = data_.at(o.range) + o.op.offset;
      if (o.op.kind == swiftkv::transport::RmaOp::Kind::get) {
        std::memcpy(o.op.local, lent, o.op.bytes);
      } else {
        std::memcpy(lent, o.op.local, o.op.bytes);
      }
    }
    if (lose_during) region_->end_all_leases();  // the bytes moved, but the leases did not hold
  }
  std::mutex mu_;
  uint64_t batches = 0, ops_in_batches = 0;
  bool fail_next = false, lose_during = false;

 private:
  std::shared_ptr<swiftkv::ElasticRegion> region_;
  std::shared_ptr<swiftkv::LenderLink> local_;
  std::unordered_map<uint64_t, std::byte *> data_;
};

// A remote lender of `chunks` chunks of r's model, borrowed by r's cache.
std::shared_ptr<RemoteTwin> borrow_remote_twin(Rig &r, uint64_t chunks) {
  swiftkv::ElasticConfig e;
  e.lender = r.g;
  e.borrower = r.g;
  const swiftkv::LendUnit u = swiftkv::lend_unit(r.sizes, r.sizes);
  e.capacity_blocks = chunks / u.borrower_chunks * u.lender_blocks;
  e.owned_blocks = 0;
  swiftkv::HostRegionOptions ho;
  ho.size = swiftkv::ElasticRegion::required_bytes(e);
  auto region = std::make_shared<swiftkv::ElasticRegion>(e, swiftkv::create_host_region(ho));
  auto twin = std::make_shared<RemoteTwin>(region);
  r.cache->borrow(r.fp, r.sizes, twin, UINT64_MAX);
  return twin;
}

// Chunks lent by a remote lender are read as one batch per retrieve; a batch that fails returns
// nothing from it and drops only the first chunk (as corrupt), and bytes whose lease was lost
// while they moved are not returned (the chunk dropped as revoked).
void remote_reads_go_as_one_batch(void **) {
  Rig r(geometry(2, 8, SWIFTKV_DTYPE_F16), 0, 0, 0);
  const std::shared_ptr<RemoteTwin> twin = borrow_remote_twin(r, 8);
  assert_int_equal(r.store(1, 6), 6);
  assert_int_equal(twin->batches, 6);  // a store writes chunk by chunk

  const std::vector<ChunkKey> k = r.keys(1, 6);
  const uint64_t cb = r.sizes.full_chunk_bytes;
  std::vector<std::byte> out(6 * cb);
  assert_int_equal(r.cache->retrieve(k, 0, cb, out.data()), 6);
  assert_int_equal(twin->batches, 7);
  assert_int_equal(twin->ops_in_batches, 6 + 6);
  for (size_t i = 0; i < 6; ++i) {
    assert_true(std::equal(out.begin() + i * cb, out.begin() + (i + 1) * cb,
                           chunk_bytes(cb, 1, i).begin()));
  }
  // From chunk 2 on: one batch of 4 that fails. Chunk 2 is dropped, 3-5 stay for a later load.
  twin->fail_next = true;
  assert_int_equal(r.cache->retrieve(k, 2, cb, out.data()), 0);
  assert_int_equal(twin->batches, 8);
  assert_false(r.where(1, 2).has_value());
  for (size_t i : {0, 1, 3, 4, 5}) assert_true(r.where(1, i) == Tier::remote);
  assert_int_equal(r.cache->stats().load_failures, 1);
  assert_true(r.intact(1, 4));
  // The leases end while a batch moves the bytes: none of them is returned.
  twin->lose_during = true;
  assert_int_equal(r.cache->retrieve(k, 0, cb, out.data()), 0);
  assert_int_equal(r.cache->stats().revocations, 1);
  assert_false(r.where(1, 0).has_value());
}

// Memory lent by another host is a tier of its own, placed in the chain as configured: new
// chunks fill the chain from the top and victims move one tier down, so with LRU and four chunks
// per tier the oldest chunks end in the lowest tier. Every chunk reads back intact from its tier.
void remote_tier_takes_its_place_in_the_chain(void **) {
  using Chain = std::array<Tier, swiftkv::kTierCount>;
  for (const Chain &chain :
       {swiftkv::kDefaultChain, Chain{Tier::peer, Tier::host, Tier::remote, Tier::disk}}) {
    Rig r(geometry(2, 8, SWIFTKV_DTYPE_F16), 4, 4, 4, swiftkv::EvictionPolicy::lru, 0, 0, "",
          chain);
    const std::shared_ptr<RemoteTwin> twin = borrow_remote_twin(r, 4);
    assert_true(r.cache->configured(Tier::remote, r.fp));
    std::vector<swiftkv::ChunkEvent> events;
    r.cache->set_event_callback([&](const swiftkv::ChunkEvent &e) { events.push_back(e); });
    for (size_t i = 0; i < 16; ++i) {
      ++r.now;
      assert_int_equal(r.store(1, i + 1), i + 1);
    }
    // Chunks 12-15 at the top, 8-11 in the chain's second tier, 4-7 in its third, 0-3 on disk.
    for (size_t i = 0; i < 16; ++i) assert_true(r.where(1, i) == chain[3 - i / 4]);
    const swiftkv::CacheStats s = r.cache->stats();
    for (const Tier t : swiftkv::kTiers) assert_int_equal(s.chunks[static_cast<size_t>(t)], 4);
    assert_int_equal(s.capacity_bytes[static_cast<size_t>(Tier::remote)],
                     4 * r.sizes.full_chunk_bytes);
    // Every demotion went one step down the chain: chunks 4-7 made one each, 8-11 two, 12-15
    // three.
    assert_int_equal(events.size(), 4 * 1 + 4 * 2 + 4 * 3);
    for (const swiftkv::ChunkEvent &e : events) {
      const auto from = std::find(chain.begin(), chain.end(), e.from);
      assert_true(e.to.has_value() && from + 1 != chain.end() && *e.to == *(from + 1));
    }
    r.cache->set_event_callback(nullptr);
    // Reads of the remote tier go through the lender's transfer; the bytes are the chunks'.
    const uint64_t batches = twin->batches;
    for (size_t i = 0; i < 16; ++i) assert_true(r.intact(1, i));
    assert_int_equal(twin->batches, batches + 4);
    // Lookup reports the remote tier by its public number.
    uint8_t codes[16];
    r.cache->lookup(r.keys(1, 16), codes);
    const size_t first_remote = chain[1] == Tier::remote ? 8 : 4;
    for (size_t i = 0; i < 16; ++i) {
      const bool remote = i >= first_remote && i < first_remote + 4;
      assert_true((codes[i] == SWIFTKV_TIER_REMOTE) == remote);
    }
    // A move from the remote tier to host memory goes up or down as the chain says.
    const swiftkv::CacheStats before = r.cache->stats();
    const std::vector<ChunkKey> k = r.keys(1, first_remote + 1);
    assert_int_equal(r.cache->move(std::span(k).subspan(first_remote, 1), Tier::host), 1);
    const swiftkv::CacheStats after = r.cache->stats();
    const bool up = chain[1] == Tier::host;
    // Host memory is full: making room there demotes its victim to the disk (the move itself
    // is the second demotion), or to the remote tier, whose victim goes to the disk.
    assert_int_equal(after.promotions - before.promotions, up ? 1 : 0);
    assert_int_equal(after.demotions - before.demotions, 2);
    assert_true(r.where(1, first_remote) == Tier::host);
  }
}

// A chain must begin with the peer tier, end with the disk and name each tier once.
void tier_chain_is_checked(void **) {
  using Chain = std::array<Tier, swiftkv::kTierCount>;
  for (const Chain &bad : {Chain{Tier::host, Tier::peer, Tier::remote, Tier::disk},
                           Chain{Tier::peer, Tier::remote, Tier::disk, Tier::host},
                           Chain{Tier::peer, Tier::host, Tier::host, Tier::disk}}) {
    swiftkv::Context ctx(swiftkv::ContextConfig{});
    CacheOptions o;
    o.chain = bad;
    o.maintenance_interval_ms = 0;
    try {
      ChunkCache c(ctx, o);
      fail_msg("a chain of the wrong order was taken");
    } catch (const swiftkv::Error &e) {
      assert_int_equal(e.status(), SWIFTKV_EINVAL);
    }
  }
}

void loads_go_before_background_demotion(void **) {
  Rig r(geometry(2, 8, SWIFTKV_DTYPE_F16), 4, 8, 0, swiftkv::EvictionPolicy::lru, 50);
  assert_int_equal(r.store(1, 4), 4);  // host full: under its 50% free mark
  {
    const ChunkCache::LoadScope pending(*r.cache, Tier::host);
    r.cache->maintain();
    assert_int_equal(r.cache->stats().chunks[1], 4);
    assert_int_equal(r.cache->stats().demotions_deferred, 1);
  }
  r.cache->maintain();
  assert_int_equal(r.cache->stats().chunks[1], 2);  // back to 50% free
  assert_int_equal(r.cache->stats().chunks[2], 2);
  assert_true(r.where(1, 0) == Tier::disk);  // the least recently used went
  for (size_t i = 0; i < 4; ++i) assert_true(r.intact(1, i));
}

// Random stores, moves, pins and clears never push a tier past its budget nor corrupt a chunk.
void budgets_hold_under_random_work(void **) {
  Rig r(geometry(2, 8, SWIFTKV_DTYPE_F16), 8, 6, 4, swiftkv::EvictionPolicy::retention, 25);
  std::mt19937 rng(7);
  const uint64_t disk_budget = r.ctx->config().disk_budget_bytes;
  for (int step = 0; step < 300; ++step) {
    r.now += 1 + rng() % 1000;
    const uint32_t seq = rng() % 12;
    const size_t n = 1 + rng() % 4;
    switch (rng() % 6) {
      case 0:
      case 1:
      case 2: r.store(seq, n); break;
      case 3: {
        const auto k = r.keys(seq, n);
        try {
          r.cache->move(k, static_cast<Tier>(rng() % 3));
        } catch (const swiftkv::Error &e) {
          assert_int_equal(e.status(), SWIFTKV_ENOTFOUND);
        }
        break;
      }
      case 4: r.cache->clear(r.fp, 7, std::nullopt); break;
      case 5: r.cache->maintain(); break;
    }
    const swiftkv::CacheStats s = r.cache->stats();
    assert_true(s.bytes[0] <= s.capacity_bytes[0]);
    assert_true(r.ctx->host_reserved() <= r.ctx->config().host_budget_bytes);
    assert_true(s.bytes[1] <= r.ctx->config().host_budget_bytes);
    assert_true(r.cache->disk()->free_bytes({}) <= r.cache->disk()->capacity_bytes({}));
    assert_true(s.chunks[2] * swiftkv::DiskTier::record_bytes(r.sizes.full_chunk_bytes) <=
                r.cache->disk()->capacity_bytes({}));
    assert_true(r.cache->disk()->stats().allocated_bytes <= disk_budget);
  }
  for (uint32_t seq = 0; seq < 12; ++seq) {
    for (size_t i = 0; i < 4; ++i) {
      if (r.where(seq, i)) assert_true(r.intact(seq, i));
    }
  }
}

// A host tier on a budget of 64 chunks of three pages: slabs of an eighth, 8 chunks.
struct SlabRig {
  explicit SlabRig(bool ahead) : ctx(config(bytes)), tier(ctx, uint64_t{1} << 30, ahead) {}
  static swiftkv::ContextConfig config(uint64_t chunk) {
    swiftkv::ContextConfig c;
    c.host_budget_bytes = 64 * chunk;
    return c;
  }
  // The bytes of the tier's slabs once they reach `want`, or after 10 s.
  uint64_t reserved_after_wait(uint64_t want) {
    for (int i = 0; i < 10000 && tier.slab_bytes_reserved() < want; ++i) ::usleep(1000);
    return tier.slab_bytes_reserved();
  }
  // A chunk; before ctx, which it sizes.
  const uint64_t bytes = 3 * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  swiftkv::Context ctx;
  swiftkv::HostTier tier;
};

// Host slabs made ahead on the tier's thread: prepare() makes the first; taking a slab's slots
// past half makes the next; two threads taking slots meanwhile get distinct slots, exactly as
// many as the budget holds, and the budget is never exceeded.
void host_slabs_are_made_ahead(void **) {
  SlabRig r(true);
  const uint64_t bytes = r.bytes;
  swiftkv::Context &ctx = r.ctx;
  swiftkv::HostTier &tier = r.tier;
  const uint64_t budget = ctx.config().host_budget_bytes;
  assert_int_equal(tier.slab_bytes_reserved(), 0);
  tier.prepare(bytes);
  assert_int_equal(r.reserved_after_wait(8 * bytes), 8 * bytes);
  const swiftkv::ChunkMeta meta{ChunkKey{1, 2}, 0, 16, bytes};
  std::vector<uint64_t> slots;
  for (int i = 0; i < 5; ++i) {  // 3 of 8 left: below half
    const std::optional<uint64_t> s = tier.allocate(ChunkKey{}, meta);
    assert_true(s.has_value());
    slots.push_back(*s);
  }
  assert_int_equal(r.reserved_after_wait(16 * bytes), 16 * bytes);
  std::mutex mu;
  auto take_all = [&] {
    while (const std::optional<uint64_t> s = tier.allocate(ChunkKey{}, meta)) {
      std::lock_guard lock(mu);
      slots.push_back(*s);
    }
  };
  std::thread other(take_all);
  take_all();
  other.join();
  assert_int_equal(slots.size(), 64);
  std::set<std::byte *> where;
  for (uint64_t s : slots) where.insert(tier.address(s, nullptr));
  assert_int_equal(where.size(), 64);
  // Slabs are private memory, no fork's child's ("dc"; nobody else maps them).
  assert_true(vm_flags_of(*where.begin()).find(" dc ") != std::string::npos);
  assert_int_equal(tier.slab_bytes_reserved(), 64 * bytes);
  assert_true(ctx.host_reserved() <= budget);
  for (uint64_t s : slots) tier.free(s);
  assert_int_equal(tier.free_bytes(ChunkKey{}), 64 * bytes);
}

// A full host tier asks its thread for no slab: each store into it frees a victim's slot and
// takes it again, and with the budget spent the thread would find nothing to make (it used to be
// asked, and woken, at nearly every such allocation: a context switch per store).
void a_full_host_tier_asks_for_no_slab(void **) {
  SlabRig r(true);
  const uint64_t bytes = r.bytes;
  swiftkv::HostTier &tier = r.tier;
  tier.prepare(bytes);
  assert_int_equal(r.reserved_after_wait(8 * bytes), 8 * bytes);
  const swiftkv::ChunkMeta meta{ChunkKey{1, 2}, 0, 16, bytes};
  std::vector<uint64_t> slots;
  while (slots.size() < 64) {
    if (const std::optional<uint64_t> s = tier.allocate(ChunkKey{}, meta)) slots.push_back(*s);
  }
  assert_false(tier.allocate(ChunkKey{}, meta).has_value());  // full: the budget is spent
  assert_int_equal(tier.slab_bytes_reserved(), 64 * bytes);
  const uint64_t asked = tier.slab_requests();
  for (size_t i = 0; i < 1000; ++i) {
    tier.free(slots[i % 64]);
    const std::optional<uint64_t> s = tier.allocate(ChunkKey{}, meta);
    assert_true(s.has_value());
    slots[i % 64] = *s;
  }
  assert_int_equal(tier.slab_requests(), asked);
  assert_int_equal(tier.slab_bytes_reserved(), 64 * bytes);
  // Budget given back makes the tier ask again: a slab freed is remade when needed.
  for (uint64_t s : slots) tier.free(s);
  assert_int_equal(tier.give_back_empty_slabs(), 64 * bytes);
  assert_true(tier.allocate(ChunkKey{}, meta).has_value());
  assert_true(tier.slab_requests() > asked || tier.slab_bytes_reserved() >= 8 * bytes);
}

// Stores wake the background thread only when it has work: below half its free target, once per
// pass. A host tier of 8 chunks over a disk keeps 4 free (50%): stored one at a time, 40 chunks
// wake it at most once per 2 stored (it used to be notified at every store), and it demotes.
void stores_wake_the_thread_only_for_work(void **) {
  Rig r(geometry(2, 8, SWIFTKV_DTYPE_F16), 8, 64, 0, swiftkv::EvictionPolicy::lru, 50, 3600000);
  for (uint32_t s = 0; s < 40; ++s) assert_int_equal(r.store(100 + s, 1), 1);
  const uint64_t wakes = r.cache->store_wakes();
  assert_true(wakes >= 1);
  assert_true(wakes <= 40 / 2 + 1);
  for (int i = 0; i < 10000 && r.cache->stats().demotions == 0; ++i) ::usleep(1000);
  assert_true(r.cache->stats().demotions >= 1);
  // Without a tier below host memory there is nothing to demote to: no wake-up at all.
  Rig alone(geometry(2, 8, SWIFTKV_DTYPE_F16), 8, 0, 0, swiftkv::EvictionPolicy::lru, 50, 3600000);
  for (uint32_t s = 0; s < 40; ++s) assert_int_equal(alone.store(100 + s, 1), 1);
  assert_int_equal(alone.cache->store_wakes(), 0);
  assert_int_equal(alone.cache->stats().evictions, 32);
}

// The background thread runs its passes only while something comes due by itself. A cache with
// no lease and no disk tier makes no pass at all (it used to wake every interval, 100 times a
// second by default, for nothing); a borrow starts the passes that renew the lease, and once the
// last lease is given back the thread sleeps again.
void an_idle_cache_makes_no_pass(void **) {
  const auto g = geometry(2, 8, SWIFTKV_DTYPE_F16);
  Rig r(g, 8, 0, 0, swiftkv::EvictionPolicy::lru, 0, 5);
  ::usleep(200 * 1000);
  assert_int_equal(r.cache->thread_passes(), 0);
  assert_int_equal(r.store(1, 4), 4);  // stores with room want nothing of the thread
  ::usleep(50 * 1000);
  assert_int_equal(r.cache->thread_passes(), 0);

  swiftkv::ElasticConfig e;
  e.lender = g;
  e.borrower = g;
  const swiftkv::LendUnit u = swiftkv::lend_unit(r.sizes, r.sizes);
  e.capacity_blocks = 8 / u.borrower_chunks * u.lender_blocks;
  e.owned_blocks = 0;
  e.lease_ns = 300'000'000;  // lost within a second unless the passes renew it
  swiftkv::HostRegionOptions ho;
  ho.size = swiftkv::ElasticRegion::required_bytes(e);
  auto lender = std::make_shared<swiftkv::ElasticRegion>(e, swiftkv::create_host_region(ho));
  r.cache->borrow(r.fp, r.sizes, swiftkv::local_lender(lender), UINT64_MAX);
  ::usleep(1000 * 1000);
  assert_true(r.cache->thread_passes() >= 20);  // every 5 ms, give or take a loaded machine
  assert_int_equal(lender->stats().leases, 1);
  assert_int_equal(lender->stats().leases_expired, 0);

  // Asked back: the cache evacuates and releases it, then has nothing due.
  lender->reclaim(swiftkv::ElasticRegion::kAllLeases);
  for (int i = 0; i < 5000 && lender->stats().leases != 0; ++i) ::usleep(1000);
  assert_int_equal(lender->stats().leases, 0);
  ::usleep(100 * 1000);  // the pass that saw the last lease go
  const uint64_t settled = r.cache->thread_passes();
  ::usleep(200 * 1000);
  assert_int_equal(r.cache->thread_passes(), settled);
}

// A disk tier makes passes due only while records wait for their group commit: the first
// record written after a commit wakes the thread, which sleeps until the commit is due (not a
// pass every interval before it, nor after it). It used to pass every interval for as long as
// the context had a disk tier, idle or not.
void a_disk_tier_wakes_the_thread_for_its_commits_only(void **) {
  const auto g = geometry(2, 8, SWIFTKV_DTYPE_F16);
  constexpr uint64_t kSyncNs = 50'000'000;
  Rig r(g, 0, 8, 0, swiftkv::EvictionPolicy::lru, 0, 5, "", swiftkv::kDefaultChain, kSyncNs);
  const swiftkv::DiskTier &disk = *r.cache->disk();
  // Whatever opening the tier wrote is committed once; then nothing is due.
  for (int i = 0; i < 5000 && disk.due_ns() != 0; ++i) ::usleep(1000);
  assert_int_equal(disk.due_ns(), 0);
  ::usleep(20 * 1000);
  const uint64_t idle = r.cache->thread_passes();
  const uint64_t syncs = disk.stats().syncs;
  ::usleep(200 * 1000);  // 40 intervals
  assert_int_equal(r.cache->thread_passes(), idle);

  for (uint32_t round = 1; round <= 2; ++round) {
    const uint64_t before = swiftkv::monotonic_ns();
    assert_int_equal(r.store(round, 4), 4);  // on disk: the host tier has no budget
    const uint64_t due = disk.due_ns();
    assert_true(due >= before + kSyncNs);  // the clock starts at the first record written
    assert_true(due <= swiftkv::monotonic_ns() + kSyncNs);
    for (int i = 0; i < 5000 && disk.stats().syncs == syncs + round - 1; ++i) ::usleep(1000);
    assert_int_equal(disk.stats().syncs, syncs + round);  // one commit for the four records
    assert_true(swiftkv::monotonic_ns() >= due);
    assert_int_equal(disk.due_ns(), 0);
    // The pass the first record asked for, the one at the commit, and at most one more on a
    // loaded machine; an interval's passes until the commit would be ten.
    ::usleep(20 * 1000);
    const uint64_t passes = r.cache->thread_passes();
    assert_true(passes - idle <= 3 * round);
    ::usleep(200 * 1000);
    assert_int_equal(r.cache->thread_passes(), passes);
    assert_int_equal(disk.stats().syncs, syncs + round);
  }
}

// The room kept for evacuations: keep_room has the thread make slabs until that many slots are
// free (with or without slabs ahead), no further than the budget; allocations taking the room do
// not make more on their own (an evacuation is taking it), a later keep_room does.
void host_room_is_kept(void **) {
  SlabRig r(false);
  const uint64_t bytes = r.bytes;
  swiftkv::Context &ctx = r.ctx;
  swiftkv::HostTier &tier = r.tier;
  const uint64_t budget = ctx.config().host_budget_bytes;
  tier.keep_room(bytes, 20);
  assert_int_equal(r.reserved_after_wait(24 * bytes), 24 * bytes);  // 3 slabs: 24 >= 20 free
  ::usleep(20000);
  assert_int_equal(tier.slab_bytes_reserved(), 24 * bytes);
  const swiftkv::ChunkMeta meta{ChunkKey{1, 2}, 0, 16, bytes};
  std::vector<uint64_t> slots;
  for (int i = 0; i < 20; ++i) slots.push_back(*tier.allocate(ChunkKey{}, meta));
  ::usleep(20000);
  assert_int_equal(tier.slab_bytes_reserved(), 24 * bytes);  // 4 free: nothing made meanwhile
  tier.keep_room(bytes, 20);
  assert_int_equal(r.reserved_after_wait(40 * bytes), 40 * bytes);  // 4 + 16: 20 free
  tier.keep_room(bytes, 1000);  // past the budget: as much as it holds, and no more
  assert_int_equal(r.reserved_after_wait(64 * bytes), 64 * bytes);
  ::usleep(20000);
  assert_int_equal(tier.slab_bytes_reserved(), 64 * bytes);
  assert_true(ctx.host_reserved() <= budget);
  for (uint64_t s : slots) tier.free(s);
  assert_int_equal(tier.free_bytes(ChunkKey{}), 64 * bytes);
}

// Empty slabs give their budget back on demand: one asked for and maybe being made when the
// call comes (it waits for it, and nothing is made after), one made ahead; a slab holding a slot
// stays, its bytes untouched, and the tier makes slabs again afterwards.
void empty_slabs_give_their_budget_back(void **) {
  SlabRig r(true);
  const uint64_t bytes = r.bytes;
  swiftkv::Context &ctx = r.ctx;
  swiftkv::HostTier &tier = r.tier;
  for (int round = 0; round < 20; ++round) {
    tier.prepare(bytes);
    const uint64_t given = tier.give_back_empty_slabs();
    assert_true(given == 0 || given == 8 * bytes);
    assert_int_equal(tier.slab_bytes_reserved(), 0);
  }
  ::usleep(20000);
  assert_int_equal(tier.slab_bytes_reserved(), 0);
  assert_int_equal(ctx.host_reserved(), 0);
  tier.prepare(bytes);
  assert_int_equal(r.reserved_after_wait(8 * bytes), 8 * bytes);
  const swiftkv::ChunkMeta meta{ChunkKey{1, 2}, 0, 16, bytes};
  std::vector<uint64_t> slots;
  for (int i = 0; i < 5; ++i) slots.push_back(*tier.allocate(ChunkKey{}, meta));  // 3 of 8 left
  assert_int_equal(r.reserved_after_wait(16 * bytes), 16 * bytes);                // the next
  for (uint64_t s : slots) std::memset(tier.address(s, nullptr), static_cast<int>(s & 0xff), bytes);
  assert_int_equal(tier.give_back_empty_slabs(), 8 * bytes);
  assert_int_equal(tier.slab_bytes_reserved(), 8 * bytes);
  assert_int_equal(ctx.host_reserved(), 8 * bytes);
  for (uint64_t s : slots) {
    const std::byte *p = tier.address(s, nullptr);
    for (uint64_t i = 0; i < bytes; ++i) assert_int_equal(static_cast<int>(p[i]), s & 0xff);
  }
  for (int i = 0; i < 3; ++i) slots.push_back(*tier.allocate(ChunkKey{}, meta));  // the slab full
  const std::optional<uint64_t> again = tier.allocate(ChunkKey{}, meta);  // a slab made again
  assert_true(again.has_value());
  assert_true(tier.slab_bytes_reserved() >= 16 * bytes);
  assert_int_equal(tier.give_back_empty_slabs(), 0);  // both hold a slot
  tier.free(*again);
  for (uint64_t s : slots) tier.free(s);
  const uint64_t held = tier.slab_bytes_reserved();
  assert_int_equal(tier.give_back_empty_slabs(), held);
  assert_int_equal(tier.slab_bytes_reserved(), 0);
  assert_int_equal(ctx.host_reserved(), 0);
}

// A store short of budget while the thread makes a slab of another size ahead: the store waits
// for that slab and takes its budget back (it is empty), every time. The budget (8 pages) holds
// one slab of either size (5 pages, 4 pages: chunks past an eighth get a slab each), not both.
void a_store_takes_the_budget_of_a_slab_made_meanwhile(void **) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  swiftkv::ContextConfig c;
  c.host_budget_bytes = 8 * page;
  swiftkv::Context ctx(c);
  swiftkv::HostTier tier(ctx, uint64_t{1} << 30, true);
  const swiftkv::ChunkMeta meta{ChunkKey{1, 2}, 0, 16, 4 * page};
  for (int round = 0; round < 200; ++round) {
    tier.prepare(5 * page);
    const std::optional<uint64_t> slot = tier.allocate(ChunkKey{}, meta);
    assert_true(slot.has_value());
    assert_true(ctx.host_reserved() <= c.host_budget_bytes);
    tier.free(*slot);
    tier.give_back_empty_slabs();
    assert_int_equal(ctx.host_reserved(), 0);
  }
}

// A borrowed lease makes the host tier ready for its evacuation: as soon as it is borrowed, host
// slabs for every chunk it can hold are made (before anything is stored), and a reclaim then
// moves every chunk into them, exact.
void borrowing_makes_room_for_the_evacuation(void **) {
  Rig r(geometry(2, 8, SWIFTKV_DTYPE_F16), 16, 0, 8);
  const uint64_t want = 8 * r.sizes.full_chunk_bytes;
  for (int i = 0; i < 10000 && r.ctx->host_reserved() < want; ++i) ::usleep(1000);
  assert_true(r.ctx->host_reserved() >= want);
  assert_int_equal(r.store(3, 8), 8);
  for (size_t i = 0; i < 8; ++i) assert_true(r.where(3, i) == Tier::peer);
  r.lender->reclaim(swiftkv::ElasticRegion::kAllLeases);
  r.cache->maintain();
  for (size_t i = 0; i < 8; ++i) {
    assert_true(r.where(3, i) == Tier::host);
    assert_true(r.intact(3, i));
  }
  assert_int_equal(r.lender->stats().lent_blocks, 0);
}

// Lookups, stores, loads, moves, clears and pins from several threads while the background
// thread demotes and keeps the leases. Every chunk a reader gets has exactly its bytes.
void concurrent_use(void **) {
  Rig r(geometry(2, 8, SWIFTKV_DTYPE_F16), 8, 8, 4, swiftkv::EvictionPolicy::lru, 25, 1);
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int i = 0; i < 150; ++i) {
        const uint32_t seq = rng() % 6;
        const size_t n = 1 + rng() % 3;
        try {
          switch ((rng() + t) % 5) {
            case 0:
            case 1: r.store(seq, n); break;
            case 2:
              for (size_t c = 0; c < n; ++c) {
                const auto k = r.keys(seq, c + 1);
                std::vector<std::byte> out(r.sizes.full_chunk_bytes);
                if (r.cache->retrieve(k, c, out.size(), out.data()) == 1 &&
                    out != chunk_bytes(out.size(), seq, c)) {
                  ++bad;
                }
              }
              break;
            case 3: r.cache->move(r.keys(seq, n), static_cast<Tier>(rng() % 3)); break;
            case 4:
              if (rng() % 2) {
                r.cache->clear(std::nullopt, 7, std::nullopt);
              } else {
                r.cache->pin(r.keys(seq, n));
                r.cache->unpin(r.keys(seq, n));
              }
              break;
          }
        } catch (const swiftkv::Error &e) {
          if (e.status() != SWIFTKV_ENOTFOUND) ++bad;
        }
      }
    });
  }
  for (auto &th : threads) th.join();
  assert_int_equal(bad.load(), 0);
  r.cache->maintain();
  const swiftkv::CacheStats s = r.cache->stats();
  assert_true(s.bytes[1] <= r.ctx->config().host_budget_bytes);
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(keys_chain_over_the_prefix),
      cmocka_unit_test(fingerprint_covers_the_kv_shape),
      cmocka_unit_test(index_keeps_every_key_through_collisions_drops_and_growth),
      cmocka_unit_test(index_frees_moved_and_dropped_copies_after_their_last_reader),
      cmocka_unit_test(index_memory_per_chunk_is_as_documented),
      cmocka_unit_test(a_growing_index_holds_its_live_tables),
      cmocka_unit_test(large_tables_are_aligned_and_give_pages_back),
      cmocka_unit_test(host_regions_ask_for_huge_pages_when_told),
      cmocka_unit_test(private_host_regions_stay_in_their_process),
      cmocka_unit_test(a_chunk_being_read_is_nobodys_victim),
      cmocka_unit_test(lru_order),
      cmocka_unit_test(retention_prefers_idle_conversations_and_leading_chunks),
      cmocka_unit_test(freed_nodes_go_to_chunks_of_their_class),
      cmocka_unit_test(cost_table_interpolates_between_powers_of_two),
      cmocka_unit_test(eviction_order_matches_a_scan),
      cmocka_unit_test(victims_in_one_pass_match_victims_in_turn),
      cmocka_unit_test(a_full_last_tier_evicts_a_stores_room_at_once),
      cmocka_unit_test(cache_evicts_in_the_exact_order),
      cmocka_unit_test(bytes_survive_every_tier_and_path),
      cmocka_unit_test(demotion_chain_ends_in_drop),
      cmocka_unit_test(a_tier_being_read_keeps_its_chunks),
      cmocka_unit_test(pinned_chunks_are_never_evicted),
      cmocka_unit_test(lookup_reports_a_dropped_head),
      cmocka_unit_test(lookup_reports_the_longest_run),
      cmocka_unit_test(retention_eviction_in_the_cache),
      cmocka_unit_test(restart_finds_disk_chunks_and_rejects_corrupt_ones),
      cmocka_unit_test(disk_skips_what_is_not_a_segment),
      cmocka_unit_test(disk_never_returns_another_record),
      cmocka_unit_test(disk_record_of_the_wrong_size_is_dropped),
      cmocka_unit_test(disk_survives_sigkill_while_storing),
      cmocka_unit_test(disk_full_lives_within_its_segments),
      cmocka_unit_test(a_full_filesystem_shrinks_the_disk_tier_to_what_it_gave),
      cmocka_unit_test(a_room_given_up_does_not_end_the_log),
      cmocka_unit_test(kills_while_cleaning_lose_no_moved_chunk),
      cmocka_unit_test(disk_reads_large_records_in_pieces),
      cmocka_unit_test(disk_reads_many_records_at_once),
      cmocka_unit_test(disk_cleaning_moves_records_under_readers),
      cmocka_unit_test(reclaimed_leases_are_evacuated_then_released),
      cmocka_unit_test(a_lost_lease_drops_its_chunks),
      cmocka_unit_test(remote_reads_go_as_one_batch),
      cmocka_unit_test(remote_tier_takes_its_place_in_the_chain),
      cmocka_unit_test(tier_chain_is_checked),
      cmocka_unit_test(loads_go_before_background_demotion),
      cmocka_unit_test(budgets_hold_under_random_work),
      cmocka_unit_test(host_slabs_are_made_ahead),
      cmocka_unit_test(host_room_is_kept),
      cmocka_unit_test(a_full_host_tier_asks_for_no_slab),
      cmocka_unit_test(stored_bounds_hold_every_size),
      cmocka_unit_test(a_batch_of_victims_takes_what_the_bytes_need),
      cmocka_unit_test(a_store_from_an_eviction_callback_evicts_in_a_pass_of_its_own),
      cmocka_unit_test(stores_wake_the_thread_only_for_work),
      cmocka_unit_test(an_idle_cache_makes_no_pass),
      cmocka_unit_test(a_disk_tier_wakes_the_thread_for_its_commits_only),
      cmocka_unit_test(empty_slabs_give_their_budget_back),
      cmocka_unit_test(a_store_takes_the_budget_of_a_slab_made_meanwhile),
      cmocka_unit_test(borrowing_makes_room_for_the_evacuation),
      cmocka_unit_test(concurrent_use),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
