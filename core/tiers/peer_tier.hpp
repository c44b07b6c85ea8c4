// A lent tier: chunks of a borrower model kept in memory lent by elastic regions (in this
// process or another, see LenderLink). The cache keeps two: the peer tier, whose leases are
// mapped here (this process, or another on this host), and the remote tier, whose leases are
// another host's memory reached over the transport. A lease holds whole borrower chunks, chunk c at
// offset c * chunk_stride of the lease, one contiguous piece per layer, so a chunk is one
// contiguous range of the lender's memory.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <unordered_map>
#include <vector>

#include "core/tiers/lender_link.hpp"
#include "core/tiers/tier_store.hpp"

namespace swiftkv {

// Nothing here grows with the number of leases per call: a model's room is kept as running
// totals and a list of leases with free chunks, each lender's leases by when they need renewing,
// and each slot's key, so a reclaimed lease is evacuated without a search.
//
// Thread-safe: mu_ guards the lease table, the lenders and the models' room. The lent bytes of a
// slot belong to whoever holds the slot.
class PeerTier final : public TierStore {
 public:
  // What the cache needs to know about a lease to keep the protocol.
  struct LeaseStatus {
    uint64_t local_id;  // the lease's number in this tier (slot >> 32)
    uint64_t lease_id;  // the lender's lease id
    ChunkKey model;
    bool reclaiming;  // the lender asked for it back: evacuate, then release
    bool lost;        // expired or gone: its bytes may already be the lender's again
    uint64_t used_slots;
  };

  // tier: Tier::peer or Tier::remote, what this one reports itself as. on_reclaim: called (with
  // a lender's locks held: it must only signal) when a lender in this process asks a lease back
  // or ends its leases.
  explicit PeerTier(Tier tier = Tier::peer, std::function<void()> on_reclaim = {});
  ~PeerTier() override;

  // Takes a lease `lender` granted (of chunks of geometry `sizes`, checked by the caller with
  // LenderLink::check_geometry) into this tier; returns its lease id. ChunkCache::borrow asks
  // for the grant and picks the tier by it.
  uint64_t adopt(const ChunkKey &model, const GeometrySizes &sizes,
                 std::shared_ptr<LenderLink> lender, const LeaseGrant &g);

  Tier tier() const noexcept override { return tier_; }
  std::optional<uint64_t> allocate(const ChunkKey &key, const ChunkMeta &meta) override;
  void free(uint64_t slot) noexcept override;
  // Null for a slot of a remote lease: its bytes move by read and write.
  std::byte *address(uint64_t slot, int32_t *device) noexcept override;
  void write(uint64_t slot, const ChunkKey &key, const ChunkMeta &meta,
             const std::byte *src) override;
  void read(uint64_t slot, const ChunkMeta &meta, std::byte *dst) override;
  // The reads of remote leases go as one batch per lender: when a lender's batch fails, every
  // read from that lender failed.
  void read_many(std::span<const SlotRead> reads, std::span<uint8_t> ok) override;
  // Asks the lender: false once the lease is lost or past its expiry.
  bool readable(uint64_t slot) const noexcept override;
  uint64_t capacity_bytes(const ChunkKey &model) const override;
  uint64_t free_bytes(const ChunkKey &model) const override;

  // Renews the leases that are due (with `all`, every lease: a lender signalled), one call per
  // lender, and returns the leases that are asked back or lost: the ones the cache must empty.
  std::vector<LeaseStatus> refresh(bool all);
  // Ends a lease with no used slots: released to its lender (unless lost) and forgotten.
  void retire(uint64_t local_id) noexcept;
  // The leases of `model`, by local id.
  std::vector<uint64_t> leases_of(const ChunkKey &model) const;
  // The keys the used slots of a lease were allocated for.
  std::vector<ChunkKey> keys_in(uint64_t local_id) const;
  bool has_leases(const ChunkKey &model) const;
  // Whether the tier holds no lease at all, draining or not: nothing of it to renew.
  bool holds_nothing() const;
  // Stops a lease from taking new chunks, as a reclaim would.
  void retire_later(uint64_t local_id) noexcept;
  uint64_t used_slots(uint64_t local_id) const;
  // The models that hold usable leases, once each.
  std::vector<ChunkKey> models() const;
  uint64_t total_capacity_bytes() const;

 private:
  struct Lender {
    std::shared_ptr<LenderLink> link;
    std::set<std::pair<uint64_t, uint64_t>> due;  // (renew at, local id) of its leases
    uint64_t leases = 0;
  };
  struct Held {
    ChunkKey model;
    Lender *lender;
    uint64_t lease_id;
    std::byte *data;
    int32_t device;
    uint64_t chunk_bytes;
    std::vector<uint32_t> free_chunks;  // free slots, lowest last
    std::vector<ChunkKey> keys;         // per slot: the key it was allocated for
    uint64_t chunks;
    uint64_t renew_at = 0;
    bool reclaiming = false;
    bool lost = false;
    bool open = false;    // in its model's list of leases with free chunks
    bool remote = false;  // not mapped here: reached through the link's transfer
    bool usable() const noexcept { return !reclaiming && !lost; }
  };
  // A model's usable leases: their bytes, their free bytes, and those that may have free chunks
  // (checked when taken: a lease that filled or stopped being usable leaves then).
  struct Room {
    uint64_t capacity = 0, free = 0, leases = 0;
    std::vector<uint64_t> open;
  };

  // Where a slot's bytes are: a remote lease's link and the offset in the lease, or (no link)
  // the mapped bytes and their device. EINTERNAL for a slot of no lease.
  struct SlotPlace {
    std::shared_ptr<LenderLink> link;
    uint64_t lease_id = 0;
    uint64_t offset = 0;
    std::byte *data = nullptr;
    int32_t device = -1;
  };
  SlotPlace place_of(uint64_t slot) const;
  // Stops a usable lease from counting in its model's room; call with mu_ held.
  void unusable_locked(uint64_t local, Held &h) noexcept;
  void update_locked(uint64_t local, Held &h, const LinkLeaseState &s);

  const Tier tier_;
  const std::function<void()> on_reclaim_;
  mutable std::mutex mu_;
  std::atomic<uint64_t> usable_leases_{0};  // the rooms' leases, all models (written under mu_)
  mutable std::unordered_map<uint64_t, Held> leases_;  // readable() may mark a lease lost
  std::vector<std::unique_ptr<Lender>> lenders_;
  mutable std::set<uint64_t> draining_;  // leases asked back or lost, until retired
  mutable std::unordered_map<ChunkKey, Room, ChunkKeyHash> room_;
  uint64_t next_local_ = 1;
};

}  // namespace swiftkv
