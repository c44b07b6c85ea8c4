// The sharded chunk index and the rules that keep a chunk readable in exactly one place. Each
// shard is an open-addressing table of 64-byte slots holding everything about a chunk, so that a
// lookup, an insert or a drop touches one cache line (about 160 bytes of table per reserved chunk).
#include "core/index/chunk_index.hpp"

#include "core/common/error.hpp"
#include "core/memory/large_pages.hpp"

#include <cmath>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <type_traits>

namespace swiftkv {

namespace {
constexpr uint64_t kFirstCapacity = 16;
// A key's first slot in a table of `cap` slots: the high bits of hi scaled to [0, cap), so that a
// table may have any size and be sized to what it must hold rather than to a power of two.
uint64_t home(uint64_t hi, uint64_t cap) noexcept {
  __extension__ using u128 = unsigned __int128;
  return static_cast<uint64_t>((static_cast<u128>(hi) * cap) >> 64);
}
uint64_t next(uint64_t i, uint64_t cap) noexcept { return i + 1 == cap ? 0 : i + 1; }
// Slots from a to b going forward, wrapping at the table's end.
uint64_t ahead(uint64_t a, uint64_t b, uint64_t cap) noexcept {
  return b >= a ? b - a : b + cap - a;
}
}  // namespace

const char *tier_name(Tier t) noexcept {
  switch (t) {
    case Tier::peer: return "peer";
    case Tier::host: return "host";
    case Tier::disk: return "disk";
    case Tier::remote: return "remote";
  }
  return "unknown";
}

ChunkIndex::ChunkIndex(EvictionPolicy policy, RecomputeCost cost)
    : shards_(std::make_unique<Shard[]>(kShards)), order_(policy, std::move(cost)) {
  const auto first = std::make_shared<SlotMemory>(kShards * kFirstCapacity, table_bytes_);
  for (size_t i = 0; i < kShards; ++i) {
    Shard &s = shards_[i];
    s.memory = first;
    s.slots = first->take(kFirstCapacity);
    s.table.store(s.slots, std::memory_order_relaxed);
    s.cap.store(kFirstCapacity, std::memory_order_relaxed);
  }
}
ChunkIndex::~ChunkIndex() = default;

ChunkIndex::SlotMemory::SlotMemory(uint64_t slots, std::atomic<uint64_t> &counted)
    : slots_(static_cast<Slot *>(allocate_large(slots * sizeof(Slot)))),
      count_(slots),
      counted_(counted) {}

ChunkIndex::SlotMemory::~SlotMemory() {
  static_assert(std::is_trivially_destructible_v<Slot>);
  free_large(slots_, count_ * sizeof(Slot));
  counted_.fetch_sub(taken_ * sizeof(Slot) - given_back_.load(std::memory_order_relaxed),
                     std::memory_order_relaxed);
}

void ChunkIndex::SlotMemory::give_back(Slot *t, uint64_t n) noexcept {
  const size_t b = discard_large(t, n * sizeof(Slot), count_ * sizeof(Slot));
  given_back_.fetch_add(b, std::memory_order_relaxed);
  counted_.fetch_sub(b, std::memory_order_relaxed);
}

ChunkIndex::Slot *ChunkIndex::SlotMemory::take(uint64_t n) {
  if (n > count_ - taken_) return nullptr;
  Slot *t = slots_ + taken_;
  std::uninitialized_value_construct_n(t, n);  // every slot empty
  taken_ += n;
  counted_.fetch_add(n * sizeof(Slot), std::memory_order_relaxed);
  return t;
}

namespace {
// A plain load and store: the counts are written only under the shard's exclusive lock.
void add_relaxed(std::atomic<uint64_t> &a, uint64_t d) noexcept {
  a.store(a.load(std::memory_order_relaxed) + d, std::memory_order_relaxed);
}
}  // namespace

void ChunkIndex::count(Shard &s, const Slot &slot, int sign) noexcept {
  const size_t t = slot.tier;
  const size_t c = std::min<size_t>(slot.encoding & kEncodingCodecMask, kCodecCount - 1);
  const uint64_t raw = raw_bytes(slot);
  // +x or -x modulo 2^64
  const auto signed_of = [sign](uint64_t x) { return sign > 0 ? x : ~x + 1; };
  add_relaxed(s.chunks[t], signed_of(1));
  add_relaxed(s.bytes[t], signed_of(slot.bytes));
  // Raw chunks (the common case) are what the totals leave: codec_counts derives them.
  if (c == 0) return;
  add_relaxed(s.codec_chunks[c][t], signed_of(1));
  add_relaxed(s.codec_raw[c][t], signed_of(raw));
  add_relaxed(s.codec_stored[c][t], signed_of(slot.bytes));
}

void ChunkIndex::set_sizes(Slot &s, const ChunkMeta &m) {
  if (m.stored_bytes == 0 || m.stored_bytes == m.bytes) {  // stored as it decodes: no division
    s.raw_per_token = 0;
    s.bytes = m.bytes;
    s.encoding = m.encoding;
    return;
  }
  const uint64_t per_token = m.tokens == 0 ? 0 : m.bytes / m.tokens;
  if (per_token == 0 || uint64_t{m.tokens} * per_token != m.bytes || per_token > UINT32_MAX) {
    fail_invalid("chunk index: a chunk of " + std::to_string(m.bytes) + " bytes and " +
                 std::to_string(m.tokens) + " tokens is not whole 32-bit tokens");
  }
  s.raw_per_token = static_cast<uint32_t>(per_token);
  s.bytes = m.stored();
  s.encoding = m.encoding;
}

ChunkIndex::CodecCounts ChunkIndex::codec_counts() const {
  CodecCounts r;
  for (size_t i = 0; i < kShards; ++i) {
    const Shard &s = shards_[i];
    // One shard's counts as one snapshot: raw is a difference of them.
    std::shared_lock lock(s.mu);
    for (size_t t = 0; t < kTierCount; ++t) {
      // Raw: a raw chunk's stored bytes are its decoded bytes.
      uint64_t chunks = s.chunks[t].load(std::memory_order_relaxed);
      uint64_t bytes = s.bytes[t].load(std::memory_order_relaxed);
      for (size_t c = 1; c < kCodecCount; ++c) {
        const uint64_t n = s.codec_chunks[c][t].load(std::memory_order_relaxed);
        const uint64_t stored = s.codec_stored[c][t].load(std::memory_order_relaxed);
        r.chunks[c][t] += n;
        r.raw_bytes[c][t] += s.codec_raw[c][t].load(std::memory_order_relaxed);
        r.stored_bytes[c][t] += stored;
        chunks -= n;
        bytes -= stored;
      }
      r.chunks[0][t] += chunks;
      r.raw_bytes[0][t] += bytes;
      r.stored_bytes[0][t] += bytes;
    }
  }
  return r;
}

uint64_t ChunkIndex::chunks(Tier t) const noexcept {
  uint64_t n = 0;
  for (size_t i = 0; i < kShards; ++i) {
    n += shards_[i].chunks[tier_slot(t)].load(std::memory_order_relaxed);
  }
  return n;
}

uint64_t ChunkIndex::bytes(Tier t) const noexcept {
  uint64_t n = 0;
  for (size_t i = 0; i < kShards; ++i) {
    n += shards_[i].bytes[tier_slot(t)].load(std::memory_order_relaxed);
  }
  return n;
}

uint16_t ChunkIndex::model_index(const ChunkKey &model) {
  if (models_ != 0 && model_key(last_model_) == model) return last_model_;
  for (uint32_t i = 0; i < models_; ++i) {
    if (model_key(static_cast<uint16_t>(i)) == model) {
      last_model_ = static_cast<uint16_t>(i);
      return last_model_;
    }
  }
  if (models_ > UINT16_MAX) throw std::length_error("chunk index: too many models");
  std::unique_ptr<ChunkKey[]> &page = model_pages_[models_ / kModelsPerPage];
  if (!page) page = std::make_unique<ChunkKey[]>(kModelsPerPage);
  page[models_ % kModelsPerPage] = model;
  last_model_ = static_cast<uint16_t>(models_++);
  return last_model_;
}

ChunkIndex::Slot *ChunkIndex::find(const Shard &s, const ChunkKey &k) noexcept {
  const uint64_t cap = s.cap.load(std::memory_order_relaxed);
  Slot *t = s.slots;
  for (uint64_t i = home(k.hi, cap);; i = next(i, cap)) {
    Slot &slot = t[i];
    if (slot.flags == 0) return nullptr;
    if (slot.lo == k.lo && slot.hi == k.hi) return &slot;
  }
}

void ChunkIndex::copy_slot(Slot &d, const Slot &o) noexcept {
  d.lo = o.lo;
  d.hi = o.hi;
  d.node = o.node;
  d.encoding = o.encoding;
  d.raw_per_token = o.raw_per_token;
  d.store_slot = o.store_slot;
  d.bytes = o.bytes;
  d.position = o.position;
  d.tokens = o.tokens;
  d.pins = o.pins;
  d.users = o.users;
  d.model = o.model;
  d.tier = o.tier;
  d.flags = o.flags;
}

void ChunkIndex::grow(Shard &s, uint64_t cap, std::shared_ptr<SlotMemory> memory, Slot *into) {
  const uint64_t old_cap = s.cap.load(std::memory_order_relaxed);
  if (!memory) {
    std::lock_guard lock(growth_mu_);
    into = growth_ ? growth_->take(cap) : nullptr;
    if (into == nullptr) {
      // The first shard of a wave to outgrow its table: room for every shard's of this size.
      growth_ = std::make_shared<SlotMemory>(kShards * cap, table_bytes_);
      into = growth_->take(cap);
    }
    memory = growth_;
  }
  for (uint64_t i = 0; i < old_cap; ++i) {
    const Slot &o = s.slots[i];
    if (o.flags == 0) continue;
    uint64_t j = home(o.hi, cap);
    while (into[j].flags != 0) j = next(j, cap);
    copy_slot(into[j], o);
  }
  // The old table's pages go back now, its memory with its last table; a prefetch() that read
  // the old pointer fetches nothing harmful (a prefetch never faults).
  s.memory->give_back(s.slots, old_cap);
  s.memory = std::move(memory);
  s.slots = into;
  s.table.store(into, std::memory_order_relaxed);
  s.cap.store(cap, std::memory_order_relaxed);
}

void ChunkIndex::erase(Shard &s, Slot *slot) {
  const uint64_t cap = s.cap.load(std::memory_order_relaxed);
  Slot *t = s.slots;
  --s.used;
  // Backward-shift deletion: later slots of the same probe run move into the hole, so a lookup
  // never needs tombstones.
  uint64_t hole = static_cast<uint64_t>(slot - t);
  for (uint64_t j = next(hole, cap); t[j].flags != 0; j = next(j, cap)) {
    const uint64_t h = home(t[j].hi, cap);
    if (ahead(h, j, cap) >= ahead(hole, j, cap)) {
      copy_slot(t[hole], t[j]);
      hole = j;
    }
  }
  t[hole].flags = 0;
}

namespace {
// Keys spread over the shards as a binomial draw: a shard's table is sized for its even share
// plus four standard deviations (about 1 in 30,000 shards gets more), so that the tables are
// within a few percent of what they must hold, and at most 40% full: a miss probes about two
// slots (at half full, 2.5; inserts grow a table only past half full).
uint64_t shard_slots_for(uint64_t chunks, uint64_t shards) noexcept {
  const uint64_t mean = (chunks + shards - 1) / shards;
  const auto spread = static_cast<uint64_t>(std::ceil(4.0 * std::sqrt(static_cast<double>(mean))));
  return 5 * (mean + spread + 4) / 2;
}
}  // namespace

uint64_t ChunkIndex::reserve_bytes(uint64_t chunks) noexcept {
  const uint64_t slots = std::max(shard_slots_for(chunks, kShards), kFirstCapacity);
  return large_bytes(kShards * slots * sizeof(Slot)) + EvictionOrder::node_bytes(chunks);
}

void ChunkIndex::reserve(uint64_t chunks) {
  {
    std::lock_guard order(order_mu_);
    order_.reserve(chunks);
  }
  const uint64_t cap = shard_slots_for(chunks, kShards);
  bool any = false;
  for (size_t i = 0; i < kShards && !any; ++i) {
    any = shards_[i].cap.load(std::memory_order_relaxed) < cap;
  }
  if (!any) return;
  // One arena with a table for each shard (one that grew past `cap` meanwhile takes none).
  const auto arena = std::make_shared<SlotMemory>(kShards * cap, table_bytes_);
  for (size_t i = 0; i < kShards; ++i) {
    Shard &s = shards_[i];
    std::unique_lock lock(s.mu);
    if (s.cap.load(std::memory_order_relaxed) < cap) grow(s, cap, arena, arena->take(cap));
  }
}

uint64_t ChunkIndex::capacity() const noexcept {
  uint64_t n = 0;
  for (size_t i = 0; i < kShards; ++i) n += shards_[i].cap.load(std::memory_order_relaxed) / 2;
  return n;
}

uint64_t ChunkIndex::memory_bytes() const {
  uint64_t n = table_bytes_.load(std::memory_order_relaxed) + kShards * sizeof(Shard);
  std::lock_guard order(order_mu_);
  return n + order_.memory_bytes();
}

void ChunkIndex::prefetch(const ChunkKey &k) const noexcept {
  const Shard &s = shard(k);
  const Slot *t = s.table.load(std::memory_order_relaxed);
  const uint64_t cap = s.cap.load(std::memory_order_relaxed);
  // A stale table (the shard grew meanwhile) only makes the hint useless: prefetch never faults.
  // The key's home and the slot after it (a line each): a miss reads on to the first empty slot,
  // about two at the tables' load, and a store's keys are misses. With the home alone, the
  // second slot was a cache miss of its own for half of a store's keys at a million chunks
  // (bench_index, both: swiftkv_store 232 -> 222 ns a chunk, swiftkv_lookup 79 -> 68).
  const uint64_t h = home(k.hi, cap);
  __builtin_prefetch(t + h, 1, 1);
  __builtin_prefetch(t + next(h, cap), 1, 1);
}

void ChunkIndex::prefetch_for_erase(const ChunkKey &k) const noexcept {
  const Shard &s = shard(k);
  const Slot *t = s.table.load(std::memory_order_relaxed);
  const uint64_t cap = s.cap.load(std::memory_order_relaxed);
  // The key's home and the five slots after it: the key may sit past its home, and erasing
  // shifts the rest of its probe run back, reading on to the first empty slot. Counted over
  // victims at a million chunks (tables about 40% full), the lines from the home through that
  // slot are two for 52% of them, up to four for 89%, up to six for 97%: four lines left one
  // victim in nine a miss of its own, and six made a store into a full tier about 10 ns faster
  // (eight no faster than six). And the shard's first three lines: its lock, table and counts.
  uint64_t h = home(k.hi, cap);
  for (int i = 0; i < 6; ++i, h = next(h, cap)) __builtin_prefetch(t + h, 1, 1);
  const char *b = reinterpret_cast<const char *>(&s);
  for (size_t o = 0; o < 192; o += 64) __builtin_prefetch(b + o, 1, 1);
}

std::optional<Tier> ChunkIndex::find_node(const ChunkKey &k, uint32_t *node) const {
  const Shard &s = shard(k);
  std::shared_lock lock(s.mu);
  const Slot *slot = find(s, k);
  if (slot == nullptr || !visible(*slot)) return std::nullopt;
  *node = slot->node;
  return static_cast<Tier>(slot->tier);
}

std::optional<Tier> ChunkIndex::touch(const ChunkKey &k, uint64_t now_ns) {
  std::lock_guard order(order_mu_);
  uint32_t node = 0;
  const std::optional<Tier> t = find_node(k, &node);
  // The node stays the chunk's after the shard's lock: freeing it takes order_mu_.
  if (t) order_.touch(node, now_ns);
  return t;
}

void ChunkIndex::touch_many(std::span<const ChunkKey> keys, uint64_t now_ns,
                            std::optional<Tier> *out) {
  // In two passes under the order lock, each fetching ahead: the keys' slots, then their
  // nodes and the neighbours a touch rewrites. At a million chunks each is a cache miss.
  constexpr size_t kAhead = 16, kBatch = 256;
  uint32_t nodes[kBatch];
  std::lock_guard order(order_mu_);
  for (size_t base = 0; base < keys.size(); base += kBatch) {
    const size_t len = std::min(kBatch, keys.size() - base);
    const ChunkKey *k = keys.data() + base;
    for (size_t i = 0; i < len && i < kAhead; ++i) prefetch(k[i]);
    for (size_t i = 0; i < len; ++i) {
      if (i + kAhead < len) prefetch(k[i + kAhead]);
      out[base + i] = find_node(k[i], &nodes[i]);
    }
    for (size_t i = 0; i < len && i < kAhead; ++i) {
      if (out[base + i]) order_.prefetch(nodes[i]);
    }
    for (size_t i = 0; i < len; ++i) {
      if (i + kAhead < len && out[base + i + kAhead]) order_.prefetch(nodes[i + kAhead]);
      if (i + kAhead / 2 < len && out[base + i + kAhead / 2]) {
        order_.prefetch_neighbours(nodes[i + kAhead / 2]);
      }
      if (out[base + i]) order_.touch(nodes[i], now_ns);
    }
  }
}

uint32_t ChunkIndex::domain_locked(Tier t, const ChunkKey &model) {
  if (t == Tier::host) return 0;
  if (t == Tier::disk) return 1;
  for (size_t i = 0; i < lent_domains_.size(); ++i) {
    if (lent_domains_[i].first == t && lent_domains_[i].second == model) {
      return static_cast<uint32_t>(2 + i);
    }
  }
  lent_domains_.emplace_back(t, model);
  return static_cast<uint32_t>(2 + lent_domains_.size() - 1);
}

void ChunkIndex::link_locked(const Shard &, const Slot &slot) {
  order_.link(slot.node, domain_locked(static_cast<Tier>(slot.tier), model_key(slot.model)));
}

bool ChunkIndex::in_use(const ChunkKey &k) const {
  const Shard &s = shard(k);
  std::shared_lock lock(s.mu);
  const Slot *slot = find(s, k);
  return slot != nullptr && slot->users != 0;
}

std::optional<ChunkKey> ChunkIndex::victim(Tier t, const ChunkKey &model, uint64_t now_ns) {
  std::lock_guard order(order_mu_);
  const uint32_t d = domain_locked(t, model);
  // A chunk being read is nobody's victim: moved or dropped, its slot would come back only when
  // the read ends, and a tier that made room by such victims would give up every chunk it has
  // while it waits. It is in use, so it becomes the newest, and the search goes on (over each
  // chunk of the domain once at most).
  for (uint64_t left = order_.size(d); left != 0; --left) {
    const uint32_t node = order_.victim(d, now_ns);
    if (node == EvictionOrder::kNoNode) break;
    const ChunkKey k = order_.key(node);
    if (!in_use(k)) return k;
    order_.renew(node, now_ns);
  }
  return std::nullopt;
}

uint64_t ChunkIndex::last_active(const ChunkKey &k) const {
  std::lock_guard order(order_mu_);
  const Shard &s = shard(k);
  std::shared_lock lock(s.mu);
  const Slot *slot = find(s, k);
  return slot == nullptr || !visible(*slot) ? 0 : order_.last_active(slot->node);
}

std::optional<ChunkIndex::Activity> ChunkIndex::activity(const ChunkKey &k) const {
  std::lock_guard order(order_mu_);
  const Shard &s = shard(k);
  std::shared_lock lock(s.mu);
  const Slot *slot = find(s, k);
  if (slot == nullptr || !visible(*slot)) return std::nullopt;
  return Activity{order_.last_active(slot->node), order_.hits(slot->node)};
}

std::optional<Tier> ChunkIndex::peek(const ChunkKey &k) const {
  const Shard &s = shard(k);
  std::shared_lock lock(s.mu);
  const Slot *slot = find(s, k);
  if (slot == nullptr || !visible(*slot)) return std::nullopt;
  return static_cast<Tier>(slot->tier);
}

std::optional<SlotRef> ChunkIndex::locate(const ChunkKey &k) const {
  const Shard &s = shard(k);
  std::shared_lock lock(s.mu);
  const Slot *slot = find(s, k);
  if (slot == nullptr || !visible(*slot)) return std::nullopt;
  return where(*slot);
}

std::optional<ChunkView> ChunkIndex::view(const ChunkKey &k) const {
  const Shard &s = shard(k);
  std::shared_lock lock(s.mu);
  const Slot *slot = find(s, k);
  if (slot == nullptr || !visible(*slot)) return std::nullopt;
  return ChunkView{k, where(*slot), meta(s, *slot), slot->pins};
}

bool ChunkIndex::insert(const ChunkKey &k, const ChunkMeta &meta, SlotRef where, uint64_t now_ns) {
  std::lock_guard order(order_mu_);
  Shard &s = shard(k);
  std::unique_lock lock(s.mu);
  if (find(s, k) != nullptr) return false;
  Slot sizes;
  set_sizes(sizes, meta);  // checked before anything changes
  const uint16_t model = model_index(meta.model);
  const uint64_t cap_now = s.cap.load(std::memory_order_relaxed);
  if ((s.used + 1) * 2 > cap_now) grow(s, cap_now * 2);
  const uint32_t node = order_.add(k, meta.position, meta.tokens, now_ns, sizes.bytes);
  try {
    order_.link(node, domain_locked(where.tier, meta.model));
  } catch (...) {
    order_.remove(node);
    throw;
  }
  const uint64_t cap = s.cap.load(std::memory_order_relaxed);
  uint64_t i = home(k.hi, cap);
  while (s.slots[i].flags != 0) i = next(i, cap);
  Slot &slot = s.slots[i];
  slot.lo = k.lo;
  slot.hi = k.hi;
  slot.node = node;
  slot.store_slot = where.slot;
  slot.bytes = sizes.bytes;
  slot.encoding = sizes.encoding;
  slot.raw_per_token = sizes.raw_per_token;
  slot.position = meta.position;
  slot.tokens = meta.tokens;
  slot.pins = 0;
  slot.users = 0;
  slot.model = model;
  slot.tier = static_cast<uint8_t>(where.tier);
  slot.flags = kUsed;
  ++s.used;
  count(s, slot, +1);
  return true;
}

std::optional<ChunkUse> ChunkIndex::begin_read(const ChunkKey &k) {
  Shard &s = shard(k);
  std::unique_lock lock(s.mu);
  Slot *slot = find(s, k);
  if (slot == nullptr || !visible(*slot)) return std::nullopt;
  ++slot->users;
  return ChunkUse{where(*slot), meta(s, *slot), slot->pins};
}

bool ChunkIndex::end_use_locked(Shard &s, Slot *slot, std::vector<SlotRef> &to_free) {
  --slot->users;
  if (slot->users != 0) return false;
  const ChunkKey k{slot->lo, slot->hi};
  if ((slot->flags & kRetired) != 0) {
    auto it = s.retired.find(k);
    to_free.insert(to_free.end(), it->second.begin(), it->second.end());
    s.retired.erase(it);
    slot->flags &= static_cast<uint8_t>(~kRetired);
  }
  if ((slot->flags & kDoomed) == 0) return false;
  to_free.push_back(where(*slot));
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
  std::lock_guard order(order_mu_);
  Shard &s = shard(k);
  std::unique_lock lock(s.mu);
  Slot *slot = find(s, k);
  if (slot == nullptr) return std::nullopt;
  if ((slot->flags & (kDoomed | kMoving)) != 0 || static_cast<Tier>(slot->tier) != from ||
      (respect_pins && slot->pins != 0)) {
    return std::nullopt;
  }
  slot->flags |= kMoving;
  ++slot->users;
  order_.unlink(slot->node);
  return ChunkUse{where(*slot), meta(s, *slot), slot->pins};
}

bool ChunkIndex::finish_move(const ChunkKey &k, SlotRef dst, std::vector<SlotRef> &to_free) {
  return finish_move(k, dst, std::nullopt, to_free);
}

bool ChunkIndex::finish_move(const ChunkKey &k, SlotRef dst, const ChunkMeta &meta,
                             std::vector<SlotRef> &to_free) {
  return finish_move(k, dst, std::optional<ChunkMeta>(meta), to_free);
}

bool ChunkIndex::finish_move(const ChunkKey &k, SlotRef dst, const std::optional<ChunkMeta> &meta,
                             std::vector<SlotRef> &to_free) {
  Slot sizes;
  if (meta) set_sizes(sizes, *meta);  // checked before anything changes
  std::lock_guard order(order_mu_);
  Shard &s = shard(k);
  std::unique_lock lock(s.mu);
  Slot *slot = find(s, k);
  if (slot == nullptr) {  // cannot happen while the mover holds a use
    to_free.push_back(dst);
    return false;
  }
  slot->flags &= static_cast<uint8_t>(~kMoving);
  if ((slot->flags & kDoomed) != 0) {
    to_free.push_back(dst);
    end_use_locked(s, slot, to_free);
    return false;
  }
  // The switch: from here on every new reader reads dst; the old copy stays until the readers
  // that began before it are done.
  count(s, *slot, -1);
  if (slot->users > 1) {
    s.retired[k].push_back(where(*slot));
    slot->flags |= kRetired;
  } else {
    to_free.push_back(where(*slot));
  }
  slot->tier = static_cast<uint8_t>(dst.tier);
  slot->store_slot = dst.slot;
  if (meta) {
    slot->bytes = sizes.bytes;
    slot->encoding = sizes.encoding;
    slot->raw_per_token = sizes.raw_per_token;
    order_.set_stored(slot->node, sizes.bytes);
  }
  count(s, *slot, +1);
  if (slot->pins == 0) link_locked(s, *slot);
  end_use_locked(s, slot, to_free);
  return true;
}

void ChunkIndex::abort_move(const ChunkKey &k, std::vector<SlotRef> &to_free) {
  std::lock_guard order(order_mu_);
  Shard &s = shard(k);
  std::unique_lock lock(s.mu);
  Slot *slot = find(s, k);
  if (slot == nullptr) return;
  slot->flags &= static_cast<uint8_t>(~kMoving);
  if ((slot->flags & kDoomed) == 0 && slot->pins == 0) link_locked(s, *slot);
  end_use_locked(s, slot, to_free);
}

bool ChunkIndex::drop(const ChunkKey &k, bool respect_pins, std::optional<Tier> only_from,
                      std::vector<SlotRef> &to_free) {
  std::lock_guard order(order_mu_);
  Shard &s = shard(k);
  std::unique_lock lock(s.mu);
  Slot *slot = find(s, k);
  if (slot == nullptr) return false;
  if ((slot->flags & kDoomed) != 0 || (respect_pins && slot->pins != 0)) return false;
  if (only_from && static_cast<Tier>(slot->tier) != *only_from) return false;
  count(s, *slot, -1);
  // The node goes now; a doomed slot keeps a stale number that nothing reads.
  order_.remove(slot->node);
  if (slot->users != 0) {
    slot->flags |= kDoomed;  // the last user frees it
    return true;
  }
  // No users, so no retired copies either: they wait only for readers.
  to_free.push_back(where(*slot));
  erase(s, slot);
  return true;
}

std::optional<ChunkMeta> ChunkIndex::evict(const ChunkKey &k, Tier from, bool respect_pins,
                                           std::vector<SlotRef> &to_free) {
  std::lock_guard order(order_mu_);
  return evict_locked(k, from, respect_pins, to_free);
}

uint64_t ChunkIndex::evict_victims(Tier t, const ChunkKey &model, uint64_t now_ns, uint64_t bytes,
                                   std::vector<Evicted> &out, std::vector<SlotRef> &to_free) {
  std::lock_guard order(order_mu_);
  const uint32_t d = domain_locked(t, model);
  // Victims are the chunks least recently used, so their table slots and shards are cold (in
  // DRAM at a million chunks), and a victim's own work here is short beside a miss. So victims
  // leave the order kLag ahead of their erase, each one's slot and shard fetched as it leaves,
  // under either policy. How many leave is told by the bytes their nodes say they are stored
  // in, a bound from above: never more than the bytes asked for go (fewer when a bound is
  // loose, and then the next take more). Between the two steps a victim is out of the order
  // but in the table, where readers may still find it; order_mu_ is held throughout, and nothing
  // reads a victim's node once it left (it may be reused). A chunk in the order is neither pinned
  // nor moving (both unlink it): it goes, unless it is being read (seen only in its slot): then,
  // as in victim(), it stays as the newest, and each chunk of the domain is offered once at most.
  EvictionOrder::Victims victims(order_, d, now_ns);
  constexpr uint32_t kLag = 16;  // a power of two: the ring's index masks
  struct Leaving {
    ChunkKey key;
    uint64_t bound;
    uint16_t hits;  // for a node made again
  };
  std::array<Leaving, kLag> leaving;
  uint32_t first = 0, end = 0;     // the ring holds [first, end), counted mod 2^32
  uint64_t freed = 0, coming = 0;  // coming: the bounds of the victims taken, not yet erased
  uint64_t offers = order_.size(d);
  for (;;) {
    while (end - first < kLag && freed + coming < bytes && offers != 0) {
      const uint32_t node = victims.peek();
      if (node == EvictionOrder::kNoNode) break;
      const Leaving l{order_.key(node), order_.stored_bound(node),
                      static_cast<uint16_t>(order_.hits(node))};
      victims.pop();
      --offers;
      prefetch_for_erase(l.key);
      leaving[end++ % kLag] = l;
      coming += l.bound;
    }
    if (first == end) break;
    const Leaving l = leaving[first++ % kLag];
    coming -= l.bound;
    Shard &s = shard(l.key);
    std::unique_lock lock(s.mu);
    Slot *slot = find(s, l.key);
    if (slot == nullptr) continue;  // cannot happen: the order and the table agree under order_mu_
    if (slot->users != 0) {
      // Its node went to the free list with pop(): a node again is one from there, its history
      // kept.
      slot->node = order_.add(l.key, slot->position, slot->tokens, now_ns, slot->bytes, l.hits);
      order_.link(slot->node, d);
      continue;
    }
    const ChunkMeta m = meta(s, *slot);
    remove_slot_locked(s, slot, to_free);
    out.push_back(Evicted{l.key, m});
    freed += m.stored();
  }
  return freed;
}

void ChunkIndex::remove_slot_locked(Shard &s, Slot *slot, std::vector<SlotRef> &to_free) {
  count(s, *slot, -1);
  if (slot->users != 0) {
    slot->flags |= kDoomed;  // a reader holds it: the last user frees it
    return;
  }
  // No users, so no retired copies either: they wait only for readers.
  to_free.push_back(where(*slot));
  erase(s, slot);
}

std::optional<ChunkMeta> ChunkIndex::evict_locked(const ChunkKey &k, Tier from, bool respect_pins,
                                                  std::vector<SlotRef> &to_free) {
  Shard &s = shard(k);
  std::unique_lock lock(s.mu);
  Slot *slot = find(s, k);
  if (slot == nullptr || (slot->flags & (kDoomed | kMoving)) != 0 ||
      static_cast<Tier>(slot->tier) != from || (respect_pins && slot->pins != 0)) {
    return std::nullopt;
  }
  const ChunkMeta m = meta(s, *slot);
  order_.remove(slot->node);  // a doomed slot keeps a stale number that nothing reads
  remove_slot_locked(s, slot, to_free);
  return m;
}

bool ChunkIndex::pin(const ChunkKey &k) {
  std::lock_guard order(order_mu_);
  Shard &s = shard(k);
  std::unique_lock lock(s.mu);
  Slot *slot = find(s, k);
  if (slot == nullptr || !visible(*slot)) return false;
  if (slot->pins++ == 0) order_.unlink(slot->node);
  return true;
}

bool ChunkIndex::unpin(const ChunkKey &k) {
  std::lock_guard order(order_mu_);
  Shard &s = shard(k);
  std::unique_lock lock(s.mu);
  Slot *slot = find(s, k);
  if (slot == nullptr || !visible(*slot) || slot->pins == 0) return false;
  if (--slot->pins == 0 && (slot->flags & kMoving) == 0) link_locked(s, *slot);
  return true;
}

uint32_t ChunkIndex::pins(const ChunkKey &k) const {
  const Shard &s = shard(k);
  std::shared_lock lock(s.mu);
  const Slot *slot = find(s, k);
  return slot == nullptr || !visible(*slot) ? 0 : slot->pins;
}

void ChunkIndex::for_each(const std::function<void(const ChunkView &)> &fn) const {
  for (size_t i = 0; i < kShards; ++i) {
    const Shard &s = shards_[i];
    std::shared_lock lock(s.mu);
    const uint64_t cap = s.cap.load(std::memory_order_relaxed);
    for (uint64_t j = 0; j < cap; ++j) {
      const Slot &slot = s.slots[j];
      if (!visible(slot)) continue;
      fn(ChunkView{ChunkKey{slot.lo, slot.hi}, where(slot), meta(s, slot), slot.pins});
    }
  }
}

}  // namespace swiftkv
