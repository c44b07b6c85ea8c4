// The sharded chunk index and the rules that keep a chunk readable in exactly one place. Each
// shard is an open-addressing table of 32-byte slots (what a lookup reads) over a pool of entries
// (what readers, movers and the controller change).
#include "core/index/chunk_index.hpp"

#include <mutex>

namespace swiftkv {

namespace {
constexpr uint64_t kFirstCapacity = 16;
uint64_t home(uint64_t hi, uint64_t mask) noexcept { return hi & mask; }
}  // namespace

const char *tier_name(Tier t) noexcept {
  switch (t) {
    case Tier::peer: return "peer";
    case Tier::host: return "host";
    case Tier::disk: return "disk";
  }
  return "unknown";
}

ChunkIndex::ChunkIndex() : shards_(std::make_unique<Shard[]>(kShards)) {
  for (size_t i = 0; i < kShards; ++i) {
    Shard &s = shards_[i];
    s.slots = std::make_unique<Slot[]>(kFirstCapacity);
    s.table.store(s.slots.get(), std::memory_order_relaxed);
    s.mask.store(kFirstCapacity - 1, std::memory_order_relaxed);
  }
}
ChunkIndex::~ChunkIndex() = default;

void ChunkIndex::count(Shard &s, const SlotRef &where, uint64_t bytes, int sign) noexcept {
  const auto t = static_cast<size_t>(where.tier);
  const uint64_t dc = sign > 0 ? 1 : ~uint64_t{0};  // +1 or -1 modulo 2^64
  const uint64_t db = sign > 0 ? bytes : ~bytes + 1;
  s.chunks[t].store(s.chunks[t].load(std::memory_order_relaxed) + dc, std::memory_order_relaxed);
  s.bytes[t].store(s.bytes[t].load(std::memory_order_relaxed) + db, std::memory_order_relaxed);
}

uint64_t ChunkIndex::chunks(Tier t) const noexcept {
  uint64_t n = 0;
  for (size_t i = 0; i < kShards; ++i) {
    n += shards_[i].chunks[static_cast<size_t>(t)].load(std::memory_order_relaxed);
  }
  return n;
}

uint64_t ChunkIndex::bytes(Tier t) const noexcept {
  uint64_t n = 0;
  for (size_t i = 0; i < kShards; ++i) {
    n += shards_[i].bytes[static_cast<size_t>(t)].load(std::memory_order_relaxed);
  }
  return n;
}

ChunkIndex::Slot *ChunkIndex::find(const Shard &s, const ChunkKey &k) noexcept {
  const uint64_t mask = s.mask.load(std::memory_order_relaxed);
  Slot *t = s.slots.get();
  for (uint64_t i = home(k.hi, mask);; i = (i + 1) & mask) {
    Slot &slot = t[i];
    if (slot.entry == kEmpty) return nullptr;
    if (slot.lo == k.lo && slot.hi == k.hi) return &slot;
  }
}

void ChunkIndex::grow(Shard &s) {
  const uint64_t old_cap = s.mask.load(std::memory_order_relaxed) + 1;
  const uint64_t cap = old_cap * 2;
  auto fresh = std::make_unique<Slot[]>(cap);
  const uint64_t mask = cap - 1;
  for (uint64_t i = 0; i < old_cap; ++i) {
    const Slot &o = s.slots[i];
    if (o.entry == kEmpty) continue;
    uint64_t j = home(o.hi, mask);
    while (fresh[j].entry != kEmpty) j = (j + 1) & mask;
    Slot &n = fresh[j];
    n.lo = o.lo;
    n.hi = o.hi;
    n.last_active_ns.store(o.last_active_ns.load(std::memory_order_relaxed),
                           std::memory_order_relaxed);
    n.entry = o.entry;
    n.tier = o.tier;
    n.visible = o.visible;
  }
  s.slots = std::move(fresh);
  s.table.store(s.slots.get(), std::memory_order_relaxed);
  s.mask.store(mask, std::memory_order_relaxed);
}

void ChunkIndex::erase(Shard &s, Slot *slot) {
  const uint64_t mask = s.mask.load(std::memory_order_relaxed);
  Slot *t = s.slots.get();
  s.entries[slot->entry] = Entry{};
  s.free_entries.push_back(slot->entry);
  --s.used;
  // Backward-shift deletion: later slots of the same probe run move into the hole, so a lookup
  // never needs tombstones.
  uint64_t hole = static_cast<uint64_t>(slot - t);
  for (uint64_t j = (hole + 1) & mask; t[j].entry != kEmpty; j = (j + 1) & mask) {
    const uint64_t h = home(t[j].hi, mask);
    if (((j - h) & mask) >= ((j - hole) & mask)) {
      Slot &d = t[hole];
      d.lo = t[j].lo;
      d.hi = t[j].hi;
      d.last_active_ns.store(t[j].last_active_ns.load(std::memory_order_relaxed),
                             std::memory_order_relaxed);
      d.entry = t[j].entry;
      d.tier = t[j].tier;
      d.visible = t[j].visible;
      hole = j;
    }
  }
  t[hole].entry = kEmpty;
}

void ChunkIndex::reserve(uint64_t chunks) {
  // A quarter more than the even share: keys spread over the shards unevenly.
  const uint64_t per_shard = (chunks + kShards - 1) / kShards * 5 / 4 + 1;
  for (size_t i = 0; i < kShards; ++i) {
    Shard &s = shards_[i];
    std::unique_lock lock(s.mu);
    while (s.mask.load(std::memory_order_relaxed) + 1 < 2 * per_shard) grow(s);
    // The pool is made (and its pages touched) now, not on the insert that first needs them.
    const size_t have = s.entries.size();
    if (have < per_shard) {
      s.entries.resize(per_shard);
      s.free_entries.reserve(per_shard);
      for (size_t e = per_shard; e-- > have;) s.free_entries.push_back(static_cast<uint32_t>(e));
    }
  }
}

void ChunkIndex::prefetch(const ChunkKey &k) const noexcept {
  const Shard &s = shard(k);
  const Slot *t = s.table.load(std::memory_order_relaxed);
  const uint64_t mask = s.mask.load(std::memory_order_relaxed);
  // A stale table (the shard grew meanwhile) only makes the hint useless: prefetch never faults.
  __builtin_prefetch(t + home(k.hi, mask), 1, 1);
}

std::optional<Tier> ChunkIndex::touch_locked(const Shard &s, const ChunkKey &k, uint64_t now_ns) {
  Slot *slot = find(s, k);
  if (slot == nullptr || !slot->visible) return std::nullopt;
  // A relaxed store under the shared lock: concurrent touches race only to the same meaning.
  if (slot->last_active_ns.load(std::memory_order_relaxed) < now_ns) {
    slot->last_active_ns.store(now_ns, std::memory_order_relaxed);
  }
  return static_cast<Tier>(slot->tier);
}

std::optional<Tier> ChunkIndex::touch(const ChunkKey &k, uint64_t now_ns) {
  const Shard &s = shard(k);
  std::shared_lock lock(s.mu);
  return touch_locked(s, k, now_ns);
}

void ChunkIndex::touch_many(std::span<const ChunkKey> keys, uint64_t now_ns,
                            std::optional<Tier> *out) {
  constexpr size_t kAhead = 16;
  for (size_t i = 0; i < keys.size() && i < kAhead; ++i) prefetch(keys[i]);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i + kAhead < keys.size()) prefetch(keys[i + kAhead]);
    out[i] = touch(keys[i], now_ns);
  }
}

std::optional<Tier> ChunkIndex::peek(const ChunkKey &k) const {
  const Shard &s = shard(k);
  std::shared_lock lock(s.mu);
  const Slot *slot = find(s, k);
  if (slot == nullptr || !slot->visible) return std::nullopt;
  return static_cast<Tier>(slot->tier);
}

bool ChunkIndex::insert(const ChunkKey &k, const ChunkMeta &meta, SlotRef where,
                        uint64_t now_ns) {
  Shard &s = shard(k);
  std::unique_lock lock(s.mu);
  if (find(s, k) != nullptr) return false;
  if ((s.used + 1) * 2 > s.mask.load(std::memory_order_relaxed) + 1) grow(s);
  uint32_t e;
  if (!s.free_entries.empty()) {
    e = s.free_entries.back();
    s.free_entries.pop_back();
  } else {
    e = static_cast<uint32_t>(s.entries.size());
    s.entries.emplace_back();
  }
  Entry &entry = s.entries[e];
  entry.where = where;
  entry.meta = meta;
  const uint64_t mask = s.mask.load(std::memory_order_relaxed);
  uint64_t i = home(k.hi, mask);
  while (s.slots[i].entry != kEmpty) i = (i + 1) & mask;
  Slot &slot = s.slots[i];
  slot.lo = k.lo;
  slot.hi = k.hi;
  slot.last_active_ns.store(now_ns, std::memory_order_relaxed);
  slot.entry = e;
  slot.tier = static_cast<uint8_t>(where.tier);
  slot.visible = 1;
  ++s.used;
  count(s, where, meta.bytes, +1);
  return true;
}

std::optional<ChunkUse> ChunkIndex::begin_read(const ChunkKey &k) {
  Shard &s = shard(k);
  std::unique_lock lock(s.mu);
  Slot *slot = find(s, k);
  if (slot == nullptr || !slot->visible) return std::nullopt;
  Entry &e = s.entries[slot->entry];
  ++e.users;
  return ChunkUse{e.where, e.meta, e.pins};
}

bool ChunkIndex::end_use_locked(Shard &s, Slot *slot, std::vector<SlotRef> &to_free) {
  Entry &e = s.entries[slot->entry];
  --e.users;
  if (e.users != 0) return false;
  to_free.insert(to_free.end(), e.retired.begin(), e.retired.end());
  e.retired.clear();
  if (!e.doomed) return false;
  to_free.push_back(e.where);
  erase(s, slot);
  return true;
}

void ChunkIndex::end_read(const ChunkKey &k, std::vector<SlotRef> &to_free) {
  Shard &s = shard(k);
  std::unique_lock lock(s.mu);
  Slot *slot = find(s, k);
  if (slot == nullptr) return;  // cannot happen while the read holds a use
  end_use_locked(s, slot, to_free);
}

std::optional<ChunkUse> ChunkIndex::begin_move(const ChunkKey &k, Tier from, bool respect_pins) {
  Shard &s = shard(k);
  std::unique_lock lock(s.mu);
  Slot *slot = find(s, k);
  if (slot == nullptr) return std::nullopt;
  Entry &e = s.entries[slot->entry];
  if (e.doomed || e.moving || e.where.tier != from || (respect_pins && e.pins != 0)) {
    return std::nullopt;
  }
  e.moving = true;
  ++e.users;
  return ChunkUse{e.where, e.meta, e.pins};
}

bool ChunkIndex::finish_move(const ChunkKey &k, SlotRef dst, std::vector<SlotRef> &to_free) {
  Shard &s = shard(k);
  std::unique_lock lock(s.mu);
  Slot *slot = find(s, k);
  if (slot == nullptr) {  // cannot happen while the mover holds a use
    to_free.push_back(dst);
    return false;
  }
  Entry &e = s.entries[slot->entry];
  e.moving = false;
  if (e.doomed) {
    to_free.push_back(dst);
    end_use_locked(s, slot, to_free);
    return false;
  }
  // The switch: from here on every new reader reads dst; the old copy stays until the readers
  // that began before it are done.
  count(s, e.where, e.meta.bytes, -1);
  e.retired.push_back(e.where);
  e.where = dst;
  slot->tier = static_cast<uint8_t>(dst.tier);
  count(s, e.where, e.meta.bytes, +1);
  end_use_locked(s, slot, to_free);
  return true;
}

void ChunkIndex::abort_move(const ChunkKey &k, std::vector<SlotRef> &to_free) {
  Shard &s = shard(k);
  std::unique_lock lock(s.mu);
  Slot *slot = find(s, k);
  if (slot == nullptr) return;
  s.entries[slot->entry].moving = false;
  end_use_locked(s, slot, to_free);
}

bool ChunkIndex::drop(const ChunkKey &k, bool respect_pins, std::optional<Tier> only_from,
                      std::vector<SlotRef> &to_free) {
  Shard &s = shard(k);
  std::unique_lock lock(s.mu);
  Slot *slot = find(s, k);
  if (slot == nullptr) return false;
  Entry &e = s.entries[slot->entry];
  if (e.doomed || (respect_pins && e.pins != 0)) return false;
  if (only_from && e.where.tier != *only_from) return false;
  count(s, e.where, e.meta.bytes, -1);
  if (e.users != 0) {
    e.doomed = true;  // the last user frees it
    slot->visible = 0;
    return true;
  }
  to_free.push_back(e.where);
  to_free.insert(to_free.end(), e.retired.begin(), e.retired.end());
  erase(s, slot);
  return true;
}

bool ChunkIndex::pin(const ChunkKey &k) {
  Shard &s = shard(k);
  std::unique_lock lock(s.mu);
  Slot *slot = find(s, k);
  if (slot == nullptr || !slot->visible) return false;
  ++s.entries[slot->entry].pins;
  return true;
}

bool ChunkIndex::unpin(const ChunkKey &k) {
  Shard &s = shard(k);
  std::unique_lock lock(s.mu);
  Slot *slot = find(s, k);
  if (slot == nullptr || !slot->visible || s.entries[slot->entry].pins == 0) return false;
  --s.entries[slot->entry].pins;
  return true;
}

uint32_t ChunkIndex::pins(const ChunkKey &k) const {
  const Shard &s = shard(k);
  std::shared_lock lock(s.mu);
  const Slot *slot = find(s, k);
  return slot == nullptr || !slot->visible ? 0 : s.entries[slot->entry].pins;
}

void ChunkIndex::for_each(const std::function<void(const ChunkView &)> &fn) const {
  for (size_t i = 0; i < kShards; ++i) {
    const Shard &s = shards_[i];
    std::shared_lock lock(s.mu);
    const uint64_t cap = s.mask.load(std::memory_order_relaxed) + 1;
    for (uint64_t j = 0; j < cap; ++j) {
      const Slot &slot = s.slots[j];
      if (slot.entry == kEmpty || !slot.visible) continue;
      const Entry &e = s.entries[slot.entry];
      fn(ChunkView{ChunkKey{slot.lo, slot.hi}, e.where, e.meta, e.pins,
                   slot.last_active_ns.load(std::memory_order_relaxed)});
    }
  }
}

}  // namespace swiftkv
