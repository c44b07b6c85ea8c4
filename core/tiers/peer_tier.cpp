// Slots in lent elastic memory and the borrower's half of the lease protocol: renew when due,
// notice a reclaim, release once evacuated.
#include "core/tiers/peer_tier.hpp"

#include <algorithm>

#include "core/common/error.hpp"
#include "core/memory/host_memory.hpp"

namespace swiftkv {

PeerTier::PeerTier(Tier tier, std::function<void()> on_reclaim)
    : tier_(tier), on_reclaim_(std::move(on_reclaim)) {}

PeerTier::~PeerTier() {
  std::lock_guard lock(mu_);
  for (auto &[local, h] : leases_) {
    if (h.lost) continue;
    h.lender->link->release(h.lease_id);
  }
}

uint64_t PeerTier::adopt(const ChunkKey &model, const GeometrySizes &sizes,
                         std::shared_ptr<LenderLink> lender, const LeaseGrant &g) {
  Held h;
  h.model = model;
  h.lease_id = g.lease_id;
  h.data = g.data;
  h.device = g.device;
  h.remote = g.remote;
  h.chunk_bytes = sizes.full_chunk_bytes;
  h.chunks = g.chunks;
  h.free_chunks.reserve(h.chunks);
  for (uint64_t c = h.chunks; c-- > 0;) h.free_chunks.push_back(static_cast<uint32_t>(c));
  h.keys.resize(h.chunks);
  std::lock_guard lock(mu_);
  // One link per lender, however many leases: renewals go to it in one call.
  Lender *l = nullptr;
  for (const auto &x : lenders_) {
    if (x->link->identity() == lender->identity()) l = x.get();
  }
  if (l == nullptr) {
    lenders_.push_back(std::make_unique<Lender>());
    l = lenders_.back().get();
    l->link = std::move(lender);
    if (on_reclaim_) l->link->watch_reclaims(on_reclaim_);
  }
  h.lender = l;
  ++l->leases;
  // Renewed at the next refresh, which learns when it is due next.
  h.renew_at = 0;
  const uint64_t local = next_local_++;
  l->due.emplace(0, local);
  Room &r = room_[model];
  r.capacity += h.chunks * h.chunk_bytes;
  r.free += h.chunks * h.chunk_bytes;
  ++r.leases;
  usable_leases_.fetch_add(1, std::memory_order_relaxed);
  r.open.push_back(local);
  h.open = true;
  leases_.emplace(local, std::move(h));
  return g.lease_id;
}

void PeerTier::unusable_locked(uint64_t local, Held &h) noexcept {
  if (!h.usable()) return;
  try {
    draining_.insert(local);
  } catch (...) {
    // Out of memory: refresh() does not report the lease until the next change to it.
  }
  Room &r = room_[h.model];
  r.capacity -= h.chunks * h.chunk_bytes;
  r.free -= h.free_chunks.size() * h.chunk_bytes;
  --r.leases;
  usable_leases_.fetch_sub(1, std::memory_order_relaxed);
}

std::optional<uint64_t> PeerTier::allocate(const ChunkKey &key, const ChunkMeta &meta) {
  std::lock_guard lock(mu_);
  const auto rit = room_.find(meta.model);
  if (rit == room_.end()) return std::nullopt;
  Room &r = rit->second;
  while (!r.open.empty()) {
    const uint64_t local = r.open.back();
    const auto it = leases_.find(local);
    if (it == leases_.end() || !it->second.usable() || it->second.free_chunks.empty() ||
        it->second.chunk_bytes != meta.stored()) {
      if (it != leases_.end()) it->second.open = false;
      r.open.pop_back();
      continue;
    }
    Held &h = it->second;
    const uint32_t c = h.free_chunks.back();
    h.free_chunks.pop_back();
    h.keys[c] = key;
    r.free -= h.chunk_bytes;
    if (h.free_chunks.empty()) {
      h.open = false;
      r.open.pop_back();
    }
    return local << 32 | c;
  }
  return std::nullopt;
}

void PeerTier::free(uint64_t slot) noexcept {
  std::lock_guard lock(mu_);
  const auto it = leases_.find(slot >> 32);
  if (it == leases_.end()) return;
  Held &h = it->second;
  h.free_chunks.push_back(static_cast<uint32_t>(slot & 0xffffffffu));  // reserved at attach
  h.keys[slot & 0xffffffffu] = ChunkKey{};
  if (!h.usable()) return;
  Room &r = room_[h.model];
  r.free += h.chunk_bytes;
  if (!h.open) {
    try {
      r.open.push_back(slot >> 32);
      h.open = true;
    } catch (...) {
      // Out of memory for the list: the lease's free chunks wait for a later free.
    }
  }
}

std::byte *PeerTier::address(uint64_t slot, int32_t *device) noexcept {
  std::lock_guard lock(mu_);
  const auto it = leases_.find(slot >> 32);
  if (it == leases_.end()) return nullptr;
  if (device != nullptr) *device = it->second.device;
  if (it->second.remote) return nullptr;
  return it->second.data + (slot & 0xffffffffu) * it->second.chunk_bytes;
}

PeerTier::SlotPlace PeerTier::place_of(uint64_t slot) const {
  std::lock_guard lock(mu_);
  const auto it = leases_.find(slot >> 32);
  if (it == leases_.end()) fail(SWIFTKV_EINTERNAL, "a peer slot of no lease");
  const Held &h = it->second;
  const uint64_t offset = (slot & 0xffffffffu) * h.chunk_bytes;
  if (h.remote) return SlotPlace{h.lender->link, h.lease_id, offset, nullptr, -1};
  return SlotPlace{nullptr, h.lease_id, offset, h.data + offset, h.device};
}

// One lookup either way. A remote lease's chunk is one contiguous range of the lease: one
// operation, and the wait happens without the tier's lock.
void PeerTier::write(uint64_t slot, const ChunkKey &, const ChunkMeta &meta, const std::byte *src) {
  const SlotPlace p = place_of(slot);
  if (!p.link) return copy_bytes(p.data, p.device, src, -1, meta.stored());
  // A put only reads its local buffer.
  const transport::RangeOp op{
      p.lease_id,
      {transport::RmaOp::Kind::put, p.offset, const_cast<std::byte *>(src), meta.stored()}};
  p.link->transfer({&op, 1});
}

void PeerTier::read(uint64_t slot, const ChunkMeta &meta, std::byte *dst) {
  const SlotPlace p = place_of(slot);
  if (!p.link) return copy_bytes(dst, -1, p.data, p.device, meta.stored());
  const transport::RangeOp op{p.lease_id,
                              {transport::RmaOp::Kind::get, p.offset, dst, meta.stored()}};
  p.link->transfer({&op, 1});
}

void PeerTier::read_many(std::span<const SlotRead> reads, std::span<uint8_t> ok) {
  // Mapped slots are copied at once; remote ones are gathered per lender (a request's chunks
  // come from few lenders: a short list, searched linearly).
  struct Batch {
    std::shared_ptr<LenderLink> link;
    std::vector<transport::RangeOp> ops;
    std::vector<size_t> reads;
  };
  std::vector<Batch> batches;
  for (size_t i = 0; i < reads.size(); ++i) {
    const SlotRead &r = reads[i];
    ok[i] = 0;
    SlotPlace p;
    try {
      p = place_of(r.slot);
    } catch (const Error &) {
      continue;
    }
    if (!p.link) {
      copy_bytes(r.dst, -1, p.data, p.device, r.meta->stored());
      ok[i] = 1;
      continue;
    }
    auto b = std::find_if(batches.begin(), batches.end(),
                          [&](const Batch &x) { return x.link->identity() == p.link->identity(); });
    if (b == batches.end()) b = batches.insert(batches.end(), Batch{p.link, {}, {}});
    b->ops.push_back(
        {p.lease_id, {transport::RmaOp::Kind::get, p.offset, r.dst, r.meta->stored()}});
    b->reads.push_back(i);
  }
  for (Batch &b : batches) {
    try {
      b.link->transfer(b.ops);
    } catch (const Error &) {
      continue;  // nothing of a failed batch is trusted
    }
    for (size_t i : b.reads) ok[i] = 1;
  }
}

uint64_t PeerTier::capacity_bytes(const ChunkKey &model) const {
  std::lock_guard lock(mu_);
  const auto it = room_.find(model);
  return it == room_.end() ? 0 : it->second.capacity;
}

uint64_t PeerTier::free_bytes(const ChunkKey &model) const {
  std::lock_guard lock(mu_);
  const auto it = room_.find(model);
  return it == room_.end() ? 0 : it->second.free;
}

bool PeerTier::readable(uint64_t slot) const noexcept {
  std::lock_guard lock(mu_);
  const auto it = leases_.find(slot >> 32);
  if (it == leases_.end() || it->second.lost) return false;
  Held &h = it->second;
  if (h.lender->link->valid(h.lease_id)) return true;
  const_cast<PeerTier *>(this)->unusable_locked(it->first, h);
  h.lost = true;
  return false;
}

void PeerTier::update_locked(uint64_t local, Held &h, const LinkLeaseState &s) {
  if (s.reclaim || s.lost) unusable_locked(local, h);
  if (s.reclaim) h.reclaiming = true;
  if (s.lost) h.lost = true;
  h.lender->due.erase({h.renew_at, local});
  if (h.lost) return;  // nothing more to renew
  h.renew_at = s.renew_at_ns;
  h.lender->due.emplace(h.renew_at, local);
}

std::vector<PeerTier::LeaseStatus> PeerTier::refresh(bool all) {
  std::lock_guard lock(mu_);
  std::vector<uint64_t> locals, ids;
  for (const auto &l : lenders_) {
    locals.clear();
    ids.clear();
    const uint64_t now = l->link->clock_now();
    for (const auto &[at, local] : l->due) {
      if (!all && at > now) break;
      locals.push_back(local);
      ids.push_back(leases_.at(local).lease_id);
    }
    if (ids.empty()) continue;
    const std::vector<LinkLeaseState> st = l->link->renew_many(ids);
    for (size_t i = 0; i < locals.size(); ++i)
      update_locked(locals[i], leases_.at(locals[i]), st[i]);
  }
  std::vector<LeaseStatus> out;
  for (uint64_t local : draining_) {
    const Held &h = leases_.at(local);
    out.push_back(LeaseStatus{local, h.lease_id, h.model, h.reclaiming, h.lost,
                              h.chunks - h.free_chunks.size()});
  }
  return out;
}

void PeerTier::retire(uint64_t local_id) noexcept {
  std::lock_guard lock(mu_);
  const auto it = leases_.find(local_id);
  if (it == leases_.end()) return;
  Held &h = it->second;
  unusable_locked(local_id, h);
  if (!h.lost) h.lender->link->release(h.lease_id);
  Lender *l = h.lender;
  l->due.erase({h.renew_at, local_id});
  draining_.erase(local_id);
  leases_.erase(it);
  // A lender with no lease left is forgotten, with its watch.
  if (--l->leases != 0) return;
  lenders_.erase(std::find_if(lenders_.begin(), lenders_.end(),
                              [&](const std::unique_ptr<Lender> &x) { return x.get() == l; }));
}

std::vector<uint64_t> PeerTier::leases_of(const ChunkKey &model) const {
  std::lock_guard lock(mu_);
  std::vector<uint64_t> out;
  for (const auto &[local, h] : leases_) {
    if (h.model == model) out.push_back(local);
  }
  return out;
}

std::vector<ChunkKey> PeerTier::keys_in(uint64_t local_id) const {
  std::lock_guard lock(mu_);
  std::vector<ChunkKey> out;
  const auto it = leases_.find(local_id);
  if (it == leases_.end()) return out;
  const Held &h = it->second;
  std::vector<bool> free(h.chunks, false);
  for (uint32_t c : h.free_chunks) free[c] = true;
  for (uint64_t c = 0; c < h.chunks; ++c) {
    if (!free[c]) out.push_back(h.keys[c]);
  }
  return out;
}

bool PeerTier::holds_nothing() const {
  std::lock_guard lock(mu_);
  return leases_.empty() && draining_.empty();
}

bool PeerTier::has_leases(const ChunkKey &model) const {
  // Asked for every chunk a store places: no lock while nothing is lent to anyone.
  if (usable_leases_.load(std::memory_order_relaxed) == 0) return false;
  std::lock_guard lock(mu_);
  const auto it = room_.find(model);
  return it != room_.end() && it->second.leases != 0;
}

void PeerTier::retire_later(uint64_t local_id) noexcept {
  std::lock_guard lock(mu_);
  const auto it = leases_.find(local_id);
  if (it == leases_.end()) return;
  unusable_locked(local_id, it->second);
  it->second.reclaiming = true;
}

uint64_t PeerTier::used_slots(uint64_t local_id) const {
  std::lock_guard lock(mu_);
  const auto it = leases_.find(local_id);
  return it == leases_.end() ? 0 : it->second.chunks - it->second.free_chunks.size();
}

std::vector<ChunkKey> PeerTier::models() const {
  std::lock_guard lock(mu_);
  std::vector<ChunkKey> out;
  for (const auto &[model, r] : room_) {
    if (r.leases != 0) out.push_back(model);
  }
  return out;
}

uint64_t PeerTier::total_capacity_bytes() const {
  std::lock_guard lock(mu_);
  uint64_t n = 0;
  for (const auto &[model, r] : room_) n += r.capacity;
  return n;
}

}  // namespace swiftkv
