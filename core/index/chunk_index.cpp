// The sharded chunk index and the rules that keep a chunk readable in exactly one place.
#include "core/index/chunk_index.hpp"

#include <mutex>

namespace swiftkv {

const char *tier_name(Tier t) noexcept {
  switch (t) {
    case Tier::peer: return "peer";
    case Tier::host: return "host";
    case Tier::disk: return "disk";
  }
  return "unknown";
}

ChunkIndex::ChunkIndex() : shards_(std::make_unique<Shard[]>(kShards)) {}
ChunkIndex::~ChunkIndex() = default;

void ChunkIndex::count(const SlotRef &where, uint64_t bytes, int sign) noexcept {
  const auto t = static_cast<size_t>(where.tier);
  if (sign > 0) {
    chunks_[t].fetch_add(1);
    bytes_[t].fetch_add(bytes);
  } else {
    chunks_[t].fetch_sub(1);
    bytes_[t].fetch_sub(bytes);
  }
}

std::optional<Tier> ChunkIndex::touch(const ChunkKey &k, uint64_t now_ns) {
  Shard &s = shard(k);
  std::shared_lock lock(s.mu);
  const auto it = s.map.find(k);
  if (it == s.map.end() || it->second.doomed) return std::nullopt;
  // A relaxed store under the shared lock: concurrent touches race only to the same meaning.
  std::atomic<uint64_t> &last = it->second.last_active_ns;
  if (last.load(std::memory_order_relaxed) < now_ns) last.store(now_ns, std::memory_order_relaxed);
  return it->second.where.tier;
}

std::optional<Tier> ChunkIndex::peek(const ChunkKey &k) const {
  const Shard &s = shard(k);
  std::shared_lock lock(s.mu);
  const auto it = s.map.find(k);
  if (it == s.map.end() || it->second.doomed) return std::nullopt;
  return it->second.where.tier;
}

bool ChunkIndex::insert(const ChunkKey &k, const ChunkMeta &meta, SlotRef where,
                        uint64_t now_ns) {
  Shard &s = shard(k);
  std::unique_lock lock(s.mu);
  auto [it, fresh] = s.map.try_emplace(k);
  if (!fresh) return false;
  Entry &e = it->second;
  e.where = where;
  e.meta = meta;
  e.last_active_ns.store(now_ns, std::memory_order_relaxed);
  count(where, meta.bytes, +1);
  return true;
}

std::optional<ChunkUse> ChunkIndex::begin_read(const ChunkKey &k) {
  Shard &s = shard(k);
  std::unique_lock lock(s.mu);
  const auto it = s.map.find(k);
  if (it == s.map.end() || it->second.doomed) return std::nullopt;
  Entry &e = it->second;
  ++e.users;
  return ChunkUse{e.where, e.meta, e.pins};
}

bool ChunkIndex::end_use_locked(Shard &s,
                                std::unordered_map<ChunkKey, Entry, ChunkKeyHash>::iterator it,
                                std::vector<SlotRef> &to_free) {
  Entry &e = it->second;
  --e.users;
  if (e.users != 0) return false;
  to_free.insert(to_free.end(), e.retired.begin(), e.retired.end());
  e.retired.clear();
  if (!e.doomed) return false;
  to_free.push_back(e.where);
  s.map.erase(it);
  return true;
}

void ChunkIndex::end_read(const ChunkKey &k, std::vector<SlotRef> &to_free) {
  Shard &s = shard(k);
  std::unique_lock lock(s.mu);
  const auto it = s.map.find(k);
  if (it == s.map.end()) return;  // cannot happen while the read holds a use
  end_use_locked(s, it, to_free);
}

std::optional<ChunkUse> ChunkIndex::begin_move(const ChunkKey &k, Tier from, bool respect_pins) {
  Shard &s = shard(k);
  std::unique_lock lock(s.mu);
  const auto it = s.map.find(k);
  if (it == s.map.end()) return std::nullopt;
  Entry &e = it->second;
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
  const auto it = s.map.find(k);
  if (it == s.map.end()) {  // cannot happen while the mover holds a use
    to_free.push_back(dst);
    return false;
  }
  Entry &e = it->second;
  e.moving = false;
  if (e.doomed) {
    to_free.push_back(dst);
    end_use_locked(s, it, to_free);
    return false;
  }
  // The switch: from here on every new reader reads dst; the old copy stays until the readers
  // that began before it are done.
  count(e.where, e.meta.bytes, -1);
  e.retired.push_back(e.where);
  e.where = dst;
  count(e.where, e.meta.bytes, +1);
  end_use_locked(s, it, to_free);
  return true;
}

void ChunkIndex::abort_move(const ChunkKey &k, std::vector<SlotRef> &to_free) {
  Shard &s = shard(k);
  std::unique_lock lock(s.mu);
  const auto it = s.map.find(k);
  if (it == s.map.end()) return;
  it->second.moving = false;
  end_use_locked(s, it, to_free);
}

bool ChunkIndex::drop(const ChunkKey &k, bool respect_pins, std::optional<Tier> only_from,
                      std::vector<SlotRef> &to_free) {
  Shard &s = shard(k);
  std::unique_lock lock(s.mu);
  const auto it = s.map.find(k);
  if (it == s.map.end()) return false;
  Entry &e = it->second;
  if (e.doomed || (respect_pins && e.pins != 0)) return false;
  if (only_from && e.where.tier != *only_from) return false;
  count(e.where, e.meta.bytes, -1);
  if (e.users != 0) {
    e.doomed = true;  // the last user frees it
    return true;
  }
  to_free.push_back(e.where);
  to_free.insert(to_free.end(), e.retired.begin(), e.retired.end());
  s.map.erase(it);
  return true;
}

bool ChunkIndex::pin(const ChunkKey &k) {
  Shard &s = shard(k);
  std::unique_lock lock(s.mu);
  const auto it = s.map.find(k);
  if (it == s.map.end() || it->second.doomed) return false;
  ++it->second.pins;
  return true;
}

bool ChunkIndex::unpin(const ChunkKey &k) {
  Shard &s = shard(k);
  std::unique_lock lock(s.mu);
  const auto it = s.map.find(k);
  if (it == s.map.end() || it->second.doomed || it->second.pins == 0) return false;
  --it->second.pins;
  return true;
}

uint32_t ChunkIndex::pins(const ChunkKey &k) const {
  const Shard &s = shard(k);
  std::shared_lock lock(s.mu);
  const auto it = s.map.find(k);
  return it == s.map.end() || it->second.doomed ? 0 : it->second.pins;
}

void ChunkIndex::for_each(const std::function<void(const ChunkView &)> &fn) const {
  for (size_t i = 0; i < kShards; ++i) {
    const Shard &s = shards_[i];
    std::shared_lock lock(s.mu);
    for (const auto &[key, e] : s.map) {
      if (e.doomed) continue;
      fn(ChunkView{key, e.where, e.meta, e.pins,
                   e.last_active_ns.load(std::memory_order_relaxed)});
    }
  }
}

}  // namespace swiftkv
