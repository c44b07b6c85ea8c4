// The host tier: chunks in pinned DRAM on the NUMA node of the borrower's GPU, carved from large
// slabs so that storing a chunk never calls malloc, under the context's host budget.
#pragma once

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "core/context/context.hpp"
#include "core/memory/memory_region.hpp"
#include "core/tiers/tier_store.hpp"

namespace swiftkv {

// A slab is kept until the tier ends, unless it is empty and another size needs its budget.
//
// Thread-safe: mu_ guards the slab list and the free lists; the bytes of a slot belong to
// whoever holds the slot and are copied without the lock.
//
// Making a slab takes time: its pages are allocated and mapped as it is made (about 2 GB/s a
// thread), and with a device it is page-locked too, which for a slab of gigabytes takes seconds.
// A store that made its own slab would wait for all of that. So slabs are made ahead (when asked)
// on the tier's own thread: the first one for a chunk size when a model of that size is
// registered, and the next one whenever a size's free slots fall below half of its last slab. A
// store finds its slot ready; only when the thread falls behind does it wait for the slab being
// made (never making a second one beside it), or make one itself.
class HostTier final : public TierStore {
 public:
  // slab_bytes: the largest slab (at most an eighth of the budget, rounded down to whole chunks;
  // a chunk larger than that gets a slab of its own). Slabs are reserved from the context's host
  // budget as they are needed and kept until the tier ends. ahead: make slabs ahead on the tier's
  // thread (see above); the cache always asks for it.
  HostTier(Context &ctx, uint64_t slab_bytes, bool ahead);
  ~HostTier() override;

  Tier tier() const noexcept override { return Tier::host; }
  std::optional<uint64_t> allocate(const ChunkKey &key, const ChunkMeta &meta) override;
  void free(uint64_t slot) noexcept override;
  void free_many(std::span<const uint64_t> slots) noexcept override;
  std::byte *address(uint64_t slot, int32_t *device) noexcept override;
  uint64_t capacity_bytes(const ChunkKey &) const override;
  uint64_t free_bytes(const ChunkKey &) const override;

  uint64_t slab_bytes_reserved() const;
  // How many times the thread was asked for a slab (what the tests count: a full tier, which
  // has no budget for one, asks for none).
  uint64_t slab_requests() const;
  // The bytes of the slot a chunk takes: its stored bytes, rounded up to a size class when it
  // is encoded.
  static uint64_t slot_bytes_for(const ChunkMeta &meta) noexcept;
  // Asks the thread for a slab of `bytes` chunks if the size has no free slot yet (the cache
  // calls it when a model is registered). Nothing without `ahead`.
  void prepare(uint64_t bytes);
  // Keeps at least `slots` free slots of `bytes` ready, made ahead by the thread within the
  // budget (with or without `ahead`): the room that evacuating lent memory takes when its lender
  // asks for it back, so that a reclaim copies into memory that is already there. 0: none kept.
  void keep_room(uint64_t bytes, uint64_t slots);
  // Gives the budget of every empty slab back to the context, for a user of the budget that
  // cannot wait for the tier to empty (a host elastic region): slabs made ahead or emptied by
  // evictions are the tier's to remake. Waits for a slab being made and drops the sizes asked
  // for, so that nothing retakes the budget meanwhile. The bytes given back.
  uint64_t give_back_empty_slabs();

 private:
  struct Slab {
    std::shared_ptr<MemoryRegion> memory;  // null once released
    uint64_t slot_bytes;
    uint64_t reserved;  // bytes taken from the budget
    uint64_t slots = 0;
    uint64_t used = 0;  // slots handed out
  };
  struct SlabPlan {
    uint64_t slot_bytes, slots, reserve;
  };
  // Sizes the next slab of `bytes` chunks and takes its bytes from the budget; nullopt when
  // none is left.
  std::optional<SlabPlan> plan_slab_locked(uint64_t bytes);
  // Its memory (no lock needed); gives the budget back when it fails.
  std::shared_ptr<MemoryRegion> make_slab_memory(const SlabPlan &plan);
  void add_slab_locked(const SlabPlan &plan, std::shared_ptr<MemoryRegion> memory);
  // Gives the budget of every empty slab of another size than `bytes` (0: of every size) back:
  // chunks of one size (decoded) and of others (encoded) share the budget, and a slab kept empty
  // for one size would starve the others. Only when a slab of `bytes` finds no budget (once no
  // slab is being made), so steady use never churns. The bytes released.
  uint64_t release_empty_slabs_locked(uint64_t bytes);
  // Wakes the thread for `bytes` when its free slots fall below half of its last slab (with
  // `ahead`), or (for_room) below the room kept for the size. Allocations do not ask for the
  // room: an evacuation takes it slot by slot, and making more meanwhile would compete with
  // it; keep_room (the cache calls it at each maintenance pass) makes it again.
  void maybe_prepare_locked(uint64_t bytes, bool for_room = false);
  void free_locked(uint64_t slot) noexcept;
  bool short_of_room_locked(uint64_t bytes) const;
  // Whether the budget has room for one more slot of `bytes` (a slab of at least one).
  bool budget_for_slot_locked(uint64_t bytes) const;
  // Whether the thread should make a slab of `bytes` now: below the room kept for the size (when
  // for_room), or, with `ahead`, no free slot yet or fewer than half of the last slab's.
  bool slab_wanted_locked(uint64_t bytes, bool for_room) const;
  void run();

  Context &ctx_;
  const uint64_t slab_bytes_;
  const bool ahead_;
  mutable std::mutex mu_;
  std::vector<Slab> slabs_;
  std::map<uint64_t, std::vector<uint64_t>> free_;  // slot bytes -> free slot ids
  std::map<uint64_t, uint64_t> class_slots_;        // slot bytes -> slots in all its slabs
  uint64_t reserved_ = 0;                           // bytes of all slabs
  uint64_t free_slot_bytes_ = 0;
  uint64_t empty_slabs_ = 0;                 // slabs with memory and no slot handed out
  uint64_t making_slot_bytes_ = 0;           // the slots of the slab the thread is making
  std::map<uint64_t, uint64_t> last_slots_;  // slot bytes -> slots of its newest slab
  std::map<uint64_t, uint64_t> room_;        // slot bytes -> free slots kept ready
  // The thread: sizes asked for, the size being made (allocate waits for it), stop.
  std::condition_variable cv_;
  std::set<uint64_t> wanted_, making_;
  uint64_t slab_requests_ = 0;
  bool stop_ = false;
  std::thread thread_;  // started at the first request for a slab ahead
};

}  // namespace swiftkv
