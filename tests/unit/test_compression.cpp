// Compression in the chunk cache: fixed codecs per tier, budgets that count the bytes stored,
// lossy chunks returned only where accepted (and then exactly what the codec decodes), encoded
// records that survive a restart, demotion that encodes on the way down, and the controller's
// compress with its statuses and unchanged state on bad input.
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <csetjmp>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <xxhash.h>

#include "core/codec/chunk_codec.hpp"
#include "core/common/error.hpp"
#include "core/geometry/model_geometry.hpp"
#include "core/index/chunk_key.hpp"
#include "core/tiers/chunk_cache.hpp"
#include "core/tiers/disk_tier.hpp"
#include "synthetic_kv.hpp"

// cmocka last: it defines a `fail` macro that the core's headers must not see.
extern "C" {
#include <cmocka.h>
}

namespace {

namespace cd = swiftkv::codec;
using swiftkv::ChunkCache;
using swiftkv::ChunkKey;
using swiftkv::Tier;

cd::CodecParams kivi(uint32_t bits, uint32_t group) {
  cd::CodecParams p;
  p.codec = cd::Codec::kivi;
  p.bits = bits;
  p.group = group;
  return p;
}
cd::CodecParams fp8() {
  cd::CodecParams p;
  p.codec = cd::Codec::fp8;
  return p;
}
cd::CodecParams zstd_planes() {
  cd::CodecParams p;
  p.codec = cd::Codec::zstd;
  p.byte_planes = true;
  return p;
}

// 2 layers, 2 KV heads of 64, f16, 16-token chunks: 16 KiB a chunk.
struct Rig {
  swiftkv::ModelGeometry g;
  swiftkv::GeometrySizes sizes;
  cd::ChunkShape shape;
  ChunkKey fp;
  std::string dir;
  std::unique_ptr<swiftkv::Context> ctx;
  std::unique_ptr<ChunkCache> cache;

  uint64_t clock_ns = 1'000'000'000;  // the cache's clock with manual_clock

  Rig(uint64_t host_chunks, uint64_t disk_bytes, std::string reuse_dir = "",
      bool manual_clock = false, uint64_t host_extra_bytes = 0) {
    g.num_layers = 2;
    g.num_kv_heads = 2;
    g.head_dim = 64;
    g.block_tokens = 4;
    g.chunk_tokens = 16;
    sizes = swiftkv::geometry_sizes(g, "g");
    shape = cd::ChunkShape{2, 16, 2, 64, SWIFTKV_DTYPE_F16};
    fp = swiftkv::model_fingerprint("m", g);
    swiftkv::ContextConfig c;
    c.host_budget_bytes = host_chunks * sizes.full_chunk_bytes + host_extra_bytes;
    if (disk_bytes != 0) {
      if (reuse_dir.empty()) {
        char t[] = "/tmp/swiftkv-compress-XXXXXX";
        assert_non_null(mkdtemp(t));
        dir = t;
      } else {
        dir = reuse_dir;
      }
      c.disk_path = dir;
      c.disk_budget_bytes = disk_bytes;
      c.disk_segment_bytes = disk_bytes / 4;
    }
    ctx = std::make_unique<swiftkv::Context>(c);
    swiftkv::CacheOptions o;
    o.policy = swiftkv::EvictionPolicy::lru;
    o.demote_free_percent = 0;
    o.host_slab_bytes = std::max<uint64_t>(c.host_budget_bytes / 8, 4096);
    o.maintenance_interval_ms = 0;
    if (manual_clock) o.clock = [this] { return clock_ns; };
    cache = std::make_unique<ChunkCache>(*ctx, o);
    set({}, false);
  }
  ~Rig() {
    cache.reset();
    if (!dir.empty() && !keep_dir) std::filesystem::remove_all(dir);
  }
  bool keep_dir = false;

  void set(std::array<std::optional<cd::CodecParams>, swiftkv::kTierCount> fixed,
           bool accept_lossy) {
    swiftkv::ModelCompression m;
    m.shape = shape;
    m.fixed = fixed;
    m.accept_lossy = accept_lossy;
    cache->set_compression(fp, m);
  }
  // Adaptive mode with `methods` (none: the default set); recompute_bandwidth 0: the default.
  void adaptive(double alpha, std::vector<swiftkv::AdaptiveMethod> methods = {},
                double recompute_bandwidth = 0) {
    swiftkv::ModelCompression m;
    m.shape = shape;
    m.accept_lossy = true;
    m.adaptive.enabled = true;
    m.adaptive.alpha = alpha;
    m.adaptive.methods = std::move(methods);
    if (recompute_bandwidth > 0) m.adaptive.recompute_bandwidth = recompute_bandwidth;
    cache->set_compression(fp, m);
  }
  std::vector<ChunkKey> keys(uint32_t seq, size_t n) const {
    std::vector<uint32_t> t(n * g.chunk_tokens);
    for (size_t i = 0; i < t.size(); ++i) t[i] = seq * 100000u + static_cast<uint32_t>(i);
    std::vector<ChunkKey> k(n);
    swiftkv::chunk_keys(k.data(), fp, t.data(), t.size(), g.chunk_tokens);
    return k;
  }
  std::vector<std::byte> kv(uint32_t seq, size_t i) const {
    return synthetic_kv(shape, seq * 64 + i);
  }
  uint64_t store(uint32_t seq, size_t n) {
    std::vector<std::byte> all;
    for (size_t i = 0; i < n; ++i) {
      const std::vector<std::byte> b = kv(seq, i);
      all.insert(all.end(), b.begin(), b.end());
    }
    return cache->store(fp, keys(seq, n), g.chunk_tokens, sizes.full_chunk_bytes, all.data());
  }
  // Chunk i of seq as retrieve gives it, or nullopt when it does not.
  std::optional<std::vector<std::byte>> load(uint32_t seq, size_t i) {
    std::vector<std::byte> out(sizes.full_chunk_bytes);
    if (cache->retrieve(keys(seq, i + 1), i, sizes.full_chunk_bytes, out.data()) != 1) {
      return std::nullopt;
    }
    return out;
  }
  swiftkv::ChunkView view(uint32_t seq, size_t i) const {
    const std::optional<swiftkv::ChunkView> v = cache->view(keys(seq, i + 1)[i]);
    assert_true(v.has_value());
    return *v;
  }
  // What a lossy codec gives back for chunk i of seq.
  std::vector<std::byte> round_trip(uint32_t seq, size_t i, const cd::CodecParams &p) const {
    const std::vector<std::byte> frame = cd::encode(shape, p, kv(seq, i));
    std::vector<std::byte> out(shape.bytes());
    cd::decode(frame, shape, out);
    return out;
  }
  uint64_t frame_bytes(const cd::CodecParams &p) const {
    return cd::encode(shape, p, kv(1, 0)).size();
  }
};

size_t ci(cd::Codec c) { return static_cast<size_t>(c); }
size_t ti(Tier t) { return static_cast<size_t>(t); }

// A host budget of 16 raw chunks holds twice as many under KIVI 4-bit, and counts their frames.
void fixed_host_codec_counts_stored_bytes(void **) {
  Rig raw(16, 0);
  assert_int_equal(raw.store(1, 40), 40);  // no lower tier: each store past 16 evicts one
  assert_int_equal(raw.cache->stats().chunks[ti(Tier::host)], 16);
  assert_int_equal(raw.cache->stats().evictions, 24);
  Rig r(16, 0);
  const cd::CodecParams k4 = kivi(4, 16);
  r.set({std::nullopt, k4, std::nullopt}, true);
  assert_int_equal(r.store(1, 32), 32);
  const swiftkv::CacheStats s = r.cache->stats();
  assert_int_equal(s.chunks[ti(Tier::host)], 32);
  assert_int_equal(s.evictions, 0);
  assert_int_equal(s.bytes[ti(Tier::host)], 32 * r.frame_bytes(k4));
  assert_int_equal(s.codecs.chunks[ci(cd::Codec::kivi)][ti(Tier::host)], 32);
  assert_int_equal(s.codecs.raw_bytes[ci(cd::Codec::kivi)][ti(Tier::host)],
                   32 * r.sizes.full_chunk_bytes);
  assert_int_equal(s.codecs.stored_bytes[ci(cd::Codec::kivi)][ti(Tier::host)],
                   32 * r.frame_bytes(k4));
  assert_int_equal(s.encodes, 32);
  const swiftkv::ChunkView v = r.view(1, 7);
  assert_true(v.meta.lossy());
  assert_int_equal(v.meta.bytes, r.sizes.full_chunk_bytes);
  assert_int_equal(v.meta.stored(), r.frame_bytes(k4));
}

// A lossy chunk is returned only to a model that accepts it, and then it is exactly what the
// codec decodes: not the original bytes.
void lossy_only_where_accepted(void **) {
  Rig r(16, 0);
  const cd::CodecParams k2 = kivi(2, 32);
  r.set({std::nullopt, k2, std::nullopt}, true);
  assert_int_equal(r.store(2, 3), 3);
  r.set({}, false);  // the model takes exact bytes again; what it stored stays lossy
  assert_false(r.load(2, 1).has_value());
  assert_int_equal(r.cache->stats().lossy_refused, 1);
  assert_int_equal(r.cache->stats().load_failures, 0);
  assert_true(r.cache->resident(r.keys(2, 2)[1]));  // refused, not dropped
  r.set({std::nullopt, k2, std::nullopt}, true);
  const std::optional<std::vector<std::byte>> got = r.load(2, 1);
  assert_true(got.has_value());
  assert_true(*got == r.round_trip(2, 1, k2));
  assert_false(*got == r.kv(2, 1));
  assert_int_equal(r.cache->stats().decodes, 1);
}

// Demotion encodes a chunk as the lower tier asks; a lossy chunk moved back up stays as it is.
void demotion_encodes_on_the_way_down(void **) {
  Rig r(2, uint64_t{4} << 20);
  r.set({std::nullopt, std::nullopt, fp8()}, true);
  assert_int_equal(r.store(3, 6), 6);
  const swiftkv::CacheStats s = r.cache->stats();
  assert_int_equal(s.chunks[ti(Tier::host)], 2);
  assert_int_equal(s.codecs.chunks[ci(cd::Codec::fp8)][ti(Tier::disk)], 4);
  assert_int_equal(s.codecs.chunks[ci(cd::Codec::raw)][ti(Tier::host)], 2);
  // The first four went down (LRU); the host keeps the last two, exact.
  assert_true(*r.load(3, 5) == r.kv(3, 5));
  assert_true(*r.load(3, 0) == r.round_trip(3, 0, fp8()));
  // Up again: the host takes it as it is (fp8), never re-encoded nor passed off as exact.
  assert_int_equal(r.cache->move(r.keys(3, 1), Tier::host), 1);
  const swiftkv::ChunkView v = r.view(3, 0);
  assert_int_equal(static_cast<int>(v.where.tier), static_cast<int>(Tier::host));
  assert_int_equal(v.meta.codec_index(), ci(cd::Codec::fp8));
  assert_true(*r.load(3, 0) == r.round_trip(3, 0, fp8()));
}

// Encoded disk records come back after a restart with their encoding, and decode exactly.
void encoded_records_survive_a_restart(void **) {
  if (!cd::zstd_available()) {
    Rig r(0, uint64_t{4} << 20);
    try {
      r.set({std::nullopt, std::nullopt, zstd_planes()}, false);
      fail_msg("zstd set on a build without it");
    } catch (const swiftkv::Error &e) {
      assert_int_equal(e.status(), SWIFTKV_EUNSUPPORTED);
    }
    return;
  }
  std::string dir;
  uint64_t stored = 0;
  {
    Rig r(0, uint64_t{4} << 20);
    r.keep_dir = true;
    dir = r.dir;
    r.set({std::nullopt, std::nullopt, zstd_planes()}, false);
    assert_int_equal(r.store(4, 5), 5);
    const swiftkv::CacheStats s = r.cache->stats();
    assert_int_equal(s.codecs.chunks[ci(cd::Codec::zstd)][ti(Tier::disk)], 5);
    stored = s.bytes[ti(Tier::disk)];
    assert_true(stored < 5 * r.sizes.full_chunk_bytes);
    for (size_t i = 0; i < 5; ++i) assert_true(*r.load(4, i) == r.kv(4, i));
  }
  Rig again(0, uint64_t{4} << 20, dir);
  const swiftkv::CacheStats s = again.cache->stats();
  assert_int_equal(s.codecs.chunks[ci(cd::Codec::zstd)][ti(Tier::disk)], 5);
  assert_int_equal(s.bytes[ti(Tier::disk)], stored);
  assert_false(again.view(4, 2).meta.lossy());
  for (size_t i = 0; i < 5; ++i) assert_true(*again.load(4, i) == again.kv(4, i));
}

// Kivi and fp8 are lossy by definition: a chunk stored under either is lossy whatever its lossy
// bit says. A kivi record on disk whose bit was cleared (its checksum made right again) is one
// the library never writes: corrupt, dropped at recovery, never returned as exact bytes. The
// records around it still load.
void a_lossy_record_passed_off_as_exact_is_dropped(void **) {
  for (uint32_t c = 0; c < swiftkv::kCodecCount; ++c) {
    const bool by_bits = ((swiftkv::kLossyCodecBits >> c) & 1u) != 0;
    assert_true(by_bits == !cd::lossless(static_cast<cd::Codec>(c)));
  }
  const cd::CodecParams k4 = kivi(4, 32);
  swiftkv::ChunkMeta cleared;
  cleared.encoding = swiftkv::encoding_of(k4, false) & ~swiftkv::kEncodingLossy;
  assert_true(cleared.lossy());
  assert_false(swiftkv::encoding_consistent(cleared.encoding));
  assert_true(swiftkv::encoding_consistent(swiftkv::encoding_of(k4, false)));
  assert_true(swiftkv::encoding_consistent(swiftkv::kEncodingLossy));  // raw after a lossy codec

  std::string dir;
  {
    Rig r(0, uint64_t{4} << 20);
    r.keep_dir = true;
    dir = r.dir;
    r.set({std::nullopt, std::nullopt, k4}, true);
    assert_int_equal(r.store(8, 3), 3);
    const swiftkv::ChunkView v = r.view(8, 1);
    assert_int_equal(static_cast<int>(v.where.tier), static_cast<int>(Tier::disk));
    const swiftkv::DiskTier::Location at = r.cache->disk()->location_of(v.where.slot);
    std::fstream f(at.path, std::ios::in | std::ios::out | std::ios::binary);
    char h[128];
    f.seekg(static_cast<std::streamoff>(at.offset));
    f.read(h, sizeof h);
    uint32_t enc = 0;
    std::memcpy(&enc, h + 112, 4);
    assert_int_equal(enc, swiftkv::encoding_of(k4, false));
    enc &= ~swiftkv::kEncodingLossy;
    std::memcpy(h + 112, &enc, 4);
    char summed[128];
    std::memcpy(summed, h, sizeof h);
    std::memset(summed + 20, 0, 4);  // `dead` is outside the checksum
    const uint64_t sum = XXH3_64bits(summed, 120);
    std::memcpy(h + 120, &sum, 8);
    f.seekp(static_cast<std::streamoff>(at.offset));
    f.write(h, sizeof h);
  }
  Rig again(0, uint64_t{4} << 20, dir);  // a model that takes exact bytes only
  const swiftkv::CacheStats s = again.cache->stats();
  assert_int_equal(s.chunks[ti(Tier::disk)], 2);
  assert_int_equal(s.corrupt_files_removed, 1);
  assert_false(again.cache->resident(again.keys(8, 2)[1]));
  assert_false(again.load(8, 1).has_value());
  assert_false(again.load(8, 2).has_value());  // lossy, refused
  again.set({}, true);
  assert_true(*again.load(8, 2) == again.round_trip(8, 2, k4));
  assert_true(*again.load(8, 0) == again.round_trip(8, 0, k4));
}

// compress: re-encodes in place; raw decodes (a lossy chunk stays lossy); a missing chunk is
// ENOTFOUND and bad parameters EINVAL, each with nothing changed.
void compress_in_place(void **) {
  Rig r(16, 0);
  r.set({}, true);
  assert_int_equal(r.store(5, 4), 4);
  const std::vector<ChunkKey> k = r.keys(5, 4);
  assert_int_equal(r.cache->compress(r.fp, k, fp8()), 4);
  assert_int_equal(r.view(5, 3).meta.codec_index(), ci(cd::Codec::fp8));
  assert_int_equal(r.cache->stats().bytes[ti(Tier::host)], 4 * r.frame_bytes(fp8()));
  assert_true(*r.load(5, 3) == r.round_trip(5, 3, fp8()));

  std::vector<ChunkKey> with_missing = r.keys(5, 2);
  with_missing.push_back(r.keys(6, 1)[0]);
  try {
    r.cache->compress(r.fp, with_missing, cd::CodecParams{});
    fail_msg("a missing chunk was compressed");
  } catch (const swiftkv::Error &e) {
    assert_int_equal(e.status(), SWIFTKV_ENOTFOUND);
  }
  try {
    r.cache->compress(r.fp, k, kivi(3, 16));
    fail_msg("kivi 3 bits accepted");
  } catch (const swiftkv::Error &e) {
    assert_int_equal(e.status(), SWIFTKV_EINVAL);
  }
  assert_int_equal(r.view(5, 0).meta.codec_index(), ci(cd::Codec::fp8));

  assert_int_equal(r.cache->compress(r.fp, k, cd::CodecParams{}), 4);  // decoded again
  const swiftkv::ChunkView v = r.view(5, 3);
  assert_int_equal(v.meta.codec_index(), ci(cd::Codec::raw));
  assert_true(v.meta.lossy());
  assert_int_equal(v.meta.stored(), r.sizes.full_chunk_bytes);
  assert_true(*r.load(5, 3) == r.round_trip(5, 3, fp8()));
  assert_int_equal(r.cache->stats().codecs.chunks[ci(cd::Codec::raw)][ti(Tier::host)], 4);
}

// The fixed codecs are checked: none on the peer tier, none the shape does not take.
void bad_compression_is_refused(void **) {
  Rig r(4, 0);
  swiftkv::ModelCompression m;
  m.shape = r.shape;
  m.fixed[0] = fp8();
  try {
    r.cache->set_compression(r.fp, m);
    fail_msg("a codec on the peer tier");
  } catch (const swiftkv::Error &e) {
    assert_int_equal(e.status(), SWIFTKV_EINVAL);
  }
  m.fixed[0].reset();
  m.fixed[1] = kivi(4, 512);
  try {
    r.cache->set_compression(r.fp, m);
    fail_msg("kivi group 512");
  } catch (const swiftkv::Error &e) {
    assert_int_equal(e.status(), SWIFTKV_EINVAL);
  }
  // A lossy codec, on either tier, for a model that takes exact bytes only.
  for (const size_t slot : {ti(Tier::host), ti(Tier::disk)}) {
    swiftkv::ModelCompression lossy;
    lossy.shape = r.shape;
    lossy.fixed[slot] = kivi(4, 32);
    try {
      r.cache->set_compression(r.fp, lossy);
      fail_msg("a lossy codec for exact bytes");
    } catch (const swiftkv::Error &e) {
      assert_int_equal(e.status(), SWIFTKV_EINVAL);
      assert_non_null(std::strstr(e.what(), "exact bytes only"));
    }
  }
  try {
    r.cache->compress(r.fp, r.keys(7, 1), fp8());
    fail_msg("a lossy compress for exact bytes");
  } catch (const swiftkv::Error &e) {
    assert_int_equal(e.status(), SWIFTKV_EINVAL);  // the parameters, before the chunks
  }
  // Nothing changed: chunks still go to the host as they are.
  assert_int_equal(r.store(7, 1), 1);
  assert_int_equal(r.view(7, 0).meta.encoding, 0);
}

// Adaptive mode keeps every chunk exact while its tier has room: the price of a byte is 0, and
// a method's loss of quality and its decode time on this CPU cost more than the bytes it saves
// on the link.
void adaptive_keeps_chunks_exact_while_there_is_room(void **) {
  Rig r(16, 0);
  r.adaptive(1.0);
  assert_int_equal(r.store(20, 8), 8);
  const swiftkv::CacheStats s = r.cache->stats();
  assert_int_equal(s.codecs.chunks[ci(cd::Codec::raw)][ti(Tier::host)], 8);
  assert_int_equal(s.encodes, 0);
  assert_true(s.price[ti(Tier::host)] == 0);
  for (size_t i = 0; i < 8; ++i) assert_true(*r.load(20, i) == r.kv(20, i));
  // The methods were measured on the first chunk: what the policy knows of each.
  const swiftkv::AdaptivePolicy a = r.cache->compression(r.fp)->adaptive;
  assert_true(a.measured);
  for (const swiftkv::AdaptiveMethod &m : a.methods) {
    assert_true(m.ratio > 0 && m.ratio < 1);
    assert_true(m.measured_quality > 0 && m.measured_quality <= 1);
    if (cd::lossless(m.params.codec)) assert_true(m.measured_quality == 1);
  }
}

// A method as an engine that decodes on its GPU describes it: decoding costs next to nothing.
swiftkv::AdaptiveMethod gpu_decoded(const cd::CodecParams &p, double quality = -1) {
  swiftkv::AdaptiveMethod m;
  m.params = p;
  m.quality = quality;
  m.decode_bandwidth = 1e15;
  return m;
}

// With alpha 0 quality is worth nothing and decoding is free: every chunk takes the smallest
// method (KIVI 4-bit), and the host budget, counted in stored bytes, holds more chunks than raw.
void adaptive_alpha_zero_takes_the_smallest(void **) {
  Rig r(8, 0);
  r.adaptive(0.0, {gpu_decoded(kivi(8, 32)), gpu_decoded(fp8()), gpu_decoded(kivi(4, 32))});
  const cd::CodecParams k4 = kivi(4, 32);
  assert_int_equal(r.store(21, 12), 12);
  const swiftkv::CacheStats s = r.cache->stats();
  assert_int_equal(s.chunks[ti(Tier::host)], 12);
  assert_int_equal(s.evictions, 0);
  assert_int_equal(s.codecs.chunks[ci(cd::Codec::kivi)][ti(Tier::host)], 12);
  assert_int_equal(s.bytes[ti(Tier::host)], 12 * r.frame_bytes(k4));
  assert_true(s.bytes[ti(Tier::host)] <= s.capacity_bytes[ti(Tier::host)]);
  for (size_t i = 0; i < 12; ++i) {
    const swiftkv::ChunkView v = r.view(21, i);
    assert_true(swiftkv::same_encoding(v.meta, k4));
    assert_true(*r.load(21, i) == r.round_trip(21, i, k4));
  }
}

// A full host tier prices its bytes by what its victims lost on their way to disk; then the
// policy compresses a cold chunk (few reuses, long idle) and keeps a hot one exact. Alpha is set
// from the observed price so that the rule, worked by hand below, splits the two.
void adaptive_price_compresses_cold_chunks_not_hot_ones(void **) {
  Rig r(4, uint64_t{4} << 20, "", true);
  const swiftkv::AdaptiveMethod f8 = gpu_decoded(fp8(), 0.98);  // the engine's own profile
  r.adaptive(1e-3, {f8});
  assert_int_equal(r.store(22, 4), 4);
  r.clock_ns += 1'000'000'000;
  assert_int_equal(r.store(23, 4), 4);  // the first four go down to disk
  const swiftkv::CacheStats s = r.cache->stats();
  assert_int_equal(s.chunks[ti(Tier::host)], 4);
  assert_int_equal(s.chunks[ti(Tier::disk)], 4);
  const double p = s.price[ti(Tier::host)];
  assert_true(p > 0);
  // Chunk 0 of seq 23 is looked up at ten later times; chunk 3 is left alone for 1000 s.
  const std::vector<ChunkKey> k = r.keys(23, 4);
  r.clock_ns += 1000 * uint64_t{1'000'000'000};
  for (int i = 0; i < 10; ++i) {
    r.clock_ns += 1'000'000;
    r.cache->lookup(std::span<const ChunkKey>(&k[0], 1), nullptr);
  }
  const double horizon = 60;
  const double f_hot = 11.0;                                   // 1 + 10 hits, idle 0
  const double f_cold = horizon / (horizon + 1000.0 + 10e-3);  // no hit, idle 1000.01 s
  // fp8 is taken when f (alpha (1 - q) - db / bw + d) < p db, db the bytes it saves and d its
  // decode time. With alpha (1 - q) - db / bw + d = p db / sqrt(f_hot f_cold), the hot chunk
  // keeps raw by a factor sqrt(f_hot / f_cold) (about 14) and the cold one takes fp8 by the same.
  const swiftkv::AdaptivePolicy a = r.cache->compression(r.fp)->adaptive;
  const double bytes = static_cast<double>(r.sizes.full_chunk_bytes);
  const double db = bytes - a.methods[0].ratio * bytes;
  const double d = bytes / f8.decode_bandwidth;
  const double alpha =
      (p * db / std::sqrt(f_hot * f_cold) + db / a.host_bandwidth - d) / (1 - 0.98);
  r.adaptive(alpha, {f8});
  assert_true(r.cache->compression(r.fp)->adaptive.measured);  // kept across the change
  const std::vector<ChunkKey> pair = {k[0], k[3]};
  assert_int_equal(r.cache->compress(r.fp, pair, std::nullopt), 2);
  assert_int_equal(r.view(23, 0).meta.encoding, 0);
  assert_true(swiftkv::same_encoding(r.view(23, 3).meta, fp8()));
  assert_true(*r.load(23, 3) == r.round_trip(23, 3, fp8()));
}

// A full host tier with no disk behind it makes room by the victim's cheapest action per byte
// freed. Recomputing is made dear (1 KB/s) and fp8 nearly exact (the engine's quality 0.999,
// decoded on its GPU), with alpha 1 so that chunks enter raw (0.001 of quality is worth more
// than the 8 KB fp8 saves at 25 GB/s). Per byte freed, dropping the 16 KiB victim loses
// 1/1e3 - 1/25e9 = 1e-3; fp8 in place loses (0.001 - 7888 / 25e9) / 7888 = 1.3e-7 (7888 bytes
// saved: 16384 less its 8496-byte frame). So the victim is re-encoded where it is, into the one
// fp8 slot the budget's last 12 KiB make, and nothing is evicted. The next victim finds no fp8
// slot free and is dropped, as before.
void make_room_compresses_in_place_when_cheaper(void **) {
  Rig r(8, 0, "", true, 12288);
  r.adaptive(1.0, {gpu_decoded(fp8(), 0.999)}, 1e3);
  assert_int_equal(r.store(30, 8), 8);
  swiftkv::CacheStats s = r.cache->stats();
  assert_int_equal(s.codecs.chunks[ci(cd::Codec::raw)][ti(Tier::host)], 8);
  r.clock_ns += 1'000'000'000;
  assert_int_equal(r.store(31, 1), 1);
  s = r.cache->stats();
  assert_int_equal(s.evictions, 0);
  assert_int_equal(s.compressed_in_place, 1);
  assert_int_equal(s.chunks[ti(Tier::host)], 9);
  assert_int_equal(s.codecs.chunks[ci(cd::Codec::fp8)][ti(Tier::host)], 1);
  // The oldest chunk was the victim: it serves what fp8 decodes, the others their bytes.
  assert_true(swiftkv::same_encoding(r.view(30, 0).meta, fp8()));
  assert_int_equal(r.view(30, 0).meta.stored(), r.frame_bytes(fp8()));
  assert_true(*r.load(30, 0) == r.round_trip(30, 0, fp8()));
  for (size_t i = 1; i < 8; ++i) assert_true(*r.load(30, i) == r.kv(30, i));
  assert_true(*r.load(31, 0) == r.kv(31, 0));
  assert_true(s.price[ti(Tier::host)] > 0);  // what the victim lost per byte it freed
  // No slot of fp8's size is left and no budget to make one: the next victim is dropped.
  r.clock_ns += 1'000'000'000;
  const std::vector<ChunkKey> k = r.keys(32, 1);
  assert_int_equal(r.store(32, 1), 1);
  s = r.cache->stats();
  assert_int_equal(s.evictions, 1);
  assert_int_equal(s.compressed_in_place, 1);
  assert_int_equal(s.chunks[ti(Tier::host)], 9);
  assert_true(*r.load(32, 0) == r.kv(32, 0));
}

// Dropping wins over moving down when recomputing is cheaper than reading the disk: with
// recomputation at 1e15 B/s, a dropped chunk is worth alpha - 1.6e-11 s, one on disk alpha -
// 16384 / 3e9 = alpha - 5.5e-6 s; so the full host tier drops its victims and the disk stays
// empty. With the default 1.5 GB/s (adaptive_price_compresses_cold_chunks_not_hot_ones) the same
// victims go to disk.
void make_room_drops_when_recomputing_is_cheaper(void **) {
  Rig r(4, uint64_t{4} << 20, "", true);
  r.adaptive(1.0, {gpu_decoded(fp8(), 0.5)}, 1e15);
  assert_int_equal(r.store(33, 4), 4);
  r.clock_ns += 1'000'000'000;
  assert_int_equal(r.store(34, 4), 4);
  const swiftkv::CacheStats s = r.cache->stats();
  assert_int_equal(s.chunks[ti(Tier::host)], 4);
  assert_int_equal(s.chunks[ti(Tier::disk)], 0);
  assert_int_equal(s.evictions, 4);
  assert_int_equal(s.demotions, 0);
  assert_int_equal(s.compressed_in_place, 0);  // fp8 at quality 0.5 loses the most
  for (size_t i = 0; i < 4; ++i) assert_true(*r.load(34, i) == r.kv(34, i));
  assert_false(r.load(33, 0).has_value());
}

// Bad adaptive configs are EINVAL and change nothing; compress without a codec is EINVAL for a
// model in fixed mode.
void bad_adaptive_config_is_refused(void **) {
  Rig r(4, 0);
  const swiftkv::ModelCompression before = *r.cache->compression(r.fp);
  auto refused = [&](const swiftkv::ModelCompression &m, const char *what) {
    try {
      r.cache->set_compression(r.fp, m);
      fail_msg("accepted: %s", what);
    } catch (const swiftkv::Error &e) {
      assert_int_equal(e.status(), SWIFTKV_EINVAL);
    }
    const swiftkv::ModelCompression now = *r.cache->compression(r.fp);
    assert_false(now.adaptive.enabled);
    assert_false(now.fixed[ti(Tier::host)].has_value());
  };
  swiftkv::ModelCompression good = before;
  good.accept_lossy = true;
  good.adaptive.enabled = true;
  good.adaptive.methods = {swiftkv::AdaptiveMethod{fp8()}};
  auto m = good;
  m.fixed[ti(Tier::host)] = fp8();
  refused(m, "a fixed codec beside adaptive mode");
  m = good;
  m.adaptive.methods = {swiftkv::AdaptiveMethod{cd::CodecParams{}}};
  refused(m, "a raw method");
  m = good;
  m.accept_lossy = false;
  refused(m, "a lossy method for exact bytes");
  m = good;
  m.adaptive.methods[0].quality = 1.5;
  refused(m, "quality 1.5");
  m = good;
  m.adaptive.methods[0].quality = NAN;
  refused(m, "quality NaN");
  m = good;
  m.adaptive.alpha = NAN;
  refused(m, "alpha NaN");
  m = good;
  m.adaptive.alpha = -1;
  refused(m, "alpha -1");
  m = good;
  m.adaptive.disk_bandwidth = 0;
  refused(m, "disk bandwidth 0");
  m = good;
  m.adaptive.horizon_s = INFINITY;
  refused(m, "an infinite horizon");
  m = good;
  m.adaptive.methods.push_back(swiftkv::AdaptiveMethod{fp8()});
  refused(m, "a repeated method");
  m = good;
  for (uint32_t b : {8u, 4u, 2u}) {
    for (uint32_t g : {8u, 16u, 32u}) m.adaptive.methods.push_back({kivi(b, g)});
  }
  refused(m, "ten methods");
  m = good;
  m.adaptive.methods = {swiftkv::AdaptiveMethod{kivi(4, 512)}};
  refused(m, "kivi group 512");
  assert_int_equal(r.store(24, 1), 1);
  try {
    r.cache->compress(r.fp, r.keys(24, 1), std::nullopt);
    fail_msg("the policy chose for a model in fixed mode");
  } catch (const swiftkv::Error &e) {
    assert_int_equal(e.status(), SWIFTKV_EINVAL);
  }
  assert_int_equal(r.view(24, 0).meta.encoding, 0);
  r.cache->set_compression(r.fp, good);  // and the good one is taken
  assert_true(r.cache->compression(r.fp)->adaptive.enabled);
}

}  // namespace

int main() {
  const CMUnitTest tests[] = {
      cmocka_unit_test(fixed_host_codec_counts_stored_bytes),
      cmocka_unit_test(lossy_only_where_accepted),
      cmocka_unit_test(demotion_encodes_on_the_way_down),
      cmocka_unit_test(encoded_records_survive_a_restart),
      cmocka_unit_test(a_lossy_record_passed_off_as_exact_is_dropped),
      cmocka_unit_test(compress_in_place),
      cmocka_unit_test(bad_compression_is_refused),
      cmocka_unit_test(adaptive_keeps_chunks_exact_while_there_is_room),
      cmocka_unit_test(adaptive_alpha_zero_takes_the_smallest),
      cmocka_unit_test(adaptive_price_compresses_cold_chunks_not_hot_ones),
      cmocka_unit_test(make_room_compresses_in_place_when_cheaper),
      cmocka_unit_test(make_room_drops_when_recomputing_is_cheaper),
      cmocka_unit_test(bad_adaptive_config_is_refused),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
