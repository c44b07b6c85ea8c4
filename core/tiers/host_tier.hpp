// The host tier: chunks in pinned DRAM on the NUMA node of the borrower's GPU, carved from large
// slabs so that storing a chunk never calls malloc, under the context's host budget.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "core/context/context.hpp"
#include "core/memory/memory_region.hpp"
#include "core/tiers/tier_store.hpp"

namespace swiftkv {

// Thread-safe: mu_ guards the slab list and the free lists; the bytes of a slot belong to
// whoever holds the slot and are copied without the lock.
class HostTier final : public TierStore {
 public:
  // slab_bytes: the largest slab (at most an eighth of the budget, rounded down to whole chunks;
  // a chunk larger than that gets a slab of its own). Slabs are reserved from the context's host budget as they are needed
  // and kept until the tier ends.
  HostTier(Context &ctx, uint64_t slab_bytes);
  ~HostTier() override;

  Tier tier() const noexcept override { return Tier::host; }
  std::optional<uint64_t> allocate(const ChunkKey &key, const ChunkMeta &meta) override;
  void free(uint64_t slot) noexcept override;
  std::byte *address(uint64_t slot, int32_t *device) noexcept override;
  uint64_t capacity_bytes(const ChunkKey &) const override;
  uint64_t free_bytes(const ChunkKey &) const override;

  uint64_t slab_bytes_reserved() const;

 private:
  struct Slab {
    std::shared_ptr<MemoryRegion> memory;
    uint64_t slot_bytes;
    uint64_t reserved;  // bytes taken from the budget
  };

  Context &ctx_;
  const uint64_t slab_bytes_;
  mutable std::mutex mu_;
  std::vector<Slab> slabs_;
  std::map<uint64_t, std::vector<uint64_t>> free_;  // slot bytes -> free slot ids
  std::map<uint64_t, uint64_t> class_slots_;         // slot bytes -> slots in all its slabs
  uint64_t reserved_ = 0;   // bytes of all slabs
  uint64_t free_slot_bytes_ = 0;
};

}  // namespace swiftkv
