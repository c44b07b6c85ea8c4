// The borrower's chunk cache: the index and the four tiers (peer, remote, host, disk) under one
// set of rules: where a new chunk goes, which chunk a full tier gives up (the eviction policy),
// how a chunk moves down the chain (peer -> remote -> host -> disk -> dropped by default, see
// CacheOptions::chain), and the background thread that demotes ahead of need and keeps the lease
// protocol with lenders.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <span>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/codec/layer_decode.hpp"
#include "core/common/defaults.hpp"
#include "core/context/context.hpp"
#include "core/index/chunk_index.hpp"
#include "core/policy/eviction_policy.hpp"
#include "core/tiers/chunk_encoding.hpp"
#include "core/tiers/disk_tier.hpp"
#include "core/tiers/host_tier.hpp"
#include "core/tiers/peer_tier.hpp"

namespace swiftkv {

// The default chain: lent memory of this host, lent memory of other hosts, host memory, disk.
inline constexpr std::array<Tier, kTierCount> kDefaultChain{Tier::peer, Tier::remote, Tier::host,
                                                            Tier::disk};

// EINVAL unless `chain` names each tier once, with peer first and disk last.
void check_chain(const std::array<Tier, kTierCount> &chain);

struct CacheOptions {
  EvictionPolicy policy = EvictionPolicy::retention;
  // The tiers from the top down: where a new chunk goes first and where a victim moves next.
  std::array<Tier, kTierCount> chain = kDefaultChain;
  RecomputeCost cost;
  // The background thread demotes from the lent and host tiers while their free space is under
  // this percentage of their capacity; 0: only when a store finds no room.
  uint32_t demote_free_percent = defaults::kCtx.demote_free_percent;
  uint64_t host_slab_bytes = uint64_t{64} << 20;
  // How often the background thread runs; 0: no thread (the owner calls maintain()).
  uint64_t maintenance_interval_ms = defaults::kCtx.maintenance_interval_ms;
  std::function<uint64_t()> clock;  // monotonic ns; empty: CLOCK_MONOTONIC
};

enum class ChunkEventReason : uint8_t { policy = 0, revoked = 1, corrupt = 2 };

// A chunk left a tier without the caller asking: demoted (to set) or dropped (to empty).
struct ChunkEvent {
  ChunkKey model;
  ChunkKey key;
  Tier from;
  std::optional<Tier> to;
  ChunkEventReason reason;
};
using ChunkEventFn = std::function<void(const ChunkEvent &)>;

struct CacheStats {
  std::array<uint64_t, kTierCount> chunks{}, bytes{}, capacity_bytes{}, hits{};
  uint64_t misses = 0;
  uint64_t stores = 0;           // chunks stored
  uint64_t stores_rejected = 0;  // chunks no tier had room for
  uint64_t evictions = 0;        // chunks dropped to make room
  uint64_t demotions = 0;        // chunks moved down a tier by the cache
  uint64_t promotions = 0;       // chunks moved up a tier on request
  uint64_t load_failures = 0;    // reads that failed their check or I/O
  uint64_t revocations = 0;  // chunks that left lent memory because the lender asked or it expired
  uint64_t corrupt_files_removed = 0;    // disk records dropped at start-up (torn, failing a check,
                                         // duplicate, over the budget)
  uint64_t demotions_deferred = 0;       // background passes that let a pending load go first
  uint64_t disk_files_skipped = 0;       // directory entries the disk tier left alone
  uint64_t disk_records_mismatched = 0;  // disk reads that found another record than expected
  uint64_t disk_segments_cleaned = 0;
  uint64_t disk_bytes_relocated = 0;
  uint64_t disk_bytes_allocated = 0;  // segment files on disk (what the disk budget counts)
  uint64_t disk_full_refusals = 0;    // segments the filesystem could not give (a full disk)
  ChunkIndex::CodecCounts codecs;     // resident chunks by codec and tier, decoded and stored
  uint64_t lossy_refused = 0;  // lossy chunks a load or retrieve stopped at (exact bytes asked)
  uint64_t encodes = 0;        // chunks encoded (a store, a move or compress)
  uint64_t decodes = 0;        // encoded chunks decoded (a load, a retrieve or a move)
  uint64_t compressed_in_place = 0;  // victims the adaptive policy re-encoded where they were
  // The adaptive policy's price of a byte in each tier (utility per byte its last victims lost;
  // the lent tiers' are always 0).
  std::array<double, kTierCount> price{};
};

// Residency of a run of chunk keys, as lookup sees it.
struct LookupResult {
  uint64_t chunks = 0;  // keys looked at
  uint64_t prefix = 0;  // resident chunks from chunk 0 on, up to the first miss
  // The longest run of resident chunks (the earliest of equal ones), which leaves the fewest
  // chunks to compute: it starts after `dropped_head` chunks (0 when it is the prefix or nothing
  // is resident) and is `loadable` chunks long. Chunks before it may be resident; an engine
  // that loads this run recomputes them.
  uint64_t dropped_head = 0;
  uint64_t loadable = 0;
  std::array<uint64_t, kTierCount> per_tier{};  // resident chunks in each tier, in all keys
};

// Thread-safe: the index and the stores guard themselves (see their comments); cb_mu_ guards
// the event callback (which runs with no lock held and may call back into the cache); maint_mu_
// serialises maintenance passes; the counters are atomics.
class ChunkCache {
 public:
  ChunkCache(Context &ctx, CacheOptions options);
  ~ChunkCache();
  ChunkCache(const ChunkCache &) = delete;
  ChunkCache &operator=(const ChunkCache &) = delete;

  // Replaces the event callback. Returns once no thread runs the old one, except the calling
  // thread itself when it is inside that callback (it goes on with its own call).
  void set_event_callback(ChunkEventFn fn);
  // Whether the calling thread is inside this cache's event callback, where giving the cache
  // back (unregistering a model, destroying the context) would wait on itself.
  bool in_event_callback() const noexcept;

  // Whether tier t can hold chunks of `model`: peer (remote) when the model borrows lent memory
  // of this host (of another host), host with a host budget, disk with a disk path.
  bool configured(Tier t, const ChunkKey &model) const;

  // Residency of each key (residency[i] = tier or kDropped when given), recording activity on
  // the resident ones for the policies.
  static constexpr uint8_t kDropped = kDroppedCode;
  LookupResult lookup(std::span<const ChunkKey> keys, uint8_t *residency);

  // Stores chunk i (bytes at src + i * chunk_bytes) under keys[i] unless it is resident: in the
  // first configured tier of the chain, making room by the policy. Returns how many leading keys
  // are resident afterwards. A chunk that fails to write (EIO) ends the call with that error;
  // the chunks before it stay stored, and *leading_so_far (when given) holds their leading run
  // at every point of the call.
  // keys[i] is chunk first_position + i of its sequence.
  uint64_t store(const ChunkKey &model, std::span<const ChunkKey> keys, uint32_t chunk_tokens,
                 uint64_t chunk_bytes, const std::byte *src, uint64_t *leading_so_far = nullptr,
                 uint32_t first_position = 0);
  // Copies chunks keys[start..] to dst (chunk i - start at dst + (i - start) * chunk_bytes),
  // decoded, while they are resident and intact and (unless their model accepts lossy chunks)
  // exact; returns how many. A chunk that fails its check is dropped and counted as a load
  // failure; a lossy one is left as it is and counted in lossy_refused.
  uint64_t retrieve(std::span<const ChunkKey> keys, uint64_t start, uint64_t chunk_bytes,
                    std::byte *dst);

  // Controller. pin/unpin: all keys or none (ENOTFOUND naming the first that is not resident,
  // resp. not pinned). move: ENOTFOUND (nothing moved) when a key is not resident; returns how
  // many keys are in tier `to` afterwards. clear: drops the unpinned chunks among `keys` (or,
  // without keys, all chunks of `model`, or of every model) in the tiers of tier_mask (bit
  // tier_code(t) for tier t, as in the C API).
  void pin(std::span<const ChunkKey> keys);
  void unpin(std::span<const ChunkKey> keys);
  uint64_t move(std::span<const ChunkKey> keys, Tier to);
  uint64_t clear(std::optional<ChunkKey> model, uint32_t tier_mask,
                 std::optional<std::span<const ChunkKey>> keys);
  // Re-encodes the chunks of `keys` under `to` (raw: decoded) in the tiers where they are: all
  // resident, or ENOTFOUND with nothing changed; EINVAL (nothing changed) when the model is not
  // registered with the cache or `to` is not a codec for its chunks. A chunk in lent memory
  // stays as it is (lent memory holds decoded chunks only), and so does one the tier has no
  // room for re-encoded. Returns how many of `keys` are stored under `to` afterwards.
  // Without `to`, the model's adaptive policy chooses each chunk's encoding in its tier as it
  // would for a chunk entering it (EINVAL when the model is not in adaptive mode); returns how
  // many of `keys` are stored as the policy chose.
  uint64_t compress(const ChunkKey &model, std::span<const ChunkKey> keys,
                    const std::optional<codec::CodecParams> &to);
  // What a model asks of compression (its chunk shape, fixed codecs or the adaptive policy,
  // whether it accepts lossy chunks): set when it registers, replaced by swiftkv_compression_set.
  // Checked (EINVAL). Adaptive mode without methods takes default_adaptive_methods.
  void set_compression(const ChunkKey &model, const ModelCompression &c);
  std::optional<ModelCompression> compression(const ChunkKey &model) const;
  // Whether a chunk of `model` placed in tier t may be encoded there (a fixed codec, or a
  // method of the adaptive policy): a connector save into such a tier goes through host staging.
  bool encodes_in(Tier t, const ChunkKey &model) const;
  // Whether a load may return this chunk: exact, or its model accepts lossy chunks. Counts a
  // refusal.
  bool loadable(const ChunkMeta &meta);
  // For a chunk stored encoded layer by layer (kivi, fp8): its shape as the device decoder takes
  // it, so that a device pool's load moves it compressed and decodes it on the GPU
  // (core/codec/layer_decode.hpp); nullopt for any other chunk.
  std::optional<codec::LayerShape> device_decodable(const ChunkMeta &meta) const;
  // EIO unless `stored` (meta.stored() bytes) is a frame the device decoder takes for this chunk
  // (check_stored_frame, then codec::check_layer_values): checked on the host before the frame
  // goes to the device. A frame that passes counts as decoded.
  void check_device_frame(std::span<const std::byte> stored, const ChunkMeta &meta);

  // Moves the chunks of the tiers in from_mask (bit tier_code(t) for tier t) down to the disk tier
  // as far as its free room goes, evicting nothing there for them, then makes the disk tier
  // durable; returns how many moved. No disk tier: 0. What the context does when it ends
  // (write-back on close).
  uint64_t write_back(uint32_t from_mask);

  // Sizes the index for every chunk of `chunk_bytes` the host and disk tiers can hold, so that
  // storing never rehashes it: called when a borrower registers. Up front it takes at most a
  // quarter of the host budget (or 16 MiB, whichever is more); past that the index grows as
  // chunks arrive, never past what the tiers can hold.
  void reserve_for(uint64_t chunk_bytes);
  // Chunks of `chunk_bytes` the host and disk tiers hold when full.
  uint64_t chunks_that_fit(uint64_t chunk_bytes) const noexcept;
  // The index's memory (bytes) and the resident chunks it holds before it grows.
  uint64_t index_bytes() const { return index_.memory_bytes(); }
  uint64_t index_capacity() const noexcept { return index_.capacity(); }
  // Borrows from a lender for `model` (of geometry `sizes`); returns the lender's lease id. The
  // lease joins the peer tier when it is mapped here, the remote tier when it is not.
  uint64_t borrow(const ChunkKey &model, const GeometrySizes &sizes,
                  std::shared_ptr<LenderLink> lender, uint64_t max_units);
  // Moves every lent chunk of `model` down and gives its leases back (unregistering a model).
  void give_back(const ChunkKey &model);

  // --- Chunk by chunk, for the connector's requests.
  // A use of a resident chunk: its copy stays readable (and is not freed) until end_read, even
  // when it is moved or dropped meanwhile. nullopt when not resident.
  std::optional<ChunkUse> begin_read(const ChunkKey &key);
  bool resident(const ChunkKey &key) const { return index_.contains(key); }
  // Where a chunk is, recording no activity (nullopt: not resident).
  std::optional<Tier> tier_of(const ChunkKey &key) const { return index_.peek(key); }
  // Where and how a chunk is stored, recording no activity (nullopt: not resident).
  std::optional<ChunkView> view(const ChunkKey &key) const { return index_.view(key); }
  void end_read(const ChunkKey &key) noexcept;
  // The bytes of a slot in this process (nullptr for disk) and their device (-1: host).
  std::byte *address(SlotRef where, int32_t *device) const noexcept;
  // Whether a slot's bytes are still the cache's: false once a lent range is lost, after which
  // whatever was read from it may be the lender's data.
  bool readable(SlotRef where) const noexcept;
  // Copies a whole chunk to host memory, decoded (meta.bytes); throws Error(EIO) when it fails
  // its check or does not decode.
  void read_slot(SlotRef where, const ChunkMeta &meta, std::byte *dst);
  // read_slot for several chunks: ok[i] is 1 when chunk i was read and decoded, 0 when it failed
  // as read_slot would have thrown or its slot stopped being readable by the end of the read.
  // The chunks one lender holds move as one batch.
  // With `as_stored`, dst takes the chunk as stored (meta.stored() bytes; for a device decoder,
  // checked by check_device_frame) instead of decoded.
  struct ChunkRead {
    SlotRef where;
    const ChunkMeta *meta;
    std::byte *dst;
    bool as_stored = false;
  };
  void read_slots(std::span<const ChunkRead> reads, std::span<uint8_t> ok);
  // A chunk whose bytes could not be trusted: counted as a load failure and dropped.
  void report_failed_load(const ChunkKey &key, const ChunkMeta &meta, Tier from);
  // A slot for a chunk that is not resident, in the first tier of the chain with room, making
  // room by the policy; nullopt (counted in stores_rejected) when there is none. The slot is the
  // caller's until publish() or release_slot(). Reserved slots take at most 1/kReserveShare of
  // a tier's capacity: past that the next tier is tried, so that requests begun and not
  // finished cannot evict more than that share of what the tier caches.
  static constexpr uint64_t kReserveShare = 2;
  std::optional<SlotRef> reserve_slot(const ChunkKey &key, const ChunkMeta &meta);
  uint64_t reserved_bytes(Tier t) const noexcept {
    return reserved_[tier_slot(t)].load(std::memory_order_relaxed);
  }
  // Makes a reserved slot the chunk's readable copy, writing `staging` (when not nullptr) into
  // it first: a disk slot, or memory the caller could not write directly. False, with the slot
  // freed, when the chunk became resident meanwhile or the slot is no longer readable.
  // `meta` is the one reserve_slot() was given.
  bool publish(const ChunkKey &key, const ChunkMeta &meta, SlotRef where, const std::byte *staging);
  void release_slot(SlotRef where, const ChunkMeta &meta) noexcept;
  // Once after a call that stored chunks of `model` (store(), a request's publishes): wakes the
  // background thread if a tier it demotes ahead from fell below its free target.
  void after_stores(const ChunkKey &model);
  // How many times stores woke the background thread (after_stores; what the tests count).
  uint64_t store_wakes() const noexcept { return store_wakes_.load(std::memory_order_relaxed); }
  // Maintenance passes the background thread ran.
  uint64_t thread_passes() const noexcept { return thread_passes_.load(std::memory_order_relaxed); }

  // Marks a load out of tier t as pending for as long as the scope lives: background demotion
  // out of t waits for it (loads first on a link). retrieve() holds one per chunk it reads.
  class LoadScope {
   public:
    LoadScope(ChunkCache &c, Tier t) : n_(c.loads_active_[tier_slot(t)]) { n_.fetch_add(1); }
    ~LoadScope() { n_.fetch_sub(1); }
    LoadScope(const LoadScope &) = delete;
    LoadScope &operator=(const LoadScope &) = delete;

   private:
    std::atomic<uint32_t> &n_;
  };

  // Runs a maintenance pass on the background thread now rather than at its next period: a
  // lender asked a lease back. Safe from any thread, with any lock held.
  void wake() noexcept;
  // Stops the background thread for good (the destructor does too); the owner calls it first
  // when what the event callback reads is about to go.
  void stop_thread() noexcept;

  // One maintenance pass: leases renewed, reclaimed leases evacuated and released, lost leases'
  // chunks dropped, and ahead-of-time demotion.
  void maintain();

  CacheStats stats() const;
  const CacheOptions &options() const noexcept { return options_; }
  // The host budget the host tier holds in empty slabs, given back to the context for another
  // user of it (HostTier::give_back_empty_slabs). The bytes given back.
  uint64_t give_back_host_budget() { return host_->give_back_empty_slabs(); }
  DiskTier *disk() noexcept { return disk_.get(); }
  const DiskTier *disk() const noexcept { return disk_.get(); }
  uint64_t now() const;

 private:
  TierStore *store_of(Tier t) const noexcept;
  PeerTier &lent_tier(Tier t) const noexcept;  // peer or remote
  std::optional<SlotRef> place(const ChunkKey &key, const ChunkMeta &meta, Tier first);
  // Stores a new chunk from its decoded bytes: in the first tier from `first` on with room,
  // encoded as that tier asks: stored, already resident (another thread stored it first), or
  // no tier had room.
  enum class Placed : uint8_t { stored, already, no_room };
  Placed place_new(const ChunkKey &key, const ChunkMeta &meta, const std::byte *decoded, Tier first,
                   uint64_t now_ns);
  // The encoding a chunk takes when it enters tier t (nullopt: the one it has): decoded for
  // lent memory; for an exact chunk, the model's fixed codec or the adaptive policy's choice.
  std::optional<codec::CodecParams> entering(const ChunkKey &key, const ChunkMeta &meta,
                                             Tier t) const;

  // --- The adaptive policy (chunk_cache_adaptive.cpp).
  // The option the policy picks for a chunk in (or entering) tier t, priced at the tier's
  // current price of a byte when it is short of `meta.bytes` of room, else at 0.
  std::optional<codec::CodecParams> adaptive_choice(const ChunkKey &key, const ChunkMeta &meta,
                                                    Tier t, const ModelCompression &mc) const;
  // Expected reuses of a chunk from its history: (1 + hits) x h / (h + idle), h the horizon; 1
  // for a chunk not resident (new).
  double reuse_of(const ChunkKey &key, double horizon_s) const;
  // Fills in the ratios and built-in qualities of a model's methods from one of its chunks
  // (its first layer), once.
  void measure_methods(const ChunkKey &model, const std::byte *decoded);
  bool needs_measure(const ChunkKey &model) const;
  // measure_methods on a resident exact chunk, when its model still needs it.
  void measure_from(const ChunkUse &use);
  // Keeps what was measured for the methods a new policy shares with the old one (a new alpha
  // or bandwidth does not make the cache measure again).
  static void carry_measurements(const AdaptivePolicy &from, AdaptivePolicy &to);
  // The model's reuse horizon in adaptive mode; 0 when it is not in adaptive mode.
  double adaptive_horizon(const ChunkKey &model) const;
  // A victim of make_room in tier t moved (after: its meta there, t itself when it was
  // re-encoded in place) or dropped (nullopt): what it lost per byte it freed goes into the
  // tier's price.
  void note_victim(Tier t, const ChunkMeta &before, double reuse,
                   const std::optional<std::pair<Tier, ChunkMeta>> &after);
  // What make_room does with a victim of the adaptive policy: move it down (or drop it from the
  // last tier, as demote does), drop it, or re-encode it in place under a smaller method.
  struct RoomAction {
    enum class Kind : uint8_t { down, drop, compress };
    Kind kind = Kind::down;
    codec::CodecParams to{};  // compress: the encoding
  };
  // The action that loses the least utility per byte it frees in tier t (AdaptCache's greedy
  // step, on the victim the eviction order offers): down, for a chunk of a model not in
  // adaptive mode or in lent memory.
  RoomAction room_action(const ChunkMeta &meta, Tier t) const;
  // Re-encodes `key` in tier t under `to` into a slot the tier has (no room is made for it):
  // the bytes it freed, 0 when it could not (no slot of its size, pinned, moving, not there).
  uint64_t compress_in_place(const ChunkKey &key, Tier t, const codec::CodecParams &to);
  // Drops `key` from tier t by the policy (not pinned, not moving): its bytes, else 0.
  uint64_t evict(const ChunkKey &key, Tier t);
  // A chunk's bytes read from `where` and re-encoded under `to`.
  Encoded recode(SlotRef where, const ChunkMeta &meta, const codec::CodecParams &to);
  codec::ChunkShape shape_of(const ChunkKey &model) const;
  // now_ns: the caller's reading of now() (victims are chosen at that time; one reading serves
  // a whole store).
  std::optional<uint64_t> allocate_in(Tier t, const ChunkKey &key, const ChunkMeta &meta,
                                      bool make_room, uint64_t now_ns);
  // Demotes the policy's victims out of tier t until it has `bytes` free for `model` (and at
  // least one with at_least_one); never a pinned or moving chunk (those are not in the eviction
  // order). False when it stopped short: nothing left that may go.
  bool make_room(Tier t, const ChunkKey &model, uint64_t bytes, bool at_least_one, uint64_t now_ns);
  std::optional<Tier> lower_tier(Tier t, const ChunkKey &model) const;
  // Whether tier t drops its victims rather than moving them: no tier below it (for any model;
  // never a lent tier) and no adaptive policy choosing per victim.
  bool drops_victims(Tier t) const;
  // Whether chunks of `model` entering tier t may be stored encoded (their sizes then vary).
  bool encodes(const ChunkKey &model, Tier t) const;
  // Moves one chunk down a tier, or drops it from the last: the bytes it took in `from`, or 0
  // when it could not be touched (moving, pinned with respect_pins, no longer in `from`).
  uint64_t demote(const ChunkKey &key, Tier from, bool respect_pins, ChunkEventReason reason);
  // A move the caller asked for (pins do not hold it); `make_room`: `to` evicts by its policy
  // when full, else the move fails there.
  bool move_chunk(const ChunkKey &key, Tier from, Tier to, bool make_room = true);
  // The second half of every move begun with begin_move: copy to dst, then switch the index to
  // it. False when the chunk was dropped meanwhile or its source failed its check (then it is
  // dropped as corrupt).
  // With `recoded`, its bytes and meta are what dst receives (a move that re-encodes).
  bool complete_move(const ChunkKey &key, const ChunkUse &use, SlotRef dst,
                     const Encoded *recoded = nullptr);
  // Moves a chunk being moved (begin_move) into tier `to`, encoded as `to` asks: false when
  // `to` has no room (the move is still open) or the copy failed (the move is closed).
  enum class MoveResult : uint8_t { moved, no_room, failed };
  MoveResult move_into(const ChunkKey &key, const ChunkUse &use, Tier to, bool make_room);
  // move_into with the encoding given (nullopt: the one it has), not the one `to` asks.
  MoveResult move_as(const ChunkKey &key, const ChunkUse &use, Tier to, bool make_room,
                     const std::optional<codec::CodecParams> &target);
  void abort_move(const ChunkKey &key) noexcept;
  void transfer(const ChunkKey &key, const ChunkMeta &meta, SlotRef src, SlotRef dst);
  void drop_chunk(const ChunkKey &key, const ChunkMeta &meta, Tier from, ChunkEventReason reason);
  // Drops a victim of tier `from` that goes nowhere (index_.evict): its stored bytes, or 0 when
  // it is not one (pinned with respect_pins, moving, gone).
  uint64_t drop_victim(const ChunkKey &key, Tier from, bool respect_pins, ChunkEventReason reason);
  void free_slots(const std::vector<SlotRef> &slots) noexcept;
  void emit(const ChunkEvent &e);
  // The free bytes the thread keeps in tier t for `model` (demote_free_percent of its capacity).
  uint64_t free_target(Tier t, const ChunkKey &model) const;
  // Whether the host tier demotes ahead: some tier below it can take its victims.
  bool host_demotes_ahead() const;
  // Whether the background thread has work that comes due every period: leases to renew (their
  // beats, evacuation room and demotion ride the same pass), or a demotion that fell short and
  // retries. Without any it sleeps until the disk tier's next group commit, if one is pending,
  // or until woken (a borrow, a lender asking a lease back, stores past a demotion target, the
  // first record written after a group commit, the end), so an idle context makes no wake-up.
  // Not under thread_mu_ (a lease's tier lock comes first).
  bool passes_due() const;
  // Asks the thread for a pass without renewing every lease (wake() does both); false when a
  // pass was asked for already (or the thread is stopping) and nothing was signalled.
  bool nudge() noexcept;
  // Makes room in t down to its free target; whether the target was reached.
  bool demote_ahead(Tier t, const ChunkKey &model);
  // Asks the host tier to keep free slots for every chunk the lent tiers can hold.
  void keep_evacuation_room();
  // Moves every chunk of a lease that is asked back down a tier (or drops them, for a lost
  // lease) and retires the lease once none is left in it.
  void empty_lease(Tier t, const PeerTier::LeaseStatus &l);
  void run_thread();

  Context &ctx_;
  const CacheOptions options_;
  ChunkIndex index_;                            // keeps the eviction order of options_.policy
  std::array<size_t, kTierCount> chain_pos_{};  // each tier's place in options_.chain
  std::unique_ptr<PeerTier> peer_;
  std::unique_ptr<PeerTier> remote_;
  std::unique_ptr<HostTier> host_;
  std::unique_ptr<DiskTier> disk_;

  // One callback as set, with the number of threads running it: set_event_callback swaps in a
  // new one under cb_mu_ and waits on cb_cv_ for the old one's count to fall to the calls of
  // its own thread.
  struct EventSlot {
    ChunkEventFn fn;
    uint32_t running = 0;  // guarded by cb_mu_
  };
  std::mutex cb_mu_;
  std::condition_variable cb_cv_;
  std::shared_ptr<EventSlot> on_event_;
  std::atomic<bool> has_event_fn_{false};  // on_event_ is set (written under cb_mu_)
  std::mutex maint_mu_;
  std::mutex room_mu_;  // guards lent_chunk_bytes_
  std::unordered_map<ChunkKey, uint64_t, ChunkKeyHash> lent_chunk_bytes_;  // model -> chunk bytes
  mutable std::shared_mutex comp_mu_;                                      // guards compression_
  std::unordered_map<ChunkKey, ModelCompression, ChunkKeyHash> compression_;
  // Per tier, the utility per byte its last victims lost (an average with weight 1/8 on the
  // newest): what the adaptive policy charges a chunk entering it for its bytes.
  std::array<std::atomic<double>, kTierCount> price_{};
  std::atomic<uint32_t> adaptive_models_{0};  // models in adaptive mode: 0 skips the policy

  std::array<std::atomic<uint32_t>, kTierCount> loads_active_{};
  std::array<std::atomic<uint64_t>, kTierCount> hits_{};
  std::array<std::atomic<uint64_t>, kTierCount> reserved_{};  // bytes of reserved slots, by tier
  std::atomic<uint64_t> misses_{0}, stores_{0}, stores_rejected_{0}, evictions_{0}, demotions_{0},
      promotions_{0}, load_failures_{0}, revocations_{0}, deferred_{0}, lossy_refused_{0},
      encodes_{0}, decodes_{0}, compressed_in_place_{0};

  std::atomic<bool> leases_signalled_{false};  // a lender may have asked a lease back
  std::atomic<bool> demote_short_{false};      // the last pass left a tier below its target
  std::atomic<uint64_t> store_wakes_{0};
  std::atomic<uint64_t> thread_passes_{0};
  std::mutex thread_mu_;  // guards stop_ and woken_
  std::condition_variable thread_cv_;
  bool stop_ = false;
  bool woken_ = false;
  std::thread thread_;
};

}  // namespace swiftkv
