// Slab allocation of host chunk slots. A slot id is (slab << 32) | index in the slab.
#include "core/tiers/host_tier.hpp"

#include <unistd.h>

#include <algorithm>

#include "core/common/checked_math.hpp"
#include "core/common/error.hpp"
#include "core/memory/host_region.hpp"

namespace swiftkv {

namespace {
uint64_t page_bytes() { return static_cast<uint64_t>(sysconf(_SC_PAGESIZE)); }
}  // namespace

HostTier::HostTier(Context &ctx, uint64_t slab_bytes) : ctx_(ctx), slab_bytes_(slab_bytes) {
  if (slab_bytes == 0) fail_invalid("host tier slab size is 0");
}

HostTier::~HostTier() {
  std::lock_guard lock(mu_);
  for (Slab &s : slabs_) {
    s.memory.reset();
    ctx_.release_host(s.reserved);
  }
}

std::optional<uint64_t> HostTier::allocate(const ChunkKey &, const ChunkMeta &meta) {
  const uint64_t bytes = meta.bytes;
  std::lock_guard lock(mu_);
  auto &list = free_[bytes];
  if (list.empty()) {
    // A new slab: as many whole chunks as fit in a slab and in what is left of the budget.
    const uint64_t page = page_bytes();
    const uint64_t budget = ctx_.config().host_budget_bytes;
    const uint64_t used = ctx_.host_reserved();
    const uint64_t left = budget > used ? budget - used : 0;
    // Slabs of at most an eighth of the budget: the budget is shared with host elastic regions,
    // and the tier takes it as it fills rather than all at once.
    // Whole pages, so that a slab of small chunks wastes nothing to rounding.
    const uint64_t slab_max = std::min(slab_bytes_, std::max({budget / 8 / page * page, bytes, page}));
    uint64_t slots = std::max<uint64_t>(1, slab_max / bytes);
    while (slots > 0 && round_up(slots * bytes, page) > left) {
      slots = std::min(slots - 1, left / bytes);
    }
    if (slots == 0 || slabs_.size() >= (uint64_t{1} << 31)) return std::nullopt;
    const uint64_t reserve = round_up(slots * bytes, page);
    try {
      ctx_.reserve_host(reserve, "the host tier");
    } catch (const Error &e) {
      if (e.status() == SWIFTKV_ENOMEM) return std::nullopt;  // another user took the budget
      throw;
    }
    HostRegionOptions o;
    o.size = reserve;
    o.numa_node = ctx_.host_numa_node();
    o.page_lock = ctx_.effective_device_mask() != 0;
    o.name = "swiftkv-host-tier";
    std::shared_ptr<MemoryRegion> mem;
    try {
      mem = create_host_region(o);
      mem->commit(0, reserve);
    } catch (...) {
      ctx_.release_host(reserve);
      throw;
    }
    const uint64_t slab = slabs_.size();
    slabs_.push_back(Slab{std::move(mem), bytes, reserve});
    reserved_ += reserve;
    // The list never holds more than the class's slots, so free() never has to grow it.
    class_slots_[bytes] += slots;
    list.reserve(class_slots_[bytes]);
    for (uint64_t i = slots; i-- > 0;) list.push_back(slab << 32 | i);
    free_slot_bytes_ += slots * bytes;
  }
  const uint64_t slot = list.back();
  list.pop_back();
  free_slot_bytes_ -= bytes;
  return slot;
}

void HostTier::free(uint64_t slot) noexcept {
  std::lock_guard lock(mu_);
  const uint64_t bytes = slabs_[slot >> 32].slot_bytes;
  free_[bytes].push_back(slot);  // capacity was reserved when the slab was made
  free_slot_bytes_ += bytes;
}

std::byte *HostTier::address(uint64_t slot, int32_t *device) noexcept {
  std::lock_guard lock(mu_);
  const Slab &s = slabs_[slot >> 32];
  if (device != nullptr) *device = -1;
  return s.memory->data() + (slot & 0xffffffffu) * s.slot_bytes;
}

uint64_t HostTier::capacity_bytes(const ChunkKey &) const { return ctx_.config().host_budget_bytes; }

uint64_t HostTier::free_bytes(const ChunkKey &) const {
  std::lock_guard lock(mu_);
  const uint64_t budget = ctx_.config().host_budget_bytes;
  const uint64_t used = ctx_.host_reserved();
  return free_slot_bytes_ + (budget > used ? budget - used : 0);
}

uint64_t HostTier::slab_bytes_reserved() const {
  std::lock_guard lock(mu_);
  return reserved_;
}

}  // namespace swiftkv
