// The disk tier: one file per chunk under a directory and a byte budget. Every file carries its
// key, its model and an XXH3 checksum of its bytes, so the tier can be rebuilt from the
// directory when a context starts and a torn or corrupt chunk is never loaded.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>

#include "core/tiers/tier_store.hpp"

namespace swiftkv {

// Thread-safe: mu_ guards the file table and the byte count; file I/O runs without the lock (a
// slot's file belongs to whoever holds the slot).
class DiskTier final : public TierStore {
 public:
  // A chunk found in the directory at start-up.
  struct Found {
    uint64_t slot;
    ChunkKey key;
    ChunkMeta meta;
    uint64_t mtime_ns;  // when the file was written, on CLOCK_REALTIME
  };

  // Opens `dir` (which must exist and be writable). Throws Error(EIO) when it cannot be read.
  DiskTier(std::string dir, uint64_t budget_bytes);

  // Scans the directory: every valid chunk file is handed to `found` and counted against the
  // budget; leftovers of interrupted writes and files whose header is torn or corrupt are
  // removed and counted in the return value. Call once, before any other use.
  uint64_t rebuild(const std::function<void(const Found &)> &found);

  Tier tier() const noexcept override { return Tier::disk; }
  std::optional<uint64_t> allocate(const ChunkKey &key, const ChunkMeta &meta) override;
  void free(uint64_t slot) noexcept override;
  std::byte *address(uint64_t, int32_t *) noexcept override { return nullptr; }
  // Writes a temporary file, syncs it and renames it into place: a crash leaves either nothing
  // or a whole file. Throws Error(EIO).
  void write(uint64_t slot, const ChunkKey &key, const ChunkMeta &meta,
             const std::byte *src) override;
  // Reads and checks a file; Error(EIO) when it is missing, short, or fails its checksum.
  void read(uint64_t slot, const ChunkMeta &meta, std::byte *dst) override;
  uint64_t capacity_bytes(const ChunkKey &) const override { return budget_; }
  uint64_t free_bytes(const ChunkKey &) const override;

  // The bytes a chunk of `payload` bytes takes on disk (header included).
  static uint64_t file_bytes(uint64_t payload) noexcept;
  // The path of a slot's file (tests corrupt it on purpose).
  std::string path_of(uint64_t slot) const;

 private:
  struct File {
    std::string name;  // empty until written
    uint64_t bytes;    // file_bytes(payload), counted against the budget
  };

  const std::string dir_;
  const uint64_t budget_;
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, File> files_;
  uint64_t used_ = 0;
  uint64_t next_slot_ = 1;
};

}  // namespace swiftkv
