// Slots in lent elastic memory and the borrower's half of the lease protocol: renew, notice a
// reclaim, release once evacuated.
#include "core/tiers/peer_tier.hpp"

#include <algorithm>

#include "core/common/error.hpp"

namespace swiftkv {

PeerTier::~PeerTier() {
  std::lock_guard lock(mu_);
  for (auto &[local, h] : leases_) {
    if (h.lost) continue;
    h.lender->release(h.lease_id);
  }
}

uint64_t PeerTier::attach(const ChunkKey &model, const GeometrySizes &sizes,
                          std::shared_ptr<LenderLink> lender, uint64_t max_units) {
  lender->check_geometry(sizes);
  const LeaseGrant g = lender->lend(max_units);
  Held h;
  h.model = model;
  h.lease_id = g.lease_id;
  h.data = g.data;
  h.device = g.device;
  h.chunk_bytes = sizes.full_chunk_bytes;
  h.chunks = g.chunks;
  h.free_chunks.reserve(h.chunks);
  for (uint64_t c = h.chunks; c-- > 0;) h.free_chunks.push_back(static_cast<uint32_t>(c));
  h.lender = std::move(lender);
  std::lock_guard lock(mu_);
  leases_.emplace(next_local_++, std::move(h));
  return g.lease_id;
}

std::optional<uint64_t> PeerTier::allocate(const ChunkKey &, const ChunkMeta &meta) {
  std::lock_guard lock(mu_);
  for (auto &[local, h] : leases_) {
    if (h.model != meta.model || h.reclaiming || h.lost || h.free_chunks.empty()) continue;
    if (h.chunk_bytes != meta.bytes) continue;
    const uint32_t c = h.free_chunks.back();
    h.free_chunks.pop_back();
    return local << 32 | c;
  }
  return std::nullopt;
}

void PeerTier::free(uint64_t slot) noexcept {
  std::lock_guard lock(mu_);
  const auto it = leases_.find(slot >> 32);
  if (it == leases_.end()) return;
  it->second.free_chunks.push_back(static_cast<uint32_t>(slot & 0xffffffffu));
}

std::byte *PeerTier::address(uint64_t slot, int32_t *device) noexcept {
  std::lock_guard lock(mu_);
  const auto it = leases_.find(slot >> 32);
  if (it == leases_.end()) return nullptr;
  if (device != nullptr) *device = it->second.device;
  return it->second.data + (slot & 0xffffffffu) * it->second.chunk_bytes;
}

uint64_t PeerTier::capacity_bytes(const ChunkKey &model) const {
  std::lock_guard lock(mu_);
  uint64_t n = 0;
  for (const auto &[local, h] : leases_) {
    if (h.model == model && !h.reclaiming && !h.lost) n += h.chunks * h.chunk_bytes;
  }
  return n;
}

uint64_t PeerTier::free_bytes(const ChunkKey &model) const {
  std::lock_guard lock(mu_);
  uint64_t n = 0;
  for (const auto &[local, h] : leases_) {
    if (h.model == model && !h.reclaiming && !h.lost) n += h.free_chunks.size() * h.chunk_bytes;
  }
  return n;
}

bool PeerTier::readable(uint64_t slot) const noexcept {
  std::lock_guard lock(mu_);
  const auto it = leases_.find(slot >> 32);
  if (it == leases_.end() || it->second.lost) return false;
  if (it->second.lender->valid(it->second.lease_id)) return true;
  it->second.lost = true;
  return false;
}

std::vector<PeerTier::LeaseStatus> PeerTier::refresh() {
  std::lock_guard lock(mu_);
  std::vector<LeaseStatus> out;
  out.reserve(leases_.size());
  for (auto &[local, h] : leases_) {
    if (!h.lost) {
      const LinkLeaseState s = h.lender->renew(h.lease_id);
      if (s.reclaim) h.reclaiming = true;
      if (s.lost) h.lost = true;
    }
    out.push_back(LeaseStatus{local, h.lease_id, h.model, h.reclaiming, h.lost,
                              h.chunks - h.free_chunks.size()});
  }
  return out;
}

void PeerTier::retire(uint64_t local_id) noexcept {
  std::lock_guard lock(mu_);
  const auto it = leases_.find(local_id);
  if (it == leases_.end()) return;
  if (!it->second.lost) it->second.lender->release(it->second.lease_id);
  leases_.erase(it);
}

std::vector<uint64_t> PeerTier::leases_of(const ChunkKey &model) const {
  std::lock_guard lock(mu_);
  std::vector<uint64_t> out;
  for (const auto &[local, h] : leases_) {
    if (h.model == model) out.push_back(local);
  }
  return out;
}

bool PeerTier::has_leases(const ChunkKey &model) const {
  std::lock_guard lock(mu_);
  for (const auto &[local, h] : leases_) {
    if (h.model == model && !h.reclaiming && !h.lost) return true;
  }
  return false;
}

void PeerTier::retire_later(uint64_t local_id) noexcept {
  std::lock_guard lock(mu_);
  const auto it = leases_.find(local_id);
  if (it != leases_.end()) it->second.reclaiming = true;
}

uint64_t PeerTier::used_slots(uint64_t local_id) const {
  std::lock_guard lock(mu_);
  const auto it = leases_.find(local_id);
  return it == leases_.end() ? 0 : it->second.chunks - it->second.free_chunks.size();
}

std::vector<ChunkKey> PeerTier::models() const {
  std::lock_guard lock(mu_);
  std::vector<ChunkKey> out;
  for (const auto &[local, h] : leases_) {
    if (h.reclaiming || h.lost) continue;
    if (std::find(out.begin(), out.end(), h.model) == out.end()) out.push_back(h.model);
  }
  return out;
}

uint64_t PeerTier::total_capacity_bytes() const {
  std::lock_guard lock(mu_);
  uint64_t n = 0;
  for (const auto &[local, h] : leases_) {
    if (!h.reclaiming && !h.lost) n += h.chunks * h.chunk_bytes;
  }
  return n;
}

}  // namespace swiftkv
