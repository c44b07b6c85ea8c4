// The interface every tier's store offers the chunk cache: slots for whole chunks under a byte
// budget, and a way to put bytes in and get them out. Which slot holds the readable copy of a
// chunk is the index's business, not the store's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "core/index/chunk_index.hpp"

namespace swiftkv {

class TierStore {
 public:
  virtual ~TierStore() = default;
  virtual Tier tier() const noexcept = 0;

  // Reserves a slot for the chunk `key` described by `meta` (its model and bytes); nullopt when
  // the tier has no room for it. The slot is the key's until freed. Thread-safe.
  virtual std::optional<uint64_t> allocate(const ChunkKey &key, const ChunkMeta &meta) = 0;
  // Gives a slot back. Thread-safe; the caller guarantees nobody reads it any more.
  virtual void free(uint64_t slot) noexcept = 0;
  // Gives several slots back (a full tier's victims of one store): the default frees one after
  // another; a store with a lock takes it once.
  virtual void free_many(std::span<const uint64_t> slots) noexcept {
    for (const uint64_t s : slots) free(s);
  }

  // The slot's bytes in this process's address space and the CUDA device holding them (-1: host
  // memory); nullptr for a store that is not memory (disk), which is reached by read and write.
  virtual std::byte *address(uint64_t slot, int32_t *device) noexcept = 0;
  // Fills a slot from host memory: the key and meta travel with the bytes where the store keeps
  // them (disk). The default copies to address().
  virtual void write(uint64_t slot, const ChunkKey &key, const ChunkMeta &meta,
                     const std::byte *src);
  // Copies a slot's bytes to host memory; throws Error(EIO) when they fail their check. The
  // default copies from address().
  virtual void read(uint64_t slot, const ChunkMeta &meta, std::byte *dst);

  // One read of read_many.
  struct SlotRead {
    uint64_t slot;
    const ChunkMeta *meta;
    std::byte *dst;
  };
  // Several reads at once: ok[i] is 1 when read i succeeded and 0 when it failed as read()
  // would have (with an Error; its dst is then unspecified). Other exceptions (out of memory)
  // propagate. The default reads one after another; a store reached over a network overrides it
  // to move them in one batch.
  virtual void read_many(std::span<const SlotRead> reads, std::span<uint8_t> ok);

  // Whether the slot's bytes are still this store's: a lent range can be lost (expired, or its
  // lender gone), after which its bytes may be overwritten. Thread-safe.
  virtual bool readable(uint64_t /*slot*/) const noexcept { return true; }

  // Room for `model`'s chunks: the bytes the tier could hold for it and those still free. For
  // a store shared by all models the model is ignored.
  virtual uint64_t capacity_bytes(const ChunkKey &model) const = 0;
  virtual uint64_t free_bytes(const ChunkKey &model) const = 0;
};

}  // namespace swiftkv
