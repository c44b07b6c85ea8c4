// The chunk index: chunk key -> where the chunk lives (tier and slot), who uses it, its pins and
// what the eviction policies need to know. It decides which copy of a chunk is the readable one,
// so that a moving chunk is readable in exactly one place and never lost in between.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/index/chunk_key.hpp"
#include "core/policy/eviction_order.hpp"

namespace swiftkv {

// The tiers a chunk can be in. peer: memory lent on this host, mapped here; remote: memory lent
// by another host, reached over the transport. The numbers index per-tier arrays; the C API
// numbers them otherwise (tier_code).
enum class Tier : uint8_t { peer = 0, host = 1, disk = 2, remote = 3 };
inline constexpr size_t kTierCount = 4;
inline constexpr std::array<Tier, kTierCount> kTiers{Tier::peer, Tier::host, Tier::disk,
                                                     Tier::remote};
const char *tier_name(Tier t) noexcept;
// Lent memory (peer or remote): leases, decoded chunks only, no price of its own.
// A tier's slot in arrays of kTierCount.
inline constexpr size_t tier_slot(Tier t) noexcept { return static_cast<size_t>(t); }
inline constexpr bool lent(Tier t) noexcept { return t == Tier::peer || t == Tier::remote; }
// The tier's number in the C API (swiftkv_tier): remote is 4, after SWIFTKV_TIER_DROPPED.
inline constexpr uint8_t tier_code(Tier t) noexcept {
  return t == Tier::remote ? uint8_t{4} : static_cast<uint8_t>(t);
}
inline constexpr uint8_t kDroppedCode = 3;  // SWIFTKV_TIER_DROPPED
// The tier of a C API number; nullopt for SWIFTKV_TIER_DROPPED and numbers of no tier.
inline constexpr std::optional<Tier> tier_of_code(uint32_t code) noexcept {
  if (code <= 2) return static_cast<Tier>(code);
  if (code == 4) return Tier::remote;
  return std::nullopt;
}

// A place in a tier's store.
struct SlotRef {
  Tier tier = Tier::host;
  uint64_t slot = 0;
};

// How a chunk's bytes are stored in its tier (core/codec/chunk_codec.hpp packs and unpacks it):
// bits 0-7 the codec (0: raw, the chunk's own bytes), 8-15 its bits, 16-23 log2 of its group,
// bit 24 byte planes, bit 31 lossy (the bytes decode to an approximation of the chunk, also
// when they are raw again after a lossy codec). 0: the chunk's exact bytes, as they are.
inline constexpr uint32_t kEncodingCodecMask = 0xff;
inline constexpr uint32_t kEncodingLossy = uint32_t{1} << 31;
inline constexpr size_t kCodecCount = 4;  // raw, zstd, kivi, fp8
// The codecs that are lossy by definition (kivi, fp8), as bits by codec number: their chunks are
// lossy whatever bit 31 says (codec::lossless is the same rule; a test ties the two).
inline constexpr uint32_t kLossyCodecBits = (uint32_t{1} << 2) | (uint32_t{1} << 3);

// Whether an encoding read from outside (a disk record) is one the library writes: a known codec,
// and bit 31 set where the codec is lossy. A contradiction is a corrupt record.
constexpr bool encoding_consistent(uint32_t e) noexcept {
  const uint32_t c = e & kEncodingCodecMask;
  if (c >= kCodecCount) return false;
  return ((kLossyCodecBits >> c) & 1u) == 0 || (e & kEncodingLossy) != 0;
}

// What the index keeps about a chunk besides its place.
struct ChunkMeta {
  ChunkKey model;         // the model's fingerprint
  uint32_t position = 0;  // the chunk's number in its sequence (0: the first chunk)
  uint32_t tokens = 0;    // tokens in the chunk
  uint64_t bytes = 0;     // bytes of the chunk, all layers, as the engine sees them (decoded)
  // The bytes its tier holds (what budgets count): 0 means `bytes` (a raw chunk).
  uint64_t stored_bytes = 0;
  uint32_t encoding = 0;  // see kEncodingCodecMask

  uint64_t stored() const noexcept { return stored_bytes != 0 ? stored_bytes : bytes; }
  // Whether the stored bytes are a frame to decode (not the chunk's bytes as they are).
  bool encoded() const noexcept { return (encoding & kEncodingCodecMask) != 0; }
  // Lossy: bit 31, or a lossy codec (so that a cleared bit never passes a kivi chunk as exact).
  bool lossy() const noexcept {
    const uint32_t c = encoding & kEncodingCodecMask;
    return (encoding & kEncodingLossy) != 0 || (c < 32 && ((kLossyCodecBits >> c) & 1u) != 0);
  }
  size_t codec_index() const noexcept {
    const uint32_t c = encoding & kEncodingCodecMask;
    return c < kCodecCount ? c : 0;
  }
};

// An entry handed to a reader or a mover: the place to read from and the chunk's meta.
struct ChunkUse {
  SlotRef where;
  ChunkMeta meta;
  uint32_t pins = 0;
};

// Everything the controller sees of one entry.
struct ChunkView {
  ChunkKey key;
  SlotRef where;
  ChunkMeta meta;
  uint32_t pins;
};

// Thread-safe. The keys are spread over kShards shards; each has its own shared_mutex over its
// table, and every call locks exactly one shard at a time (lookups shared, changes exclusive).
// The per-tier counts are atomics. The eviction order (which chunk each full tier gives up
// first) is one structure under order_mu_, taken before a shard's lock: by every call that
// changes whether a chunk can be a victim (insert, drop, moves, pins) and once per run of keys
// by touch_many. Reads (peek, begin_read, end_read) do not take it.
//
// A chunk is in its tier's eviction order while it is visible, unpinned and not moving: a
// victim is never pinned nor moving, and a tier never scans for one. Nor is a victim being read;
// reads stay out of order_mu_, so a victim search that meets a chunk being read makes it the
// newest (it is in use) and looks at the next.
//
// A chunk's life: insert() makes it resident. Readers bracket their reads with begin_read /
// end_read; a mover with begin_move and then finish_move or abort_move. drop() removes a chunk;
// when someone still uses it, it only becomes invisible (doomed) and the last user frees it.
// Every call that ends a use returns the slots that nobody can reach any more in `to_free`: the
// caller frees them in their stores after the call, outside the index's locks.
class ChunkIndex {
 public:
  explicit ChunkIndex(EvictionPolicy policy = EvictionPolicy::lru, RecomputeCost cost = {});
  ~ChunkIndex();

  // The tier of a resident chunk, recording `now_ns` as its last activity; nullopt when the key
  // is absent or dropped.
  std::optional<Tier> touch(const ChunkKey &k, uint64_t now_ns);
  // touch() for a run of keys (a prompt's chunks), fetching the memory of later keys while it
  // handles earlier ones: at a million chunks one lookup is a cache miss, and a run overlaps them.
  void touch_many(std::span<const ChunkKey> keys, uint64_t now_ns, std::optional<Tier> *out);
  // Sizes the tables and pools for `chunks` resident chunks, so that inserts up to that many
  // (almost always: a shard sized four standard deviations over its share may still grow) never
  // rehash (growing a table touches all of it). Never shrinks. About 160 bytes of table (at most
  // 40% full) and 40 of eviction order per chunk, a few percent more for uneven shards.
  void reserve(uint64_t chunks);
  // The bytes of tables and eviction nodes that reserve(chunks) makes the index hold.
  static uint64_t reserve_bytes(uint64_t chunks) noexcept;
  // Resident chunks the tables hold before one of them grows, if keys spread evenly.
  uint64_t capacity() const noexcept;
  // Bytes of memory the index holds: its tables, its shards and its eviction order.
  uint64_t memory_bytes() const;
  // A hint that k is needed soon (insert or lookup): its home slot and the one after it; no
  // effect on the index.
  void prefetch(const ChunkKey &k) const noexcept;
  // The same for a key about to be erased: its home slot, the five after it, and the lines of
  // its shard that an erase writes (its lock, table and counts).
  void prefetch_for_erase(const ChunkKey &k) const noexcept;
  std::optional<Tier> peek(const ChunkKey &k) const;
  // Where a visible chunk is, recording no activity.
  std::optional<SlotRef> locate(const ChunkKey &k) const;
  bool contains(const ChunkKey &k) const { return peek(k).has_value(); }
  // Everything about a visible chunk, recording no activity.
  std::optional<ChunkView> view(const ChunkKey &k) const;

  // Adds a resident chunk stored at `where`; false (nothing changed) when the key exists.
  bool insert(const ChunkKey &k, const ChunkMeta &meta, SlotRef where, uint64_t now_ns);

  std::optional<ChunkUse> begin_read(const ChunkKey &k);
  void end_read(const ChunkKey &k, std::vector<SlotRef> &to_free);

  // Starts moving a chunk that is in tier `from` and not being moved: nullopt when it is not
  // there, already moving, or (with respect_pins) pinned.
  std::optional<ChunkUse> begin_move(const ChunkKey &k, Tier from, bool respect_pins);
  // Makes `dst` the readable copy: false (dst put in to_free) when the chunk was dropped in the
  // meantime. The old copy is freed once its last reader is done.
  bool finish_move(const ChunkKey &k, SlotRef dst, std::vector<SlotRef> &to_free);
  void abort_move(const ChunkKey &k, std::vector<SlotRef> &to_free);

  // Removes a chunk; false when absent, dropped, or (with respect_pins) pinned. With
  // `only_from`, only a chunk in that tier.
  bool drop(const ChunkKey &k, bool respect_pins, std::optional<Tier> only_from,
            std::vector<SlotRef> &to_free);

  // Removes a chunk that is in tier `from`, not being moved and (with respect_pins) not pinned,
  // in one step: what begin_move, abort_move and drop do to a victim that goes nowhere. Its meta,
  // or nullopt (nothing changed) when it is not such a chunk.
  std::optional<ChunkMeta> evict(const ChunkKey &k, Tier from, bool respect_pins,
                                 std::vector<SlotRef> &to_free);
  struct Evicted {
    ChunkKey key;
    ChunkMeta meta;
  };
  // Victims of tier t (as victim() chooses them, chunks being read kept) removed in one pass,
  // for a tier whose victims go nowhere: until their stored bytes reach `bytes` or nothing may
  // go. Appends them to `out` and their slots to to_free; returns the bytes they stored.
  uint64_t evict_victims(Tier t, const ChunkKey &model, uint64_t now_ns, uint64_t bytes,
                         std::vector<Evicted> &out, std::vector<SlotRef> &to_free);

  // Counted pins. unpin: false when the chunk is absent or not pinned.
  bool pin(const ChunkKey &k);
  bool unpin(const ChunkKey &k);
  uint32_t pins(const ChunkKey &k) const;

  // Calls fn for every resident chunk, one shard at a time under its shared lock: fn must not
  // call back into the index.
  void for_each(const std::function<void(const ChunkView &)> &fn) const;

  // The chunk tier t gives up first for a chunk of `model` (the model matters for the lent
  // tiers only: lent memory holds one model's chunks), by the index's policy at `now_ns`;
  // nullopt when the tier holds no chunk that may go (all pinned, moving or being read, or
  // none). A chunk being read is in use: a search that finds it first makes it the newest.
  std::optional<ChunkKey> victim(Tier t, const ChunkKey &model, uint64_t now_ns);
  // The last activity of a resident chunk (0 when it is not resident).
  uint64_t last_active(const ChunkKey &k) const;
  // A resident chunk's history: its last activity and how many touches it had since it was
  // stored (each at a later time than the one before); nullopt when it is not resident.
  struct Activity {
    uint64_t last_active = 0;
    uint32_t hits = 0;
  };
  std::optional<Activity> activity(const ChunkKey &k) const;
  EvictionPolicy policy() const noexcept { return order_.policy(); }

  uint64_t chunks(Tier t) const noexcept;
  // Bytes the tier holds (stored: compressed where encoded).
  uint64_t bytes(Tier t) const noexcept;
  // Resident chunks by codec (ChunkMeta::codec_index) and tier: how many, their decoded bytes
  // and the bytes stored.
  struct CodecCounts {
    std::array<std::array<uint64_t, kTierCount>, kCodecCount> chunks{}, raw_bytes{}, stored_bytes{};
  };
  CodecCounts codec_counts() const;
  // Makes `meta` (same model, position and tokens; a new encoding and stored size) the chunk's
  // meta in the same step as finish_move switches to `dst`: a move that re-encoded the chunk.
  bool finish_move(const ChunkKey &k, SlotRef dst, const ChunkMeta &meta,
                   std::vector<SlotRef> &to_free);

 private:
  // Everything the index keeps about one chunk, in one 64-byte slot of an open-addressing table
  // (linear probing, backward-shift deletion, at most half full): a lookup, an insert and a drop
  // each touch one cache line, which a run of keys can fetch ahead.
  struct alignas(64) Slot {
    uint64_t lo = 0, hi = 0;
    uint32_t node = 0;  // in the eviction order, which keeps the last activity
    uint32_t encoding = 0;
    uint64_t store_slot = 0;  // the place in its tier's store
    uint64_t bytes = 0;       // stored
    uint32_t position = 0, tokens = 0;
    uint32_t pins = 0;
    uint32_t users = 0;  // readers plus the mover
    uint16_t model = 0;  // index in the shard's model list
    uint8_t tier = 0;
    uint8_t flags = 0;  // kUsed, kDoomed, kMoving, kRetired
    // Decoded bytes per token of a chunk stored in another size than it decodes to (an
    // encoded one), in the 4 bytes the 64 would otherwise pad; 0: it decodes to `bytes`.
    uint32_t raw_per_token = 0;
  };
  static_assert(sizeof(Slot) == 64);
  static constexpr uint8_t kUsed = 1;    // the slot holds a chunk
  static constexpr uint8_t kDoomed = 2;  // dropped while in use: invisible, freed by the last user
  static constexpr uint8_t kMoving = 4;
  static constexpr uint8_t kRetired = 8;  // old copies wait in the shard's `retired` map
  // Memory that slot tables are cut from, on huge pages (core/memory/large_pages.hpp): a shard's
  // table at a million chunks is 640 KiB, less than a huge page, and the 256 of them, read at
  // random, are 160 MiB; cut from one mapping, a cold slot costs a cache miss and no page walk.
  // reserve() cuts one table per shard from one arena; shards that outgrow theirs cut the next
  // from a growth arena made for all shards' tables of that size (the shards' shares are even,
  // so they grow in waves). Freed when the last table in it goes; `counted` holds the bytes of
  // the tables cut while it lives.
  class SlotMemory {
   public:
    SlotMemory(uint64_t slots, std::atomic<uint64_t> &counted);
    ~SlotMemory();
    SlotMemory(const SlotMemory &) = delete;
    SlotMemory &operator=(const SlotMemory &) = delete;
    // The next `n` slots, empty; nullptr when fewer are left. One thread at a time.
    Slot *take(uint64_t n);
    // A table cut from here that is no longer used: its pages go back to the kernel (where the
    // memory is a mapping of its own), so that a wave of growth that stops halfway does not keep
    // the tables the grown shards left. Any thread.
    void give_back(Slot *t, uint64_t n) noexcept;

   private:
    Slot *slots_;
    uint64_t count_, taken_ = 0;
    std::atomic<uint64_t> given_back_{0};  // bytes
    std::atomic<uint64_t> &counted_;
  };
  struct Shard {
    // What an erase touches comes first, in three lines that prefetch_for_erase fetches.
    mutable std::shared_mutex mu;
    // The table: replaced whole when it grows, under the exclusive lock. Its pointer and size are
    // atomics only so that prefetch() may read them without the lock. Any size: a key's home is
    // its hash scaled to the size.
    Slot *slots = nullptr;
    std::shared_ptr<SlotMemory> memory;  // what holds `slots`
    std::atomic<Slot *> table{nullptr};
    std::atomic<uint64_t> cap{0};
    uint64_t used = 0;
    // Resident chunks and bytes per tier in this shard: written only under the exclusive lock
    // (a plain load and store, no locked instruction), read by chunks() and bytes() without it.
    std::array<std::atomic<uint64_t>, kTierCount> chunks{}, bytes{};
    // The same by codec, with the decoded bytes beside the stored ones; raw chunks (codec 0,
    // the common case) are not counted here but derived from the totals by codec_counts.
    std::array<std::array<std::atomic<uint64_t>, kTierCount>, kCodecCount> codec_chunks{},
        codec_raw{}, codec_stored{};
    // Old copies of moved chunks that readers may still read, until their last reader is done.
    std::unordered_map<ChunkKey, std::vector<SlotRef>, ChunkKeyHash> retired;
  };
  static constexpr size_t kShards = 256;

  Shard &shard(const ChunkKey &k) noexcept { return shards_[(k.lo >> 56) & (kShards - 1)]; }
  const Shard &shard(const ChunkKey &k) const noexcept {
    return shards_[(k.lo >> 56) & (kShards - 1)];
  }
  static bool visible(const Slot &s) noexcept { return (s.flags & (kUsed | kDoomed)) == kUsed; }
  static SlotRef where(const Slot &s) noexcept {
    return SlotRef{static_cast<Tier>(s.tier), s.store_slot};
  }
  static uint64_t raw_bytes(const Slot &s) noexcept {
    return s.raw_per_token == 0 ? s.bytes : uint64_t{s.raw_per_token} * s.tokens;
  }
  // A slot's meta; call with its shard locked.
  ChunkMeta meta(const Shard &, const Slot &s) const noexcept {
    const uint64_t raw = raw_bytes(s);
    return ChunkMeta{model_key(s.model),           s.position, s.tokens, raw,
                     raw == s.bytes ? 0 : s.bytes, s.encoding};
  }
  const ChunkKey &model_key(uint16_t i) const noexcept {
    return model_pages_[i / kModelsPerPage][i % kModelsPerPage];
  }
  bool finish_move(const ChunkKey &k, SlotRef dst, const std::optional<ChunkMeta> &meta,
                   std::vector<SlotRef> &to_free);
  // Puts the decoded size, stored size and encoding of `m` into a slot: EINVAL when a chunk
  // stored in another size than it decodes to has decoded bytes that are not tokens x a 32-bit
  // per-token size (at least 1).
  static void set_sizes(Slot &s, const ChunkMeta &m);
  // The slot holding k, or nullptr. Call with the shard locked.
  static Slot *find(const Shard &s, const ChunkKey &k) noexcept;
  static void copy_slot(Slot &dst, const Slot &src) noexcept;
  // Rehashes a shard into a table of `cap` slots (more than it holds): at `into`, cut from
  // `memory`, or when that is null cut from the growth arena.
  void grow(Shard &s, uint64_t cap, std::shared_ptr<SlotMemory> memory = nullptr,
            Slot *into = nullptr);
  static void erase(Shard &s, Slot *slot);
  // Takes a resident chunk's slot out (its order node already gone): erased, or doomed when a
  // reader holds it; call with its shard's lock held.
  void remove_slot_locked(Shard &s, Slot *slot, std::vector<SlotRef> &to_free);
  std::optional<ChunkMeta> evict_locked(const ChunkKey &k, Tier from, bool respect_pins,
                                        std::vector<SlotRef> &to_free);
  // Adds (+1) or takes (-1) a chunk's share of its shard's counts.
  static void count(Shard &s, const Slot &slot, int sign) noexcept;
  // The number of a model's fingerprint, given it on its first chunk; call with order_mu_ and
  // the shard's lock held (the new number is written before any slot holds it).
  uint16_t model_index(const ChunkKey &model);
  // Ends one use of a chunk; erases it (and hands back its slots) when it was the last user of
  // a doomed chunk. Returns true when the chunk was erased.
  bool end_use_locked(Shard &s, Slot *slot, std::vector<SlotRef> &to_free);
  // Whether a reader or a mover holds the chunk.
  bool in_use(const ChunkKey &k) const;
  // The tier and eviction node of a visible chunk, under its shard's shared lock.
  std::optional<Tier> find_node(const ChunkKey &k, uint32_t *node) const;
  // The eviction domain of a chunk in tier t of `model`; call with order_mu_ held.
  uint32_t domain_locked(Tier t, const ChunkKey &model);
  // Puts a chunk that may be a victim (visible, unpinned, not moving) into its tier's order.
  void link_locked(const Shard &s, const Slot &slot);

  std::atomic<uint64_t> table_bytes_{0};  // of all tables cut from live memory: before the shards
  std::unique_ptr<Shard[]> shards_;
  // Where tables that grow are cut from (see SlotMemory); taken after a shard's lock.
  std::mutex growth_mu_;
  std::shared_ptr<SlotMemory> growth_;
  // The model fingerprints of the index's chunks (a handful: one per registered model and
  // identity), shared by every shard, so that reading a chunk's meta finds its model in a line
  // every shard keeps hot rather than in one list per shard. Pages are made as numbers are
  // given and never move: a reader holding a shard's lock reads the numbers its slots hold.
  static constexpr size_t kModelsPerPage = 256;
  std::array<std::unique_ptr<ChunkKey[]>, (size_t{UINT16_MAX} + 1) / kModelsPerPage> model_pages_;
  uint32_t models_ = 0;      // numbers given; guarded by order_mu_
  uint16_t last_model_ = 0;  // the number model_index gave last, tried first
  mutable std::mutex
      order_mu_;  // guards order_, lent_domains_ and the models; taken before a shard's lock
  EvictionOrder order_;
  // Domain 2 + i holds the chunks of lent tier .first of model .second (each model's leases
  // make room for that model only).
  std::vector<std::pair<Tier, ChunkKey>> lent_domains_;
};

}  // namespace swiftkv
