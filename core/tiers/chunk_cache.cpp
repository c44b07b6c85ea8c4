// Placement, eviction, the demotion chain and the borrower's lease duties. A chunk moves by
// copy, then switch in the index, then free of the old copy: at every moment exactly one copy is
// the readable one (ChunkIndex), so nothing is readable twice nor lost in between.
#include "core/tiers/chunk_cache.hpp"

#include <algorithm>
#include <chrono>
#include <map>
#include <utility>

#include "core/codec/layer_decode.hpp"
#include "core/common/clock.hpp"
#include "core/common/error.hpp"
#include "core/memory/host_memory.hpp"

namespace swiftkv {

void check_chain(const std::array<Tier, kTierCount> &chain) {
  std::array<bool, kTierCount> seen{};
  for (const Tier t : chain) {
    if (tier_slot(t) >= kTierCount || seen[tier_slot(t)]) {
      fail_invalid("the tier chain must name each of peer, remote, host and disk once");
    }
    seen[tier_slot(t)] = true;
  }
  if (chain.front() != Tier::peer || chain.back() != Tier::disk) {
    fail_invalid("the tier chain must begin with peer and end with disk");
  }
}

ChunkCache::ChunkCache(Context &ctx, CacheOptions options)
    : ctx_(ctx), options_(std::move(options)), index_(options_.policy, options_.cost) {
  check_recompute_cost(options_.cost, "the recompute cost model:");
  if (options_.demote_free_percent > 100) {
    fail_invalid("demote_free_percent (" + std::to_string(options_.demote_free_percent) +
                 ") is above 100");
  }
  check_chain(options_.chain);
  for (size_t i = 0; i < kTierCount; ++i) chain_pos_[tier_slot(options_.chain[i])] = i;
  peer_ = std::make_unique<PeerTier>(Tier::peer, [this] { wake(); });
  remote_ = std::make_unique<PeerTier>(Tier::remote, [this] { wake(); });
  // Slabs made ahead on every context: see HostTier.
  host_ = std::make_unique<HostTier>(ctx_, options_.host_slab_bytes, true);
  const ContextConfig &c = ctx_.config();
  if (c.disk_path) {
    DiskOptions d;
    d.dir = *c.disk_path;
    d.budget_bytes = c.disk_budget_bytes;
    d.segment_bytes = c.disk_segment_bytes;
    d.sync_ns = c.disk_sync_ns;
    disk_ = std::make_unique<DiskTier>(d);
    // The records of an earlier context come back as they were written; their conversations are
    // as idle as the record's age says, so they are the first a policy gives up.
    const uint64_t now_ns = now();
    timespec rt{};
    clock_gettime(CLOCK_REALTIME, &rt);
    const uint64_t real_ns =
        static_cast<uint64_t>(rt.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(rt.tv_nsec);
    std::vector<SlotRef> duplicates;
    disk_->rebuild([&](const DiskTier::Found &f) {
      const uint64_t age = real_ns > f.written_ns ? real_ns - f.written_ns : 0;
      const uint64_t last = now_ns > age ? now_ns - age : 0;
      bool kept = false;
      try {
        kept = index_.insert(f.key, f.meta, SlotRef{Tier::disk, f.slot}, last);
      } catch (const Error &) {
        // Sizes the index cannot hold (not whole tokens): not a chunk of any model.
      }
      if (!kept) duplicates.push_back(SlotRef{Tier::disk, f.slot});
    });
    free_slots(duplicates);
    // The first record written after a group commit makes one due: a thread asleep with
    // nothing due learns when (a pass, which waits for it).
    disk_->on_due([this] { nudge(); });
  }
  if (options_.maintenance_interval_ms != 0) thread_ = std::thread([this] { run_thread(); });
}

ChunkCache::~ChunkCache() {
  stop_thread();
  if (disk_) disk_->on_due(nullptr);  // its last sync, at its end, wakes nobody
  // The leases go first, with the lenders' watches that would wake this cache.
  peer_.reset();
  remote_.reset();
}

void ChunkCache::stop_thread() noexcept {
  if (thread_.joinable()) {
    {
      std::lock_guard lock(thread_mu_);
      stop_ = true;
    }
    thread_cv_.notify_all();
    thread_.join();
  }
  // Chunks in lent memory are lost with the cache; the peer tier gives the leases back.
}

uint64_t ChunkCache::now() const { return options_.clock ? options_.clock() : monotonic_ns(); }

namespace {
// The event callbacks the calling thread is running, innermost last, with their caches (a
// callback may store, and so evict, and so run a callback again).
struct RunningSlot {
  const void *cache;
  const void *slot;
};
thread_local std::vector<RunningSlot> t_running_slots;
}  // namespace

void ChunkCache::set_event_callback(ChunkEventFn fn) {
  auto slot = fn ? std::make_shared<EventSlot>() : nullptr;
  if (slot) slot->fn = std::move(fn);
  std::unique_lock lock(cb_mu_);
  has_event_fn_.store(slot != nullptr, std::memory_order_relaxed);
  std::shared_ptr<EventSlot> old = std::exchange(on_event_, std::move(slot));
  if (!old) return;
  // A call of the old callback on this very thread is below us on the stack: not waited for.
  const auto mine = static_cast<uint32_t>(
      std::count_if(t_running_slots.begin(), t_running_slots.end(),
                    [&](const RunningSlot &r) { return r.slot == old.get(); }));
  cb_cv_.wait(lock, [&] { return old->running == mine; });
}

bool ChunkCache::in_event_callback() const noexcept {
  return std::any_of(t_running_slots.begin(), t_running_slots.end(),
                     [this](const RunningSlot &r) { return r.cache == this; });
}

void ChunkCache::emit(const ChunkEvent &e) {
  // Without a callback an eviction takes no lock here (one per chunk of a full tier's stores).
  if (!has_event_fn_.load(std::memory_order_relaxed)) return;
  std::shared_ptr<EventSlot> slot;
  {
    std::lock_guard lock(cb_mu_);
    if (!on_event_) return;
    slot = on_event_;
    ++slot->running;
  }
  t_running_slots.push_back(RunningSlot{this, slot.get()});
  try {
    slot->fn(e);
  } catch (...) {
    // The C callback cannot throw; a failure of the wrapper around it loses one event only.
  }
  t_running_slots.pop_back();
  {
    std::lock_guard lock(cb_mu_);
    --slot->running;
  }
  cb_cv_.notify_all();
}

TierStore *ChunkCache::store_of(Tier t) const noexcept {
  switch (t) {
    case Tier::peer: return peer_.get();
    case Tier::host: return host_.get();
    case Tier::disk: return disk_.get();
    case Tier::remote: return remote_.get();
  }
  return nullptr;
}

bool ChunkCache::configured(Tier t, const ChunkKey &model) const {
  switch (t) {
    case Tier::peer: return peer_->has_leases(model);
    case Tier::host: return ctx_.config().host_budget_bytes != 0;
    case Tier::disk: return disk_ != nullptr;
    case Tier::remote: return remote_->has_leases(model);
  }
  return false;
}

std::optional<Tier> ChunkCache::lower_tier(Tier t, const ChunkKey &model) const {
  for (size_t i = chain_pos_[tier_slot(t)] + 1; i < kTierCount; ++i) {
    if (configured(options_.chain[i], model)) return options_.chain[i];
  }
  return std::nullopt;
}

PeerTier &ChunkCache::lent_tier(Tier t) const noexcept {
  return t == Tier::remote ? *remote_ : *peer_;
}

void ChunkCache::free_slots(const std::vector<SlotRef> &slots) noexcept {
  for (const SlotRef &s : slots) store_of(s.tier)->free(s.slot);
}

LookupResult ChunkCache::lookup(std::span<const ChunkKey> keys, uint8_t *residency) {
  LookupResult r;
  r.chunks = keys.size();
  const uint64_t t = now();
  std::vector<std::optional<Tier>> tiers(keys.size());
  index_.touch_many(keys, t, tiers.data());
  uint64_t run_start = 0, run = 0;  // the current run of resident chunks
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::optional<Tier> tier = tiers[i];
    if (residency != nullptr) residency[i] = tier ? tier_code(*tier) : kDropped;
    if (!tier) {
      misses_.fetch_add(1, std::memory_order_relaxed);
      run = 0;
      continue;
    }
    ++r.per_tier[tier_slot(*tier)];
    hits_[tier_slot(*tier)].fetch_add(1, std::memory_order_relaxed);
    if (run++ == 0) run_start = i;
    if (run_start == 0) r.prefix = run;
    // The longest run, the earliest of equal ones: a run from chunk 0 is the prefix.
    if (run > r.loadable) {
      r.loadable = run;
      r.dropped_head = run_start;
    }
  }
  return r;
}

std::optional<uint64_t> ChunkCache::allocate_in(Tier t, const ChunkKey &key, const ChunkMeta &meta,
                                                bool room, uint64_t now_ns) {
  TierStore *s = store_of(t);
  if (std::optional<uint64_t> slot = s->allocate(key, meta)) return slot;
  if (!room) return std::nullopt;
  // A tier may count room it cannot hand out in one piece (the tail of a disk segment): then
  // one more victim at a time, a few times.
  for (int tries = 0; tries < 16; ++tries) {
    // The allocation just failed: at least one victim goes before the free bytes are asked.
    if (!make_room(t, meta.model, meta.stored(), true, now_ns)) return std::nullopt;
    if (std::optional<uint64_t> slot = s->allocate(key, meta)) return slot;
  }
  return std::nullopt;
}

std::optional<SlotRef> ChunkCache::place(const ChunkKey &key, const ChunkMeta &meta, Tier first) {
  for (size_t i = chain_pos_[tier_slot(first)]; i < kTierCount; ++i) {
    const Tier t = options_.chain[i];
    if (!configured(t, meta.model)) continue;
    if (std::optional<uint64_t> slot = allocate_in(t, key, meta, true, now())) {
      return SlotRef{t, *slot};
    }
  }
  return std::nullopt;
}

bool ChunkCache::drops_victims(Tier t) const {
  return adaptive_models_.load(std::memory_order_relaxed) == 0 && !lent(t) &&
         !lower_tier(t, ChunkKey{});
}

bool ChunkCache::encodes(const ChunkKey &model, Tier t) const {
  if (lent(t)) return false;
  std::shared_lock lock(comp_mu_);
  const auto it = compression_.find(model);
  return it != compression_.end() &&
         (it->second.adaptive.enabled || it->second.fixed[tier_slot(t)].has_value());
}

namespace {
// What one full-tier eviction pass lists, kept by the thread from one pass to the next: three
// allocations a store were a tenth of an eviction's time. A chunk event callback may store from
// inside a pass (the same thread, a pass within a pass): that one lists into its own. A pass
// that listed many more victims than a store's batch gives the memory back when it ends.
struct EvictLists {
  std::vector<ChunkIndex::Evicted> gone;
  std::vector<SlotRef> to_free;
  std::vector<uint64_t> slots;
};
class ScratchLists {
 public:
  ScratchLists() : lists_(t_busy ? own_ : t_lists) {
    mine_ = !t_busy;
    t_busy = true;
  }
  ~ScratchLists() {
    if (!mine_) return;
    t_busy = false;
    constexpr size_t kKeep = 1024;
    if (t_lists.gone.capacity() > kKeep) t_lists = EvictLists{};
  }
  ScratchLists(const ScratchLists &) = delete;
  ScratchLists &operator=(const ScratchLists &) = delete;
  EvictLists &operator*() noexcept { return lists_; }

 private:
  static thread_local EvictLists t_lists;
  static thread_local bool t_busy;
  EvictLists own_;
  EvictLists &lists_;
  bool mine_ = false;
};
thread_local EvictLists ScratchLists::t_lists;
thread_local bool ScratchLists::t_busy = false;
}  // namespace

bool ChunkCache::make_room(Tier t, const ChunkKey &model, uint64_t bytes, bool at_least_one,
                           uint64_t now_ns) {
  const TierStore *s = store_of(t);
  // Victims come from the tier's eviction order, one at a time: no scan of the index. A victim
  // another thread takes meanwhile is simply not ours to move, and the order offers the next.
  // The tier's free bytes are asked after each: a chunk still read frees its slot later, and a
  // disk segment gives its room back only once it can be cleaned.
  bool evicted = false;
  if (drops_victims(t)) {
    // The last tier of the chain drops its victims, each found and removed in one step of the
    // index: a full tier does this at every store.
    ScratchLists lists;
    std::vector<ChunkIndex::Evicted> &gone = (*lists).gone;
    std::vector<SlotRef> &to_free = (*lists).to_free;
    std::vector<uint64_t> &slots = (*lists).slots;
    for (;;) {
      uint64_t want = bytes;  // at_least_one: an allocation just failed, at least a chunk's worth
      if (evicted || !at_least_one) {
        const uint64_t free_now = s->free_bytes(model);
        if (free_now >= bytes) return true;
        want = bytes - free_now;
      }
      gone.clear();
      to_free.clear();
      index_.evict_victims(t, model, now_ns, want, gone, to_free);
      if (gone.empty()) return evicted;
      slots.clear();
      for (const SlotRef &r : to_free) slots.push_back(r.slot);  // all of tier t
      store_of(t)->free_many(slots);
      evictions_.fetch_add(gone.size(), std::memory_order_relaxed);
      for (const ChunkIndex::Evicted &e : gone) {
        emit(ChunkEvent{e.meta.model, e.key, t, std::nullopt, ChunkEventReason::policy});
      }
      evicted = true;
    }
  }
  std::optional<ChunkKey> last;
  while ((at_least_one && !evicted) || s->free_bytes(model) < bytes) {
    const std::optional<ChunkKey> v = index_.victim(t, model, now_ns);
    if (!v || v == last) return evicted;  // nothing may go, or a victim that would not move
    last = v;
    if (adaptive_models_.load(std::memory_order_relaxed) == 0) {
      evicted |= demote(*v, t, true, ChunkEventReason::policy) != 0;
      continue;
    }
    // The adaptive policy takes the victim's cheapest action per byte freed (re-encoded in
    // place when a slot of its new size is free, else moved down or dropped) and prices the
    // tier's bytes by what its victims lose.
    const std::optional<ChunkView> before = index_.view(*v);
    const double horizon = before ? adaptive_horizon(before->meta.model) : 0;
    const double reuse = horizon > 0 ? reuse_of(*v, horizon) : 0;
    const RoomAction act = before && horizon > 0 ? room_action(before->meta, t) : RoomAction{};
    uint64_t freed = 0;
    if (act.kind == RoomAction::Kind::compress) freed = compress_in_place(*v, t, act.to);
    if (act.kind == RoomAction::Kind::drop) freed = evict(*v, t);
    if (freed == 0) freed = demote(*v, t, true, ChunkEventReason::policy);
    const bool gone = freed != 0;
    evicted |= gone;
    if (gone && before && reuse > 0) {
      const std::optional<ChunkView> after = index_.view(*v);
      note_victim(t, before->meta, reuse,
                  after
                      ? std::optional<std::pair<Tier, ChunkMeta>>({after->where.tier, after->meta})
                      : std::nullopt);
    }
  }
  return true;
}

void ChunkCache::abort_move(const ChunkKey &key) noexcept {
  std::vector<SlotRef> to_free;
  index_.abort_move(key, to_free);
  free_slots(to_free);
}

bool ChunkCache::complete_move(const ChunkKey &key, const ChunkUse &use, SlotRef dst,
                               const Encoded *recoded) {
  try {
    if (recoded != nullptr) {
      store_of(dst.tier)->write(dst.slot, key, recoded->meta, recoded->bytes.data());
    } else {
      transfer(key, use.meta, use.where, dst);
    }
  } catch (const Error &) {
    // The source failed its check (a disk chunk gone bad) or the copy failed: give up on it.
    store_of(dst.tier)->free(dst.slot);
    abort_move(key);
    load_failures_.fetch_add(1, std::memory_order_relaxed);
    drop_chunk(key, use.meta, use.where.tier, ChunkEventReason::corrupt);
    return false;
  }
  // A lease lost during the copy may have been overwritten under it: the copy is not the chunk.
  if (lent(use.where.tier) && !readable(use.where)) {
    store_of(dst.tier)->free(dst.slot);
    abort_move(key);
    drop_chunk(key, use.meta, use.where.tier, ChunkEventReason::revoked);
    return false;
  }
  std::vector<SlotRef> to_free;
  const bool moved = recoded != nullptr ? index_.finish_move(key, dst, recoded->meta, to_free)
                                        : index_.finish_move(key, dst, to_free);
  free_slots(to_free);
  return moved;
}

ChunkCache::MoveResult ChunkCache::move_into(const ChunkKey &key, const ChunkUse &use, Tier to,
                                             bool room) {
  // The adaptive policy's first look at this model's bytes may be a chunk on its way down.
  if (!lent(to)) measure_from(use);
  return move_as(key, use, to, room, entering(key, use.meta, to));
}

ChunkCache::MoveResult ChunkCache::move_as(const ChunkKey &key, const ChunkUse &use, Tier to,
                                           bool room,
                                           const std::optional<codec::CodecParams> &target) {
  std::optional<Encoded> recoded;
  if (const std::optional<codec::CodecParams> &p = target) {
    try {
      recoded = recode(use.where, use.meta, *p);
    } catch (const Error &) {
      // The source does not read or decode: it is dropped as corrupt, as a failed copy is.
      abort_move(key);
      load_failures_.fetch_add(1, std::memory_order_relaxed);
      drop_chunk(key, use.meta, use.where.tier, ChunkEventReason::corrupt);
      return MoveResult::failed;
    } catch (...) {
      abort_move(key);
      throw;
    }
  }
  const std::optional<uint64_t> slot =
      allocate_in(to, key, recoded ? recoded->meta : use.meta, room, now());
  if (!slot) return MoveResult::no_room;
  return complete_move(key, use, SlotRef{to, *slot}, recoded ? &*recoded : nullptr)
             ? MoveResult::moved
             : MoveResult::failed;
}

uint64_t ChunkCache::demote(const ChunkKey &key, Tier from, bool respect_pins,
                            ChunkEventReason reason) {
  // The last tier of the chain (host or disk: their lower tiers are every model's) drops its
  // victims: one step in the index, as a full tier evicts at each store.
  if (!lent(from) && !lower_tier(from, ChunkKey{}))
    return drop_victim(key, from, respect_pins, reason);
  std::optional<ChunkUse> use = index_.begin_move(key, from, respect_pins);
  if (!use) return 0;
  const ChunkMeta meta = use->meta;
  for (std::optional<Tier> to = lower_tier(from, meta.model); to;
       to = lower_tier(*to, meta.model)) {
    const MoveResult r = move_into(key, *use, *to, true);
    if (r == MoveResult::no_room) continue;
    if (r == MoveResult::moved) {
      demotions_.fetch_add(1, std::memory_order_relaxed);
      if (reason == ChunkEventReason::revoked) revocations_.fetch_add(1, std::memory_order_relaxed);
      emit(ChunkEvent{meta.model, key, from, *to, reason});
    }
    return meta.stored();
  }
  // No lower tier has room: the chunk is dropped.
  abort_move(key);
  drop_chunk(key, meta, from, reason);
  return meta.stored();
}

uint64_t ChunkCache::evict(const ChunkKey &key, Tier t) {
  return drop_victim(key, t, true, ChunkEventReason::policy);
}

uint64_t ChunkCache::drop_victim(const ChunkKey &key, Tier from, bool respect_pins,
                                 ChunkEventReason reason) {
  std::vector<SlotRef> to_free;
  const std::optional<ChunkMeta> meta = index_.evict(key, from, respect_pins, to_free);
  if (!meta) return 0;
  free_slots(to_free);
  if (reason == ChunkEventReason::policy) evictions_.fetch_add(1, std::memory_order_relaxed);
  if (reason == ChunkEventReason::revoked) revocations_.fetch_add(1, std::memory_order_relaxed);
  emit(ChunkEvent{meta->model, key, from, std::nullopt, reason});
  return meta->stored();
}

uint64_t ChunkCache::compress_in_place(const ChunkKey &key, Tier t, const codec::CodecParams &to) {
  std::optional<ChunkUse> use = index_.begin_move(key, t, true);
  if (!use) return 0;
  const uint64_t before = use->meta.stored();
  const MoveResult r = move_as(key, *use, t, false, to);
  if (r == MoveResult::no_room) {
    abort_move(key);
    return 0;
  }
  if (r == MoveResult::failed) return before;  // dropped as corrupt: its slot is free
  const std::optional<ChunkView> after = index_.view(key);
  const uint64_t now_stored = after ? after->meta.stored() : 0;
  compressed_in_place_.fetch_add(1, std::memory_order_relaxed);
  return before > now_stored ? before - now_stored : 0;
}

void ChunkCache::drop_chunk(const ChunkKey &key, const ChunkMeta &meta, Tier from,
                            ChunkEventReason reason) {
  std::vector<SlotRef> to_free;
  if (!index_.drop(key, false, from, to_free)) return;
  free_slots(to_free);
  if (reason == ChunkEventReason::policy) evictions_.fetch_add(1, std::memory_order_relaxed);
  if (reason == ChunkEventReason::revoked) revocations_.fetch_add(1, std::memory_order_relaxed);
  emit(ChunkEvent{meta.model, key, from, std::nullopt, reason});
}

void ChunkCache::transfer(const ChunkKey &key, const ChunkMeta &meta, SlotRef src, SlotRef dst) {
  TierStore *s = store_of(src.tier);
  TierStore *d = store_of(dst.tier);
  int32_t sdev = -1, ddev = -1;
  std::byte *sp = s->address(src.slot, &sdev);
  std::byte *dp = d->address(dst.slot, &ddev);
  if (sp != nullptr && dp != nullptr) {
    copy_bytes(dp, ddev, sp, sdev, meta.stored());
  } else if (sp != nullptr && sdev < 0) {
    d->write(dst.slot, key, meta, sp);
  } else if (dp != nullptr && ddev < 0) {
    s->read(src.slot, meta, dp);
  } else {
    // Device memory on one side and a file on the other: through host memory.
    std::vector<std::byte> staging(meta.stored());
    s->read(src.slot, meta, staging.data());
    d->write(dst.slot, key, meta, staging.data());
  }
}

bool ChunkCache::move_chunk(const ChunkKey &key, Tier from, Tier to, bool make_room) {
  std::optional<ChunkUse> use = index_.begin_move(key, from, false);
  if (!use) return false;
  const MoveResult r = move_into(key, *use, to, make_room);
  if (r == MoveResult::no_room) abort_move(key);
  return r == MoveResult::moved;
}

uint64_t ChunkCache::store(const ChunkKey &model, std::span<const ChunkKey> keys,
                           uint32_t chunk_tokens, uint64_t chunk_bytes, const std::byte *src,
                           uint64_t *leading_so_far, uint32_t first_position) {
  const uint64_t t = now();
  uint64_t leading = 0;
  if (leading_so_far != nullptr) *leading_so_far = 0;
  bool run_open = true;
  std::vector<std::optional<Tier>> tiers(keys.size());
  index_.touch_many(keys, t, tiers.data());
  // A full last tier makes the call's room at once: its victims leave the index in one pass and
  // their slots go back in one call, rather than one eviction per chunk placed. (Chunks it
  // encodes have sizes not known yet: those make room as each is placed.)
  const uint64_t absent =
      static_cast<uint64_t>(std::count(tiers.begin(), tiers.end(), std::nullopt));
  if (absent != 0) {
    for (size_t i = 0; i < kTierCount; ++i) {
      const Tier first = options_.chain[i];
      if (!configured(first, model)) continue;
      if (drops_victims(first) && !encodes(model, first)) {
        make_room(first, model, absent * chunk_bytes, false, t);
      }
      break;
    }
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    bool resident = tiers[i].has_value();
    if (!resident) {
      const ChunkMeta meta{model, first_position + static_cast<uint32_t>(i), chunk_tokens,
                           chunk_bytes};
      resident =
          place_new(keys[i], meta, src + i * chunk_bytes, options_.chain[0], t) != Placed::no_room;
      if (!resident) stores_rejected_.fetch_add(1, std::memory_order_relaxed);
    }
    if (!resident) run_open = false;
    if (run_open) ++leading;
    if (leading_so_far != nullptr) *leading_so_far = leading;
  }
  after_stores(model);
  return leading;
}

uint64_t ChunkCache::retrieve(std::span<const ChunkKey> keys, uint64_t start, uint64_t chunk_bytes,
                              std::byte *dst) {
  const uint64_t t = now();
  // The run of resident chunks from `start` is held for reading, then read at once (a lender's
  // chunks in one batch), then checked in order: the first that failed ends what is returned.
  // A chunk of another size than its model's (a record that passed its checks but not this) is
  // not this chunk: it ends the run, is dropped as corrupt and never copied.
  std::vector<ChunkUse> uses;
  for (size_t i = start; i < keys.size(); ++i) {
    std::optional<ChunkUse> use = index_.begin_read(keys[i]);
    if (!use) break;
    if (use->meta.bytes == chunk_bytes && !loadable(use->meta)) {
      end_read(keys[i]);  // not a failure: the chunk stays for who accepts it
      break;
    }
    uses.push_back(*use);
    if (use->meta.bytes != chunk_bytes) break;
  }
  const size_t n = uses.size();
  std::vector<ChunkRead> reads;
  std::vector<size_t> read_of;  // the chunk each read is for
  std::vector<uint8_t> ok(n, 0), lost(n, 0);
  std::array<std::optional<LoadScope>, kTierCount> scopes;
  for (size_t k = 0; k < n; ++k) {
    const ChunkUse &u = uses[k];
    // Lent memory is checked before and after the copy: a lease lost in between (expired, or
    // its lender gone) may have been overwritten mid-copy, so those bytes are not returned.
    lost[k] = lent(u.where.tier) && !readable(u.where);
    if (u.meta.bytes != chunk_bytes || lost[k]) continue;
    if (!scopes[tier_slot(u.where.tier)])
      scopes[tier_slot(u.where.tier)].emplace(*this, u.where.tier);
    reads.push_back({u.where, &u.meta, dst + k * chunk_bytes});
    read_of.push_back(k);
  }
  std::vector<uint8_t> read_ok(reads.size());
  try {
    read_slots(reads, read_ok);
  } catch (...) {
    for (size_t k = 0; k < n; ++k) end_read(keys[start + k]);
    throw;
  }
  for (size_t r = 0; r < reads.size(); ++r) ok[read_of[r]] = read_ok[r];
  uint64_t returned = 0;
  bool run_open = true;
  for (size_t k = 0; k < n; ++k) {
    const ChunkKey &key = keys[start + k];
    const ChunkUse &u = uses[k];
    // A read that succeeded was checked against its lease after it (read_slots); a failed one
    // is a revocation, not corruption, when the lease is gone.
    if (!ok[k] && lent(u.where.tier) && !readable(u.where)) lost[k] = 1;
    std::vector<SlotRef> to_free;
    index_.end_read(key, to_free);
    free_slots(to_free);
    if (!run_open) continue;
    if (!ok[k]) {
      load_failures_.fetch_add(1, std::memory_order_relaxed);
      drop_chunk(key, u.meta, u.where.tier,
                 lost[k] ? ChunkEventReason::revoked : ChunkEventReason::corrupt);
      run_open = false;
      continue;
    }
    index_.touch(key, t);
    ++returned;
  }
  return returned;
}

ChunkCache::Placed ChunkCache::place_new(const ChunkKey &key, const ChunkMeta &meta,
                                         const std::byte *decoded, Tier first, uint64_t now_ns) {
  std::optional<Encoded> encoded;  // the last encoding made, for the next tier that asks it
  if (needs_measure(meta.model)) measure_methods(meta.model, decoded);
  for (size_t i = chain_pos_[tier_slot(first)]; i < kTierCount; ++i) {
    const Tier t = options_.chain[i];
    if (!configured(t, meta.model)) continue;
    const ChunkMeta *m = &meta;
    const std::byte *bytes = decoded;
    if (const std::optional<codec::CodecParams> p = entering(key, meta, t)) {
      if (!encoded || !same_encoding(encoded->meta, *p)) {
        encoded = encode_chunk(std::span<const std::byte>(decoded, meta.bytes), meta,
                               shape_of(meta.model), *p);
        encodes_.fetch_add(1, std::memory_order_relaxed);
      }
      m = &encoded->meta;
      bytes = encoded->bytes.data();
    }
    const std::optional<uint64_t> slot = allocate_in(t, key, *m, true, now_ns);
    if (!slot) continue;
    TierStore *s = store_of(t);
    try {
      s->write(*slot, key, *m, bytes);
    } catch (...) {
      s->free(*slot);
      throw;
    }
    // Visible to lookup only now that the bytes are whole, and only if they are still ours.
    if (s->readable(*slot) && index_.insert(key, *m, SlotRef{t, *slot}, now_ns)) {
      stores_.fetch_add(1, std::memory_order_relaxed);
      return Placed::stored;
    }
    s->free(*slot);
    return index_.contains(key) ? Placed::already : Placed::no_room;
  }
  return Placed::no_room;
}

std::optional<codec::CodecParams> ChunkCache::entering(const ChunkKey &key, const ChunkMeta &meta,
                                                       Tier t) const {
  if (lent(t)) {
    return meta.encoded() ? std::optional<codec::CodecParams>(codec::CodecParams{}) : std::nullopt;
  }
  if (meta.lossy()) return std::nullopt;  // approximate already: never encoded a second time
  std::shared_lock lock(comp_mu_);
  const auto it = compression_.find(meta.model);
  if (it == compression_.end()) return std::nullopt;
  if (it->second.adaptive.enabled) return adaptive_choice(key, meta, t, it->second);
  const std::optional<codec::CodecParams> &p = it->second.fixed[tier_slot(t)];
  if (!p || same_encoding(meta, *p)) return std::nullopt;
  return p;
}

Encoded ChunkCache::recode(SlotRef where, const ChunkMeta &meta, const codec::CodecParams &to) {
  const codec::ChunkShape shape = shape_of(meta.model);
  std::vector<std::byte> decoded(meta.bytes);
  read_slot(where, meta, decoded.data());
  // A range of lent memory lost during the read may hold the lender's bytes by now.
  if (lent(where.tier) && !readable(where)) {
    fail(SWIFTKV_EIO, "a lent chunk was lost while it was read");
  }
  Encoded e = encode_chunk(decoded, meta, shape, to);
  if (e.meta.encoded()) encodes_.fetch_add(1, std::memory_order_relaxed);
  return e;
}

codec::ChunkShape ChunkCache::shape_of(const ChunkKey &model) const {
  std::shared_lock lock(comp_mu_);
  const auto it = compression_.find(model);
  if (it == compression_.end()) {
    fail(SWIFTKV_EIO,
         "an encoded chunk of a model not registered with the cache (" + to_hex(model) + ")");
  }
  return it->second.shape;
}

void ChunkCache::set_compression(const ChunkKey &model, const ModelCompression &c) {
  ModelCompression mc = c;
  mc.adaptive.measured = false;
  if (mc.adaptive.enabled && mc.adaptive.methods.empty()) {
    mc.adaptive.methods = default_adaptive_methods(mc.shape, mc.accept_lossy);
  }
  for (AdaptiveMethod &m : mc.adaptive.methods) {
    m.ratio = 0;
    m.measured_quality = -1;
    m.measured_decode_bandwidth = 0;
  }
  check_compression(mc);
  std::unique_lock lock(comp_mu_);
  ModelCompression &slot = compression_[model];
  if (slot.adaptive.enabled && mc.adaptive.enabled) carry_measurements(slot.adaptive, mc.adaptive);
  if (slot.adaptive.enabled) adaptive_models_.fetch_sub(1, std::memory_order_relaxed);
  if (mc.adaptive.enabled) adaptive_models_.fetch_add(1, std::memory_order_relaxed);
  slot = std::move(mc);
}

double ChunkCache::adaptive_horizon(const ChunkKey &model) const {
  std::shared_lock lock(comp_mu_);
  const auto it = compression_.find(model);
  return it != compression_.end() && it->second.adaptive.enabled ? it->second.adaptive.horizon_s
                                                                 : 0.0;
}

std::optional<ModelCompression> ChunkCache::compression(const ChunkKey &model) const {
  std::shared_lock lock(comp_mu_);
  const auto it = compression_.find(model);
  if (it == compression_.end()) return std::nullopt;
  return it->second;
}

bool ChunkCache::encodes_in(Tier t, const ChunkKey &model) const {
  std::shared_lock lock(comp_mu_);
  const auto it = compression_.find(model);
  if (it == compression_.end()) return false;
  const ModelCompression &c = it->second;
  return c.fixed[tier_slot(t)].has_value() ||
         (c.adaptive.enabled && !lent(t) && !c.adaptive.methods.empty());
}

std::optional<codec::LayerShape> ChunkCache::device_decodable(const ChunkMeta &meta) const {
  if (!meta.encoded() || !codec::decodes_by_layer(params_of(meta.encoding))) return std::nullopt;
  try {
    const codec::ChunkShape shape = shape_of(meta.model);
    if (shape.bytes() != meta.bytes) return std::nullopt;  // refused by the decode, as on the CPU
    const codec::LayerShape ls = codec::layer_shape_of(shape);
    if (!codec::layer_fits_device(ls)) return std::nullopt;  // decoded on the host
    return ls;
  } catch (const Error &) {
    return std::nullopt;  // a model not registered: the CPU path reports it
  }
}

void ChunkCache::check_device_frame(std::span<const std::byte> stored, const ChunkMeta &meta) {
  const codec::ChunkShape shape = shape_of(meta.model);
  const codec::FrameInfo fi = check_stored_frame(stored, meta, shape);
  codec::check_layer_values(stored, shape, fi.params);
  decodes_.fetch_add(1, std::memory_order_relaxed);  // the device decodes what passes
}

bool ChunkCache::loadable(const ChunkMeta &meta) {
  if (!meta.lossy()) return true;
  {
    std::shared_lock lock(comp_mu_);
    const auto it = compression_.find(meta.model);
    if (it != compression_.end() && it->second.accept_lossy) return true;
  }
  lossy_refused_.fetch_add(1, std::memory_order_relaxed);
  return false;
}

uint64_t ChunkCache::compress(const ChunkKey &model, std::span<const ChunkKey> keys,
                              const std::optional<codec::CodecParams> &to) {
  std::optional<ModelCompression> c = compression(model);
  if (!c) fail_invalid("the model is not registered with the chunk cache");
  if (to) {
    codec::check_params(c->shape, *to);
    if (!codec::lossless(to->codec) && !c->accept_lossy) {
      fail_invalid(std::string("the codec ") + codec::codec_name(to->codec) +
                   " is lossy, and the model accepts exact bytes only: its chunks could never "
                   "load (set accept_lossy)");
    }
  } else if (!c->adaptive.enabled) {
    fail_invalid("the policy chooses only for a model in adaptive mode; name a codec");
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!index_.contains(keys[i])) {
      fail(SWIFTKV_ENOTFOUND, "chunk " + std::to_string(i) + " (" + to_hex(keys[i]) +
                                  ") is not cached; nothing was compressed");
    }
  }
  uint64_t there = 0;
  for (const ChunkKey &k : keys) {
    const std::optional<Tier> from = index_.peek(k);
    if (!from || lent(*from)) continue;
    std::optional<ChunkUse> use = index_.begin_move(k, *from, false);
    if (!use) continue;  // moving meanwhile: another thread's
    // The policy's choice in the tier where the chunk is (nullopt: it stays as it is). The
    // model's methods are measured on the first chunk if they were not yet; the policy is read
    // again only then.
    std::optional<codec::CodecParams> target;
    if (to) {
      if (!same_encoding(use->meta, *to)) target = to;
    } else {
      if (needs_measure(model)) {
        measure_from(*use);
        if (std::optional<ModelCompression> now = compression(model)) c = std::move(now);
      }
      if (c->adaptive.enabled) target = adaptive_choice(k, use->meta, *from, *c);
    }
    if (!target) {
      abort_move(k);
      ++there;
      continue;
    }
    // A move within the tier, under the target whatever the tier's own codec.
    const MoveResult r = move_as(k, *use, *from, true, target);
    if (r == MoveResult::no_room) abort_move(k);
    if (r == MoveResult::moved) ++there;
  }
  return there;
}

std::optional<ChunkUse> ChunkCache::begin_read(const ChunkKey &key) {
  return index_.begin_read(key);
}

void ChunkCache::end_read(const ChunkKey &key) noexcept {
  std::vector<SlotRef> to_free;
  try {
    index_.end_read(key, to_free);
  } catch (...) {
    return;  // only allocation can fail here; the slots then stay held until the context ends
  }
  free_slots(to_free);
}

std::byte *ChunkCache::address(SlotRef where, int32_t *device) const noexcept {
  return store_of(where.tier)->address(where.slot, device);
}

bool ChunkCache::readable(SlotRef where) const noexcept {
  return store_of(where.tier)->readable(where.slot);
}

void ChunkCache::read_slot(SlotRef where, const ChunkMeta &meta, std::byte *dst) {
  TierStore *s = store_of(where.tier);
  if (!meta.encoded()) {
    s->read(where.slot, meta, dst);
    return;
  }
  const codec::ChunkShape shape = shape_of(meta.model);
  std::vector<std::byte> stored(meta.stored());
  s->read(where.slot, meta, stored.data());
  decode_stored(stored, meta, shape, dst);
  decodes_.fetch_add(1, std::memory_order_relaxed);
}

void ChunkCache::read_slots(std::span<const ChunkRead> reads, std::span<uint8_t> ok) {
  // Each tier's reads in one call (in the order given); an encoded chunk is read as stored into
  // its own buffer, then decoded into dst.
  std::vector<std::vector<std::byte>> stored(reads.size());
  for (size_t t = 0; t < kTierCount; ++t) {
    std::vector<TierStore::SlotRead> batch;
    std::vector<size_t> index;
    for (size_t i = 0; i < reads.size(); ++i) {
      const ChunkRead &r = reads[i];
      if (tier_slot(r.where.tier) != t) continue;
      std::byte *dst = r.dst;
      if (r.meta->encoded() && !r.as_stored) {
        stored[i].resize(r.meta->stored());
        dst = stored[i].data();
      }
      batch.push_back({r.where.slot, r.meta, dst});
      index.push_back(i);
    }
    if (batch.empty()) continue;
    std::vector<uint8_t> done(batch.size());
    TierStore *s = store_of(static_cast<Tier>(t));
    s->read_many(batch, done);
    // Lent bytes count only if the lease still held once they were read: a lease lost
    // meanwhile may have been reused by its lender mid-read.
    for (size_t k = 0; k < batch.size(); ++k) {
      ok[index[k]] = done[k] && s->readable(batch[k].slot) ? 1 : 0;
    }
  }
  for (size_t i = 0; i < reads.size(); ++i) {
    if (!ok[i] || !reads[i].meta->encoded()) continue;
    if (reads[i].as_stored) {
      try {
        check_device_frame({reads[i].dst, reads[i].meta->stored()}, *reads[i].meta);
      } catch (const Error &) {
        ok[i] = 0;
      }
      continue;
    }
    try {
      decode_stored(stored[i], *reads[i].meta, shape_of(reads[i].meta->model), reads[i].dst);
      decodes_.fetch_add(1, std::memory_order_relaxed);
    } catch (const Error &) {
      ok[i] = 0;
    }
    stored[i] = {};
  }
}

void ChunkCache::report_failed_load(const ChunkKey &key, const ChunkMeta &meta, Tier from) {
  load_failures_.fetch_add(1, std::memory_order_relaxed);
  drop_chunk(key, meta, from, ChunkEventReason::corrupt);
}

std::optional<SlotRef> ChunkCache::reserve_slot(const ChunkKey &key, const ChunkMeta &meta) {
  const uint64_t bytes = meta.stored();
  for (size_t i = 0; i < kTierCount; ++i) {
    const Tier t = options_.chain[i];
    if (!configured(t, meta.model)) continue;
    std::atomic<uint64_t> &held = reserved_[tier_slot(t)];
    const uint64_t share = store_of(t)->capacity_bytes(meta.model) / kReserveShare;
    if (held.fetch_add(bytes, std::memory_order_relaxed) + bytes > share) {
      held.fetch_sub(bytes, std::memory_order_relaxed);
      continue;  // the requests open hold their share of this tier already
    }
    if (std::optional<uint64_t> slot = allocate_in(t, key, meta, true, now())) {
      return SlotRef{t, *slot};
    }
    held.fetch_sub(bytes, std::memory_order_relaxed);
  }
  stores_rejected_.fetch_add(1, std::memory_order_relaxed);
  return std::nullopt;
}

bool ChunkCache::publish(const ChunkKey &key, const ChunkMeta &meta, SlotRef where,
                         const std::byte *staging) {
  // No longer a reservation, whatever follows: the slot becomes the chunk's or is freed.
  reserved_[tier_slot(where.tier)].fetch_sub(meta.stored(), std::memory_order_relaxed);
  TierStore *s = store_of(where.tier);
  if (staging != nullptr && entering(key, meta, where.tier)) {
    // The tier encodes: the decoded reservation gives way to the encoded chunk.
    s->free(where.slot);
    const Placed p = place_new(key, meta, staging, where.tier, now());
    if (p == Placed::no_room) stores_rejected_.fetch_add(1, std::memory_order_relaxed);
    return p == Placed::stored;
  }
  try {
    if (staging != nullptr) s->write(where.slot, key, meta, staging);
  } catch (...) {
    s->free(where.slot);
    throw;
  }
  // Visible to lookup only now that the bytes are whole, and only if they are still ours.
  if (s->readable(where.slot) && index_.insert(key, meta, where, now())) {
    stores_.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  s->free(where.slot);
  return false;
}

void ChunkCache::release_slot(SlotRef where, const ChunkMeta &meta) noexcept {
  reserved_[tier_slot(where.tier)].fetch_sub(meta.stored(), std::memory_order_relaxed);
  store_of(where.tier)->free(where.slot);
}

void ChunkCache::pin(std::span<const ChunkKey> keys) {
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!index_.pin(keys[i])) {
      for (size_t j = 0; j < i; ++j) index_.unpin(keys[j]);
      fail(SWIFTKV_ENOTFOUND, "chunk " + std::to_string(i) + " (" + to_hex(keys[i]) +
                                  ") is not cached; nothing was pinned");
    }
  }
}

void ChunkCache::unpin(std::span<const ChunkKey> keys) {
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!index_.unpin(keys[i])) {
      for (size_t j = 0; j < i; ++j) index_.pin(keys[j]);
      fail(SWIFTKV_ENOTFOUND, "chunk " + std::to_string(i) + " (" + to_hex(keys[i]) +
                                  ") is not cached or not pinned; nothing was unpinned");
    }
  }
}

uint64_t ChunkCache::move(std::span<const ChunkKey> keys, Tier to) {
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!index_.contains(keys[i])) {
      fail(SWIFTKV_ENOTFOUND, "chunk " + std::to_string(i) + " (" + to_hex(keys[i]) +
                                  ") is not cached; nothing was moved");
    }
  }
  uint64_t there = 0;
  for (const ChunkKey &k : keys) {
    const std::optional<Tier> from = index_.peek(k);
    if (!from) continue;  // dropped meanwhile
    if (*from != to && move_chunk(k, *from, to)) {
      (chain_pos_[tier_slot(to)] < chain_pos_[tier_slot(*from)] ? promotions_ : demotions_)
          .fetch_add(1, std::memory_order_relaxed);
    }
    if (index_.peek(k) == to) ++there;
  }
  return there;
}

uint64_t ChunkCache::clear(std::optional<ChunkKey> model, uint32_t tier_mask,
                           std::optional<std::span<const ChunkKey>> keys) {
  std::vector<ChunkKey> targets;
  if (keys) {
    targets.assign(keys->begin(), keys->end());
  } else {
    index_.for_each([&](const ChunkView &v) {
      if (!model || v.meta.model == *model) targets.push_back(v.key);
    });
  }
  uint64_t n = 0;
  for (const ChunkKey &k : targets) {
    const std::optional<Tier> t = index_.peek(k);
    if (!t || (tier_mask & (1u << tier_code(*t))) == 0) continue;
    std::vector<SlotRef> to_free;
    if (index_.drop(k, true, *t, to_free)) ++n;
    free_slots(to_free);
  }
  return n;
}

uint64_t ChunkCache::write_back(uint32_t from_mask) {
  if (!disk_) return 0;
  std::vector<std::pair<ChunkKey, Tier>> targets;
  index_.for_each([&](const ChunkView &v) {
    if (v.where.tier != Tier::disk && (from_mask & (1u << tier_code(v.where.tier))) != 0) {
      targets.emplace_back(v.key, v.where.tier);
    }
  });
  uint64_t moved = 0;
  for (const auto &[key, from] : targets) {
    // No room made on disk: what is there stays, and a chunk that does not fit is left behind.
    if (move_chunk(key, from, Tier::disk, false)) {
      demotions_.fetch_add(1, std::memory_order_relaxed);
      ++moved;
    }
  }
  disk_->sync();
  return moved;
}

uint64_t ChunkCache::chunks_that_fit(uint64_t chunk_bytes) const noexcept {
  uint64_t n = ctx_.config().host_budget_bytes / chunk_bytes;
  if (disk_) n += disk_->records_that_fit(chunk_bytes);
  return n;
}

void ChunkCache::reserve_for(uint64_t chunk_bytes) {
  // Tiny chunks would otherwise reserve more index than KV: up front, the index's tables and
  // nodes take at most a quarter of the host budget, or 16 MiB when that is more.
  const uint64_t limit =
      std::max<uint64_t>(ctx_.config().host_budget_bytes / 4, uint64_t{16} << 20);
  uint64_t lo = 0, hi = chunks_that_fit(chunk_bytes);
  if (ChunkIndex::reserve_bytes(hi) > limit) {
    while (lo + 1 < hi) {  // the most chunks whose reservation fits the limit
      const uint64_t mid = lo + (hi - lo) / 2;
      (ChunkIndex::reserve_bytes(mid) <= limit ? lo : hi) = mid;
    }
    hi = lo;
  }
  index_.reserve(hi);
  host_->prepare(chunk_bytes);
}

uint64_t ChunkCache::borrow(const ChunkKey &model, const GeometrySizes &sizes,
                            std::shared_ptr<LenderLink> lender, uint64_t max_units) {
  lender->check_geometry(sizes);
  const LeaseGrant g = lender->lend(max_units);
  // Memory mapped here is the peer tier; memory reached over the transport the remote tier.
  uint64_t local = 0;
  try {
    local = lent_tier(g.remote ? Tier::remote : Tier::peer).adopt(model, sizes, lender, g);
  } catch (...) {
    lender->release(g.lease_id);  // out of memory taking it in: the lease goes straight back
    throw;
  }
  {
    std::lock_guard lock(room_mu_);
    lent_chunk_bytes_[model] = sizes.full_chunk_bytes;
  }
  keep_evacuation_room();
  nudge();  // the thread may sleep with nothing due: from now on it renews this lease
  return local;
}

void ChunkCache::keep_evacuation_room() {
  if (!host_) return;
  // Per chunk size, the chunks every lease of the models of that size can hold: a reclaim
  // evacuates them into the host tier, which makes its slabs for them ahead. Nothing for a
  // cache that never borrowed.
  std::map<uint64_t, uint64_t> room;
  std::lock_guard lock(room_mu_);
  for (const auto &[model, bytes] : lent_chunk_bytes_) {
    const uint64_t lent = peer_->capacity_bytes(model) + remote_->capacity_bytes(model);
    room[bytes] += lent / bytes;
  }
  for (const auto &[bytes, slots] : room) host_->keep_room(bytes, slots);
}

void ChunkCache::empty_lease(Tier t, const PeerTier::LeaseStatus &l) {
  PeerTier &lt = lent_tier(t);
  // Only the chunks whose readable copy is in this lease: a slot may hold a copy that is being
  // replaced, or a reservation not yet published.
  for (const ChunkKey &k : lt.keys_in(l.local_id)) {
    const std::optional<SlotRef> w = index_.locate(k);
    if (!w || w->tier != t || (w->slot >> 32) != l.local_id) continue;
    if (l.lost) {
      drop_chunk(k, ChunkMeta{l.model, 0, 0, 0}, t, ChunkEventReason::revoked);
    } else {
      demote(k, t, false, ChunkEventReason::revoked);
    }
  }
  if (lt.used_slots(l.local_id) == 0) lt.retire(l.local_id);
}

void ChunkCache::give_back(const ChunkKey &model) {
  std::lock_guard lock(maint_mu_);
  for (const Tier t : {Tier::peer, Tier::remote}) {
    PeerTier &lt = lent_tier(t);
    // The leases stop taking chunks first, so nothing new lands in them while they empty.
    const std::vector<uint64_t> leases = lt.leases_of(model);
    for (uint64_t local : leases) lt.retire_later(local);
    for (uint64_t local : leases) {
      empty_lease(t, PeerTier::LeaseStatus{local, 0, model, true, false, 0});
    }
  }
}

uint64_t ChunkCache::free_target(Tier t, const ChunkKey &model) const {
  const uint64_t cap = store_of(t)->capacity_bytes(model);
  return cap / 100 * options_.demote_free_percent + cap % 100 * options_.demote_free_percent / 100;
}

bool ChunkCache::host_demotes_ahead() const {
  const bool remote_below_host =
      chain_pos_[tier_slot(Tier::remote)] > chain_pos_[tier_slot(Tier::host)] &&
      remote_->total_capacity_bytes() != 0;
  return configured(Tier::host, ChunkKey{}) &&
         (lower_tier(Tier::host, ChunkKey{}) || remote_below_host);
}

bool ChunkCache::demote_ahead(Tier t, const ChunkKey &model) {
  const TierStore *s = store_of(t);
  const uint64_t want = free_target(t, model);
  if (s->free_bytes(model) >= want) return true;
  // Loads first: a pending load out of this tier uses the link this demotion would.
  if (loads_active_[tier_slot(t)].load() != 0) {
    deferred_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  make_room(t, model, want, false, now());
  return s->free_bytes(model) >= want;
}

void ChunkCache::after_stores(const ChunkKey &model) {
  // One look per call that stored (never per chunk), and no wake-up unless the thread has work:
  // a store into a full tier evicts on its own thread, and a thread woken for nothing there
  // cost more than the store (a context switch each). A pass that could not reach its target
  // (pinned chunks, loads first) leaves the retries to the thread's own period.
  if (options_.demote_free_percent == 0 || !thread_.joinable() ||
      demote_short_.load(std::memory_order_relaxed)) {
    return;
  }
  // Woken below half the target, a pass makes room up to all of it: one wake-up per half a
  // target's worth of stores, not one per store that takes the free bytes under the target.
  bool below = false;
  for (const Tier t : {Tier::peer, Tier::remote}) {
    if (!below && lent_tier(t).capacity_bytes(model) != 0) {
      below = store_of(t)->free_bytes(model) < free_target(t, model) / 2;
    }
  }
  if (!below && host_demotes_ahead()) {
    below = store_of(Tier::host)->free_bytes(ChunkKey{}) < free_target(Tier::host, ChunkKey{}) / 2;
  }
  if (below && nudge()) store_wakes_.fetch_add(1, std::memory_order_relaxed);
}

void ChunkCache::maintain() {
  std::lock_guard lock(maint_mu_);
  if (disk_) disk_->maintain(monotonic_ns());  // group commit when due
  // The lease protocol first: a reclaimed lease holds up its lender.
  // After a wake-up every lease is renewed (and so learns whether it is asked back).
  const bool all = leases_signalled_.exchange(false, std::memory_order_relaxed);
  for (const Tier t : {Tier::peer, Tier::remote}) {
    for (const PeerTier::LeaseStatus &l : lent_tier(t).refresh(all)) empty_lease(t, l);
  }
  keep_evacuation_room();  // what stores into the host tier took of it, made again
  if (options_.demote_free_percent == 0) return;
  // Lent memory makes room per model (its victims go down, or are dropped from the last tier);
  // host memory only while some tier below it can take its victims.
  bool reached = true;
  for (const Tier t : {Tier::peer, Tier::remote}) {
    for (const ChunkKey &m : lent_tier(t).models()) reached &= demote_ahead(t, m);
  }
  if (host_demotes_ahead()) reached &= demote_ahead(Tier::host, ChunkKey{});
  demote_short_.store(!reached, std::memory_order_relaxed);
}

void ChunkCache::wake() noexcept {
  // Set before the pass is asked for: a pass already asked for reads it too (it clears woken_
  // under thread_mu_ before its leases are renewed).
  leases_signalled_.store(true, std::memory_order_relaxed);
  nudge();
}

bool ChunkCache::passes_due() const {
  return demote_short_.load(std::memory_order_relaxed) || !peer_->holds_nothing() ||
         !remote_->holds_nothing();
}

bool ChunkCache::nudge() noexcept {
  {
    std::lock_guard lock(thread_mu_);
    if (woken_ || stop_) return false;  // a pass is asked for already
    woken_ = true;
  }
  thread_cv_.notify_one();
  return true;
}

void ChunkCache::run_thread() {
  const auto interval = std::chrono::milliseconds(options_.maintenance_interval_ms);
  const auto asked = [this] { return stop_ || woken_; };
  for (;;) {
    // Asked before the lock: whatever makes work due (a borrow) then asks for a pass, which the
    // wait below sees, so nothing is missed between the two.
    const bool periodic = passes_due();
    const uint64_t disk_due = periodic || !disk_ ? 0 : disk_->due_ns();
    std::unique_lock lock(thread_mu_);
    if (periodic) {
      thread_cv_.wait_for(lock, interval, asked);
    } else if (disk_due != 0) {
      // A group commit: no pass before it (a pass has nothing else to do), as woken.
      const uint64_t now_ns = monotonic_ns();
      thread_cv_.wait_for(lock, std::chrono::nanoseconds(disk_due > now_ns ? disk_due - now_ns : 0),
                          asked);
    } else {
      thread_cv_.wait(lock, asked);
    }
    if (stop_) break;
    woken_ = false;
    lock.unlock();
    thread_passes_.fetch_add(1, std::memory_order_relaxed);
    try {
      maintain();
    } catch (...) {
      // A failed pass (a lender's region refusing, memory short) is retried on the next one;
      // what it could not do shows in the stats.
    }
  }
}

CacheStats ChunkCache::stats() const {
  CacheStats s;
  for (size_t i = 0; i < kTierCount; ++i) {
    const auto t = static_cast<Tier>(i);
    s.chunks[i] = index_.chunks(t);
    s.bytes[i] = index_.bytes(t);
    s.hits[i] = hits_[i].load();
  }
  s.capacity_bytes[tier_slot(Tier::peer)] = peer_->total_capacity_bytes();
  s.capacity_bytes[tier_slot(Tier::remote)] = remote_->total_capacity_bytes();
  s.capacity_bytes[tier_slot(Tier::host)] = ctx_.config().host_budget_bytes;
  s.capacity_bytes[tier_slot(Tier::disk)] = disk_ ? disk_->capacity_bytes(ChunkKey{}) : 0;
  s.misses = misses_.load();
  s.stores = stores_.load();
  s.stores_rejected = stores_rejected_.load();
  s.evictions = evictions_.load();
  s.demotions = demotions_.load();
  s.promotions = promotions_.load();
  s.load_failures = load_failures_.load();
  s.revocations = revocations_.load();
  if (disk_) {
    const DiskStats d = disk_->stats();
    s.corrupt_files_removed = d.records_dropped;
    s.disk_files_skipped = d.files_skipped;
    s.disk_records_mismatched = d.records_mismatched;
    s.disk_segments_cleaned = d.segments_cleaned;
    s.disk_bytes_relocated = d.bytes_relocated;
    s.disk_bytes_allocated = d.allocated_bytes;
    s.disk_full_refusals = d.full_refusals;
  }
  s.demotions_deferred = deferred_.load();
  s.codecs = index_.codec_counts();
  for (size_t t = 0; t < kTierCount; ++t) s.price[t] = price_[t].load(std::memory_order_relaxed);
  s.lossy_refused = lossy_refused_.load();
  s.encodes = encodes_.load();
  s.decodes = decodes_.load();
  s.compressed_in_place = compressed_in_place_.load();
  return s;
}

}  // namespace swiftkv
