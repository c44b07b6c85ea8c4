// Slab allocation of host chunk slots. A slot id is (slab << 32) | index in the slab.
#include "core/tiers/host_tier.hpp"

#include <unistd.h>

#include <algorithm>
#include <bit>

#include "core/common/checked_math.hpp"
#include "core/common/error.hpp"
#include "core/common/log.hpp"
#include "core/memory/host_region.hpp"

namespace swiftkv {

namespace {
uint64_t page_bytes() { return static_cast<uint64_t>(sysconf(_SC_PAGESIZE)); }
}  // namespace

HostTier::HostTier(Context &ctx, uint64_t slab_bytes, bool ahead)
    : ctx_(ctx), slab_bytes_(slab_bytes), ahead_(ahead) {
  if (slab_bytes == 0) fail_invalid("host tier slab size is 0");
}

HostTier::~HostTier() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard lock(mu_);
  for (Slab &s : slabs_) {
    s.memory.reset();
    ctx_.release_host(s.reserved);  // 0 for a slab released already
  }
}

std::optional<HostTier::SlabPlan> HostTier::plan_slab_locked(uint64_t bytes) {
  // As many whole chunks as fit in a slab and in what is left of the budget.
  const uint64_t page = page_bytes();
  const uint64_t budget = ctx_.config().host_budget_bytes;
  const uint64_t used = ctx_.host_reserved();
  const uint64_t left = budget > used ? budget - used : 0;
  // Slabs of at most an eighth of the budget: the budget is shared with host elastic regions,
  // and the tier takes it as it fills rather than all at once.
  // Whole pages, so that a slab of small chunks wastes nothing to rounding.
  const uint64_t slab_max =
      std::min(slab_bytes_, std::max({budget / 8 / page * page, bytes, page}));
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
  return SlabPlan{bytes, slots, reserve};
}

std::shared_ptr<MemoryRegion> HostTier::make_slab_memory(const SlabPlan &plan) {
  HostRegionOptions o;
  o.size = plan.reserve;
  o.numa_node = ctx_.host_numa_node();
  o.page_lock = ctx_.effective_device_mask() != 0;
  o.name = "swiftkv-host-tier";
  // A full tier's new chunks go where its victims were, which under retention (or any order
  // that reads change) lie scattered over the slabs: on 4 KiB pages each small chunk's copy can
  // cost a page walk. No other process maps a tier's slabs, so they are private memory, which
  // gets huge pages at the system's default setting (shared memory does not).
  o.huge_pages = true;
  o.shared = false;
  try {
    std::shared_ptr<MemoryRegion> mem = create_host_region(o);
    mem->commit(0, plan.reserve);
    return mem;
  } catch (...) {
    ctx_.release_host(plan.reserve);
    throw;
  }
}

void HostTier::add_slab_locked(const SlabPlan &plan, std::shared_ptr<MemoryRegion> memory) {
  const uint64_t slab = slabs_.size();
  slabs_.push_back(Slab{std::move(memory), plan.slot_bytes, plan.reserve, plan.slots, 0});
  reserved_ += plan.reserve;
  // The list never holds more than the class's slots, so free() never has to grow it.
  std::vector<uint64_t> &list = free_[plan.slot_bytes];
  class_slots_[plan.slot_bytes] += plan.slots;
  list.reserve(class_slots_[plan.slot_bytes]);
  for (uint64_t i = plan.slots; i-- > 0;) list.push_back(slab << 32 | i);
  free_slot_bytes_ += plan.slots * plan.slot_bytes;
  last_slots_[plan.slot_bytes] = plan.slots;
  ++empty_slabs_;
}

uint64_t HostTier::slot_bytes_for(const ChunkMeta &meta) noexcept {
  const uint64_t n = meta.stored();
  // A model's decoded chunks are all one size; encoded ones (zstd) vary chunk by chunk, and a
  // size class each would leave slabs mostly empty: eight classes per doubling instead, each
  // slot at most 12.5% over its chunk.
  if (!meta.encoded() || n <= 64) return n;
  const uint64_t step = (uint64_t{1} << (63 - std::countl_zero(n))) / 8;
  return (n + step - 1) / step * step;
}

std::optional<uint64_t> HostTier::allocate(const ChunkKey &, const ChunkMeta &meta) {
  const uint64_t bytes = slot_bytes_for(meta);
  std::unique_lock lock(mu_);
  std::vector<uint64_t> &list = free_[bytes];
  // The thread is making a slab of this size: wait for it rather than make a second one.
  cv_.wait(lock, [&] { return !list.empty() || making_.count(bytes) == 0; });
  if (list.empty()) {
    std::optional<SlabPlan> plan = plan_slab_locked(bytes);
    if (!plan) {
      // Short of budget. A slab of another size being made holds some: wait for it (it may
      // fail and give its budget back), then take the empty slabs of other sizes.
      cv_.wait(lock, [&] { return making_.empty(); });
      if (list.empty()) {
        // A full tier ends here at every store, before its cache evicts: no scan of the slabs
        // when none is empty (this size's slots all taken, an empty slab is another size's).
        if (empty_slabs_ != 0) release_empty_slabs_locked(bytes);
        plan = plan_slab_locked(bytes);
        if (!plan) return std::nullopt;
      }
    }
    if (plan) add_slab_locked(*plan, make_slab_memory(*plan));
  }
  const uint64_t slot = list.back();
  list.pop_back();
  if (!list.empty()) {
    // The next slot is written soon, and a full tier's free slots are its victims' (cold, and
    // scattered over the slabs): its first line on its way now.
    const Slab &n = slabs_[list.back() >> 32];
    __builtin_prefetch(n.memory->data() + (list.back() & 0xffffffffu) * n.slot_bytes, 1, 0);
  }
  if (slabs_[slot >> 32].used++ == 0) --empty_slabs_;
  free_slot_bytes_ -= bytes;
  maybe_prepare_locked(bytes);
  return slot;
}

uint64_t HostTier::release_empty_slabs_locked(uint64_t bytes) {
  uint64_t released = 0;
  for (uint64_t i = 0; i < slabs_.size(); ++i) {
    Slab &s = slabs_[i];
    if (!s.memory || s.used != 0 || s.slot_bytes == bytes) continue;
    std::vector<uint64_t> &list = free_[s.slot_bytes];
    std::erase_if(list, [i](uint64_t slot) { return (slot >> 32) == i; });
    class_slots_[s.slot_bytes] -= s.slots;
    free_slot_bytes_ -= s.slots * s.slot_bytes;
    s.memory.reset();
    --empty_slabs_;
    ctx_.release_host(s.reserved);
    reserved_ -= s.reserved;
    released += s.reserved;
    s.reserved = 0;
  }
  return released;
}

uint64_t HostTier::give_back_empty_slabs() {
  std::unique_lock lock(mu_);
  wanted_.clear();
  cv_.wait(lock, [&] { return making_.empty(); });
  wanted_.clear();  // asked for while the last slab was made
  return release_empty_slabs_locked(0);
}

void HostTier::prepare(uint64_t bytes) {
  if (!ahead_) return;
  std::lock_guard lock(mu_);
  if (!free_[bytes].empty() || making_.count(bytes) != 0 || wanted_.count(bytes) != 0) return;
  if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  wanted_.insert(bytes);
  ++slab_requests_;
  cv_.notify_all();
}

void HostTier::keep_room(uint64_t bytes, uint64_t slots) {
  std::lock_guard lock(mu_);
  if (slots == 0) {
    room_.erase(bytes);
    return;
  }
  room_[bytes] = slots;
  maybe_prepare_locked(bytes, true);
}

bool HostTier::budget_for_slot_locked(uint64_t bytes) const {
  const uint64_t budget = ctx_.config().host_budget_bytes;
  const uint64_t used = ctx_.host_reserved();
  return budget > used && budget - used >= bytes;
}

bool HostTier::short_of_room_locked(uint64_t bytes) const {
  const auto room = room_.find(bytes);
  if (room == room_.end()) return false;
  const auto list = free_.find(bytes);
  if ((list == free_.end() ? 0 : list->second.size()) >= room->second) return false;
  return budget_for_slot_locked(bytes);
}

bool HostTier::slab_wanted_locked(uint64_t bytes, bool for_room) const {
  if (for_room && short_of_room_locked(bytes)) return true;
  if (!ahead_) return false;
  // Ahead: no free slot yet (a registration), or below half of the last slab.
  const auto last = last_slots_.find(bytes);
  const auto list = free_.find(bytes);
  const size_t free_now = list == free_.end() ? 0 : list->second.size();
  if (last == last_slots_.end() ? free_now != 0 : free_now * 2 >= last->second) return false;
  // A full tier stays below half a slab free at every store, each evicting to make its room:
  // with no budget left for a slab the thread would wake for nothing at each allocation. A store
  // that finds no slot makes its own room (empty slabs of other sizes, then its cache's
  // evictions); budget given back by others is seen at the next allocation.
  return budget_for_slot_locked(bytes);
}

void HostTier::maybe_prepare_locked(uint64_t bytes, bool for_room) {
  if (last_slots_.count(bytes) == 0 && !for_room) return;  // prepare() asks for the first slab
  if (!slab_wanted_locked(bytes, for_room)) return;
  if (making_.count(bytes) != 0 || wanted_.count(bytes) != 0 || stop_) return;
  try {
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    wanted_.insert(bytes);
    ++slab_requests_;
  } catch (...) {
    return;  // no thread or no memory: the next store makes its slab itself
  }
  cv_.notify_all();
}

void HostTier::run() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !wanted_.empty(); });
    if (stop_) return;
    const uint64_t bytes = *wanted_.begin();
    wanted_.erase(wanted_.begin());
    if (!slab_wanted_locked(bytes, true)) continue;  // no longer: slots were freed meanwhile
    std::optional<SlabPlan> plan;
    try {
      plan = plan_slab_locked(bytes);
    } catch (const Error &e) {
      log_warn(std::string("host tier: ") + e.what());
    }
    if (!plan) continue;
    making_.insert(bytes);
    making_slot_bytes_ += plan->slots * plan->slot_bytes;
    lock.unlock();
    std::shared_ptr<MemoryRegion> memory;
    try {
      memory = make_slab_memory(*plan);
    } catch (const std::exception &e) {
      log_warn(std::string("host tier: making a slab ahead: ") + e.what());
    }
    lock.lock();
    making_.erase(bytes);
    making_slot_bytes_ -= plan->slots * plan->slot_bytes;
    if (memory) {
      add_slab_locked(*plan, std::move(memory));
      if (short_of_room_locked(bytes)) wanted_.insert(bytes);  // the next slab of the room
    }
    cv_.notify_all();
  }
}

void HostTier::free(uint64_t slot) noexcept {
  std::lock_guard lock(mu_);
  free_locked(slot);
}

void HostTier::free_many(std::span<const uint64_t> slots) noexcept {
  std::lock_guard lock(mu_);
  // A full tier's victims are of one size, nearly always: one lookup of its free list for all.
  uint64_t list_bytes = 0;
  std::vector<uint64_t> *list = nullptr;
  for (const uint64_t slot : slots) {
    Slab &s = slabs_[slot >> 32];
    const uint64_t bytes = s.slot_bytes;
    if (--s.used == 0) ++empty_slabs_;
    if (list == nullptr || bytes != list_bytes) {
      list = &free_[bytes];
      list_bytes = bytes;
    }
    list->push_back(slot);  // capacity was reserved when the slab was made
    free_slot_bytes_ += bytes;
  }
}

void HostTier::free_locked(uint64_t slot) noexcept {
  Slab &s = slabs_[slot >> 32];
  const uint64_t bytes = s.slot_bytes;
  if (--s.used == 0) ++empty_slabs_;
  free_[bytes].push_back(slot);  // capacity was reserved when the slab was made
  free_slot_bytes_ += bytes;
}

std::byte *HostTier::address(uint64_t slot, int32_t *device) noexcept {
  std::lock_guard lock(mu_);
  const Slab &s = slabs_[slot >> 32];
  if (device != nullptr) *device = -1;
  return s.memory->data() + (slot & 0xffffffffu) * s.slot_bytes;
}

uint64_t HostTier::capacity_bytes(const ChunkKey &) const {
  return ctx_.config().host_budget_bytes;
}

uint64_t HostTier::free_bytes(const ChunkKey &) const {
  std::lock_guard lock(mu_);
  const uint64_t budget = ctx_.config().host_budget_bytes;
  const uint64_t used = ctx_.host_reserved();
  // A slab being made has its budget reserved already, and its slots are free in a moment.
  return free_slot_bytes_ + making_slot_bytes_ + (budget > used ? budget - used : 0);
}

uint64_t HostTier::slab_requests() const {
  std::lock_guard lock(mu_);
  return slab_requests_;
}

uint64_t HostTier::slab_bytes_reserved() const {
  std::lock_guard lock(mu_);
  return reserved_;
}

}  // namespace swiftkv
