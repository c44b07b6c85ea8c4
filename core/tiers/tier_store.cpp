// The default data movement of memory-backed stores.
#include "core/tiers/tier_store.hpp"

#include "core/common/error.hpp"
#include "core/memory/host_memory.hpp"

namespace swiftkv {

void TierStore::write(uint64_t slot, const ChunkKey &, const ChunkMeta &meta,
                      const std::byte *src) {
  int32_t device = -1;
  std::byte *p = address(slot, &device);
  if (p == nullptr) fail(SWIFTKV_EINTERNAL, std::string(tier_name(tier())) + " has no write");
  copy_bytes(p, device, src, -1, meta.stored());
}

void TierStore::read(uint64_t slot, const ChunkMeta &meta, std::byte *dst) {
  int32_t device = -1;
  const std::byte *p = address(slot, &device);
  if (p == nullptr) fail(SWIFTKV_EINTERNAL, std::string(tier_name(tier())) + " has no read");
  copy_bytes(dst, -1, p, device, meta.stored());
}

void TierStore::read_many(std::span<const SlotRead> reads, std::span<uint8_t> ok) {
  for (size_t i = 0; i < reads.size(); ++i) {
    try {
      read(reads[i].slot, *reads[i].meta, reads[i].dst);
      ok[i] = 1;
    } catch (const Error &) {
      ok[i] = 0;
    }
  }
}

}  // namespace swiftkv
