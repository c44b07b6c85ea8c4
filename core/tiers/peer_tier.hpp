// The peer tier: chunks of a borrower model kept in memory lent by an elastic region (in this
// process or another, see LenderLink). A lease
// holds whole borrower chunks, chunk c at offset c * chunk_stride of the lease, one contiguous
// piece per layer, so a chunk is one contiguous range of the lender's memory.
#pragma once

#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/tiers/lender_link.hpp"
#include "core/tiers/tier_store.hpp"

namespace swiftkv {

// Thread-safe: mu_ guards the lease table and every lease's slot state. The lent bytes of a
// slot belong to whoever holds the slot.
class PeerTier final : public TierStore {
 public:
  // What the cache needs to know about a lease to keep the protocol.
  struct LeaseStatus {
    uint64_t local_id;    // the lease's number in this tier (slot >> 32)
    uint64_t lease_id;    // the lender's lease id
    ChunkKey model;
    bool reclaiming;      // the lender asked for it back: evacuate, then release
    bool lost;            // expired or gone: its bytes may already be the lender's again
    uint64_t used_slots;
  };

  ~PeerTier() override;

  // Borrows up to max_units lending units of `lender` for `model`, of geometry `sizes`: the
  // lender must lay chunks out as the model does (EINVAL). Returns the lender's lease id. ENOMEM
  // when the lender has nothing free.
  uint64_t attach(const ChunkKey &model, const GeometrySizes &sizes,
                  std::shared_ptr<LenderLink> lender, uint64_t max_units);

  Tier tier() const noexcept override { return Tier::peer; }
  std::optional<uint64_t> allocate(const ChunkKey &key, const ChunkMeta &meta) override;
  void free(uint64_t slot) noexcept override;
  std::byte *address(uint64_t slot, int32_t *device) noexcept override;
  // Asks the lender: false once the lease is lost or past its expiry.
  bool readable(uint64_t slot) const noexcept override;
  uint64_t capacity_bytes(const ChunkKey &model) const override;
  uint64_t free_bytes(const ChunkKey &model) const override;

  // Renews every lease and reads the lender's reclaim requests: the status of each lease after
  // that. A lease the lender no longer holds comes back lost.
  std::vector<LeaseStatus> refresh();
  // Ends a lease with no used slots: released to its lender (unless lost) and forgotten.
  void retire(uint64_t local_id) noexcept;
  // The leases of `model`, by local id.
  std::vector<uint64_t> leases_of(const ChunkKey &model) const;
  bool has_leases(const ChunkKey &model) const;
  // Stops a lease from taking new chunks, as a reclaim would.
  void retire_later(uint64_t local_id) noexcept;
  uint64_t used_slots(uint64_t local_id) const;
  // The models that hold usable leases, once each.
  std::vector<ChunkKey> models() const;
  uint64_t total_capacity_bytes() const;

 private:
  struct Held {
    ChunkKey model;
    std::shared_ptr<LenderLink> lender;
    uint64_t lease_id;
    std::byte *data;
    int32_t device;
    uint64_t chunk_bytes;
    std::vector<uint32_t> free_chunks;  // free slots, lowest last
    uint64_t chunks;
    bool reclaiming = false;
    bool lost = false;
  };

  mutable std::mutex mu_;
  mutable std::unordered_map<uint64_t, Held> leases_;  // readable() may mark a lease lost
  uint64_t next_local_ = 1;
};

}  // namespace swiftkv
